"""The key/value cache for incremental decoding: per-layer buffers (``LayerKV``), the per-row token
bookkeeping (``KVCache``) and where a static cache's fixed-shape step writes (``StaticStep``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor


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
        shape = (k.shape[0], k.shape[1], capacity, k.shape[3])
        if self.k is None or self.v is None or self.k.shape != shape or self.k.dtype != k.dtype or self.k.device != k.device:
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
        self.weights_checked = False  # the model's stacked projections checked for this generation

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
        if (
            self.valid is None
            or self.next_pos is None
            or self.index is None
            or self.valid.shape[0] != batch
            or self.valid.device != device
        ):
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

    def hold_state(self, state: Tensor) -> None:
        """Carry ``state`` [batch, d_model] (FBT's last final state). A static cache keeps it in a
        buffer of its own, written in place where it fits, so a compiled step reads it at the same
        address every step and every reuse of the cache (CUDA graphs replay only on the addresses
        they captured). A dynamic cache holds the tensor itself: its caller may keep the states it
        was given (or set ``state``), and an in-place write would change them."""
        held = self.state
        if not self.static:
            self.state = state.contiguous()
        elif held is not None and held.shape == state.shape and held.dtype == state.dtype and held.device == state.device:
            held.copy_(state)
        else:
            self.state = state.clone(memory_format=torch.contiguous_format)

    def reset(self) -> None:
        """Empty the cache for a new generation, keeping its buffers (and their addresses) for
        prompts of the same batch; every buffer is zeroed, as a new cache's would be (a key left
        from an earlier generation is masked out, but a NaN in it would still reach attention)."""
        self.length, self.offset, self.padded, self.weights_checked = 0, 0, False, False
        self._key_valid = self._n_valid = None
        for layer in self.layers:
            layer.length, layer.per_token = 0, 1
        for t in [self.valid, self.next_pos, self.index, self.state] + [t for layer in self.layers for t in (layer.k, layer.v)]:
            if t is not None:
                t.zero_()

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
    # slots, masks and biases, built once per step and shared by the layers of one kind: each would
    # otherwise launch its own few small kernels, a step's cost on a launch-bound device
    built: dict = dataclasses.field(default_factory=dict)

    def slots(self, per_token: int) -> Tensor:
        """[per_token] slots of the new token in a layout with ``per_token`` positions per token."""
        if per_token not in self.built:  # keyed by the int; masks and biases by tuples
            self.built[per_token] = self.index * per_token + torch.arange(per_token, device=self.index.device)
        return self.built[per_token]

    def mask(self, per_token: int, rows_per_batch: int, window: int | None) -> Tensor:
        """[batch', 1, per_token, capacity * per_token] bool (True = may attend) over the whole buffer."""
        kind = (per_token, rows_per_batch, window)
        if kind not in self.built:
            self.built[kind] = self._mask(per_token, rows_per_batch, window)
        return self.built[kind]

    def bias(self, per_token: int, rows_per_batch: int, window: int | None, dtype: torch.dtype) -> Tensor:
        """``mask`` as attention's additive bias (0 where it may attend, -inf elsewhere) in
        ``dtype``: what attention makes of a boolean mask at every call, made once."""
        kind = (per_token, rows_per_batch, window, dtype)
        if kind not in self.built:
            allowed = self.mask(per_token, rows_per_batch, window)
            self.built[kind] = torch.zeros((), dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))
        return self.built[kind]

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
