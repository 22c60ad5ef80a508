"""The layer-0 probes, the feedback dynamics and the trace lengths of every seed of a zoo, with
each headline reading's mean and 95% interval across the seeds (the tables in docs/probes.md,
docs/dynamics.md and docs/traces.md).

    python scripts/zoo_analyses.py runs/cpu --seeds 3 --out docs/results/zoo_analyses.json

Runs the CLI verbs (``probe``, ``dynamics``, ``traces``) on each seed's members, ``--jobs`` at a
time with one torch thread each, writing into each run's ``results/`` (probes) and
``ZOO/analyses/`` (dynamics, traces); a verb whose output is already there is not rerun. Then
reads the reports (``workbench.experiments.seed_readings.zoo_readings``, which the app's Zoo page also shows)
and writes the readings across seeds with the commands, settings and commit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from workbench.experiments.seed_readings import PROBES, analysis_reports, zoo_readings
from workbench.storage.files import read_json, write_json
from workbench.storage.provenance import source_commit
from workbench.training.zoo import seed_name

PROBE = ["--passes", "2,3"]
DYNAMICS = ["--horizon", "1040", "--spectra", "2", "--fixed-points", "1", "--starts", "8"]
TRACES = ["--n", "400", "--difficulty", "1..4", "--passes", "2"]
TRACE_MEMBERS = ["baseline", "fbt", "hd2", "hd4"]


def commands(zoo: Path, seed: int) -> list[tuple[list[str], Path]]:
    """``(argv, output)`` of every analysis of seed ``seed``."""
    run = lambda name: str(zoo / seed_name(name, seed))  # noqa: E731
    reports = analysis_reports(zoo, seed)
    cmds = [(["probe", run(m), "--target", t, *PROBE], reports[f"probe/{m}/{t}"]) for m, t in PROBES]
    dynamics, traces = reports["dynamics/fbt"], reports["traces"]
    cmds.append((["dynamics", run("fbt"), "--out", str(dynamics.parent), *DYNAMICS], dynamics))
    cmds.append((["traces", *(run(m) for m in TRACE_MEMBERS), "--out", str(traces.parent), *TRACES], traces))
    return cmds


def run_verbs(work: list[tuple[list[str], Path]], log: Path) -> tuple[float, int]:
    """Run each verb in turn (one run's probes hold its results/ in turn), skipping those whose
    output is there; returns the seconds taken and how many verbs ran."""
    started, ran = time.perf_counter(), 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for argv, output in work:
        if output.is_file():
            continue
        quiet = ["--no-progress"] if argv[0] in ("probe", "dynamics", "traces") else []
        with log.open("a") as f:
            f.write(f"$ workbench {' '.join(argv)}\n")
            f.flush()
            subprocess.run([sys.executable, "-m", "workbench.cli", *argv, *quiet], stdout=f, stderr=f, env=env, check=True)
        ran += 1
    return time.perf_counter() - started, ran


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("zoo", type=Path)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    (args.zoo / "analyses").mkdir(exist_ok=True)
    log = args.zoo / "analyses" / "log.txt"
    groups: dict[str, list] = {}  # verbs that write one run's results/, in turn
    for seed in range(args.seeds):
        for argv, output in commands(args.zoo, seed):
            groups.setdefault(str(output.parent if argv[0] == "probe" else output), []).append((argv, output))
    work = sorted(groups.values(), key=lambda g: g[0][0][0] != "dynamics")  # the longest first
    started = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        seconds, ran = zip(*pool.map(lambda g: run_verbs(g, log), work))
    timing = {
        "commit": source_commit(),
        "seconds": round(time.perf_counter() - started, 1),
        "verb_seconds": round(sum(seconds), 1),
    }
    if not any(ran) and args.out.is_file():  # only the readings were taken again: the verbs' commit and time stay
        timing = {key: read_json(args.out)[key] for key in timing} | {"readings_commit": source_commit()}
    write_json(
        args.out,
        {
            "zoo": str(args.zoo),
            "seeds": args.seeds,
            "commands": [["workbench", *argv] for argv, _ in commands(args.zoo, 0)],
            **timing,
            "readings": zoo_readings(args.zoo, args.seeds),
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
