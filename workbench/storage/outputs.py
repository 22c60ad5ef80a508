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
- ``DIR/.workbench-output.json``, the output record: the kind of output a verb made in a directory
  and every entry it made there, by relative path with its device, inode, type, size and
  modification time. A previous output is recognised by its record, never by a file name, and only
  what the record names (the same file, or a copy that kept its times: ``_same``) is ever replaced
  or removed: a user's file of the same name, or one put inside a directory the workbench made, is
  not the workbench's (``read_record``, ``record_made``, ``foreign_entries``).
- Runs, zoos and a run's ``results/`` keep their own rules (resume, refresh) and use ``hold``.
- Nothing is opened for writing through a link: the lock is opened with ``O_NOFOLLOW`` and must be a
  regular file, and a directory the workbench writes inside a run (``real_directory``) must be a
  real directory, not a link to one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from workbench.storage.errors import BadInput, NotADirectory, OutputBusy, OutputExists
from workbench.storage.files import fsync, write_json

logger = logging.getLogger(__name__)

LOCK = ".workbench.lock"
RECORD = ".workbench-output.json"  # the output record: what a verb made in a directory
RECORD_FORMAT = 1
STAGING = ".staging-"  # + the writer's PID
STAGING_MARK = ".workbench-staging"  # inside every staging directory: what makes a leftover one removable
_STAGING = re.compile(r"^\.staging-(\d+)$")
_TMP = re.compile(r"^\..+\.wb-\d+-[^.]+\.tmp$")  # what files.atomic_write leaves when a writer is killed


@dataclass(frozen=True)
class Kind:
    name: str  # "store": the kind an output record names
    noun: str  # "activation store"
    article: str  # "an"
    marker: str  # the metadata file that says a directory holds this kind of output


KINDS = {
    "store": Kind("store", "activation store", "an", "store.json"),
    "dynamics": Kind("dynamics", "dynamics study", "a", "dynamics.json"),
    "traces": Kind("traces", "trace study", "a", "summary.json"),
    "export": Kind("export", "Hugging Face export", "a", "workbench_export.json"),
    "demo": Kind("demo", "demo output", "a", "demo.json"),
    "corpus": Kind("corpus", "prepared corpus", "a", "corpus.json"),
    "sae": Kind("sae", "sparse autoencoder", "a", "sae.json"),
}

# Said where an output is not recognised as the workbench's: a copy made without its times is not.
COPIES = "a copied output is recognised only if the copy kept modification times (cp -a, rsync -a)"

_held: dict[Path, list] = {}  # resolved directory -> [thread id, nesting depth]
_held_guard = threading.Lock()


def is_bookkeeping(name: str) -> bool:
    """Files of ours that say nothing about what a directory holds: the lock, staging directories,
    and the temporary files of a killed atomic write."""
    return name in (LOCK, RECORD) or bool(_STAGING.match(name)) or bool(_TMP.match(name))


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
    fd = _open_lock(path)
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
            if stale.get("host") != socket.gethostname():  # a pid means nothing on another host
                state = "on another host: whether it still runs cannot be checked from here"
            else:
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


def holder(directory: str | Path) -> dict | None:
    """Who holds ``directory`` now (its lock's record: pid, command, host, since; ``{}`` when it says
    nothing), or None when nobody does. Takes nothing: a shared lock tried without waiting, and
    given back at once. A directory without a lock file, or one that is a link, is not held."""
    path = Path(directory) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_record(fd) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _open_lock(path: Path) -> int:
    """The lock file, opened for writing only if it is a regular file: never through a link (a
    planted link would have every writer truncate its target) and never a FIFO or device (opened
    without blocking, then refused)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BadInput(f"cannot lock {path.parent}: {path} is a symbolic link, expected a regular file (remove it)") from None
        raise OSError(err.errno, f"cannot lock {path.parent}: {err.strerror} ({path})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadInput(f"cannot lock {path.parent}: {path} is not a regular file (remove it)")
    return fd


def real_directory(path: str | Path) -> Path:
    """``path`` as a directory the workbench may write in: made if missing (with its parents), and
    refused with one line if it is a link (a planted link would send the writes to its target) or
    anything but a directory."""
    path = Path(path)
    if path.is_symlink():
        raise BadInput(f"{path} is a symbolic link, expected a real directory: the workbench does not write through links")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectory(f"{path} exists and is not a directory") from None
    return path


# ---- the output record -------------------------------------------------------------------------


def read_record(directory: str | Path) -> dict | None:
    """The output record of ``directory``, or None when there is none that this workbench wrote (no
    file, a link, not JSON, or not a record of this format)."""
    path = Path(directory) / RECORD
    if path.is_symlink() or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    ok = (
        isinstance(record, dict)
        and record.get("format") == RECORD_FORMAT
        and isinstance(record.get("kind"), str)
        and isinstance(record.get("made"), dict)
    )
    return record if ok else None


def record_of(directory: str | Path, kind: str) -> dict | None:
    """``directory``'s record if it is one of ``kind``."""
    record = read_record(directory)
    return record if record is not None and record["kind"] == kind else None


def _write_record(directory: Path, kind: str, made: dict) -> None:
    # An entry still the one recorded is restamped: a file appended to since, or the copy a copied
    # output holds, is recognised by its present identity from now on.
    made = {rel: (now if _same(stamp, now) else stamp) for rel, stamp in made.items() for now in [_stamp(directory / rel)]}
    old = read_record(directory)
    if old is not None and old["kind"] == kind and old["made"] == made:
        return  # nothing new: the file stays as it was
    record = {"format": RECORD_FORMAT, "kind": kind, "writer": _holder_record(), "made": dict(sorted(made.items()))}
    write_json(directory / RECORD, record)


def new_record(directory: str | Path, kind: str) -> None:
    """Start ``directory``'s record as a ``kind`` output that has made nothing yet (the caller holds it)."""
    _write_record(Path(directory), kind, {})


def record_made(directory: str | Path, kind: str, *paths: str | Path, recursive: bool = True) -> None:
    """Add ``paths`` (inside ``directory``, which the caller holds, each as a path of its own, not
    one relative to ``directory``; a directory with all it holds unless not ``recursive``) to ``directory``'s ``kind`` record with the identity they have now,
    starting the record if there is none, and drop the entries that are gone. Called after every
    write of a recorded file: a replaced file is a new inode."""
    directory = Path(directory)
    record = read_record(directory)
    if record is not None and record["kind"] != kind:
        raise OutputExists(f"{directory} holds {record['kind']!r} output, not {kind!r}: choose another directory")
    made = {rel: stamp for rel, stamp in (record or {"made": {}})["made"].items() if _stamp(directory / rel) is not None}
    base = Path(os.path.abspath(directory))  # a relative path is the working directory's, as every caller's is
    for path in (Path(os.path.abspath(p)) for p in paths):
        if recursive:
            made.update(_stamps(path, base))
        elif _stamp(path) is not None:
            made[str(path.relative_to(base))] = _stamp(path)
    _write_record(directory, kind, made)


def owns(record: dict | None, directory: Path, rel: str) -> bool:
    """Whether ``record`` names ``directory / rel`` as the entry there now (``_same``)."""
    return record is not None and _same(record["made"].get(rel), _stamp(directory / rel))


def _stamp(path: Path) -> list[int] | None:
    """What a record keeps of an entry: [device, inode, file type, size (0 for a directory),
    modification time in ns], or None if nothing is there (a link is not followed)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    kind = stat.S_IFMT(st.st_mode)
    return [st.st_dev, st.st_ino, kind, 0 if kind == stat.S_IFDIR else st.st_size, st.st_mtime_ns]


def _same(recorded, now: list[int] | None) -> bool:
    """Whether the entry now at a recorded path is the recorded one: the same file (device, inode
    and type; appended to since, as a log is), or a copy of it that kept its type, size and
    modification time to the nanosecond (``cp -a``, ``rsync -a``, ``shutil.copytree``), so a run
    or zoo copied whole is still the workbench's. A file put there since, even with the same
    name and content, has another time: it is not."""
    if now is None or not isinstance(recorded, list) or len(recorded) != 5:
        return False
    return recorded[:3] == now[:3] or recorded[2:] == now[2:]


def foreign_entries(directory: str | Path, record: dict | None, names=None) -> list[str]:
    """The entries under ``directory`` (or under its top-level ``names``), recursively, that
    ``record`` does not name with their present identity: what the output it records did not make
    (a user's file, or one replaced since). Locks and records are bookkeeping at any depth; staging
    directories, the directory's own bookkeeping."""
    directory = Path(directory)
    found = []
    tops = contents(directory) if names is None else [n for n in names if _identity(directory / n) is not None]
    for top in tops:
        for rel in _stamps(directory / top, directory):
            if Path(rel).name in (LOCK, RECORD):
                continue
            if not owns(record, directory, rel):
                found.append(rel)
    return sorted(found)


def _stamps(path: Path, base: Path) -> dict[str, list[int]]:
    """``path`` and, for a real directory, everything under it: relative path -> ``_stamp``."""
    found = {}
    stamp = _stamp(path)
    if stamp is None:
        return found
    found[str(path.relative_to(base))] = stamp
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                entry = Path(root, name)
                stamp = _stamp(entry)
                if stamp is not None:
                    found[str(entry.relative_to(base))] = stamp
    return found


class Claim:
    """A held unit output directory with its staging directory (see ``claim``)."""

    def __init__(self, directory: Path, kind: Kind, previous: bool, staging: Staging):
        self.directory, self.kind, self.previous = directory, kind, previous
        self.staging = staging.path  # where the writer writes; it records what it writes with ``made``
        self.made, self.making = staging.made, staging.making
        self._staging = staging

    def publish(self) -> None:
        """Move everything staged into the directory, ``kind.marker`` last. A previous output is
        invalidated first (its marker goes), then its entries that the new output does not bring are
        removed, and entries with a staged replacement are swapped: only what the previous output's
        record names, with the identity it recorded (``claim`` refused a previous output holding
        anything else; one put there since stays, named in cleanup's warning). The new record is
        written before the first entry moves, naming the new entries and the previous ones still in
        place, so a writer killed half-way leaves nothing unrecorded; then again with the new only."""
        staged = sorted(p.name for p in self.staging.iterdir() if p.name != STAGING_MARK)
        marker = self.kind.marker
        if marker not in staged:
            raise RuntimeError(f"the {self.kind.noun} in {self.staging} has no {marker}: nothing to publish")
        old = read_record(self.directory) if self.previous else None
        taken = [n for n in staged if _identity(self.directory / n) is not None and not owns(old, self.directory, n)]
        if taken:  # before anything moves: a file beside the previous output is the user's, never replaced
            raise OutputExists(
                f"{self.directory} holds {listing(taken)}, which the new {self.kind.noun} would replace and no "
                "previous one wrote: move it away, or choose a new directory"
            )
        new = {}
        for name in staged:
            new.update(_stamps(self.staging / name, self.staging))
        trash = self.staging / f"{STAGING}replaced"
        trash.mkdir()
        self.made(trash)
        if old is not None:
            if owns(old, self.directory, marker):
                self._discard(marker, trash, old)
            for name in contents(self.directory):
                if name not in staged and owns(old, self.directory, name):
                    self._discard(name, trash, old)
        still = {rel: ident for rel, ident in (old or {"made": {}})["made"].items() if owns(old, self.directory, rel)}
        _write_record(self.directory, self.kind.name, {**still, **new})
        for name in [n for n in staged if n != marker] + [marker]:
            target = self.directory / name
            if target.is_dir() and not target.is_symlink():
                self._discard(name, trash, old)  # a directory is not replaced by rename in one step
            os.replace(self.staging / name, target)
        _write_record(self.directory, self.kind.name, new)
        fsync(self.directory)

    def _discard(self, name: str, trash: Path, old: dict | None) -> None:
        discard(self._staging, self.directory, name, trash / name, old)


def discard(staging: Staging, directory: Path, rel: str, to: Path, record: dict | None) -> None:
    """Move the entry ``rel`` of ``directory`` to ``to`` inside ``staging`` and note for removal
    only what ``record`` names there with the identity it recorded (cleanup leaves the rest in
    staging, and names it in its warning)."""
    before = _stamps(directory / rel, directory)
    os.replace(directory / rel, to)
    moved = to.relative_to(staging.path)
    for part in reversed(moved.parents[:-1]):
        staging.note_identity(part, _identity(staging.path / part))
    for entry, stamp in before.items():
        if record is not None and _same(record["made"].get(entry), stamp):
            staging.note_identity(moved / Path(entry).relative_to(rel), stamp[:2])


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

    def note_identity(self, rel: Path, identity) -> None:
        """Record ``rel`` as this process's to remove if it still has ``identity``."""
        if identity is not None:
            self.manifest[str(rel)] = tuple(identity)

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
    """A claimed directory is new or empty, or holds a previous output of ``spec``'s kind: its
    marker and a record of that kind naming it (a file of the right name alone is not one),
    replaced only with ``overwrite``, and only if none of its entries holds anything the record
    does not name (a user's file inside a directory it made, or one of its files changed since).
    Other files beside it are the user's and stay."""
    if not found:
        return
    record = record_of(directory, spec.name)
    if spec.marker not in found or record is None or not owns(record, directory, spec.marker):
        raise OutputExists(
            f"{directory} holds files that are not {spec.article} {spec.noun} ({listing(found)}): choose a new or "
            f"empty directory (a previous output is one whose {RECORD} names it)"
        )
    if not overwrite:
        raise OutputExists(f"{directory} holds a previous {spec.noun}: pass --overwrite to replace it, or choose a new directory")
    foreign = foreign_entries(directory, record, [name for name in record["made"] if "/" not in name])
    if foreign:
        raise OutputExists(
            f"{directory} holds a previous {spec.noun} with files it did not write among its own ({listing(foreign)}): "
            "move them away, or choose a new directory"
        )
