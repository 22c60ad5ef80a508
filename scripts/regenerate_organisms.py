#!/usr/bin/env python3
"""Regenerate the model organisms' results with one command: the zoo at N seeds, every study on
every organism, the claims table and every results page.

    python scripts/regenerate_organisms.py                       # everything, 5 seeds (hours on 2 cores)
    python scripts/regenerate_organisms.py --organism perm --study fbt-vs-baseline --no-zoo
    python scripts/regenerate_organisms.py --no-zoo --study probes --expect d8b51918   # a later part

Each step is the ``workbench`` command a user would type, run in turn and timed:

1. ``workbench zoo --preset organisms --seeds N --out RUNS`` (unless ``--no-zoo``);
2. per organism and study, ``workbench zoo --study STUDY --preset org-TASK --seeds N --out
   RUNS/TASK/studies/STUDY`` (the study's default output under ``runs/organisms``; a finished
   member is not trained again; ``--reuse RUNS/TASK`` where the zoo is there, so a member the
   zoo already trained is copied, not retrained);
3. the JSON each wrote copied into ``docs/results`` (``zoo_organisms.json``, ``zoo_org_TASK.json``,
   ``study_STUDY_org_TASK.json``), the claims table read from the studies there written to
   ``claims.json``, and ``scripts/results_pages.py`` run.

A study runs on the organisms where it reads a claim (``workbench.experiments.claims``: traces on addition
only). What each step last did is kept in ``docs/results/organisms_regenerated.json`` by command
(commit, training fingerprint, wall-clock seconds, exit status, when it finished), across
partial runs (``--organism``, ``--study``; a step run again replaces its earlier record, whatever
its output folder), and beside the step's output (``OUT.step.json``:
``runs/organisms.step.json`` for the zoo, ``runs/organisms/TASK/studies/STUDY.step.json``), so
that ``--copy``, which runs nothing and copies what the runs hold now, also brings in the record
of runs made elsewhere (a worktree). A whole run also records its command and total time
(``last_full_run``). The whole thing is longer than a session, so it is made in parts at more
than one commit: the training fingerprint (``workbench.training.fingerprint``, computed once per
invocation, 10 s) says whether two parts were trained by the same code, and the claims table
records each study's (``made_under``). The fingerprint also depends on the CPU's instruction
set, so every step and the fingerprint run under ``PINNED_NUMERICS`` (PyTorch, MKL and oneDNN on
their AVX2 paths, MKL's results fixed), each step records the path that ran (``numerics``), and
``--expect`` makes a later part refuse to train under another fingerprint. A step that fails
stops the rest (its output is on the terminal); a study's or zoo's finished members are kept, so
running the command again continues.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import results_pages  # noqa: E402
from results_pages import CLAIMS_JSON, ORGANISM_STUDIES  # noqa: E402
from results_pages import organism_study_name as results_name  # noqa: E402

from workbench.experiments.claims import ALL, CLAIMS, claims_table  # noqa: E402
from workbench.storage.provenance import source_commit  # noqa: E402
from workbench.training.fingerprint import PINNED_NUMERICS  # noqa: E402

STUDIES = list(ORGANISM_STUDIES)
SERVES = {study: {o for c in CLAIMS if c.study == study for o in c.organisms} for study in STUDIES}  # where it reads a claim
SERVES["stability"] = set(ALL)  # a finding of its own on every organism, no claim of the papers
RECORD = "organisms_regenerated.json"
ZOO_JSON = "zoo_organisms.json"
ZOO_STEP = "zoo organisms"


def claims_json(results: Path) -> dict:
    """The claims table read from the studies' JSON files in ``results`` (``results_name``), and
    ``made_under``: the training fingerprint each of those files (and the zoo's) was made under,
    from the steps ``RECORD`` keeps (None where the step recorded none)."""

    def found(study: str, organism: str) -> dict | None:
        path = results / results_name(study, organism)
        return json.loads(path.read_text()) if path.is_file() else None

    record = json.loads((results / RECORD).read_text()) if (results / RECORD).is_file() else {}
    steps, prints = record.get("steps", {}), record.get("fingerprints", {})
    made: dict[str, tuple[str | None, dict]] = {}  # result -> (its organism, None for the zoo; its step)
    zoo = [step for command, step in steps.items() if step_name(command) == ZOO_STEP]
    if (results / ZOO_JSON).is_file():
        made[ZOO_JSON] = (None, zoo[-1] if zoo else {})
    for study, organism in [(s, o) for s in STUDIES for o in ALL]:
        if (results / results_name(study, organism)).is_file():
            command = json.loads((results / results_name(study, organism)).read_text()).get("command")
            made[results_name(study, organism)] = (organism, steps.get(f"{command} --no-progress", {}))

    def trained_under(organism: str | None, step: dict) -> str | None:
        whole = step.get("training_fingerprint")
        if organism is None:
            return whole
        return step.get("organism_fingerprints", {}).get(organism) or prints.get(whole, {}).get(organism) or whole

    return {
        "written_by": "python scripts/regenerate_organisms.py",
        "commit": source_commit(),
        "rows": claims_table(found),
        # the training fingerprint each result was made under: its organism's own (``organisms`` of
        # the fingerprint), the whole one for the zoo and where a step recorded no other
        "made_under": {name: trained_under(organism, step) for name, (organism, step) in made.items()},
        # the wall-clock seconds of the step that made each result (None: not recorded)
        "took": {name: step.get("wall_seconds") for name, (_, step) in made.items()},
    }


def refusal(expect: str, fingerprint: dict, known: dict[str, dict], organisms: list[str]) -> str | None:
    """Why ``--expect EXPECT`` refuses to train ``organisms`` under ``fingerprint`` (this code's),
    or None. ``EXPECT`` names a whole fingerprint (its first characters); where the record knows
    that fingerprint's organisms' own (``known``), each organism to train must keep its own, so a
    change to one organism's training leaves the parts made for the others standing; otherwise the
    whole must match."""
    if fingerprint["sha256"].startswith(expect):
        return None
    expected = next((known[whole] for whole in known if whole.startswith(expect)), None)
    if expected is None:
        return (
            f"--expect {expect}: this code on this machine trains under fingerprint {fingerprint['sha256']} "
            f"({fingerprint['numerics']}); nothing was run"
        )
    changed = [o for o in organisms if fingerprint.get("organisms", {}).get(o) != expected.get(o)]
    if not changed:
        return None
    return (
        f"--expect {expect}: this code on this machine trains {', '.join(changed)} under another fingerprint than "
        f"the parts made under {expect} ({fingerprint['sha256']}, {fingerprint['numerics']}); nothing was run"
    )


def step_name(command: str) -> str:
    """What a step makes, whatever its output folder or seeds: ``fbt-vs-baseline org-perm``, or
    ``ZOO_STEP``; a step run again replaces its record under another command."""
    words = command.split()
    flag = {k: v for k, v in zip(words, words[1:]) if k.startswith("--")}
    return f"{flag.get('--study', 'zoo')} {flag.get('--preset', '')}"


def record_step(steps: dict, command: str, step: dict) -> None:
    """Keep ``step`` as what ``command`` last did, and drop the record of an earlier run of the
    same step under another command, so the record holds what the results are made of."""
    for stale in [c for c in steps if step_name(c) == step_name(command)]:
        del steps[stale]
    steps[command] = step


def measured(study: Path) -> bool:
    """Whether ``study`` (a ``study.json``) is a finished study: a running one writes its members'
    rows as they finish and its readings last."""
    return study.is_file() and "readings" in json.loads(study.read_text())


def step_file(out: Path) -> Path:
    """Where a step's record is kept beside its output ``out``."""
    return out.with_name(out.name + ".step.json")


def pinned_fingerprint(tasks: tuple[str, ...] = ()) -> dict:
    """The training fingerprint under ``PINNED_NUMERICS``, computed in a new process (the variables
    only act before torch is imported); ``tasks`` (default all organisms) is for tests."""
    command = [sys.executable, "-m", "workbench.training.fingerprint", *[a for t in tasks for a in ("--task", t)]]
    done = subprocess.run(command, env=os.environ | PINNED_NUMERICS, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"the training fingerprint failed (exit {done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)


def workbench() -> str:
    """The ``workbench`` command of this interpreter's environment."""
    path = Path(sys.executable).with_name("workbench")
    if not path.is_file():
        raise SystemExit(f"{path}: no workbench command beside {sys.executable}; install the project (pip install -e .)")
    return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--seeds", type=int, default=5, help="training seeds 0..N-1 (default 5; the fair study chooses its own by a power step)"
    )
    parser.add_argument(
        "--runs", type=Path, default=Path("runs") / "organisms", help="the organisms' runs (default runs/organisms)"
    )
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results", help="where the JSON and pages go")
    parser.add_argument("--organism", action="append", choices=ALL, help="only these organisms (repeatable; default all)")
    parser.add_argument("--study", action="append", choices=STUDIES, help="only these studies (repeatable; default all)")
    parser.add_argument("--no-zoo", action="store_true", help="keep the zoo's JSON as it is (do not train or copy the zoo)")
    parser.add_argument(
        "--copy", action="store_true", help="run nothing: copy the JSON the zoo and studies hold now, then the claims and pages"
    )
    parser.add_argument(
        "--expect",
        default=None,
        help="a training fingerprint (or its first characters) the parts made so far were trained under: "
        "refuse to train anything where this code and machine give another",
    )
    args = parser.parse_args(argv)
    organisms, studies = args.organism or list(ALL), args.study or STUDIES
    started = time.perf_counter()
    path = args.results / RECORD
    if args.results.is_dir() and any(args.results.iterdir()) and not path.is_file():
        parser.error(f"--results {args.results} holds files and no {RECORD}: it is not a results directory this wrote")
    record = json.loads(path.read_text()) if path.is_file() else {"written_by": "python scripts/regenerate_organisms.py"}
    steps = record.setdefault("steps", {})  # by command: what each step last did, kept across partial runs
    fingerprint = None

    def run(command: list[str], out: Path, trains: list[str]) -> str:
        """Run (or with ``--copy``, find the record of) ``workbench COMMAND``, which trains the
        organisms ``trains``; the command as it ran."""
        nonlocal fingerprint
        print(("copying what this wrote: " if args.copy else "$ ") + " ".join(["workbench", *command]), flush=True)
        key, code = " ".join(["workbench", *command]), 0
        if args.copy:
            if step_file(out).is_file():  # the record of a step run elsewhere (as it ran there) comes with its output
                saved = json.loads(step_file(out).read_text())
                key = saved["command"]
                record_step(steps, key, saved["step"])
                write(path, record)
        else:
            if fingerprint is None:
                fingerprint = pinned_fingerprint()
                print(f"training fingerprint of this code: {fingerprint['sha256']} ({fingerprint['numerics']})", flush=True)
                known = record.setdefault("fingerprints", {})  # each whole fingerprint seen -> its organisms' own
                why = args.expect and refusal(args.expect, fingerprint, known, sorted(set(trains) | set(organisms)))
                if why:
                    raise SystemExit(why)
                if "organisms" in fingerprint:
                    known[fingerprint["sha256"]] = fingerprint["organisms"]
            t = time.perf_counter()
            code = subprocess.call([workbench(), *command], env=os.environ | PINNED_NUMERICS)
            record_step(
                steps,
                key,
                {
                    "commit": source_commit(),
                    "training_fingerprint": fingerprint["sha256"],
                    "organism_fingerprints": {o: fingerprint.get("organisms", {}).get(o) for o in trains},
                    "numerics": fingerprint["numerics"],
                    "wall_seconds": round(time.perf_counter() - t, 1),
                    "rc": code,
                    "finished": datetime.now(UTC).isoformat(timespec="seconds"),
                },
            )
            write(path, record)
            write(step_file(out), {"written_by": "python scripts/regenerate_organisms.py", "command": key, "step": steps[key]})
        if code != 0:
            raise SystemExit(f"`workbench {' '.join(command)}` exited {code}: the steps after it were not run")
        return key

    if not args.no_zoo and not (args.copy and not (args.runs / "organisms.json").is_file()):
        zoo = ["zoo", "--preset", "organisms", "--seeds", str(args.seeds), "--out", str(args.runs), "--no-progress"]
        run(zoo, args.runs, list(ALL))
        shutil.copyfile(args.runs / "organisms.json", args.results / ZOO_JSON)
        for organism in ALL:
            shutil.copyfile(args.runs / organism / "zoo.json", args.results / f"zoo_org_{organism}.json")
    for organism in organisms:
        for study in studies:
            if organism not in SERVES[study]:
                continue
            out = args.runs / organism / "studies" / study
            seeds = "power" if study == "fbt-vs-baseline" else str(args.seeds)  # the fair study sizes its own
            command = ["zoo", "--study", study, "--preset", f"org-{organism}", "--seeds", seeds, "--out", str(out)]
            if study != "fbt-vs-baseline" and (args.runs / organism / "zoo.json").is_file():
                command += ["--reuse", str(args.runs / organism)]  # the zoo's members the study shares are copied
            if args.copy and not measured(out / "study.json"):
                print(f"{out / 'study.json'}: not there or not finished (no readings yet), not copied", flush=True)
                continue
            ran = run([*command, "--no-progress"], out, [organism]).removesuffix(" --no-progress")
            copied = json.loads((out / "study.json").read_text())
            write(args.results / results_name(study, organism), {"command": ran, **copied})
    write(args.results / CLAIMS_JSON, claims_json(args.results))
    if not args.no_zoo and args.organism is None and args.study is None and not args.copy:  # the whole thing, in one go
        record["last_full_run"] = {
            "command": " ".join(["python scripts/regenerate_organisms.py", *(argv if argv is not None else sys.argv[1:])]),
            "commit": source_commit(),
            "training_fingerprint": fingerprint["sha256"] if fingerprint else None,
            "seeds": args.seeds,
            "wall_seconds": round(time.perf_counter() - started, 1),
        }
        write(path, record)
    return results_pages.main(["--results", str(args.results)])


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # a step that failed may not have made its output
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
