"""Run directories under a root: what the app's Runs page lists, and what it reads of each."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from workbench.checkpoint import load_model, read_json

SKIP = {"train_state", "results", "probes"}


@dataclass
class RunInfo:
    name: str  # path relative to the root, e.g. "cpu/fbt"
    path: Path
    arch: str | None
    config: dict
    metrics: list[dict] = field(default_factory=list)
    eval: dict | None = None
    results: list[str] = field(default_factory=list)  # files under results/
    error: str | None = None  # why the run cannot be used (corrupt checkpoint, bad config, ...)

    @property
    def usable(self) -> bool:
        return self.error is None

    @property
    def steps(self) -> int | None:
        return self.metrics[-1]["step"] if self.metrics else None


def find_run_dirs(root: str | Path, max_depth: int = 3) -> list[Path]:
    """Directories under ``root`` (itself included) that hold a ``config.json`` and a
    ``model.safetensors`` (or only a config: an unfinished or broken run), sorted by path."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"runs directory {root} does not exist (train the zoo with `workbench zoo --out {root}`)")
    found, frontier = [], [(root, 0)]
    while frontier:
        directory, depth = frontier.pop()
        if (directory / "config.json").is_file():
            found.append(directory)
            continue
        if depth < max_depth:
            frontier += [(d, depth + 1) for d in directory.iterdir() if d.is_dir() and d.name not in SKIP and not d.name.startswith(".")]
    return sorted(found)


def read_metrics(path: Path) -> list[dict]:
    """The records of ``metrics.jsonl`` (none if it is missing). A torn last line (a process killed
    while appending it) is dropped; a corrupt line before it is an error naming the line."""
    if not path.is_file():
        return []
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError
        except ValueError:
            if number == len(lines):
                break
            raise ValueError(f"corrupt line {number} of {path}: {line[:60]!r}") from None
        records.append(record)
    return records


def inspect_run(path: str | Path, root: str | Path | None = None, *, check_weights: bool = True) -> RunInfo:
    """Everything the Runs page shows of one run; problems end up in ``error``, never raised."""
    path = Path(path)
    name = str(path.relative_to(root)) if root is not None and path != Path(root) else path.name
    info = RunInfo(name=name, path=path, arch=None, config={})
    try:
        info.config = read_json(path / "config.json")
        info.arch = info.config.get("arch")
        info.metrics = read_metrics(path / "metrics.jsonl")
        if (path / "results" / "eval.json").is_file():
            info.eval = read_json(path / "results" / "eval.json")
        if (path / "results").is_dir():
            info.results = sorted(p.name for p in (path / "results").iterdir() if p.is_file())
        if check_weights:
            load_model(path)
    except (ValueError, FileNotFoundError, KeyError, TypeError, RuntimeError, OSError) as err:
        info.error = f"{type(err).__name__}: {err}"
    return info


def list_runs(root: str | Path, *, check_weights: bool = True) -> list[RunInfo]:
    root = Path(root)
    return [inspect_run(p, root, check_weights=check_weights) for p in find_run_dirs(root)]
