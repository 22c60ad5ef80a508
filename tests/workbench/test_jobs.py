"""Background jobs: a verb run by a detached supervisor whose state is on disk; it outlives the
process that started it, reports progress, and ends as done, failed, cancelled or lost."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_nothing_lost, snapshot, tally

import workbench.jobs
from workbench.jobs import cancel_job, list_jobs, read_job, start_job
from workbench.runtime.progress import PROGRESS_ENV, Bar
from workbench.storage.errors import BadInput
from workbench.storage.files import read_json, write_json

TRAIN = ["train", "--arch", "baseline", "--preset", "debug", "--task", "mix", "--no-progress"]


def wait(job, until, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        job = read_job(job.path)
        if until(job):
            return job
        assert time.monotonic() < deadline, (job.state, job.log_tail())
        time.sleep(0.1)


@pytest.mark.slow
def test_a_job_runs_its_verb_and_records_the_end_and_the_summary(tmp_path):
    job = start_job(tmp_path, ["presets"], title="list presets", page="p", outputs=[str(tmp_path / "x")])
    assert job.state in ("starting", "running") and job.running and job.path.parent == tmp_path / ".jobs"
    job = wait(job, lambda j: not j.running)
    assert (job.state, job.returncode) == ("done", 0), job.log_tail()
    assert "tiny" in job.log_tail() and job.result() is not None  # its --json summary
    assert job.finished >= job.created and job.outputs == [str(tmp_path / "x")]
    assert [j.id for j in list_jobs(tmp_path, "p")] == [job.id] and list_jobs(tmp_path, "other") == []


@pytest.mark.slow
def test_a_failing_verb_is_a_failed_job_with_its_error_in_the_log(tmp_path):
    job = wait(start_job(tmp_path, ["eval", str(tmp_path / "nothing")], title="eval"), lambda j: not j.running)
    assert (job.state, job.returncode) == ("failed", 2)
    assert "workbench eval: error:" in job.log_tail() and str(tmp_path / "nothing") in job.log_tail()
    assert job.result() is None


@pytest.mark.slow
def test_a_job_outlives_the_process_that_started_it_and_reports_progress(tmp_path):
    """The starting process exits at once (as a browser session or app server may); the job goes
    on, its progress file fills, and it finishes."""
    run = tmp_path / "run"
    script = (
        "import sys; from workbench.jobs import start_job; "
        f"start_job({str(tmp_path)!r}, {[*TRAIN, '--set', 'train.steps=30', '--out', str(run)]!r}, title='t')"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    (job,) = list_jobs(tmp_path)
    job = wait(job, lambda j: not j.running, timeout=300)
    assert job.state == "done", job.log_tail()
    assert job.progress["fraction"] == 1.0 and job.progress["desc"] == "baseline run"
    assert (run / "model.safetensors").is_file()


@pytest.mark.slow
def test_cancel_stops_the_verb_cleanly_and_a_killed_supervisor_is_lost(tmp_path):
    run = tmp_path / "run"
    job = start_job(tmp_path, [*TRAIN, "--set", "train.steps=100000", "--out", str(run)], title="long")
    job = wait(job, lambda j: j.progress.get("fraction") is not None, timeout=300)  # training, not starting
    assert cancel_job(job)
    job = wait(job, lambda j: not j.running, timeout=120)
    assert job.state == "cancelled" and "KeyboardInterrupt" in job.log_tail()
    assert not cancel_job(job)  # over: nothing to cancel
    assert not [p for p in run.iterdir() if p.name.startswith(".staging")]  # the verb cleaned up what it staged
    # a supervisor killed outright never records an end: the job reads as lost, not running forever
    job = start_job(tmp_path, [*TRAIN, "--set", "train.steps=100000", "--out", str(tmp_path / "run2")], title="killed")
    job = wait(job, lambda j: j.state == "running")
    os.killpg(job.pid, signal.SIGKILL)
    job = wait(job, lambda j: not j.running)
    assert job.state == "lost" and read_json(job.path / "job.json")["state"] == "running"


@pytest.mark.slow
def test_a_job_started_where_ctrl_c_is_ignored_is_still_cancelled_cleanly(tmp_path):
    """A launcher run under ``nohup`` (or in an execnet worker) ignores SIGINT, and an ignored
    signal survives exec: unless the supervisor takes SIGINT back, the verb never gets its Ctrl-C
    and a cancel ends in a kill, leaving what the verb staged."""
    run = tmp_path / "run"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        job = start_job(tmp_path, [*TRAIN, "--set", "train.steps=100000", "--out", str(run)], title="nohup")
    finally:
        signal.signal(signal.SIGINT, previous)
    job = wait(job, lambda j: j.progress.get("fraction") is not None, timeout=300)
    assert cancel_job(job)
    job = wait(job, lambda j: not j.running, timeout=120)
    assert job.state == "cancelled" and "KeyboardInterrupt" in job.log_tail(), job.log_tail()
    assert not [p for p in run.iterdir() if p.name.startswith(".staging")]


@pytest.mark.slow
def test_a_job_directory_is_never_reused_and_bad_argv_is_refused(tmp_path):
    a = start_job(tmp_path, ["presets"], title="a")
    b = start_job(tmp_path, ["presets"], title="b")
    assert a.path != b.path and {a.path, b.path} == set((tmp_path / ".jobs").iterdir())
    with pytest.raises(ValueError, match="job argv"):
        start_job(tmp_path, [], title="nothing")
    for job in (a, b):
        wait(job, lambda j: not j.running)


def test_the_progress_bar_writes_the_job_file_only_when_asked(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    with Bar("phase", 10, show=False) as bar:
        bar.update(3, "three")
    assert not path.exists()
    monkeypatch.setenv(PROGRESS_ENV, str(path))
    with Bar("phase", 10, show=False) as bar:
        bar.update(3, "three")
        assert read_json(path)["fraction"] == 0.3
        bar.advance(4)  # within the write interval: not yet on disk
        assert read_json(path)["fraction"] == 0.3
    written = read_json(path)
    assert written["started"] <= written["updated"]
    assert written | {"updated": 0, "started": 0} == {
        "desc": "phase",
        "fraction": 0.7,
        "what": "three",
        "updated": 0,
        "n": 7,
        "total": 10,
        "unit": "it",
        "started": 0,
        "milestone": 0,
    }


@pytest.mark.slow
def test_a_job_started_here_lists_with_the_newest_first(tmp_path):
    jobs = [start_job(tmp_path, ["presets"], title=str(i)) for i in range(2)]
    assert [j.title for j in list_jobs(tmp_path)] == ["1", "0"]
    (tmp_path / ".jobs" / "junk").mkdir()  # not a job: skipped
    assert len(list_jobs(tmp_path)) == 2
    for job in jobs:
        wait(job, lambda j: not j.running)
    assert Path(jobs[0].path / "log.txt").is_file()


# Hostile job files: a job directory's files are read as untrusted. A bad
# field is an invalid job naming the file and the field, never an exception in a reader; a process is
# signalled only when its command line proves it is the job's supervisor or verb; no file is read or
# appended to through a planted link.

COUNTS = tally("the app and its jobs")


@pytest.fixture
def signals(monkeypatch):
    """Every signal the code under test sends, recorded instead of sent: a regression must not be
    able to signal pid -1 (every process the user may signal) or 0 (the test's process group)."""
    sent = []

    def record(*args):
        sent.append(args)

    monkeypatch.setattr(os, "kill", record)
    monkeypatch.setattr(os, "killpg", record)
    monkeypatch.setattr(signal, "pidfd_send_signal", record, raising=False)
    return sent


def plant(root: Path, name: str = "planted", **fields) -> Path:
    """A job directory as the supervisor leaves a finished ``presets`` job, with ``fields`` replaced."""
    path = root / ".jobs" / name
    path.mkdir(parents=True)
    record = {
        "id": name,
        "title": f"job {name}",
        "argv": ["presets", "--json", str(path / "result.json")],
        "page": "p",
        "outputs": [str(root / "out")],
        "created": time.time(),
        "state": "done",
        "returncode": 0,
        "finished": time.time(),
    }
    write_json(path / "job.json", record | fields)
    (path / "log.txt").write_text("the verb's output\n")
    return path


@pytest.mark.parametrize("pid", [-1, 0, 1, -os.getpid(), 2**80, 2**31, True, 1.5, "123"])
def test_cancel_never_signals_a_pid_that_is_not_one_process_other_than_init(tmp_path, signals, pid):
    plant(tmp_path, state="running", pid=pid)
    (job,) = list_jobs(tmp_path)
    assert (job.state, job.running, job.cancellable) == ("invalid", False, False)
    assert str(job.path / "job.json") in job.error and "'pid'" in job.error
    assert not cancel_job(job)
    # a job made by hand, not read from disk, is refused the same way
    assert not cancel_job(dataclasses.replace(job, state="running", pid=pid, error=None))
    assert not cancel_job(dataclasses.replace(job, state="orphaned", verb_pid=pid, error=None))
    assert signals == []  # not even signal 0 reaches such a pid
    COUNTS["inputs_tried"] += 1
    COUNTS["faults_injected"] += 1


def test_a_live_process_that_is_not_the_supervisor_is_never_signalled(tmp_path, signals, monkeypatch):
    """The pid a job records may be reused by any process once the supervisor is gone: here it is
    the test's own. With /proc its command line shows it is not the supervisor (the job is lost);
    without /proc nothing proves it is, so the job shows as running but cannot be cancelled."""
    plant(tmp_path, state="running", pid=os.getpid())
    (job,) = list_jobs(tmp_path)
    assert job.state == "lost" and not cancel_job(job)
    assert not cancel_job(dataclasses.replace(job, state="running"))
    monkeypatch.setattr(workbench.jobs, "PROC", tmp_path / "no-proc")
    (job,) = list_jobs(tmp_path)
    assert (job.state, job.unverified, job.cancellable) == ("running", True, False)
    assert not cancel_job(job)
    assert all(sig == 0 for _, sig in signals) and {p for p, _ in signals} <= {os.getpid()}
    COUNTS["inputs_tried"] += 2
    COUNTS["faults_injected"] += 2


MALFORMED_JOBS = [
    ("created", "yesterday"),
    ("created", None),
    ("created", float("nan")),
    ("created", -1.0),
    ("argv", 5),
    ("argv", []),
    ("argv", ["presets", "a\0b"]),
    ("outputs", None),
    ("outputs", [3]),
    ("finished", 1e20),
    ("finished", float("inf")),
    ("started", "now"),
    ("state", "bogus"),
    ("title", 5),
    ("returncode", "0"),
    ("returncode", 2**80),
    ("reason", ["x"]),
]


@pytest.mark.parametrize(("name", "value"), MALFORMED_JOBS, ids=lambda v: repr(v)[:20])
def test_a_job_file_with_a_bad_field_is_listed_as_invalid_naming_the_file_and_the_field(tmp_path, signals, name, value):
    path = plant(tmp_path, **{name: value})
    with pytest.raises(BadInput, match=f"'{name}'"):
        read_job(path)
    (job,) = list_jobs(tmp_path, "p")
    assert (job.state, job.running, job.title) == ("invalid", False, "job planted" if name != "title" else "planted")
    assert job.error.startswith(f"{path / 'job.json'}: field '{name}'"), job.error
    assert "\n" not in job.error and job.created > 0  # one line; sorted by when its directory changed
    assert list_jobs(tmp_path, "other") == []  # its page could be read: listed there only
    assert not cancel_job(job) and signals == []
    COUNTS["inputs_tried"] += 1
    COUNTS["faults_injected"] += 1


def test_a_job_file_that_cannot_be_read_is_listed_as_invalid_on_every_page(tmp_path):
    outside = tmp_path / "elsewhere.json"
    write_json(outside, {"title": "not a job"})
    cases = {
        "page": lambda p: write_json(p / "job.json", read_json(p / "job.json") | {"page": ["p"]}),
        "corrupt": lambda p: (p / "job.json").write_text("{not json"),
        "array": lambda p: (p / "job.json").write_text("[1, 2]"),
        "huge": lambda p: (p / "job.json").write_text(" " * (workbench.jobs.MAX_FILE + 1) + "{}"),
        "link": lambda p: ((p / "job.json").unlink(), (p / "job.json").symlink_to(outside)),
        "fifo": lambda p: ((p / "job.json").unlink(), os.mkfifo(p / "job.json")),  # read without blocking
    }
    for name, damage in cases.items():
        damage(plant(tmp_path, name))
    (tmp_path / ".jobs" / "linked").symlink_to(plant(tmp_path / "other", "real"), target_is_directory=True)
    (tmp_path / ".jobs" / "a-file").write_text("not a job directory")  # neither a job nor an error: skipped
    jobs = {j.id: j for j in list_jobs(tmp_path, "some page")}
    assert set(jobs) == {*cases, "linked"}
    assert all(j.state == "invalid" and j.page is None and str(j.path) in j.error for j in jobs.values())
    assert "'page'" in jobs["page"].error and "corrupt JSON" in jobs["corrupt"].error
    assert "symbolic link" in jobs["link"].error and "symbolic link" in jobs["linked"].error
    assert "not a regular file" in jobs["fifo"].error and "larger than" in jobs["huge"].error
    assert jobs["page"].title == "job page"  # what can be read is shown
    COUNTS["inputs_tried"] += len(cases) + 1
    COUNTS["faults_injected"] += len(cases) + 1


MALFORMED_PROGRESS = [
    ({"fraction": 7.5}, "'fraction'"),
    ({"fraction": "half"}, "'fraction'"),
    ({"fraction": -0.1}, "'fraction'"),
    ({"fraction": float("nan")}, "'fraction'"),
    ({"fraction": True}, "'fraction'"),
    ({"desc": 5}, "'desc'"),
    ({"what": {"a": 1}}, "'what'"),
    ({"updated": 1e20}, "'updated'"),
]


@pytest.mark.parametrize(("progress", "named"), MALFORMED_PROGRESS, ids=lambda v: repr(v)[:24])
def test_a_bad_progress_file_is_an_error_of_its_job_not_a_progress(tmp_path, progress, named):
    path = plant(tmp_path, state="starting", created=time.time())  # running as far as readers can tell
    write_json(path / "progress.json", {"desc": "phase", "fraction": 0.5, "what": "", "updated": time.time()} | progress)
    (job,) = list_jobs(tmp_path)
    assert job.running and job.progress == {}
    assert job.progress_error.startswith(f"{path / 'progress.json'}: field {named}"), job.progress_error
    COUNTS["inputs_tried"] += 1
    COUNTS["faults_injected"] += 1


def test_progress_and_result_files_are_never_read_through_a_link(tmp_path):
    secret = tmp_path / "secret.json"
    write_json(secret, {"fraction": 0.25, "desc": "someone else's file"})
    path = plant(tmp_path)
    (path / "progress.json").symlink_to(secret)
    (path / "result.json").symlink_to(secret)
    (job,) = list_jobs(tmp_path)
    assert job.state == "done" and job.progress == {} and "symbolic link" in job.progress_error
    with pytest.raises(BadInput, match="symbolic link"):
        job.result()
    COUNTS["inputs_tried"] += 2
    COUNTS["faults_injected"] += 2


def test_the_log_tail_never_reads_through_a_link_or_blocks_on_a_fifo(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("a file the job never wrote\n")
    linked, fifo = plant(tmp_path, "linked"), plant(tmp_path, "fifo")
    (linked / "log.txt").unlink()
    (linked / "log.txt").symlink_to(secret)
    (fifo / "log.txt").unlink()
    os.mkfifo(fifo / "log.txt")
    jobs = {j.id: j for j in list_jobs(tmp_path)}
    assert jobs["linked"].log_tail() == f"({linked / 'log.txt'} not read: a symbolic link)"
    assert jobs["fifo"].log_tail() == f"({fifo / 'log.txt'} not read: not a regular file)"
    assert plant(tmp_path, "plain") and read_job(tmp_path / ".jobs" / "plain").log_tail(7) == "output\n"
    COUNTS["inputs_tried"] += 2
    COUNTS["faults_injected"] += 2


def supervise_planted(path: Path) -> subprocess.CompletedProcess:
    """The supervisor, as ``start_job`` starts it, on a job directory planted by hand."""
    write_json(path / "job.json", read_json(path / "job.json") | {"state": "starting", "created": time.time()})
    return subprocess.run(
        [sys.executable, "-m", "workbench.jobs", str(path)], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.slow
def test_the_supervisor_appends_only_to_a_log_of_its_own(tmp_path):
    """A log.txt that is a link (or a FIFO, or another name of someone's file) is refused with one
    line naming it; the job ends as failed with that reason, and the file it pointed at is intact."""
    victims = tmp_path / "victims"
    victims.mkdir()
    (victims / "target.txt").write_text("not the job's\n")
    (victims / "linked.txt").write_text("not the job's either\n")
    before = snapshot(victims)
    cases = {
        "symlink": (lambda log: log.symlink_to(victims / "target.txt"), "is a symbolic link"),
        "hardlink": (lambda log: os.link(victims / "linked.txt", log), "has other names (hard links)"),
        "fifo": (os.mkfifo, "is not a regular file"),
        "directory": (lambda log: log.mkdir(), "cannot open"),
    }
    for name, (plant_log, message) in cases.items():
        path = plant(tmp_path, name)
        (path / "log.txt").unlink()
        plant_log(path / "log.txt")
        done = supervise_planted(path)
        job = read_job(path)
        log = path / "log.txt"
        assert (job.state, job.running) == ("failed", False), (name, job.state, done.stderr)
        assert str(log) in job.reason and message in job.reason, (name, job.reason)
        (line,) = done.stderr.splitlines()
        assert line == f"workbench.jobs: error: {job.reason}" and done.returncode == 1
        assert not (path / "result.json").exists()  # the verb never ran
    assert_nothing_lost(before, snapshot(victims), COUNTS)
    COUNTS["inputs_tried"] += len(cases)
    COUNTS["faults_injected"] += len(cases)
    # the same supervisor on a plain log runs the verb and appends to it
    path = plant(tmp_path, "plain")
    assert supervise_planted(path).returncode == 0
    job = read_job(path)
    assert job.state == "done" and job.reason is None and "tiny" in job.log_tail()
    assert job.log_tail().startswith("the verb's output\n")  # appended, not replaced


def test_a_planted_jobs_directory_link_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "runs"
    root.mkdir()
    (root / ".jobs").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(BadInput, match="symbolic link"):
        start_job(root, ["presets"], title="through a link")
    assert list(elsewhere.iterdir()) == []
    COUNTS["inputs_tried"] += 1
    COUNTS["faults_injected"] += 1


def test_a_lock_record_that_is_not_the_verbs_makes_no_orphan(tmp_path, signals):
    """When the supervisor is gone the verb is looked for by the lock records of the job's outputs:
    a record naming a process whose command line is not the verb's, pid -1, or another host is
    not the verb, and nothing is signalled."""
    import socket

    out = tmp_path / "out"
    out.mkdir()
    path = plant(tmp_path, state="running", pid=None, outputs=[str(out / "report.json"), str(out)])
    for record in [
        {"pid": os.getpid(), "host": socket.gethostname()},  # alive, on this host, but not the verb
        {"pid": -1, "host": socket.gethostname()},
        {"pid": 0, "host": socket.gethostname()},
        {"pid": os.getpid(), "host": "another-host"},
        {"pid": "1", "host": socket.gethostname()},
    ]:
        (out / ".workbench.lock").write_text(json.dumps(record))
        job = read_job(path)
        assert (job.state, job.verb_pid) == ("lost", None), record
        assert not cancel_job(job)
        COUNTS["inputs_tried"] += 1
        COUNTS["faults_injected"] += 1
    assert signals == []


def exited(pid: int) -> bool:
    """Whether ``pid`` has ended: gone, or a zombie (an orphan's new parent may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_a_verb_that_outlives_its_killed_supervisor_is_found_by_its_lock_and_cancelled(tmp_path):
    """The supervisor is killed alone (not its process group): the verb still runs and holds the run
    directory. The job is orphaned, not lost, and Cancel gives the verb its Ctrl-C, after which it
    has cleaned up and the job is lost."""
    run = tmp_path / "run"
    job = start_job(tmp_path, [*TRAIN, "--set", "train.steps=100000", "--out", str(run)], title="orphan", outputs=[str(run)])
    job = wait(job, lambda j: j.progress.get("fraction") is not None, timeout=300)  # training: the verb holds run/
    supervisor = job.pid
    verb = json.loads((run / ".workbench.lock").read_text())["pid"]
    try:
        os.kill(supervisor, signal.SIGKILL)
        job = wait(job, lambda j: j.state != "running")
        assert job.state == "orphaned" and job.running and job.cancellable, job.state
        assert job.verb_pid == verb != supervisor
        cmdline = Path(f"/proc/{verb}/cmdline").read_bytes().decode().split("\0")[:-1]
        assert cmdline[1:] == ["-m", "workbench.cli", *job.argv]
        assert cancel_job(job)
        job = wait(job, lambda j: not j.running, timeout=120)
        # the verb released the run directory first, then writes its traceback and exits: a kill
        # before that would cut its log (CI's busy machine met it), so it is given its time
        deadline = time.monotonic() + 60
        while not exited(verb) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:  # a failure must not leave a training verb running
        if not exited(verb) and str(run) in Path(f"/proc/{verb}/cmdline").read_text(errors="replace"):
            os.kill(verb, signal.SIGKILL)
            raise AssertionError(f"the verb {verb} was still running and was killed")
    assert job.state == "lost"  # the verb released the run directory: it no longer holds the job's outputs
    assert "KeyboardInterrupt" in job.log_tail()
    assert not [p for p in run.iterdir() if p.name.startswith(".staging")]  # the verb cleaned up what it staged
    assert (run / ".workbench.lock").read_text() == ""  # released
    assert not cancel_job(job)
    COUNTS["inputs_tried"] += 1
    COUNTS["faults_injected"] += 1
