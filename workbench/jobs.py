"""Background jobs: a CLI verb run as a detached subprocess whose state lives on disk, so that it
outlives the browser tab (or the app) that started it and any page can show it.

A job is a directory ``ROOT/.jobs/ID/`` holding

- ``job.json``: what runs (``argv`` of ``workbench``), for which ``page``, the ``outputs`` it
  writes, and its ``state``: ``starting`` -> ``running`` -> ``done`` | ``failed`` | ``cancelled``
  (a failure the supervisor itself detected says why in ``reason``). Three states are read, never
  written: ``lost``, the supervisor is gone without recording an end (killed); ``orphaned``, it is
  gone but its verb still runs (found by the lock record of an output directory it holds); and
  ``invalid``, ``job.json`` is not what ``start_job`` and the supervisor write (its ``error`` names
  the file and the field);
- ``log.txt``: the verb's standard output and error;
- ``progress.json``: the verb's latest progress (``workbench.runtime.progress.Bar``), when it reports one;
- ``result.json``: the verb's summary (its ``--json``), when it finished.

``start_job`` creates the directory and starts a supervisor, ``python -m workbench.jobs DIR``,
in a session of its own (a closed tab, a stopped app server or a Ctrl-C in its terminal does not
reach it). The supervisor runs the verb, records its pid and end, and turns a cancel (SIGTERM to
the supervisor, ``cancel_job``) into a Ctrl-C of the verb, so the verb cleans up what it staged.
Only the supervisor writes ``job.json`` once it runs; readers never write it.

Every file of a job is read as untrusted: a field of the wrong type or out of range makes the job
``invalid`` (or its progress unread), never an exception in a reader. No file is read or appended
to through a link. A process is signalled only when its command line (``/proc``) proves it is this
job's supervisor or verb, and never pids 0, 1 or negative ones (which address process groups or
every process the user may signal).
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from workbench.runtime.progress import PROGRESS_ENV
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import parse_json, write_json
from workbench.storage.outputs import LOCK
from workbench.storage.shapes import Check, check_shape

JOBS_DIR = ".jobs"
STATES = ("starting", "running", "done", "failed", "cancelled")  # what job.json may say
FINISHED = ("done", "failed", "cancelled", "lost", "invalid")
START_GRACE = 60.0  # seconds a job may stay ``starting`` before a dead supervisor makes it ``lost``
STOP_GRACE = 30.0  # seconds a cancelled verb has to clean up after its Ctrl-C before it is killed
# bytes: a job's own files (job.json, progress.json, a lock record) are a few hundred, and every page
# load reads them all; a verb's result (result.json) may be larger
MAX_FILE, MAX_RESULT = 1 << 16, 1 << 20
LATEST = 32503680000.0  # 3000-01-01 in seconds since the epoch: a later "time" is garbage and cannot be drawn
PID_LIMIT = 1 << 22  # Linux's PID_MAX_LIMIT: no process has a larger id (and os.kill overflows on huge ones)
PROC = Path("/proc")  # where a process's command line proves what it is (Linux); without it nothing is signalled
_children: dict[str, subprocess.Popen] = {}  # supervisors started by this process, reaped when listed


@dataclass
class Job:
    id: str
    path: Path
    title: str
    argv: list[str]
    page: str | None  # None: an invalid job whose page cannot be read (every page lists it)
    outputs: list[str]
    created: float
    state: str
    pid: int | None = None
    returncode: int | None = None
    finished: float | None = None
    reason: str | None = None  # why the supervisor failed the job itself (a refused log)
    progress: dict = field(default_factory=dict)
    progress_error: str | None = None  # why progress.json was not read
    error: str | None = None  # ``invalid``: what is wrong with job.json
    verb_pid: int | None = None  # ``orphaned``: the verb that still runs without its supervisor
    unverified: bool = False  # its supervisor may run, but its command line cannot be checked here

    @property
    def running(self) -> bool:
        return self.state not in FINISHED

    @property
    def cancellable(self) -> bool:
        """Whether ``cancel_job`` may find a process to stop (it checks again before signalling)."""
        return (self.state == "running" and not self.unverified) or self.state == "orphaned"

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the verb's log (its last ``chars`` bytes); a note instead of what a link or
        anything but a regular file would give."""
        path = self.path / "log.txt"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return ""
        except OSError as err:
            return f"({path} not read: {_why(err)})"
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                return f"({path} not read: not a regular file)"
            f.seek(max(0, info.st_size - chars))
            return f.read(chars).decode("utf-8", errors="replace")

    def result(self) -> dict | None:
        """The verb's ``--json`` summary once it is done, else None."""
        if self.state != "done":
            return None
        try:
            return _read_object(self.path / "result.json", MAX_RESULT)
        except MissingFile:
            return None


def jobs_dir(root: str | Path) -> Path:
    return Path(root) / JOBS_DIR


def start_job(root: str | Path, argv: list[str], *, title: str, page: str = "", outputs: list[str] | None = None) -> Job:
    """Start ``workbench ARGV --json DIR/result.json`` as a background job under ``root``; returns it
    at once (``starting``)."""
    if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise BadInput(f"job argv {argv!r}: expected a workbench verb and its arguments as strings")
    base = jobs_dir(root).absolute()  # the supervisor's command line names its directory: absolute, so readers anywhere match it
    if base.is_symlink():
        raise BadInput(f"{base} is a symbolic link, expected a real directory: jobs are not written through links")
    base.mkdir(parents=True, exist_ok=True)
    job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{argv[0]}-{secrets.token_hex(3)}"
    path = base / job_id
    path.mkdir()  # a new name: an existing directory is never reused
    write_json(
        path / "job.json",
        {
            "id": job_id,
            "title": title,
            "argv": [*argv, "--json", str(path / "result.json")],
            "page": page,
            "outputs": [str(o) for o in outputs or []],
            "created": time.time(),
            "state": "starting",
        },
    )
    with _open_log(path / "log.txt", new=True) as log:
        _children[job_id] = subprocess.Popen(
            [sys.executable, "-m", "workbench.jobs", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return read_job(path)


def read_job(path: str | Path) -> Job:
    """The job in directory ``path`` as its files say: ``lost`` if its supervisor is gone without
    having recorded an end, ``orphaned`` if its verb still runs then. Raises ``MissingFile`` without
    a ``job.json``, and ``BadInput`` naming the file and the field when it is not one the workbench
    writes."""
    path = Path(path)
    file = path / "job.json"
    child = _children.get(path.name)
    exited = child is not None and child.poll() is not None  # reap it (it wrote its end before exiting)
    if exited:
        _children.pop(path.name, None)
    data = _check_job(_read_object(file), file)
    state, unverified, verb = data["state"], False, None
    if state == "running":
        supervisor = _is_supervisor(data.get("pid"), path, data.get("host"))
        if supervisor is None:
            unverified = True
        elif not supervisor:
            verb = _orphaned_verb(data["argv"], data["outputs"])
            state = "lost" if verb is None else "orphaned"
    elif state == "starting" and (exited or (child is None and time.time() - data["created"] > START_GRACE)):
        state = "lost"
    progress, progress_error = read_progress(path)
    return Job(
        id=path.name,  # the directory's name, unique among the jobs (a copied job.json may repeat an id)
        path=path,
        title=data["title"],
        argv=data["argv"],
        page=data["page"],
        outputs=data["outputs"],
        created=data["created"],
        state=state,
        pid=data.get("pid"),
        returncode=data.get("returncode"),
        finished=data.get("finished"),
        reason=data.get("reason"),
        progress=progress,
        progress_error=progress_error,
        verb_pid=verb,
        unverified=unverified,
    )


def read_progress(path: str | Path) -> tuple[dict, str | None]:
    """The job's latest progress (``{}`` when it reported none) and, if ``progress.json`` is not
    what ``Bar`` writes, why (the file and the field) with ``{}``."""
    file = Path(path) / "progress.json"
    try:
        return _check_progress(_read_object(file), file), None
    except MissingFile:
        return {}, None
    except (BadInput, OSError) as err:
        return {}, str(err)


def list_jobs(root: str | Path, page: str | None = None) -> list[Job]:
    """The jobs under ``root`` (for ``page``), newest first. A directory without ``job.json`` is
    not a job (or one being created) and is skipped; one whose ``job.json`` cannot be read or is
    not what the workbench writes is listed as ``invalid``, with its error, on its page (on every
    page when even its page cannot be read)."""
    base = jobs_dir(root)
    if not base.is_dir():
        return []
    jobs = []
    for path in base.iterdir():
        if path.is_symlink():
            job = _invalid(path, f"{path} is a symbolic link, expected a job's own directory: not read", read=False)
        elif not path.is_dir():
            continue
        else:
            try:
                job = read_job(path)
            except MissingFile:
                continue
            except (BadInput, OSError) as err:
                job = _invalid(path, str(err))
        if page is None or job.page == page or (job.state == "invalid" and job.page is None):
            jobs.append(job)
    return sorted(jobs, key=lambda j: j.created, reverse=True)


def cancel_job(job: Job) -> bool:
    """Ask a running job to stop: its supervisor gets SIGTERM (it gives the verb a Ctrl-C), or, when
    the supervisor is gone and the verb still runs (``orphaned``), the verb gets the Ctrl-C itself.
    Only a process whose command line proves it is that supervisor or verb is signalled; False
    when there is none."""
    if job.state == "running" and not job.unverified:
        return _signal(job.pid, signal.SIGTERM, lambda pid, cmd: _supervises(cmd, job.path, pid))
    if job.state == "orphaned":
        return _signal(job.verb_pid, signal.SIGINT, lambda pid, cmd: cmd[1:] == _verb_args(job.argv))
    return False


# ---- reading a job's files ---------------------------------------------------------------------


def _why(err: OSError) -> str:
    return "a symbolic link" if err.errno == errno.ELOOP else err.strerror or str(err)


def _read_object(path: Path, limit: int = MAX_FILE) -> dict:
    """A JSON object from a regular file of at most ``limit`` bytes, never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MissingFile(f"missing {path}") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BadInput(f"{path} is a symbolic link, expected a regular file: not read") from None
        raise OSError(err.errno, f"cannot read {path}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise BadInput(f"{path} is not a regular file: not read")
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise BadInput(f"{path} is larger than {limit} bytes: not a file the workbench writes")
    data = parse_json(raw, f"corrupt JSON in {path}")
    if not isinstance(data, dict):
        raise BadInput(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_time(value) -> bool:
    return _is_number(value) and 0 <= value <= LATEST


def _is_text(value) -> bool:
    return isinstance(value, str) and "\0" not in value


def _is_pid(value) -> TypeGuard[int]:
    """A pid that names one process other than init: 0 and negative ones address groups of processes."""
    return type(value) is int and 1 < value <= PID_LIMIT


_TIME = Check(float, _is_time, "a time in seconds since the epoch (a finite number from 0 to year 3000)")
_TEXT = Check(str, _is_text, "a string")
_JOB = {  # null stands for an optional field's absence
    "id?": (_TEXT, None),
    "title": _TEXT,
    "argv": Check(list, lambda v: bool(v) and all(map(_is_text, v)), "a non-empty list of strings"),
    "page": _TEXT,
    "outputs": Check(list, lambda v: all(map(_is_text, v)), "a list of strings"),
    "created": _TIME,
    "state": Check(str, lambda v: v in STATES, f"one of {', '.join(STATES)}"),
    "pid?": (Check(int, _is_pid, f"a process id from 2 to {PID_LIMIT}"), None),
    "host?": (_TEXT, None),
    "started?": (_TIME, None),
    "finished?": (_TIME, None),
    "returncode?": (Check(int, lambda v: abs(v) < 1 << 31, "an exit status (a whole number)"), None),
    "reason?": (_TEXT, None),
}
_PROGRESS = {
    "fraction?": (Check(float, lambda v: _is_number(v) and 0 <= v <= 1, "a number from 0 to 1"), None),
    "desc?": (_TEXT, None),
    "what?": (_TEXT, None),
    "updated?": (_TIME, None),
    "n?": (Check(float, lambda v: _is_number(v) and v >= 0, "a count (a number >= 0)"), None),
    "total?": (Check(float, lambda v: _is_number(v) and v > 0, "a total (a number > 0)"), None),
    "unit?": (_TEXT, None),
    "started?": (_TIME, None),
    "milestone?": (Check(int, lambda v: v >= 0, "a whole number >= 0"), None),
}


def _check_job(data: dict, file: Path) -> dict:
    check_shape(data, _JOB, file)
    return data


def _check_progress(data: dict, file: Path) -> dict:
    check_shape(data, _PROGRESS, file)
    return data


def _invalid(path: Path, error: str, *, read: bool = True) -> Job:
    """A job whose ``job.json`` cannot be used, with what its readable fields say (its page, to be
    listed there; its title; when it was made, else when its directory changed)."""
    try:
        raw = _read_object(path / "job.json") if read else {}
    except (BadInput, OSError):
        raw = {}
    try:
        changed = path.lstat().st_mtime
    except OSError:
        changed = 0.0
    return Job(
        id=path.name,
        path=path,
        title=raw["title"] if _is_text(raw.get("title")) else path.name,
        argv=[],
        page=raw["page"] if _is_text(raw.get("page")) else None,
        outputs=[],
        created=raw["created"] if _is_time(raw.get("created")) else changed,
        state="invalid",
        error=error,
    )


# ---- which process is whose ----------------------------------------------------------------------


def _cmdline(pid: int) -> list[str] | None:
    """The argument vector of live process ``pid`` from /proc; None when it is gone, a zombie, or
    cannot be read."""
    proc = PROC / str(pid)
    try:
        status = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        raw = (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    if status in ("Z", "X"):  # exited, not yet reaped: its pid is not free, but nothing runs
        return None
    args = raw.split(b"\0")
    if args and args[-1] == b"":
        args.pop()
    return [os.fsdecode(a) for a in args]


def _same_path(arg: str, path: Path, pid: int) -> bool:
    """Whether ``arg``, a path in process ``pid``'s command line, names ``path``."""
    named = Path(arg)
    if not named.is_absolute():  # relative to that process's working directory, not ours
        try:
            named = Path(os.readlink(PROC / str(pid) / "cwd")) / named
        except OSError:
            return False
    return os.path.realpath(named) == os.path.realpath(path)


def _supervises(cmd: list[str], path: Path, pid: int) -> bool:
    return len(cmd) == 4 and cmd[1:3] == ["-m", "workbench.jobs"] and _same_path(cmd[3], path, pid)


def _verb_args(argv: list[str]) -> list[str]:
    """The verb's command line after the interpreter, as the supervisor starts it."""
    return ["-m", "workbench.cli", *argv]


def _is_supervisor(pid, path: Path, host: str | None) -> bool | None:
    """Whether ``pid`` is this job's supervisor, running (not another process that got its pid);
    None when that cannot be told here: a process on another host, or no /proc to read its command
    line (then it only looks alive)."""
    if not _is_pid(pid):
        return False
    if host is not None and host != socket.gethostname():
        return None
    if not PROC.is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return None
    cmd = _cmdline(pid)
    return cmd is not None and _supervises(cmd, path, pid)


def _orphaned_verb(argv: list[str], outputs: list[str]) -> int | None:
    """The pid of the job's verb, still running after its supervisor died: the holder named by the
    lock record of an output directory (or of the directory an output file is in), on this host,
    whose command line is exactly the verb's."""
    host, seen = socket.gethostname(), set()
    for output in outputs:
        for directory in (Path(output), Path(output).parent):
            lock = directory / LOCK
            if lock in seen:
                continue
            seen.add(lock)
            try:
                record = _read_object(lock)
            except (BadInput, OSError):  # none, released (empty), or not a lock record
                continue
            pid = record.get("pid")
            if record.get("host") == host and _is_pid(pid) and (_cmdline(pid) or [])[1:] == _verb_args(argv):
                return pid
    return None


def _signal(pid, sig: int, proves: Callable[[int, list[str]], bool]) -> bool:
    """Send ``sig`` to ``pid`` if ``proves(pid, its command line)``; False (nothing sent) if not,
    if it is gone, or if there is no /proc to read. With a pidfd the process checked is the one
    signalled, even if it exits and its pid is reused in between."""
    if not _is_pid(pid) or not PROC.is_dir():
        return False
    pidfd = None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfds (not Linux, an old kernel, a sandbox): check, then kill
        pass
    try:
        cmd = _cmdline(pid)
        if cmd is None or not proves(pid, cmd):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return True


# ---- the supervisor ------------------------------------------------------------------------------


def _open_log(path: Path, *, new: bool = False):
    """The job's log, for appending: a regular file with no other name, never what a link points
    at (a planted link would have the verb's output appended to its target) nor a FIFO or device
    (opened without blocking, then refused). ``new``: it must not exist yet."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | (os.O_EXCL if new else 0), 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BadInput(f"{path} is a symbolic link: a job's log is written only to a regular file of its own") from None
        if err.errno == errno.ENXIO:  # a FIFO nobody reads (or a device without its driver)
            raise BadInput(f"{path} is not a regular file: a job's log is written only to a regular file of its own") from None
        raise OSError(err.errno, f"cannot open {path} for the job's log: {err.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "has other names (hard links)" if stat.S_ISREG(info.st_mode) else "is not a regular file"
        raise BadInput(f"{path} {what}: a job's log is written only to a regular file of its own")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, "ab")


def supervise(path: Path) -> int:
    """The supervisor: run the job's verb to its end and record it in ``job.json``."""
    file = path / "job.json"
    try:
        data = _check_job(_read_object(file), file)
    except (BadInput, OSError) as err:  # nothing to run; the readers list the job as invalid
        print(f"workbench.jobs: error: {err}", file=sys.stderr)
        return 2
    cancelled_at: float | None = None
    child: subprocess.Popen | None = None

    def cancel(signum, frame) -> None:
        nonlocal cancelled_at
        cancelled_at = cancelled_at or time.monotonic()
        if child is not None:
            child.send_signal(signal.SIGINT)

    # before the pid is recorded: a cancel that reads it must never meet the default SIGTERM (death)
    signal.signal(signal.SIGTERM, cancel)
    # SIGINT too: an ignored signal survives exec, and a launcher under nohup (or an execnet worker)
    # ignores it; a handled one is reset there, so the verb gets Python's KeyboardInterrupt for its Ctrl-C
    signal.signal(signal.SIGINT, cancel)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    data.update(state="running", pid=os.getpid(), host=socket.gethostname(), started=time.time())
    write_json(file, data)
    env = {**os.environ, PROGRESS_ENV: str(path / "progress.json"), "PYTHONUNBUFFERED": "1"}
    try:
        log = _open_log(path / "log.txt")
    except (BadInput, OSError) as err:
        print(f"workbench.jobs: error: {err}", file=sys.stderr)
        data.update(state="failed", reason=str(err), finished=time.time())
        write_json(file, data)
        return 1
    with log:
        child = subprocess.Popen(
            [sys.executable, *_verb_args(data["argv"])], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
        )
        if cancelled_at is not None:  # cancelled while it was being started
            child.send_signal(signal.SIGINT)
        while True:
            try:
                returncode = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if cancelled_at is not None and time.monotonic() - cancelled_at > STOP_GRACE:
                    child.kill()
    state = "cancelled" if cancelled_at is not None else "done" if returncode == 0 else "failed"
    data.update(state=state, returncode=returncode, finished=time.time())
    write_json(file, data)
    return 0


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
