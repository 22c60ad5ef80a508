"""Guarantee: a second writer on one output is refused, naming the holder (PID, command, host).

The lock itself (``workbench.storage.outputs.hold``) is held by a second process; concurrent
writers are real ``workbench`` processes: the first one is frozen with SIGSTOP as soon as it holds
its output directory, so the second one meets it deterministically; it is then continued, or killed
to leave a stale lock behind. Every case counts in the tally's class "concurrent writers"."""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import assert_nothing_lost, assert_usage_error, cli, snapshot, tally

from workbench import load_model
from workbench.probing.store import load_store
from workbench.storage.errors import OutputBusy
from workbench.storage.outputs import LOCK, hold
from workbench.training.metrics import read_metrics

CONCURRENT = tally("concurrent writers")
FAST = ["train.batch_size=4", "train.seq_len=32", "train.warmup=3", "train.log_every=1", "data.n_train=300"]
SETS = [a for s in FAST for a in ("--set", s)]
HOLDER = "import sys; from workbench.storage.outputs import hold\nwith hold(sys.argv[1]):\n    print('held', flush=True); sys.stdin.readline()"


def holder_record(directory: Path) -> dict:
    text = (directory / LOCK).read_text() if (directory / LOCK).exists() else ""
    return json.loads(text) if text.strip() else {}


def start_holding(argv: list[str], directory: Path, timeout: float = 120.0) -> subprocess.Popen:
    """Start ``workbench ARGV`` and freeze it (SIGSTOP) the moment it holds ``directory``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    deadline = time.monotonic() + timeout
    while holder_record(directory).get("pid") != proc.pid:
        if proc.poll() is not None:
            raise AssertionError(f"{argv} ended before holding {directory}: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{argv} did not hold {directory} within {timeout} s")
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGSTOP)
    return proc


def finish(proc: subprocess.Popen, *, kill: bool = False) -> int:
    if kill:
        proc.kill()
    else:
        os.kill(proc.pid, signal.SIGCONT)
    return proc.wait(timeout=600)


# ---- the lock itself -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_held_directory_names_its_holder_to_a_second_process(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "out"), "--some-flag"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "held\n"
        CONCURRENT["faults_injected"] += 1
        with pytest.raises(
            OutputBusy, match=rf"{tmp_path / 'out'} is being written by PID {proc.pid} \(-c .*--some-flag\) on .* since "
        ):
            with hold(tmp_path / "out"):
                pass
    finally:
        proc.communicate("\n", timeout=60)
    assert holder_record(tmp_path / "out") == {}  # released: an empty lock file
    with hold(tmp_path / "out"):
        assert holder_record(tmp_path / "out")["pid"] == os.getpid()


@pytest.mark.slow
def test_a_lock_left_by_a_killed_process_is_taken_over_and_reported(tmp_path, caplog):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "out")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "held\n"
    proc.kill()
    proc.wait()
    CONCURRENT["faults_injected"] += 1
    assert holder_record(tmp_path / "out")["pid"] == proc.pid  # the dead holder's record stays behind
    with caplog.at_level(logging.WARNING, logger="workbench.storage.outputs"), hold(tmp_path / "out"):
        assert holder_record(tmp_path / "out")["pid"] == os.getpid()
    assert f"took over a stale lock of PID {proc.pid}" in caplog.text and "no longer running" in caplog.text


def test_the_lock_is_reentrant_in_one_thread_and_exclusive_between_threads(tmp_path):
    errors = []
    with hold(tmp_path / "out"), hold(tmp_path / "out"):  # nested: the same writer
        thread = threading.Thread(target=lambda: errors.append(_try_hold(tmp_path / "out")))
        thread.start()
        thread.join()
    assert len(errors) == 1 and "another thread of this process" in errors[0]
    assert _try_hold(tmp_path / "out") is None  # released once the outer hold ends


def _try_hold(path):
    try:
        with hold(path):
            return None
    except OutputBusy as err:
        return str(err)


# ---- concurrent writers: real processes -----------------------------------------------------


def train_argv(arch: str, out: Path, steps: int = 400, every: int = 10) -> list[str]:
    return [
        "train",
        "--arch",
        arch,
        "--out",
        str(out),
        "--no-progress",
        *SETS,
        "--set",
        f"train.steps={steps}",
        "--set",
        f"train.checkpoint_every={every}",
    ]


@pytest.mark.slow
def test_two_trainings_into_one_directory_one_resume_and_a_stale_lock(tmp_path, caplog):
    """The reported bug: two `train` of different archs into one new directory both exited 0 and
    interleaved their metrics. Now the second names the first; so does a concurrent --resume; a
    SIGKILL leaves a stale lock that the next --resume takes over, and the metrics stay one run's."""
    run = tmp_path / "run"
    first = start_holding(train_argv("fbt", run), run)
    try:
        CONCURRENT["faults_injected"] += 1
        assert_usage_error(train_argv("baseline", run), f"is being written by PID {first.pid}", "train --arch fbt")
        CONCURRENT["faults_injected"] += 1
        os.kill(first.pid, signal.SIGCONT)
        deadline = time.monotonic() + 120
        while not (run / "train_state" / "state.json").exists():  # let it commit a checkpoint
            assert first.poll() is None and time.monotonic() < deadline, "the first training ended or stalled"
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGSTOP)
        assert_usage_error(["train", "--out", str(run), "--resume", "--no-progress"], f"is being written by PID {first.pid}")
    finally:
        finish(first, kill=True)
    CONCURRENT["faults_injected"] += 1
    with caplog.at_level(logging.WARNING, logger="workbench.storage.outputs"):
        code, _, err = cli(["train", "--out", str(run), "--resume", "--no-progress", "--stop-after", "3"])
    assert code is None, err
    assert f"took over a stale lock of PID {first.pid}" in caplog.text
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    assert steps == list(range(1, steps[-1] + 1))  # one run's lines, no step twice
    assert load_model(run).arch == "fbt"


@pytest.mark.slow
def test_two_caches_into_one_store_do_not_mix(tmp_path):
    """The reported bug: two `cache` into one --out published a store mixing two models' shards."""
    store = tmp_path / "store"
    argv = [
        "cache",
        "fbt:debug:1",
        "--hooks",
        "blocks.0.hook_resid_pre",
        "--task",
        "modsum",
        "--n",
        "400",
        "--out",
        str(store),
    ]
    first = start_holding(argv, store)
    try:
        CONCURRENT["faults_injected"] += 1
        assert_usage_error(
            ["cache", "baseline:debug", "--hooks", "hook_embed", "--task", "flipflop", "--n", "8", "--out", str(store)],
            f"is being written by PID {first.pid}",
            "cache fbt:debug:1",
        )
    finally:
        assert finish(first) == 0
    ds, meta = load_store(store)
    assert meta["arch"] == "fbt" and meta["hooks"] == ["blocks.0.hook_resid_pre"] and len(ds) == meta["n_rows"]
    assert sorted(set(ds["seq"])) == list(range(400))


@pytest.mark.slow
def test_two_zoos_into_one_directory(tmp_path):
    zoo = tmp_path / "zoo"
    first = start_holding(["zoo", "--preset", "micro", "--out", str(zoo), "--no-progress"], zoo)
    try:
        before = snapshot(zoo)
        CONCURRENT["faults_injected"] += 1
        assert_usage_error(
            ["zoo", "--preset", "micro", "--out", str(zoo), "--no-progress", "--only", "baseline"],
            f"is being written by PID {first.pid}",
            "zoo --preset micro",
        )
        assert_nothing_lost(before, snapshot(zoo), CONCURRENT)
    finally:
        finish(first, kill=True)
