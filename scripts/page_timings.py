"""Seconds the app's pages take at their default settings, through Streamlit's AppTest: the first
render of each page, and for the Probes and Feedback dynamics pages the time until the default
analysis is drawn (pressing its button where there is one, and waiting for its background job
where it runs as one).

    python scripts/page_timings.py --runs runs/cpu --out timings.json [--app OTHER_CHECKOUT]

``--app`` times another checkout's app (its ``app/`` and ``workbench/`` come first on the path),
so an earlier commit and this one can be timed on copies of the same runs, one after the other.
The runs are copied first: the pages write their results into the copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
from pathlib import Path
from streamlit.testing.v1 import AppTest

app, runs = sys.argv[1], Path(sys.argv[2])
os.environ["WORKBENCH_RUNS"] = str(runs)


def jobs_done():
    try:
        from workbench.jobs import list_jobs
    except ImportError:  # an app without background jobs
        return
    while any(j.running for j in list_jobs(runs)):
        time.sleep(0.5)


timings = {}
at = AppTest.from_file(str(Path(app) / "app" / "main.py"), default_timeout=3600)
started = time.perf_counter()
at.run()
timings["runs: first render"] = time.perf_counter() - started
for page, button, drawn in [("probes", "probe_train", "metric"), ("dynamics", "dyn_run", "subheader")]:
    started = time.perf_counter()
    at.switch_page(f"views/{page}.py").run()
    timings[f"{page}: first render"] = time.perf_counter() - started
    if not getattr(at, drawn):
        if [b for b in at.button if b.key == button]:
            if page == "dynamics":  # one run, as the earlier page analysed by default on this zoo
                at.multiselect(key="dyn_runs").set_value(["fbt"]).run()
            at.button(key=button).click().run()
            jobs_done()
            at.run()
    timings[f"{page}: default analysis drawn"] = time.perf_counter() - started
    assert getattr(at, drawn), (page, [e.value for e in at.error], [e.value for e in at.exception])
print(json.dumps(timings))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--app", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = shutil.copytree(args.runs, Path(tmp) / "runs", ignore=shutil.ignore_patterns(".workbench.lock"))
        env = {**os.environ, "PYTHONPATH": str(args.app.resolve())}
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(args.app.resolve()), str(runs)], env=env, check=True, capture_output=True, text=True
        )
    timings = json.loads(out.stdout.strip().splitlines()[-1])
    commit = subprocess.run(["git", "-C", str(args.app), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    result = {"app": str(args.app), "commit": commit.stdout.strip(), "runs": str(args.runs), "seconds": timings}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
