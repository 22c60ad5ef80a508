#!/usr/bin/env python3
"""The README's first hour, walked through the app itself and timed: what a new researcher does
after the main job's command, each step the button the README names.

    python scripts/first_hour.py [--runs EMPTY_DIR] [--out docs/results/first_hour.json]

From an empty runs directory, through Streamlit's AppTest (the pages' own code, the same
background jobs a browser starts):

1. the Runs page: choose the ``quick`` zoo and press **Train**; wait for the job;
2. the Zoo and studies page: each member's held-out accuracy per regime, read from its table;
3. the Probes page on ``quick/fbt``: press **Train probes** at the page's defaults; wait;
4. the Feedback dynamics page on ``quick/fbt``: press **Analyse** at the defaults; wait;
5. Trace lengths, Streams (HD) and the Playground: each page drawn without an error.

The seconds of each step, what each showed, the commit, whether the tree was clean, the CPU
model and the machine's load when it started are written to ``--out``; the README's first hour
quotes it and a test holds the two together. The walk runs on PyTorch's, MKL's and oneDNN's AVX2
paths with MKL's results pinned (``PINNED_NUMERICS``, inherited by every job), so one CPU model
repeats its numbers (another may not: an Intel Xeon's layer-0 probe differs at K = 2 and exact),
and ``tests/integration/test_first_hour.py`` recomputes the probe from the recorded job arguments
and must find the same numbers, or those recorded for its CPU model. The runs directory is kept
(the screenshots are taken on it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

OUT = ROOT / "docs" / "results" / "first_hour.json"


def wait_for_jobs(runs: Path) -> None:
    """Until every background job is over; a job that failed stops the walk with its log."""
    from workbench.jobs import list_jobs

    while any(j.running for j in list_jobs(runs)):
        time.sleep(0.5)
    failed = [(j.title, j.state, j.log_tail(2000)) for j in list_jobs(runs) if j.state not in ("done", "cancelled")]
    if failed:
        raise SystemExit(f"a job of the first hour failed: {failed}")


def walk(runs: Path, zoo: str = "quick") -> dict:
    from streamlit.testing.v1 import AppTest

    from workbench.jobs import list_jobs

    os.environ["WORKBENCH_RUNS"] = str(runs)
    seconds, shown = {}, {}

    def clean(at: AppTest, where: str) -> AppTest:
        problems = [e.value for e in at.exception] + [e.value for e in at.error]
        if problems:
            raise SystemExit(f"{where}: the page shows {problems}")
        return at

    at = clean(AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=3600).run(), "runs")
    at.radio(key="zoo_scale").set_value(zoo).run()
    started = time.perf_counter()
    at.button(key="train_zoo").click().run()
    wait_for_jobs(runs)
    clean(at.run(), "runs after training")
    seconds[f"train the {zoo} zoo"] = time.perf_counter() - started

    clean(at.switch_page("views/zoo.py").run(), "zoo")
    table = next(d.value for d in at.dataframe if "accuracy" in d.value.columns and "member" in d.value.columns)
    shown["held-out accuracy"] = {f"{r['member']}/{r['regime']}": float(r["accuracy"]) for r in table.to_dict("records")}
    shown["task"] = sorted(set(table["task"]))

    started = time.perf_counter()
    clean(at.switch_page("views/probes.py").run(), "probes")
    at.selectbox(key="probe_run").set_value(f"{zoo}/fbt").run()
    at.button(key="probe_train").click().run()
    wait_for_jobs(runs)
    clean(at.run(), "probes after training")
    seconds["train probes (defaults)"] = time.perf_counter() - started
    [target] = [p.stem.removeprefix("probe_") for p in (runs / zoo / "fbt" / "results").glob("probe_*.json")]
    report = json.loads((runs / zoo / "fbt" / "results" / f"probe_{target}.json").read_text())
    layer0 = [r for r in report["rows"] if r["hook"] == "blocks.0.hook_resid_pre"]
    shown["layer-0 probe"] = {"target": target} | {
        "standard" if r["prefill"] == "standard" else f"recurrent K={r['passes']}": r["accuracy"] for r in layer0
    }
    shown["layer-0 probe converged"] = all(r["converged"] for r in layer0)
    # the job's arguments with the runs directory as RUNS: what the test replays
    [job] = [j for j in list_jobs(runs) if j.argv[0] == "probe"]
    shown["probe job"] = [a.replace(str(runs), "RUNS") for a in job.argv[: job.argv.index("--json")]]

    started = time.perf_counter()
    clean(at.switch_page("views/dynamics.py").run(), "dynamics")
    at.multiselect(key="dyn_runs").set_value([f"{zoo}/fbt"]).run()
    at.button(key="dyn_run").click().run()
    wait_for_jobs(runs)
    clean(at.run(), "dynamics after the analysis")
    seconds["analyse the feedback dynamics (defaults)"] = time.perf_counter() - started
    [dyn] = (runs / zoo / "fbt" / "results").glob("dynamics-*/dynamics.json")
    analysis = json.loads(dyn.read_text())["runs"][f"{zoo}/fbt"]
    shown["dynamics input"] = analysis["input"] | {"prompt": analysis["prompt"]}
    shown["lyapunov"] = analysis["lyapunov"]
    shown["lyapunov tangent"] = {T: v[0] for T, v in analysis["lyapunov_tangent"].items()}

    for page in ("traces", "streams", "playground"):
        started = time.perf_counter()
        clean(at.switch_page(f"views/{page}.py").run(), page)
        seconds[f"{page}: first render"] = time.perf_counter() - started
    return {"seconds": seconds, "shown": shown}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--runs", type=Path, help="an empty (or new) runs directory, kept (default: a new one in /tmp)")
    parser.add_argument("--zoo", default="quick", help="the zoo trained on the Runs page (micro: a minute's check of the walk)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the record goes (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    from workbench.runtime.process import PINNED_NUMERICS  # torch-free: the environment is set before torch loads

    os.environ.update(PINNED_NUMERICS)
    from workbench.training.fingerprint import cpu_model  # imports torch: after the numerics are pinned

    runs = args.runs or Path(tempfile.mkdtemp(prefix="first-hour-")) / "runs"
    if runs.exists() and any(runs.iterdir()):
        raise SystemExit(f"{runs}: not empty; the first hour starts from an empty runs directory")
    runs.mkdir(parents=True, exist_ok=True)
    record = {
        "command": "python scripts/first_hour.py",
        "commit": git("rev-parse", "HEAD"),
        "clean tree": git("status", "--porcelain", "--untracked-files=no") == "",
        "cores": os.cpu_count(),
        "cpu": cpu_model(),  # the probe's numbers are this CPU model's
        "load average at start": os.getloadavg()[0],
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": str(runs),
        "zoo": args.zoo,
        "numerics": PINNED_NUMERICS,
    }
    record |= walk(runs, args.zoo)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
