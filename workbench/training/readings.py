"""What a training step reports, kept on the device until the host reads it.

A step's losses and gradient norm are tensors on the device; reading one on the host (``.item()``,
``float()``) waits for every queued kernel, which on a GPU stalls the launch queue at every step.
``StepReadings`` keeps the last step's readings and a sticky record of the first step whose loss
or gradient norm was non-finite (with those values), all on the device, and ``read()`` brings
them to the host in one transfer: the training loop calls it on logging and checkpoint steps and
at its end, so a divergence is still named by its exact step and caught before any checkpoint is
written after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class Reading:
    values: dict  # the last step's readings as Python numbers (tensors read, the rest as given)
    diverged_at: int | None  # the first step with a non-finite loss or gradient norm, if any
    diverged_loss: float  # ... its loss and gradient norm (NaN when none diverged)
    diverged_grad_norm: float


class StepReadings:
    def __init__(self, device: torch.device | str) -> None:
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.bad_values = torch.full((2,), float("nan"), dtype=torch.float32, device=device)
        self.last: dict = {}

    def add(self, step: int, info: dict, grad_norm: Tensor) -> None:
        """Record ``step``'s ``info`` (its ``loss`` a 0-d tensor; other tensors read later, other
        values kept as they are) and gradient norm, without reading the device."""
        loss = info["loss"].detach().float()
        norm = grad_norm.detach().float()
        new = ~(torch.isfinite(loss) & torch.isfinite(norm)) & (self.first_bad < 0)
        self.bad_values = torch.where(new, torch.stack((loss, norm)), self.bad_values)
        self.first_bad = self.first_bad.masked_fill(new, step)
        self.last = {**info, "grad_norm": norm}

    def read(self, world: int = 1) -> Reading:
        """The one host read (after at least one ``add``): the last step's tensors (its losses
        averaged over ``world`` processes, every one of which must call this at the same step; the
        gradient norm is already global) and the divergence record."""
        keys = [k for k, v in self.last.items() if isinstance(v, Tensor) and k != "grad_norm"]
        losses = torch.stack([self.last[k].double().reshape(()) for k in keys])
        if world > 1:
            dist.all_reduce(losses)
            losses /= world
        head = torch.stack((self.first_bad.double(), *self.bad_values.double(), self.last["grad_norm"].double()))
        first, bad_loss, bad_norm, grad_norm, *values = torch.cat((head, losses)).tolist()
        return Reading(
            {**self.last, "grad_norm": grad_norm, **dict(zip(keys, values))},
            int(first) if first >= 0 else None,
            bad_loss,
            bad_norm,
        )
