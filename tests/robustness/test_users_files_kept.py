"""Guarantee: no verb writes into or replaces a directory it did not make unless told to, and
``--overwrite`` replaces only what that verb's own output lists (its manifest,
``.workbench-output.json``): a user's file beside it, or inside one of its folders, stays, or the
overwrite is refused.

Every verb pointed at a trained run, a store, a study or a plain folder of a user's files refuses
with one line and changes nothing (``helpers.snapshot`` compares bytes). The user's own symbolic
links are followed as they meant them. Faults count in the tally's classes "wrong-target outputs"
and "users' files where a verb writes"; ``data_lost`` stays 0."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import FAST, assert_nothing_lost, assert_usage_error, cli, snapshot, tally

from workbench import build_model, load_model, save_model
from workbench.probing.store import load_store
from workbench.probing.study import RESULTS, check_probe_outputs
from workbench.storage.errors import OutputExists
from workbench.storage.outputs import KINDS, LOCK, MANIFEST, listed, output
from workbench.training.checkpointing import RUN, STATE_DIR

WRONG = tally("wrong-target outputs")
PLANTED = tally("users' files where a verb writes")
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


def train_argv(arch: str, out: Path, steps: int, every: int) -> list[str]:
    sets = [*FAST, "train.log_every=1", f"train.steps={steps}", f"train.checkpoint_every={every}"]
    return ["train", "--arch", arch, "--out", str(out), "--no-progress", *(a for s in sets for a in ("--set", s))]


# ---- every verb pointed at what it did not write ----------------------------------------------


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
def test_every_verb_refuses_a_target_it_did_not_write_and_changes_nothing(trained):
    for argv, named, compared in wrong_targets(trained):
        where = trained / compared
        before = snapshot(where)
        WRONG["faults_injected"] += 1
        assert_usage_error(argv, named)
        assert_nothing_lost(before, snapshot(where), WRONG)


@pytest.mark.parametrize("kind", sorted(k for k in KINDS if KINDS[k].marker))
def test_a_users_folder_holding_a_file_of_the_markers_name_is_not_a_previous_output(tmp_path, kind):
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
        with pytest.raises(OutputExists, match=f"holds files that are not {KINDS[kind].noun}"):
            with output(out, kind, overwrite=overwrite):
                pass
    assert_nothing_lost(before, snapshot(out), PLANTED)
    assert sorted(p.name for p in out.iterdir()) == sorted([KINDS[kind].marker, "notes.txt"])  # not even a lock


# ---- --overwrite: only the previous output ----------------------------------------------------


def test_overwrite_replaces_only_the_previous_output(tmp_path):
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
    assert sorted(p.name for p in store.iterdir()) == sorted([LOCK, MANIFEST, "README.txt", "shard-00000.arrow", "store.json"])
    assert (store / "README.txt").read_text() == "what this store is for"


def previous_demo(out: Path) -> None:
    with output(out, "demo") as first:
        (first.staging / "fbt").mkdir()
        (first.staging / "fbt" / "model.safetensors").write_text("weights")
        (first.staging / "demo.json").write_text("{}")
        first.publish()


def test_overwrite_replaces_the_previous_output_and_keeps_a_users_file_beside_it(tmp_path):
    out = tmp_path / "D"
    previous_demo(out)
    (out / "README.txt").write_text("what this is")
    with output(out, "demo", overwrite=True) as second:
        (second.staging / "demo.json").write_text('{"new": 1}')
        second.publish()
    PLANTED["inputs_tried"] += 1
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [LOCK, MANIFEST, "README.txt", "demo.json"]
    )  # fbt/ was the previous demo's
    assert (out / "README.txt").read_text() == "what this is"
    assert (out / "demo.json").read_text() == '{"new": 1}' and listed(out, "demo") == {"demo.json"}


def test_overwrite_refuses_a_users_file_inside_a_directory_it_would_replace(tmp_path):
    out = tmp_path / "D"
    previous_demo(out)
    (out / "fbt" / "mynotes.txt").write_text("mine")
    before = snapshot(out)
    PLANTED["inputs_tried"] += 1
    PLANTED["faults_injected"] += 1
    with pytest.raises(OutputExists, match=r"files its previous output did not write \(fbt/mynotes.txt\)"):
        with output(out, "demo", overwrite=True):
            pass
    assert_nothing_lost(before, snapshot(out), PLANTED)


def test_publish_never_replaces_a_users_file_the_new_output_would_bring(tmp_path):
    out = tmp_path / "D"
    previous_demo(out)
    (out / "hf_baseline").write_text("mine")  # beside the previous demo, under a name the new one brings
    PLANTED["inputs_tried"] += 1
    PLANTED["faults_injected"] += 1
    with pytest.raises(OutputExists, match="holds hf_baseline, which no previous output wrote"):
        with output(out, "demo", overwrite=True) as second:
            (second.staging / "hf_baseline").write_text("export")
            (second.staging / "demo.json").write_text("{}")
            second.publish()
    assert (out / "hf_baseline").read_text() == "mine" and (out / "fbt" / "model.safetensors").is_file()


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


# ---- probe sweeps ------------------------------------------------------------------------------


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
    # a report of the right shape that no sweep listed is not a previous sweep either
    report.write_text(json.dumps({"rows": [], "target": "memory"}))
    (out / "probes" / "memory" / "notes.txt").unlink()
    with pytest.raises(OutputExists, match="probe_memory.json"):
        check_probe_outputs(report, out / "probes" / "memory", True)
    # a sweep's own outputs, listed: replaced only with --overwrite
    with output(out, RESULTS) as held:
        held.wrote(report, out / "probes" / "memory")
    with pytest.raises(OutputExists, match="pass --overwrite"):
        check_probe_outputs(report, out / "probes" / "memory", False)
    check_probe_outputs(report, out / "probes" / "memory", True)
    (out / "probes" / "memory" / "notes.txt").write_text("mine, added since")
    with pytest.raises(OutputExists, match="notes.txt"):
        check_probe_outputs(report, out / "probes" / "memory", True)


# ---- runs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "tokenizer_config.json"])
def test_train_refuses_a_users_file_of_a_run_files_name(tmp_path, name):
    out = tmp_path / "u"
    out.mkdir()
    (out / name).write_text('{"experiment": "mine"}\n')
    refused([*TRAIN, "--out", str(out), *STEPS], out, str(out), name)


def test_train_refuses_a_train_state_it_did_not_make_and_keeps_its_files(tmp_path):
    run = tmp_path / "K3"
    (run / STATE_DIR).mkdir(parents=True)
    (run / STATE_DIR / "notes.txt").write_text("notes")
    refused([*TRAIN, "--out", str(run), *STEPS], tmp_path, str(run), "not a workbench run")
    assert (run / STATE_DIR / "notes.txt").read_text() == "notes"


def test_a_run_killed_before_its_first_checkpoint_is_trained_again_but_not_a_users_file_beside_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    with output(run, RUN) as killed:  # what a run killed before its first checkpoint leaves
        killed.wrote(run / "config.json", run / "metrics.jsonl")
    (run / "tokenizer_config.json").write_text('{"mine": 1}')  # a user's file of a run file's name, beside it
    refused([*TRAIN, "--out", str(run), *STEPS], run, "tokenizer_config.json")
    (run / "tokenizer_config.json").unlink()
    assert cli([*TRAIN, "--out", str(run), *STEPS])[0] is None  # the killed run's own leftovers: trained over
    assert (run / STATE_DIR / "state.json").is_file()


def test_a_resumed_run_keeps_files_it_did_not_write(tmp_path):
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
    assert (run / STATE_DIR / "notes.txt").read_text() == "notes"
    assert look_alike.read_text() == "mine"


def test_eval_writes_through_a_results_folder_the_user_linked_elsewhere(tmp_path):
    """The user's links are followed as they meant them: a run's ``results/`` linked to a folder
    of theirs gets the evaluation there, beside their files."""
    run = tmp_path / "run"
    assert cli([*TRAIN, "--out", str(run), *STEPS, "--set=train.steps=2", "--set=train.eval_examples=4"])[0] is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.md").write_text("mine")
    if (run / "results").exists():
        (run / "results").rename(tmp_path / "old-results")
    (run / "results").symlink_to(elsewhere)
    code, _, err = cli(["eval", str(run), "--n", "4"])
    assert code is None, err
    assert (run / "results").is_symlink() and (elsewhere / "notes.md").read_text() == "mine"
    assert json.loads((elsewhere / "eval.json").read_text()) and listed(elsewhere, "results") == {"eval.json"}


def test_save_model_replaces_a_model_only_when_asked(tmp_path):
    run = save_model(build_model("fbt", "debug"), tmp_path / "run")
    (run / "notes.md").write_text("mine")
    before = snapshot(run)
    WRONG["faults_injected"] += 1
    with pytest.raises(OutputExists, match=r"already holds a model \(model.safetensors, config.json, tokenizer.json\)"):
        save_model(build_model("baseline", "debug"), run)
    assert_nothing_lost(before, snapshot(run), WRONG)
    save_model(build_model("baseline", "debug"), run, overwrite=True)
    assert load_model(run).arch == "baseline" and (run / "notes.md").read_text() == "mine"


# ---- zoos --------------------------------------------------------------------------------------


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


def test_a_torn_zoo_summary_is_named(tmp_path):
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    (zoo / "zoo.json").write_text("{}")
    with output(zoo, "zoo") as held:  # the zoo's own summary ...
        held.wrote(zoo / "zoo.json")
    (zoo / "zoo.json").write_text('{"scale": "micro", "models": {"base')  # ... cut short by a write in place
    WRONG["faults_injected"] += 1
    assert_usage_error(
        ["zoo", "--preset", "micro", "--out", str(zoo), "--only", "baseline", "--no-progress"],
        f"corrupt JSON in {zoo / 'zoo.json'}",
    )


def test_only_the_staging_folder_the_verb_made_is_removed_whole(tmp_path, caplog):
    """The one folder an output removes whole is the one ``scratch()`` made; whatever stands at that
    path when the block ends otherwise (here a link to the user's folder) is left, with its target."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep").write_text("the user's")
    (tmp_path / "out").mkdir()
    with output(tmp_path / "out", "results") as out:
        scratch = out.scratch()
        scratch.rmdir()
        scratch.symlink_to(mine, target_is_directory=True)
    assert (mine / "keep").read_text() == "the user's" and scratch.is_symlink()
    assert "not the staging folder this verb made; left as it is" in caplog.text
    with output(tmp_path / "out", "results") as out:  # the folder it made is removed with what it holds
        made = out.scratch()
        (made / "part").write_text("staged")
    assert not made.exists()
