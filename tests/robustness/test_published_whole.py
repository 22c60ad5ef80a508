"""Guarantee: outputs are published atomically: a reader sees the previous output or the new one,
and a kill leaves the last committed state whole.

A unit output is staged in ``DIR/.staging-PID`` and published by renames, its marker file last
(``workbench.storage.outputs.output``); a writer that fails or is killed leaves the previous output
as it was, and the next holder of the lock removes what a killed writer staged. Faults count in the
tally's class "wrong-target outputs"."""

import errno
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_nothing_lost, assert_usage_error, cli, snapshot, tally

from workbench import build_model, save_model
from workbench.probing.store import load_store
from workbench.storage.errors import OutputExists
from workbench.storage.files import fsync
from workbench.storage.outputs import LOCK, MANIFEST, Output, check_output, listed, output

WRONG = tally("wrong-target outputs")


def test_an_output_refuses_before_creating_anything_and_publishes_atomically(tmp_path):
    target = tmp_path / "dyn"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(OutputExists, match=r"holds files that are not a dynamics study \(notes.txt\)"):
        with output(target, "dynamics"):
            pass
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]  # not even a lock file
    with output(tmp_path / "new", "dynamics") as out:
        (out.staging / "rollout.png").write_text("figure")
        (out.staging / "dynamics.json").write_text("{}")
        assert not (tmp_path / "new" / "dynamics.json").exists()  # nothing visible before publish
        out.publish()
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == sorted([LOCK, MANIFEST, "dynamics.json", "rollout.png"])
    with pytest.raises(OutputExists, match="holds a previous dynamics study: pass --overwrite"):
        with output(tmp_path / "new", "dynamics"):
            pass
    with pytest.raises(RuntimeError, match="boom"), output(tmp_path / "new", "dynamics", overwrite=True) as out:
        (out.staging / "dynamics.json").write_text('{"new": 1}')
        raise RuntimeError("boom")  # a failed writer leaves the previous output as it was
    assert (tmp_path / "new" / "dynamics.json").read_text() == "{}" and (tmp_path / "new" / "rollout.png").exists()
    assert not list((tmp_path / "new").glob(".staging-*"))


CACHE = ["cache", "fbt:debug", "--hooks", "blocks.0.hook_resid_pre", "--task", "modsum"]


def killed_mid_write(argv: list[str], store: Path) -> Path:
    """Run ``workbench ARGV`` (a cache into ``store``) and SIGKILL it once it has staged two shards;
    the staging folder it leaves."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not (staged := list(store.glob(f".staging-{proc.pid}-*/shard-00001.arrow"))):  # after two shards
            if proc.poll() is not None:
                raise AssertionError(f"{argv} ended before it was killed: {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "the cache stalled"
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait(timeout=600)
    WRONG["faults_injected"] += 1
    return staged[0].parent


def published(store: Path) -> dict:
    """The store's files, without the lock (a killed holder's record stays in it) and staging."""
    return {k: v for k, v in snapshot(store).items() if k != LOCK and not k.startswith(".staging-")}


@pytest.mark.slow
def test_a_killed_cache_leaves_its_staging_which_the_next_writer_names_and_keeps(tmp_path, caplog):
    """A killed writer's staging folder is never read or published, and never deleted by another
    writer (it did not make it): the next holder of the lock names it in a warning. Killed into a
    new directory it leaves nothing published (the next cache needs no --overwrite); killed
    replacing a store with --overwrite, it leaves that store whole."""
    store = tmp_path / "store"
    left = killed_mid_write([*CACHE, "--n", "400", "--out", str(store)], store)
    assert [p.name for p in store.iterdir() if p.name != LOCK] == [left.name]
    with pytest.raises(FileNotFoundError, match="no activation store"):
        load_store(store)
    with caplog.at_level(logging.WARNING, logger="workbench.storage.outputs"):
        code, _, err = cli([*CACHE, "--n", "8", "--out", str(store)])  # no --overwrite needed: nothing was published
    assert code is None, err
    assert f"{left}: left by a writer that was killed" in caplog.text
    assert sorted(p.name for p in store.iterdir()) == sorted([LOCK, MANIFEST, left.name, "shard-00000.arrow", "store.json"])
    assert (left / "shard-00001.arrow").is_file() and load_store(store)[1]["n_sequences"] == 8

    before = published(store)
    again = killed_mid_write([*CACHE, "--n", "400", "--out", str(store), "--overwrite"], store)
    assert (again / "shard-00001.arrow").is_file()
    assert_nothing_lost(before, published(store), WRONG)  # the store it had stays whole
    assert load_store(store)[1]["n_sequences"] == 8
    code, _, err = cli([*CACHE, "--n", "20", "--out", str(store), "--overwrite"])
    assert code is None, err
    assert sorted(store.glob(".staging-*")) == sorted([left, again])
    assert load_store(store)[1]["n_sequences"] == 20


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


def test_a_directory_given_relative_to_the_working_directory_records_what_it_made(tmp_path, monkeypatch):
    """``workbench zoo --out runs/x`` passes relative paths: the record named nothing (the made
    path was joined onto the directory a second time), so the study's second stage refused its own
    tuning.json as a user's file."""
    monkeypatch.chdir(tmp_path)
    out = Path("runs") / "x"
    with output(out, "zoo") as held:
        (out / "zoo.json").write_text("{}")
        (out / "run").mkdir()
        (out / "run" / "a.txt").write_text("a")
        held.wrote(out / "zoo.json", out / "run")
    assert listed(out, "zoo") == {"zoo.json", "run", "run/a.txt"}
    assert json.loads((out / MANIFEST).read_text())["files"] == ["run", "run/a.txt", "zoo.json"]
    assert Output(out, "zoo").owns("zoo.json") and Output(tmp_path / out, "zoo").owns("zoo.json")


def test_fsync_refuses_a_link_to_a_file_and_follows_a_link_to_a_directory(tmp_path):
    (tmp_path / "target.txt").write_text("x")
    (tmp_path / "link.txt").symlink_to(tmp_path / "target.txt")
    with pytest.raises(OSError) as err:
        fsync(tmp_path / "link.txt")
    assert err.value.errno == errno.ELOOP
    (tmp_path / "dir").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "dir")  # a user's --out may be a link to a directory
    fsync(tmp_path / "out")
    fsync(tmp_path / "target.txt")


def test_an_output_nested_in_one_thread_keeps_the_enclosing_writers_scratch(tmp_path):
    with output(tmp_path, "results") as outer:
        scratch = outer.scratch()
        (scratch / "part").write_text("kept")
        with output(tmp_path, "results"):
            pass
        assert (scratch / "part").read_text() == "kept"
    assert not scratch.exists()


def test_replacing_an_output_deletes_only_what_its_manifest_lists(tmp_path):
    """A user's file put inside the previous output after ``check_output`` looked (here, inside
    the block) survives the publish, which refuses, naming the folder that holds it; the
    previous output's own files are gone, and the next writer sees the user's file first."""
    with output(tmp_path, "dynamics") as first:
        (first.staging / "figures").mkdir()
        (first.staging / "figures" / "a.png").write_text("a")
        (first.staging / "dynamics.json").write_text("{}")
        first.publish()
    assert listed(tmp_path, "dynamics") == {"dynamics.json", "figures", "figures/a.png"}
    with pytest.raises(OutputExists, match=r"did not write in figures"):
        with output(tmp_path, "dynamics", overwrite=True) as second:
            (tmp_path / "figures" / "mine.txt").write_text("the user's")
            (second.staging / "dynamics.json").write_text('{"new": 1}')
            second.publish()
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["mine.txt"]
    assert not (tmp_path / "dynamics.json").exists()
    with pytest.raises(OutputExists, match=r"not a dynamics study \(figures\)"):
        check_output(tmp_path, "dynamics", overwrite=True)


@pytest.mark.parametrize("text", ["[1]", "{not json", '{"kind": "results", "files": "probes"}', ""])
def test_a_manifest_that_is_not_one_lists_nothing(tmp_path, text):
    (tmp_path / MANIFEST).write_text(text)
    assert listed(tmp_path, "results") is None
