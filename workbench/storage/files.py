"""File writes that never leave a torn file: atomic replace through a synced temporary, JSON
objects read with errors that name the file. The bottom of the workbench: it imports only ``errors``."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from workbench.storage.errors import BadInput, MissingFile

TMP_SUFFIX = ".tmp"
TMP_MARK = "wb-"  # a temporary file's name: .NAME.wb-PID-RANDOM.tmp, its writer's PID in it


def atomic_write(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` then rename, so a crash never leaves a half-written file
    (only a hidden ``.NAME.wb-PID-*.tmp`` beside it). The temporary file is fsynced before the rename and
    the directory after it, so once this returns the new file survives a power loss too (a rename
    alone can reach the disk before the data it publishes). OS errors name ``path``, not the
    temporary file."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{TMP_MARK}{os.getpid()}-", suffix=TMP_SUFFIX)
    except OSError as err:
        raise _naming(err, path) from err
    except ValueError as err:  # a NUL byte: a path no file system takes
        raise BadInput(f"cannot write {str(path)!r}: {err}") from err
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        fsync(tmp)
        os.replace(tmp, path)
        fsync(path.parent)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise _naming(err, path) from err
        raise


def _naming(err: OSError, path: Path) -> OSError:
    if err.errno is None:
        return OSError(f"cannot write {path}: {err}")
    return OSError(err.errno, f"cannot write {path}: {err.strerror}")  # OSError(errno, ...) keeps the subclass


def remove_stale_temps(directory: Path, names=None) -> None:
    """Delete what ``atomic_write`` left of ``names`` (default: of any file) in ``directory`` when a
    process was killed mid-write: only a regular file of this user named as ``atomic_write`` names
    its temporaries (``.NAME.wb-PID-*.tmp``), so a user's look-alike (``.config.json.x.tmp``) or a
    link stays. The caller holds ``directory`` (``outputs.hold``) and has no write in flight there,
    so no live writer's temporary can be among them: whether the PID in a name still runs is not
    asked, since PIDs are reused."""
    names = [re.escape(name) for name in names] if names is not None else [".+"]
    pattern = re.compile(rf"^\.(?:{'|'.join(names)})\.{TMP_MARK}\d+-[^./]+{re.escape(TMP_SUFFIX)}$")
    for tmp in Path(directory).glob(f".*.{TMP_MARK}*{TMP_SUFFIX}"):
        try:
            st = tmp.lstat()
        except FileNotFoundError:
            continue
        if pattern.match(tmp.name) and stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            tmp.unlink(missing_ok=True)


def link_or_copy(src: Path, dst: Path) -> None:
    """Atomically make ``dst`` a hard link to ``src`` (a copy where links are not supported)."""

    def place(tmp: str) -> None:
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)

    atomic_write(dst, place)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n"))


def parse_json(text: str | bytes, where: str, expected: str = ""):
    """``text`` (from elsewhere) parsed as JSON. Malformed text, nesting deeper than the parser
    recurses and an integer of more digits than ``int`` converts are each one ``BadInput`` naming
    ``where`` (and, for text that is not JSON, what was ``expected``): the parser's own errors are a
    traceback of a RecursionError or a ValueError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput(f"{where}: not JSON ({err.msg} at line {err.lineno} column {err.colno}){expected}") from None
    except UnicodeDecodeError as err:
        raise BadInput(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise BadInput(f"{where}: JSON nested too deeply to read") from None
    except ValueError as err:
        raise BadInput(f"{where}: a number too long to read ({str(err).partition(':')[0]})") from None


def read_json(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"missing {path}")
    try:
        text = path.read_text()
    except UnicodeDecodeError as err:
        raise BadInput(f"corrupt JSON in {path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    data = parse_json(text, f"corrupt JSON in {path}")
    if not isinstance(data, dict):
        raise BadInput(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def fsync(path) -> None:
    """Make a file's data, or the renames into a directory, durable. A file is opened without
    following a link (a link planted where the workbench wrote is refused, ELOOP); a directory is
    followed, since an output directory the user gave may itself be a link (``hold`` allows it).
    The open is read-only either way: nothing is written through it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (0 if os.path.isdir(path) else os.O_NOFOLLOW))
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno != errno.EINVAL:  # EINVAL: a file system that cannot sync this (some cannot sync directories)
            raise
    finally:
        os.close(fd)
