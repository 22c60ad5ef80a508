"""Checkpoints, configs and tokenizers: a full disk during a checkpoint, integer weights,
non-finite or absurd config values, inconsistent tokenizer vocabularies and unbounded pass counts
are each stopped with one line naming the file (or field) and the problem; atomic writes are
synced to the disk (file and directory) before they count as done.

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
from helpers import C, T, W, assert_usage_error, tally, tokens
from safetensors.torch import load_file

from workbench import CharTokenizer, build_model, generate, load_model, save_model
from workbench.dynamics.feedback import kpass_convergence
from workbench.runtime.checkpoint import load_weights, save_weights
from workbench.runtime.decoding import score_completions
from workbench.storage.files import write_json
from workbench.training.runconfig import make_run_config
from workbench.training.train import train

COUNTS = tally("checkpoints, configs, tokenizers")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return save_model(build_model("fbt", "debug"), tmp_path_factory.mktemp("pristine") / "fbt")


def copy_of(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "run")


# ---- a full disk during a checkpoint, for real -------------------------------------------

TRAIN = [
    "train.batch_size=4",
    "train.seq_len=32",
    "train.warmup=1",
    "data.n_train=100",
    "train.steps=4",
    "train.checkpoint_every=2",
]


def file_size_limit(limit: int):
    def preexec():  # in the child: writes past ``limit`` bytes fail with EFBIG instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_last_checkpoint_resumes(tmp_path):
    """The second checkpoint (step 4) is written by a process whose files may not grow past half
    the weights' size: safetensors' own writer fails with EFBIG, as on a full disk."""
    cfg = make_run_config("fbt", "debug", "modsum", TRAIN)
    train(cfg, tmp_path / "straight", progress=False)
    run = tmp_path / "run"
    train(cfg, run, progress=False, stop_after=2)
    step2 = load_file(str(run / W))
    proc = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "train", "--out", str(run), "--resume", "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=file_size_limit((run / W).stat().st_size // 2),
    )
    COUNTS["faults_injected"] += 1
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert re.fullmatch(
        rf"workbench train: error: \[Errno 27\] cannot write {re.escape(str(run))}/train_state/model-4\.safetensors: "
        r"File too large\n",
        proc.stderr,
    ), proc.stderr
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
    for path, write in [
        (tmp_path / "a.json", lambda p: write_json(p, {"a": 1})),
        (tmp_path / W, lambda p: save_weights(p, {"x": torch.ones(3)})),
    ]:
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
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(run / W))}: tensor 'ln_final.w' has dtype {name}; model weights "
        "must be floating point$",
    ):
        load_model(run)
    assert_usage_error(["generate", str(run), "--prompt", "a"], str(run / W), "'ln_final.w'", f"dtype {name}")


# ---- non-finite and absurd config values -------------------------------------------------

CONFIG_VALUES = [
    ("rope_base", float("inf"), "rope_base=inf: expected a finite number > 1"),
    ("rope_base", 1.0, "rope_base=1.0: expected a finite number > 1"),
    ("rope_base", 0.5, "rope_base=0.5: expected a finite number > 1"),
    ("norm_eps", 1e300, r"norm_eps=1e\+300: expected a number in \(0, 1\)"),
    ("norm_eps", float("inf"), r"norm_eps=inf: expected a number in \(0, 1\)"),
    ("norm_eps", 1.0, r"norm_eps=1.0: expected a number in \(0, 1\)"),
    ("norm_eps", 0.0, r"norm_eps=0.0: expected a number in \(0, 1\)"),
    ("init_std", float("inf"), "init_std=inf: expected a finite number > 0"),
    ("init_std", -float("inf"), "init_std=-inf: expected a finite number > 0"),
]


@pytest.mark.parametrize("field,value,match", CONFIG_VALUES)
def test_a_saved_config_with_a_non_finite_or_absurd_value_names_the_field(pristine, tmp_path, field, value, match):
    run = copy_of(pristine, tmp_path)
    config = json.loads((run / C).read_text())
    config["model"][field] = value
    (run / C).write_text(json.dumps(config))  # JSON writes inf as Infinity, which json.loads accepts
    assert ("Infinity" in (run / C).read_text()) == (abs(value) == float("inf"))
    COUNTS["faults_injected"] += 1
    with pytest.raises(ValueError, match=rf"bad model config in {re.escape(str(run / C))}: config field {match}"):
        load_model(run)
    assert_usage_error(["generate", str(run), "--prompt", "a"], str(run / C), match=match)


@pytest.mark.parametrize("field,value,match", CONFIG_VALUES)
def test_a_set_override_with_a_non_finite_or_absurd_value_names_the_field(tmp_path, monkeypatch, field, value, match):
    monkeypatch.chdir(tmp_path)
    COUNTS["inputs_tried"] += 1
    assert_usage_error(
        ["train", "--arch", "fbt", "--out", "x", "--set", f"model.{field}={value!r}", *[a for s in TRAIN for a in ("--set", s)]],
        match=f"config field {match}",
    )
    assert not (tmp_path / "x").exists()


# ---- tokenizers whose ids do not mean what every tool assumes ----------------------------


def edit_tokenizer(change):
    def edit(run):
        data = json.loads((run / T).read_text())
        change(data["model"]["vocab"], {t["content"]: t for t in data["added_tokens"]})
        (run / T).write_text(json.dumps(data))

    return edit


def swap(a, b):
    def change(vocab, added):
        vocab[a], vocab[b] = vocab[b], vocab[a]
        for x, _y in ((a, b), (b, a)):
            if x in added:
                added[x]["id"] = vocab[x]

    return change


TOKENIZERS = [
    (
        "two tokens share an id",
        edit_tokenizer(lambda v, a: v.update(a=5)),
        r"maps several tokens to one id: id 5 <- \[' ', 'a'\]",
    ),
    (
        "several pairs share ids",
        edit_tokenizer(lambda v, a: v.update({c: 10 + i for i, c in enumerate("abcd")})),
        r"maps several tokens to one id: id 10 <- .*; id 11 <- .*; id 12 <- .* \(and 1 more\)",
    ),
    ("<pad> and <eos> swapped", edit_tokenizer(swap("<pad>", "<eos>")), "<pad> is id 2, <eos> is id 0"),
    ("<unk> and 'a' swapped", edit_tokenizer(swap("<unk>", "a")), "<unk> is id 70$"),
    ("<bos> and <unk> swapped", edit_tokenizer(swap("<bos>", "<unk>")), "<bos> is id 3, <unk> is id 1$"),
]


@pytest.mark.parametrize("name,fault,match", TOKENIZERS, ids=[t[0] for t in TOKENIZERS])
def test_a_tokenizer_that_maps_ids_inconsistently_is_rejected_naming_the_entries(pristine, tmp_path, name, fault, match):
    run = copy_of(pristine, tmp_path)
    fault(run)
    COUNTS["faults_injected"] += 1
    if "swapped" in name:
        match = r"special tokens must be at ids 0 <pad>, 1 <bos>, 2 <eos>, 3 <unk>: " + match
    with pytest.raises(ValueError, match=match) as info:
        CharTokenizer.load(run)
    assert str(run / T) in str(info.value) and "\n" not in str(info.value)
    assert_usage_error(["generate", str(run), "--prompt", "a"], str(run / T), match=match)


def test_the_default_tokenizer_passes_its_own_checks(tmp_path):
    CharTokenizer().save(tmp_path)
    tok = CharTokenizer.load(tmp_path)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)


# ---- unbounded pass counts ---------------------------------------------------------------

EXACT = r"passes=129 is more than the context n_ctx=128: K = the prompt length is already the exact recurrence \(use 'exact'\)"


def test_a_pass_count_past_the_context_is_rejected_before_any_work():
    model = build_model("fbt", "debug")  # n_ctx 128
    calls = model.forward_calls
    with pytest.raises(ValueError, match="^" + EXACT):
        generate(model, tokens(1, 4), regime="fused", passes=129, max_new_tokens=2)
    with pytest.raises(ValueError, match="^" + EXACT):
        score_completions(model, [[5, 6]], [[7]], regime="fused", passes=129)
    with pytest.raises(ValueError, match="^max_" + EXACT):
        kpass_convergence(model, tokens(1, 6)[0].tolist(), 129)
    assert model.forward_calls == calls
    generate(model, tokens(1, 4), regime="fused", passes=128, max_new_tokens=1)  # the bound itself is allowed


def test_unbounded_passes_on_the_command_line_are_usage_errors(pristine, tmp_path):
    COUNTS["inputs_tried"] += 2
    assert_usage_error(
        ["generate", str(pristine), "--prompt", "a", "--regimes", "fused", "--passes", str(10**9)],
        match=r"passes=1000000000 is more than the context n_ctx=128: .*\(use 'exact'\)",
    )
    out = tmp_path / "out"
    assert_usage_error(
        ["dynamics", str(pristine), "--horizon", "30", "--perturb-at", "5", "--max-passes", "129", "--out", str(out)],
        match="max_" + EXACT,
    )
    assert not (out / "dynamics.json").exists()


def test_eval_rejects_an_unbounded_pass_count_before_scoring_anything(monkeypatch):
    import workbench.training.evaluate as evaluate
    from workbench.data.splits import heldout_task

    def scored(*args, **kwargs):
        raise AssertionError("plain_loss ran before the pass count was checked")

    monkeypatch.setattr(evaluate, "plain_loss", scored)
    model, tok = build_model("fbt", "debug"), CharTokenizer()
    with pytest.raises(ValueError, match="^" + EXACT):
        evaluate.evaluate_examples(model, heldout_task("modsum", 2, 0)[:2], tok, fused_passes=129)
