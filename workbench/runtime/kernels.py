"""Counting the operations a decode step dispatches, and which of them launch a kernel.

An eager step on a GPU is launch-bound when it dispatches many small kernels: each costs a few
microseconds of host time whatever its size. Views (``view``, ``transpose``, ``unsqueeze``,
``expand``, ...) change only metadata and launch nothing, and ``empty`` allocates without running
a kernel; every other aten operation launches at least one. The dispatcher sees the same
operations on the CPU, so the count is a proxy CI can hold when no GPU is at hand:

    per_step(model, prompts, engine="static")   # {'launching': 204, 'views': 180, 'ops': {...}}
    per_layer(arch, preset, engine="static")   # one block's share, by differencing depths

A count is exact, not a timing: it says how many kernels a step asks for, not how long they take.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten operations that allocate, reshape or read metadata without running a kernel (``_unsafe_view``
# is a view its schema does not declare)
NO_KERNEL = frozenset({"aten._unsafe_view", "aten.empty", "aten.empty_strided", "aten.empty_like", "aten.lift_fresh", "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset"})  # fmt: skip


def _name(func) -> str:
    return str(func.overloadpacket).replace("::", ".")


class KernelCounter(TorchDispatchMode):
    """A dispatch mode counting every aten operation (``ops``, by name) and, apart, the views and
    allocations that launch no kernel; ``launching`` is the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _name(func)
        if func.is_view or name in NO_KERNEL:
            self.views += 1
        else:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def launching(self) -> int:
        return sum(self.ops.values())


def count_kernels(fn, *args, **kwargs) -> tuple[object, KernelCounter]:
    """``fn(*args, **kwargs)`` under ``torch.no_grad`` and the ``KernelCounter`` of what it dispatched."""
    with torch.no_grad(), KernelCounter() as counter:
        out = fn(*args, **kwargs)
    return out, counter


def per_step(model, prompts, *, steps: int = 32, **generate_kwargs) -> dict:
    """What one decode step dispatches, past the prefill: the difference between generating
    ``2 * steps`` and ``steps`` tokens, over ``steps`` (a multiple of the host's read interval, so
    the periodic reads fall in both alike). ``launching`` and ``views`` are per step (floats: a
    count that is not a whole number says steps differ); ``ops``, the launching ones by name."""
    from workbench.runtime.decoding import SYNC_EVERY, generate

    if steps % SYNC_EVERY:
        raise ValueError(f"steps={steps}: expected a multiple of {SYNC_EVERY}")
    with torch.no_grad():  # what a first generation builds once and later ones reuse is not a step's
        generate(model, prompts, max_new_tokens=2, **generate_kwargs)
    counts = [count_kernels(generate, model, prompts, max_new_tokens=n, **generate_kwargs)[1] for n in (steps, 2 * steps)]
    short, long = counts
    ops = {name: (long.ops[name] - short.ops[name]) / steps for name in sorted(long.ops | short.ops)}
    return {
        "launching": (long.launching - short.launching) / steps,
        "views": (long.views - short.views) / steps,
        "ops": {name: n for name, n in ops.items() if n},
    }


def per_layer(arch: str, preset: str = "debug", *, depths: tuple[int, int] = (2, 4), **kwargs) -> dict:
    """One block's share of a decode step: ``per_step`` at two depths of an otherwise identical
    model, differenced and divided by the extra layers (the embedding, readout and the step's own
    bookkeeping cancel). ``kwargs``: ``generate``'s, and config overrides under ``overrides``."""
    from workbench.runtime.config import build_model

    overrides = kwargs.pop("overrides", {})
    prompts = kwargs.pop("prompts", [[1, 2, 3, 4], [5, 6, 7, 8]])
    shallow, deep = (per_step(build_model(arch, preset, n_layers=n, **overrides), prompts, **kwargs) for n in depths)
    extra = depths[1] - depths[0]
    ops = {name: (deep["ops"].get(name, 0) - shallow["ops"].get(name, 0)) / extra for name in deep["ops"] | shallow["ops"]}
    return {
        "launching": (deep["launching"] - shallow["launching"]) / extra,
        "views": (deep["views"] - shallow["views"]) / extra,
        "outside_layers": shallow["launching"] - depths[0] * (deep["launching"] - shallow["launching"]) / extra,
        "ops": {name: n for name, n in sorted(ops.items()) if n},
    }
