"""``DecoderLM.run_with_cache`` against TransformerLens's own implementation, and the explicit
attention path (the one ``hook_pattern`` forces) against SDPA."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import tokens
from transformer_lens import HookedRootModule

from models.layers import Attention, ModelConfig, apply_rotary, attention_mask
from workbench import build_model

ARCHS = {  # arch: (overrides, forward kwargs)
    "baseline": ({}, {}),
    "fbt": ({}, {"passes": 3}),  # hooks fire once per pass: the cache keeps the last firing
    "hd": ({"n_streams": 2, "cross_window": 5}, {}),  # per-stream 5-d patterns and a windowed cross layer
}


def _model(arch):
    return build_model(arch, "debug", **ARCHS[arch][0])


def _assert_same(reference, ours):
    (ref_out, ref_cache), (out, cache) = reference, ours
    assert torch.equal(out, ref_out) and out.requires_grad == ref_out.requires_grad
    assert isinstance(cache, dict) and list(cache) == list(ref_cache)  # names, in firing order
    for name, ref in ref_cache.items():
        got = cache[name]
        assert got.shape == ref.shape and got.dtype == ref.dtype and got.device == ref.device, name
        assert got.stride() == ref.stride() and not got.requires_grad, name
        assert torch.equal(got, ref), name


def _both(model, *args, **kwargs):
    return HookedRootModule.run_with_cache(model, *args, **kwargs), model.run_with_cache(*args, **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_run_with_cache_equals_transformer_lens_for_every_hook(arch, grad):
    model, kw = _model(arch), ARCHS[arch][1]
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, :4] = False  # left padding: the masked explicit path
    with torch.set_grad_enabled(grad):
        for extra in ({}, {"attention_mask": mask}):
            ref, ours = _both(model, tokens(3, 9), **kw, **extra)
            assert set(ours[1]) == set(model.hook_dict)  # every hook fired
            _assert_same(ref, ours)
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())  # nothing left behind
    assert not model.is_caching and model.context_level == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_run_with_cache_names_filter_device_and_batch_dim(arch):
    model, kw = _model(arch), ARCHS[arch][1]
    toks = tokens(2, 7)
    names = [n for n in model.hook_dict if n.endswith(("hook_pattern", "hook_resid_post"))]
    for names_filter in (names, names[0], lambda n: n.endswith("hook_z"), "no.such.hook", []):
        ref, ours = _both(model, toks, names_filter=names_filter, **kw)
        _assert_same(ref, ours)
    _assert_same(*_both(model, toks, names_filter=names, device="cpu", **kw))
    _assert_same(*_both(model, toks[:1], remove_batch_dim=True, **kw))
    _, cache = model.run_with_cache(toks[:1], remove_batch_dim=True, **kw)
    assert cache["blocks.0.hook_resid_post"].shape[0] == toks.shape[1] * model.n_streams


def test_run_with_cache_errors_as_transformer_lens_and_cleans_up():
    model = _model("baseline")
    with pytest.raises(ValueError, match="names_filter must be"):
        model.run_with_cache(tokens(1, 4), names_filter=("blocks.0.hook_resid_pre",))
    with pytest.raises(AssertionError, match="batch size 2"):
        model.run_with_cache(tokens(2, 4), remove_batch_dim=True)
    with pytest.raises(ValueError, match="outside the vocabulary"):  # the forward itself fails
        model.run_with_cache(torch.full((1, 4), 1000))
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())
    assert not model.is_caching and model.context_level == 0


def test_run_with_cache_sees_what_user_hooks_return_and_leaves_them_attached():
    model = _model("fbt")
    toks = tokens(2, 8)
    zero = ("fusion.hook_state", lambda x, hook: torch.zeros_like(x))
    seen = []
    perma = ("blocks.1.hook_resid_post", lambda x, hook: seen.append(x.shape))
    model.add_perma_hook(*perma)
    try:
        with model.hooks(fwd_hooks=[zero]):
            ref, ours = _both(model, toks, passes=2)
            assert len(model.hook_dict["fusion.hook_state"].fwd_hooks) == 1  # the user's hook survives
        _assert_same(ref, ours)
        assert torch.equal(ours[1]["fusion.hook_state"], torch.zeros_like(ours[1]["fusion.hook_state"]))
        assert len(seen) == 4  # the permanent hook ran in both passes of both calls
        plain = model.run_with_cache(toks, passes=2)[1]["fusion.hook_state"]
        assert plain.abs().max() > 0  # the zeroing hook went with its context
    finally:
        model.reset_hooks(including_permanent=True)


def test_run_with_cache_falls_back_to_transformer_lens_for_its_other_options():
    model = _model("baseline")
    toks = tokens(2, 6)
    _assert_same(*_both(model, toks, pos_slice=-1))
    ref, ours = _both(model, toks, names_filter="blocks.0.hook_resid_pre", reset_hooks_end=False)
    _assert_same(ref, ours)
    model.reset_hooks()


def test_run_with_cache_inside_a_recorder_and_patched_runs():
    """The other capture paths keep working around it: a recorder records the same call."""
    from workbench import ActivationRecorder

    model = _model("baseline")
    toks = tokens(2, 6)
    with torch.no_grad(), ActivationRecorder(model, ["blocks.1.attn.hook_pattern"]) as rec:
        _, cache = model.run_with_cache(toks)
    assert torch.equal(rec.calls("blocks.1.attn.hook_pattern")[0].value, cache["blocks.1.attn.hook_pattern"])


# ---- the explicit attention path ---------------------------------------------------------------


def _attention(dtype, n_heads=4, d_head=8, window=None):
    cfg = ModelConfig(d_model=n_heads * d_head, n_heads=n_heads, n_ctx=64)
    return Attention(cfg, "cross", window).to(dtype), cfg


def _qkv(dtype, rows, n_heads, n_query, n_key, d_head, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(rows, n_heads, n, d_head, generator=g, dtype=dtype) for n in (n_query, n_key, n_key))
    return q, k, v


CASES = {  # name: (rows, n_query, n_key, padded, window)
    "causal": (3, 16, 16, False, None),
    "after-a-cached-past": (3, 5, 16, False, None),
    "one-query": (3, 1, 16, False, None),
    "padded": (3, 16, 16, True, None),
    "windowed": (2, 16, 16, False, 4),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("case", CASES)
def test_explicit_attention_equals_sdpa(dtype, case):
    rows, n_query, n_key, padded, window = CASES[case]
    attn, cfg = _attention(dtype, window=window)
    q, k, v = _qkv(dtype, rows, cfg.n_heads, n_query, n_key, cfg.d_head)
    key_valid = None
    if padded:
        key_valid = torch.ones(rows, n_key, dtype=torch.bool)
        key_valid[0, :5] = False
        key_valid[1, :1] = False
    mask = attention_mask(n_query, n_key, key_valid, window, q.device)
    z = attn._attend_explicit(q, k, v, mask, rows, 1)
    if mask is None:
        sdpa_mask = attention_mask(n_query, n_key, None, None, q.device, explicit=True)
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask)
        if n_query == n_key:
            causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.testing.assert_close(z, causal, atol=1e-6, rtol=0)
    else:
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(z, reference, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("case", CASES)
def test_explicit_pattern_and_gradients_match_the_textbook_formula(dtype, case):
    """softmax(masked_fill(q k^T / sqrt(d), ~mask, -inf)) @ v: the pattern the hook sees, the
    output, and the gradients through both (the scores are masked in place)."""
    rows, n_query, n_key, padded, window = CASES[case]
    attn, cfg = _attention(dtype, window=window)
    key_valid = None
    if padded:
        key_valid = torch.ones(rows, n_key, dtype=torch.bool)
        key_valid[0, :5] = False
    mask = attention_mask(n_query, n_key, key_valid, window, torch.device("cpu"))
    full = mask if mask is not None else attention_mask(n_query, n_key, None, None, torch.device("cpu"), explicit=True)
    seen = []
    attn.hook_pattern.add_hook(lambda p, hook: seen.append(p))
    inputs = [t.requires_grad_() for t in _qkv(dtype, rows, cfg.n_heads, n_query, n_key, cfg.d_head, seed=1)]
    ref_inputs = [t.detach().clone().requires_grad_() for t in inputs]

    z = attn._attend_explicit(*inputs, mask, rows, 1)
    (z.square().sum() + (seen[0] * torch.arange(n_key, dtype=dtype)).sum()).backward()
    q, k, v = ref_inputs
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(cfg.d_head)
    pattern = scores.masked_fill(~full, float("-inf")).softmax(dim=-1)
    ref_z = pattern @ v
    (ref_z.square().sum() + (pattern * torch.arange(n_key, dtype=dtype)).sum()).backward()

    assert torch.all(seen[0].masked_select(~full.expand_as(seen[0])) == 0)  # masked keys: exactly 0
    torch.testing.assert_close(seen[0], pattern, atol=1e-6, rtol=0)
    torch.testing.assert_close(z, ref_z, atol=1e-6, rtol=0)
    for got, ref in zip(inputs, ref_inputs):
        torch.testing.assert_close(got.grad, ref.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["causal", "padded"])
def test_non_finite_scores_at_masked_keys_stay_masked(case):
    """Like masked_fill, the mask overrides whatever a masked score holds: NaN or inf in a future
    (or padding) key does not reach the queries that cannot see it."""
    rows, n_query, n_key = 2, 8, 8
    attn, cfg = _attention(torch.float32)
    q, k, v = _qkv(torch.float32, rows, cfg.n_heads, n_query, n_key, cfg.d_head)
    key_valid = None
    if case == "padded":
        key_valid = torch.ones(rows, n_key, dtype=torch.bool)
        key_valid[:, :3] = False
        k[:, :, 1], k[:, :, 2] = float("nan"), float("inf")  # padding keys
    else:
        k[:, :, -1], k[:, :, -2] = float("nan"), float("inf")  # the last two keys
    mask = attention_mask(n_query, n_key, key_valid, None, q.device)
    z = attn._attend_explicit(q, k, v, mask, rows, 1)
    visible = slice(3, None) if case == "padded" else slice(0, n_key - 2)
    assert torch.isfinite(z[:, :, visible]).all()


def test_hooked_patterns_leave_every_model_output_within_1e_6(any_model):
    toks = tokens(2, 11)
    kw = {"passes": 3} if any_model.arch == "fbt" else {}
    with torch.no_grad():
        fast = any_model(toks, **kw)
        any_model.compute_patterns()
        slow = any_model(toks, **kw)
        any_model.compute_patterns(False)
    torch.testing.assert_close(slow, fast, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_apply_rotary_is_bit_for_bit_the_textbook_formula(dtype, layout):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 7, 4, 16, generator=g).to(dtype)  # [batch, pos, n_heads, d_head]
    angles = torch.randn(2, 7, 1, 8, generator=g)
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(dtype)
    if layout == "transposed":  # [batch, n_heads, pos, d_head] views, as attention holds them
        x, cos, sin = x.transpose(1, 2), cos.transpose(1, 2), sin.transpose(1, 2)
    rotated = torch.cat((-x[..., 8:], x[..., :8]), dim=-1)
    out = apply_rotary(x, cos, sin)
    assert torch.equal(out, x * cos + rotated * sin) and out.is_contiguous()
