"""Planted links and foreign files (#35): no verb deletes, replaces or writes through what it did
not make. Each case is a reproduction from the issue: it lost a user's file before the output
record (``workbench.storage.outputs``), and must now be refused with one line, or leave the file.
Every case counts in the tally's class "planted links and foreign files"; ``data_lost`` stays 0."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from helpers import FAST, assert_nothing_lost, assert_usage_error, cli, snapshot, tally

from workbench.probing.study import RESULTS, check_probe_outputs
from workbench.storage.errors import BadInput, OutputExists
from workbench.storage.files import atomic_write, remove_stale_temps
from workbench.storage.outputs import KINDS, LOCK, RECORD, claim, hold, owns, record_made, record_of
from workbench.training.checkpointing import RUN, STATE_DIR

PLANTED = tally("planted links and foreign files")
TRAIN = ["train", "--arch", "baseline", "--preset", "debug", "--task", "modsum", "--no-progress"]
STEPS = [f"--set={s}" for s in [*FAST, "train.steps=4", "train.checkpoint_every=2"]]


def refused(argv: list[str], where: Path, *named: str) -> str:
    """``workbench ARGV`` exits 2 with one line naming ``named`` and changes nothing under ``where``."""
    before = snapshot(where)
    PLANTED["inputs_tried"] += 1
    PLANTED["faults_injected"] += 1
    message = assert_usage_error(argv, *named)
    assert_nothing_lost(before, snapshot(where), PLANTED)
    return message


def test_train_refuses_a_train_state_it_did_not_make_and_keeps_its_files(tmp_path):
    run = tmp_path / "K3"
    (run / STATE_DIR).mkdir(parents=True)
    (run / STATE_DIR / "notes.txt").write_text("notes")
    refused([*TRAIN, "--out", str(run), *STEPS], tmp_path, str(run), "not a workbench run")
    assert (run / STATE_DIR / "notes.txt").read_text() == "notes"


def test_train_never_writes_through_a_planted_train_state_link(tmp_path):
    run, victim = tmp_path / "K2", tmp_path / "victim" / "scratch"
    victim.mkdir(parents=True)
    (victim / "thesis.tex").write_text("x")
    run.mkdir()
    (run / STATE_DIR).symlink_to(victim)
    refused([*TRAIN, "--out", str(run), *STEPS], victim, str(run))
    assert sorted(p.name for p in victim.iterdir()) == ["thesis.tex"]


def test_a_resumed_run_keeps_files_it_did_not_write_and_refuses_a_linked_train_state(tmp_path):
    run = tmp_path / "run"
    assert cli([*TRAIN, "--out", str(run), *STEPS, "--set=train.steps=6", "--stop-after", "2"])[0] is None
    (run / STATE_DIR / "notes.txt").write_text("notes")
    (run / STATE_DIR / "model-1.safetensors").write_text("a user's file named like a checkpoint")
    look_alike = run / ".config.json.abc123.tmp"  # named like an older version's temporary file
    look_alike.write_text("mine")
    assert cli(["train", "--out", str(run), "--resume", "--no-progress", "--stop-after", "2"])[0] is None
    PLANTED["inputs_tried"] += 3
    kept = {p.name for p in (run / STATE_DIR).iterdir()}
    assert {"notes.txt", "model-1.safetensors", "model-4.safetensors"} <= kept and "model-2.safetensors" not in kept, kept
    assert look_alike.read_text() == "mine"
    # the same run with its train_state swapped for a link: refused before anything is written
    elsewhere = tmp_path / "elsewhere"
    (run / STATE_DIR).rename(elsewhere)
    (run / STATE_DIR).symlink_to(elsewhere)
    refused(["train", "--out", str(run), "--resume", "--no-progress"], elsewhere, "symbolic link")


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "tokenizer_config.json"])
def test_train_refuses_a_users_file_of_a_run_files_name(tmp_path, name):
    out = tmp_path / "u"
    out.mkdir()
    (out / name).write_text('{"experiment": "mine"}\n')
    refused([*TRAIN, "--out", str(out), *STEPS], out, str(out), name)


def test_a_run_killed_before_its_first_checkpoint_is_trained_again_but_not_a_users_file_beside_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    record_made(run, RUN, run / "config.json", run / "metrics.jsonl")  # what a killed run leaves
    (tmp_path / "mine.jsonl").write_text('{"mine": 1}\n')
    os.replace(tmp_path / "mine.jsonl", run / "metrics.jsonl")  # replaced since: another file, not the run's
    refused([*TRAIN, "--out", str(run), *STEPS], run, "metrics.jsonl")
    (run / "metrics.jsonl").unlink()
    assert cli([*TRAIN, "--out", str(run), *STEPS])[0] is None  # the killed run's own leftovers: trained over
    assert (run / STATE_DIR / "state.json").is_file()


def test_a_run_copied_with_its_times_is_still_the_workbenchs_and_one_copied_without_them_is_not(tmp_path):
    """A run moved to another disk or machine (``cp -a``, ``rsync -a``, ``shutil.copytree``: new
    inodes, same times) is still the workbench's, entry by entry, and resumes; a copy that lost its
    times cannot be told from a user's files of the same names, and a zoo summary copied so is
    refused with one line saying how to copy."""
    import shutil

    from workbench.training.zoo import ZOO, previous_summary

    run = tmp_path / "run"
    assert cli([*TRAIN, "--out", str(run), *STEPS, "--set=train.steps=6", "--stop-after", "2"])[0] is None
    kept = shutil.copytree(run, tmp_path / "kept")
    lost = shutil.copytree(run, tmp_path / "lost", copy_function=shutil.copyfile)
    made = record_of(run, RUN)["made"]
    assert {"config.json", "metrics.jsonl", "model.safetensors", f"{STATE_DIR}/state.json"} <= set(made)
    assert all(owns(record_of(kept, RUN), kept, rel) for rel in made)
    assert not any(owns(record_of(lost, RUN), lost, rel) for rel in made if not (lost / rel).is_dir())
    assert cli(["train", "--out", str(kept), "--resume", "--no-progress"])[0] is None
    assert record_of(kept, RUN)["made"]["metrics.jsonl"][:2] == [
        os.lstat(kept / "metrics.jsonl").st_dev,
        os.lstat(kept / "metrics.jsonl").st_ino,
    ]
    PLANTED["inputs_tried"] += 2

    zoo = tmp_path / "zoo"
    zoo.mkdir()
    (zoo / "zoo.json").write_text('{"seeds": 1, "models": {}}')
    record_made(zoo, ZOO, zoo / "zoo.json")
    assert previous_summary(shutil.copytree(zoo, tmp_path / "zoo-kept") / "zoo.json") == {"seeds": 1, "models": {}}
    with pytest.raises(OutputExists, match=r"zoo-lost/zoo.json was not written by a workbench zoo .*cp -a"):
        previous_summary(shutil.copytree(zoo, tmp_path / "zoo-lost", copy_function=shutil.copyfile) / "zoo.json")


def test_zoo_refuses_a_users_zoo_json_and_a_users_file_in_a_member_folder(tmp_path):
    out = tmp_path / "u"
    out.mkdir()
    (out / "zoo.json").write_text('{"my": 1}')
    zoo = ["zoo", "--preset", "micro", "--only", "baseline", "--no-progress"]
    refused([*zoo, "--out", str(out)], out, "zoo.json")
    other = tmp_path / "v"
    (other / "baseline").mkdir(parents=True)
    (other / "baseline" / "config.json").write_text('{"experiment": "mine"}')
    refused([*zoo, "--out", str(other)], other, "config.json")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_overwrite_does_not_take_a_look_alike_for_a_previous_output(tmp_path, kind):
    """A user's folder with a JSON object under the kind's marker name (and notes beside it) is not
    a previous output: refused with and without ``--overwrite``."""
    out = tmp_path / "u"
    out.mkdir()
    (out / KINDS[kind].marker).write_text('{"mine": true}')
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    for overwrite in (False, True):
        PLANTED["inputs_tried"] += 1
        PLANTED["faults_injected"] += 1
        with pytest.raises(OutputExists, match=f"holds files that are not {KINDS[kind].article} {KINDS[kind].noun}"):
            with claim(out, kind, overwrite=overwrite):
                pass
    assert_nothing_lost(before, snapshot(out), PLANTED)
    assert sorted(p.name for p in out.iterdir()) == sorted([KINDS[kind].marker, "notes.txt"])  # not even a lock


def previous_demo(out: Path) -> None:
    with claim(out, "demo") as first:
        (first.staging / "fbt").mkdir()
        (first.staging / "fbt" / "model.safetensors").write_text("weights")
        (first.staging / "demo.json").write_text("{}")
        first.made(first.staging / "fbt", first.staging / "demo.json")
        first.publish()


def test_overwrite_refuses_a_users_file_inside_a_directory_it_would_replace(tmp_path):
    out = tmp_path / "D"
    previous_demo(out)
    (out / "fbt" / "mynotes.txt").write_text("mine")
    before = snapshot(out)
    PLANTED["inputs_tried"] += 1
    PLANTED["faults_injected"] += 1
    with pytest.raises(OutputExists, match=r"files it did not write among its own \(fbt/mynotes.txt\)"):
        with claim(out, "demo", overwrite=True):
            pass
    assert_nothing_lost(before, snapshot(out), PLANTED)


def test_overwrite_replaces_the_previous_output_and_keeps_a_users_file_beside_it(tmp_path):
    out = tmp_path / "D"
    previous_demo(out)
    (out / "README.txt").write_text("what this is")
    with claim(out, "demo", overwrite=True) as second:
        (second.staging / "demo.json").write_text('{"new": 1}')
        second.made(second.staging / "demo.json")
        second.publish()
    PLANTED["inputs_tried"] += 1
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [LOCK, RECORD, "README.txt", "demo.json"]
    )  # fbt/ was the previous demo's
    assert (out / "README.txt").read_text() == "what this is"


def test_publish_never_replaces_a_users_file_the_new_output_would_bring(tmp_path):
    out = tmp_path / "D"
    previous_demo(out)
    (out / "hf_baseline").write_text("mine")  # beside the previous demo, under a name the new one brings
    PLANTED["inputs_tried"] += 1
    PLANTED["faults_injected"] += 1
    with pytest.raises(OutputExists, match="hf_baseline, which the new demo output would replace"):
        with claim(out, "demo", overwrite=True) as second:
            (second.staging / "hf_baseline").write_text("export")
            (second.staging / "demo.json").write_text("{}")
            second.made(second.staging / "hf_baseline", second.staging / "demo.json")
            second.publish()
    assert (out / "hf_baseline").read_text() == "mine" and (out / "fbt" / "model.safetensors").is_file()


def test_a_probe_sweep_refuses_outputs_it_did_not_write(tmp_path):
    out = tmp_path / "u"
    (out / "probes" / "memory").mkdir(parents=True)
    (out / "probes" / "memory" / "notes.txt").write_text("mine")
    report = out / "probe_memory.json"
    for overwrite in (False, True):  # no sweep was here: refused either way
        PLANTED["inputs_tried"] += 1
        PLANTED["faults_injected"] += 1
        with pytest.raises(
            OutputExists, match=r"no probe sweep of this workbench wrote \(probes/memory, probes/memory/notes.txt\)"
        ):
            check_probe_outputs(report, out / "probes" / "memory", overwrite)
    # a look-alike report of the right shape, with no record of it, is not a previous sweep either
    report.write_text(json.dumps({"rows": [], "target": "memory"}))
    (out / "probes" / "memory" / "notes.txt").unlink()
    with pytest.raises(OutputExists, match="probe_memory.json"):
        check_probe_outputs(report, out / "probes" / "memory", True)
    # a sweep's own outputs, recorded: replaced only with --overwrite
    with hold(out):
        record_made(out, RESULTS, report, out / "probes" / "memory")
    with pytest.raises(OutputExists, match="pass --overwrite"):
        check_probe_outputs(report, out / "probes" / "memory", False)
    check_probe_outputs(report, out / "probes" / "memory", True)
    (out / "probes" / "memory" / "notes.txt").write_text("mine, added since")
    with pytest.raises(OutputExists, match="notes.txt"):
        check_probe_outputs(report, out / "probes" / "memory", True)


def test_stale_temporaries_are_only_the_workbenchs_own(tmp_path):
    """In a directory its caller holds, every temporary named as ``atomic_write`` names them is a
    killed writer's (whatever its PID, since PIDs are reused); a user's look-alikes and links stay."""
    ours = [tmp_path / f".config.json.wb-{pid}-x1y2.tmp" for pid in (os.getpid(), 2**22 + 7)]
    users = [tmp_path / ".config.json.abc.tmp", tmp_path / ".config.json.wb-notes.tmp", tmp_path / ".notes.wb-1-x.tmp"]
    for path in [*ours, *users]:
        path.write_text("x")
    link = tmp_path / ".config.json.wb-12-link.tmp"
    link.symlink_to(users[0])
    with hold(tmp_path):
        remove_stale_temps(tmp_path, ["config.json"])
    PLANTED["inputs_tried"] += 4
    assert not any(p.exists() for p in ours) and all(p.read_text() == "x" for p in users) and link.is_symlink()


def test_an_atomic_write_names_its_temporary_by_its_writer(tmp_path, monkeypatch):
    seen = []
    atomic_write(tmp_path / "f.json", lambda tmp: seen.append(Path(tmp).name) or Path(tmp).write_text("{}"))
    assert seen[0].startswith(f".f.json.wb-{os.getpid()}-") and seen[0].endswith(".tmp")


def test_the_lock_never_writes_through_a_link_or_into_a_fifo(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("precious notes")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).symlink_to(precious)
    refused([*TRAIN, "--out", str(out), *STEPS], tmp_path, str(out / LOCK), "symbolic link")
    assert precious.read_text() == "precious notes"
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / LOCK)
    PLANTED["inputs_tried"] += 1
    with pytest.raises(BadInput, match=f"{fifo_dir / LOCK} is not a regular file"):
        with hold(fifo_dir):
            pass


def test_eval_never_writes_through_a_linked_results_folder(tmp_path):
    run = tmp_path / "run"
    assert cli([*TRAIN, "--out", str(run), *STEPS, "--set=train.steps=2", "--set=train.eval_examples=4"])[0] is None
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "eval.json").write_text('{"mine": 1}')
    if (run / "results").exists():
        (run / "results").rename(tmp_path / "old-results")
    (run / "results").symlink_to(target)
    refused(["eval", str(run), "--n", "4"], target, "symbolic link")
    assert sorted(p.name for p in target.iterdir()) == ["eval.json"]


def test_a_stale_lock_of_another_host_is_not_called_running(tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    record = {"pid": os.getpid(), "command": "workbench train", "host": socket.gethostname() + "-elsewhere", "since": "then"}
    (out / LOCK).write_text(json.dumps(record))
    with caplog.at_level("WARNING", logger="workbench.storage.outputs"), hold(out):
        pass
    (message,) = [r.getMessage() for r in caplog.records if "stale lock" in r.getMessage()]
    assert "another host" in message and "still running" not in message
