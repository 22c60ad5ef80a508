"""Linear layers that read one input, projected by one matmul in the fixed-shape decode step.

Eager code keeps the separate layers (their names are what checkpoints, Hugging Face and
TransformerLens use, and training's gradients stay those of separate matmuls). The decode step
reads a stacked copy of their weights instead: one kernel launch where there were two or three,
with the same dot products in every output. The copy follows its parts: an optimizer step or an
edit in place bumps a tensor's version, a move or a cast makes a new tensor, and either rebuilds it
at the next ``refresh``; it is rewritten in place where its shape, dtype and device allow, so a
captured CUDA graph reading it stays valid.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Stacked:
    def __init__(self, *linears: nn.Linear):
        self.linears = linears
        self.weight: Tensor | None = None  # [sum of out_features, in_features]
        self._seen: tuple = ()

    def refresh(self) -> None:
        """Bring ``weight`` up to date with the parts (a tuple comparison when nothing changed)."""
        parts = [linear.weight for linear in self.linears]
        seen = tuple((id(p), p.data_ptr(), p._version) for p in parts)
        if seen == self._seen and self.weight is not None:
            return
        with torch.no_grad():
            weight = torch.cat(parts)
            held = self.weight
            if held is not None and (held.shape, held.dtype, held.device) == (weight.shape, weight.dtype, weight.device):
                held.copy_(weight)
            else:
                # a compiled step's CUDA graph then reads it where it is, not from a copy per replay
                torch._dynamo.mark_static_address(weight)
                self.weight = weight
        self._seen = seen

    def __call__(self, x: Tensor) -> Tensor:
        """The parts' outputs side by side along the last dimension, as ``linear(x)`` gives each."""
        assert self.weight is not None, "refresh() before the first projection"
        return torch.nn.functional.linear(x, self.weight)
