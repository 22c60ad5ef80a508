"""Counting the operations that make the host wait for the device.

On a GPU, reading a tensor's value on the host (``.item()``, ``int(t)``, ``bool(t)``, an ``if``
on a tensor) waits for every queued kernel, and an operation whose output shape depends on the
data (``nonzero``, boolean-mask indexing, ``unique``) has to wait to learn it. Each such wait
stalls the launch queue and stops CUDA graphs from replaying back to back. The CPU has no queue,
but the same operations pass through the dispatcher there, so a test can count them on the CPU:

    with SyncCounter() as syncs:
        generate(model, prompts, max_new_tokens=16)
    syncs.total, syncs.counts   # {'aten._local_scalar_dense.default': 3, ...}

What it cannot see: ``Tensor.tolist()`` and ``.numpy()`` read memory without a dispatched op (on a
GPU they copy to the host first, which is a sync); code meant to run per step avoids them.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# the ops that read a value on the host (_local_scalar_dense: .item(), int(), float(), bool()) or
# whose output shape depends on the data
SYNC_OPS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.repeat_interleave",  # without output_size it reads the repeats' sum
    }
)


# indexing that finds a boolean mask's True positions first (``x[mask]``, ``x[mask] = v``)
MASKED_INDEXING = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})


def _has_mask(indices) -> bool:
    return isinstance(indices, (list, tuple)) and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


class SyncCounter(TorchDispatchMode):
    """A dispatch mode counting ``SYNC_OPS`` by name (``counts``) and in all (``total``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if name.startswith("aten::"):
            name = "aten." + name.removeprefix("aten::")
        if name in SYNC_OPS:
            self.counts[str(func)] += 1
        elif name in MASKED_INDEXING and _has_mask(args[1] if len(args) > 1 else kwargs.get("indices")):
            self.counts[f"{func} (boolean mask)"] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def count_syncs(fn, *args, **kwargs) -> tuple[object, SyncCounter]:
    """``fn(*args, **kwargs)`` and the ``SyncCounter`` of its host-device synchronisations."""
    with torch.no_grad(), SyncCounter() as counter:
        out = fn(*args, **kwargs)
    return out, counter


def host_value(t: torch.Tensor) -> float | int | bool:
    """The value of a one-element tensor that lives on the host by construction (a batch drawn on
    the CPU, a generator's draw), read through numpy: no dispatched op, so ``SyncCounter`` does not
    count it, and no device is waited for. A tensor on a device is refused: reading it would be a
    synchronisation."""
    if t.device.type != "cpu":
        raise ValueError(f"host_value reads host tensors; this one is on {t.device}")
    return t.detach().numpy().item()
