"""The reference model set: ``baseline``, ``fbt``, ``fbt-no3pass`` (no 3-pass batches, for the
stability study), ``hd2`` and ``hd4`` (continued from ``baseline``), all on the ``mix`` task with
the same data order, so FBT and the baseline see equal data.

``micro`` finishes in well under 2 minutes on 2 CPU cores (tests, CI); ``cpu`` in under 25 and
gives models good enough for the studies to show something.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from workbench.evaluate import evaluate_run
from workbench.runconfig import make_run_config
from workbench.train import train

SCALES = {
    "micro": {
        "preset": "debug",
        "steps": 60,
        "hd_steps": 20,
        "common": ["model.n_ctx=256", "train.batch_size=8", "train.seq_len=64", "train.lr=3e-3", "train.warmup=5",
                   "train.log_every=10", "train.checkpoint_every=1000", "train.eval_examples=12", "data.n_train=600"],
    },
    "cpu": {
        "preset": "tiny",
        "steps": 900,
        "hd_steps": 200,
        "common": ["train.batch_size=32", "train.seq_len=128", "train.lr=2e-3", "train.warmup=50",
                   "train.log_every=25", "train.checkpoint_every=300", "train.eval_examples=96", "data.n_train=40000"],
    },
}


def members(scale: str, out: Path) -> list[tuple[str, str, list[str], str | None]]:
    if scale not in SCALES:
        raise ValueError(f"unknown zoo preset {scale!r}: expected one of {sorted(SCALES)}")
    s = SCALES[scale]
    steps, hd_steps = [f"train.steps={s['steps']}"], [f"train.steps={s['hd_steps']}"]
    base = str(out / "baseline")
    return [
        ("baseline", "baseline", steps, None),
        ("fbt", "fbt", steps, None),
        ("fbt-no3pass", "fbt", steps + ["fbt.three_pass_fraction=0"], None),
        ("hd2", "hd", hd_steps + ["hd.streams=2", "hd.expand_at=0"], base),
        ("hd4", "hd", hd_steps + ["hd.streams=2,4", f"hd.expand_at=0,{s['hd_steps'] // 2}"], base),
    ]


def member_names(scale: str = "micro") -> list[str]:
    return [name for name, *_ in members(scale, Path("."))]


def train_zoo(scale: str = "micro", out: str | Path = "runs", *, progress: bool | Callable = True,
              only: list[str] | None = None) -> dict:
    """Train (or resume) and evaluate the zoo; returns and writes ``zoo.json`` under ``out``.
    ``progress``: True for tqdm bars, or ``progress(name, step, total, record)`` after every step."""
    unknown = sorted(set(only or []) - set(member_names(scale)))
    if unknown:
        raise ValueError(f"unknown zoo member(s) {unknown}: expected some of {member_names(scale)}")
    out = Path(out)
    summary = {"scale": scale, "models": {}}
    if (out / "zoo.json").is_file():  # a partial re-run (``only``) keeps the other members' entries
        previous = json.loads((out / "zoo.json").read_text())
        if previous.get("scale") == scale:
            summary["models"].update(previous.get("models", {}))
    for name, arch, overrides, init in members(scale, out):
        if only and name not in only:
            continue
        cfg = make_run_config(arch, SCALES[scale]["preset"], "mix", SCALES[scale]["common"] + overrides, init_from=init)
        run = out / name
        started = time.perf_counter()
        resume = (run / "train_state" / "state.json").is_file()
        report = (lambda step, total, record, name=name: progress(name, step, total, record)) if callable(progress) else progress
        result = train(cfg, run, resume=resume, progress=report)
        seconds = time.perf_counter() - started
        evaluation = evaluate_run(run)
        summary["models"][name] = {"train_seconds": round(seconds, 1), "eval_seconds": evaluation["seconds"],
                                   "resumed_from": result["resumed_from"], "tasks": evaluation["tasks"]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "zoo.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def ensure_zoo(scale: str = "micro", out: str | Path = "runs/micro", *, progress: bool | Callable = False) -> Path:
    """The zoo's directory, trained first if any member is missing or unfinished (what notebooks
    call so that they run on a fresh clone)."""
    out = Path(out)
    missing = [n for n in member_names(scale) if not (out / n / "results" / "eval.json").is_file()]
    if missing:
        train_zoo(scale, out, progress=progress, only=missing)
    return out
