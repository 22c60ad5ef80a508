"""Checkpoints (issue #12): a full disk during a checkpoint and integer weights are each stopped
with one line naming the file and the problem; atomic writes are synced to the disk (file and
directory) before they count as done.

``COUNTS`` is this fault class's tally, printed at the end of the session (``tests/faultkit.py``)."""

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from faultkit import assert_usage_error, tally
from workbench import build_model, load_model, save_model
from workbench.checkpoint import load_weights, save_weights, write_json
from workbench.runconfig import make_run_config
from workbench.train import train

COUNTS = tally("checkpoints, configs, tokenizers (#12)")
W, C, T = "model.safetensors", "config.json", "tokenizer.json"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return save_model(build_model("fbt", "debug"), tmp_path_factory.mktemp("pristine") / "fbt")


def copy_of(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "run")


# ---- a full disk during a checkpoint, for real -------------------------------------------

TRAIN = ["train.batch_size=4", "train.seq_len=32", "train.warmup=1", "data.n_train=100", "train.steps=4", "train.checkpoint_every=2"]


def file_size_limit(limit: int):
    def preexec():  # in the child: writes past ``limit`` bytes fail with EFBIG instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_last_checkpoint_resumes(tmp_path):
    """The second checkpoint (step 4) is written by a process whose files may not grow past half
    the weights' size: safetensors' own writer fails with EFBIG, as on a full disk."""
    cfg = make_run_config("fbt", "debug", "modsum", TRAIN)
    train(cfg, tmp_path / "straight", progress=False)
    run = tmp_path / "run"
    train(cfg, run, progress=False, stop_after=2)
    step2 = load_file(str(run / W))
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--out", str(run), "--resume", "--no-progress"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          preexec_fn=file_size_limit((run / W).stat().st_size // 2))
    COUNTS["faults_injected"] += 1
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert re.fullmatch(rf"workbench train: error: \[Errno 27\] cannot write {re.escape(str(run))}/train_state/model-4\.safetensors: "
                        r"File too large\n", proc.stderr), proc.stderr
    assert json.loads((run / "train_state" / "state.json").read_text())["step"] == 2 and not list(run.rglob("*.tmp"))
    weights = load_model(run).state_dict()
    if not all(torch.equal(weights[k], step2[k]) for k in step2):
        COUNTS["data_lost"] += 1
    assert all(torch.equal(weights[k], step2[k]) for k in step2)
    train(cfg, run, resume=True, progress=False)
    a, b = load_file(str(tmp_path / "straight" / W)), load_file(str(run / W))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_safetensors_write_error_is_an_oserror_naming_the_file_with_its_errno(tmp_path):
    """The same fault in this process: files may briefly not grow past 1000 bytes."""
    path = tmp_path / W
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    try:
        with pytest.raises(OSError, match=rf"^\[Errno 27\] cannot write {re.escape(str(path))}: File too large$") as info:
            save_weights(path, {"x": torch.zeros(1000)})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    COUNTS["faults_injected"] += 1
    assert info.value.errno == 27 and not list(tmp_path.iterdir())  # no temporary file left


# ---- durable atomic writes ---------------------------------------------------------------


def test_atomic_writes_sync_the_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.realpath(src), os.path.realpath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    directory = os.path.realpath(tmp_path)
    for path, write in [(tmp_path / "a.json", lambda p: write_json(p, {"a": 1})),
                        (tmp_path / W, lambda p: save_weights(p, {"x": torch.ones(3)}))]:
        events.clear()
        write(path)
        tmp = events[0][1]
        assert Path(tmp).name.startswith(f".{path.name}.") and tmp.endswith(".tmp")
        assert events == [("fsync", tmp), ("replace", tmp, os.path.realpath(path)), ("fsync", directory)]


# ---- weights of integer or bool dtype ----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_weights_are_an_error_naming_the_file_the_tensor_and_the_dtype(pristine, tmp_path, no_unpickling, dtype):
    run = copy_of(pristine, tmp_path)
    tensors, meta = load_weights(run / W)
    tensors["ln_final.w"] = tensors["ln_final.w"].to(dtype)  # ones: they would load as 1.0 without a word
    save_weights(run / W, tensors, meta)
    COUNTS["faults_injected"] += 1
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(run / W))}: tensor 'ln_final.w' has dtype {name}; model weights "
                                         "must be floating point$"):
        load_model(run)
    assert_usage_error(["generate", str(run), "--prompt", "a"], str(run / W), "'ln_final.w'", f"dtype {name}")
