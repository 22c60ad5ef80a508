"""The fair study's readouts (``fbt_vs_baseline`` runs the study): from every member's
per-problem scores and training-loss curve, per seed, the declared family of comparisons with
Holm's correction and each readout behind it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

import numpy as np

from workbench.training import stats

BEYOND_REGIMES = ("standard", "fused")  # single-token answers: soft decodes as standard does
CONTROL = "fbt-no-feedback"
COMPUTE = "baseline-compute"  # the baseline trained for FBT's training FLOPs
AFTER_SWITCH = "fbt - baseline: log steps to the loss threshold after the switch"
# the difficulty band declared before the study (``declare_band``): its accuracy comparisons are
# named for the band's role, whichever band it is
BAND = "band"
BAND_CELLS = (*(f"fbt {r} - baseline: accuracy, {BAND}" for r in BEYOND_REGIMES), f"fbt fused - {COMPUTE}: accuracy, {BAND}")
FAMILY = (
    *(f"fbt {r} - baseline: accuracy" for r in ("standard", "soft", "fused")),
    *(f"fbt {r} - baseline: completion loss" for r in ("standard", "soft", "fused")),
    "fbt - baseline: plain-pass training loss, last half",
    AFTER_SWITCH,
    f"{CONTROL} - baseline: accuracy",
    f"{CONTROL} - baseline: completion loss",
    # FBT's own regimes on the same weights (the seeds' claim that soft and fused decoding beat
    # standard; soft can differ from standard only after the first generated token); a study
    # record that declares only the first 10 was measured without these two
    *(f"fbt {r} - fbt standard: accuracy" for r in ("soft", "fused")),
    f"fbt fused - {COMPUTE}: accuracy",
    *BAND_CELLS,
)


def family_names(beyond) -> tuple[str, ...]:
    """The family of a scale with test sets ``beyond`` (names): ``FAMILY``, then each regime of
    ``BEYOND_REGIMES`` against the baseline on each set, all Holm-corrected together."""
    return (*FAMILY, *(f"fbt {r} - baseline: accuracy, {name}" for name in beyond for r in BEYOND_REGIMES))


def member_regimes(member: str) -> list[str]:
    return ["standard", "soft", "fused"] if member == "fbt" else ["standard"]


TEST = "test"  # the in-distribution test problems' name among the scored sets


def pack_bits(correct) -> str:
    """A sequence of 1/0 answers as base64 text, one bit per problem."""
    return base64.b64encode(np.packbits(np.asarray(correct, dtype=np.uint8)).tobytes()).decode("ascii")


def unpack_bits(text: str, n: int) -> np.ndarray:
    """The ``n`` answers ``pack_bits`` wrote, as 1.0 / 0.0."""
    return np.unpackbits(np.frombuffer(base64.b64decode(text), dtype=np.uint8))[:n].astype(np.float64)


def packed_scores(per_seed: dict[int, dict[str, dict]]) -> dict:
    """Every member's per-problem answers, one bit per problem and seed (``study.json``'s
    ``scores``), so that each accuracy interval of the study can be recomputed from its data:
    ``{set: {"n": problems, member: {regime: [bits of seed 0, ...]}}}``, the test problems as
    ``TEST`` and each set beyond training or band by its name."""
    seeds = sorted(per_seed)
    sets: dict[str, dict] = {}
    for member, row in per_seed[seeds[0]].items():
        for name in (TEST, *row.get("beyond", {})):
            scored = [per_seed[s][member] if name == TEST else per_seed[s][member]["beyond"][name] for s in seeds]
            regimes = scored[0]["correct"]
            sets.setdefault(name, {})[member] = {r: [pack_bits(each["correct"][r]) for each in scored] for r in regimes}
            sets[name]["n"] = len(next(iter(regimes.values())))
    return sets


def unpacked(scores: dict, name: str, member: str, regime: str) -> np.ndarray:
    """The [seeds, problems] answers of ``member`` in ``regime`` on set ``name`` of ``packed_scores``."""
    n = scores[name]["n"]
    return np.stack([unpack_bits(text, n) for text in scores[name][member][regime]])


def recompute_accuracy(study: Mapping, comparison: str) -> dict:
    """An accuracy comparison of the family (``fbt fused - baseline: accuracy``, ``..., band``,
    ``..., longer``) recomputed from the study's ``scores`` alone (before Holm's correction):
    what a reader checks the committed interval against."""
    arms, _, readout = comparison.partition(": ")
    name = readout.partition(", ")[2] or TEST
    name = study["band"]["band"] if name == BAND else name
    right, left = (side.split(" ") for side in arms.split(" - "))
    a, b = (unpacked(study["scores"], name, side[0], side[1] if len(side) > 1 else "standard") for side in (left, right))
    return stats.paired_difference(a, b, bounds=(-1.0, 1.0))


def time_to_threshold(steps: list[int], losses: list[float], threshold: float, window: int, budget: int) -> tuple[int, bool]:
    """``(step, reached)``: the first logged step at which the mean of the last ``window`` logged
    losses (``smoothed``) is at most ``threshold``; ``(budget, False)`` when it never is (censored)."""
    hits = np.flatnonzero(smoothed(np.array([losses], dtype=np.float64), window)[0] <= threshold)
    return (steps[hits[0]], True) if hits.size else (budget, False)


def smoothed(losses: np.ndarray, window: int) -> np.ndarray:
    """Per logged step the mean of the last ``window`` logged losses ([runs, steps]; +inf before a
    window is full)."""
    out = np.full(losses.shape, np.inf)
    for i in range(window - 1, losses.shape[1]):
        out[:, i] = losses[:, i - window + 1 : i + 1].mean(axis=1)
    return out


def after_switch(steps: list[int], baseline: np.ndarray, fbt: np.ndarray, switch: int, window: int) -> dict:
    """Steps from FBT's feedback switch to a loss both arms reach only after it, paired by seed.

    ``baseline`` / ``fbt``: plain-pass training losses [seeds, logged steps], smoothed over
    ``window`` logged steps. At the first logged step from ``switch`` on, every run's loss is at
    least ``high`` (the lowest of them); afterwards each run gets down to ``low`` or below (the
    highest of the runs' minima). The threshold is their midpoint: no run is at it when feedback
    starts, every run reaches it later. Per seed the steps from the switch to it, and the readout,
    the log of FBT's steps over the baseline's (below 0: FBT faster), with its interval across
    seeds. Without such a loss (``low >= high``: some run has stopped learning) it says why."""
    a, b = smoothed(baseline, window), smoothed(fbt, window)
    at = next((i for i, step in enumerate(steps) if step >= switch and i >= window - 1), None)
    if at is None or at == len(steps) - 1:
        return {"switch": switch, "threshold": None, "why": "no logged step after the switch"}
    high = float(min(a[:, at].min(), b[:, at].min()))
    low = float(max(a[:, at + 1 :].min(axis=1).max(), b[:, at + 1 :].min(axis=1).max()))
    if not low < high:
        return {"switch": switch, "threshold": None, "why": f"some run never gets below {high:.4g}, its loss at the switch"}
    threshold = (low + high) / 2

    def times(curves: np.ndarray) -> list[int]:
        return [steps[at + 1 + int(np.argmax(c[at + 1 :] <= threshold))] - switch for c in curves]

    t_base, t_fbt = times(a), times(b)
    ratio = np.log(np.array(t_fbt, dtype=np.float64) / np.array(t_base, dtype=np.float64))
    return {
        "switch": switch,
        "window": window,
        "threshold": threshold,
        "between": [low, high],
        "baseline_steps": t_base,
        "fbt_steps": t_fbt,
        "cell": {
            **stats.crossed_interval(ratio[:, None]),
            "seeds_higher": int((ratio > 0).sum()),
            "seeds_lower": int((ratio < 0).sum()),
        },
    }


def readings(
    per_seed: dict[int, dict[str, dict]],
    threshold: float,
    window: int,
    budget: int,
    beyond: tuple[str, ...] = (),
    *,
    switch: int,
    not_run: Mapping[str, str] | None = None,
    band: str | None = None,
    curves: tuple[str, ...] = (),
) -> dict:
    """The study's readouts from ``per_seed[seed][member]`` = ``{correct, completion_nll, steps,
    losses}`` (``correct`` / ``completion_nll``: regime -> one value per test problem; with test
    sets ``beyond`` training, the baseline's and FBT's also ``beyond: {name: {correct, ...}}``): per
    member and regime the accuracy with its seed-by-problem interval (on each set beyond, too);
    every comparison of ``family_names(beyond)`` with Holm's correction; the per-step loss gaps, the
    times to ``threshold`` (descriptive) and the times after FBT's ``switch`` (``after_switch``).
    ``not_run``: comparisons the power step left out of the family, with why. ``band``: the
    declared difficulty band, whose scores are among ``beyond`` (its comparisons are ``BAND_CELLS``;
    None: they are in ``not_run``); ``curves``: the graded sets every member's accuracy is given on,
    accuracy against difficulty."""
    seeds = sorted(per_seed)
    S = len(seeds)

    def matrix(member: str, what: str, regime: str) -> np.ndarray:
        return np.array([per_seed[s][member][what][regime] for s in seeds], dtype=np.float64)

    accuracy = {
        member: {r: stats.accuracy_interval(matrix(member, "correct", r)) for r in member_regimes(member)}
        for member in ("baseline", "fbt", CONTROL, COMPUTE)
    }
    cells: dict[str, dict] = {}
    for r in ("standard", "soft", "fused"):
        cells[f"fbt {r} - baseline: accuracy"] = stats.paired_difference(
            matrix("baseline", "correct", "standard"), matrix("fbt", "correct", r), bounds=(-1.0, 1.0)
        )
        cells[f"fbt {r} - baseline: completion loss"] = stats.paired_difference(
            matrix("baseline", "completion_nll", "standard"), matrix("fbt", "completion_nll", r)
        )
    steps = per_seed[seeds[0]]["baseline"]["steps"]
    base_curves = np.array([per_seed[s]["baseline"]["losses"] for s in seeds])
    fbt_curves = np.array([per_seed[s]["fbt"]["losses"] for s in seeds])
    gap = fbt_curves - base_curves
    half = len(steps) // 2
    cells["fbt - baseline: plain-pass training loss, last half"] = stats.paired_difference(
        base_curves[:, half:].mean(axis=1, keepdims=True), fbt_curves[:, half:].mean(axis=1, keepdims=True)
    )
    reached: dict[str, list[tuple[int, bool]]] = {m: [] for m in ("baseline", "fbt", CONTROL)}
    for member, rows in reached.items():
        for s in seeds:
            rows.append(time_to_threshold(per_seed[s][member]["steps"], per_seed[s][member]["losses"], threshold, window, budget))
    efficiency = after_switch(steps, base_curves, fbt_curves, switch, window)
    if "cell" in efficiency:
        cells[AFTER_SWITCH] = efficiency["cell"]
    cells[f"{CONTROL} - baseline: accuracy"] = stats.paired_difference(
        matrix("baseline", "correct", "standard"), matrix(CONTROL, "correct", "standard"), bounds=(-1.0, 1.0)
    )
    cells[f"{CONTROL} - baseline: completion loss"] = stats.paired_difference(
        matrix("baseline", "completion_nll", "standard"), matrix(CONTROL, "completion_nll", "standard")
    )
    for r in ("soft", "fused"):
        cells[f"fbt {r} - fbt standard: accuracy"] = stats.paired_difference(
            matrix("fbt", "correct", "standard"), matrix("fbt", "correct", r), bounds=(-1.0, 1.0)
        )
    cells[f"fbt fused - {COMPUTE}: accuracy"] = stats.paired_difference(
        matrix(COMPUTE, "correct", "standard"), matrix("fbt", "correct", "fused"), bounds=(-1.0, 1.0)
    )

    def outside(member: str, name: str, regime: str) -> np.ndarray:
        return np.array([per_seed[s][member]["beyond"][name]["correct"][regime] for s in seeds], dtype=np.float64)

    for name in beyond:
        for r in BEYOND_REGIMES:
            cells[f"fbt {r} - baseline: accuracy, {name}"] = stats.paired_difference(
                outside("baseline", name, "standard"), outside("fbt", name, r), bounds=(-1.0, 1.0)
            )
    if band is not None:
        for r in BEYOND_REGIMES:
            cells[f"fbt {r} - baseline: accuracy, {BAND}"] = stats.paired_difference(
                outside("baseline", band, "standard"), outside("fbt", band, r), bounds=(-1.0, 1.0)
            )
        cells[f"fbt fused - {COMPUTE}: accuracy, {BAND}"] = stats.paired_difference(
            outside(COMPUTE, band, "standard"), outside("fbt", band, "fused"), bounds=(-1.0, 1.0)
        )

    def graded(name: str) -> dict:
        members = (("baseline", ["standard"]), ("fbt", list(BEYOND_REGIMES)), (COMPUTE, ["standard"]))
        return {m: {r: stats.accuracy_interval(outside(m, name, r)) for r in regimes} for m, regimes in members}

    not_run = dict(not_run or {})
    if band is None:
        not_run = dict.fromkeys(BAND_CELLS, "no difficulty band was declared") | not_run
    if "cell" not in efficiency:
        not_run[AFTER_SWITCH] = efficiency["why"]
    family = stats.family({name: cells[name] for name in family_names(beyond) if name in cells and name not in not_run})
    return {
        "seeds": seeds,
        "accuracy": accuracy,
        "beyond": {
            name: {
                member: {r: stats.accuracy_interval(outside(member, name, r)) for r in regimes}
                for member, regimes in (("baseline", ["standard"]), ("fbt", list(BEYOND_REGIMES)))
            }
            for name in beyond
        },
        "band": band,
        "curves": {name: graded(name) for name in curves},
        "family": family,
        "wording": {name: stats.describe(cell) for name, cell in family.items()},
        "after_switch": {k: v for k, v in efficiency.items() if k != "cell"},
        # a declared comparison that could not be measured or was not run, and why (read as "not testable")
        "unmeasured": not_run,
        "loss_gap_per_step": {
            "steps": steps,
            "cells": [stats.crossed_interval(gap[:, [i]]) if S > 1 else {"mean": float(gap[0, i])} for i in range(len(steps))],
        },
        "time_to_threshold": {
            "threshold": threshold,
            "window": window,
            **{
                member: {
                    "per_seed": [{"step": t, "reached": e} for t, e in rows],
                    "median": stats.median_time([t for t, _ in rows], [e for _, e in rows]),
                    "kaplan_meier": stats.kaplan_meier([t for t, _ in rows], [e for _, e in rows])
                    if any(e for _, e in rows)
                    else [],
                }
                for member, rows in reached.items()
            },
        },
    }
