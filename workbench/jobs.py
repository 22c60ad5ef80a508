"""Background jobs: a CLI verb run as a detached subprocess whose state lives on disk, so that it
outlives the browser tab (or the app) that started it and any page can show it.

A job is a directory ``ROOT/.jobs/ID/`` holding

- ``job.json``: what runs (``argv`` of ``workbench``), for which ``page``, the ``outputs`` it
  writes, and its ``state``: ``starting`` -> ``running`` -> ``done`` | ``failed`` | ``cancelled``;
  ``lost`` is read, never written: the supervisor is gone without recording an end (killed);
- ``log.txt``: the verb's standard output and error;
- ``progress.json``: the verb's latest progress (``workbench.runtime.progress.Bar``), when it reports one;
- ``result.json``: the verb's summary (its ``--json``), when it finished.

``start_job`` creates the directory and starts a supervisor, ``python -m workbench.jobs DIR``,
in a session of its own (a closed tab, a stopped app server or a Ctrl-C in its terminal does not
reach it). The supervisor runs the verb, records its pid and end, and turns a cancel (SIGTERM to
the supervisor, ``cancel_job``) into a Ctrl-C of the verb, so the verb cleans up what it staged.
Only the supervisor writes ``job.json`` once it runs; readers never write it.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.runtime.progress import PROGRESS_ENV
from workbench.storage.errors import BadInput
from workbench.storage.files import read_json, write_json

JOBS_DIR = ".jobs"
FINISHED = ("done", "failed", "cancelled", "lost")
START_GRACE = 60.0  # seconds a job may stay ``starting`` before a dead supervisor makes it ``lost``
STOP_GRACE = 30.0  # seconds a cancelled verb has to clean up after its Ctrl-C before it is killed
_children: dict[str, subprocess.Popen] = {}  # supervisors started by this process, reaped when listed


@dataclass
class Job:
    id: str
    path: Path
    title: str
    argv: list[str]
    page: str
    outputs: list[str]
    created: float
    state: str
    pid: int | None = None
    returncode: int | None = None
    finished: float | None = None
    progress: dict = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.state not in FINISHED

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the verb's log (its last ``chars`` characters)."""
        path = self.path / "log.txt"
        if not path.is_file():
            return ""
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - chars))
            return f.read().decode("utf-8", errors="replace")

    def result(self) -> dict | None:
        """The verb's ``--json`` summary once it is done, else None."""
        path = self.path / "result.json"
        return read_json(path) if self.state == "done" and path.is_file() else None


def jobs_dir(root: str | Path) -> Path:
    return Path(root) / JOBS_DIR


def start_job(root: str | Path, argv: list[str], *, title: str, page: str = "", outputs: list[str] | None = None) -> Job:
    """Start ``workbench ARGV --json DIR/result.json`` as a background job under ``root``; returns it
    at once (``starting``)."""
    if not argv or not all(isinstance(a, str) for a in argv):
        raise BadInput(f"job argv {argv!r}: expected a workbench verb and its arguments as strings")
    base = jobs_dir(root)
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
    with (path / "log.txt").open("ab") as log:
        _children[job_id] = subprocess.Popen(
            [sys.executable, "-m", "workbench.jobs", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return read_job(path)


def read_job(path: str | Path) -> Job:
    """The job in directory ``path`` as its files say, ``lost`` if its supervisor is gone without
    having recorded an end."""
    path = Path(path)
    data = read_json(path / "job.json")
    child = _children.get(path.name)
    if child is not None and child.poll() is not None:  # reap it (and re-read: it wrote its end first)
        _children.pop(path.name, None)
        data = read_json(path / "job.json")
    state = data.get("state", "lost")
    if state == "running" and not _alive(data.get("pid"), path):
        state = "lost"
    elif state == "starting" and time.time() - data.get("created", 0) > START_GRACE and child is None:
        state = "lost"
    progress = {}
    if (path / "progress.json").is_file():
        try:
            progress = read_json(path / "progress.json")
        except (BadInput, OSError):  # being replaced: the next read gets it
            progress = {}
    return Job(
        id=data.get("id", path.name),
        path=path,
        title=data.get("title", path.name),
        argv=list(data.get("argv", [])),
        page=data.get("page", ""),
        outputs=list(data.get("outputs", [])),
        created=float(data.get("created", 0.0)),
        state=state,
        pid=data.get("pid"),
        returncode=data.get("returncode"),
        finished=data.get("finished"),
        progress=progress,
    )


def list_jobs(root: str | Path, page: str | None = None) -> list[Job]:
    """The jobs under ``root`` (for ``page``), newest first; a directory without a readable
    ``job.json`` is skipped."""
    base = jobs_dir(root)
    if not base.is_dir():
        return []
    jobs = []
    for path in base.iterdir():
        try:
            job = read_job(path)
        except (BadInput, OSError):
            continue
        if page is None or job.page == page:
            jobs.append(job)
    return sorted(jobs, key=lambda j: j.created, reverse=True)


def cancel_job(job: Job) -> bool:
    """Ask a running job to stop (its verb gets a Ctrl-C); False if it is not running."""
    if not job.running or job.pid is None or not _alive(job.pid, job.path):
        return False
    os.kill(job.pid, signal.SIGTERM)
    return True


def _alive(pid: int | None, path: Path) -> bool:
    """Whether ``pid`` is this job's supervisor, running (not another process that got its pid)."""
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():  # no /proc (not Linux): the signal check is all there is
        return True
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
            return False
        return str(path) in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False


def supervise(path: Path) -> int:
    """The supervisor: run the job's verb to its end and record it in ``job.json``."""
    data = read_json(path / "job.json")
    data.update(state="running", pid=os.getpid(), started=time.time())
    write_json(path / "job.json", data)
    env = {**os.environ, PROGRESS_ENV: str(path / "progress.json"), "PYTHONUNBUFFERED": "1"}
    cancelled_at: float | None = None
    with (path / "log.txt").open("ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", *data["argv"]], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
        )

        def cancel(signum, frame) -> None:
            nonlocal cancelled_at
            cancelled_at = cancelled_at or time.monotonic()
            child.send_signal(signal.SIGINT)

        signal.signal(signal.SIGTERM, cancel)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        while True:
            try:
                returncode = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if cancelled_at is not None and time.monotonic() - cancelled_at > STOP_GRACE:
                    child.kill()
    state = "cancelled" if cancelled_at is not None else "done" if returncode == 0 else "failed"
    data.update(state=state, returncode=returncode, finished=time.time())
    write_json(path / "job.json", data)
    return 0


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
