"""The backbone's remaining pieces: RMSNorm, rotary embeddings, SwiGLU, the block and weight
initialisation (config, cache and attention have modules of their own).

Dimension names (used in every shape comment): batch pos d_model n_heads d_head d_mlp d_vocab
n_streams n_passes. ``pos`` counts sequence positions as the layer sees them: for Hidden Decoding
an interleaved sequence of ``n_streams * tokens`` positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from models.attention import Attention, AttnContext
from models.config import ModelConfig
from models.kv_cache import LayerKV
from models.stacked import Stacked


class RMSNorm(nn.Module):
    """Llama RMSNorm; reduced-precision inputs are normalised in fp32 like Hugging Face's."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d_model))
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]
        self.guard = None  # a models.numerics.NumericsGuard while guard_numerics is on
        self.site = ""  # this norm's path in the model (set with the guard)

    def forward(self, x: Tensor, sink: list[Tensor] | None = None) -> Tensor:
        """``sink``: a list the compiled decode step collects this norm's status in (the guard's
        records cannot be written from compiled code; the step returns the statuses and records
        them): 0 when every input is finite, NaN when one is NaN, inf when one overflowed."""
        dtype = x.dtype
        xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        mean_square = xf.pow(2).mean(-1, keepdim=True)  # [batch, pos, 1]
        if sink is not None:
            bad = torch.where(mean_square.isnan().any(), float("nan"), float("inf"))
            sink.append(torch.where(mean_square.isfinite().all(), 0.0, bad))
        elif self.guard is not None:  # inf when the square overflows: rsqrt would turn it into a finite zero
            self.guard.record(self.site, mean_square)
        xf = xf * torch.rsqrt(mean_square + self.eps)
        return self.hook_normalized(self.w * xf.to(dtype))


class Rotary(nn.Module):
    """Rotary position embedding, half-split layout (the Hugging Face Llama convention)."""

    def __init__(self, d_head: int, base: float):
        super().__init__()
        # Not a buffer: model.to(bfloat16) must not round the frequencies (or the positions).
        self.inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head))
        self._on: dict[tuple, Tensor] = {}

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        # positions: [batch, pos] -> cos, sin: [batch, 1, pos, d_head], broadcast over heads.
        # Angles in fp32 (fp64 for an fp64 model), like Hugging Face's Llama.
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        key = (positions.device, compute)
        if key not in self._on:
            self._on[key] = self.inv_freq.to(device=positions.device, dtype=compute)
        freqs = positions.to(compute)[..., None] * self._on[key]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_gate = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.W_in = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.W_out = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)
        self.stacked = Stacked(self.W_gate, self.W_in)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp] gate pre-activation
        self.hook_pre_linear = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: Tensor, stacked: bool = False) -> Tensor:
        """``stacked``: project through ``self.stacked`` (the fixed-shape decode step)."""
        if stacked:
            gate, lin = self.stacked(x).chunk(2, dim=-1)
        else:
            gate, lin = self.W_gate(x), self.W_in(x)
        return self.W_out(self.hook_post(F.silu(self.hook_pre(gate)) * self.hook_pre_linear(lin)))


class Block(nn.Module):
    """``mirror='mirrored'`` (Hidden Decoding's KV-Mirror): only the last stream is computed; the
    others pass through unchanged (``hook_attn_out`` and ``hook_mlp_out`` are zero there, and the
    hooks inside attention and the MLP see the last stream alone)."""

    def __init__(self, cfg: ModelConfig, attn: Attention | None = None):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = attn if attn is not None else Attention(cfg)
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Tensor, ctx: AttnContext, kv: LayerKV | None) -> Tensor:
        x = self.hook_resid_pre(x)
        if self.attn.mirror == "mirrored" and ctx.n_streams > 1:
            return self._last_stream_only(x, ctx, kv)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x, ctx.sink), ctx, kv)))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x, ctx.sink), ctx.static is not None)))

    def _last_stream_only(self, x: Tensor, ctx: AttnContext, kv: LayerKV | None) -> Tensor:
        n = ctx.n_streams

        def widen(last: Tensor) -> Tensor:  # [batch, tokens, d] -> [batch, tokens * n, d], zero off the last stream
            out = x.new_zeros(x.shape)
            out[:, n - 1 :: n] = last
            return out

        attn = self.attn(self.ln1(x[:, n - 1 :: n], ctx.sink), ctx, kv)
        x = self.hook_resid_mid(x + self.hook_attn_out(widen(attn)))
        mlp = self.mlp(self.ln2(x[:, n - 1 :: n], ctx.sink), ctx.static is not None)
        return self.hook_resid_post(x + self.hook_mlp_out(widen(mlp)))


def init_weights(model: nn.Module, cfg: ModelConfig, added: dict[str, int] | None = None) -> None:
    """Normal(0, init_std) everywhere; residual output projections scaled by 1/sqrt(2 n_layers)
    so the residual stream (and the carried state) keeps O(1) scale as depth grows.

    Matched initialisation: ``added`` names what an architecture adds to the baseline (parameter
    name -> the index along dim 0 from which it is its own: 0 for a whole tensor, 1 for HD's stream
    tables after the first). Everything else is drawn first, from the global generator in the
    baseline's order, so at one seed it is bitwise the baseline's; the added parts are drawn after
    it, from a generator of their own seeded by one draw of the global one."""
    added = added or {}
    params = list(model.named_parameters())
    with torch.no_grad():
        for name, p in params:
            _init_parameter(name, p[: added[name]] if name in added else p, cfg, None)
        if added:
            # a CPU draw even where the model is built on the meta device (a checkpoint's shapes)
            own = torch.Generator().manual_seed(int(torch.randint(2**62, (), device="cpu")))
            for name, p in params:
                if name in added and not p.is_meta:
                    _init_parameter(name, p[added[name] :], cfg, own)


def _init_parameter(name: str, p: Tensor, cfg: ModelConfig, generator: torch.Generator | None) -> None:
    if not p.numel():
        return
    if name.endswith("ln1.w") or name.endswith("ln2.w") or name.endswith("ln_final.w"):
        p.fill_(1.0)
    elif name.endswith("attn.W_O.weight") or name.endswith("mlp.W_out.weight"):
        p.normal_(0.0, cfg.init_std / math.sqrt(2 * cfg.n_layers), generator=generator)
    else:
        p.normal_(0.0, cfg.init_std, generator=generator)
