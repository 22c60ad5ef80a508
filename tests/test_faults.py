"""Faults and bad input (issue #8): corrupt, truncated or missing checkpoint files, configs and
tokenizers; a training process killed in the middle of a checkpoint write; NaN injected into a
training step; a fuzzed command line; rollouts past the context or to divergence.

``COUNTS`` tallies the inputs tried, the faults injected and the data lost (which must stay zero);
pytest prints every fault class's tally at the end of the session (``tests/faultkit.py``)."""

import contextlib
import importlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import tokens
from faultkit import assert_nothing_lost as _assert_nothing_lost
from faultkit import assert_usage_error, cli, snapshot, stamps, tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import workbench.runtime.checkpoint as checkpoint
import workbench.runtime.tokenizer as tokenizer
import workbench.storage.files as files
import workbench.training.train as training
from workbench import CharTokenizer, build_model, load_model, save_model
from workbench.dynamics.feedback import RolloutDiverged, rollout
from workbench.runtime.checkpoint import load_weights, save_weights
from workbench.training.runconfig import make_run_config
from workbench.training.train import TrainingDiverged, train

COUNTS = tally("checkpoints, resume, kills, NaN steps, rollouts, CLI fuzz (#8)")
FAST = ["train.batch_size=4", "train.seq_len=32", "train.warmup=3", "train.log_every=2", "data.n_train=300"]
W, C, T = "model.safetensors", "config.json", "tokenizer.json"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def assert_nothing_lost(before: dict, after: dict) -> None:
    _assert_nothing_lost(before, after, COUNTS)


# ---- 1. corrupt, truncated or missing checkpoint files ------------------------------------

def truncate(keep):
    return lambda p: p.write_bytes(p.read_bytes()[:keep] if isinstance(keep, int) else p.read_bytes()[: int(len(p.read_bytes()) * keep)])


def flip(offset):
    def change(p):
        data = bytearray(p.read_bytes())
        data[offset] ^= 0xFF
        p.write_bytes(bytes(data))
    return change


def write(content):
    return lambda p: p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)


def remove(p):
    p.unlink()


def a_directory(p):
    p.unlink()
    p.mkdir()


def edit_json(change):
    def edit(p):
        data = json.loads(p.read_text())
        change(data)
        p.write_text(json.dumps(data))
    return edit


def edit_model(**fields):
    return edit_json(lambda c: c["model"].update(fields))


def nan_weight(p):  # a diverged model saved with a valid checksum
    tensors, meta = load_weights(p)
    tensors[sorted(tensors)[0]].view(-1)[0] = float("nan")
    save_weights(p, tensors, meta)


def other_size(p):
    arch = json.loads((p.parent / C).read_text())["arch"]
    save_weights(p, build_model(arch, "debug", d_model=64, **ARCH_OVERRIDES[arch]).state_dict())


def other_arch(p):
    edit_json(lambda c: c.update(arch={"baseline": "fbt", "fbt": "baseline", "hd": "fbt"}[c["arch"]]))(p)


def more_ids(p):
    def grow(c):
        c["model"]["vocab"].update({f"extra{i}": 100 + i for i in range(100)})
    edit_json(grow)(p)


def without_eos(p):
    def drop(c):
        c["model"]["vocab"].pop("<eos>")
        c["added_tokens"] = [t for t in c["added_tokens"] if t["content"] != "<eos>"]
    edit_json(drop)(p)


ARCH_OVERRIDES = {"baseline": {}, "fbt": {}, "hd": {"n_streams": 2}}
ALL = tuple(ARCH_OVERRIDES)
# (name, file, fault, archs, exception, message)
FAULTS = [
    ("weights truncated to half", W, truncate(0.5), ALL, ValueError, "corrupt checkpoint"),
    ("weights empty", W, truncate(0), ALL, ValueError, "corrupt checkpoint"),
    ("weights cut after 8 bytes", W, truncate(8), ALL, ValueError, "corrupt checkpoint"),
    ("weights missing their last byte", W, truncate(-1), ALL, ValueError, "corrupt checkpoint"),
    ("weights replaced by garbage", W, write(bytes(range(256)) * 8), ALL, ValueError, "corrupt checkpoint"),
    ("weights with a header byte flipped", W, flip(12), ALL, ValueError, "corrupt checkpoint"),
    ("weights with a data byte flipped", W, flip(-3), ALL, ValueError, "checksum"),
    ("weights replaced by a pickle", W, write(pickle.dumps({"embed.W_E": [0.0]})), ALL, ValueError, "corrupt checkpoint"),
    ("weights replaced by torch.save", W, lambda p: torch.save({"embed.W_E": torch.zeros(2)}, p), ALL, ValueError, "corrupt checkpoint"),
    ("weights holding NaN", W, nan_weight, ALL, ValueError, "NaN or inf"),
    ("weights of another size", W, other_size, ALL, ValueError, r"does not match the config .*embed\.W_E is \["),
    ("weights missing", W, remove, ALL, FileNotFoundError, "missing"),
    ("weights a directory", W, a_directory, ALL, FileNotFoundError, "missing"),
    ("config missing", C, remove, ALL, FileNotFoundError, "missing"),
    ("config empty", C, write(""), ALL, ValueError, "corrupt JSON"),
    ("config not JSON", C, write("{not json"), ALL, ValueError, "corrupt JSON"),
    ("config binary", C, write(b"\xff\xfe\x00\x01"), ALL, ValueError, "corrupt JSON"),
    ("config nested too deep", C, write("[" * 100_000 + "]" * 100_000), ALL, ValueError, "corrupt JSON"),
    ("config a list", C, write("[1, 2]"), ALL, ValueError, "must hold a JSON object"),
    ("config without arch", C, edit_json(lambda c: c.pop("arch")), ALL, ValueError, "no 'arch' field"),
    ("config without model", C, edit_json(lambda c: c.pop("model")), ALL, ValueError, "no 'model' field"),
    ("config arch unknown", C, edit_json(lambda c: c.update(arch="gpt")), ALL, ValueError, "unknown architecture 'gpt'"),
    ("config arch a list", C, edit_json(lambda c: c.update(arch=["fbt"])), ALL, ValueError, r"unknown architecture \['fbt'\]"),
    ("config arch of another model", C, other_arch, ALL, ValueError, "does not match the config|unknown config field"),
    ("config model a string", C, edit_json(lambda c: c.update(model="debug")), ALL, ValueError, "must be a JSON object, got str"),
    ("config unknown field", C, edit_model(d_modle=3), ALL, ValueError, "unknown config field 'd_modle'"),
    ("config n_layers 'two'", C, edit_model(n_layers="two"), ALL, ValueError, "n_layers='two': expected int"),
    ("config n_heads null", C, edit_model(n_heads=None), ALL, ValueError, "n_heads=None: expected int"),
    ("config norm_eps NaN", C, edit_model(norm_eps=float("nan")), ALL, ValueError, "norm_eps=nan: expected float"),
    ("config d_model not the weights'", C, edit_model(d_model=64), ALL, ValueError, r"does not match the config .*embed\.W_E"),
    ("config of an absurd size", C, edit_model(d_model=2**40, n_heads=2**30), ALL, ValueError, "bad model config"),
    ("config of a size torch cannot describe", C, edit_model(d_model=10**30, n_heads=2), ALL, ValueError,
     "bad model config .*a size torch cannot allocate"),
    ("config fusion unknown", C, edit_model(fusion="concat"), ("fbt",), ValueError, "fusion='concat'"),
    ("config cross_layers an int", C, edit_model(cross_layers=1), ("hd",), ValueError, r"cross_layers=1: expected tuple\[int, \.\.\.\] \| None"),
    ("config n_streams zero", C, edit_model(n_streams=0), ("hd",), ValueError, "n_streams=0"),
    ("tokenizer missing", T, remove, ALL, FileNotFoundError, "no tokenizer"),
    ("tokenizer not JSON", T, write("{bad"), ALL, ValueError, "corrupt tokenizer file"),
    ("tokenizer an empty object", T, write("{}"), ALL, ValueError, "corrupt tokenizer file"),
    ("tokenizer with ids past d_vocab", T, more_ids, ALL, ValueError, "does not match the model .*d_vocab is 128"),
    ("tokenizer without <eos>", T, without_eos, ALL, ValueError, "no special token '<eos>'"),
]
CASES = [pytest.param(arch, *fault, id=f"{arch}: {fault[0]}") for fault in FAULTS for arch in fault[3]]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    base = tmp_path_factory.mktemp("pristine")
    return {arch: save_model(build_model(arch, "debug", **kw), base / arch) for arch, kw in ARCH_OVERRIDES.items()}


@pytest.mark.parametrize("arch,name,file,fault,archs,error,match", CASES)
def test_a_corrupt_checkpoint_names_the_file_and_the_problem(pristine, tmp_path, no_unpickling, arch, name, file, fault, archs, error, match):
    run = shutil.copytree(pristine[arch], tmp_path / "run")
    fault(run / file)
    COUNTS["faults_injected"] += 1
    loader = CharTokenizer.load if file == T else load_model
    with pytest.raises(error, match=match) as info:
        loader(run)
    assert str(run / file) in str(info.value) and "\n" not in str(info.value)
    if name != "tokenizer missing":  # the CLI falls back to the default tokenizer, by design
        assert_usage_error(["generate", str(run), "--prompt", "ab", "--max-new-tokens", "1"], str(run / file), match=match)


def test_legacy_weights_without_a_checksum_still_load(pristine, tmp_path, no_unpickling):
    run = shutil.copytree(pristine["fbt"], tmp_path / "run")
    save_file(load_file(str(run / W)), str(run / W), metadata={"arch": "fbt"})
    with torch.no_grad():
        assert torch.equal(load_model(run)(tokens(1, 6)), load_model(pristine["fbt"])(tokens(1, 6)))


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10**6), position=st.integers(0, 10**6), value=st.integers(1, 255))
def test_any_torn_or_altered_weights_file_loads_identically_or_fails_naming_it(pristine, tmp_path, no_unpickling, cut, position, value):
    """Property: a weights file with one byte altered and/or cut short either loads the same
    tensors or raises ValueError naming the file: never a crash, never different weights."""
    path = tmp_path / "run" / W
    shutil.copytree(pristine["fbt"], path.parent, dirs_exist_ok=True)
    data = bytearray((pristine["fbt"] / W).read_bytes())
    data[position % len(data)] ^= value
    path.write_bytes(bytes(data[: len(data) - cut % 64]))
    COUNTS["faults_injected"] += 1
    try:
        tensors, _ = load_weights(path)
    except ValueError as err:
        assert str(path) in str(err)
    else:
        original, _ = load_weights(pristine["fbt"] / W)
        assert tensors.keys() == original.keys() and all(torch.equal(tensors[k], original[k]) for k in tensors)


# ---- 1b. corrupt training state: --resume ------------------------------------------------


def fbt_config(steps=8, every=4):
    return make_run_config("fbt", "debug", "mix", FAST + [f"train.steps={steps}", f"train.checkpoint_every={every}",
                                                        "fbt.feedback_start=0.25", "fbt.three_pass_fraction=0.5"])


def strip_timing(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in path.read_text().splitlines()]


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
    ("state.json pointing outside", S, edit_state(weights="../model.safetensors"), "state.json: 'weights' and 'optimizer' must name files"),
    ("state.json pointing at nothing", S, edit_state(weights="model-99.safetensors"), "missing .*train_state/model-99.safetensors"),
    ("state.json without param_groups", S, edit_json(lambda c: c.pop("param_groups")), "state.json: 'param_groups' must be a list"),
    ("state.json param_groups garbage", S, edit_state(param_groups=[{"x": 1}]), "optimizer-4.safetensors and .*state.json does not fit"),
    ("state.json scalars a list", S, edit_state(scalars=[1]), "state.json: .*'scalars' an object"),
    ("state.json model wrongly typed", S, edit_json(lambda c: c["model"].update(d_model="x")),
     "bad model config in .*state.json: config field d_model='x': expected int"),
    ("weights truncated", SW, truncate(0.5), "corrupt checkpoint .*model-4.safetensors"),
    ("weights byte flipped", SW, flip(-3), "corrupt checkpoint .*model-4.safetensors: .*checksum"),
    ("weights missing", SW, remove, "missing .*model-4.safetensors"),
    ("optimizer truncated", SO, truncate(0.5), "corrupt checkpoint .*optimizer-4.safetensors"),
    ("optimizer garbage", SO, write(b"\x08" + bytes(300)), "corrupt checkpoint .*optimizer-4.safetensors"),
    ("optimizer byte flipped", SO, flip(-3), "corrupt checkpoint .*optimizer-4.safetensors: .*checksum"),
    ("optimizer missing", SO, remove, "missing .*optimizer-4.safetensors"),
    ("optimizer holding the weights", SO, lambda p: shutil.copyfile(p.parent / "model-4.safetensors", p),
     "unexpected optimizer entry .* in .*optimizer-4.safetensors"),
    ("optimizer of other shapes", SO, swap_shapes, "optimizer-4.safetensors and .*state.json does not fit the model: exp_avg has shape"),
    ("config missing", C, remove, "missing .*/config.json"),
    ("config not JSON", C, write("nope"), "corrupt JSON in .*config.json"),
    ("config without a section", C, edit_json(lambda c: c.pop("train")), r"config.json has sections .* but not \['train'\]"),
    ("config unknown field", C, edit_json(lambda c: c["train"].update(foo=1)), "config.json: unknown config field 'train.foo'"),
    ("config steps 'ten'", C, edit_json(lambda c: c["train"].update(steps="ten")), "config.json: config field train.steps='ten': expected int"),
    ("config task a number", C, edit_json(lambda c: c["data"].update(task=5)), "config.json: config field data.task=5: expected str"),
    ("config streams not a list", C, edit_json(lambda c: c["hd"].update(streams=3)), r"config.json: config field hd.streams=3: expected tuple"),
    ("config lr NaN", C, edit_json(lambda c: c["train"].update(lr=float("nan"))), "config.json: config field train.lr=nan: expected float"),
    ("config arch changed", C, edit_state(arch="hd"), "config.json: unknown config field 'fusion' for arch 'hd'"),
    ("metrics corrupt before the end", "metrics.jsonl", lambda p: p.write_text("garbage\n" + p.read_text()), "corrupt line 1 of .*metrics.jsonl"),
]


@pytest.mark.parametrize("name,file,fault,match", RESUME_FAULTS, ids=[f[0] for f in RESUME_FAULTS])
def test_a_corrupt_training_state_stops_resume_and_changes_nothing(interrupted, tmp_path, no_unpickling, name, file, fault, match):
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


RECOVERABLE = [
    ("metrics with a torn last line", "metrics.jsonl", lambda p: p.write_text(p.read_text() + '{"step": 6, "lo')),
    ("published weights missing", W, remove),
    ("published weights garbage", W, replace_file(b"garbage")),
    ("published tokenizer garbage", T, replace_file(b"{")),
    ("temp files of killed writes", ".model.safetensors.x1.tmp",
     lambda p: [p.write_bytes(b"half"), (p.parent / "train_state" / ".state.json.x2.tmp").write_text("{")]),
]


@pytest.mark.parametrize("name,file,fault", RECOVERABLE, ids=[f[0] for f in RECOVERABLE])
def test_resume_repairs_what_a_kill_or_a_stray_write_left_and_reaches_the_same_weights(interrupted, tmp_path, no_unpickling, name, file, fault):
    run = shutil.copytree(interrupted / "run", tmp_path / "run")
    fault(run / file)
    COUNTS["faults_injected"] += 1
    assert cli(["train", "--out", str(run), "--resume", "--no-progress"])[0] is None
    a, b = load_file(str(interrupted / "straight" / W)), load_file(str(run / W))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert strip_timing(run / "metrics.jsonl") == strip_timing(interrupted / "straight" / "metrics.jsonl")
    load_model(run), CharTokenizer.load(run)
    assert not list(run.rglob("*.tmp"))


def test_a_checkpoint_from_before_state_json_committed_them_still_resumes(interrupted, tmp_path, no_unpickling):
    """Runs written by the earlier layout (model.safetensors, train_state/optimizer.safetensors,
    state.json without file names, no checksums) keep resuming."""
    run = shutil.copytree(interrupted / "run", tmp_path / "run")
    state = json.loads((run / S).read_text())
    for key in ("weights", "optimizer", "model"):
        state.pop(key)
    (run / S).write_text(json.dumps(state))
    (run / W).unlink()
    save_file(load_file(str(run / SW)), str(run / W), metadata={"arch": "fbt", "step": "4"})
    save_file(load_file(str(run / SO)), str(run / "train_state" / "optimizer.safetensors"), metadata={"step": "4"})
    (run / SW).unlink(), (run / SO).unlink()
    train(fbt_config(), run, resume=True, progress=False)
    a, b = load_file(str(interrupted / "straight" / W)), load_file(str(run / W))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- 2. a training process killed during a checkpoint write, for real ---------------------

KILL_ARGV = ["train", "--arch", "fbt", "--task", "mix", "--no-progress",
             *[a for s in FAST + ["train.steps=6", "train.checkpoint_every=2", "fbt.feedback_start=0.25"] for a in ("--set", s)]]

# One interpreter, forked once per kill point so the imports are paid once. Child i runs the
# training command and, at the i-th file write of its second checkpoint, leaves the temporary
# file half written, says so in a marker file and sleeps until the test kills it with SIGKILL.
HARNESS = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    import workbench.runtime.checkpoint as checkpoint
    import workbench.runtime.tokenizer as tokenizer
    import workbench.storage.files as files
    import workbench.training.train as training
    from workbench.cli import main

    def say(marker, text):  # atomically: the test polls the marker
        Path(f"{marker}.part").write_text(text)
        os.replace(f"{marker}.part", marker)

    def stall(write_index, marker, argv):
        real_write, real_save = files.atomic_write, training.save_checkpoint
        seen = {"checkpoints": 0, "writes": 0, "inside": False}

        def save(*args, **kwargs):
            seen["checkpoints"] += 1
            seen["inside"] = True
            try:
                return real_save(*args, **kwargs)
            finally:
                seen["inside"] = False

        def write(path, fill):
            if seen["inside"] and seen["checkpoints"] == 2:
                seen["writes"] += 1
                if seen["writes"] == write_index:
                    def torn(tmp):
                        fill(tmp)
                        data = Path(tmp).read_bytes()
                        os.unlink(tmp)  # a new file: a temp that is a hard link must not truncate its source
                        Path(tmp).write_bytes(data[: len(data) // 2])
                        say(marker, f"{os.getpid()} {path}")
                        time.sleep(600)
                    return real_write(path, torn)
            return real_write(path, fill)

        files.atomic_write = checkpoint.atomic_write = tokenizer.atomic_write = training.atomic_write = write
        training.save_checkpoint = save
        main(argv)
        say(marker, "finished")

    base, points = Path(sys.argv[1]), [int(i) for i in sys.argv[2].split(",")]
    children = []
    for index in points:
        pid = os.fork()
        if pid == 0:
            try:
                stall(index, base / f"marker{index}", sys.argv[3:] + ["--out", str(base / f"run{index}")])
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
''')


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the harness forks one process per kill point")
def test_a_process_killed_at_any_checkpoint_write_leaves_a_loadable_run_that_resumes_exactly(tmp_path, no_unpickling):
    # the uninterrupted run, recording every file write of each checkpoint and the weights it saved
    writes, saved, saving = [], {}, []
    real_write, real_save = files.atomic_write, training.save_checkpoint
    writers = [files, checkpoint, tokenizer, training]  # every module that binds the name

    def record_write(path, fill):
        if saving:
            writes.append((saving[-1], Path(path).name))
        return real_write(path, fill)

    def record_save(run_dir, model, opt, cfg, step, tokenizer):
        saved[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        saving.append(step)
        try:
            real_save(run_dir, model, opt, cfg, step, tokenizer)
        finally:
            saving.pop()

    with pytest.MonkeyPatch.context() as patch:
        for module in writers:
            patch.setattr(module, "atomic_write", record_write)
        patch.setattr(training, "save_checkpoint", record_save)
        assert cli(KILL_ARGV + ["--out", str(tmp_path / "straight")])[0] is None
    second = [name for step, name in writes if step == 4]  # the writes of the second checkpoint
    assert {"state.json", W, C, T} <= set(second), second

    points = list(range(1, len(second) + 1))
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), ",".join(map(str, points)), *KILL_ARGV],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        started = time.monotonic()
        while not all((tmp_path / f"marker{i}").is_file() for i in points):
            assert proc.poll() is None and time.monotonic() - started < 240, "the harness did not reach every write"
            time.sleep(0.05)
        for i in points:
            pid, path = (tmp_path / f"marker{i}").read_text().split(" ", 1)
            assert Path(path).name == second[i - 1]
            os.kill(int(pid), signal.SIGKILL)  # a child of the harness, which reaps it
            COUNTS["faults_injected"] += 1
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:  # the test failed: end the harness and its children (its own process group)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    straight = load_file(str(tmp_path / "straight" / W))
    for i in points:
        run = tmp_path / f"run{i}"
        assert any(p.name.endswith(".tmp") for p in run.rglob("*")), "the kill did not land in a write"
        # what is there loads: the previous checkpoint's weights, or the new ones once published
        weights = load_model(run).state_dict()
        if not any(all(torch.equal(weights[k], saved[step][k]) for k in weights) for step in (2, 4)):
            COUNTS["data_lost"] += 1
            pytest.fail(f"killed while writing {second[i - 1]}: the run's weights are neither checkpoint's")
        CharTokenizer.load(run)
        code, _, err = cli(["train", "--out", str(run), "--resume", "--no-progress"])
        if code is not None:
            COUNTS["data_lost"] += 1
            pytest.fail(f"killed while writing {second[i - 1]}: resume failed: {err}")
        final = load_file(str(run / W))
        assert all(torch.equal(final[k], straight[k]) for k in straight), f"killed while writing {second[i - 1]}"
        assert strip_timing(run / "metrics.jsonl") == strip_timing(tmp_path / "straight" / "metrics.jsonl")
        assert not list(run.rglob("*.tmp")), "temporary files outlived the resume"


# ---- 3. NaN injected into a training step -------------------------------------------------


@contextlib.contextmanager
def poisoned(step: int, where: str):
    """Within the context, training step ``step`` makes a parameter NaN or its gradient inf."""
    real = training.make_strategy

    def make(cfg):
        strategy = real(cfg)
        prepare = strategy.prepare

        def poisoned(model, s):
            model = prepare(model, s)
            if s == step:
                p = next(model.parameters())
                if where == "parameter":
                    with torch.no_grad():
                        p.view(-1)[0] = float("nan")
                else:
                    p.register_hook(lambda g: g * float("inf"))
            return model

        strategy.prepare = poisoned
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
    with poisoned(6, where), pytest.raises(TrainingDiverged, match=rf"non-finite {kind} at step 6 .*last checkpoint \(step 4\) in .* is intact"):
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


# ---- 4. the command line, fuzzed ----------------------------------------------------------


class ReachedRealWork(BaseException):
    """A fuzzed command line passed validation: the strategies built a valid command."""


def real_work(*args, **kwargs):
    raise ReachedRealWork(args, kwargs)


# where each verb's real work starts; generate is left alone (a debug model's generation is cheap,
# and its argument checks live inside it)
HEAVY = [("workbench.training.train", "load_task"), ("workbench.training.zoo", "train_zoo"), ("workbench.demo", "cache_parity"),
         ("subprocess", "call"), ("workbench.runtime.export", "export_hf"),
         ("workbench.training.evaluate", "evaluate_examples"), ("workbench.probing.store", "cache_activations"),
         ("workbench.probing.study", "cache_activations"), ("workbench.dynamics.study", "rollout"),
         ("workbench.studies.traces", "run_traces"), ("workbench.bench", "build_model"), ("workbench.bench", "_store_rss")]

NAMES = st.text(max_size=12).filter(lambda s: ":" not in s)  # unicode junk, never ARCH:PRESET
INTS = st.integers(-(10**6), 10**6).map(str)
NUMBERS = st.one_of(INTS, INTS, st.integers(-(10**30), 10**30).map(str), st.floats().map(repr),
                    st.sampled_from(["nan", "inf", "1e309", "0x10", "", " ", "1_0", "٣", "--5", "2**8", "exact"]))
PATHS = st.one_of(NAMES, st.sampled_from(["out", "a/b/c", "afile", "afile/below", ".", "/proc/denied/x"]))
TASKS = st.one_of(NAMES, st.sampled_from(["chain", "mix", "modsum", "sudoku", "jsonl:nowhere.jsonl", "text:", "hf:"]))
REGIMES = st.one_of(NAMES, st.sampled_from(["standard", "soft,fused", "standard,soft,fused", ",,", "greedy"]))
HOOKS = st.one_of(NAMES, st.sampled_from(["blocks.*.hook_resid_post", "hook_embed", "blocks.9.hook_q", "*"]))
UNKNOWN_FLAGS = st.sampled_from(["--bogus", "--zz-top", "-Q", "--Out", "---x"])  # no prefix of a real flag
BAD_OVERRIDES = st.one_of(
    NAMES.filter(lambda s: "=" not in s),
    st.sampled_from(["train.lr=-1", "train.lr=nan", "train.lr=inf", "train.steps=0", "train.steps=ten", "model.d_model=30",
                     "model.n_layers=0", "hd.streams=4,2", "fbt.three_pass_fraction=1.5", "data.task=sudoku", "nosection.x=1",
                     "train.nofield=1", "train.lr", "=", "", "train.seq_len=4096", "model.d_model=abc", "data.modsum_p=1",
                     "train.grad_accum=3", "hd.supervise=none", "train.beta1=2", "model.norm_eps=nan", "model.n_heads=-4"]))

# (flag,) for a switch, (flag, values) for an option; REQUIRED ones are in every example
OPTIONS = {
    "demo": [("--out", PATHS), ("--preset", NAMES), ("--seed", NUMBERS)],
    "generate": [("--prompt", NAMES), ("--regime", REGIMES), ("--passes", NUMBERS), ("--max-new-tokens", NUMBERS),
                 ("--temperature", NUMBERS), ("--top-k", NUMBERS), ("--seed", NUMBERS), ("--json", PATHS)],
    "export": [("--json", PATHS)],
    "train": [("--arch", st.sampled_from(["baseline", "fbt", "hd", "gpt", ""])), ("--preset", NAMES), ("--task", TASKS),
              ("--out", PATHS), ("--set", BAD_OVERRIDES), ("--init-from", PATHS), ("--stop-after", NUMBERS), ("--json", PATHS),
              ("--resume",), ("--no-progress",)],
    "eval": [("--n", NUMBERS), ("--passes", NUMBERS), ("--task", TASKS), ("--json", PATHS)],
    "zoo": [("--preset", st.sampled_from(["micro", "cpu"])), ("--out", PATHS), ("--only", NAMES), ("--json", PATHS), ("--no-progress",)],
    "cache": [("--hooks", HOOKS), ("--task", TASKS), ("--n-sequences", NUMBERS), ("--prefill", st.sampled_from(["standard", "recurrent", "x"])),
              ("--passes", NUMBERS), ("--seed", NUMBERS), ("--out", PATHS), ("--json", PATHS)],
    "probe": [("--target", st.sampled_from(["memory", "running_sum", "value", "x"])), ("--hooks", HOOKS),
              ("--passes", st.one_of(NUMBERS, st.sampled_from(["2,3", "0,1", "a,b", ","]))), ("--n-sequences", NUMBERS),
              ("--seed", NUMBERS), ("--out", PATHS), ("--json", PATHS), ("--no-exact",)],
    "dynamics": [(flag, NUMBERS) for flag in ("--horizon", "--perturb-at", "--spectra", "--fixed-points", "--starts",
                                              "--max-passes", "--fp-steps")] + [("--out", PATHS), ("--json", PATHS)],
    "traces": [("--task", st.one_of(NAMES, st.sampled_from(["chain", "gsm8k-jsonl:nowhere.jsonl"]))), ("--regimes", REGIMES),
               ("--passes", NUMBERS), ("--n-problems", NUMBERS), ("--difficulty", st.one_of(NAMES, st.sampled_from(["1..4", "0..2", "4..1"]))),
               ("--max-new-tokens", NUMBERS), ("--seed", NUMBERS), ("--out", PATHS), ("--json", PATHS)],
    "presets": [("--json", PATHS)],
    "app": [("--runs", PATHS), ("--port", NUMBERS), ("--address", NAMES)],
    "bench": [("--preset", NAMES), ("--reps", NUMBERS), ("--only", NAMES), ("--store-positions", NUMBERS), ("--out", PATHS)],
}
REQUIRED = {"generate": ["--prompt"], "train": ["--out"], "cache": ["--hooks", "--out"], "probe": ["--target"],
            "dynamics": ["--out"], "traces": ["--out"]}


def is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def tokens_of(option) -> st.SearchStrategy:
    flag, *values = option
    return st.tuples(st.just(flag), values[0]).map(list) if values else st.just([flag])


def argv_strategy(verb: str, bad_runs: list[str], bad_models: list[str], resume_bad: list[str], a_file: str):
    """[VERB, positionals, required options, random options, tail]. Every example carries a poison
    that makes it fail before real work whatever the random part holds: a positional run or model
    that cannot load, or a tail that is an argparse error or an invalid value (the tail comes last,
    so for a single-valued option it is the value that counts)."""
    run, model = st.sampled_from(bad_runs), st.sampled_from(bad_models)
    argparse_error = st.one_of(UNKNOWN_FLAGS.map(lambda f: [f]), st.tuples(UNKNOWN_FLAGS, NAMES).map(list))
    options = {o[0]: o for o in OPTIONS[verb]}
    required = st.tuples(*[tokens_of(options[f]) for f in REQUIRED.get(verb, [])]).map(lambda parts: sum(parts, []))
    random = st.lists(st.one_of(*map(tokens_of, OPTIONS[verb])), max_size=6).map(lambda parts: sum(parts, []))
    # generate: a loadable debug model is allowed when the tail is an argument generate() rejects
    generate = st.one_of(
        st.tuples(model.map(lambda m: [m]), st.just([])),
        st.tuples(st.sampled_from(["baseline:debug", "fbt:debug", "hd:debug:3"]).map(lambda m: [m]),
                  st.one_of(st.sampled_from(["0", "-3", "129", "100000"]).map(lambda n: ["--max-new-tokens", n]),
                            st.sampled_from(["greedy", ",", "standard,beam"]).map(lambda r: ["--regime", r]),
                            st.sampled_from(["-1", "-0.5", "-inf"]).map(lambda t: ["--temperature", t]),
                            st.sampled_from(["0", "-2"]).map(lambda k: ["--top-k", k]), argparse_error)))
    head_tail = {
        "generate": generate,
        "export": st.tuples(st.tuples(model, PATHS).map(list), st.just([])),
        "cache": st.tuples(model.map(lambda m: [m]), st.just([])),
        "eval": st.tuples(run.map(lambda r: [r]), st.just([])),
        "probe": st.tuples(run.map(lambda r: [r]), st.just([])),
        "dynamics": st.tuples(st.lists(run, min_size=1, max_size=3), st.just([])),
        "traces": st.tuples(st.lists(run, min_size=1, max_size=3), st.just([])),
        "demo": st.tuples(st.just([]), st.one_of(
            argparse_error, NAMES.filter(lambda s: not is_int(s)).map(lambda s: ["--seed", s]),
            st.one_of(NAMES, st.sampled_from(["huge", "DEBUG", "debug "])).filter(lambda s: s not in ("debug", "tiny", "small", "gpu"))
            .map(lambda p: ["--preset", p]))),
        "train": st.tuples(st.just([]), st.one_of(
            argparse_error, BAD_OVERRIDES.map(lambda o: ["--set", o]),
            st.sampled_from(["sudoku", "jsonl", "", "chain "]).map(lambda t: ["--task", t]),
            st.sampled_from(resume_bad).map(lambda r: ["--resume", "--out", r]))),
        "zoo": st.tuples(st.just([]), st.one_of(argparse_error, st.sampled_from(["huge", "", "MICRO"]).map(lambda p: ["--preset", p]),
                                                st.sampled_from([["--out"], ["--only"]]))),
        "presets": st.tuples(st.just([]), st.one_of(argparse_error, NAMES.map(lambda s: [s]), st.just(["--json"]))),
        "app": st.tuples(st.just([]), st.one_of(
            argparse_error, st.sampled_from(["0", "65536", "-1", "http", "", "80.5", "1e3"]).map(lambda p: ["--port", p]),
            st.just(["--runs", a_file]))),
        # bench checks --reps and every --only key before measuring anything
        "bench": st.tuples(st.just([]), st.one_of(
            argparse_error, st.sampled_from(["4", "0", "-5", "five", "", "5.0"]).map(lambda r: ["--reps", r]),
            NAMES.map(lambda k: ["--only", k + "?"]), st.sampled_from(["huge", "", "SMALL"]).map(lambda p: ["--preset", p]))),
    }[verb]
    return st.tuples(head_tail, required, random).map(lambda t: [verb, *t[0][0], *t[1], *t[2], *t[0][1]])


@pytest.fixture(scope="module")
def fuzz_targets(tmp_path_factory, pristine):
    """Runs that fail to load (for verbs that load one), specs that fail to resolve, and run
    directories that fail to resume."""
    base = tmp_path_factory.mktemp("fuzz_targets")
    (base / "afile").write_text("not a run")
    (base / "empty").mkdir()
    for name, fault in [("truncated", lambda r: truncate(0.5)(r / W)), ("no-weights", lambda r: remove(r / W)),
                        ("garbage-config", lambda r: write("x")(r / C)), ("wrong-arch", lambda r: other_arch(r / C)),
                        ("nan-weights", lambda r: nan_weight(r / W))]:
        fault(shutil.copytree(pristine["fbt"], base / name))
    bad_runs = [str(base / n) for n in ("afile", "empty", "truncated", "no-weights", "garbage-config", "wrong-arch", "nan-weights")]
    bad_runs += [str(base / "nowhere"), "no/such/run", "rün😀", "gpt:debug", "\x00"]
    for r in bad_runs:
        with pytest.raises((ValueError, OSError)):
            load_model(r)
    bad_models = bad_runs + ["fbt:huge", "fbt:debug:x", "fbt:debug:99999999999999999999999", "::", "hd:debug:1:2", "baseline:"]
    resume_bad = [str(base / "nowhere"), str(base / "garbage-config"), str(pristine["fbt"])]  # the last: no training state
    return {"bad_runs": bad_runs, "bad_models": bad_models, "resume_bad": resume_bad, "a_file": str(base / "afile"), "base": base}


VERBS = ["demo", "generate", "export", "train", "eval", "zoo", "cache", "probe", "dynamics", "traces", "presets", "app", "bench"]
FUZZ_EXAMPLES = 200  # per verb


@pytest.mark.parametrize("verb", VERBS)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_command_lines_are_usage_errors_never_tracebacks(fuzz_targets, pristine, tmp_path, monkeypatch, no_unpickling, verb, data):
    """Every example is an invalid command line (see ``argv_strategy``); the only acceptable
    outcomes are exit status 2 with a message, or 0 for --help. Nothing the examples point at changes."""
    if Path.cwd() != tmp_path:  # once per test: the examples share the directory and the patches
        # import every module before patching any: a module first imported under the patches would
        # bind a patched name (``from workbench.probing.store import cache_activations``) for good
        modules = [importlib.import_module(module) for module, _ in HEAVY]
        for module, (_, name) in zip(modules, HEAVY):
            monkeypatch.setattr(module, name, real_work)
        monkeypatch.chdir(tmp_path)
        (tmp_path / "afile").write_text("a file where a directory is expected")
    before = stamps(fuzz_targets["base"]), stamps(pristine["fbt"].parent)
    t = fuzz_targets
    argv = data.draw(argv_strategy(verb, t["bad_runs"], t["bad_models"], t["resume_bad"], t["a_file"]), label="argv")
    COUNTS["inputs_tried"] += 1
    code, out, err = cli(argv)
    assert code is not None, f"{argv} ran to completion"
    if code == 0:
        assert "usage:" in out, (argv, out)  # --help, or an abbreviation of it
    else:
        assert code == 2 and "Traceback" not in err and "error" in err, (argv, code, err)
    assert_nothing_lost(before[0], stamps(t["base"]))
    assert_nothing_lost(before[1], stamps(pristine["fbt"].parent))


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb):
    code, out, _ = cli([verb, "--help"])
    assert code == 0 and "usage: workbench " + verb in out


@pytest.mark.parametrize("argv,path", [
    (["generate", "fbt:debug", "--prompt", "a", "--max-new-tokens", "1", "--json", "afile/out.json"], "afile/out.json"),
    (["export", "baseline:debug", "afile/hf"], "afile/hf"),
    (["traces", "nowhere", "--out", "afile/traces"], "afile/traces"),
    (["train", "--out", "afile/run", "--no-progress", *[a for s in FAST + ["train.steps=1"] for a in ("--set", s)]], "afile/run"),
])
def test_an_unwritable_output_path_is_a_usage_error(tmp_path, monkeypatch, argv, path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file where a directory is expected")
    COUNTS["faults_injected"] += 1
    assert_usage_error(argv, "afile")
    assert (tmp_path / "afile").read_text() == "a file where a directory is expected"


# ---- 5. rollouts past the context and to divergence --------------------------------------


def inf_at_step(step: int):
    """A hook that makes the value path W_U h infinite from rollout step ``step`` on (it fires once per step)."""
    calls = []

    def hook(x, hook):
        calls.append(1)
        return x * float("inf") if len(calls) > step else x

    return hook


def test_a_rollout_past_the_context_that_then_diverges_names_the_step():
    model = build_model("fbt", "debug")  # n_ctx 128: a 4-token prompt slides at steps 124 and 188
    COUNTS["faults_injected"] += 1
    with model.hooks(fwd_hooks=[("fusion.hook_value", inf_at_step(200))]):
        with pytest.raises(RolloutDiverged, match="at step 200 "):
            rollout(model, tokens(1, 4)[0].tolist(), 400, perturb_at=150)
    assert len(rollout(model, tokens(1, 4)[0].tolist(), 300).slid_at) == 3  # and without the fault it runs on


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_exploding_feedback_map_is_reported_not_plotted_as_zeros(dtype):
    """W_U scaled so the fused input overflows: RMSNorm would turn the overflowing stream into a
    finite zero state, so the rollout must look at the residual stream, not only at h."""
    model = build_model("fbt", "debug", dtype=dtype)
    with torch.no_grad():
        model.fusion.W_U.weight.mul_(1e30 if dtype == torch.float32 else 1e300)
    COUNTS["faults_injected"] += 1
    with pytest.raises(RolloutDiverged, match="overflowed at step 0 "):
        rollout(model, tokens(1, 4)[0].tolist(), 20)


@pytest.mark.parametrize("kwargs,match", [
    (dict(horizon=0), "horizon=0"),
    (dict(prompt=[]), "at least one token"),
    (dict(prompt=list(range(4, 100)) * 2), "192 tokens is longer than the context n_ctx=128"),
    (dict(tokens=[500] * 5), "token id 500 is outside the vocabulary"),
    (dict(tokens=[5, 6]), "needs 5 tokens, got 2"),
    (dict(perturb_at=5), r"perturb_at=5: expected a step in \[0, 5\)"),
    (dict(context_rule="wrap"), "context_rule='wrap'"),
])
def test_bad_rollout_arguments_name_the_value(kwargs, match):
    model = build_model("fbt", "debug")
    args = {"prompt": [5, 6, 7], "horizon": 5, **kwargs}
    with pytest.raises(ValueError, match=match):
        rollout(model, args.pop("prompt"), args.pop("horizon"), **args)


def test_a_prompt_that_fills_the_context_stops_at_once_with_the_reason():
    out = rollout(build_model("fbt", "debug"), list(range(4, 100)) + list(range(4, 36)), 10, context_rule="stop")
    assert out.tokens == [] and out.states.shape == (0, 32) and "context full after 128 tokens" in out.stopped


def test_the_dynamics_cli_reports_a_rollout_that_diverges_past_the_context(tmp_path, monkeypatch):
    import workbench.dynamics.study as study

    run = save_model(build_model("fbt", "debug"), tmp_path / "fbt")
    real = study.load_model

    def diverging(path, *args, **kwargs):
        model = real(path, *args, **kwargs)
        model.add_hook("fusion.hook_value", inf_at_step(90), is_permanent=True)
        return model

    monkeypatch.setattr(study, "load_model", diverging)
    COUNTS["faults_injected"] += 1
    # the default prompt is 62 tokens, so the 128-token window slides at step 66, before the fault; the
    # hook's first 8 calls are the own-dtype check's soft steps, so its 91st call is fp64 rollout step 82
    assert_usage_error(["dynamics", str(run), "--horizon", "150", "--perturb-at", "5", "--spectra", "1", "--fixed-points", "0",
                        "--max-passes", "2", "--out", str(tmp_path / "out")],  # names the run, the site and the step
                       match=re.escape(str(run)) + r": blocks\.0\.ln1 input overflowed at step 82 \(token \d+\): the carried state diverged$")
    assert not (tmp_path / "out" / "dynamics.json").exists()
