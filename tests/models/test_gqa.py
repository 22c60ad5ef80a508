"""Grouped-query attention (``n_kv_heads``) and the untied readout (``tie_embeddings=False``) in
every architecture: the grouping convention, cached == full forward, hook shapes, export parity
with ``transformers``, and checkpoints written before these fields existed."""

import json

import pytest
import torch
from helpers import tokens

from models import ConfigError, ModelConfig
from workbench import build_model, load_model, save_model

ARCHS = {"baseline": {}, "fbt": {}, "hd": {"n_streams": 3}}


@pytest.mark.parametrize("n_kv_heads", [1, 2])
@pytest.mark.parametrize("arch", ARCHS)
def test_grouped_query_attention_is_attention_with_each_kv_head_shared_by_its_group(arch, n_kv_heads):
    """A GQA model equals the multi-head model whose key/value projections repeat each GQA head for
    the n_heads / n_kv_heads query heads of its group (query head h reads key/value head h // group,
    the Hugging Face Llama convention)."""
    gqa = build_model(arch, "debug", n_kv_heads=n_kv_heads, **ARCHS[arch])
    mha = build_model(arch, "debug", **ARCHS[arch])
    group, d_head = gqa.cfg.n_heads // n_kv_heads, gqa.cfg.d_head
    state = gqa.state_dict()
    for name, value in list(state.items()):
        if name.endswith(("attn.W_K.weight", "attn.W_V.weight")):  # [n_kv_heads * d_head, d_model]
            state[name] = value.view(n_kv_heads, d_head, -1).repeat_interleave(group, dim=0).reshape(-1, value.shape[-1])
    mha.load_state_dict(state)
    toks = tokens(2, 12)
    kwargs = {"passes": 2} if arch == "fbt" else {}
    with torch.no_grad():
        torch.testing.assert_close(gqa(toks, **kwargs), mha(toks, **kwargs), atol=1e-6, rtol=1e-6)
    assert sum(p.numel() for p in gqa.parameters()) < sum(p.numel() for p in mha.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_gqa_cached_decoding_equals_the_full_forward_with_padding(arch):
    model = build_model(arch, "debug", n_kv_heads=2, tie_embeddings=False, **ARCHS[arch])
    toks = tokens(2, 12)
    mask = torch.ones_like(toks, dtype=torch.bool)
    mask[1, :3] = False
    plain = {"fuse_mask": torch.zeros_like(toks, dtype=torch.bool)} if arch == "fbt" else {}
    with torch.no_grad():
        full = model(toks, attention_mask=mask, **plain)
        for static in (False, True):
            cache = model.make_cache(16, static=static)
            parts = [model(toks[:, :7], cache=cache, attention_mask=mask[:, :7], **{k: v[:, :7] for k, v in plain.items()})]
            for t in range(7, 12):
                parts.append(model.readout(model.step(toks[:, t : t + 1], cache=cache)))
            got = torch.cat(parts, dim=1)
            torch.testing.assert_close(got[mask], full[mask], atol=1e-5, rtol=1e-5)
            assert cache.layers[0].k.shape[1] == 2  # the cache holds n_kv_heads heads, not n_heads


def test_hooks_carry_n_kv_heads_for_keys_and_values():
    model = build_model("baseline", "debug", n_kv_heads=2)
    _, cache = model.run_with_cache(tokens(1, 6))
    assert cache["blocks.0.attn.hook_q"].shape == (1, 6, 4, 8)
    assert cache["blocks.0.attn.hook_k"].shape == cache["blocks.0.attn.hook_v"].shape == (1, 6, 2, 8)
    assert cache["blocks.0.attn.hook_pattern"].shape == (1, 4, 6, 6)  # one pattern per query head


@pytest.mark.parametrize("arch", ARCHS)
def test_an_untied_readout_is_its_own_matrix(arch):
    model = build_model(arch, "debug", tie_embeddings=False, **ARCHS[arch])
    tied = build_model(arch, "debug", **ARCHS[arch])
    assert model.unembed is not None and model.readout_weight is model.unembed and tied.unembed is None
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in tied.parameters()) == 128 * 32
    toks = tokens(1, 5)
    with torch.no_grad():
        before = model(toks)
        model.unembed.mul_(2.0)  # the readout doubles; the input embedding is untouched
        torch.testing.assert_close(model(toks), 2 * before)
        h = model.final_states(toks) if arch != "hd" else None
    if h is not None:
        torch.testing.assert_close(model.readout(h), h @ model.unembed.T)


def test_n_kv_heads_must_divide_n_heads():
    for bad in (3, 0, 8):
        with pytest.raises(ConfigError, match=f"n_kv_heads={bad}: expected a divisor of n_heads=4"):
            ModelConfig(n_heads=4, n_kv_heads=bad)


@pytest.mark.parametrize("tie", [True, False])
def test_gqa_export_gives_transformers_the_same_logits(tmp_path, tie):
    from transformers import LlamaForCausalLM

    from workbench.runtime.export import export_hf

    model = build_model("baseline", "debug", seed=3, n_kv_heads=2, tie_embeddings=tie)
    hf = LlamaForCausalLM.from_pretrained(export_hf(model, tmp_path / "hf")).eval()
    assert hf.config.num_key_value_heads == 2 and hf.config.tie_word_embeddings is tie
    toks = tokens(2, 20)
    with torch.no_grad():
        torch.testing.assert_close(hf(toks).logits, model(toks), atol=1e-5, rtol=0)


def test_checkpoints_written_before_gqa_load_unchanged(tmp_path):
    """A config.json without ``n_kv_heads`` and ``tie_embeddings`` (every run made before them)
    loads as multi-head attention with a tied readout, computing what it computed."""
    model = build_model("fbt", "debug", seed=5)
    run = save_model(model, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    for field in ("n_kv_heads", "tie_embeddings"):
        del config["model"][field]
    (run / "config.json").write_text(json.dumps(config))
    loaded = load_model(run)
    assert loaded.cfg.n_kv_heads == loaded.cfg.n_heads and loaded.cfg.tie_embeddings and loaded.unembed is None
    toks = tokens(2, 9)
    with torch.no_grad():
        assert torch.equal(loaded(toks, passes=2), model(toks, passes=2))


def test_a_gqa_untied_baseline_expands_into_hidden_decoding_that_starts_where_it_was():
    """Progressive expansion keeps n_kv_heads and the untied readout: HD with one stream expanded
    from such a baseline is that baseline."""
    from models import expand_streams

    base = build_model("baseline", "debug", seed=4, n_kv_heads=2, tie_embeddings=False)
    hd = expand_streams(base, 1)
    assert hd.cfg.n_kv_heads == 2 and hd.unembed is not None and torch.equal(hd.unembed, base.unembed)
    toks = tokens(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(hd(toks), base(toks), atol=1e-6, rtol=1e-6)
