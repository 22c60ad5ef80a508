"""Ownership of output directories: a verb that writes a run, a store, a study output or a zoo holds
an exclusive lock on its directory while it writes, and never deletes or overwrites what it did not
create.

- ``hold(directory)``: the lock. ``DIR/.workbench.lock`` is held with ``fcntl.flock`` and names its
  holder (PID, command, host, start time); a second writer gets ``OutputBusy`` naming the holder.
  The kernel releases the lock when the holder dies, so a lock file still naming a dead process is
  stale: the next writer takes it over and logs that it did.
- ``claim(directory, kind, overwrite)``: the lock, plus the rule for outputs that are one unit (an
  activation store, a dynamics or trace study, a Hugging Face export, the demo). The directory must
  be new, empty, or a previous output of the same kind (recognised by its metadata file), which is
  replaced only with ``overwrite``. Files are written into a hidden staging directory inside it and
  published by ``publish()``, metadata file last, so a reader never sees a half-written output and a
  killed writer leaves only its staging directory. The writer records what it creates there
  (``Claim.made``, ``Claim.making``), and cleanup removes only that (``Staging``). No process
  removes another's staging directory: the next holder names a dead writer's leftover in a warning
  and leaves it for the user to delete.
- Runs, zoos and a run's ``results/`` keep their own rules (resume, refresh) and use ``hold``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from workbench.storage.errors import BadInput, NotADirectory, OutputBusy, OutputExists
from workbench.storage.files import fsync

logger = logging.getLogger(__name__)

LOCK = ".workbench.lock"
STAGING = ".staging-"  # + the writer's PID
STAGING_MARK = ".workbench-staging"  # inside every staging directory: what makes a leftover one removable
_STAGING = re.compile(r"^\.staging-(\d+)$")
_TMP = re.compile(r"^\..+\.tmp$")  # what files.atomic_write leaves when a writer is killed


@dataclass(frozen=True)
class Kind:
    noun: str  # "activation store"
    article: str  # "an"
    marker: str  # the metadata file that says a directory holds this kind of output


KINDS = {
    "store": Kind("activation store", "an", "store.json"),
    "dynamics": Kind("dynamics study", "a", "dynamics.json"),
    "traces": Kind("trace study", "a", "summary.json"),
    "export": Kind("Hugging Face export", "a", "workbench_export.json"),
    "demo": Kind("demo output", "a", "demo.json"),
    "corpus": Kind("prepared corpus", "a", "corpus.json"),
}

_held: dict[Path, list] = {}  # resolved directory -> [thread id, nesting depth]
_held_guard = threading.Lock()


def is_bookkeeping(name: str) -> bool:
    """Files of ours that say nothing about what a directory holds: the lock, staging directories,
    and the temporary files of a killed atomic write."""
    return name == LOCK or bool(_STAGING.match(name)) or bool(_TMP.match(name))


def contents(directory: Path) -> list[str]:
    """The names in ``directory`` that are not bookkeeping, sorted (none if it does not exist)."""
    directory = Path(directory)
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise NotADirectory(f"{directory} exists and is not a directory")
    return sorted(p.name for p in directory.iterdir() if not is_bookkeeping(p.name))


def _holder_record() -> dict:
    return {
        "pid": os.getpid(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "python",
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _read_record(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 65536).decode(errors="replace")
        record = json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _describe(record: dict | None) -> str:
    if not record:
        return "another process"
    return f"PID {record.get('pid', '?')} ({record.get('command', '?')}) on {record.get('host', '?')} since {record.get('since', '?')}"


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, TypeError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def hold(directory: str | Path) -> Iterator[Path]:
    """Create ``directory`` (and its parents) if needed and hold it exclusively until the block
    ends. Re-entrant within one thread; another thread or process gets ``OutputBusy``."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectory(f"{directory} exists and is not a directory") from None
    except OSError as err:
        raise OSError(err.errno, f"cannot create {directory}: {err.strerror}") from None
    except ValueError as err:  # a NUL byte: a path no file system takes
        raise BadInput(f"cannot create {str(directory)!r}: {err}") from None
    key = directory.resolve()
    with _held_guard:
        entry = _held.get(key)
        if entry is not None:
            if entry[0] != threading.get_ident():
                raise OutputBusy(
                    f"{directory} is being written by another thread of this process (PID {os.getpid()}): "
                    "wait for it to finish or choose another output directory"
                )
            entry[1] += 1
    if entry is not None:
        try:
            yield directory
        finally:
            with _held_guard:
                entry[1] -= 1
        return
    path = directory / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise OSError(err.errno, f"cannot lock {directory}: {err.strerror} ({path})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputBusy(
                f"{directory} is being written by {_describe(_read_record(fd))}: "
                "wait for it to finish or choose another output directory"
            ) from None
        stale = _read_record(fd)
        if stale:
            state = "still running, not holding it" if _alive(stale.get("pid")) else "no longer running"
            logger.warning("%s: took over a stale lock of %s (%s)", directory, _describe(stale), state)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder_record()) + "\n").encode(), 0)
        with _held_guard:
            _held[key] = [threading.get_ident(), 0]
        try:
            yield directory
        finally:
            with _held_guard:
                _held.pop(key, None)
            os.ftruncate(fd, 0)  # an empty lock file is a released one; a record left behind is stale
    finally:
        os.close(fd)  # closing releases the flock


class Claim:
    """A held unit output directory with its staging directory (see ``claim``)."""

    def __init__(self, directory: Path, kind: Kind, previous: bool, staging: Staging):
        self.directory, self.kind, self.previous = directory, kind, previous
        self.staging = staging.path  # where the writer writes; it records what it writes with ``made``
        self.made, self.making = staging.made, staging.making

    def publish(self, replaces=()) -> None:
        """Move everything staged into the directory, ``kind.marker`` last. A previous output is
        invalidated first (its marker goes), then its entries named by ``replaces`` (names, or a
        callable on a name) that the new output does not bring are removed, and entries with a
        staged replacement are swapped."""
        staged = sorted(p.name for p in self.staging.iterdir() if p.name != STAGING_MARK)
        marker = self.kind.marker
        if marker not in staged:
            raise RuntimeError(f"the {self.kind.noun} in {self.staging} has no {marker}: nothing to publish")
        trash = self.staging / f"{STAGING}replaced"
        trash.mkdir()
        self.made(trash)
        if self.previous:
            old = self.directory / marker
            if old.exists():
                os.replace(old, trash / marker)
                self.made(trash / marker)
            owned = replaces if callable(replaces) else set(replaces).__contains__
            for name in contents(self.directory):
                if name not in staged and owned(name):
                    os.replace(self.directory / name, trash / name)
                    self.made(trash / name)  # the previous output's, which the new one replaces
        for name in [n for n in staged if n != marker] + [marker]:
            target = self.directory / name
            if target.exists() and (target.is_dir() and not target.is_symlink()):
                os.replace(target, trash / name)  # a directory is not replaced by rename in one step
                self.made(trash / name)
            os.replace(self.staging / name, target)
        fsync(self.directory)


def listing(names: list[str], most: int = 4) -> str:
    """``a, b, c, d and 3 more``: what a refused directory holds, for its error message."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check_claim(directory: str | Path, kind: str, *, overwrite: bool = False) -> None:
    """What ``claim`` refuses, checked without holding or creating anything: for verbs that check
    their output before long preparation (``claim`` checks again once it holds the directory)."""
    directory = Path(directory)
    ancestor = directory.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectory(f"{ancestor} exists and is not a directory: {directory} cannot be made under it")
    _check_target(directory, KINDS[kind], contents(directory), overwrite)


@contextmanager
def claim(directory: str | Path, kind: str, *, overwrite: bool = False) -> Iterator[Claim]:
    """Hold ``directory`` as a new output of ``kind`` (see the module docstring). Staging is
    removed when the block ends, published or not."""
    spec = KINDS[kind]
    directory = Path(directory)
    check_claim(directory, kind, overwrite=overwrite)  # refuse before creating anything
    with hold(directory), staging_in(directory) as staging:
        found = contents(directory)
        _check_target(directory, spec, found, overwrite)
        yield Claim(directory, spec, bool(found), staging)


class Staging:
    """A staging directory this process made (``staging_in``) and its manifest: every entry the
    process created in it, by its path relative to the directory and the identity (device, inode)
    it had when recorded. Cleanup removes exactly these, so a file that anyone else puts into the
    directory while the writer runs is left, and named."""

    def __init__(self, path: Path):
        self.path = path
        self.manifest: dict[str, tuple[int, int]] = {}

    def made(self, *paths: str | Path) -> None:
        """Record ``paths``, just written inside the staging directory, as this process's: each with
        the directories between it and the staging directory and, for a directory, all it holds."""
        for path in map(Path, paths):
            rel = path.relative_to(self.path)
            for part in [*reversed(rel.parents[:-1]), rel]:
                self._note(part)
            if path.is_dir() and not path.is_symlink():
                for root, dirs, files in os.walk(path):
                    for name in dirs + files:
                        self._note(Path(root, name).relative_to(self.path))

    @contextmanager
    def making(self) -> Iterator[Path]:
        """Record what appears in the staging directory while the block runs (also when it fails):
        for a library call that chooses its own file names (``save_pretrained``). A file someone
        else moves in during the call cannot be told apart, so keep such blocks to the one call."""
        before = self._entries()
        try:
            yield self.path
        finally:
            self.manifest.update((rel, ident) for rel, ident in self._entries().items() if before.get(rel) != ident)

    def _note(self, rel: Path) -> None:
        identity = _identity(self.path / rel)
        if identity is not None:
            self.manifest[str(rel)] = identity

    def _entries(self) -> dict[str, tuple[int, int]]:
        found = {}
        for root, dirs, files in os.walk(self.path):
            for name in dirs + files:
                path = Path(root, name)
                identity = _identity(path)
                if identity is not None:
                    found[str(path.relative_to(self.path))] = identity
        return found

    def remove_made(self) -> None:
        """Remove the recorded entries that are still the ones recorded, deepest first; a directory
        only once empty (``rmdir``), so nothing unrecorded inside one goes with it."""
        for rel in sorted(self.manifest, key=lambda r: len(Path(r).parts), reverse=True):
            path = self.path / rel
            if _identity(path) != self.manifest[rel]:
                continue
            try:
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
            except OSError:
                pass  # a directory that holds something unrecorded stays, and so does its content


@contextmanager
def staging_in(directory: Path) -> Iterator[Staging]:
    """A fresh staging directory inside ``directory``, which the caller holds. When the block ends
    the directory is removed only if it is still the one this process made, with the mark it wrote,
    and only with what its manifest records (``Staging``): anything else is left and named.
    What a killed writer left (provably one, ``_staging_record``, its writer dead on this host) is
    named in a warning and left in place: this process did not create it, so it does not delete it
    (staging directories are bookkeeping, so a leftover never blocks a writer)."""
    host = socket.gethostname()
    for leftover in Path(directory).iterdir():
        record = _staging_record(leftover)
        if record is not None and record.get("host") == host and not _alive(record["pid"]):
            logger.warning(
                "%s: left by %r (PID %s, no longer running), which was killed while writing; it is not "
                "published and not used: delete it to reclaim its space",
                leftover,
                record.get("command"),
                record["pid"],
            )
    staging = Staging(Path(directory) / f"{STAGING}{os.getpid()}")
    staging.path.mkdir()  # never an existing directory: mkdir fails on one
    made = _identity(staging.path)
    mark = _holder_record()
    try:
        (staging.path / STAGING_MARK).write_text(json.dumps(mark) + "\n")
        staging.made(staging.path / STAGING_MARK)
        yield staging
    finally:
        left = _remove_staging(staging, made, mark)
        if left:
            logger.warning("%s: left in place, holding what this process did not create: %s", staging.path, listing(left))
        elif left is None and (staging.path.exists() or staging.path.is_symlink()):
            logger.warning("%s: left in place, it is no longer the staging directory this process made", staging.path)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path`` itself (a link is not followed), or None if nothing is there."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _remove_staging(staging: Staging, identity: tuple[int, int] | None, record: dict) -> list[str] | None:
    """Remove ``staging``: only if its directory is still the very one that was made (same device
    and inode: not a look-alike renamed or swapped in since) and still carries the mark ``record``
    this process wrote (else None, and nothing is touched), and then only what its manifest
    records. Returns what is left in it (empty when the directory itself is gone)."""
    path = staging.path
    if identity is None or _identity(path) != identity or _staging_record(path) != record:
        return None
    staging.remove_made()
    try:
        path.rmdir()
    except OSError:
        return sorted(str(p.relative_to(path)) for p in path.rglob("*"))
    return []


def _staging_record(path: Path) -> dict | None:
    """The holder record a writer marked staging directory ``path`` with, or None when ``path`` is
    not provably one: a name other than ``.staging-PID``, a link, not a directory, a mark that is a
    link or not a file, or a mark that is not a record naming that PID."""
    match = _STAGING.match(path.name)
    mark = path / STAGING_MARK
    if not match or path.is_symlink() or not path.is_dir() or mark.is_symlink() or not mark.is_file():
        return None
    try:
        record = json.loads(mark.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and record.get("pid") == int(match.group(1)) else None


def _check_target(directory: Path, spec: Kind, found: list[str], overwrite: bool) -> None:
    if not found:
        return
    if spec.marker not in found or not _is_json_object(directory / spec.marker):
        raise OutputExists(
            f"{directory} holds files that are not {spec.article} {spec.noun} ({listing(found)}): choose a new or empty directory"
        )
    if not overwrite:
        raise OutputExists(f"{directory} holds a previous {spec.noun}: pass --overwrite to replace it, or choose a new directory")


def _is_json_object(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError, RecursionError):
        return False
