"""The explicit attention path (the one ``hook_pattern`` forces) against SDPA and the textbook
formula, and rotary against its textbook formula."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import tokens

from models.attention import Attention, apply_rotary, attention_mask
from models.config import ModelConfig


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
