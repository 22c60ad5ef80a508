"""Where a verb writes: ``with output(directory, kind, overwrite=...) as out:``.

One context per verb, which
- holds ``DIR/.workbench.lock`` (``fcntl.flock``, released by the kernel when the holder dies) and
  writes its holder into it, so that a second writer gets ``OutputBusy`` naming the holder;
- keeps ``DIR/.workbench-output.json``, the manifest: the kind of output and every path the verb
  wrote there. A previous output is recognised by its manifest, and ``--overwrite`` replaces only
  what the manifest lists: a user's file beside it, or put inside one of its folders, stays;
- for an output that is one unit (an activation store, a study, an export: ``staged``), gives the
  verb a staging folder inside the directory and publishes it with ``out.publish()``, the
  kind's marker file last, so a reader never sees half an output and a kill leaves the previous
  output whole (the next holder names the dead writer's staging folder and leaves it);
- for an output that grows (a run, a zoo, a run's ``results/``), lets the verb write in place,
  each file atomically (``files.atomic_write``), and name it with ``out.wrote(path)``.

The threat model (docs/robustness.md) trusts the user's filesystem: links are followed as the user
made them, and nothing here defends against files planted inside the user's own runs directory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from workbench.storage.errors import BadInput, NotADirectory, OutputBusy, OutputExists
from workbench.storage.files import TMP_MARK, TMP_SUFFIX, fsync, parse_json, write_json

logger = logging.getLogger(__name__)

LOCK = ".workbench.lock"
MANIFEST = ".workbench-output.json"
STAGING = ".staging-"  # + the writer's PID


@dataclass(frozen=True)
class Kind:
    noun: str  # "activation store"
    marker: str = ""  # a unit output's metadata file, published last: what makes it whole


KINDS = {
    "store": Kind("an activation store", "store.json"),
    "dynamics": Kind("a dynamics study", "dynamics.json"),
    "traces": Kind("a trace study", "summary.json"),
    "export": Kind("a Hugging Face export", "workbench_export.json"),
    "demo": Kind("a demo output", "demo.json"),
    "corpus": Kind("a prepared corpus", "corpus.json"),
    "sae": Kind("a sparse autoencoder", "sae.json"),
    "run": Kind("a training run"),
    "zoo": Kind("a zoo or study"),
    "results": Kind("a run's results"),
    "model": Kind("a saved model"),
}

_held: dict[Path, list] = {}  # resolved directory -> [thread id, nesting depth]
_held_guard = threading.Lock()
_scratch: set[Path] = set()  # the staging folders of this process's outputs still open


def is_bookkeeping(name: str) -> bool:
    """Our files that say nothing about what a directory holds: the lock, the manifest, staging
    folders and the temporary files of a killed atomic write."""
    return name in (LOCK, MANIFEST) or name.startswith(STAGING) or (TMP_MARK in name and name.endswith(TMP_SUFFIX))


def contents(directory: str | Path) -> list[str]:
    """The names in ``directory`` that are not bookkeeping, sorted (none if it does not exist)."""
    directory = Path(directory)
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise NotADirectory(f"{directory} exists and is not a directory")
    return sorted(p.name for p in directory.iterdir() if not is_bookkeeping(p.name))


def listing(names, most: int = 4) -> str:
    """``a, b, c, d and 3 more``: what a refused directory holds, for its error message."""
    names = list(names)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _writer() -> dict:
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "python"
    return {"pid": os.getpid(), "command": command, "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _describe(record: dict | None) -> str:
    if not record:
        return "another process"
    return f"PID {record.get('pid', '?')} ({record.get('command', '?')}) on {record.get('host', '?')} since {record.get('since', '?')}"


def _read_lock(fd: int) -> dict:
    try:
        record = json.loads(os.pread(fd, 65536, 0).decode(errors="replace") or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


@contextmanager
def hold(directory: str | Path) -> Iterator[Path]:
    """Make ``directory`` (and its parents) if needed and hold it until the block ends. Re-entrant
    within one thread; another thread or process gets ``OutputBusy`` naming the holder."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectory(f"{directory} exists and is not a directory") from None
    except ValueError as err:  # a NUL byte: a path no file system takes
        raise BadInput(f"cannot create {str(directory)!r}: {err}") from None
    busy = "wait for it to finish or choose another output directory"
    key = directory.resolve()
    with _held_guard:
        entry = _held.setdefault(key, [threading.get_ident(), 0])
        if entry[0] != threading.get_ident():
            raise OutputBusy(f"{directory} is being written by another thread of this process (PID {os.getpid()}): {busy}")
        entry[1] += 1
    try:
        if entry[1] > 1:
            yield directory
            return
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputBusy(f"{directory} is being written by {_describe(_read_lock(fd))}: {busy}") from None
            stale = _read_lock(fd)
            if stale:  # an empty lock file is a released one: this one's holder was killed
                logger.warning("%s: took over a stale lock of %s (no longer running)", directory, _describe(stale))
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(_writer()) + "\n").encode(), 0)
            try:
                yield directory
            finally:
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing releases the flock
    finally:
        with _held_guard:
            entry[1] -= 1
            if not entry[1]:
                _held.pop(key, None)


def holder(directory: str | Path) -> dict | None:
    """Who holds ``directory`` now (its lock's record; ``{}`` when it says nothing), or None when
    nobody does. Takes nothing: a shared lock tried without waiting and given back at once."""
    try:
        fd = os.open(Path(directory) / LOCK, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_lock(fd)
    finally:
        os.close(fd)
    return None


def listed(directory: str | Path, kind: str) -> set[str] | None:
    """The paths (relative to ``directory``) that ``directory``'s manifest lists as a ``kind``
    output's, or None when it has no manifest of that kind."""
    path = Path(directory) / MANIFEST
    try:
        with path.open("rb") as f:
            manifest = parse_json(f.read(1 << 26), str(path))  # ours, but a copy may be cut short
    except (OSError, BadInput):
        return None
    if not isinstance(manifest, dict):
        return None
    files = manifest.get("files", list(manifest.get("made") or []))  # format 1 kept a stamp per path
    if manifest.get("kind") != kind or not isinstance(files, list):
        return None
    return {f for f in files if isinstance(f, str)}


def _write_manifest(directory: Path, kind: str, files) -> None:
    files = sorted({f for f in files if os.path.lexists(directory / f)})
    write_json(directory / MANIFEST, {"format": 2, "kind": kind, "writer": _writer(), "files": files})


def _tree(path: Path, base: Path) -> list[str]:
    """``path`` and everything under it, relative to ``base``."""
    found = [str(path.relative_to(base))]
    if path.is_dir():
        found += [str(Path(root, name).relative_to(base)) for root, dirs, files in os.walk(path) for name in dirs + files]
    return found


class Output:
    """A held output directory (see ``output``)."""

    def __init__(self, directory: Path, kind: str, staged: bool = False):
        self.directory, self.kind = directory, kind
        self.files = listed(directory, kind) or set()
        self._scratch: Path | None = None
        self.staging = self.scratch() if staged else directory  # where the verb writes

    def scratch(self) -> Path:
        """A folder inside the directory that this output makes (a new name, never an existing
        folder) and removes, with what the verb wrote there, when the block ends."""
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}-", dir=self.directory))
            _scratch.add(self._scratch)
        return self._scratch

    def close(self) -> None:
        scratch, self._scratch = self._scratch, None
        if scratch is None:
            return
        _scratch.discard(scratch)
        # removed whole only as the folder ``scratch()`` made: this process's name, directly in the
        # output directory, a real folder (a link put in its place is left, and so is its target)
        ours = scratch.parent == self.directory and scratch.name.startswith(f"{STAGING}{os.getpid()}-")
        if ours and scratch.is_dir() and not scratch.is_symlink():
            shutil.rmtree(scratch)
        elif os.path.lexists(scratch):
            logger.warning("%s: not the staging folder this verb made; left as it is", scratch)

    def remove(self, rel: str) -> bool:
        """Delete ``rel`` and what lies under it as far as the manifest lists it, deepest first, a
        folder only once empty; whether ``rel`` is gone (a folder holding anything unlisted stays)."""
        for entry in sorted((r for r in self.files if r == rel or r.startswith(f"{rel}/")), key=lambda r: -r.count("/")):
            path = self.directory / entry
            try:
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                pass  # a folder still holding what the manifest does not list
        return not os.path.lexists(self.directory / rel)

    def owns(self, rel: str | Path) -> bool:
        """Whether ``rel`` (relative to the directory) is this kind of output's, by its manifest."""
        return str(rel) in self.files

    def wrote(self, *paths: str | Path, alone: bool = False) -> None:
        """Add ``paths`` (written in place, each with all it holds unless ``alone``) to the manifest;
        entries gone since are dropped."""
        base = Path(os.path.abspath(self.directory))
        for path in (Path(os.path.abspath(p)) for p in paths):
            self.files.update([str(path.relative_to(base))] if alone else _tree(path, base))
        _write_manifest(self.directory, self.kind, self.files)

    def foreign(self, names) -> list[str]:
        """What lies under the top-level ``names`` that the manifest does not list."""
        found = [
            rel
            for name in names
            if os.path.lexists(self.directory / name)
            for rel in _tree(self.directory / name, self.directory)
        ]
        return sorted(rel for rel in found if not self.owns(rel) and Path(rel).name not in (LOCK, MANIFEST))

    def publish(self) -> None:
        """Move what was staged into the directory, the marker last, after removing the previous
        output's listed entries; the manifest names the union while entries move, then the new."""
        marker = KINDS[self.kind].marker
        staged = sorted(p.name for p in self.staging.iterdir())
        if marker not in staged:
            raise RuntimeError(f"{self.staging} has no {marker}: nothing to publish")
        taken = [n for n in staged if os.path.lexists(self.directory / n) and not self.owns(n)]
        if taken:
            raise OutputExists(f"{self.directory} holds {listing(taken)}, which no previous output wrote: move it away")
        new = [rel for name in staged for rel in _tree(self.staging / name, self.staging)]
        _write_manifest(self.directory, self.kind, self.files | set(new))
        kept = [n for n in [marker, *sorted(self.files)] if "/" not in n and not self.remove(n)]
        if kept:  # put there since check_output looked: the user's, never deleted
            raise OutputExists(
                f"{self.directory} holds files its previous output did not write in {listing(kept)}: move them away"
            )
        for name in [n for n in staged if n != marker] + [marker]:
            os.replace(self.staging / name, self.directory / name)
        self.files = set(new)
        _write_manifest(self.directory, self.kind, self.files)
        fsync(self.directory)


def check_output(directory: str | Path, kind: str, *, overwrite: bool = False) -> None:
    """What ``output`` refuses for a unit output, checked without holding or making anything: the
    directory is new or empty, or holds a previous output of ``kind`` (its manifest lists its
    marker), replaced only with ``overwrite`` and only if nothing unlisted lies among its entries."""
    directory, spec = Path(directory), KINDS[kind]
    ancestor = directory.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectory(f"{ancestor} exists and is not a directory: {directory} cannot be made under it")
    found = contents(directory)
    if not found:
        return
    previous = Output(directory, kind)
    if not (spec.marker in found and previous.owns(spec.marker)):
        raise OutputExists(
            f"{directory} holds files that are not {spec.noun} ({listing(found)}): choose a new or empty directory"
        )
    if not overwrite:
        raise OutputExists(
            f"{directory} holds a previous {spec.noun[spec.noun.index(' ') + 1 :]}: pass --overwrite to replace it"
        )
    foreign = previous.foreign(n for n in previous.files if "/" not in n)
    if foreign:
        raise OutputExists(f"{directory} holds files its previous output did not write ({listing(foreign)}): move them away")


@contextmanager
def output(directory: str | Path, kind: str, *, overwrite: bool = False, staged: bool | None = None) -> Iterator[Output]:
    """Hold ``directory`` as a ``kind`` output until the block ends (see the module docstring).
    A unit output (a kind with a marker) is staged and checked by ``check_output``; an output that
    grows is written in place, by the caller's rules for what it continues."""
    directory = Path(directory)
    staged = bool(KINDS[kind].marker) if staged is None else staged
    if staged:
        check_output(directory, kind, overwrite=overwrite)  # refuse before making anything
    with hold(directory):
        for leftover in directory.glob(f"{STAGING}*"):  # the lock is ours: whoever staged these was killed
            if leftover not in _scratch:
                logger.warning(
                    "%s: left by a writer that was killed; never read or published: delete it to reclaim its space", leftover
                )
        if staged:
            check_output(directory, kind, overwrite=overwrite)  # again, now that nobody else writes here
        out = Output(directory, kind, staged)
        try:
            yield out
        finally:
            out.close()
