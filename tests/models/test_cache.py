"""Cached (incremental) decoding equals the full forward pass."""

import torch
from helpers import sequential_fbt_states, tokens

from workbench import build_model


def _plain_kwargs(model, toks):
    # FBT: compare the plain backbone; the fused semantics are tested below
    return {"fuse_mask": torch.zeros_like(toks, dtype=torch.bool)} if model.arch == "fbt" else {}


def test_cached_equals_full_forward(any_model):
    toks = tokens(2, 14)
    kw = _plain_kwargs(any_model, toks)
    with torch.no_grad():
        full = any_model(toks, **kw)
        cache = any_model.make_cache()
        chunks = [(0, 5), (5, 6), (6, 9), (9, 10), (10, 14)]  # prefill, single steps, multi-token chunks
        parts = [any_model(toks[:, a:b], cache=cache, **{k: v[:, a:b] for k, v in kw.items()}) for a, b in chunks]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 14


def test_cached_equals_full_with_left_padding(any_model):
    """A left-padded row, prefilled then decoded with the cache, matches the row alone."""
    toks = tokens(1, 10)
    padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), toks), dim=1)
    mask = torch.cat((torch.zeros(1, 3, dtype=torch.bool), torch.ones(1, 10, dtype=torch.bool)), dim=1)
    kw = _plain_kwargs(any_model, padded)
    with torch.no_grad():
        alone = any_model(toks, **_plain_kwargs(any_model, toks))
        cache = any_model.make_cache()
        first = any_model(padded[:, :8], cache=cache, attention_mask=mask[:, :8], **{k: v[:, :8] for k, v in kw.items()})
        rest = [any_model(padded[:, t : t + 1], cache=cache, **{k: v[:, t : t + 1] for k, v in kw.items()}) for t in range(8, 13)]
    got = torch.cat([first] + rest, dim=1)[:, 3:]
    torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-5)


def test_fbt_soft_cached_equals_uncached_recurrence():
    model = build_model("fbt", "debug")
    toks = tokens(2, 10)
    prompt = 4
    with torch.no_grad():
        cache = model.make_cache()
        h = [model.final_states(toks[:, :prompt], fuse_mask=torch.zeros(2, prompt, dtype=torch.bool), cache=cache)]
        for t in range(prompt, 10):  # soft: each generated step is fused with the cached state
            h.append(model.final_states(toks[:, t : t + 1], cache=cache))
        cached = torch.cat(h, dim=1)
        reference = sequential_fbt_states(model, toks, fuse_start=prompt)
    torch.testing.assert_close(cached, reference, atol=1e-5, rtol=1e-5)
    # the feedback matters: the plain backbone differs from the recurrence after the prompt
    plain = model.final_states(toks, fuse_mask=torch.zeros_like(toks, dtype=torch.bool))
    assert (plain[:, prompt:] - reference[:, prompt:]).abs().max() > 1e-2
