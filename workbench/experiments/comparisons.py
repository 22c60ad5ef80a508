"""The comparison studies' runner (``workbench zoo --study NAME``): each study, a plugin in
``workbench.experiments.studies`` (its members, its measurement, its declared family, its readings
table), trained here at several training seeds, every reading a mean with a 95% interval across
seeds (``workbench.training.intervals``), and its family Holm-corrected (``stats.family``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from workbench.experiments.studies import ROWS, STUDIES
from workbench.experiments.studies.common import interval_text, torch_threads
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import LOCK, STAGING, output
from workbench.training import stats
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

__all__ = [
    "ensure_study",
    "family_rows",
    "interval_text",
    "reading_rows",
    "run_study",
    "study_family",
    "study_members",
    "torch_threads",
    "zoo_counterparts",
]


def study_members(study: str, scale: str, seed: int) -> list[tuple[str, str, list[str], str | None]]:
    """``(name, arch, overrides, source)`` of every member of ``study`` at training seed ``seed``;
    ``source`` names the member (of the same seed) it continues from, or is None."""
    if study not in STUDIES:
        raise BadInput(f"unknown study {study!r}: expected one of {tuple(STUDIES)}")
    if scale not in SCALES:
        raise BadInput(f"unknown zoo preset {scale!r}: expected one of {sorted(SCALES)}")
    seeded = [f"train.seed={seed}"] if seed else []
    return [
        (seed_name(name, seed), arch, seeded + overrides, source and seed_name(source, seed))
        for name, arch, overrides, source in STUDIES[study].members(scale)
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
    (default: the scale's, as the zoo), measure them (the study's ``measure``), and write
    ``study.json`` there: the zoo's per-member rows (``models``, ``across_seeds``) and the
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
                    shutil.copytree(
                        source, out / name, ignore=shutil.ignore_patterns(LOCK, f"{STAGING}*", ".*.tmp"), symlinks=True
                    )
    summary = train_plan(plan, out, out / "study.json", summary, scale=scale, threads=threads, jobs=jobs, progress=progress)
    with output(out, ZOO) as held:
        for name, source in copies.items():  # its training time is the zoo run's, from the copied metrics log
            summary["models"][name]["reused_from"] = str(source)
        summary["readings"] = STUDIES[study].measure(summary["models"], out, scale, threads, jobs)
        summary["family"] = study_family(summary)
        seeds_needed = getattr(STUDIES[study], "seeds_needed", None)
        if seeds_needed is not None and summary["seeds"] > 1:  # this run as the pilot of the next
            summary["power"] = seeds_needed(summary["readings"])
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


def study_family(study: dict) -> dict[str, dict]:
    """A study's declared family of paired comparisons (its plugin's ``family`` of its readings),
    each across its seeds (``stats.paired_difference`` on the per-seed values, in seed order) and
    Holm-corrected together (``stats.family``); none for a study that is not one of ``STUDIES``."""
    plugin = STUDIES.get(study.get("study", ""))
    cells = plugin.family(study.get("readings", {})) if plugin is not None else {}
    return stats.family(cells) if cells else {}


# ---- tables ------------------------------------------------------------------------------


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
    """A study's ``readings`` as table rows of text cells (mean [95% interval] across seeds): its
    plugin's ``rows``; ``BadInput`` for a study the workbench does not have."""
    name = study.get("study")
    if name not in ROWS:
        raise BadInput(f"unknown study {name!r}: expected one of {tuple(ROWS)}")
    return ROWS[name](study)
