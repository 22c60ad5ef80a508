"""A corrupt training state stops --resume naming the file; NaN injected into a training step stops
the run naming the step, and the last checkpoint resumes exactly.

``COUNTS`` tallies the inputs tried, the faults injected and the data lost (which must stay zero);
pytest prints every fault class's tally at the end of the session (``tests/helpers.py``)."""

import contextlib
import json
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import (
    FAST,
    RUN_FAULTS,
    C,
    T,
    W,
    assert_usage_error,
    cli,
    edit_json,
    flip,
    remove,
    snapshot,
    strip_timing,
    tally,
    truncate,
    write,
)
from helpers import assert_nothing_lost as _assert_nothing_lost
from safetensors.torch import load_file

import workbench.training.train as training
from workbench import CharTokenizer, load_model
from workbench.runtime.checkpoint import load_weights, save_weights
from workbench.storage.errors import BadInput
from workbench.training.runconfig import make_run_config
from workbench.training.train import TrainingDiverged, train

COUNTS = tally(RUN_FAULTS)


pytestmark = pytest.mark.slow


def assert_nothing_lost(before: dict, after: dict) -> None:
    _assert_nothing_lost(before, after, COUNTS)


# ---- 1b. corrupt training state: --resume ------------------------------------------------


def fbt_config(steps=8, every=4):
    return make_run_config(
        "fbt",
        "debug",
        "mix",
        FAST
        + [f"train.steps={steps}", f"train.checkpoint_every={every}", "fbt.feedback_start=0.25", "fbt.three_pass_fraction=0.5"],
    )


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """An FBT run stopped after its step-4 checkpoint (8 steps planned), and the uninterrupted run."""
    base = tmp_path_factory.mktemp("interrupted")
    train(fbt_config(), base / "straight", progress=False)
    train(fbt_config(), base / "run", progress=False, stop_after=4)
    return base


S, SW, SO = "train_state/state.json", "train_state/model-4.safetensors", "train_state/optimizer-4.safetensors"


def edit_state(**fields):
    return edit_json(lambda c: c.update(fields))


def swap_shapes(p):
    tensors, meta = load_weights(p)
    save_weights(p, {k: v.t().contiguous() if v.dim() == 2 and v.shape[0] != v.shape[1] else v for k, v in tensors.items()}, meta)


RESUME_FAULTS = [  # each message names the file
    ("state.json missing", S, remove, r"no checkpoint in .*\(missing train_state/state.json\)"),
    ("state.json not JSON", S, write("{"), "corrupt JSON in .*train_state/state.json"),
    ("state.json without step", S, edit_json(lambda c: c.pop("step")), "state.json: step=None, expected an integer"),
    ("state.json step a string", S, edit_state(step="4"), "state.json: step='4', expected an integer"),
    ("state.json step negative", S, edit_state(step=-1), "state.json: step=-1"),
    ("state.json step not the files'", S, edit_state(step=8), "state.json says step 8, .*optimizer-4.safetensors holds step 4"),
    (
        "state.json pointing outside",
        S,
        edit_state(weights="../model.safetensors"),
        "state.json: 'weights' and 'optimizer' must name files",
    ),
    (
        "state.json pointing at nothing",
        S,
        edit_state(weights="model-99.safetensors"),
        "missing .*train_state/model-99.safetensors",
    ),
    (
        "state.json without param_groups",
        S,
        edit_json(lambda c: c.pop("param_groups")),
        "state.json: 'param_groups' must be a list",
    ),
    (
        "state.json param_groups garbage",
        S,
        edit_state(param_groups=[{"x": 1}]),
        "optimizer-4.safetensors and .*state.json does not fit",
    ),
    ("state.json scalars a list", S, edit_state(scalars=[1]), "state.json: .*'scalars' an object"),
    (
        "state.json model wrongly typed",
        S,
        edit_json(lambda c: c["model"].update(d_model="x")),
        "bad model config in .*state.json: config field d_model='x': expected int",
    ),
    ("weights truncated", SW, truncate(0.5), "corrupt checkpoint .*model-4.safetensors"),
    ("weights byte flipped", SW, flip(-3), "corrupt checkpoint .*model-4.safetensors: .*checksum"),
    ("weights missing", SW, remove, "missing .*model-4.safetensors"),
    ("optimizer truncated", SO, truncate(0.5), "corrupt checkpoint .*optimizer-4.safetensors"),
    ("optimizer garbage", SO, write(b"\x08" + bytes(300)), "corrupt checkpoint .*optimizer-4.safetensors"),
    ("optimizer byte flipped", SO, flip(-3), "corrupt checkpoint .*optimizer-4.safetensors: .*checksum"),
    ("optimizer missing", SO, remove, "missing .*optimizer-4.safetensors"),
    (
        "optimizer holding the weights",
        SO,
        lambda p: shutil.copyfile(p.parent / "model-4.safetensors", p),
        "unexpected optimizer entry .* in .*optimizer-4.safetensors",
    ),
    (
        "optimizer of other shapes",
        SO,
        swap_shapes,
        "optimizer-4.safetensors and .*state.json does not fit the model: exp_avg has shape",
    ),
    ("config missing", C, remove, "missing .*/config.json"),
    ("config not JSON", C, write("nope"), "corrupt JSON in .*config.json"),
    ("config without a section", C, edit_json(lambda c: c.pop("train")), r"config.json has sections .* but not \['train'\]"),
    ("config unknown field", C, edit_json(lambda c: c["train"].update(foo=1)), "config.json: unknown config field 'train.foo'"),
    (
        "config steps 'ten'",
        C,
        edit_json(lambda c: c["train"].update(steps="ten")),
        "config.json: config field train.steps='ten': expected int",
    ),
    (
        "config task a number",
        C,
        edit_json(lambda c: c["data"].update(task=5)),
        "config.json: config field data.task=5: expected str",
    ),
    (
        "config streams not a list",
        C,
        edit_json(lambda c: c["hd"].update(streams=3)),
        r"config.json: config field hd.streams=3: expected tuple",
    ),
    (
        "config lr NaN",
        C,
        edit_json(lambda c: c["train"].update(lr=float("nan"))),
        "config.json: config field train.lr=nan: expected float",
    ),
    ("config arch changed", C, edit_state(arch="hd"), "config.json: unknown config field 'fusion' for arch 'hd'"),
    (
        "metrics corrupt before the end",
        "metrics.jsonl",
        lambda p: p.write_text("garbage\n" + p.read_text()),
        "corrupt line 1 of .*metrics.jsonl",
    ),
]


@pytest.mark.parametrize("name,file,fault,match", RESUME_FAULTS, ids=[f[0] for f in RESUME_FAULTS])
def test_a_corrupt_training_state_stops_resume_and_changes_nothing(
    interrupted, tmp_path, no_unpickling, name, file, fault, match
):
    run = shutil.copytree(interrupted / "run", tmp_path / "run")
    fault(run / file)
    COUNTS["faults_injected"] += 1
    before = snapshot(run)
    assert_usage_error(["train", "--out", str(run), "--resume", "--no-progress"], str(run), match=match)
    assert_nothing_lost(before, snapshot(run))


def replace_file(content):  # a new file (the published weights are a hard link into train_state/)
    def change(p):
        p.unlink()
        p.write_bytes(content)

    return change


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


DEAD = dead_pid()  # a killed writer's PID, as atomic_write names its temporary files
RECOVERABLE = [
    ("metrics with a torn last line", "metrics.jsonl", lambda p: p.write_text(p.read_text() + '{"step": 6, "lo')),
    ("published weights missing", W, remove),
    ("published weights garbage", W, replace_file(b"garbage")),
    ("published tokenizer garbage", T, replace_file(b"{")),
    (
        "temp files of killed writes",
        f".model.safetensors.wb-{DEAD}-x1.tmp",
        lambda p: [p.write_bytes(b"half"), (p.parent / "train_state" / f".state.json.wb-{DEAD}-x2.tmp").write_text("{")],
    ),
]


@pytest.mark.parametrize("name,file,fault", RECOVERABLE, ids=[f[0] for f in RECOVERABLE])
def test_resume_repairs_what_a_kill_or_a_stray_write_left_and_reaches_the_same_weights(
    interrupted, tmp_path, no_unpickling, name, file, fault
):
    run = shutil.copytree(interrupted / "run", tmp_path / "run")
    fault(run / file)
    COUNTS["faults_injected"] += 1
    assert cli(["train", "--out", str(run), "--resume", "--no-progress"])[0] is None
    a, b = load_file(str(interrupted / "straight" / W)), load_file(str(run / W))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert strip_timing(run / "metrics.jsonl") == strip_timing(interrupted / "straight" / "metrics.jsonl")
    load_model(run), CharTokenizer.load(run)
    assert not list(run.rglob("*.tmp"))


def test_a_checkpoint_whose_state_json_names_no_files_is_refused_in_one_line(interrupted, tmp_path):
    """state.json names the weights and optimizer files it commits; one that does not is refused."""
    run = shutil.copytree(interrupted / "run", tmp_path / "run")
    state = json.loads((run / S).read_text())
    state.pop("weights")
    (run / S).write_text(json.dumps(state))
    with pytest.raises(BadInput, match="'weights' and 'optimizer' must name files"):
        train(fbt_config(), run, resume=True, progress=False)


# ---- 3. NaN injected into a training step -------------------------------------------------


@contextlib.contextmanager
def poisoned(step: int, where: str):
    """Within the context, training step ``step`` makes a parameter NaN or its gradient inf."""
    real = training.make_strategy

    def make(cfg, stream=None):
        strategy = real(cfg, stream)
        loss = strategy.loss

        def poisoned(model, x, y, s, rows, weight=None):
            if s == step:
                p = next(model.parameters())
                if where == "parameter":
                    with torch.no_grad():
                        p.view(-1)[0] = float("nan")
                else:
                    p.register_hook(lambda g: g * float("inf"))
            return loss(model, x, y, s, rows, weight)

        strategy.loss = poisoned
        return strategy

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training, "make_strategy", make)
        yield


@pytest.mark.parametrize("where", ["parameter", "gradient"])
@pytest.mark.parametrize("arch,extra", [("fbt", ["fbt.feedback_start=0.25"]), ("hd", ["hd.streams=1,2", "hd.expand_at=0,3"])])
def test_nan_in_a_step_stops_naming_the_step_and_the_last_checkpoint_resumes_exactly(tmp_path, no_unpickling, arch, extra, where):
    cfg = make_run_config(arch, "debug", "mix", FAST + ["train.steps=8", "train.checkpoint_every=4", *extra])
    train(cfg, tmp_path / "straight", progress=False)
    COUNTS["faults_injected"] += 1
    kind = "loss" if where == "parameter" else "gradient norm"
    with (
        poisoned(6, where),
        pytest.raises(TrainingDiverged, match=rf"non-finite {kind} at step 6 .*last checkpoint \(step 4\) in .* is intact"),
    ):
        train(cfg, tmp_path / "run", progress=False)
    assert json.loads((tmp_path / "run" / S).read_text())["step"] == 4
    assert load_model(tmp_path / "run").n_streams == (2 if arch == "hd" else 1)
    out = train(cfg, tmp_path / "run", resume=True, progress=False)
    assert out.summary["resumed_from"] == 4
    a, b = (load_file(str(tmp_path / r / W)) for r in ("straight", "run"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert strip_timing(tmp_path / "run" / "metrics.jsonl") == strip_timing(tmp_path / "straight" / "metrics.jsonl")


def test_nan_before_the_first_checkpoint_loses_nothing_and_blocks_nothing(tmp_path, no_unpickling):
    cfg = make_run_config("baseline", "debug", "mix", FAST + ["train.steps=4", "train.checkpoint_every=4"])
    COUNTS["faults_injected"] += 1
    with poisoned(1, "parameter"), pytest.raises(TrainingDiverged, match="at step 1 .*no checkpoint was written"):
        train(cfg, tmp_path / "run", progress=False)
    assert_usage_error(["train", "--out", str(tmp_path / "run"), "--resume"], "no checkpoint")
    train(cfg, tmp_path / "run", progress=False)  # nothing was published, so a fresh start is allowed
    load_model(tmp_path / "run")
