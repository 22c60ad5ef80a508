"""FBT against the baseline, fair by construction: one command,
``workbench zoo --study fbt-vs-baseline --preset org-perm --seeds power``.

1. **Tuning, by a rule written before the sweep runs** (``experiments.tuning``: one learning-rate
   grid for every architecture, grown past an edge choice, FBT's rows eligible only where FBT
   learned the task in its standard regime).
2. **The comparison**, at training seeds 0..n-1, each architecture at its chosen setting:
   ``baseline``; ``fbt`` (matched initialisation, warm feedback switch: the defaults); and the
   control ``fbt-no-feedback``, FBT's model at the baseline's setting with ``fbt.pass_weights=1,0,0``
   (its feedback passes carry no loss: the baseline on FBT's initialisation and batches, so any
   difference from the baseline would be the comparison's own bias; with matched initialisation
   its shared weights are expected bitwise the baseline's); and ``baseline-compute``, the baseline
   at its setting trained for FBT's training FLOPs at the same seed (``flops_ratio``):
   FBT's K passes cost more per token, so a claim is read at equal tokens and at equal compute.
3. **Readouts** on the same ``test`` held-out problems for every member (seed 0's held-out stream:
   seeds and problems crossed): accuracy and completion loss per problem and regime, each member
   minus the baseline by seed (``stats.paired_difference``); the paired per-step gap of the
   plain-pass training loss on identical batches; the steps from FBT's feedback switch until the
   plain-pass loss, averaged over ``window`` logged steps, reaches a loss both arms reach only after
   the switch, as the log ratio FBT / baseline across seeds (``after_switch``; before the switch
   the two arms run one computation, so a threshold crossed then measures nothing of feedback).
4. **The family** of ``FAMILY`` comparisons, Holm-corrected together (``stats.family``), worded by
   ``stats.describe``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from workbench.data.splits import heldout_examples
from workbench.experiments.power import EFFECTS, components, seeds_for
from workbench.experiments.tuning import pilot, setting_overrides, tune
from workbench.names import FAIR_STUDY as STUDY
from workbench.runtime.checkpoint import load_model
from workbench.runtime.tokenizer import load_tokenizer
from workbench.storage.errors import BadInput
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import output
from workbench.storage.provenance import source_commit
from workbench.training import stats
from workbench.training.evaluate import evaluate_examples
from workbench.training.runconfig import RunConfig, load_run_config, make_run_config, task_settings
from workbench.training.strategies import run_flops
from workbench.training.zoo import (
    MAX_SEEDS,
    ORGANISM_BUDGETS,
    ORGANISMS,
    TARGETS,
    ZOO,
    new_summary,
    previous_summary,
    seed_name,
    train_plan,
)
from workbench.training.zoo import SCALES as SCALES_OF_ZOO

TEST_FILE = "comparison_test.json"  # per member, in results/: its per-problem scores

# The scales: ``micro`` checks the plumbing in seconds; ``modsum`` is the setting in which the old
# zoo's FBT-minus-baseline gap on modsum was measured (tiny, p = 3, 1-6 digits, seq 64,
# batch 16, 600 steps), where a tiny baseline learns modsum within its budget; ``flipflop`` the same
# on the zoo's third task (the threshold, as modsum's, about half the chance-level completion loss).
MODSUM = ["data.modsum_p=3", "data.modsum_min_len=1", "data.modsum_max_len=6"]
TINY = {  # the modsum and flip-flop scales' shared settings
    "preset": "tiny",
    "steps": 600,
    "jobs": 2,
    "threads": 1,
    "lrs": (5e-4, 1e-3, 2e-3),
    "validation": 500,
    "test": 1000,  # binomial standard error <= 0.016 per seed
    "window": 3,
}
TINY_COMMON = [
    "train.batch_size=16",
    "train.seq_len=64",
    "train.warmup=30",
    "train.log_every=10",
    "train.checkpoint_every=600",
    "train.eval_examples=64",
    "data.n_train=40000",
    "data.loss_on=completion",
    "data.windows=example",
]
SCALES = {
    "micro": {
        "task": "modsum",
        "preset": "debug",
        "steps": 40,
        "jobs": 1,
        "threads": 2,
        "lrs": (1e-3, 3e-3, 1e-2),
        "validation": 48,
        "test": 64,
        "threshold": 0.5,
        "window": 2,
        "targets": None,
        "common": [
            "train.batch_size=8",
            "train.seq_len=64",
            "train.warmup=4",
            "train.log_every=4",
            "train.checkpoint_every=1000",
            "train.eval_examples=8",
            "data.n_train=400",
            "data.loss_on=completion",
            "data.windows=example",
            *MODSUM,
        ],
    },
    "modsum": {**TINY, "task": "modsum", "threshold": 0.25, "targets": {"modsum": 0.8}, "common": [*TINY_COMMON, *MODSUM]},
    # completion loss: chance is ln(3) / 2 = 0.55 on modsum, ln(2) / 2 = 0.35 on a flip-flop bit
    # (answer and <eos>); each threshold is about half of it
    "flipflop": {**TINY, "task": "flipflop", "threshold": 0.17, "targets": {"flipflop": 0.95}, "common": TINY_COMMON},
}


def organism_scale(task: str, lrs: tuple[float, ...], threshold: float) -> dict:
    """The fair study on a model organism (``workbench.training.zoo.ORGANISMS``): its task, settings
    and budget, a sweep of three learning rates ``lrs`` that holds the organism's own, the
    loss logged every 10 steps for the time to ``threshold``, and its test sets beyond training
    (``BEYOND``)."""
    steps = ORGANISM_BUDGETS[task][0]
    common = [line for line in SCALES_OF_ZOO[ORGANISMS[task]]["common"] if not line.startswith(("train.lr=", "train.log_every="))]
    return {
        **TINY,
        "task": task,
        "steps": steps,
        "threshold": threshold,
        "targets": TARGETS[ORGANISMS[task]],
        "common": [*common, "train.log_every=10"],
        "lrs": lrs,
        "beyond": BEYOND.get(task, {}),
    }


# Test problems beyond training, where an organism's ceiling leaves room (every member reaches 1.0
# on the flip-flop and the baseline on perm): the task settings they are drawn with instead of the
# training ones. The flip-flop trains at write : ignore : read = 0.3 : 0.5 : 0.2 and is tested
# sparser (0.85 ignores: a written bit must be held over longer stretches, where Liu et al. find
# transformers' rare "glitches") and denser (0.1); Liu et al. go from 0.8 to 0.98 and 0.1, but at
# 8-24 instructions 0.98 leaves most sequences without a write. Perm trains on 1-3 permutations
# and is tested on 4-6 (serial composition beyond the depth trained). Addition has none: a 4-digit
# trace with a line per digit is 66-70 tokens, past the 64-token training windows, so it would
# test positions never trained rather than longer carries.
BEYOND = {
    "flipflop": {"sparser": {"flipflop_weights": (0.1, 0.85, 0.05)}, "denser": {"flipflop_weights": (0.45, 0.1, 0.45)}},
    "perm": {"longer": {"perm_min_len": 4, "perm_max_len": 6}},
}
BEYOND_REGIMES = ("standard", "fused")  # single-token answers: soft decodes as standard does


# thresholds: perm's chance-level completion loss is ln(6) / 2 = 0.90 (answer and <eos>), a
# flip-flop's ln(2) / 2 = 0.35, each about halved as above; addition's completions are traces,
# so its threshold is the training loss at which the pilot's held-out accuracy passed one half
# (0.23 at step 500, accuracy 0.47; 0.11 at step 600, 0.77).
# Learning rates: the organism's own in the middle, one a factor 2 either side; addition's start at
# its own. Below it the baseline learns addition late and by seed: at 5e-4 it missed
# the target at 2 of 7 seeds (0.825, 0.215), and neither lever of the organism caught the slower
# one up (docs/results/organism_pilots.json, seed 4: 0.88 after 2,000 steps, past the zoo's time
# budget; 0.85 on 1-2 digits), while at 1e-3 it reached it at each of the zoo's 5 seeds; FBT's
# choice sat at the old grid's top (2e-3), so the sweep goes a factor 2 past it.
SCALES |= {
    "org-flipflop": organism_scale("flipflop", (2.5e-4, 5e-4, 1e-3), 0.17),
    "org-perm": organism_scale("perm", (2.5e-4, 5e-4, 1e-3), 0.45),
    "org-addition": organism_scale("addition", (1e-3, 2e-3, 4e-3), 0.2),
}
CONTROL = "fbt-no-feedback"
COMPUTE = "baseline-compute"  # the baseline trained for FBT's training FLOPs
AFTER_SWITCH = "fbt - baseline: log steps to the loss threshold after the switch"
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
    *(f"fbt {r} - {COMPUTE}: accuracy" for r in ("standard", "soft", "fused")),
)


def family_names(beyond) -> tuple[str, ...]:
    """The family of a scale with test sets ``beyond`` (names): ``FAMILY``, then each regime of
    ``BEYOND_REGIMES`` against the baseline on each set, all Holm-corrected together."""
    return (*FAMILY, *(f"fbt {r} - baseline: accuracy, {name}" for name in beyond for r in BEYOND_REGIMES))


def _scale(scale: str) -> dict:
    if scale not in SCALES:
        raise BadInput(f"unknown {STUDY} scale {scale!r}: expected one of {sorted(SCALES)}")
    return SCALES[scale]


def member_config(scale: str, arch: str, overrides: list[str]):
    s = _scale(scale)
    return make_run_config(arch, s["preset"], s["task"], [*s["common"], f"train.steps={s['steps']}", *overrides])


def comparison_members(chosen: dict) -> list[tuple[str, str, list[str]]]:
    """``(member, arch, overrides)`` of the comparison at the ``chosen`` settings."""
    base, fbt = chosen["baseline"], chosen["fbt"]
    return [
        ("baseline", "baseline", setting_overrides("baseline", base)),
        ("fbt", "fbt", setting_overrides("fbt", fbt)),
        (CONTROL, "fbt", [*setting_overrides("baseline", base), "fbt.pass_weights=1,0,0"]),
        (COMPUTE, "baseline", setting_overrides("baseline", base)),
    ]


def flops_ratio(fbt: RunConfig, baseline: RunConfig) -> float:
    """FBT's training FLOPs over the baseline's (``strategies.run_flops``: every step's passes as the
    run draws them); ``baseline-compute`` trains this many times the baseline's steps."""
    return run_flops(fbt) / run_flops(baseline)


def member_regimes(member: str) -> list[str]:
    return ["standard", "soft", "fused"] if member == "fbt" else ["standard"]


def as_recorded(settings: dict) -> dict:
    """Task settings as JSON gives them back (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}


def score_member(run: Path, member: str, n: int, beyond: tuple[str, dict] | None = None) -> dict:
    """Per regime the 1/0 correctness and the completion loss of each of ``n`` test problems (seed
    0's held-out stream, the same for every member and seed), written to ``results/TEST_FILE``.
    ``beyond``: ``(name, settings)`` of a test set beyond training (``BEYOND``), its problems drawn
    with the run's task settings changed by ``settings``, in ``BEYOND_REGIMES`` (the baseline in
    its one), written to ``results/comparison_test_NAME.json``."""
    name, settings = beyond if beyond is not None else (None, {})
    path = run / "results" / (TEST_FILE if name is None else f"comparison_test_{name}.json")
    regimes = member_regimes(member) if name is None else [r for r in BEYOND_REGIMES if r in member_regimes(member)]
    recorded = as_recorded(settings)
    if path.is_file():
        saved = read_json(path)
        whole = [saved.get(what) for what in ("correct", "completion_nll")]
        if (
            saved.get("n") == n
            and saved.get("settings", {}) == recorded
            and all(isinstance(w, dict) and set(w) == set(regimes) and all(len(v) == n for v in w.values()) for w in whole)
        ):
            return saved  # scored before (a rerun); anything else is scored again
    cfg = load_run_config(run / "config.json")
    examples = heldout_examples(cfg.data.task, n, 0, dataclasses.replace(task_settings(cfg.data), **settings))
    row = evaluate_examples(load_model(run), examples, load_tokenizer(run), regimes=regimes, per_problem=True)
    result = {"n": n, "problems_seed": 0, "correct": row["correct"], "completion_nll": row["completion_nll"]}
    if name is not None:
        result["settings"] = recorded
    with output(run / "results", "results") as held:
        write_json(path, result)
        held.wrote(path)
    return result


def plain_losses(run: Path) -> tuple[list[int], list[float]]:
    """The logged steps and plain-pass training losses (FBT's pass 1, the baseline's loss) of a run."""
    steps, losses = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "step" in record and ("loss_pass1" in record or "loss" in record):
            steps.append(int(record["step"]))
            losses.append(float(record.get("loss_pass1", record.get("loss"))))
    return steps, losses


def time_to_threshold(steps: list[int], losses: list[float], threshold: float, window: int, budget: int) -> tuple[int, bool]:
    """``(step, reached)``: the first logged step at which the mean of the last ``window`` logged
    losses is at most ``threshold``; ``(budget, False)`` when it never is (censored)."""
    for i in range(window - 1, len(losses)):
        if sum(losses[i - window + 1 : i + 1]) / window <= threshold:
            return steps[i], True
    return budget, False


def shared_bitwise(control: Path, baseline: Path) -> bool:
    """Whether every tensor the baseline has is bitwise the same in the control's weights."""
    a, b = load_file(str(baseline / "model.safetensors")), load_file(str(control / "model.safetensors"))
    return all(name in b and torch.equal(a[name], b[name]) for name in a)


def first_difference(a: dict, b: dict) -> int | None:
    """The first logged step at which two runs' plain-pass training losses differ (None: never).
    The control's equal the baseline's to the last bit until its first 2-pass step; from there the
    gradient norm that clipping divides by also sums the fusion's (zero) gradients, which rounds
    differently once clipping is active."""
    return next((step for step, x, y in zip(a["steps"], a["losses"], b["losses"]) if x != y), None)


def power_step(pilot: dict[str, np.ndarray], problems: int, family_size: int) -> dict:
    """The seeds the study needs (``power.seeds_for``, 5 to 12) so that each comparison of the
    ``pilot`` (its name -> [pilot seeds, problems] differences) resolves its target effect
    (``power.EFFECTS``: accuracy or loss) at ``problems`` test problems in a family of
    ``family_size``: the most any of them needs. A comparison that even 12 seeds cannot resolve
    is not run (``not_run``, with why): its "no detectable difference" would say nothing."""
    plans = {
        name: seeds_for(components(d), problems, family_size, EFFECTS["accuracy" if name.endswith("accuracy") else "loss"])
        for name, d in pilot.items()
    }
    return {
        "seeds": max((p["seeds"] for p in plans.values() if p["seeds"] is not None), default=5),
        "comparisons": plans,
        "not_run": {name: p["reason"] for name, p in plans.items() if p["seeds"] is None},
    }


def switch_step(run: Path) -> int:
    """The step at which an FBT run's feedback passes start."""
    cfg = load_run_config(run / "config.json")
    return round(cfg.fbt.feedback_start * cfg.train.steps)


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
) -> dict:
    """The study's readouts from ``per_seed[seed][member]`` = ``{correct, completion_nll, steps,
    losses}`` (``correct`` / ``completion_nll``: regime -> one value per test problem; with test
    sets ``beyond`` training, the baseline's and FBT's also ``beyond: {name: {correct, ...}}``): per
    member and regime the accuracy with its seed-by-problem interval (on each set beyond, too);
    every comparison of ``family_names(beyond)`` with Holm's correction; the per-step loss gaps, the
    times to ``threshold`` (descriptive) and the times after FBT's ``switch`` (``after_switch``).
    ``not_run``: comparisons the power step left out of the family, with why."""
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
    for r in ("standard", "soft", "fused"):
        cells[f"fbt {r} - {COMPUTE}: accuracy"] = stats.paired_difference(
            matrix(COMPUTE, "correct", "standard"), matrix("fbt", "correct", r), bounds=(-1.0, 1.0)
        )

    def outside(member: str, name: str, regime: str) -> np.ndarray:
        return np.array([per_seed[s][member]["beyond"][name]["correct"][regime] for s in seeds], dtype=np.float64)

    for name in beyond:
        for r in BEYOND_REGIMES:
            cells[f"fbt {r} - baseline: accuracy, {name}"] = stats.paired_difference(
                outside("baseline", name, "standard"), outside("fbt", name, r), bounds=(-1.0, 1.0)
            )
    not_run = dict(not_run or {})
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


def run_comparison(
    scale: str = "micro",
    out: str | Path | None = None,
    *,
    seeds: int | None = None,
    threads: int | None = None,
    jobs: int | None = None,
    progress: bool | Callable = True,
) -> dict:
    """Tune (``tune``), choose the seeds (``power_step`` on the tuning runs; ``seeds``, when given,
    overrides its count but not what it leaves out), train the comparison at seeds 0..seeds-1 into
    ``out`` (default ``runs/studies/fbt-vs-baseline``), score every member on the test problems and
    write ``study.json``: the tuning, the power step with its predicted and achieved half-widths,
    the members' rows and the ``readings``."""
    s = _scale(scale)
    if seeds is not None and not 2 <= seeds <= MAX_SEEDS:
        raise BadInput(f"seeds={seeds}: expected 2..{MAX_SEEDS} training seeds (a paired interval needs two)")
    threads = s["threads"] if threads is None else threads
    jobs = s["jobs"] if jobs is None else jobs
    out = Path(out) if out is not None else Path("runs") / "studies" / STUDY
    previous_summary(out / "study.json")  # a user's file of that name is refused before anything is trained
    started = time.perf_counter()
    tuning = tune(
        scale,
        s,
        lambda arch, overrides: member_config(scale, arch, overrides),
        out,
        threads=threads,
        jobs=jobs,
        progress=progress,
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads * jobs)
    try:
        power = power_step(pilot(out, tuning["chosen"], s["validation"]), s["test"], len(family_names(s.get("beyond", {}))))
    finally:
        torch.set_num_threads(before)
    seeds = power["seeds"] if seeds is None else seeds
    plan, matched = [], []
    for seed in range(seeds):
        members = {
            member: (arch, [f"train.seed={seed}", *overrides]) for member, arch, overrides in comparison_members(tuning["chosen"])
        }
        configs = {member: member_config(scale, arch, overrides) for member, (arch, overrides) in members.items()}
        ratio = flops_ratio(configs["fbt"], configs["baseline"])
        steps = round(ratio * configs["baseline"].train.steps)
        configs[COMPUTE] = member_config(scale, "baseline", [*members[COMPUTE][1], f"train.steps={steps}"])
        matched.append({"seed": seed, "steps": steps, "flops_ratio": ratio})
        plan += [(seed_name(member, seed), member, seed, cfg) for member, cfg in configs.items()]
    summary = new_summary(scale, seeds, threads, jobs, study=STUDY)
    summary = train_plan(
        plan, out, out / "study.json", summary, scale=scale, threads=threads, jobs=jobs, progress=progress, targets=s["targets"]
    )
    per_seed: dict[int, dict[str, dict]] = {}
    before = torch.get_num_threads()
    torch.set_num_threads(threads * jobs)
    try:
        for name, member, seed, _ in plan:
            scores = score_member(out / name, member, s["test"])
            if member in ("baseline", "fbt"):
                scores["beyond"] = {
                    b: score_member(out / name, member, s["test"], (b, v)) for b, v in s.get("beyond", {}).items()
                }
            steps, losses = plain_losses(out / name)
            per_seed.setdefault(seed, {})[member] = {**scores, "steps": steps, "losses": losses}
    finally:
        torch.set_num_threads(before)
    with output(out, ZOO) as held:
        summary["tuning"] = {k: tuning[k] for k in ("rule", "tuning_seeds", "validation_problems", "rows", "rounds", "chosen")}
        summary["readings"] = readings(
            per_seed,
            s["threshold"],
            s["window"],
            s["steps"],
            tuple(s.get("beyond", {})),
            switch=switch_step(out / "fbt"),
            not_run=power["not_run"],
        )
        power["achieved"] = {
            name: (cell["family_high"] - cell["family_low"]) / 2
            for name, cell in summary["readings"]["family"].items()
            if name in power["comparisons"]
        }
        summary["power"] = power
        summary["readings"]["beyond_settings"] = {b: as_recorded(v) for b, v in s.get("beyond", {}).items()}
        summary["compute_matched"] = matched
        summary["family"] = summary["readings"].pop("family")  # where every study keeps its family
        summary["readings"]["control_bitwise_seeds"] = sum(
            shared_bitwise(out / seed_name(CONTROL, seed), out / seed_name("baseline", seed)) for seed in range(seeds)
        )
        summary["readings"]["control_same_loss_until"] = [
            first_difference(per_seed[seed]["baseline"], per_seed[seed][CONTROL]) for seed in range(seeds)
        ]
        summary["commit"] = source_commit()
        summary["study_wall_seconds"] = round(time.perf_counter() - started, 1)
        write_json(out / "study.json", summary)
        held.wrote(out / "study.json")
    return summary
