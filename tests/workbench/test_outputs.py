"""Output ownership: concurrent writers and wrong-target outputs.

Concurrent writers are real ``workbench`` processes: the first one is frozen with SIGSTOP as soon as
it holds its output directory, so the second one meets it deterministically; it is then continued,
or killed to leave a stale lock behind. Wrong targets are trained runs, stores, studies and plain
user files: every verb pointed at something it did not write refuses with one line and changes
nothing (``faultkit.snapshot`` compares bytes)."""

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import assert_nothing_lost, assert_usage_error, cli, snapshot, tally

from workbench import build_model, load_model, save_model
from workbench.probing.store import load_store
from workbench.storage.outputs import LOCK, RECORD, STAGING_MARK, OutputBusy, claim, hold, record_made
from workbench.training.metrics import read_metrics

CONCURRENT = tally("concurrent writers")
WRONG = tally("wrong-target outputs")
FAST = ["train.batch_size=4", "train.seq_len=32", "train.warmup=3", "train.log_every=1", "data.n_train=300"]
SETS = [a for s in FAST for a in ("--set", s)]


# ---- the lock itself -----------------------------------------------------------------------


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


@pytest.mark.slow
def test_a_held_directory_names_its_holder_to_a_second_process(tmp_path):
    script = "import sys; from workbench.storage.outputs import hold\nwith hold(sys.argv[1]):\n    print('held', flush=True); sys.stdin.readline()"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "out"), "--some-flag"],
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
    script = "import sys; from workbench.storage.outputs import hold\nwith hold(sys.argv[1]):\n    print('held', flush=True); sys.stdin.readline()"
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "out")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
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


def test_a_claim_refuses_before_creating_anything_and_publishes_atomically(tmp_path):
    target = tmp_path / "dyn"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds files that are not a dynamics study \(notes.txt\)"):
        with claim(target, "dynamics"):
            pass
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]  # not even a lock file
    with claim(tmp_path / "new", "dynamics") as out:
        (out.staging / "rollout.png").write_text("figure")
        (out.staging / "dynamics.json").write_text("{}")
        assert not (tmp_path / "new" / "dynamics.json").exists()  # nothing visible before publish
        out.publish()
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == sorted([LOCK, RECORD, "dynamics.json", "rollout.png"])
    with pytest.raises(FileExistsError, match="holds a previous dynamics study: pass --overwrite"):
        with claim(tmp_path / "new", "dynamics"):
            pass
    with pytest.raises(RuntimeError, match="boom"), claim(tmp_path / "new", "dynamics", overwrite=True) as out:
        (out.staging / "dynamics.json").write_text('{"new": 1}')
        out.made(out.staging / "dynamics.json")
        raise RuntimeError("boom")  # a failed writer leaves the previous output as it was
    assert (tmp_path / "new" / "dynamics.json").read_text() == "{}" and (tmp_path / "new" / "rollout.png").exists()
    assert not list((tmp_path / "new").glob(".staging-*"))


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def staging_left_by(out: Path, pid: int, host: str | None = None) -> Path:
    """What a writer with ``pid`` leaves when killed: ``.staging-PID`` holding its mark and a file."""
    path = out / f".staging-{pid}"
    path.mkdir()
    (path / "dynamics.json").write_text("{}")
    record = {"pid": pid, "command": "workbench dynamics", "host": host or socket.gethostname(), "since": "then"}
    (path / STAGING_MARK).write_text(json.dumps(record))
    return path


def test_no_writer_removes_a_staging_directory_it_did_not_make(tmp_path, caplog):
    """A killed writer's leftover staging (``.staging-PID``, a real directory, holding the staging
    mark whose record names that PID on this host, no such process alive) is named in a warning and
    kept: the next writer did not create it. A user's look-alikes, and a live or foreign writer's,
    are neither removed nor named; the new output is published beside them all."""
    out = tmp_path / "dyn"
    with claim(out, "dynamics") as first:
        (first.staging / "dynamics.json").write_text("{}")
        first.publish()
    killed = staging_left_by(out, dead_pid())
    alive = staging_left_by(out, os.getppid())  # a writer still running
    foreign = staging_left_by(out, dead_pid(), host="another-host")  # its PID means nothing here
    renamed = out / f".staging-{dead_pid()}"
    shutil.copytree(killed, renamed)  # a mark that names another PID than the directory
    (out / ".staging-12345").mkdir()  # the user's, no mark
    (out / ".staging-12345" / "data.txt").write_text("mine")
    (out / ".staging-keep").mkdir()
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(killed, elsewhere)
    (out / ".staging-54321").symlink_to(elsewhere)  # a link to a marked directory elsewhere
    WRONG["faults_injected"] += 1
    with caplog.at_level("WARNING", logger="workbench.storage.outputs"), claim(out, "dynamics", overwrite=True) as again:
        (again.staging / "dynamics.json").write_text('{"new": 1}')
        again.publish()
    assert (killed / "dynamics.json").read_text() == "{}" and (killed / STAGING_MARK).is_file()
    named = [r.getMessage() for r in caplog.records if ".staging-" in r.getMessage()]
    assert len(named) == 1 and named[0].startswith(f"{killed}: left by 'workbench dynamics'"), named
    assert (out / ".staging-12345" / "data.txt").read_text() == "mine" and (out / ".staging-keep").is_dir()
    assert (elsewhere / STAGING_MARK).is_file() and (out / ".staging-54321").is_symlink()
    assert all((p / STAGING_MARK).is_file() for p in (alive, foreign, renamed))
    assert json.loads((out / "dynamics.json").read_text()) == {"new": 1}


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


# ---- wrong targets: every verb pointed at what it did not write -------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trained run (with a user's notes in it), a finished store and a user directory."""
    base = tmp_path_factory.mktemp("targets")
    code, _, err = cli(train_argv("fbt", base / "run", steps=4, every=2))
    assert code is None, err
    (base / "run" / "notes.md").write_text("my observations")
    code, _, err = cli(["eval", str(base / "run"), "--n", "4"])
    assert code is None, err
    code, _, err = cli(
        ["cache", "fbt:debug", "--hooks", "hook_embed", "--task", "modsum", "--n", "40", "--out", str(base / "store")]
    )
    assert code is None, err
    (base / "mine").mkdir()
    (base / "mine" / "thesis.tex").write_text("\\section{}")
    shutil.copytree(base / "run", base / "zoo" / "fbt")  # a zoo directory whose fbt member is another run
    return base


def wrong_targets(base: Path) -> list[tuple[list[str], str, str]]:
    run, store, mine = (str(base / n) for n in ("run", "store", "mine"))
    sets = [a for s in FAST + ["train.steps=2"] for a in ("--set", s)]
    return [  # (argv, what must be named, the directory to compare)
        (
            ["cache", "fbt:debug", "--task", "modsum", "--hooks", "hook_embed", "--n", "4", "--out", run],
            "not an activation store",
            "run",
        ),
        (
            ["cache", "fbt:debug", "--task", "modsum", "--hooks", "hook_embed", "--n", "4", "--out", run, "--overwrite"],
            "not an activation store",
            "run",
        ),
        (
            ["cache", "fbt:debug", "--task", "modsum", "--hooks", "hook_embed", "--n", "4", "--out", mine, "--overwrite"],
            "thesis.tex",
            "mine",
        ),
        (
            ["cache", "fbt:debug", "--task", "modsum", "--hooks", "hook_embed", "--n", "4", "--out", store],
            "pass --overwrite",
            "store",
        ),
        (["demo", "--out", run, "--preset", "debug"], "not a demo output", "run"),
        (["demo", "--out", str(base), "--preset", "debug", "--overwrite"], "not a demo output", "."),
        (["export", run, run], "not a Hugging Face export", "run"),
        (["export", "fbt:debug", store, "--overwrite"], "not a Hugging Face export", "store"),
        (["train", "--out", run, *sets], "already holds a run", "run"),
        (["train", "--out", mine, *sets], "not a workbench run (thesis.tex)", "mine"),
        (["train", "--out", store, *sets], "not a workbench run", "store"),
        (
            ["dynamics", run, "--out", run, "--horizon", "30", "--spectra", "1", "--fixed-points", "0"],
            "not a dynamics study",
            "run",
        ),
        (["traces", run, "--out", store, "--n", "2"], "not a trace study", "store"),
        (["traces", run, "--out", mine, "--n", "2", "--overwrite"], "not a trace study", "mine"),
        (["probe", run, "--target", "memory", "--out", f"{mine}/thesis.tex"], "is a file: --out takes the directory", "mine"),
        (["eval", run, "--n", "2", "--json", f"{run}/config.json"], "is not a workbench --json output", "run"),
        (["generate", "fbt:debug", "--prompt", "a", "--json", f"{mine}/thesis.tex"], "is not a workbench --json output", "mine"),
        (["zoo", "--preset", "micro", "--out", str(base / "zoo"), "--only", "fbt"], "that is not this zoo's fbt", "zoo"),
    ]


@pytest.mark.slow
def test_every_verb_refuses_a_target_it_did_not_write_and_changes_nothing(trained, tmp_path):
    for argv, named, compared in wrong_targets(trained):
        where = trained / compared
        before = snapshot(where)
        WRONG["faults_injected"] += 1
        assert_usage_error(argv, named)
        assert_nothing_lost(before, snapshot(where), WRONG)


def test_overwrite_replaces_only_the_previous_output(trained, tmp_path):
    store = tmp_path / "store"
    argv = [
        "cache",
        "baseline:debug",
        "--hooks",
        "hook_embed",
        "blocks.0.hook_resid_post",
        "--task",
        "modsum",
        "--n",
        "70",
        "--out",
        str(store),
    ]
    assert cli(argv)[0] is None
    (store / "README.txt").write_text("what this store is for")
    old = load_store(store)[1]
    assert len(old["shards"]) == 3
    WRONG["faults_injected"] += 1
    assert_usage_error(argv, "holds a previous activation store: pass --overwrite")
    argv[argv.index("70")] = "20"  # a smaller store: one shard replaces three
    assert cli(argv + ["--overwrite"])[0] is None
    ds, meta = load_store(store)
    assert meta["n_sequences"] == 20 and [s["name"] for s in meta["shards"]] == ["shard-00000.arrow"]
    assert sorted(p.name for p in store.iterdir()) == sorted([LOCK, RECORD, "README.txt", "shard-00000.arrow", "store.json"])


def test_a_json_output_replaces_only_an_earlier_json_output(tmp_path):
    out = tmp_path / "gen.json"
    argv = ["generate", "fbt:debug", "--prompt", "ab", "--max-new-tokens", "2", "--json", str(out)]
    assert cli(argv)[0] is None
    first = json.loads(out.read_text())
    assert first["written_by"] == "workbench generate" and "generations" in first
    assert cli(argv)[0] is None  # its own earlier output: replaced
    WRONG["faults_injected"] += 1
    out.write_text(json.dumps({"my": "results"}))
    assert_usage_error(argv, str(out), "not a workbench --json output")
    assert json.loads(out.read_text()) == {"my": "results"}


@pytest.mark.slow
def test_a_probe_sweep_replaces_its_previous_sweep_only_with_overwrite(tmp_path):
    run = save_model(build_model("fbt", "debug"), tmp_path / "run")
    argv = [
        "probe",
        str(run),
        "--target",
        "running_sum",
        "--passes",
        "2",
        "--no-exact",
        "--n",
        "30",
        "--hooks",
        "blocks.0.hook_resid_pre",
    ]
    assert cli(argv)[0] is None
    first = snapshot(run / "results")
    WRONG["faults_injected"] += 1
    assert_usage_error(argv, "holds a previous probe sweep: pass --overwrite")
    assert_nothing_lost(first, snapshot(run / "results"), WRONG)
    assert cli(argv + ["--overwrite", "--hooks", "hook_embed"])[0] is None  # a different sweep: its probes replace the old set
    probes = sorted(p.name for p in (run / "results" / "probes" / "running_sum").iterdir())
    assert probes == ["hook_embed__recurrent-2.safetensors", "hook_embed__standard-1.safetensors"]
    assert not [p for p in (run / "results").iterdir() if p.name.startswith(".staging-") or p.name.startswith("tmp")]


@pytest.mark.slow
def test_a_staging_directory_swapped_under_its_writer_is_left_alone(tmp_path):
    """A writer removes its staging directory at the end only if it is still the directory it
    made: one moved away and replaced by a user's directory of the same name survives."""
    out = tmp_path / "dyn"
    with claim(out, "dynamics") as writer:
        mine = tmp_path / "moved-away"
        writer.staging.rename(mine)
        writer.staging.mkdir()  # the user's, in its place
        (writer.staging / "data.txt").write_text("mine")
        shutil.copy(mine / STAGING_MARK, writer.staging / STAGING_MARK)  # even with a copy of the mark
    WRONG["faults_injected"] += 1
    assert (writer.staging / "data.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_killed_cache_leaves_only_staging_that_the_next_writer_keeps(tmp_path):
    store = tmp_path / "store"
    argv = [
        "cache",
        "fbt:debug",
        "--hooks",
        "blocks.0.hook_resid_pre",
        "--task",
        "modsum",
        "--n",
        "400",
        "--out",
        str(store),
    ]
    proc = start_holding(argv, store)
    os.kill(proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 120
    while not list(store.glob(".staging-*/shard-00001.arrow")):  # killed mid-write, after two shards
        assert proc.poll() is None and time.monotonic() < deadline, "the cache ended or stalled"
        time.sleep(0.005)
    finish(proc, kill=True)
    WRONG["faults_injected"] += 1
    assert [p.name for p in store.iterdir() if p.name != LOCK] == [f".staging-{proc.pid}"]
    with pytest.raises(FileNotFoundError, match="no activation store"):
        load_store(store)
    assert cli(argv[:-4] + ["--n", "8", "--out", str(store)])[0] is None  # no --overwrite needed: nothing was published
    # the killed writer's staging is kept, not the next writer's to delete, and does not block it
    assert sorted(p.name for p in store.iterdir()) == sorted(
        [LOCK, RECORD, "shard-00000.arrow", "store.json", f".staging-{proc.pid}"]
    )
    assert (store / f".staging-{proc.pid}" / "shard-00001.arrow").is_file()
    load_store(store)


def test_save_model_replaces_a_model_only_when_asked(tmp_path):
    run = save_model(build_model("fbt", "debug"), tmp_path / "run")
    (run / "notes.md").write_text("mine")
    before = snapshot(run)
    WRONG["faults_injected"] += 1
    with pytest.raises(FileExistsError, match=r"already holds a model \(model.safetensors, config.json, tokenizer.json\)"):
        save_model(build_model("baseline", "debug"), run)
    assert_nothing_lost(before, snapshot(run), WRONG)
    save_model(build_model("baseline", "debug"), run, overwrite=True)
    assert load_model(run).arch == "baseline" and (run / "notes.md").read_text() == "mine"


@pytest.mark.slow
def test_a_failed_probe_sweep_leaves_no_temporary_directories(tmp_path):
    """The reported leftovers: a failed probe left ``tmp*`` stores in the run directory. Here the
    sweep fails in its second caching (an overflowing weight makes the recurrent prefill stop)."""
    from workbench.runtime.checkpoint import load_weights, save_weights

    run = save_model(build_model("fbt", "debug"), tmp_path / "run")
    tensors, meta = load_weights(run / "model.safetensors")
    tensors["fusion.W_U.weight"].view(-1)[0] = 1e30  # only fused positions overflow: the standard prefill passes
    save_weights(run / "model.safetensors", tensors, meta)
    before = snapshot(run)
    WRONG["faults_injected"] += 1
    assert_usage_error(
        [
            "probe",
            str(run),
            "--target",
            "running_sum",
            "--passes",
            "2",
            "--no-exact",
            "--n",
            "30",
            "--hooks",
            "hook_embed",
            "--no-progress",  # the error is the only line on stderr
        ],
        "non-finite activation",
        "FBT pass 2",
    )
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.name != LOCK)
    assert left == sorted([name for name in before if name != LOCK] + ["results"]), (
        left
    )  # results/ holds no store, probe or report


def test_a_torn_zoo_summary_is_named(tmp_path):
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    (zoo / "zoo.json").write_text("{}")
    record_made(zoo, "zoo", zoo / "zoo.json")  # the zoo's own summary ...
    (zoo / "zoo.json").write_text('{"scale": "micro", "models": {"base')  # ... cut short by a write in place
    WRONG["faults_injected"] += 1
    assert_usage_error(
        ["zoo", "--preset", "micro", "--out", str(zoo), "--only", "baseline", "--no-progress"],
        f"corrupt JSON in {zoo / 'zoo.json'}",
    )


def test_staging_is_removed_only_if_it_is_still_the_directory_that_was_checked(tmp_path):
    """``_remove_staging``: a directory swapped in under the checked name, with a copy of the same
    mark, is a different inode and survives; the checked one itself is removed."""
    from workbench.storage.outputs import STAGING_MARK, Staging, _identity, _remove_staging

    record = {"pid": 999999, "host": "here"}
    staging = Staging(tmp_path / ".staging-999999")
    staging.path.mkdir()
    (staging.path / STAGING_MARK).write_text(json.dumps(record))
    staging.made(staging.path / STAGING_MARK)
    identity = _identity(staging.path)
    staging.path.rename(tmp_path / "moved-away")
    staging.path.mkdir()  # a look-alike in its place: same name, same mark, a user's file inside
    (staging.path / STAGING_MARK).write_text(json.dumps(record))
    (staging.path / "keep.txt").write_text("mine")
    assert _remove_staging(staging, identity, record) is None and (staging.path / "keep.txt").read_text() == "mine"
    assert _remove_staging(staging, _identity(staging.path), {**record, "pid": 1}) is None  # another mark: not ours
    # the look-alike's mark is not the recorded one (another inode), and keep.txt was never recorded
    assert _remove_staging(staging, _identity(staging.path), record) == [STAGING_MARK, "keep.txt"]
    assert (staging.path / "keep.txt").read_text() == "mine"
    (staging.path / "keep.txt").unlink()
    staging.made(staging.path / STAGING_MARK)
    assert _remove_staging(staging, _identity(staging.path), record) == [] and not staging.path.exists()
    assert _remove_staging(staging, identity, record) is None  # nothing there any more


@pytest.mark.parametrize("fails", [False, True])
def test_a_writer_removes_only_what_it_recorded_making(tmp_path, caplog, fails):
    """Cleanup removes the staging directory's recorded entries only: files moved into it by hand
    while the verb runs, at its top or inside a directory the writer made, survive (named in a
    warning) whether the writer failed or published; what the writer made is gone."""
    out = tmp_path / "dyn"
    with claim(out, "dynamics") as first:  # a previous output, so publishing moves one into the trash
        (first.staging / "dynamics.json").write_text("{}")
        first.publish()

    def move_in(name: str, to: Path) -> None:
        (tmp_path / name).write_text(f"mine: {name}")
        (tmp_path / name).rename(to / name)

    with caplog.at_level("WARNING", logger="workbench.storage.outputs"), contextlib.suppress(RuntimeError):
        with claim(out, "dynamics", overwrite=True) as writer:
            (writer.staging / "figures").mkdir()
            (writer.staging / "figures" / "a.png").write_text("figure")
            writer.made(writer.staging / "figures")
            with writer.making():  # a library call that names its own files
                (writer.staging / "states.safetensors").write_text("states")
            (writer.staging / "dynamics.json").write_text('{"new": 1}')
            writer.made(writer.staging / "dynamics.json")
            if fails:
                move_in("notes.txt", writer.staging)
                move_in("deep.txt", writer.staging / "figures")
                raise RuntimeError("boom")
            writer.publish()
            move_in("notes.txt", writer.staging)
            move_in("deep.txt", writer.staging / ".staging-replaced")  # beside the replaced output
    left = sorted(str(p.relative_to(writer.staging)) for p in writer.staging.rglob("*"))
    if fails:  # the previous output stands; of the staging, only the user's files and their directory
        assert left == ["figures", "figures/deep.txt", "notes.txt"], left
        assert (out / "dynamics.json").read_text() == "{}"
    else:
        assert left == [".staging-replaced", ".staging-replaced/deep.txt", "notes.txt"], left
        assert (out / "dynamics.json").read_text() == '{"new": 1}' and (out / "figures" / "a.png").is_file()
    assert (writer.staging / "notes.txt").read_text() == "mine: notes.txt"
    named = [r.getMessage() for r in caplog.records if "did not create" in r.getMessage()]
    assert len(named) == 1 and "notes.txt" in named[0] and "deep.txt" in named[0], named


def test_a_directory_given_relative_to_the_working_directory_records_what_it_made(tmp_path, monkeypatch):
    """``workbench zoo --out runs/x`` passes relative paths: the record named nothing (the made
    path was joined onto the directory a second time), so the study's second stage refused its own
    tuning.json as a user's file."""
    from workbench.storage.outputs import owns, read_record

    monkeypatch.chdir(tmp_path)
    out = Path("runs") / "x"
    with hold(out):
        (out / "zoo.json").write_text("{}")
        (out / "run").mkdir()
        (out / "run" / "a.txt").write_text("a")
        record_made(out, "zoo", out / "zoo.json", out / "run")
    made = read_record(out)["made"]
    assert set(made) == {"zoo.json", "run", "run/a.txt"}
    assert owns(read_record(out), out, "zoo.json") and owns(read_record(tmp_path / out), tmp_path / out, "zoo.json")


def test_fsync_refuses_a_link_to_a_file_and_follows_a_link_to_a_directory(tmp_path):
    import errno

    from workbench.storage.files import fsync

    (tmp_path / "target.txt").write_text("x")
    (tmp_path / "link.txt").symlink_to(tmp_path / "target.txt")
    with pytest.raises(OSError) as err:
        fsync(tmp_path / "link.txt")
    assert err.value.errno == errno.ELOOP
    (tmp_path / "dir").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "dir")  # a user's --out may be a link to a directory
    fsync(tmp_path / "out")
    fsync(tmp_path / "target.txt")
