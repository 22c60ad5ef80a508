"""``traces`` (the FBT paper: shorter traces at equal accuracy): ``baseline`` and ``fbt`` at the
zoo's settings; per seed a trace study on the same held-out problems of the scale's traced task (an
organism's addition, whose scratchpads mix verbosities; on a zoo of the mix, chain), FBT in each
regime against the baseline: trace tokens and accuracy per problem, seeds and problems crossed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.experiments.studies.common import FBT_REGIMES, Member, crossed_text, torch_threads
from workbench.storage.errors import BadInput
from workbench.training import stats
from workbench.training.zoo import SCALES

TRACE_PROBLEMS = 200  # held-out problems per seed, the same at every seed
TRACE_TOKENS = 96  # new tokens at most (3-digit addition's longest trace is about 50)


def members(scale: str) -> list[Member]:
    trace_task(scale)  # a scale whose task has no traces is refused before anything is trained
    steps = SCALES[scale]["steps"]
    return [(arch, arch, [f"train.steps={steps}"], None) for arch in ("baseline", "fbt")]


def measure(models: dict, out: Path, scale: str, threads: int, jobs: int) -> dict:
    return trace_lengths(models, out, trace_task(scale), threads * jobs)


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
                "accuracy": stats.accuracy_interval(np.array(m["correct"])),
            }
            for pair, m in per_problem.items()
        },
    }


def family(readings: dict) -> dict[str, dict]:
    """FBT in each regime minus the baseline in trace tokens and accuracy, seeds and problems
    crossed (``stats.paired_difference`` on the seeds x problems matrices)."""
    cells: dict[str, dict] = {}
    matrices = readings.get("per_problem", {})
    if "baseline/standard" not in matrices:
        return cells
    base = matrices["baseline/standard"]
    for regime in FBT_REGIMES:
        fbt = matrices.get(f"fbt/{regime}")
        if fbt is not None and len(fbt["correct"]) >= 2:
            cells[f"fbt {regime} - baseline: trace tokens"] = stats.paired_difference(base["trace_tokens"], fbt["trace_tokens"])
            cells[f"fbt {regime} - baseline: accuracy"] = stats.paired_difference(
                base["correct"], fbt["correct"], bounds=(-1.0, 1.0)
            )
    return cells


def rows(study: dict) -> list[dict]:
    """Seeds x problems crossed: per member and regime its trace tokens and accuracy."""
    return [
        {"member/regime": pair, "trace tokens": crossed_text(g["trace_tokens"]), "accuracy": crossed_text(g["accuracy"])}
        for pair, g in study.get("readings", {}).get("groups", {}).items()
    ]
