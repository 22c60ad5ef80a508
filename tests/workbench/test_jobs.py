"""Background jobs: a verb run by a detached supervisor whose state is on disk; it outlives the
process that started it, reports progress, and ends as done, failed, cancelled or lost."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.jobs import cancel_job, list_jobs, read_job, start_job
from workbench.runtime.progress import PROGRESS_ENV, Bar
from workbench.storage.files import read_json

TRAIN = ["train", "--arch", "baseline", "--preset", "debug", "--task", "mix", "--no-progress"]


def wait(job, until, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        job = read_job(job.path)
        if until(job):
            return job
        assert time.monotonic() < deadline, (job.state, job.log_tail())
        time.sleep(0.1)


def test_a_job_runs_its_verb_and_records_the_end_and_the_summary(tmp_path):
    job = start_job(tmp_path, ["presets"], title="list presets", page="p", outputs=[str(tmp_path / "x")])
    assert job.state in ("starting", "running") and job.running and job.path.parent == tmp_path / ".jobs"
    job = wait(job, lambda j: not j.running)
    assert (job.state, job.returncode) == ("done", 0), job.log_tail()
    assert "tiny" in job.log_tail() and job.result() is not None  # its --json summary
    assert job.finished >= job.created and job.outputs == [str(tmp_path / "x")]
    assert [j.id for j in list_jobs(tmp_path, "p")] == [job.id] and list_jobs(tmp_path, "other") == []


def test_a_failing_verb_is_a_failed_job_with_its_error_in_the_log(tmp_path):
    job = wait(start_job(tmp_path, ["eval", str(tmp_path / "nothing")], title="eval"), lambda j: not j.running)
    assert (job.state, job.returncode) == ("failed", 2)
    assert "workbench eval: error:" in job.log_tail() and str(tmp_path / "nothing") in job.log_tail()
    assert job.result() is None


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
    assert read_json(path) | {"updated": 0} == {"desc": "phase", "fraction": 0.7, "what": "three", "updated": 0}


def test_a_job_started_here_lists_with_the_newest_first(tmp_path):
    jobs = [start_job(tmp_path, ["presets"], title=str(i)) for i in range(2)]
    assert [j.title for j in list_jobs(tmp_path)] == ["1", "0"]
    (tmp_path / ".jobs" / "junk").mkdir()  # not a job: skipped
    assert len(list_jobs(tmp_path)) == 2
    for job in jobs:
        wait(job, lambda j: not j.running)
    assert Path(jobs[0].path / "log.txt").is_file()
