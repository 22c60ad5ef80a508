"""``three-pass`` (FBT's stability knob): ``fbt.three_pass_fraction`` in {0, 0.03, 0.1, 0.3}; per
member the K-pass residual at K = 2..8, the leading Lyapunov exponent from tangent vectors at 100
and 1000 steps (where the horizon reaches them), of the carried-state map F_t (context frozen) and
of the whole decoding step (context carried too), the step at which a 1e-3 perturbation of the
carried state first regrows to its size (``regrowth_step``), and held-out accuracy under ``soft``
and ``fused``."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from workbench.experiments.studies.common import Member, add_paired, interval_text, mean_accuracy, torch_threads
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import output
from workbench.training.intervals import ACCURACY, seed_interval
from workbench.training.zoo import SCALES

THREE_PASS = (0.0, 0.03, 0.1, 0.3)  # the fractions of 3-pass feedback batches
# the last step of lambda(T), T = 100, 1000 (micro: 100; every other scale 1000)
HORIZONS = {scale: 100 if scale == "micro" else 1000 for scale in SCALES}
PERTURB_AT = 20  # the rollout step of the perturbation, where the tangents start too


def members(scale: str) -> list[Member]:
    steps = SCALES[scale]["steps"]
    return [(f"fbt-3pass{f:g}", "fbt", [f"train.steps={steps}", f"fbt.three_pass_fraction={f}"], None) for f in THREE_PASS]


def measure(models: dict, out: Path, scale: str, threads: int, jobs: int) -> dict:
    return three_pass(models, out, HORIZONS[scale], threads, jobs)


def regrowth_step(ratios: list[float]) -> int | None:
    """The first step t >= 1 after a perturbation at which its size ``ratios[t]`` (relative to the
    size it was given, ``ratios[0]`` = 1) is back to at least that size; None if it never is
    within the rollout."""
    return next((t for t in range(1, len(ratios)) if ratios[t] >= 1.0), None)


def stability(run: Path, horizon: int) -> dict:
    """The stability measures of one FBT member (``analyse_run`` on its own task's first held-out prompt), the
    exponents up to ``horizon`` steps after the perturbation."""
    from workbench.dynamics.study import analyse_run

    rollout = PERTURB_AT + horizon  # the tangents start at the perturbation: lambda(T) needs T steps after it
    report = analyse_run(run, horizon=rollout, perturb_at=PERTURB_AT, n_spectra=1, n_fixed=0, max_passes=8, tangents=1).report
    return {
        "kpass_residual": {str(r["passes"]): r["relative_residual"] for r in report["kpass"]["rows"] if "relative_residual" in r},
        "lyapunov_tangent": {T: v[0] for T, v in report["lyapunov_tangent"].items() if T in ("100", "1000")},
        "lyapunov_tangent_full": {T: v[0] for T, v in report["lyapunov_tangent_full"].items() if T in ("100", "1000")},
        "regrowth_step": regrowth_step(report["per_step"]["perturbation_ratio"]),
        "horizon": report["horizon"],
        "input": report["input"],
    }


READING_FIELDS = {"kpass_residual", "lyapunov_tangent", "lyapunov_tangent_full", "regrowth_step", "horizon", "input"}


def stored_stability(run: str | Path, horizon: int, threads: int) -> dict:
    """``stability(run, horizon)`` at ``threads`` torch threads, written to the run's
    ``results/stability_HORIZON.json`` and read back on a rerun, so that a study stopped in its
    readouts keeps the members it measured; a file there of another shape is measured again."""
    run = Path(run)
    path = run / "results" / f"stability_{horizon}.json"
    if path.is_file():
        saved = read_json(path)
        if set(saved) == READING_FIELDS and saved["horizon"] == horizon + PERTURB_AT:
            return saved
    with torch_threads(threads):
        reading = stability(run, horizon)
    with output(path.parent, "results") as held:
        write_json(path, reading)
        held.wrote(path)
    return reading


def measure_members(out: Path, names: list[str], horizon: int, threads: int, jobs: int) -> dict[str, dict]:
    """``stored_stability`` of each run ``out/NAME``, ``jobs`` at a time (each in its own spawned
    process when ``jobs`` > 1) with ``threads`` torch threads each: a member's readout is one long
    sequential rollout, which a second process speeds up more than a second thread does."""
    if jobs == 1:
        return {name: stored_stability(out / name, horizon, threads) for name in names}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(stored_stability, str(out / name), horizon, threads) for name in names}
        return {name: future.result() for name, future in futures.items()}


def three_pass(models: dict, out: Path, horizon: int, threads: int, jobs: int = 1) -> dict:
    """Per 3-pass fraction: each seed's stability measures and accuracies (``measure_members``),
    and across seeds the mean with its interval of every number (``regrowth_step``: of the seeds
    where it regrew, with ``never`` counting the others)."""
    measured = measure_members(out, sorted(models), horizon, threads, jobs)
    groups: dict[str, list[str]] = {}
    for name, row in models.items():
        groups.setdefault(row["member"], []).append(name)
    readings = {}
    for member, names in sorted(groups.items()):
        names = sorted(names, key=lambda n: int(models[n]["seed"]))
        rows = [measured[n] for n in names]
        accuracy = {
            regime: seed_interval([mean_accuracy(models[n], regime) for n in names], bounds=ACCURACY)
            for regime in ("soft", "fused")
        }
        regrew = [r["regrowth_step"] for r in rows if r["regrowth_step"] is not None]
        readings[member] = {
            "runs": names,
            "per_seed": rows,
            "kpass_residual": {K: seed_interval([r["kpass_residual"][K] for r in rows]) for K in rows[0]["kpass_residual"]},
            **{
                key: {T: seed_interval([r[key][T] for r in rows]) for T in rows[0][key]}
                for key in ("lyapunov_tangent", "lyapunov_tangent_full")
            },
            "regrowth_step": seed_interval(regrew) if regrew else None,
            "never_regrew": len(rows) - len(regrew),
            "accuracy": accuracy,
        }
    return readings


def family(readings: dict) -> dict[str, dict]:
    """Each nonzero fraction minus fraction 0 in lambda(1000) of the carried-state map and of the
    whole step and in the K = 8 residual."""
    cells: dict[str, dict] = {}
    zero = readings.get("fbt-3pass0")
    for member, r in readings.items():
        if zero is None or member == "fbt-3pass0":
            continue
        for key, label in (("lyapunov_tangent", "lambda(1000)"), ("lyapunov_tangent_full", "whole-step lambda(1000)")):
            if "1000" in r[key] and "1000" in zero[key]:
                add_paired(cells, f"{member} - fbt-3pass0: {label}", zero[key]["1000"]["values"], r[key]["1000"]["values"])
        add_paired(
            cells,
            f"{member} - fbt-3pass0: residual K=8",
            zero["kpass_residual"]["8"]["values"],
            r["kpass_residual"]["8"]["values"],
        )
    return cells


def rows(study: dict) -> list[dict]:
    return [
        {
            "member": key,
            **{f"residual K={K}": interval_text(v, 2) for K, v in r["kpass_residual"].items() if K in ("2", "4", "8")},
            **{f"lambda({T})": interval_text(v, 2) for T, v in r["lyapunov_tangent"].items()},
            **{f"whole-step lambda({T})": interval_text(v, 2) for T, v in r.get("lyapunov_tangent_full", {}).items()},
            "regrowth step": interval_text(r["regrowth_step"]),
            "never regrew": f"{r['never_regrew']}/{len(r['runs'])}",
            **{f"{regime} accuracy": interval_text(v) for regime, v in r["accuracy"].items()},
        }
        for key, r in study.get("readings", {}).items()
    ]
