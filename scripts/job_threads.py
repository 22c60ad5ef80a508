#!/usr/bin/env python3
"""App jobs beside another job, with and without the app's thread budget: how long a probe, a
dynamics and an SAE job take on ``quick/fbt`` while another analysis job runs (docs/app.md).

    python scripts/job_threads.py [--zoo DIR] [--reps 2] [--out docs/results/job_threads.json]

Each measured job is started as the app starts it (``workbench.jobs.start_job``, the page's
arguments) while a background job (a long dynamics rollout of the same run) runs. ``before``: no
``--threads``, the app without its thread budget (torch's default, one thread per core, for each
job); ``after``: ``--threads`` from the budget the app divides among the running jobs
(``min(cores, 4) // (running + 1)``), the background job included. The two modes alternate within
each repetition, on the same machine in one sitting; the ratio is before / after of the median
seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

OUT = ROOT / "docs" / "results" / "job_threads.json"
LAYER0 = "blocks.0.hook_resid_pre"


def measured(run: Path, out: Path) -> dict[str, list[str]]:
    """The app's arguments of each measured job (the pages' defaults) writing under ``out``."""
    from workbench.probing.study import N_SEQUENCES, default_hooks
    from workbench.training.run import Run

    hooks = default_hooks(Run.open(run).config.model.n_layers)
    return {
        "probe": ["probe", str(run), "--n", str(N_SEQUENCES), "--hooks", *hooks, "--passes", "2,3"]
        + ["--mdl-hooks", LAYER0, "--ranks", "none", "--out", str(out / "probe")],
        "dynamics": ["dynamics", str(run), "--out", str(out / "dynamics")],
        "sae": ["sae", str(run), "--hook", "ln_final.hook_normalized", "--prefill", "recurrent", "--passes", "2"]
        + ["--out", str(out / "sae")],
    }


def wait(root: Path, job) -> float:
    """Seconds from the job's creation to its end; a failed job stops the measurement with its log."""
    from workbench.jobs import read_job

    while (job := read_job(job.path)).running:
        time.sleep(0.2)
    if job.state != "done":
        raise SystemExit(f"{job.title}: {job.state}\n{job.log_tail(2000)}")
    assert job.finished is not None
    return job.finished - job.created


def timed(root: Path, run: Path, kind: str, argv: list[str], threads: int | None, work: Path) -> float:
    """``argv`` as a job beside a background dynamics job, both with ``threads`` (None: torch's default)."""
    from workbench.jobs import cancel_job, read_job, start_job

    extra = [] if threads is None else ["--threads", str(threads)]
    background = start_job(
        root,
        ["dynamics", str(run), "--horizon", "20000", "--spectra", "1", "--fixed-points", "0", "--out", str(work / "bg"), *extra],
        title="background",
        page="bench",
    )
    time.sleep(5.0)  # past its start: loading the model, then the rollout, which runs until cancelled
    job = start_job(root, [*argv, *extra, "--no-progress"], title=kind, page="bench")
    seconds = wait(root, job)
    cancel_job(read_job(background.path))
    while read_job(background.path).running:
        time.sleep(0.2)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--zoo", type=Path, help="a trained quick zoo (default: train one in /tmp, about 2.5 min)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="job-threads-"))
    zoo = args.zoo or work / "quick"
    if args.zoo is None:
        subprocess.run(
            [sys.executable, "-m", "workbench.cli", "zoo", "--preset", "quick", "--out", str(zoo), "--no-progress"], check=True
        )
    run = zoo / "fbt"
    budget = min(os.cpu_count() or 1, 4)
    after = max(1, budget // 2)  # the app's share for a job that starts beside one other
    seconds: dict[str, dict[str, list[float]]] = {}
    for rep in range(args.reps):
        for kind in ("probe", "dynamics", "sae"):
            for mode, threads in (("before", None), ("after", after)):
                out = work / f"rep{rep}-{mode}"
                took = timed(work / "root", run, kind, measured(run, out)[kind], threads, out)
                seconds.setdefault(kind, {}).setdefault(mode, []).append(round(took, 1))
                print(f"{kind} {mode} (threads {threads or 'default'}): {took:.1f} s", flush=True)
    rows = {
        kind: {
            **modes,
            "median_before": statistics.median(modes["before"]),
            "median_after": statistics.median(modes["after"]),
            "ratio": round(statistics.median(modes["before"]) / statistics.median(modes["after"]), 2),
        }
        for kind, modes in seconds.items()
    }
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {
        "command": " ".join(["python scripts/job_threads.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": commit,
        "cores": os.cpu_count(),
        "load average at start": os.getloadavg()[0],
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "threads after": after,
        "background": "a dynamics job of the same run (20,000-step rollout), cancelled when the measured job ends",
        "seconds": rows,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
