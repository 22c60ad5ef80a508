"""Causal multi-head attention: the per-call context (``AttnContext``), rotary application, the
masks and ``Attention`` itself (shapes in the dimension names listed in ``models.layers``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from models.config import ModelConfig
from models.kv_cache import KVCache, LayerKV, StaticStep
from models.stacked import Stacked


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
    mirror: tuple[Tensor, Tensor] | None = None  # KV-Mirror's source keys and values (set by that layer)


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
        self,
        cfg: ModelConfig,
        mode: Literal["intra", "cross"] = "intra",
        window: int | None = None,
        shared_kv: bool = False,
        mirror: Literal["source", "mirrored"] | None = None,
    ):
        super().__init__()
        self.cfg, self.mode, self.window, self.shared_kv, self.mirror = cfg, mode, window, shared_kv, mirror
        d = cfg.n_heads * cfg.d_head
        self.n_kv_heads: int = cfg.n_kv_heads or cfg.n_heads
        self.W_Q = nn.Linear(cfg.d_model, d, bias=False)
        self.W_K = nn.Linear(cfg.d_model, self.n_kv_heads * cfg.d_head, bias=False)
        self.W_V = nn.Linear(cfg.d_model, self.n_kv_heads * cfg.d_head, bias=False)
        self.W_O = nn.Linear(d, cfg.d_model, bias=False)
        self.stacked = Stacked(self.W_Q, self.W_K, self.W_V)
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
        n = ctx.n_streams
        shared = self.shared_kv and n > 1
        if shared and ctx.static is not None:
            raise NotImplementedError("the shared key/value cache ablation has no static-cache (compiled) step")
        # KV-Mirror: x holds the last stream alone; a cross-stream query also sees the other
        # streams, whose keys and values are the source layer's (ctx.mirror; the cache holds the past's)
        mirrored = self.mirror == "mirrored" and n > 1
        if mirrored:
            ctx = dataclasses.replace(ctx, cos=ctx.cos[:, :, n - 1 :: n], sin=ctx.sin[:, :, n - 1 :: n])
        # batch rows per sequence: one per stream in an intra-stream layer, else the interleaved sequence
        rows = n if (self.mode == "intra" and n > 1 and not shared and not mirrored) else 1
        per_token = n if ((self.mode == "cross" or shared) and n > 1) else 1  # cached positions per token
        q, k, v = self._project(x, ctx)
        if self.mirror == "source":
            ctx.mirror = (k, v)
        if mirrored and per_token > 1:
            assert ctx.mirror is not None, "the source layer runs first"
            k, v = (_as_last_stream(own, source, n) for own, source in zip((k, v), ctx.mirror))
        if rows > 1:  # [batch, n_heads, tokens*n_streams, d_head] -> [batch*n_streams, n_heads, tokens, d_head]
            q, k, v = (self._split_streams(t, rows) for t in (q, k, v))
        explicit = self.force_pattern or _is_hooked(self.hook_pattern)
        if ctx.static is not None:
            assert kv is not None  # a static step always has its cache
            k, v, mask = self._static_cache(k, v, kv, ctx.static, per_token, rows, explicit)
        else:  # a mirrored query's mask: every stream's, of which the last stream's rows are kept below
            n_query = q.shape[2] * per_token if mirrored else q.shape[2]
            k, v, mask = self._dynamic_cache(n_query, k, v, kv, ctx, per_token, rows, shared or n_query > q.shape[2])
        if mirrored and per_token > 1 and mask is not None:
            mask = mask[:, :, per_token - 1 :: per_token]
        if explicit:
            z = self._attend_explicit(q, k, v, mask, x.shape[0], rows)
        else:
            z = self._attend(q, k, v, mask)
        return self._merge(z, rows, x.shape[0], x.shape[1])

    def _project(self, x: Tensor, ctx: AttnContext) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys (rotated) and values through their hooks (which see [batch, pos, heads,
        d_head]), returned in SDPA's [batch, heads, pos, d_head] layout. The fixed-shape decode
        step projects by one matmul and rotates queries and keys at once; the same numbers."""
        B, P, _ = x.shape
        H, KV, dh = self.cfg.n_heads, self.n_kv_heads, self.cfg.d_head
        cos, sin = ctx.cos.transpose(1, 2), ctx.sin.transpose(1, 2)  # [batch, pos, 1, d_head]
        if ctx.static is None:
            q = apply_rotary(self.W_Q(x).view(B, P, H, dh), cos, sin)
            k = apply_rotary(self.W_K(x).view(B, P, KV, dh), cos, sin)
            v = self.W_V(x)
        else:
            qk, v = self.stacked(x).split(((H + KV) * dh, KV * dh), dim=-1)
            q, k = apply_rotary(qk.view(B, P, H + KV, dh), cos, sin).split((H, KV), dim=2)
        v = v.view(B, P, KV, dh)
        return self.hook_q(q).transpose(1, 2), self.hook_k(k).transpose(1, 2), self.hook_v(v).transpose(1, 2)

    def _static_cache(
        self, k: Tensor, v: Tensor, kv: LayerKV, static: StaticStep, per_token: int, rows: int, explicit: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Write the new keys/values in place and return the whole buffers with the step's mask."""
        k, v = kv.write_at(k, v, static.slots(per_token))
        if not explicit:
            return k, v, static.bias(per_token, rows, self.window, k.dtype)
        # the pattern a hook sees covers the cached keys only, as in a dynamic step
        end = static.end * per_token
        return k[:, :, :end], v[:, :, :end], static.mask(per_token, rows, self.window)[..., :end]

    def _dynamic_cache(
        self, n_query: int, k: Tensor, v: Tensor, kv: LayerKV | None, ctx: AttnContext, per_token: int, rows: int, explicit: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Append to the cache (if any) and return past + new keys/values with the mask of the
        last ``n_query`` positions over them (None: plain causal, unless ``explicit``)."""
        key_valid = ctx.key_valid
        if key_valid is not None and rows > 1:  # token units -> one row per stream
            key_valid = key_valid.repeat_interleave(rows, dim=0)
        elif key_valid is not None and per_token > 1:  # token units -> interleaved stream positions
            key_valid = key_valid.repeat_interleave(per_token, dim=1)
        if kv is not None and ctx.cache is not None:
            kv.per_token = per_token
            k, v = kv.extend(k, v, ctx.cache.capacity * per_token, ctx.write)
        mask = attention_mask(n_query, k.shape[2], key_valid, self.window, k.device, explicit=explicit)
        if self.shared_kv and ctx.n_streams > 1:
            assert mask is not None  # explicit=True always builds one
            mask = mask & shared_kv_mask(n_query, k.shape[2], ctx.n_streams, self.mode, k.device)
        return k, v, mask

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """SDPA, causal when ``mask`` is None."""
        gqa = self.n_kv_heads != self.cfg.n_heads
        if mask is None and q.shape[2] > 1:
            if q.shape[2] == k.shape[2]:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            # several new queries after a cached past
            mask = attention_mask(q.shape[2], k.shape[2], None, None, q.device, explicit=True)
        # a single query sees every cached key, or an explicit padding/window mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    def _merge(self, z: Tensor, rows: int, batch: int, pos: int) -> Tensor:
        """Streams back into one sequence, ``hook_z``, then the output projection."""
        if rows > 1:
            z = self._merge_streams(z, rows)
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, n_heads, d_head]
        return self.W_O(z.reshape(batch, pos, self.cfg.n_heads * self.cfg.d_head))

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


def _as_last_stream(own: Tensor, source: Tensor, n: int) -> Tensor:
    """Interleaved [batch, heads, tokens * n, d_head]: ``source``'s positions, the last stream's
    replaced by ``own`` [batch, heads, tokens, d_head]."""
    B, H, T, dh = own.shape
    return torch.cat((source.reshape(B, H, T, n, dh)[:, :, :, : n - 1], own[:, :, :, None]), dim=3).view(B, H, T * n, dh)
