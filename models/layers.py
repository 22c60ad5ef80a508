"""Shared backbone pieces: the config, RMSNorm, rotary embeddings, attention, SwiGLU, the block,
and the key/value cache.

Dimension names (used in every shape comment): batch pos d_model n_heads d_head d_mlp d_vocab
n_streams n_passes. ``pos`` counts sequence positions as the layer sees them: for Hidden Decoding
an interleaved sequence of ``n_streams * tokens`` positions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from models.fields import ConfigError, check_config

SIZE_LIMIT = 2**63 - 1  # torch describes sizes and indices as int64: a larger one cannot even be asked for


def check_size(name: str, value: int) -> None:
    """Refuse a size or position count past ``SIZE_LIMIT``: torch would fail on it with an overflow
    deep inside a build or a mask, not with a message naming the field. (What fits in memory is the
    workbench's to check, where it knows the machine.)"""
    if value > SIZE_LIMIT:
        raise ConfigError(f"config field {name}={value}: a size torch cannot allocate (expected at most 2**63 - 1)")


@dataclass
class ModelConfig:
    """Shape and numerics of the Llama-style backbone shared by every architecture."""

    d_vocab: int = 128
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention); None: n_heads
    d_mlp: int = 176
    n_ctx: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    tie_embeddings: bool = True  # the readout is the (first) input embedding table; False: its own matrix

    def __post_init__(self) -> None:
        check_config(self)  # types first: the checks below compare numbers
        for name in ("d_vocab", "d_model", "n_layers", "n_heads", "d_mlp", "n_ctx"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config field {name}={getattr(self, name)!r}: expected an integer >= 1")
            check_size(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ConfigError(f"config field d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if not 1 <= self.n_kv_heads <= self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"config field n_kv_heads={self.n_kv_heads!r}: expected a divisor of n_heads={self.n_heads} "
                "(each key/value head serves n_heads / n_kv_heads query heads)"
            )
        if self.d_head % 2:
            raise ConfigError(f"d_head = d_model / n_heads = {self.d_head}: rotary embeddings need it even")
        # JSON and --set both accept Infinity; rotary angles, the norm and the init need finite values
        for name, ok, expected in (
            ("rope_base", 1 < self.rope_base < math.inf, "a finite number > 1"),
            ("norm_eps", 0 < self.norm_eps < 1, "a number in (0, 1)"),
            ("init_std", 0 < self.init_std < math.inf, "a finite number > 0"),
        ):
            if not ok:
                raise ConfigError(f"config field {name}={getattr(self, name)!r}: expected {expected}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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


def _is_hooked(hook_point) -> bool:
    """True if anything is attached (TransformerLens, nnsight or plain torch hooks)."""
    return isinstance(hook_point, nn.Module) and bool(hook_point._forward_hooks or hook_point._backward_hooks)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` (rotate_half(x) = [-x2, x1]), computed half by half:
    [x1 cos1 - x2 sin1, x2 cos2 + x1 sin2]. The same roundings as the textbook formula (a + (-b)
    is a - b in IEEE arithmetic), so bit for bit the same result, without building the negated,
    rotated copy. The result is contiguous in ``x``'s shape."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c1, c2, s1, s2 = cos[..., :half], cos[..., half:], sin[..., :half], sin[..., half:]
    return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)


class LayerKV:
    """Preallocated key/value buffers of one layer, in the layout that layer attends in."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # [batch', n_kv_heads, capacity, d_head]
        self.v: Tensor | None = None
        self.length = 0
        self.per_token = 1  # positions per token in this layer's layout (n_streams in HD cross layers)

    def extend(self, k: Tensor, v: Tensor, capacity: int, write: bool) -> tuple[Tensor, Tensor]:
        """Return past + new keys and values; store the new ones only if ``write``. A read-only
        call may bring a larger batch than the cache holds when the cache has batch 1 (many
        states evaluated against one context)."""
        n = k.shape[2]
        if self.length + n > capacity:
            raise ValueError(f"key/value cache holds {capacity} positions; {self.length + n} requested")
        if not write:
            if self.length == 0:
                return k, v
            assert self.k is not None and self.v is not None  # length > 0: the buffers exist
            past_k, past_v = self.k[:, :, : self.length], self.v[:, :, : self.length]
            if past_k.shape[0] != k.shape[0] and past_k.shape[0] == 1:
                past_k = past_k.expand(k.shape[0], -1, -1, -1)
                past_v = past_v.expand(k.shape[0], -1, -1, -1)
            return torch.cat((past_k, k), dim=2), torch.cat((past_v, v), dim=2)
        if self.k is None or self.v is None:
            shape = (k.shape[0], k.shape[1], capacity, k.shape[3])
            # zeros, not empty: a static step attends over the whole buffer, and a masked key's
            # weight is 0 but 0 * NaN (uninitialised memory) would still be NaN
            self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
        keys, values = self.k, self.v
        end = self.length + n
        keys[:, :, self.length : end] = k
        values[:, :, self.length : end] = v
        self.length = end
        return keys[:, :, :end], values[:, :, :end]

    def write_at(self, k: Tensor, v: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values [batch', n_kv_heads, new, d_head] in place at ``slots`` [new] and
        return the whole buffers (a static cache's step: fixed shapes, no growing slice)."""
        assert self.k is not None and self.v is not None  # a static step follows a prefill
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        return self.k, self.v

    def drop_oldest(self, n: int) -> None:
        """Forget the oldest ``n`` positions (a sliding window)."""
        if self.k is None or self.v is None or n <= 0:
            return
        keep = self.length - n
        self.k[:, :, :keep] = self.k[:, :, n : self.length].clone()
        self.v[:, :, :keep] = self.v[:, :, n : self.length].clone()
        self.length = keep


class KVCache:
    """Key/value cache for incremental decoding, with per-row bookkeeping in token units.

    ``key_valid`` marks real (non-padding) tokens; ``n_valid`` counts them per row and gives the
    next rotary position. ``state`` is the Full-Bandwidth carried state at the last position.

    A ``static`` cache keeps the same buffers and also its bookkeeping in tensors of fixed shape
    (``valid``, ``next_pos``, ``index``, a ``state`` buffer), so that a model's ``step`` on it has
    fixed shapes: the new token's keys and values are written in place at ``index`` and attention
    runs over the whole buffer under a mask. That is what lets a decode step be compiled (and
    captured as a CUDA graph). Any other call on a static cache works as on a dynamic one.
    """

    def __init__(self, n_layers: int, capacity: int, static: bool = False, compiled: bool = False):
        self.layers = [LayerKV() for _ in range(n_layers)]
        self.capacity = capacity  # tokens
        self.length = 0  # tokens stored
        self.static = static or compiled
        self.compiled = compiled  # static steps run the model's compiled step (unless hooks are attached)
        self._key_valid: Tensor | None = None  # [batch, length] bool; None while every token is real
        self._n_valid: Tensor | None = None  # [batch] long
        self.state: Tensor | None = None  # [batch, d_model]
        self.offset = 0  # rotary position of the first cached token (grows when the window slides)
        # static bookkeeping, allocated by the first write (the prefill) once the batch is known
        self.valid: Tensor | None = None  # [batch, capacity] bool: True at real cached tokens only
        self.next_pos: Tensor | None = None  # [batch] long: the rotary position of each row's next token
        self.index: Tensor | None = None  # [] long: the next token's slot (== length)
        self.padded = False  # some row holds padding (then key_valid and n_valid are not None)

    @property
    def key_valid(self) -> Tensor | None:
        if self.static:
            return self.valid[:, : self.length] if (self.padded and self.valid is not None) else None
        return self._key_valid

    @property
    def n_valid(self) -> Tensor | None:
        return (self.next_pos if self.padded else None) if self.static else self._n_valid

    def advance(self, key_valid: Tensor | None, n_new: int, batch: int, device: torch.device) -> None:
        """Bookkeeping after the layers stored ``n_new`` tokens: ``key_valid`` [batch, length +
        n_new] bool is the call's mask over every cached token (None: all real)."""
        seen = self.n_valid if self.n_valid is not None else self.offset + self.length
        if key_valid is not None:
            n_valid = seen + key_valid[:, -n_new:].sum(dim=1)
        end = self.length + n_new
        if not self.static:
            if key_valid is not None:
                self._n_valid, self._key_valid = n_valid, key_valid
            self.length = end
            return
        if self.valid is None or self.next_pos is None or self.index is None:
            self.valid = torch.zeros(batch, self.capacity, dtype=torch.bool, device=device)
            self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)
            self.index = torch.zeros((), dtype=torch.long, device=device)
        if key_valid is not None:
            self.padded = True
            self.valid[:, :end] = key_valid
            self.next_pos.copy_(n_valid)
        else:
            self.valid[:, self.length : end] = True
            self.next_pos.fill_(self.offset + end)
        self.index.fill_(end)
        self.length = end

    def mark_static(self) -> None:
        """Tell ``torch.compile`` that the buffers a compiled step reads and writes in place keep
        their addresses from step to step (``torch._dynamo.mark_static_address``, unguarded): CUDA
        graphs then capture the writes instead of skipping the graph for "mutated inputs". A buffer
        replaced later (compaction) is marked when the next compiled step calls this again."""
        tensors = [self.valid, self.next_pos, self.index, self.state]
        for t in tensors + [t for layer in self.layers for t in (layer.k, layer.v)]:
            if t is not None and getattr(t, "_dynamo_static_input_type", None) is None:
                torch._dynamo.mark_static_address(t)

    def advance_step(self) -> None:
        """Bookkeeping after a static step stored one real token per row at ``index``."""
        assert self.index is not None and self.next_pos is not None
        self.length += 1
        for layer in self.layers:
            layer.length += layer.per_token
        self.index.add_(1)
        self.next_pos.add_(1)

    def keep_rows(self, rows: Tensor, batch: int) -> None:
        """Keep only the batch rows ``rows`` [kept] (ascending indices into the current ``batch``
        rows): finished sequences leave the batch, the others decode on exactly as before."""
        for layer in self.layers:
            if layer.k is None or layer.v is None:
                continue
            per_row = layer.k.shape[0] // batch  # n_streams in HD's intra-stream layers, else 1
            idx = (rows[:, None] * per_row + torch.arange(per_row, device=rows.device)).flatten()
            layer.k, layer.v = layer.k.index_select(0, idx), layer.v.index_select(0, idx)
        for name in ("valid", "next_pos", "_key_valid", "_n_valid", "state"):
            value = getattr(self, name)
            if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch:
                setattr(self, name, value.index_select(0, rows))

    def slide(self, keep: int) -> None:
        """Keep only the newest ``keep`` tokens. Cached keys keep their absolute rotary phases and
        new tokens continue the absolute positions, so relative distances stay exact."""
        if not 0 < keep <= self.length:
            raise ValueError(f"slide keeps {keep} tokens; the cache holds {self.length}")
        drop = self.length - keep
        for layer in self.layers:
            layer.drop_oldest(drop * layer.per_token)
        if self.valid is not None and self.index is not None:
            self.valid[:, :keep] = self.valid[:, drop : self.length].clone()
            self.valid[:, keep:] = False
            self.index.fill_(keep)
        if self._key_valid is not None:
            self._key_valid = self._key_valid[:, drop:]
        self.length, self.offset = keep, self.offset + drop


@dataclass
class StaticStep:
    """Where a static cache's step writes and what it may attend to (all tensors: fixed shapes)."""

    index: Tensor  # [] long: the new token's slot
    valid: Tensor  # [batch, capacity] bool, the new token's slot included
    end: int  # tokens cached after this step (eager code only: slices a pattern to the real keys)
    masks: dict = dataclasses.field(default_factory=dict)  # built once per step per layer kind

    def slots(self, per_token: int) -> Tensor:
        """[per_token] slots of the new token in a layout with ``per_token`` positions per token."""
        return self.index * per_token + torch.arange(per_token, device=self.index.device)

    def mask(self, per_token: int, rows_per_batch: int, window: int | None) -> Tensor:
        """[batch', 1, per_token, capacity * per_token] bool (True = may attend) over the whole buffer."""
        kind = (per_token, rows_per_batch, window)
        if kind not in self.masks:
            self.masks[kind] = self._mask(per_token, rows_per_batch, window)
        return self.masks[kind]

    def _mask(self, per_token: int, rows_per_batch: int, window: int | None) -> Tensor:
        keys = self.valid
        if rows_per_batch > 1:  # HD intra-stream layers: one row per stream
            keys = keys.repeat_interleave(rows_per_batch, dim=0)
        if per_token > 1:  # HD cross-stream layers: every stream position of a token
            keys = keys.repeat_interleave(per_token, dim=1)
        q_idx = self.slots(per_token)[:, None]
        k_idx = torch.arange(keys.shape[1], device=keys.device)[None, :]
        allowed = k_idx <= q_idx
        if window is not None:
            allowed = allowed & (k_idx > q_idx - window)
        return keys[:, None, None, :] & allowed[None, None]


@dataclass
class AttnContext:
    """Everything a layer needs about positions and masking for one forward call.

    Positions are in the layer-visible sequence (interleaved stream positions for HD).
    """

    cos: Tensor  # [batch, 1, pos, d_head]
    sin: Tensor
    past: int  # tokens already in the cache
    key_valid: Tensor | None  # [batch, past + tokens] bool, token units; None = all real
    n_streams: int
    cache: KVCache | None
    write: bool
    static: StaticStep | None = None  # a static cache's fixed-shape step
    sink: list[Tensor] | None = None  # the norms' mean squares, collected by a compiled step


def attention_mask(
    n_query: int,
    n_key: int,
    key_valid: Tensor | None,
    window: int | None,
    device: torch.device,
    explicit: bool = False,
) -> Tensor | None:
    """Boolean mask [batch or 1, 1, query, key] (True = may attend), or None for plain causal
    unless ``explicit`` asks for that mask too.

    Queries are the last ``n_query`` of ``n_key`` positions. A query always sees itself, so a
    padding query never has an empty row (its output is unused but stays finite).
    """
    if key_valid is None and window is None and not explicit:
        return None
    q_idx = torch.arange(n_key - n_query, n_key, device=device)[:, None]
    k_idx = torch.arange(n_key, device=device)[None, :]
    allowed = k_idx <= q_idx
    if window is not None:
        allowed = allowed & (k_idx > q_idx - window)
    allowed = allowed[None, None]
    if key_valid is not None:
        allowed = allowed & key_valid[:, None, None, :]
        allowed = allowed | (k_idx == q_idx)[None, None]
    return allowed


def shared_kv_mask(n_query: int, n_key: int, n_streams: int, mode: str, device: torch.device) -> Tensor:
    """[1, 1, query, key] bool over interleaved positions (queries the last ``n_query`` of
    ``n_key``): a key of an earlier token is visible only if it is that token's last stream; at the
    query's own token, its own stream (``intra``) or the streams up to its own (``cross``)."""
    q_idx = torch.arange(n_key - n_query, n_key, device=device)[:, None]
    k_idx = torch.arange(n_key, device=device)[None, :]
    q_tok, q_str, k_tok, k_str = q_idx // n_streams, q_idx % n_streams, k_idx // n_streams, k_idx % n_streams
    same = (k_str == q_str) if mode == "intra" else (k_str <= q_str)
    return ((k_tok < q_tok) & (k_str == n_streams - 1) | (k_tok == q_tok) & same)[None, None]


_CAUSAL_BIAS: dict[tuple, Tensor] = {}
_CAUSAL_BIAS_KEEP = 4  # tables kept (the most recently built); each is query x key elements


def _causal_bias(n_query: int, n_key: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[query, key] additive causal mask (0 where a query may attend, -inf after it), queries being
    the last ``n_query`` of ``n_key`` positions; cached per shape, dtype and device."""
    key = (n_query, n_key, dtype, device)
    bias = _CAUSAL_BIAS.get(key)
    if bias is None:
        allowed = attention_mask(n_query, n_key, None, None, device, explicit=True)
        assert allowed is not None  # explicit=True always builds one
        bias = torch.zeros(n_query, n_key, dtype=dtype, device=device).masked_fill_(~allowed[0, 0], float("-inf"))
        while len(_CAUSAL_BIAS) >= _CAUSAL_BIAS_KEEP:
            del _CAUSAL_BIAS[next(iter(_CAUSAL_BIAS))]
        _CAUSAL_BIAS[key] = bias
    return bias


class Attention(nn.Module):
    """Causal multi-head attention through SDPA.

    ``mode='intra'``: each stream attends only to itself (a per-stream causal attention over
    tokens, cost ~ n_streams * tokens^2, never an interleaved-length mask). ``mode='cross'``:
    causal over the interleaved sequence, optionally windowed. With one stream both are the
    ordinary causal attention.

    ``shared_kv`` (Hidden Decoding's shared-cache ablation): only the last stream's keys and values
    of a token stay visible to later tokens. A query at (token i, stream s) sees the last stream of
    tokens j < i, and at token i itself its own stream (``intra``) or streams <= s (``cross``).
    Computed over the interleaved sequence with that mask (the pattern is then [batch, n_heads,
    query_pos, key_pos] in interleaved positions); the last stream sees what it sees without it.
    """

    def __init__(
        self, cfg: ModelConfig, mode: Literal["intra", "cross"] = "intra", window: int | None = None, shared_kv: bool = False
    ):
        super().__init__()
        self.cfg, self.mode, self.window, self.shared_kv = cfg, mode, window, shared_kv
        d = cfg.n_heads * cfg.d_head
        self.n_kv_heads: int = cfg.n_kv_heads or cfg.n_heads
        self.W_Q = nn.Linear(cfg.d_model, d, bias=False)
        self.W_K = nn.Linear(cfg.d_model, self.n_kv_heads * cfg.d_head, bias=False)
        self.W_V = nn.Linear(cfg.d_model, self.n_kv_heads * cfg.d_head, bias=False)
        self.W_O = nn.Linear(d, cfg.d_model, bias=False)
        self.hook_q = HookPoint()  # [batch, pos, n_heads, d_head] (after rotary)
        self.hook_k = HookPoint()  # [batch, pos, n_kv_heads, d_head] (after rotary)
        self.hook_v = HookPoint()  # [batch, pos, n_kv_heads, d_head]
        # [batch, n_heads, query_pos, key_pos]; intra-stream layers with n_streams > 1:
        # [batch, n_streams, n_heads, query_token, key_token] (with shared_kv: interleaved
        # [batch, n_heads, query_pos, key_pos]). Computed only when hooked.
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()  # [batch, pos, n_heads, d_head]
        # Materialise the pattern even with no TransformerLens hook on hook_pattern (for nnsight,
        # which does not register torch hooks). See DecoderLM.compute_patterns.
        self.force_pattern = False

    def forward(self, x: Tensor, ctx: AttnContext, kv: LayerKV | None) -> Tensor:
        B, P, _ = x.shape
        H, Hkv, dh, n = self.cfg.n_heads, self.n_kv_heads, self.cfg.d_head, ctx.n_streams
        # rotary in the [batch, pos, heads, d_head] layout the hooks see (cos, sin: [batch, pos, 1, d_head])
        cos, sin = ctx.cos.transpose(1, 2), ctx.sin.transpose(1, 2)
        q = self.hook_q(apply_rotary(self.W_Q(x).view(B, P, H, dh), cos, sin)).transpose(1, 2)  # [batch, n_heads, pos, d_head]
        k = self.hook_k(apply_rotary(self.W_K(x).view(B, P, Hkv, dh), cos, sin)).transpose(1, 2)  # [batch, n_kv_heads, ...]
        v = self.hook_v(self.W_V(x).view(B, P, Hkv, dh)).transpose(1, 2)
        shared = self.shared_kv and n > 1
        if shared and ctx.static is not None:
            raise NotImplementedError("the shared key/value cache ablation has no static-cache (compiled) step")
        per_stream = self.mode == "intra" and n > 1 and not shared
        key_valid = ctx.key_valid
        if per_stream:
            # [batch, n_heads, tokens*n_streams, d_head] -> [batch*n_streams, n_heads, tokens, d_head]
            q, k, v = (self._split_streams(t, n) for t in (q, k, v))
            if key_valid is not None:
                key_valid = key_valid.repeat_interleave(n, dim=0)
        elif n > 1 and key_valid is not None:
            key_valid = key_valid.repeat_interleave(n, dim=1)
        scale = n if ((self.mode == "cross" or shared) and n > 1) else 1
        explicit = self.force_pattern or _is_hooked(self.hook_pattern)
        if ctx.static is not None:
            assert kv is not None  # a static step always has its cache
            k, v = kv.write_at(k, v, ctx.static.slots(scale))
            mask = ctx.static.mask(scale, n if per_stream else 1, self.window)
            if explicit:  # the pattern a hook sees covers the cached keys only, as in a dynamic step
                end = ctx.static.end * scale
                k, v, mask = k[:, :, :end], v[:, :, :end], mask[..., :end]
        else:
            if kv is not None and ctx.cache is not None:
                kv.per_token = scale
                k, v = kv.extend(k, v, ctx.cache.capacity * scale, ctx.write)
            mask = attention_mask(q.shape[2], k.shape[2], key_valid, self.window, x.device, explicit=shared)
            if shared:
                assert mask is not None  # explicit=True always builds one
                mask = mask & shared_kv_mask(q.shape[2], k.shape[2], n, self.mode, x.device)
        if explicit:
            z = self._attend_explicit(q, k, v, mask, B, n if per_stream else 1)
        elif mask is None and q.shape[2] > 1:
            if q.shape[2] == k.shape[2]:
                z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H)
            else:  # several new queries after a cached past
                causal = attention_mask(q.shape[2], k.shape[2], None, None, x.device, explicit=True)
                z = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, enable_gqa=Hkv != H)
        else:  # a single query sees every cached key, or an explicit padding/window mask
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=Hkv != H)
        if per_stream:
            z = self._merge_streams(z, n)
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, n_heads, d_head]
        return self.W_O(z.reshape(B, P, H * dh))

    def _attend_explicit(self, q, k, v, mask, batch: int, n: int) -> Tensor:
        """Attention with the pattern materialised for ``hook_pattern``: [rows, n_heads, query,
        key] scores, masked to -inf, softmax, pattern @ v. ``mask`` None: causal.

        The scale is applied inside the score matmul (``baddbmm``'s alpha, not a division over
        the scores), and the scores are masked in place: one [rows * n_heads, query, key] tensor
        is allocated before the pattern itself. A causal mask is applied as ``tril_`` then the
        addition of a cached 0 / -inf table, which sets exactly the masked scores to -inf whatever
        they held (NaN and inf included), like ``masked_fill`` but at the cost of two cheap passes.
        """
        rows, H, n_query, dh = q.shape
        n_key = k.shape[2]
        if k.shape[1] != H:  # grouped-query attention: query head h reads key/value head h // (H / n_kv_heads)
            k, v = k.repeat_interleave(H // k.shape[1], dim=1), v.repeat_interleave(H // v.shape[1], dim=1)
        q3, k3 = q.reshape(rows * H, n_query, dh), k.reshape(rows * H, n_key, dh)
        scale = 1.0 / math.sqrt(self.cfg.d_head)
        scores = torch.baddbmm(q3.new_zeros(()), q3, k3.transpose(1, 2), beta=0.0, alpha=scale)
        # in place on the matmul's own output (autograd saves neither it nor a view of it)
        if mask is not None:
            masked = torch.broadcast_to(~mask, (rows, H, n_query, n_key)).reshape(scores.shape)
            scores.masked_fill_(masked, float("-inf"))
        elif n_query > 1:  # causal; a single last query sees every key
            scores.tril_(n_key - n_query).add_(_causal_bias(n_query, n_key, scores.dtype, scores.device))
        pattern = scores.softmax(dim=-1).view(rows, H, n_query, n_key)
        if n > 1:
            pattern = pattern.view(batch, n, *pattern.shape[1:])
        pattern = self.hook_pattern(pattern)
        return pattern.reshape(q.shape[0], *pattern.shape[-3:]) @ v

    @staticmethod
    def _split_streams(t: Tensor, n: int) -> Tensor:
        B, H, P, dh = t.shape
        return t.view(B, H, P // n, n, dh).permute(0, 3, 1, 2, 4).reshape(B * n, H, P // n, dh)

    @staticmethod
    def _merge_streams(t: Tensor, n: int) -> Tensor:
        Bn, H, T, dh = t.shape
        return t.view(Bn // n, n, H, T, dh).permute(0, 2, 3, 1, 4).reshape(Bn // n, H, T * n, dh)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_gate = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.W_in = nn.Linear(cfg.d_model, cfg.d_mlp, bias=False)
        self.W_out = nn.Linear(cfg.d_mlp, cfg.d_model, bias=False)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp] gate pre-activation
        self.hook_pre_linear = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: Tensor) -> Tensor:
        gate = self.hook_pre(self.W_gate(x))
        lin = self.hook_pre_linear(self.W_in(x))
        return self.W_out(self.hook_post(F.silu(gate) * lin))


class Block(nn.Module):
    def __init__(
        self, cfg: ModelConfig, mode: Literal["intra", "cross"] = "intra", window: int | None = None, shared_kv: bool = False
    ):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, mode, window, shared_kv)
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Tensor, ctx: AttnContext, kv: LayerKV | None) -> Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x, ctx.sink), ctx, kv)))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x, ctx.sink))))


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
