"""Hugging Face export, TransformerLens's TransformerBridge and nnsight on our models."""

import json

import pytest
import torch
from helpers import tokens

from models import expand_streams
from workbench import CharTokenizer, build_model
from workbench.runtime.export import export_hf


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = build_model("baseline", "debug", seed=11)
    out = export_hf(model, tmp_path_factory.mktemp("hf"))
    return model, out


def test_export_loads_in_transformers_with_equal_logits(exported):
    from transformers import AutoTokenizer, LlamaForCausalLM

    model, out = exported
    hf = LlamaForCausalLM.from_pretrained(out).eval()
    toks = tokens(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(hf(toks).logits, model(toks), atol=1e-4, rtol=0)
    tok = AutoTokenizer.from_pretrained(out)
    ids = CharTokenizer().encode("a+b = 3\n")
    assert tok("a+b = 3\n").input_ids == ids and tok.decode(ids) == "a+b = 3\n"
    note = json.loads((out / "workbench_export.json").read_text())
    assert note["exact"] is True
    assert note["files"] == sorted(
        p.name for p in out.iterdir() if not p.name.startswith(".") and p.name != "workbench_export.json"
    )


def test_export_loads_in_transformer_bridge_with_equal_logits(exported):
    from transformer_lens.model_bridge import TransformerBridge

    model, out = exported
    bridge = TransformerBridge.boot_transformers(str(out), device="cpu")
    toks = tokens(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(bridge(toks), model(toks), atol=1e-4, rtol=0)
        _, cache = bridge.run_with_cache(toks)
        _, ours = model.run_with_cache(toks)
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"], ours["blocks.1.hook_resid_post"], atol=1e-5, rtol=0)


def test_fbt_and_hd_export_their_backbone(tmp_path):
    from transformers import LlamaForCausalLM

    toks = tokens(1, 10)
    fbt = build_model("fbt", "debug", seed=2)
    hf = LlamaForCausalLM.from_pretrained(export_hf(fbt, tmp_path / "fbt")).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(toks).logits, fbt(toks), atol=1e-4, rtol=0)  # the standard regime
    note = json.loads((tmp_path / "fbt" / "workbench_export.json").read_text())
    assert note["exact"] is False and "fusion.W_U.weight" in note["dropped"]
    hd1 = expand_streams(build_model("baseline", "debug", seed=2), 1)
    hf = LlamaForCausalLM.from_pretrained(export_hf(hd1, tmp_path / "hd")).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(toks).logits, hd1(toks), atol=1e-4, rtol=0)


def test_nnsight_and_transformer_lens_zero_the_carried_state_identically():
    from nnsight import NNsight

    model = build_model("fbt", "debug")
    toks = tokens(2, 10)
    traced = NNsight(model)
    with torch.no_grad():
        with traced.trace(toks, passes=2):
            state = traced.fusion.hook_state.output.save()
            traced.fusion.hook_state.output = torch.zeros_like(traced.fusion.hook_state.output)
            nn_logits = traced.output.save()
        tl_logits = model.run_with_hooks(toks, passes=2, fwd_hooks=[("fusion.hook_state", lambda x, hook: torch.zeros_like(x))])
        plain = model(toks, passes=2)
    assert torch.equal(nn_logits, tl_logits)
    assert (plain - tl_logits).abs().max() > 1e-3
    h1 = model.final_states(toks)  # pass 1's carried states, shifted right, are what pass 2 reads
    torch.testing.assert_close(state[:, 1:], h1[:, :-1])


def test_nnsight_overwrites_the_fused_input():
    from nnsight import NNsight

    model = build_model("fbt", "debug")
    toks = tokens(2, 10)
    traced = NNsight(model)
    with torch.no_grad():
        with traced.trace(toks, passes=2):
            traced.fusion.hook_fused.output = traced.embed.output  # feed pass 2 plain embeddings
            logits = traced.output.save()
        standard = model(toks)
    torch.testing.assert_close(logits, standard)


def test_nnsight_reads_attention_patterns_once_forced():
    from nnsight import NNsight

    model = build_model("baseline", "debug")
    model.compute_patterns()
    toks = tokens(1, 7)
    traced = NNsight(model)
    with torch.no_grad():
        with traced.trace(toks):
            pattern = traced.blocks[1].attn.hook_pattern.output.save()
        _, cache = model.run_with_cache(toks, names_filter="blocks.1.attn.hook_pattern")
    assert pattern.shape == (1, 4, 7, 7)
    torch.testing.assert_close(pattern, cache["blocks.1.attn.hook_pattern"])


# ---- the export's "exact" flag agrees with an actual logits comparison ---------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: build_model("baseline", "debug", seed=3),
        lambda: expand_streams(build_model("baseline", "debug", seed=3), 1),
        lambda: build_model("hd", "debug", seed=3, n_streams=1, cross_window=2),
        lambda: build_model("hd", "debug", seed=3, n_streams=1, cross_window=2, cross_layers=(0, 1)),
        lambda: build_model(
            "hd", "debug", seed=3, n_streams=1, cross_window=128
        ),  # a window as long as the context restricts nothing
        lambda: build_model("hd", "debug", seed=3, n_streams=1, positions="interleaved", readout="sum"),
        lambda: build_model("hd", "debug", seed=3, n_streams=2),
    ],
    ids=["baseline", "hd1", "hd1-window2", "hd1-window2-all-cross", "hd1-window-n_ctx", "hd1-interleaved-sum", "hd2"],
)
def test_export_exact_flag_matches_the_exported_logits(make, tmp_path):
    from transformers import LlamaForCausalLM

    model = make()
    out = export_hf(model, tmp_path / "hf")
    hf = LlamaForCausalLM.from_pretrained(out).eval()
    toks = tokens(2, model.cfg.n_ctx)  # the whole context: a window shorter than it must show
    with torch.no_grad():
        gap = (hf(toks).logits - model(toks)).abs().max().item()
    note = json.loads((out / "workbench_export.json").read_text())
    assert note["exact"] == (gap < 1e-4), (note, gap)
    if not note["exact"] and model.arch == "hd" and model.n_streams == 1:
        assert any("cross_window" in d for d in note["dropped"]), note
