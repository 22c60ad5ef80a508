"""The fair study's tuning: one rule, written before the sweep runs (``RULE``), applied to every
architecture on a grid that brackets its optimum.

Each architecture gets the same learning rates (the scale's ``lrs``); FBT also
``fbt.feedback_start`` in ``FEEDBACK_STARTS`` (at ``fbt.ramp`` 0.1) and then, at its chosen
learning rate and start, ``fbt.ramp`` in ``RAMPS``. Every sweep row trains at each of
``TUNING_SEEDS``, seeds no comparison member uses, for the full budget, and is scored on the
validation split (neither training data nor test problems) by the worse of its seeds' losses: a
setting whose learning time depends on the seed loses to one that learns at both.

Two guards make the choice fair. A choice at the edge of the grid says the optimum may lie beyond
it, so the grid grows by a factor of 2 past that edge and the rule is applied again, at most
``EXTENSIONS`` times (``tuning.json`` keeps every round). And a row is eligible only where its
model learned the task in its standard regime at both seeds (the competence target, on the held-out
problems of the member's own evaluation): a feedback model can reach a low fused loss without
answering in the standard regime, and a claim read from it would be a tuning failure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from workbench.data.tasks import synthetic_examples
from workbench.experiments.bands import band_accuracy
from workbench.names import FAIR_STUDY as STUDY
from workbench.runtime.checkpoint import load_model
from workbench.runtime.tokenizer import load_tokenizer
from workbench.storage.errors import BadInput
from workbench.storage.files import write_json
from workbench.storage.outputs import output
from workbench.training.evaluate import evaluate_examples
from workbench.training.runconfig import RunConfig, load_run_config, task_settings
from workbench.training.zoo import ZOO, new_summary, train_plan

TUNING_SEEDS = (1000, 1001)  # the sweep's training seeds: none of the comparison's seeds 0..MAX_SEEDS-1
FEEDBACK_STARTS = (0.3, 0.7)
RAMPS = (0.1, 0.3)  # the first is the stage-1 ramp (the default)
EXTENSIONS = 3  # at most this many times a learning-rate grid grows past the edge its choice sits at
REGIME = {"baseline": "standard", "fbt": "fused"}  # the regime an architecture is tuned and compared in
RULE = (
    "Per architecture, the eligible sweep row with the lowest validation completion loss (mean over "
    "the validation problems' completion tokens) at the full budget, in the architecture's regime "
    "(baseline: standard; FBT: fused, its feedback at the prompt and at every generated step), a "
    "row's loss being the worse of its two tuning seeds'; ties go to the row listed first. A row is "
    "eligible when both of its runs reached the task's competence target in the standard regime "
    "(without targets, every row is). When the chosen learning rate is the lowest or the highest of "
    "the architecture's grid, the grid gains the learning rate a factor 2 beyond that edge and the "
    "rule is applied again, at most 3 times. FBT: stage 1 chooses the learning rate and "
    "feedback_start at ramp 0.1, stage 2 the ramp at that learning rate and start."
)


def setting_overrides(arch: str, setting: dict) -> list[str]:
    """The ``--set`` overrides of a tuned ``setting`` (``lr``; FBT also ``feedback_start``, ``ramp``)."""
    out = [f"train.lr={setting['lr']:g}"]
    if arch == "fbt":
        out += [f"fbt.feedback_start={setting['feedback_start']:g}", f"fbt.ramp={setting['ramp']:g}"]
    return out


def sweep_name(arch: str, setting: dict) -> str:
    if arch == "baseline":
        return f"tune-baseline-lr{setting['lr']:g}"
    return f"tune-fbt-lr{setting['lr']:g}-start{setting['feedback_start']:g}-ramp{setting['ramp']:g}"


def grid_rows(arch: str, lrs) -> list[tuple[str, dict]]:
    """The stage-1 rows of ``arch`` at learning rates ``lrs``: ``(arch, setting)``."""
    if arch == "baseline":
        return [("baseline", {"lr": lr}) for lr in lrs]
    return [("fbt", {"lr": lr, "feedback_start": f, "ramp": RAMPS[0]}) for lr in lrs for f in FEEDBACK_STARTS]


def stage_one(lrs) -> list[tuple[str, dict]]:
    """The sweep rows every architecture gets first, at the scale's learning rates ``lrs``."""
    return [*grid_rows("baseline", lrs), *grid_rows("fbt", lrs)]


def beyond_edge(lrs, chosen: float) -> float | None:
    """The learning rate the grid ``lrs`` gains when ``chosen`` sits at one of its edges (a factor
    2 past it); None when the choice is inside the grid."""
    if chosen == min(lrs):
        return chosen / 2
    if chosen == max(lrs):
        return chosen * 2
    return None


def scored_row(name: str, arch: str, setting: dict, losses: list[float], eligible: bool = True) -> dict:
    """A sweep row as ``RULE`` reads it: its validation loss at each of ``TUNING_SEEDS``
    (``validation_losses``) and the worse of them (``validation_loss``), by which it is chosen; a
    loss that is not finite (a diverged run) counts as infinite, the worst, wherever it is listed."""
    return {
        "name": name,
        "arch": arch,
        **setting,
        "regime": REGIME[arch],
        "validation_losses": losses,
        "validation_loss": max(loss if math.isfinite(loss) else math.inf for loss in losses),
        "eligible": eligible,
    }


def choose(rows: list[dict], arch: str) -> dict:
    """``RULE`` over the scored sweep ``rows`` of ``arch`` (the first of equal losses). With no
    eligible row, the best of all, marked ``eligible: false``: the arm did not learn the task at any
    setting, which its competence in the comparison then shows."""
    mine = [r for r in rows if r["arch"] == arch]
    if not mine:
        raise BadInput(f"no sweep row of {arch} to choose from")
    eligible = [r for r in mine if r.get("eligible", True)]
    return min(eligible or mine, key=lambda r: r["validation_loss"])  # min keeps the first of ties


def validation_loss(run: Path, arch: str, n: int) -> float:
    """The run's completion loss on ``n`` validation problems, in its architecture's regime."""
    cfg = load_run_config(run / "config.json")
    examples = synthetic_examples(cfg.data.task, n, 0, task_settings(cfg.data), split="validation")
    row = evaluate_examples(load_model(run), examples, load_tokenizer(run), regimes=[REGIME[arch]])
    return row["answer_loss"][REGIME[arch]]


def tuning_run(arch: str, setting: dict, seed: int) -> str:
    """The directory of a sweep row's run at tuning seed ``seed`` (the first seed keeps the row's name)."""
    name = sweep_name(arch, setting)
    return name if seed == TUNING_SEEDS[0] else f"{name}-seed{seed}"


def pilot(out: Path, chosen: dict, n: int, sets: Mapping[str, dict] | None = None) -> dict[str, np.ndarray]:
    """The power step's pilot: the chosen settings' tuning runs (two seeds each) scored per problem
    on ``n`` validation problems, as the study's declared comparisons of FBT against the baseline
    would read them: per comparison name the [tuning seeds, problems] matrix of differences. On the
    in-distribution problems, accuracy and completion loss in each of FBT's regimes; on each test
    set of ``sets`` (its name in the family -> the task settings its problems are drawn with: a set
    beyond training, the declared band), accuracy in FBT's ``standard`` and ``fused``."""
    scored: dict[tuple[str, str | None], list[dict]] = {}
    for arch in REGIME:
        for seed in TUNING_SEEDS:
            run = out / tuning_run(arch, chosen[arch], seed)
            cfg = load_run_config(run / "config.json")
            model, tokenizer = load_model(run), load_tokenizer(run)
            for name, settings in [(None, {}), *(sets or {}).items()]:
                drawn = dataclasses.replace(task_settings(cfg.data), **settings)
                examples = synthetic_examples(cfg.data.task, n, 0, drawn, split="validation")
                regimes = None if name is None else ["standard", "fused"] if arch == "fbt" else ["standard"]
                row = evaluate_examples(model, examples, tokenizer, regimes=regimes, per_problem=True)
                scored.setdefault((arch, name), []).append(row)

    def matrix(arch: str, name: str | None, what: str, regime: str) -> np.ndarray:
        return np.array([row[what][regime] for row in scored[arch, name]], dtype=np.float64)

    differences = {
        f"fbt {r} - baseline: {label}": matrix("fbt", None, what, r) - matrix("baseline", None, what, "standard")
        for r in ("standard", "soft", "fused")
        for what, label in (("correct", "accuracy"), ("completion_nll", "completion loss"))
    }
    for name in sets or {}:
        for r in ("standard", "fused"):
            differences[f"fbt {r} - baseline: accuracy, {name}"] = matrix("fbt", name, "correct", r) - matrix(
                "baseline", name, "correct", "standard"
            )
    return differences


def band_pilot(out: Path, baseline: dict, n: int, bands: dict[str, dict]) -> dict[str, float]:
    """The baseline's ``band_accuracy`` averaged over the chosen setting's tuning runs: what the
    band a claim is read on is declared from, before any comparison member trains."""
    runs = [band_accuracy(out / tuning_run("baseline", baseline, seed), bands, n) for seed in TUNING_SEEDS]
    return {name: sum(r[name] for r in runs) / len(runs) for name in bands}


def learned(models: dict, name: str) -> bool:
    """Whether a tuning run met its competence target in the standard regime (a plumbing check,
    without targets, always counts)."""
    competence = models[name]["competence"]
    return bool(competence["qualified"] or competence["plumbing_check"])


def tune(
    scale: str,
    s: dict,
    config: Callable[[str, list[str]], RunConfig],
    out: Path,
    *,
    threads: int,
    jobs: int,
    progress: bool | Callable,
) -> dict:
    """Run the sweep of scale ``scale`` (settings ``s``; ``config(arch, overrides)`` a member's
    run config) into ``out``, growing each architecture's grid past an edge choice, and apply
    ``RULE``: ``{rule, rows, rounds, chosen}``, written to ``out/tuning.json``."""
    summary = new_summary(scale, 1, threads, jobs, study=STUDY)
    scored: list[dict] = []

    def run_stage(rows: list[tuple[str, dict]]) -> None:
        rows = [(arch, setting) for arch, setting in rows if all(r["name"] != sweep_name(arch, setting) for r in scored)]
        plan = [
            (
                tuning_run(arch, setting, seed),
                sweep_name(arch, setting),
                seed,
                config(arch, [f"train.seed={seed}", *setting_overrides(arch, setting)]),
            )
            for arch, setting in rows
            for seed in TUNING_SEEDS
        ]
        done = train_plan(
            plan,
            out,
            out / "tuning.json",
            summary,
            scale=scale,
            threads=threads,
            jobs=jobs,
            progress=progress,
            targets=s["targets"],
        )
        for arch, setting in rows:
            runs = [tuning_run(arch, setting, seed) for seed in TUNING_SEEDS]
            losses = [validation_loss(out / run, arch, s["validation"]) for run in runs]
            eligible = all(learned(done["models"], run) for run in runs)
            scored.append(scored_row(sweep_name(arch, setting), arch, setting, losses, eligible))

    grids = {arch: list(s["lrs"]) for arch in REGIME}
    rounds = []
    run_stage(stage_one(s["lrs"]))
    for _ in range(EXTENSIONS + 1):
        chosen = {arch: choose(scored, arch) for arch in REGIME}
        rounds.append({"lrs": {a: sorted(g) for a, g in grids.items()}, "chosen": {a: r["name"] for a, r in chosen.items()}})
        grow = {arch: beyond_edge(grids[arch], chosen[arch]["lr"]) for arch in REGIME if chosen[arch]["eligible"]}
        grow = {arch: lr for arch, lr in grow.items() if lr is not None}
        if not grow or len(rounds) > EXTENSIONS:
            break
        for arch, lr in grow.items():
            grids[arch].append(lr)
        run_stage([row for arch, lr in grow.items() for row in grid_rows(arch, [lr])])
    first = chosen["fbt"]
    run_stage([("fbt", {"lr": first["lr"], "feedback_start": first["feedback_start"], "ramp": r}) for r in RAMPS])
    stage_two = [
        r for r in scored if r["arch"] == "fbt" and r["lr"] == first["lr"] and r["feedback_start"] == first["feedback_start"]
    ]
    tuning = {
        **summary,
        "rule": RULE,
        "tuning_seeds": list(TUNING_SEEDS),
        "validation_problems": s["validation"],
        "rows": scored,
        "rounds": rounds,
        "chosen": {"baseline": chosen["baseline"], "fbt": choose(stage_two, "fbt")},
    }
    with output(out, ZOO) as held:
        write_json(out / "tuning.json", tuning)
        held.wrote(out / "tuning.json")
    return tuning
