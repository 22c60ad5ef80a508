"""Full-Bandwidth Transformer: the previous step's final-normed state re-enters the bottom of the
stack, fused with the token embedding.

    u_t = (W_U h_{t-1}) * sigmoid(W_G e_t)      (GLU: the state is the value, the token the gate)
    u_t = e_t                                   where there is no previous state

Sequential semantics are the ground truth. ``run_passes`` computes K Jacobi iterations of that
causal recurrence in parallel: with a plain prefix of p >= 1 positions (position 0 has no previous
state), after k passes the positions below p + k - 1 (the prefix and the first k - 1 fused
positions) equal the sequential recurrence exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from models.baseline import DecoderLM
from models.config import ModelConfig
from models.fields import ConfigError
from models.kv_cache import KVCache

FUSIONS = ("glu", "add")


@dataclass
class FBTConfig(ModelConfig):
    fusion: str = "glu"  # "glu" (default) or the ablation "add": u = e + W_U h

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fusion not in FUSIONS:
            raise ConfigError(f"config field fusion={self.fusion!r}: expected one of {FUSIONS}")


class Fusion(nn.Module):
    def __init__(self, cfg: FBTConfig):
        super().__init__()
        self.kind = cfg.fusion
        # skip_init: a Linear's constructor would draw its own initialisation from the global
        # generator, shifting the draws of everything init_weights initialises after it
        self.W_U = nn.utils.skip_init(nn.Linear, cfg.d_model, cfg.d_model, bias=False)
        self.W_G = nn.utils.skip_init(nn.Linear, cfg.d_model, cfg.d_model, bias=False) if cfg.fusion == "glu" else None
        self.hook_state = HookPoint()  # [batch, pos, d_model] carried state h_{t-1} fed in at t
        self.hook_value = HookPoint()  # [batch, pos, d_model] value path W_U h_{t-1}
        self.hook_gate = HookPoint()  # [batch, pos, d_model] sigmoid(W_G e_t) (glu only)
        self.hook_fused = HookPoint()  # [batch, pos, d_model] stack input u_t (e_t where unfused)

    def forward(self, state: Tensor, embed: Tensor, fuse: Tensor) -> Tensor:
        """state, embed: [batch, pos, d_model]; fuse: [batch, pos] bool, False where u = e."""
        value = self.hook_value(self.W_U(self.hook_state(state)))
        if self.W_G is not None:
            fused = value * self.hook_gate(torch.sigmoid(self.W_G(embed)))
        else:
            fused = embed + value
        return self.hook_fused(torch.where(fuse[..., None], fused, embed))


class FullBandwidthLM(DecoderLM):
    arch = "fbt"
    cfg: FBTConfig
    # standard: plain everywhere; soft: plain prompt, then every step fused with the carried state;
    # fused: K-pass prompt (passes='exact': the sequential recurrence), then soft steps
    regimes = ("standard", "soft", "fused")

    def __init__(self, cfg: FBTConfig):
        super().__init__(cfg)
        self.fusion = Fusion(cfg)
        self._finish_init()

    def added_parameters(self) -> dict[str, int]:
        return {f"fusion.{name}": 0 for name, _ in self.fusion.named_parameters()}

    def run_passes(
        self,
        tokens: Tensor,
        passes: int = 1,
        *,
        fuse_mask: Tensor | bool | None = None,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
        perturb: Callable[[Tensor, int], Tensor] | None = None,
        detach_states: bool = False,
        state: Tensor | None = None,
        commit: bool = True,
    ) -> list[Tensor]:
        """Carried states [batch, pos, d_model] of every pass (a list of ``passes`` tensors).

        Pass 1 feeds plain embeddings, except that a position whose previous state is already
        known (the first position after a cached past) is fused with it. Pass k > 1 fuses each
        ``fuse_mask`` position with pass k-1's state at the position before it.

        fuse_mask: [batch, pos] bool, or one bool for every position (which the host knows
            without reading the device); default every position that has a previous state. It is
            always restricted to positions that have one (the first position has none unless the
            cache holds a state).
        cache: only the last pass writes keys/values; earlier passes read the cached past.
        perturb: ``perturb(states, pass_index)`` returns the fed-back states to use (training
            jitter); called on every state fed back, [batch, pos, d_model].
        detach_states: stop gradients through the states fed back (ablation).
        state: [batch, d_model] the carried state before the first position, in place of the
            cache's (with a cache: the feedback map at a chosen state).
        commit: with ``False`` the cache is only read (nothing written, no bookkeeping), so the
            same context can be evaluated at many states; its batch may then be 1.
        """
        if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
            raise ValueError(f"passes={passes!r}: expected an integer >= 1")
        self.check_tokens(tokens, cache)
        self.forward_calls += 1
        B, T = tokens.shape
        known = fuse_mask if isinstance(fuse_mask, bool) else None  # a constant the host knows: no read of the device
        if isinstance(fuse_mask, bool):
            fuse_mask = torch.full_like(tokens, fuse_mask, dtype=torch.bool)
        carried = state if state is not None else (cache.state if (cache is not None and cache.length > 0) else None)
        has_prev = torch.ones(B, T, dtype=torch.bool, device=tokens.device)
        if carried is None:
            has_prev[:, 0] = False
        if fuse_mask is None:
            fuse_mask = has_prev
        else:
            if fuse_mask.shape != tokens.shape:
                raise ValueError(f"fuse_mask shape {tuple(fuse_mask.shape)} != tokens shape {tuple(tokens.shape)}")
            fuse_mask = fuse_mask.to(device=tokens.device, dtype=torch.bool) & has_prev
        embed = self.stack_input(tokens)
        first = carried if carried is not None else embed.new_zeros(B, embed.shape[-1])

        ctx = self.context(tokens, cache, attention_mask)
        states: list[Tensor] = []
        with self.guard_scope():  # the numerics guard, if on, checks every pass once they have run
            try:
                for k in range(passes):
                    self.current_pass = k
                    ctx.write = commit and k == passes - 1
                    if k == 0:
                        # only the first position can know its previous state before any pass has run
                        fuse = fuse_mask.clone()
                        fuse[:, 1:] = False
                        # no carried state: nothing to fuse at the first position (no read of the mask)
                        if carried is not None and (known if known is not None else bool(fuse.any())):
                            prev = torch.cat((first[:, None], embed.new_zeros(B, T - 1, embed.shape[-1])), 1)
                            x = self.fusion(self._feedback(prev, k, perturb, detach_states), embed, fuse)
                        else:
                            x = embed
                    else:
                        prev = torch.cat((first[:, None], states[-1][:, :-1]), dim=1)
                        x = self.fusion(self._feedback(prev, k, perturb, detach_states), embed, fuse_mask)
                    states.append(self.run_stack(x, ctx))
            finally:
                self.current_pass = 0
            if commit:
                self.commit(cache, ctx, T)
                if cache is not None:
                    cache.hold_state(states[-1][:, -1])
        return states

    @staticmethod
    def _feedback(prev: Tensor, pass_index: int, perturb, detach: bool) -> Tensor:
        if detach:
            prev = prev.detach()
        return perturb(prev, pass_index) if perturb is not None else prev

    def final_states(
        self,
        tokens: Tensor,
        *,
        passes: int = 1,
        fuse_mask: Tensor | bool | None = None,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
        state: Tensor | None = None,
        commit: bool = True,
    ) -> Tensor:
        """Carried states [batch, pos, d_model] of the last pass (arguments as in ``run_passes``)."""
        return self.run_passes(
            tokens, passes, fuse_mask=fuse_mask, cache=cache, attention_mask=attention_mask, state=state, commit=commit
        )[-1]

    def prefill(
        self,
        tokens: Tensor,
        *,
        regime: str = "standard",
        passes: int | str = 1,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Final states [batch, pos, d_model] of a prompt under ``regime`` (into ``cache`` if given).
        ``standard`` and ``soft`` run it plain; ``fused`` fuses every position after a row's first
        real token, by ``passes`` Jacobi passes or, with ``passes='exact'``, by the sequential
        recurrence, one position per call (the one place it is written)."""
        self.check_regime(regime)
        if regime != "fused":
            return self.final_states(tokens, fuse_mask=False, cache=cache, attention_mask=attention_mask)
        real = attention_mask if attention_mask is not None else torch.ones_like(tokens, dtype=torch.bool)
        after_real = torch.cat((torch.zeros_like(real[:, :1]), real[:, :-1]), dim=1)
        fuse = real & after_real
        if isinstance(passes, int):
            return self.final_states(tokens, passes=passes, fuse_mask=fuse, cache=cache, attention_mask=attention_mask)
        if passes != "exact":
            raise ValueError(f"passes={passes!r}: expected a positive number of passes or 'exact'")
        cache = cache if cache is not None else self.make_cache(tokens.shape[1])
        states = []
        for t in range(tokens.shape[1]):
            mask = attention_mask[:, t : t + 1] if attention_mask is not None else None
            states.append(self.final_states(tokens[:, t : t + 1], fuse_mask=fuse[:, t : t + 1], cache=cache, attention_mask=mask))
        return torch.cat(states, dim=1)

    def step(self, tokens: Tensor, *, regime: str = "standard", cache: KVCache) -> Tensor:
        """Final states [batch, 1, d_model] of one new token per row after ``cache``; ``soft`` and
        ``fused`` fuse it with the carried state."""
        self.check_regime(regime)
        fuse = regime != "standard"
        if self.steps_statically(tokens, cache):
            h = self.static_step(tokens, cache, fuse)
            cache.hold_state(h[:, -1])
            return h
        return self.final_states(tokens, fuse_mask=fuse, cache=cache)

    def step_input(self, tokens: Tensor, cache: KVCache, fuse: bool) -> Tensor:
        """The plain embedding, or (``fuse``) its fusion with the carried state, as in ``run_passes``."""
        embed = self.stack_input(tokens)
        if not fuse:
            return embed
        assert cache.state is not None  # a prefill came first
        return self.fusion(cache.state[:, None], embed, torch.ones_like(tokens, dtype=torch.bool))

    def forward(
        self,
        tokens: Tensor,
        *,
        passes: int = 1,
        fuse_mask: Tensor | None = None,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits [batch, pos, d_vocab] of the last pass. ``passes=1`` with no cached state is the
        plain backbone (the ``standard`` regime); a cached continuation fuses its first position
        with the cached state unless ``fuse_mask`` says otherwise (the ``soft`` regime)."""
        with self.guard_scope():
            return self.readout(
                self.final_states(tokens, passes=passes, fuse_mask=fuse_mask, cache=cache, attention_mask=attention_mask)
            )
