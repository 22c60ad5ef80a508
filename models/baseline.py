"""The baseline decoder-only LM (numerically the Llama architecture) and the base class the other
architectures extend: input validation, positions and padding, the block stack, the tied readout.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.checkpoint import checkpoint
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from models.attention import Attention, AttnContext, _is_hooked
from models.config import ModelConfig
from models.kv_cache import KVCache, StaticStep
from models.layers import Block, RMSNorm, Rotary, SwiGLU, init_weights
from models.numerics import UNGUARDED


class Embed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))  # [d_vocab, d_model]

    def forward(self, tokens: Tensor) -> Tensor:
        # F.embedding, not W_E[tokens]: the same rows, but indexing's backward (index_put_ with
        # accumulation) adds repeated tokens' rows across CPU threads in arrival order, so two
        # identical training steps can differ; embedding's backward is deterministic
        return nn.functional.embedding(tokens, self.W_E)


class DecoderLM(HookedRootModule):
    """Pre-norm decoder stack with a tied readout. Subclasses decide how tokens become the
    stack's input (``n_streams`` positions per token for Hidden Decoding)."""

    arch = "baseline"
    n_streams = 1
    regimes: tuple[str, ...] = ("standard",)  # the decoding regimes ``prefill`` and ``step`` know

    def __init__(self, cfg: ModelConfig, blocks: list[Block] | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.rotary = Rotary(cfg.d_head, cfg.rope_base)
        self.blocks = nn.ModuleList(blocks if blocks is not None else [Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = RMSNorm(cfg.d_model, cfg.norm_eps)
        # the readout's own [d_vocab, d_model] matrix when it is not tied to the input embedding
        self.unembed = None if cfg.tie_embeddings else nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        # Where the hooks are firing: the pass of a multi-pass forward (0-based) and a count of
        # forward calls (decoding steps). Labels only, read by the workbench's activation recorder.
        self.current_pass = 0
        self.forward_calls = 0
        self.numerics_guard = None  # set by models.guard_numerics
        self.check_token_values = True  # off inside trusted_ids
        self.compiled_mode: str | None = None  # the torch.compile mode of compiled steps, after compile_step()
        # the compiled engine's caches between generations, by (batch, capacity): their buffers keep
        # the addresses a CUDA graph captured (``workbench.runtime.decoding``)
        self.decode_caches: dict[tuple[int, int], KVCache] = {}
        self.patterns_forced = False  # see compute_patterns
        # Activation checkpointing: in training, keep only each block's input and recompute the
        # block in backward (memory per block falls from its activations to one [batch, pos,
        # d_model] tensor, for about one more forward of compute). Set by the training loop.
        self.checkpoint_blocks = False

    def guard_scope(self):
        """The context a model call runs in: the numerics guard checks its records when the
        outermost call ends (one host sync per call, none when no guard is on)."""
        return self.numerics_guard if self.numerics_guard is not None else UNGUARDED

    def checked_logits(self, logits: Tensor) -> Tensor:
        """``logits`` [batch, pos, (n_streams,) d_vocab], recorded by the numerics guard when one is on."""
        if self.numerics_guard is not None:
            self.numerics_guard.record("readout", logits)
            self.numerics_guard.settle()
        return logits

    def norm_sites(self) -> list[str]:
        """The norms' paths in the order a forward calls them (each block's ``ln1``, ``ln2``, then
        ``ln_final``): the sites of a compiled step's statuses."""
        n = self.cfg.n_layers
        return [f"blocks.{i}.ln{j}" for i in range(n) for j in (1, 2)] + ["ln_final"]

    def compute_patterns(self, enabled: bool = True) -> None:
        """Always compute attention patterns explicitly (so ``hook_pattern`` fires for tools that
        do not attach TransformerLens hooks, e.g. nnsight). Off by default: SDPA's fused kernel
        is used whenever nothing is attached to ``hook_pattern``."""
        for module in self.modules():
            if isinstance(module, Attention):
                module.force_pattern = enabled
        self.patterns_forced = enabled

    def _finish_init(self) -> None:
        init_weights(self, self.cfg, self.added_parameters())
        self.setup()

    def added_parameters(self) -> dict[str, int]:
        """What this architecture adds to the baseline: parameter name -> the index along dim 0
        from which the tensor is its own (0: all of it). ``init_weights`` draws these after, and
        apart from, the parameters it shares with the baseline (matched initialisation)."""
        return {}

    # ---- inputs -------------------------------------------------------------------------------

    def check_token_range(self, lo: int, hi: int) -> None:
        """Refuse token ids from ``lo`` to ``hi`` unless they are in the vocabulary (for a caller
        that read the range where it costs nothing, such as a batch still on the host)."""
        if lo < 0 or hi >= self.cfg.d_vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.cfg.d_vocab})")

    def check_tokens(self, tokens: Tensor, cache: KVCache | None = None) -> None:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a [batch, pos] integer tensor, got {shape}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"tokens must be an integer tensor, got dtype {tokens.dtype}")
        if tokens.numel() and self.check_token_values:  # two host reads: see trusted_ids
            self.check_token_range(int(tokens.min()), int(tokens.max()))
        past = cache.length if cache is not None else 0
        if past + tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"sequence of {past + tokens.shape[1]} tokens"
                + (f" ({past} cached + {tokens.shape[1]} new)" if past else "")
                + f" is longer than the context n_ctx={self.cfg.n_ctx}"
            )

    def make_cache(self, capacity: int | None = None, *, static: bool = False, compiled: bool = False) -> KVCache:
        """An empty cache for up to ``capacity`` tokens (default: the context length). ``static``:
        ``step`` runs on it with fixed shapes (see ``KVCache``); ``compiled`` (implies ``static``):
        that step is ``torch.compile``d (see ``compile_step``)."""
        capacity = self.cfg.n_ctx if capacity is None else capacity
        if not 0 < capacity <= self.cfg.n_ctx:
            raise ValueError(f"cache capacity {capacity} must be in [1, n_ctx={self.cfg.n_ctx}]")
        return KVCache(self.cfg.n_layers, capacity, static=static or compiled, compiled=compiled)

    def context(
        self,
        tokens: Tensor,
        cache: KVCache | None,
        attention_mask: Tensor | None,
        write: bool = True,
    ) -> AttnContext:
        """Rotary tables and masks for ``tokens`` (optionally after a cached past).

        ``attention_mask``: [batch, pos] bool for the new tokens, False at padding. Rotary
        positions count real tokens only, so a left-padded row matches the unpadded sequence.
        """
        B, T = tokens.shape
        past = cache.length if cache is not None else 0
        past_valid = cache.key_valid if cache is not None else None
        if attention_mask is not None:
            if attention_mask.shape != tokens.shape:
                raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != tokens shape {tuple(tokens.shape)}")
            attention_mask = attention_mask.to(device=tokens.device, dtype=torch.bool)
        offset = cache.offset if cache is not None else 0
        if attention_mask is None and past_valid is None:
            positions = torch.arange(offset + past, offset + past + T, device=tokens.device).expand(B, T)
            key_valid = None
        else:
            new_valid = attention_mask if attention_mask is not None else tokens.new_ones(B, T, dtype=torch.bool)
            if past_valid is None:
                past_valid = tokens.new_ones(B, past, dtype=torch.bool)
            key_valid = torch.cat((past_valid, new_valid), dim=1)
            seen = cache.n_valid if (cache is not None and cache.n_valid is not None) else offset + past
            positions = (
                torch.cumsum(new_valid.long(), dim=1) - 1 + torch.as_tensor(seen, device=tokens.device).view(-1, 1)
            ).clamp(min=0)
        stream_positions = self.stream_positions(positions)
        dtype = self.embed.W_E.dtype
        cos, sin = self.rotary(stream_positions, dtype)
        return AttnContext(cos, sin, past, key_valid, self.n_streams, cache, write)

    def stream_positions(self, positions: Tensor) -> Tensor:
        """Rotary positions of the stack's sequence from token positions [batch, tokens]."""
        return positions

    @staticmethod
    def commit(cache: KVCache | None, ctx: AttnContext, n_new: int) -> None:
        """Advance the cache's token bookkeeping after the layers wrote their keys/values."""
        if cache is not None:
            cache.advance(ctx.key_valid, n_new, ctx.cos.shape[0], ctx.cos.device)

    # ---- the stack ----------------------------------------------------------------------------

    def run_stack(self, x: Tensor, ctx: AttnContext) -> Tensor:
        """Run the blocks on input embeddings; return the final-normed state [batch, pos, d_model]."""
        cache = ctx.cache
        recompute = self.checkpoint_blocks and self.training and cache is None and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            if recompute:
                x = checkpoint(block, x, ctx, None, use_reentrant=False)
            else:
                x = block(x, ctx, cache.layers[i] if cache is not None else None)
        return self.ln_final(x, ctx.sink)

    def stack_input(self, tokens: Tensor) -> Tensor:
        """The stack's input embeddings [batch, pos, d_model] for ``tokens``."""
        return self.hook_embed(self.embed(tokens))

    @property
    def readout_weight(self) -> Tensor:
        """[d_vocab, d_model]: the readout's matrix (the token embedding, unless untied)."""
        return self.unembed if self.unembed is not None else self.input_table

    @property
    def input_table(self) -> Tensor:
        """[d_vocab, d_model]: the token embedding (Hidden Decoding: its first stream's table)."""
        return self.embed.W_E

    @property
    def carries_state(self) -> bool:
        """Whether decoding feeds a state from step to step (a regime other than ``standard``)."""
        return len(self.regimes) > 1

    def readout(self, h: Tensor) -> Tensor:
        """Readout: logits [batch, pos, d_vocab] from final-normed states."""
        return self.checked_logits(h @ self.readout_weight.T)

    # ---- decoding regimes: what a regime means at the prompt and at one step ---------------------

    def check_regime(self, regime: str) -> None:
        if regime not in self.regimes:
            kind = "needs a Full-Bandwidth model" if regime in ("soft", "fused") else "is unknown"
            raise ValueError(f"regime {regime!r} {kind}; arch {self.arch!r} decodes only {'/'.join(self.regimes)}")

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
        Here every regime is ``standard``; ``passes`` matters only where a regime feeds back."""
        self.check_regime(regime)
        return self.final_states(tokens, cache=cache, attention_mask=attention_mask)

    def step(self, tokens: Tensor, *, regime: str = "standard", cache: KVCache) -> Tensor:
        """Final states [batch, 1 * n_streams, d_model] of one new token per row after ``cache``."""
        self.check_regime(regime)
        if self.steps_statically(tokens, cache):
            return self.static_step(tokens, cache)
        return self.final_states(tokens, cache=cache)

    # ---- the fixed-shape decode step on a static cache ------------------------------------------

    @staticmethod
    def steps_statically(tokens: Tensor, cache: KVCache) -> bool:
        """Whether ``step`` takes the fixed-shape path: a static cache that holds a prefill, one
        token for each of its rows (anything else runs as on a dynamic cache)."""
        return cache.static and cache.valid is not None and tuple(tokens.shape) == (cache.valid.shape[0], 1)

    def step_input(self, tokens: Tensor, cache: KVCache, fuse: bool) -> Tensor:
        """The stack's input [batch, n_streams, d_model] of one step's tokens [batch, 1]."""
        return self.stack_input(tokens)

    def hooks_attached(self) -> bool:
        """Whether anything observes the activations (hooks, or patterns forced for nnsight)."""
        return self.patterns_forced or any(_is_hooked(hp) for hp in self.hook_dict.values())

    def compile_step(self, mode: str | None = None) -> None:
        """Compile the static-cache decode step (used by steps on a ``compiled`` cache) with
        ``torch.compile``; ``mode`` defaults to ``reduce-overhead`` (CUDA graphs) on CUDA and to
        inductor's default elsewhere. Called on the first compiled step if not before. Compiled
        code is shared by every model in the process and reused for the shapes it has seen (the
        weights are its inputs); a new shape or architecture variant compiles again."""
        if mode is None:
            mode = "reduce-overhead" if self.embed.W_E.device.type == "cuda" else "default"
        # one code object serves every model in the process, and each architecture variant, fuse
        # flag and (before dynamo makes it dynamic) batch or capacity is an entry of its cache; past
        # dynamo's default of 8 entries a step would silently run eagerly
        dynamo_config = torch._dynamo.config
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
        if mode not in _COMPILED_STEPS:  # the function, not a bound method: a copy of the model uses its own weights
            # fullgraph: a graph break would split the step into pieces run between Python, and
            # under CUDA graphs each piece would be a graph of its own; better to fail at compile
            _COMPILED_STEPS[mode] = torch.compile(DecoderLM._static_step_core, mode=mode, fullgraph=True)
        self.compiled_mode = mode

    def static_step(self, tokens: Tensor, cache: KVCache, fuse: bool = False) -> Tensor:
        """Final states [batch, n_streams, d_model] of one token per row [batch, 1] on a static
        cache: the keys and values go in place at the cache's index, attention runs over the whole
        buffer under a mask, so every step has the same shapes (compiled after ``compile_step``).
        ``fuse``: feed the cache's carried state back (FBT's soft steps)."""
        self.check_tokens(tokens, cache)
        self.forward_calls += 1
        if not cache.weights_checked:  # once per generation: the weights may have changed since the last
            for module in self.modules():
                if isinstance(module, (Attention, SwiGLU)):
                    module.stacked.refresh()
            cache.weights_checked = True
        with self.guard_scope():
            # hooks are Python, and dynamo cannot trace under a dispatch mode (an op counter): both run eagerly
            if not cache.compiled or self.hooks_attached() or _get_current_dispatch_mode() is not None:
                h = self._static_step_core(tokens, cache, fuse, False)[0]  # the norms report to the guard themselves
            else:
                if self.compiled_mode is None:
                    self.compile_step()
                assert self.compiled_mode is not None
                cache.mark_static()
                h, status = _COMPILED_STEPS[self.compiled_mode](self, tokens, cache, fuse, self.numerics_guard is not None)
                if status is not None and self.numerics_guard is not None:  # read with the guard's other records
                    for site, value in zip(self.norm_sites(), status.unbind()):
                        self.numerics_guard.record(site, value)
                if self.compiled_mode == "reduce-overhead":
                    h = h.clone()  # a CUDA graph's next replay overwrites its outputs
            cache.advance_step()
        return h

    def _static_step_core(self, tokens: Tensor, cache: KVCache, fuse: bool, collect: bool) -> tuple[Tensor, Tensor | None]:
        """The fixed-shape step (what ``compile_step`` compiles). Reads no Python number that
        changes between steps; writes only the new token's slots. ``collect``: also return each
        norm's status [n_norms] in ``norm_sites`` order (0: finite; NaN or inf: what its input held)."""
        assert cache.valid is not None and cache.index is not None and cache.next_pos is not None
        cache.valid.index_fill_(1, cache.index.view(1), True)
        end = 0 if torch.compiler.is_compiling() else cache.length + 1  # never read when compiled
        cos, sin = self.rotary(self.stream_positions(cache.next_pos[:, None]), self.embed.W_E.dtype)
        sink: list[Tensor] | None = [] if collect else None
        ctx = AttnContext(cos, sin, 0, None, self.n_streams, cache, True, StaticStep(cache.index, cache.valid, end), sink)
        h = self.run_stack(self.step_input(tokens, cache, fuse), ctx)
        return h, (torch.stack(sink) if sink is not None else None)

    def final_states(
        self,
        tokens: Tensor,
        *,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Final-normed states [batch, pos, d_model]. With ``cache``, ``tokens`` continue the cached
        sequence. ``attention_mask`` [batch, pos] is False at (left) padding."""
        self.check_tokens(tokens, cache)
        self.forward_calls += 1
        with self.guard_scope():
            ctx = self.context(tokens, cache, attention_mask)
            h = self.run_stack(self.stack_input(tokens), ctx)
            self.commit(cache, ctx, tokens.shape[1])
        return h

    def forward(
        self,
        tokens: Tensor,
        *,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Logits [batch, pos, d_vocab]; arguments as in ``final_states``."""
        with self.guard_scope():
            return self.readout(self.final_states(tokens, cache=cache, attention_mask=attention_mask))


_COMPILED_STEPS: dict[str, Callable] = {}  # torch.compile mode -> the compiled DecoderLM._static_step_core


class BaselineLM(DecoderLM):
    arch = "baseline"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self._finish_init()


def _identity(x):
    return x


def without_hooks(model: DecoderLM) -> DecoderLM:
    """A copy of ``model`` whose hook points are plain functions (no module call, no hooks).

    The reference for "hooks change nothing when unused" and for the hook-overhead benchmark.
    """
    clone = copy.deepcopy(model)
    for name in list(clone.hook_dict):
        parent_name, _, attr = name.rpartition(".")
        parent = clone.get_submodule(parent_name) if parent_name else clone
        del parent._modules[attr]
        object.__setattr__(parent, attr, _identity)
    clone.hook_dict, clone.mod_dict = {}, {}
    return clone


class trusted_ids:
    """``with trusted_ids(model):`` the model's calls skip the host read of their token ids' range
    (two syncs per call; shapes and context lengths are still checked). For a decode loop whose ids
    come from the model's own readout (an argmax or a draw over ``d_vocab`` logits, or a pad id the
    caller checked once): those are in the vocabulary by construction."""

    def __init__(self, model: DecoderLM):
        self.model = model

    def __enter__(self) -> None:
        self.previous, self.model.check_token_values = self.model.check_token_values, False

    def __exit__(self, *exc) -> None:  # never swallows an exception
        self.model.check_token_values = self.previous
