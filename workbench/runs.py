"""Run directories under a root: what the app's Runs page lists, what it reads of each (checked, so
pages can trust a usable run's fields), and the rules for writing under the root."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from workbench.storage.errors import BadInput, MissingFile, WorkbenchError
from workbench.storage.files import read_json
from workbench.storage.outputs import holder
from workbench.training.run import Run

SKIP = {"train_state", "results", "probes"}
# how deep runs lie under a root: an organism study's members are organisms/TASK/studies/STUDY/MEMBER
MAX_DEPTH = 5


@dataclass
class RunInfo:
    name: str  # path relative to the root, e.g. "cpu/fbt"
    path: Path
    arch: str | None
    config: dict  # validated (the model section complete); {} when config.json is unusable
    metrics: list[dict] = field(default_factory=list)
    eval: dict | None = None  # results/eval.json, validated
    results: list[str] = field(default_factory=list)  # files under results/
    error: str | None = None  # why the run cannot be used (corrupt checkpoint, bad config, unreadable, ...)
    # a member of a ``micro`` zoo or study (its directory's zoo.json / study.json says so): trained
    # for seconds to exercise the code, so nothing measured on it is a finding
    plumbing_check: bool = False
    # being written now (its directory held, as training holds it): the holder's record, the last
    # logged step and the steps it trains for; not usable yet, and not broken for what it lacks
    training: dict | None = None

    @property
    def usable(self) -> bool:
        return self.error is None and self.training is None

    @property
    def steps(self) -> int | None:
        return self.metrics[-1]["step"] if self.metrics else None


def _walk(root: Path, max_depth: int = MAX_DEPTH) -> list[tuple[Path, OSError | None]]:
    """(run directory, None) for each directory holding a config.json, and (directory, error) for
    each one that cannot be looked into: it may hold runs, so it is reported rather than skipped."""
    if not root.is_dir():
        raise MissingFile(f"runs directory {root} does not exist (train the zoo with `workbench zoo --out {root}`)")
    found, frontier = [], [(root, 0)]
    while frontier:
        directory, depth = frontier.pop()
        try:
            if (directory / "config.json").is_file():
                found.append((directory, None))
            elif depth < max_depth:
                frontier += [
                    (d, depth + 1)
                    for d in directory.iterdir()
                    if d.name not in SKIP and not d.name.startswith(".") and d.is_dir()
                ]
        except OSError as err:  # pathlib raises EACCES from is_file/is_dir too
            found.append((directory, err))
    return sorted(found, key=lambda entry: entry[0])


def find_run_dirs(root: str | Path, max_depth: int = MAX_DEPTH) -> list[Path]:
    """Directories under ``root`` (itself included) that hold a ``config.json`` and a
    ``model.safetensors`` (or only a config: an unfinished or broken run), and those that cannot be
    read (``list_runs`` reports them), sorted by path. Never raises for what lies under ``root``."""
    return [path for path, _ in _walk(Path(root), max_depth)]


def inspect_run(path: str | Path, root: str | Path | None = None, *, check_weights: bool = True) -> RunInfo:
    """Everything the Runs page shows of one run; problems end up in ``error``, never raised."""
    path = Path(path)
    info = RunInfo(name=_name(path, root), path=path, arch=None, config={}, plumbing_check=_in_micro_zoo(path))
    try:
        run = Run.open(path)
        info.config = {**run.raw, "model": run.config.model.to_dict()}  # every model field, for the pages to read
        info.arch = run.arch
        info.metrics, info.eval, info.results = run.metrics, run.eval, sorted(run.results)
        if check_weights:
            run.model()
    except (ValueError, FileNotFoundError, KeyError, TypeError, RuntimeError, OSError) as err:
        info.error = _describe(err)
        if str(path) not in info.error:  # e.g. torch's own message for a size it cannot allocate
            info.error += f" (in {path})"
    if (held := holder(path)) is not None:  # a run being written lacks what it has not written yet
        steps = info.config.get("train", {}).get("steps") if isinstance(info.config.get("train"), dict) else None
        info.training, info.error = {"holder": held, "step": info.steps, "steps": steps}, None
    return info


def _in_micro_zoo(path: Path) -> bool:
    """Whether the directory holding run ``path`` is a ``micro`` zoo or study (by its summary)."""
    for name in ("zoo.json", "study.json"):
        try:
            summary = read_json(path.parent / name)
        except (ValueError, OSError):  # none there, or unreadable: nothing says it is one
            continue
        if isinstance(summary, dict) and summary.get("scale") == "micro":
            return True
    return False


def _name(path: Path, root: str | Path | None) -> str:
    return str(path.relative_to(root)) if root is not None and path != Path(root) else path.name


def _describe(err: Exception) -> str:
    """One line: the message's first line, after the error's type unless it is a ``WorkbenchError``
    (whose message says everything)."""
    if isinstance(err, OSError) and err.filename and err.strerror:  # "[Errno 13] Permission denied: 'x'" says less
        return f"{type(err).__name__}: cannot read {err.filename}: {err.strerror}"
    line = (str(err).strip().splitlines() or [""])[0]
    return line if isinstance(err, WorkbenchError) else f"{type(err).__name__}: {line}"


def list_runs(root: str | Path, *, check_weights: bool = True) -> list[RunInfo]:
    """``inspect_run`` of every run directory under ``root``; a directory that cannot be read is a
    run whose ``error`` names it."""
    root = Path(root)
    return [
        inspect_run(p, root, check_weights=check_weights)
        if err is None
        else RunInfo(_name(p, root), p, arch=None, config={}, error=f"{_describe(err)} (runs under it, if any, are not listed)")
        for p, err in _walk(root)
    ]


def within_root(path: str | Path, root: str | Path) -> Path:
    """``path`` with symlinks and ``..`` resolved (a relative one taken under ``root``) if that is
    ``root`` or a directory under it; else a ``BadInput`` (a ValueError) naming both. The app writes only there."""
    root = Path(root).resolve()
    try:
        resolved = (root / Path(path).expanduser()).resolve()
        resolved.exists()  # a name longer than the file system allows fails here, not on every page
    except (OSError, RuntimeError, ValueError) as err:  # a symlink loop, a NUL byte, a name too long
        raise BadInput(f"{path}: not a usable path ({err}); expected the runs root {root} or a directory under it") from None
    if resolved != root and root not in resolved.parents:
        shown = "" if str(resolved) == str(path) else f" (resolves to {resolved})"
        raise BadInput(f"{path}{shown} is outside the runs root {root}: expected the root or a directory under it")
    return resolved


def is_loopback(address: str | None) -> bool:
    """Whether a server bound to ``address`` serves this machine only (127.0.0.0/8, ::1, localhost).
    None or "" (all interfaces) and host names other than localhost are not."""
    text = (address or "").strip().strip("[]").lower()
    if text == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    return ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def exposure_warning(address: str | None, root: str | Path) -> str | None:
    """The one-line warning for an app bound to ``address`` (None: all interfaces) over ``root``."""
    if is_loopback(address):
        return None
    return (
        f"--address {address or '(all interfaces)'} is not a loopback address: anyone who can reach it can start "
        f"training and write files under {Path(root).resolve()}"
    )
