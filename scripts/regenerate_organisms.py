#!/usr/bin/env python3
"""Regenerate the model organisms' results with one command: the zoo at N seeds, every study on
every organism, the claims table and every results page (issue #37).

    python scripts/regenerate_organisms.py                       # everything, 5 seeds (hours on 2 cores)
    python scripts/regenerate_organisms.py --organism perm --study fbt-vs-baseline --no-zoo

Each step is the ``workbench`` command a user would type, run in turn and timed:

1. ``workbench zoo --preset organisms --seeds N --out RUNS`` (unless ``--no-zoo``);
2. per organism and study, ``workbench zoo --study STUDY --preset org-TASK --seeds N --out
   RUNS/TASK/studies/STUDY`` (the study's default output under ``runs/organisms``; a finished
   member is not trained again; ``--reuse RUNS/TASK`` where the zoo is there, so a member the
   zoo already trained is copied, not retrained);
3. the JSON each wrote copied into ``docs/results`` (``zoo_organisms.json``, ``zoo_org_TASK.json``,
   ``study_STUDY_org_TASK.json``), the claims table read from the studies there written to
   ``claims.json``, and ``scripts/results_pages.py`` run.

What it did is recorded in ``docs/results/organisms_regenerated.json``: this command, the commit,
the seeds, each step's command, wall-clock seconds and exit status, and the whole time. A step
that fails stops the rest (its output is on the terminal); a study's or zoo's finished members
are kept, so running the command again continues.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import results_pages  # noqa: E402
from results_pages import CLAIMS_JSON, ORGANISM_STUDIES  # noqa: E402
from results_pages import organism_study_name as results_name  # noqa: E402

from workbench.claims import ALL, claims_table  # noqa: E402
from workbench.storage.provenance import source_commit  # noqa: E402

STUDIES = list(ORGANISM_STUDIES)
RECORD = "organisms_regenerated.json"


def claims_json(results: Path) -> dict:
    """The claims table read from the studies' JSON files in ``results`` (``results_name``)."""

    def found(study: str, organism: str) -> dict | None:
        path = results / results_name(study, organism)
        return json.loads(path.read_text()) if path.is_file() else None

    return {"written_by": "python scripts/regenerate_organisms.py", "commit": source_commit(), "rows": claims_table(found)}


def workbench() -> str:
    """The ``workbench`` command of this interpreter's environment."""
    path = Path(sys.executable).with_name("workbench")
    if not path.is_file():
        raise SystemExit(f"{path}: no workbench command beside {sys.executable}; install the project (pip install -e .)")
    return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seeds", type=int, default=5, help="training seeds 0..N-1 (default 5)")
    parser.add_argument(
        "--runs", type=Path, default=Path("runs") / "organisms", help="the organisms' runs (default runs/organisms)"
    )
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results", help="where the JSON and pages go")
    parser.add_argument("--organism", action="append", choices=ALL, help="only these organisms (repeatable; default all)")
    parser.add_argument("--study", action="append", choices=STUDIES, help="only these studies (repeatable; default all)")
    parser.add_argument("--no-zoo", action="store_true", help="keep the zoo's JSON as it is (do not train or copy the zoo)")
    args = parser.parse_args(argv)
    organisms, studies = args.organism or list(ALL), args.study or STUDIES
    if args.runs.resolve() != (Path("runs") / "organisms").resolve() and studies:
        parser.error(
            f"--runs {args.runs}: the studies write to runs/organisms/TASK/studies (their default); run from the checkout"
        )
    steps: list[dict] = []
    started = time.perf_counter()
    record = {
        "command": " ".join(["python scripts/regenerate_organisms.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": source_commit(),
        "seeds": args.seeds,
        "steps": steps,
    }

    def run(command: list[str]) -> None:
        print("$", " ".join(command), flush=True)
        t = time.perf_counter()
        code = subprocess.call([workbench(), *command])
        steps.append(
            {"command": " ".join(["workbench", *command]), "wall_seconds": round(time.perf_counter() - t, 1), "rc": code}
        )
        if code != 0:
            write(args.results / RECORD, record | {"wall_seconds": round(time.perf_counter() - started, 1)})
            raise SystemExit(f"`workbench {' '.join(command)}` exited {code}: the steps after it were not run")

    if not args.no_zoo:
        run(["zoo", "--preset", "organisms", "--seeds", str(args.seeds), "--out", str(args.runs), "--no-progress"])
        shutil.copyfile(args.runs / "organisms.json", args.results / "zoo_organisms.json")
        for organism in ALL:
            shutil.copyfile(args.runs / organism / "zoo.json", args.results / f"zoo_org_{organism}.json")
    for organism in organisms:
        for study in studies:
            out = args.runs / organism / "studies" / study
            command = ["zoo", "--study", study, "--preset", f"org-{organism}", "--seeds", str(args.seeds), "--out", str(out)]
            if study != "fbt-vs-baseline" and (args.runs / organism / "zoo.json").is_file():
                command += ["--reuse", str(args.runs / organism)]  # the zoo's members the study shares are copied
            run([*command, "--no-progress"])
            copied = json.loads((out / "study.json").read_text())
            write(args.results / results_name(study, organism), {"command": " ".join(["workbench", *command]), **copied})
    write(args.results / CLAIMS_JSON, claims_json(args.results))
    record["wall_seconds"] = round(time.perf_counter() - started, 1)
    write(args.results / RECORD, record)
    return results_pages.main(["--results", str(args.results)])


def write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
