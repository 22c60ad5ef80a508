"""The comparison studies as plugins (``workbench zoo --study NAME``), one module each, listed in
one registry (``STUDIES``). Each exposes

- ``members(scale) -> [(name, arch, overrides, source)]``: its members, unseeded (the runner,
  ``comparisons.study_members``, names them per training seed and adds ``train.seed=``);
- ``measure(models, out, scale, threads, jobs) -> dict``: the study's ``readings`` from its
  trained members (``models``: the zoo's per-member rows; ``threads``: each member's training
  threads, ``jobs`` how many trained at once);
- ``family(readings) -> {name: cell}``: its declared family of paired comparisons, each across
  its seeds, before Holm's correction (``comparisons.study_family`` applies ``stats.family``);
- ``rows(study) -> [dict]``: its readings as a table of text cells (the app's Zoo page);
- optionally ``seeds_needed(readings) -> dict``: ``power.power_step`` with this run (at two or
  more seeds) as the pilot, which ``study.json`` keeps as ``power``;

and its constants and helpers. ``ROWS`` also has the fair study's table (``fbt-vs-baseline``,
which ``experiments.fbt_vs_baseline`` runs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from workbench.experiments.studies import data_efficiency, fair, hd_ablations, probes, stability, three_pass, traces
from workbench.experiments.studies.common import Member
from workbench.names import FAIR_STUDY


class Study(Protocol):
    """What a comparison study's module exposes (the module itself is the plugin)."""

    def members(self, scale: str) -> list[Member]: ...

    def measure(self, models: dict, out: Path, scale: str, threads: int, jobs: int) -> dict: ...

    def family(self, readings: dict) -> dict[str, dict]: ...

    def rows(self, study: dict) -> list[dict]: ...


# the same names as workbench.names.COMPARISON_STUDIES, in its order (tests/workbench/test_names.py)
STUDIES: dict[str, Study] = {
    "data-efficiency": data_efficiency,
    "three-pass": three_pass,
    "hd-ablations": hd_ablations,
    "probes": probes,
    "traces": traces,
    "stability": stability,
}
# every study's readings table: the same names as workbench.names.STUDIES
ROWS: dict[str, Callable[[dict], list[dict]]] = {**{name: study.rows for name, study in STUDIES.items()}, FAIR_STUDY: fair.rows}
