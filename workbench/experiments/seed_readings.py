"""The studies' headline readings taken from their reports, and across training seeds: each
reading a mean with a 95% interval over the seeds (``workbench.training.intervals``), so a table
of the zoo's probes, dynamics or traces says how much of a difference is the seed.

A reading is named ``WHAT/WHERE`` (for example ``recurrent K=2/layer 0/accuracy``); ``across``
keeps the names every seed has. ``zoo_readings`` collects them from where
``scripts/zoo_analyses.py`` has the verbs write a zoo's analyses (``analysis_reports``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from workbench.experiments.studies.three_pass import regrowth_step
from workbench.storage.files import read_json
from workbench.training.intervals import seed_interval
from workbench.training.zoo import seed_name

PROBES = [("baseline", "memory"), ("baseline", "running_sum"), ("fbt", "memory"), ("fbt", "running_sum")]


def probe_readings(report: dict) -> dict[str, float]:
    """A probe sweep's (``probe_study``) accuracy, selectivity and, where measured, online-code
    compression per prefill regime, depth (0 = the input to block 0) and stream."""
    readings = {}
    for row in report["rows"]:
        regime = row["prefill"] if row["prefill"] == "standard" else f"{row['prefill']} K={row['passes']}"
        stream = f"/stream {row['stream']}" if report.get("arch") == "hd" else ""
        where = f"{regime}/layer {row['layer']:g}{stream}"
        readings[f"{where}/accuracy"] = row["accuracy"]
        readings[f"{where}/selectivity"] = row["selectivity"]
        if row.get("compression") is not None:
            readings[f"{where}/compression"] = row["compression"]
    return readings


def dynamics_readings(run: dict) -> dict[str, float]:
    """One run's dynamics report (``analyse_run``): the leading Lyapunov exponent at each horizon
    T from tangents through the feedback map (``tangent``), through the whole decoding step
    (``whole step``) and from the finite perturbation; the K-pass relative residual at each K; the
    step at which the perturbation first grows back to its size (the horizon when it never does
    within the rollout, a bound); the number of fixed points found and how many are stable."""
    readings = {}
    for name, key in (("tangent", "lyapunov_tangent"), ("whole step", "lyapunov_tangent_full")):
        for T, values in run.get(key, {}).items():
            readings[f"lambda {name}/T={T}"] = values[0]
    for T, value in run["lyapunov"].items():
        readings[f"lambda perturbation/T={T}"] = value
    for row in run["kpass"]["rows"]:
        if row.get("relative_residual") is not None:
            readings[f"K-pass residual/K={row['passes']}"] = row["relative_residual"]
    ratios = run["per_step"]["perturbation_ratio"]
    step = regrowth_step(ratios)
    readings["regrowth step (rollout length if never)"] = float(len(ratios) if step is None else step)
    points = [p for f in run["fixed_points"] for p in f["points"]]
    readings["fixed points/found"] = float(len(points))
    readings["fixed points/stable"] = float(sum(bool(p["stable"]) for p in points))
    return readings


def trace_readings(summary: dict) -> dict[str, float]:
    """A trace study's (``trace_study``) accuracy, mean trace length and share of unfinished traces
    (the token budget ran out before the trace ended) per model/regime, and the
    paired differences' means (each pair against the reference on the same problems). Models are
    named without their seed (``fbt-seed2/soft`` reads as ``fbt/soft``), so seeds line up."""
    readings = {}
    for group, g in summary["groups"].items():
        readings[f"{unseeded(group)}/accuracy"] = g["accuracy"]
        readings[f"{unseeded(group)}/mean trace"] = g["mean_trace"]
        readings[f"{unseeded(group)}/unfinished"] = g["unfinished"]
    for pair, p in summary["paired"].items():
        readings[f"{unseeded(pair)}/trace tokens"] = p["trace_tokens"]["mean"]
        readings[f"{unseeded(pair)}/accuracy"] = p["accuracy"]["mean"]
    return readings


def unseeded(name: str) -> str:
    """``name`` with every zoo seed suffix (``-seedK`` before a ``/``) taken out."""
    return re.sub(r"-seed\d+(?=/)", "", name)


def across(per_seed: Sequence[dict[str, float]]) -> dict[str, dict]:
    """Each reading every seed has, as ``seed_interval`` over the seeds (in their order)."""
    if not per_seed:
        return {}
    keys = [k for k in per_seed[0] if all(k in r for r in per_seed[1:])]
    return {k: seed_interval([r[k] for r in per_seed]) for k in keys}


def analysis_reports(zoo: Path, seed: int) -> dict[str, Path]:
    """Where seed ``seed``'s analyses of the zoo at ``zoo`` are, by reading group: each probe sweep
    of ``PROBES`` in its run's ``results/``, the ``fbt`` dynamics and the trace study under
    ``ZOO/analyses/seedK/``."""
    out = Path(zoo) / "analyses" / f"seed{seed}"
    reports = {f"probe/{m}/{t}": Path(zoo) / seed_name(m, seed) / "results" / f"probe_{t}.json" for m, t in PROBES}
    return reports | {"dynamics/fbt": out / "dynamics" / "dynamics.json", "traces": out / "traces" / "summary.json"}


def zoo_readings(zoo: Path, seeds: int) -> dict[str, dict[str, dict]]:
    """Every reading group whose report every seed 0..``seeds``-1 has, each reading ``across`` the
    seeds."""
    readers = {
        "probe": probe_readings,
        "dynamics": lambda r: dynamics_readings(next(iter(r["runs"].values()))),
        "traces": trace_readings,
    }
    groups = {}
    for group in analysis_reports(zoo, 0):
        paths = [analysis_reports(zoo, seed)[group] for seed in range(seeds)]
        if all(p.is_file() for p in paths):
            read = readers[group.split("/")[0]]
            groups[group] = across([read(read_json(p)) for p in paths])
    return groups
