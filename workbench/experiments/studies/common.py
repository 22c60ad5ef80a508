"""What more than one comparison study uses: a member's shape, the threads its measurements run
with, the regimes FBT is read in, a member's held-out accuracy and completion loss averaged over
its tasks, a paired cell of a study's family, and the text of an interval in a readings table."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from workbench.training import stats

FBT_REGIMES = ("standard", "soft", "fused")

# A study's member, unseeded: (name, arch, overrides, source), ``source`` naming the member it
# continues from (or None); the runner names and seeds each per training seed.
Member = tuple[str, str, list[str], str | None]


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Torch at ``threads`` threads for the block (a study's measurements use the threads its
    members trained with, all of them together), then as it was."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def completion_loss(row: dict, regime: str) -> float:
    """A member's held-out validation loss in ``regime``: the mean over tasks of the completion loss."""
    values = [task["answer_loss"][regime] for task in row["tasks"].values()]
    return sum(values) / len(values)


def mean_accuracy(row: dict, regime: str) -> float:
    """A member's held-out accuracy in ``regime``: the mean over tasks."""
    values = [task["accuracy"][regime] for task in row["tasks"].values()]
    return sum(values) / len(values)


def add_paired(
    cells: dict[str, dict], name: str, a: Sequence[float], b: Sequence[float], bounds: tuple[float, float] | None = None
) -> None:
    """``cells[name]``: ``b`` minus ``a``, paired by seed (``stats.paired_difference`` on the
    per-seed values, in seed order), where both have the same seeds and at least two; its
    intervals clipped to ``bounds`` (``ACCURACY_DIFFERENCE`` for two accuracies)."""
    if len(a) == len(b) and len(a) >= 2:
        cells[name] = stats.paired_difference([[x] for x in a], [[y] for y in b], bounds=bounds)


def interval_text(cell: dict | None, digits: int = 3) -> str:
    """``mean [low, high]`` of a ``seed_interval`` (just the mean for one seed); '-' for none."""
    if not cell:
        return "-"
    mean = f"{cell['mean']:.{digits}g}"
    return mean if cell["n"] < 2 else f"{mean} [{cell['low']:.{digits}g}, {cell['high']:.{digits}g}]"


def crossed_text(cell: dict) -> str:
    """``mean [low, high]`` of a cell over seeds and problems crossed (``stats.crossed_interval``)."""
    return f"{cell['mean']:.3g} [{cell['low']:.3g}, {cell['high']:.3g}]"
