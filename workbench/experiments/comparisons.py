"""The seed papers' comparisons as studies on zoo-sized models, each one command
(``workbench zoo --study NAME``), each member at several training seeds, every reading a mean with
a 95% interval across seeds (``workbench.training.intervals``).

- ``data-efficiency`` (the FBT paper: FBT matches a baseline trained on 1.5-2x the tokens):
  ``baseline`` and ``fbt`` at three token budgets (a quarter, a half and all of the zoo's steps,
  each a run with its own schedule). The validation loss is the completion loss on held-out
  problems (``answer_loss``, what training scores), averaged over the tasks; for each FBT budget and
  regime, the tokens the baseline needs to reach FBT's loss, interpolated on the baseline's curve
  in log tokens (``tokens_to_reach``), divided by FBT's tokens: the token ratio.
- ``three-pass`` (FBT's stability knob): ``fbt.three_pass_fraction`` in {0, 0.03, 0.1, 0.3}; per
  member the K-pass residual at K = 2..8, the leading Lyapunov exponent from tangent vectors at
  100 and 1000 steps (where the horizon reaches them), of the carried-state map F_t (context
  frozen) and of the whole decoding step (context carried too), the step at which a 1e-3 perturbation of
  the carried state first regrows to its size (``regrowth_step``), and held-out accuracy under
  ``soft`` and ``fused``.
- ``hd-ablations`` (the Hidden Decoding paper's ablations): from a ``baseline`` per seed, HD
  continued for the zoo's HD steps at n = 1 (the baseline continued alike), 2, 4 and 8 streams by
  progressive expansion, and at n = 4: every stream supervised, the sum-of-streams readout,
  cross-stream attention in every layer, and the shared key/value cache (later tokens see only the
  last stream's keys and values). Per member: held-out accuracy and completion loss per
  task, the loss jump at each expansion, the training time relative to n = 1 (from the runs'
  logs), and the cost of one training step relative to n = 1, measured side by side.
- ``probes`` (the FBT paper: recurrent prefill exposes global state at layer 0): ``baseline`` and
  ``fbt`` at the zoo's settings; per seed a linear probe of the task's state label (the organism's:
  the flip-flop's stored bit, the permutation's running product, addition's carry) on the input to
  block 0 (FBT's fused input), under standard prefill and under recurrent prefill with K = 2
  passes (FBT), on the same held-out sequences.
- ``traces`` (the FBT paper: shorter traces at equal accuracy): ``baseline`` and ``fbt`` at the
  zoo's settings; per seed a trace study on the same held-out problems of the scale's traced task
  (an organism's addition, whose scratchpads mix verbosities; on a zoo of the mix, chain), FBT in
  each regime against the baseline: trace tokens and accuracy per problem, seeds and problems crossed.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from workbench.names import COMPARISON_STUDIES as STUDIES
from workbench.runtime.config import make_config
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import LOCK, output
from workbench.training import stats
from workbench.training.intervals import ACCURACY, ACCURACY_DIFFERENCE, seed_interval
from workbench.training.runconfig import load_run_config
from workbench.training.zoo import (
    MAX_SEEDS,
    SCALES,
    ZOO,
    config_differences,
    execution,
    member_config,
    new_summary,
    previous_summary,
    seed_name,
    train_plan,
)


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


BUDGETS = (0.25, 0.5, 1.0)  # data-efficiency: fractions of the scale's training steps
THREE_PASS = (0.0, 0.03, 0.1, 0.3)  # three-pass: the fractions of 3-pass feedback batches
# three-pass: the last step of lambda(T), T = 100, 1000 (micro: 100; every other scale 1000)
HORIZONS = {scale: 100 if scale == "micro" else 1000 for scale in SCALES}
PERTURB_AT = 20  # three-pass: the rollout step of the perturbation, where the tangents start too
FBT_REGIMES = ("standard", "soft", "fused")
PROBE_HOOK = "blocks.0.hook_resid_pre"  # probes: the input to block 0 (FBT's fused input)
PROBE_PASSES = 2  # probes: the recurrent prefill's passes (the 2-pass objective's)
PROBE_SEQUENCES = 400  # probes: held-out sequences per run (the probe verb's default)
TRACE_PROBLEMS = 200  # traces: held-out problems per seed, the same at every seed
TRACE_TOKENS = 96  # traces: new tokens at most (3-digit addition's longest trace is about 50)


def study_members(study: str, scale: str, seed: int) -> list[tuple[str, str, list[str], str | None]]:
    """``(name, arch, overrides, source)`` of every member of ``study`` at training seed ``seed``;
    ``source`` names the member (of the same seed) it continues from, or is None."""
    if study not in STUDIES:
        raise BadInput(f"unknown study {study!r}: expected one of {STUDIES}")
    if scale not in SCALES:
        raise BadInput(f"unknown zoo preset {scale!r}: expected one of {sorted(SCALES)}")
    steps, hd = SCALES[scale]["steps"], SCALES[scale]["hd_steps"]
    seeded = [f"train.seed={seed}"] if seed else []
    if study == "data-efficiency":
        rows = [
            (f"{arch}-steps{round(f * steps)}", arch, [f"train.steps={round(f * steps)}"], None)
            for f in BUDGETS
            for arch in ("baseline", "fbt")
        ]
    elif study == "three-pass":
        rows = [(f"fbt-3pass{f:g}", "fbt", [f"train.steps={steps}", f"fbt.three_pass_fraction={f}"], None) for f in THREE_PASS]
    elif study in ("probes", "traces"):
        if study == "traces":
            trace_task(scale)  # a scale whose task has no traces is refused before anything is trained
        rows = [(arch, arch, [f"train.steps={steps}"], None) for arch in ("baseline", "fbt")]
    else:
        layers = make_config("baseline", SCALES[scale]["preset"]).n_layers
        stages = {1: ([1], [0]), 2: ([2], [0]), 4: ([2, 4], [0, hd // 2]), 8: ([2, 4, 8], [0, hd // 3, 2 * hd // 3])}

        def grown(n: int) -> list[str]:
            streams, at = stages[n]
            return [f"train.steps={hd}", f"hd.streams={','.join(map(str, streams))}", f"hd.expand_at={','.join(map(str, at))}"]

        rows = [("baseline", "baseline", [f"train.steps={steps}"], None)]
        rows += [(f"hd{n}", "hd", grown(n), "baseline") for n in stages]
        rows += [
            ("hd4-supervise-all", "hd", grown(4) + ["hd.supervise=all"], "baseline"),
            ("hd4-readout-sum", "hd", grown(4) + ["model.readout=sum"], "baseline"),
            ("hd4-cross-every-layer", "hd", grown(4) + [f"model.cross_layers={','.join(map(str, range(layers)))}"], "baseline"),
            ("hd4-shared-kv", "hd", grown(4) + ["model.kv=shared"], "baseline"),
        ]
    return [
        (seed_name(name, seed), arch, seeded + overrides, source and seed_name(source, seed))
        for name, arch, overrides, source in rows
    ]


def run_study(
    study: str,
    scale: str = "micro",
    out: str | Path | None = None,
    *,
    seeds: int = 1,
    threads: int | None = None,
    jobs: int | None = None,
    reuse: str | Path | None = None,
    progress: bool | Callable = True,
) -> dict:
    """Train (or resume) and evaluate ``study``'s members at seeds 0..``seeds``-1 into ``out``
    (default ``runs/studies/STUDY``), ``jobs`` at a time with ``threads`` torch threads each
    (default: the scale's, as the zoo), measure them (with ``threads`` x ``jobs`` threads), and
    write ``study.json`` there: the zoo's per-member rows (``models``, ``across_seeds``) and the
    study's ``readings``. ``reuse``: a zoo directory whose finished members the study copies
    instead of training them again where one is the same run (``zoo_counterparts``); their rows
    name the copy's source (``reused_from``), and their ``train_seconds``, from the copied metrics
    log, are the zoo run's."""
    if not 1 <= seeds <= MAX_SEEDS:
        raise BadInput(f"seeds={seeds}: expected 1..{MAX_SEEDS} training seeds")
    threads, jobs = execution(scale, threads, jobs)
    out = Path(out) if out is not None else Path("runs") / "studies" / study
    plan = []
    for seed in range(seeds):
        plain = [name for name, *_ in study_members(study, scale, 0)]
        for (name, arch, overrides, source), member in zip(study_members(study, scale, seed), plain):
            init = str(out / source) if source else None
            plan.append((name, member, seed, member_config(scale, arch, overrides, init)))
    summary = new_summary(scale, seeds, threads, jobs, study=study)
    previous_summary(out / "study.json")  # a user's file of that name is refused before anything is copied or trained
    copies = zoo_counterparts(plan, Path(reuse)) if reuse is not None else {}
    if copies:
        with output(out, ZOO):
            for name, source in copies.items():
                if not (out / name).exists():  # an earlier copy (or run) there is checked as any member is
                    # the copy keeps the run's manifest: what it lists is the study's now
                    shutil.copytree(source, out / name, ignore=shutil.ignore_patterns(LOCK, ".*.tmp"), symlinks=True)
    summary = train_plan(plan, out, out / "study.json", summary, scale=scale, threads=threads, jobs=jobs, progress=progress)
    with output(out, ZOO) as held:
        for name, source in copies.items():  # its training time is the zoo run's, from the copied metrics log
            summary["models"][name]["reused_from"] = str(source)
        if study == "data-efficiency":
            summary["readings"] = data_efficiency(summary["models"])
        elif study == "three-pass":
            summary["readings"] = three_pass(summary["models"], out, HORIZONS[scale], threads * jobs)
        elif study == "probes":
            summary["readings"] = layer0_probes(summary["models"], out, probe_target(scale), threads * jobs)
        elif study == "traces":
            summary["readings"] = trace_lengths(summary["models"], out, trace_task(scale), threads * jobs)
        else:
            summary["readings"] = hd_ablations(summary["models"])
            for member, ratio in hd_step_times(out, sorted(summary["readings"]), threads).items():
                summary["readings"][member]["step_time_vs_hd1"] = ratio
        summary["family"] = study_family(summary)
        write_json(out / "study.json", summary)
        held.wrote(out / "study.json")
    return summary


def zoo_counterparts(plan: list, zoo: Path) -> dict[str, Path]:
    """The members of ``plan`` that a finished member of the zoo at ``zoo`` already is: the same
    config (the model's grown sizes aside) and, for a member continued from another, continued
    from that one's counterpart. Member name -> the zoo's run directory."""
    summary = zoo / "zoo.json"
    if not summary.is_file():
        raise MissingFile(f"--reuse {zoo}: no zoo there (missing {summary})")
    finished = {}
    for name in read_json(summary).get("models", {}):
        run = zoo / name
        if (run / "train_state" / "state.json").is_file() and (run / "results" / "eval.json").is_file():
            finished[run.resolve()] = load_run_config(run / "config.json")
    found: dict[str, Path] = {}
    for name, _, _, cfg in plan:  # in plan order: a member's source comes before it
        for run, saved in finished.items():
            if config_differences(saved.to_dict(), cfg.to_dict()) or (saved.init_from is None) != (cfg.init_from is None):
                continue
            source = found.get(Path(cfg.init_from).name) if cfg.init_from else None
            if cfg.init_from is None or (source is not None and Path(str(saved.init_from)).resolve() == source):
                found[name] = run
                break
    return found


def ensure_study(study: str, scale: str = "micro", out: str | Path | None = None, *, progress: bool | Callable = False) -> Path:
    """The study's directory, trained and measured first unless its ``study.json`` already has
    every member and the readings (what notebooks call so that they run on a fresh clone)."""
    out = Path(out) if out is not None else Path("runs") / "studies" / study
    names = {name for name, *_ in study_members(study, scale, 0)}
    path = out / "study.json"
    summary = read_json(path) if path.is_file() else {}
    if summary.get("scale") != scale or "readings" not in summary or not names <= set(summary.get("models", {})):
        run_study(study, scale, out, progress=progress)
    return out


# ---- data efficiency ---------------------------------------------------------------------


def completion_loss(row: dict, regime: str) -> float:
    """A member's held-out validation loss in ``regime``: the mean over tasks of the completion loss."""
    values = [task["answer_loss"][regime] for task in row["tasks"].values()]
    return sum(values) / len(values)


def tokens_to_reach(curve: Sequence[tuple[float, float]], loss: float) -> tuple[float, str]:
    """The training tokens at which a loss curve ``[(tokens, loss), ...]`` (increasing tokens) first
    reaches ``loss``, by linear interpolation in log tokens between the two budgets it falls between:
    ``(tokens, "=")``. Below the curve's last loss: ``(last tokens, ">")`` (it needs more than its
    largest budget); at or above its first: ``(first tokens, "<")``."""
    if loss >= curve[0][1]:
        return curve[0][0], "<"
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= loss < l0:
            w = (l0 - loss) / (l0 - l1)
            return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0))), "="
    return curve[-1][0], ">"


def data_efficiency(models: dict) -> dict:
    """Per FBT budget and regime: FBT's loss, the baseline's loss at the same tokens, and the token
    ratio (baseline tokens to reach FBT's loss / FBT's tokens) per seed, with the across-seed
    interval of the ratios that the baseline's budgets bracket (``censored`` counts the others)."""
    by_seed: dict[int, dict[str, dict]] = {}
    for row in models.values():
        by_seed.setdefault(int(row["seed"]), {})[row["member"]] = row
    budgets = sorted({int(row["tokens"]) for row in models.values() if row["member"].startswith("fbt")})
    readings = {}
    for tokens in budgets:
        for regime in FBT_REGIMES:
            ratios, censored, fbt_losses, base_losses = [], [], [], []
            for members in by_seed.values():
                base = sorted(
                    (int(r["tokens"]), completion_loss(r, "standard")) for m, r in members.items() if m.startswith("baseline")
                )
                fbt = [r for m, r in members.items() if m.startswith("fbt") and int(r["tokens"]) == tokens]
                if not fbt or not base:
                    continue
                loss = completion_loss(fbt[0], regime)
                reach, how = tokens_to_reach(base, loss)
                fbt_losses.append(loss)
                base_losses += [b for t, b in base if t == tokens]
                if how == "=":
                    ratios.append(reach / tokens)
                else:  # outside the baseline's budgets: a bound, e.g. ">2" (needs more than twice)
                    censored.append(f"{how}{reach / tokens:.3g}")
            if not fbt_losses:
                continue
            readings[f"{tokens}/{regime}"] = {
                "tokens": tokens,
                "regime": regime,
                "fbt_loss": seed_interval(fbt_losses),
                "baseline_loss": seed_interval(base_losses) if base_losses else None,
                "token_ratio": seed_interval(ratios) if ratios else None,
                "censored": censored,
            }
    return readings


# ---- three-pass --------------------------------------------------------------------------


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


def three_pass(models: dict, out: Path, horizon: int, threads: int) -> dict:
    """Per 3-pass fraction: each seed's stability measures and accuracies, and across seeds the
    mean with its interval of every number (``regrowth_step``: of the seeds where it regrew, with
    ``never`` counting the others)."""
    with torch_threads(threads):
        measured = {name: stability(out / name, horizon) for name in sorted(models)}
    groups: dict[str, list[str]] = {}
    for name, row in models.items():
        groups.setdefault(row["member"], []).append(name)
    readings = {}
    for member, names in sorted(groups.items()):
        names = sorted(names, key=lambda n: int(models[n]["seed"]))
        rows = [measured[n] for n in names]
        accuracy = {
            regime: seed_interval([_mean_accuracy(models[n], regime) for n in names], bounds=ACCURACY)
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


def _mean_accuracy(row: dict, regime: str) -> float:
    values = [task["accuracy"][regime] for task in row["tasks"].values()]
    return sum(values) / len(values)


# ---- probes ------------------------------------------------------------------------------


def probe_target(scale: str) -> str:
    """The state label a scale's probes read: its organism's (``tasks.LABELS``); on a zoo of the
    mix, the flip-flop's stored bit."""
    from workbench.data.tasks import LABELS

    return LABELS[SCALES[scale].get("task", "flipflop")][0]


def layer0_probe(run: Path, target: str) -> dict[str, dict]:
    """One run's layer-0 probe of ``target`` (``probe_study`` on ``PROBE_HOOK``, written to its
    ``results/probe_layer0_TARGET.json``, read back on a rerun): per prefill regime (``standard``;
    FBT also ``recurrent K=2``) the probe's accuracy, its majority-class chance and selectivity."""
    from workbench.probing.study import probe_study

    path = run / "results" / f"probe_layer0_{target}.json"
    if path.is_file():
        report = read_json(path)
    else:
        report = probe_study(
            run, target, hooks=[PROBE_HOOK], passes=(PROBE_PASSES,), exact=False, n_sequences=PROBE_SEQUENCES,
            report_name=path.name, mdl=False, ranks=(),
        )  # fmt: skip
    return {
        (r["prefill"] if r["prefill"] == "standard" else f"recurrent K={r['passes']}"): {
            k: r[k] for k in ("accuracy", "chance", "selectivity")
        }
        for r in report["rows"]
    }


def layer0_probes(models: dict, out: Path, target: str, threads: int) -> dict:
    """Per member its layer-0 probes (``layer0_probe``) at each seed and, across seeds, each
    regime's accuracy and selectivity with their intervals."""
    with torch_threads(threads):
        measured = {name: layer0_probe(out / name, target) for name in sorted(models)}
    readings = {}
    for member in sorted({row["member"] for row in models.values()}):
        names = sorted((n for n, row in models.items() if row["member"] == member), key=lambda n: int(models[n]["seed"]))
        rows = [measured[n] for n in names]
        readings[member] = {
            "runs": names,
            "target": target,
            "hook": PROBE_HOOK,
            "per_seed": rows,
            **{
                what: {regime: seed_interval([r[regime][what] for r in rows], bounds=bounds) for regime in rows[0]}
                for what, bounds in (("accuracy", ACCURACY), ("selectivity", ACCURACY_DIFFERENCE))
            },
        }
    return readings


# ---- traces ------------------------------------------------------------------------------


def trace_task(scale: str) -> str:
    """The traced task a scale's trace study runs: its organism's, or chain on a zoo of the mix;
    ``BadInput`` for an organism whose answers have no trace."""
    from workbench.data.answers import TRACED

    task = SCALES[scale].get("task", "chain")
    if task not in TRACED:
        raise BadInput(f"the traces study on {scale}: its task {task!r} has no traces (expected one of {', '.join(TRACED)})")
    return task


def trace_lengths(models: dict, out: Path, task: str, threads: int) -> dict:
    """Per seed a trace study of its ``baseline`` and ``fbt`` (``trace_study`` into
    ``out/traces/seedS``, read back on a rerun) on the same ``TRACE_PROBLEMS`` problems; per
    ``model/regime`` the trace tokens and correctness of each problem every seed answered (the
    matrices ``per_problem``: seeds x problems) and their crossed intervals."""
    from workbench.studies.traces import read_traces, trace_study

    by_seed: dict[int, dict[str, str]] = {}
    for name, row in models.items():
        by_seed.setdefault(int(row["seed"]), {})[row["member"]] = name
    seeds = sorted(by_seed)
    rows: dict[int, list[dict]] = {}
    with torch_threads(threads):
        for seed in seeds:
            where = out / "traces" / f"seed{seed}"
            if not (where / "traces.csv").is_file():
                runs = [str(out / by_seed[seed][m]) for m in ("baseline", "fbt")]
                trace_study(runs, where, task=task, n_problems=TRACE_PROBLEMS, max_new_tokens=TRACE_TOKENS)
            member = {v: k for k, v in by_seed[seed].items()}  # a run's directory name -> its member
            rows[seed] = [{**r, "pair": f"{member[r['model']]}/{r['regime']}"} for r in read_traces(where / "traces.csv")]
    pairs = sorted({r["pair"] for r in rows[seeds[0]]})
    answered = set.intersection(*({r["problem_id"] for r in rows[s] if r["pair"] == p} for s in seeds for p in pairs))
    problems = sorted(answered)  # a problem some run had no room for is left out of every matrix
    per_problem = {}
    for pair in pairs:
        cell = {s: {r["problem_id"]: r for r in rows[s] if r["pair"] == pair} for s in seeds}
        per_problem[pair] = {
            "trace_tokens": [[float(cell[s][i]["trace_tokens"]) for i in problems] for s in seeds],
            "correct": [[float(cell[s][i]["correct"]) for i in problems] for s in seeds],
        }
    return {
        "task": task,
        "seeds": seeds,
        "problems": len(problems),
        "per_problem": per_problem,
        "groups": {
            pair: {
                "trace_tokens": stats.crossed_interval(np.array(m["trace_tokens"])),
                "accuracy": stats.crossed_interval(np.array(m["correct"]), bounds=(0.0, 1.0)),
            }
            for pair, m in per_problem.items()
        },
    }


# ---- HD ablations ------------------------------------------------------------------------


def hd_reference(member: str) -> str | None:
    """The member an HD ablation is paired against: ``hd1`` (the baseline continued alike) for a
    stream count, ``hd4`` for an n = 4 ablation; None for ``hd1``."""
    if member == "hd1":
        return None
    return "hd4" if member.startswith("hd4-") else "hd1"


def hd_ablations(models: dict) -> dict:
    """Per HD member: accuracy and completion loss per task, the training loss jump at each
    expansion, and training seconds over those of ``hd1`` (the baseline continued alike) of the same
    seed, each across seeds; and ``paired``: the member minus its ``hd_reference`` at the same seed
    (accuracy and completion loss, each the mean of the tasks), across the seeds both have."""
    by_member: dict[str, dict[int, dict]] = {}
    for row in models.values():
        by_member.setdefault(row["member"], {})[int(row["seed"])] = row
    readings = {}
    for member, rows in sorted(by_member.items()):
        if member == "baseline":
            continue
        seeds = sorted(rows)
        first = rows[seeds[0]]
        tasks = {
            task: {
                "accuracy": seed_interval([rows[s]["tasks"][task]["accuracy"]["standard"] for s in seeds], bounds=ACCURACY),
                "completion_loss": seed_interval([rows[s]["tasks"][task]["answer_loss"]["standard"] for s in seeds]),
            }
            for task in first["tasks"]
        }
        jumps = {}
        for k, expansion in enumerate(first.get("expansions", [])):
            values = [rows[s]["expansions"][k]["loss_after"] - rows[s]["expansions"][k]["loss_before"] for s in seeds]
            jumps[f"{expansion['from']}->{expansion['to']}"] = seed_interval(values)
        plain = by_member.get("hd1", {})
        ratios = [rows[s]["train_seconds"] / plain[s]["train_seconds"] for s in seeds if s in plain and plain[s]["train_seconds"]]
        readings[member] = {
            "seeds": seeds,
            "tasks": tasks,
            "accuracy": seed_interval([_mean_accuracy(rows[s], "standard") for s in seeds], bounds=ACCURACY),
            "expansion_jumps": jumps,
            "time_vs_hd1": seed_interval(ratios) if ratios else None,
        }
    for member, reading in readings.items():
        reference = hd_reference(member)
        mine, theirs = by_member[member], by_member.get(reference or "", {})
        seeds = sorted(set(mine) & set(theirs))
        if not seeds:
            continue
        reading["paired"] = {
            "reference": reference,
            "seeds": seeds,
            "accuracy": seed_interval(
                [_mean_accuracy(mine[s], "standard") - _mean_accuracy(theirs[s], "standard") for s in seeds],
                bounds=ACCURACY_DIFFERENCE,
            ),
            "completion_loss": seed_interval(
                [completion_loss(mine[s], "standard") - completion_loss(theirs[s], "standard") for s in seeds]
            ),
        }
    return readings


def hd_step_times(out: Path, members: list[str], threads: int, reps: int = 5) -> dict:
    """The training cost of each HD member (seed 0) against ``hd1``, side by side in this process:
    one optimiser step (its strategy's loss, backward, AdamW) of the trained model at its final
    stream count on a fixed batch of the run's shape, every member's steps interleaved ``reps``
    times after a warm-up (``workbench.bench.timing.measure``) with ``threads`` torch threads (a
    member's own training threads: more threads than free cores slow small steps most, which
    squeezes the ratios).
    Member -> ``{ratio, spread}``: the median over the repetitions of its step time over ``hd1``'s
    in the same repetition, and their min and max."""
    from workbench.bench.timing import measure, ratio_of
    from workbench.bench.train_steps import optimiser_step
    from workbench.runtime.checkpoint import load_model
    from workbench.training.strategies import make_strategy

    def step_of(name: str) -> Callable:
        cfg = load_run_config(out / name / "config.json")
        model, strategy = load_model(out / name), make_strategy(cfg)
        B, last = cfg.train.batch_size, cfg.train.steps - 1
        sizes = {"batch": B, "seq": cfg.train.seq_len}
        return optimiser_step(model, lambda x, y: strategy.loss(model, x, y, last, slice(0, B))[0], sizes)

    with torch_threads(threads):
        times, _ = measure({name: step_of(name) for name in ["hd1", *[m for m in members if m != "hd1"]]}, reps)
    ratios = {}
    for name in members:
        r = ratio_of(times, "hd1", name, what_a="hd1 train step", what_b=f"{name} train step")
        ratios[name] = {"ratio": r["ratio"], "spread": r["spread"]}
    return ratios


# ---- families ----------------------------------------------------------------------------


def study_family(study: dict) -> dict[str, dict]:
    """A study's declared family of paired comparisons, each across its seeds (``stats.paired_difference``
    on the per-seed values, in seed order) and Holm-corrected together (``stats.family``):
    ``three-pass``: each nonzero fraction minus fraction 0 in lambda(1000) of the carried-state map
    and of the whole step and in the K = 8 residual; ``hd-ablations``: each member minus its
    reference in accuracy and completion loss, and ``hd4``'s training loss jump at each expansion;
    ``probes``: FBT's layer-0 probe accuracy under recurrent prefill minus under standard prefill
    and minus the baseline's; ``traces``: FBT in each regime minus the baseline in trace tokens and
    accuracy, seeds and problems crossed (``stats.paired_difference``); ``data-efficiency``: FBT's completion loss minus the
    baseline's at the same tokens, per budget and regime."""
    readings, cells = study.get("readings", {}), {}

    def paired(name: str, a: Sequence[float], b: Sequence[float]) -> None:
        if len(a) == len(b) and len(a) >= 2:
            cells[name] = stats.paired_difference([[x] for x in a], [[y] for y in b])

    if study.get("study") == "three-pass":
        zero = readings.get("fbt-3pass0")
        for member, r in readings.items():
            if zero is None or member == "fbt-3pass0":
                continue
            for key, label in (("lyapunov_tangent", "lambda(1000)"), ("lyapunov_tangent_full", "whole-step lambda(1000)")):
                if "1000" in r[key] and "1000" in zero[key]:
                    paired(f"{member} - fbt-3pass0: {label}", zero[key]["1000"]["values"], r[key]["1000"]["values"])
            paired(
                f"{member} - fbt-3pass0: residual K=8", zero["kpass_residual"]["8"]["values"], r["kpass_residual"]["8"]["values"]
            )
    elif study.get("study") == "hd-ablations":
        for member, r in readings.items():
            if "paired" in r:
                for what in ("accuracy", "completion_loss"):
                    values = r["paired"][what]["values"]
                    paired(f"{member} - {r['paired']['reference']}: {what.replace('_', ' ')}", [0.0] * len(values), values)
        for expansion, jump in readings.get("hd4", {}).get("expansion_jumps", {}).items():
            # cyclic replication keeps the function: the training loss after an expansion minus
            # before it, on the same rows (``train._record_expansion``)
            paired(f"hd4: loss jump at expansion {expansion}", [0.0] * len(jump["values"]), jump["values"])
    elif study.get("study") == "probes" and {"baseline", "fbt"} <= set(readings):
        recurrent = f"recurrent K={PROBE_PASSES}"
        fbt, base = readings["fbt"]["accuracy"], readings["baseline"]["accuracy"]
        if recurrent in fbt:
            paired(f"fbt {recurrent} - fbt standard: layer-0 probe accuracy", fbt["standard"]["values"], fbt[recurrent]["values"])
            paired(f"fbt {recurrent} - baseline: layer-0 probe accuracy", base["standard"]["values"], fbt[recurrent]["values"])
    elif study.get("study") == "traces" and "baseline/standard" in readings.get("per_problem", {}):
        matrices = readings["per_problem"]
        base = matrices["baseline/standard"]
        for regime in FBT_REGIMES:
            fbt = matrices.get(f"fbt/{regime}")
            if fbt is not None and len(fbt["correct"]) >= 2:
                cells[f"fbt {regime} - baseline: trace tokens"] = stats.paired_difference(
                    base["trace_tokens"], fbt["trace_tokens"]
                )
                cells[f"fbt {regime} - baseline: accuracy"] = stats.paired_difference(
                    base["correct"], fbt["correct"], bounds=(-1.0, 1.0)
                )
    elif study.get("study") == "data-efficiency":
        for r in readings.values():
            if r.get("baseline_loss"):
                paired(
                    f"fbt - baseline at {r['tokens']} tokens, {r['regime']}: completion loss",
                    r["baseline_loss"]["values"],
                    r["fbt_loss"]["values"],
                )
    return stats.family(cells) if cells else {}


# ---- tables ------------------------------------------------------------------------------


def interval_text(cell: dict | None, digits: int = 3) -> str:
    """``mean [low, high]`` of a ``seed_interval`` (just the mean for one seed); '-' for none."""
    if not cell:
        return "-"
    mean = f"{cell['mean']:.{digits}g}"
    return mean if cell["n"] < 2 else f"{mean} [{cell['low']:.{digits}g}, {cell['high']:.{digits}g}]"


def family_rows(study: dict) -> list[dict]:
    """A study's declared family (``study_family``, or the fair study's), one row per comparison:
    the difference with its simultaneous interval, the seeds on each side, Holm's p and the
    reading (``stats.describe``'s rule)."""
    rows = []
    for name, cell in study.get("family", {}).items():
        if "earlier" in cell:  # who reached a threshold first, by seed
            difference = "-"
            seeds = f"FBT first {cell['earlier']}, baseline first {cell['later']}, undetermined {cell['undetermined']}"
        else:
            low, high = cell.get("family_low", cell["low"]), cell.get("family_high", cell["high"])
            difference = f"{cell['mean']:+.3g} [{low:+.3g}, {high:+.3g}]"
            seeds = f"{cell['seeds_higher']} higher, {cell['seeds_lower']} lower"
        reading = "detectable" if stats.detectable(cell) else "no detectable difference"
        rows.append(
            {"comparison": name, "difference": difference, "seeds": seeds, "Holm p": f"{cell['p_holm']:.3g}", "reading": reading}
        )
    return rows


def reading_rows(study: dict) -> list[dict]:
    """A study's ``readings`` as table rows of text cells (mean [95% interval] across seeds)."""
    if study.get("study") == "fbt-vs-baseline":  # accuracy on the shared test problems, seeds x problems
        return [
            {"member": member, "regime": regime, "accuracy": f"{c['mean']:.3g} [{c['low']:.3g}, {c['high']:.3g}]"}
            for member, regimes in study.get("readings", {}).get("accuracy", {}).items()
            for regime, c in regimes.items()
        ]
    if study.get("study") == "traces":  # seeds x problems
        return [
            {
                "member/regime": pair,
                **{
                    what: f"{c['mean']:.3g} [{c['low']:.3g}, {c['high']:.3g}]"
                    for what, c in (("trace tokens", g["trace_tokens"]), ("accuracy", g["accuracy"]))
                },
            }
            for pair, g in study.get("readings", {}).get("groups", {}).items()
        ]
    rows = []
    for key, r in study.get("readings", {}).items():
        if study.get("study") == "data-efficiency":
            rows.append(
                {
                    "FBT tokens": r["tokens"],
                    "FBT regime": r["regime"],
                    "FBT loss": interval_text(r["fbt_loss"]),
                    "baseline loss (same tokens)": interval_text(r["baseline_loss"]),
                    "token ratio": interval_text(r["token_ratio"]),
                    "bounds": ", ".join(r["censored"]) or "-",
                }
            )
        elif study.get("study") == "probes":
            rows.append(
                {
                    "member": key,
                    "target": r["target"],
                    **{f"{regime} accuracy": interval_text(v) for regime, v in r["accuracy"].items()},
                    **{f"{regime} selectivity": interval_text(v) for regime, v in r["selectivity"].items()},
                }
            )
        elif study.get("study") == "hd-ablations":
            rows.append(
                {
                    "member": key,
                    "accuracy (mean of tasks)": interval_text(r["accuracy"]),
                    **{f"{task} accuracy": interval_text(v["accuracy"]) for task, v in r["tasks"].items()},
                    **{f"{task} completion loss": interval_text(v["completion_loss"]) for task, v in r["tasks"].items()},
                    "loss jumps": ", ".join(f"{k}: {interval_text(v, 2)}" for k, v in r["expansion_jumps"].items()) or "-",
                    "time / hd1": interval_text(r["time_vs_hd1"], 2),
                    "step time / hd1": f"{r['step_time_vs_hd1']['ratio']:.2f}" if "step_time_vs_hd1" in r else "-",
                    "paired against": r["paired"]["reference"] if "paired" in r else "-",
                    "accuracy, minus it": interval_text(r["paired"]["accuracy"]) if "paired" in r else "-",
                    "completion loss, minus it": interval_text(r["paired"]["completion_loss"]) if "paired" in r else "-",
                }
            )
        else:
            rows.append(
                {
                    "member": key,
                    **{f"residual K={K}": interval_text(v, 2) for K, v in r["kpass_residual"].items() if K in ("2", "4", "8")},
                    **{f"lambda({T})": interval_text(v, 2) for T, v in r["lyapunov_tangent"].items()},
                    **{f"whole-step lambda({T})": interval_text(v, 2) for T, v in r.get("lyapunov_tangent_full", {}).items()},
                    "regrowth step": interval_text(r["regrowth_step"]),
                    "never regrew": f"{r['never_regrew']}/{len(r['runs'])}",
                    **{f"{regime} accuracy": interval_text(v) for regime, v in r["accuracy"].items()},
                }
            )
    return rows
