"""Hidden Decoding: stream factorisation, causality, expansion, readout."""

import pytest
import torch
import torch.nn.functional as F
from helpers import tokens

from models import expand_streams, unstack_streams
from workbench import build_model


def _states_by_layer(model, toks, stream_noise=None):
    """Every block's resid_post [layer, batch, pos, n_streams, d_model]; optionally add noise to
    the embedding of one stream (``(stream, token_slice)``)."""
    hooks = []
    if stream_noise is not None:
        stream, where = stream_noise

        def perturb(x, hook):
            x = x.clone()
            x[:, where, stream] += torch.randn_like(x[:, where, stream])
            return x

        hooks.append(("hook_stream_embed", perturb))
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_resid_post"))
    return torch.stack(
        [unstack_streams(cache[f"blocks.{i}.hook_resid_post"], model.n_streams) for i in range(model.cfg.n_layers)]
    )


def test_intra_stream_layers_keep_streams_apart():
    n = 3
    model = build_model("hd", "debug", n_streams=n, n_layers=3, cross_layers=(2,))
    toks = tokens(2, 8)
    clean = _states_by_layer(model, toks)
    for s_prime in range(n):
        noisy = _states_by_layer(model, toks, (s_prime, slice(None)))
        for s in range(n):
            diff = (noisy[:2, :, :, s] - clean[:2, :, :, s]).abs().max()  # layers 0, 1: intra-stream
            assert (diff == 0) == (s != s_prime), (s, s_prime, diff)
        # the cross-stream layer mixes the perturbed stream into the later streams
        later = [s for s in range(n) if s > s_prime]
        if later:
            assert (noisy[2, :, :, later] - clean[2, :, :, later]).abs().max() > 0


@pytest.mark.parametrize("window", [None, 4])
def test_no_position_sees_a_later_token_or_a_later_stream(window):
    n = 3
    model = build_model("hd", "debug", n_streams=n, n_layers=3, cross_layers=(1, 2), cross_window=window)
    toks = tokens(2, 8)
    clean = _states_by_layer(model, toks)
    j = 5
    changed = toks.clone()
    changed[:, j] = (changed[:, j] + 1) % 100
    moved = _states_by_layer(model, changed)
    assert torch.equal(moved[:, :, :j], clean[:, :, :j])  # every layer, every stream of earlier tokens
    assert (moved[:, :, j] - clean[:, :, j]).abs().max() > 0
    # within token j, stream s is untouched by streams after it (interleaved causality)
    for s_prime in range(1, n):
        noisy = _states_by_layer(model, toks, (s_prime, slice(j, j + 1)))
        assert torch.equal(noisy[:, :, j, :s_prime], clean[:, :, j, :s_prime])
        assert torch.equal(noisy[:, :, :j], clean[:, :, :j])


def test_intra_stream_layers_never_build_an_interleaved_mask(monkeypatch):
    n, L = 4, 16
    model = build_model("hd", "debug", n_streams=n, n_layers=3, cross_layers=(1,))
    seen = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        seen.append((q.shape[-2], k.shape[-2], None if attn_mask is None else tuple(attn_mask.shape[-2:])))
        return real_sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    toks = tokens(2, L)
    pad_mask = torch.ones(2, L, dtype=torch.bool)
    pad_mask[1, :3] = False
    with torch.no_grad():
        model(toks)
        model(toks, attention_mask=pad_mask)
        cache = model.make_cache()
        model(toks[:, :10], cache=cache)
        model(toks[:, 10:11], cache=cache)
    # one SDPA call per layer per forward; only the cross-stream layer (index 1) works at
    # interleaved length, the intra-stream ones see at most L tokens per stream
    assert len(seen) == 4 * 3
    cross = [s for i, s in enumerate(seen) if i % 3 == 1]
    intra = [s for i, s in enumerate(seen) if i % 3 != 1]
    assert all(max(s[0], s[1]) <= L and (s[2] is None or max(s[2]) <= L) for s in intra), intra
    assert all(max(s[0], s[1]) > L for s in cross), cross


def test_hd_with_one_stream_is_the_baseline():
    baseline = build_model("baseline", "debug", seed=5)
    hd = expand_streams(baseline, 1)
    toks = tokens(2, 12)
    with torch.no_grad():
        assert torch.equal(hd(toks), baseline(toks))


def test_expansion_replicates_tables_cyclically_and_chains():
    baseline = build_model("baseline", "debug", seed=5)
    hd2 = expand_streams(baseline, 2)
    with torch.no_grad():
        hd2.embed.W_E[1] += 1.0  # make E_2 distinguishable from E_1
    hd4 = expand_streams(hd2, 4)
    W = hd4.embed.W_E
    assert torch.equal(W[0], baseline.embed.W_E) and torch.equal(W[2], W[0])
    assert torch.equal(W[1], hd2.embed.W_E[1]) and torch.equal(W[3], W[1])
    assert torch.equal(hd4.blocks[1].mlp.W_out.weight, baseline.blocks[1].mlp.W_out.weight)
    with pytest.raises(ValueError, match="n_streams=2"):
        expand_streams(hd4, 2)


def test_readout_last_stream_and_sum_ablation():
    model = build_model("hd", "debug", n_streams=3)
    toks = tokens(1, 5)
    with torch.no_grad():
        every = model(toks, all_streams=True)
        assert every.shape == (1, 5, 3, 128)
        torch.testing.assert_close(model(toks), every[:, :, -1])
        model.cfg.readout = "sum"
        torch.testing.assert_close(model(toks), every.sum(dim=2), atol=1e-5, rtol=1e-5)


def test_interleaved_positions_option_changes_cross_layers_only():
    a = build_model("hd", "debug", n_streams=2, cross_layers=())
    b = build_model("hd", "debug", n_streams=2, cross_layers=(), positions="interleaved")
    toks = tokens(1, 6)
    with torch.no_grad():
        assert not torch.equal(a(toks), b(toks))  # rotary phases differ per stream


def test_unstack_streams_checks_its_input():
    x = torch.arange(2 * 6 * 3).view(2, 6, 3)
    assert unstack_streams(x, 3).shape == (2, 2, 3, 3)
    assert torch.equal(unstack_streams(x, 3)[:, 1, 0], x[:, 3])
    with pytest.raises(ValueError, match="n_streams=4"):
        unstack_streams(x, 4)


@pytest.mark.parametrize("n", [2, 4])
def test_expanding_a_baseline_with_one_cross_stream_layer_keeps_its_function(n):
    """Replicated tables make every stream the same until the one cross-stream layer; there the last
    stream attends to n copies of each earlier key (the same softmax weights), and later layers are
    intra-stream: the last stream computes the baseline exactly (up to round-off). So continued
    pretraining of HD starts at the baseline's loss."""
    baseline = build_model("baseline", "debug", seed=5, n_layers=4)
    hd = expand_streams(baseline, n, cross_layers=(2,))
    toks = tokens(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(hd(toks), baseline(toks), atol=1e-5, rtol=0)


def _logit_gap(small, big, toks) -> float:
    with torch.no_grad():
        return float((big(toks) - small(toks)).abs().max())


# (what the expansion is, the expansion, does it keep the function)
EXPANSIONS = [
    ("1 -> 2, one cross layer", lambda m: expand_streams(m, 2, cross_layers=(1,)), True),
    ("1 -> 4, one cross layer", lambda m: expand_streams(m, 4, cross_layers=(1,)), True),
    ("1 -> 2, cross layer at the bottom", lambda m: expand_streams(m, 2, cross_layers=(0,)), True),
    ("1 -> 2, two cross layers", lambda m: expand_streams(m, 2, cross_layers=(0, 1)), False),
    ("1 -> 2, interleaved positions", lambda m: expand_streams(m, 2, cross_layers=(1,), positions="interleaved"), False),
    ("1 -> 2, cross window of 3 positions", lambda m: expand_streams(m, 2, cross_layers=(1,), cross_window=3), False),
    ("1 -> 2, sum readout", lambda m: expand_streams(m, 2, cross_layers=(1,), readout="sum"), False),
    ("1 -> 2, shared key/value cache", lambda m: expand_streams(m, 2, cross_layers=(1,), kv="shared"), False),
]


@pytest.mark.parametrize("what,expand,keeps", EXPANSIONS, ids=[e[0] for e in EXPANSIONS])
def test_cyclic_replication_keeps_the_smaller_models_function_only_with_one_cross_layer(what, expand, keeps):
    """Replicated streams compute the same states up to the cross-stream layer. There the last
    stream of token i sees every stream of tokens <= i, i.e. each of the smaller model's keys
    n times over with the same value, so its softmax gives the same weights and the same output;
    after it, intra-stream layers keep the last stream to itself. So the expanded model's logits
    equal the smaller model's (to round-off, in fp64). A second cross layer reads the earlier
    streams, which the first one made differ (stream 0 of token i sees only one copy of token i);
    interleaved positions give the copies different rotary phases; a window cuts copies unevenly;
    a sum readout adds the other streams; with the shared key/value cache the cross layer sees two
    copies of its own token's key but one of each earlier token's (only the last stream's stays),
    so the weights shift: then the function changes."""
    torch.manual_seed(0)
    base = build_model("baseline", "debug", seed=3).double()
    gap = _logit_gap(base, expand(base), tokens(2, 24))
    assert (gap < 1e-12) if keeps else (gap > 1e-4), (what, gap)


def test_expanding_an_hd_model_keeps_its_function_when_the_new_n_is_a_multiple():
    """2 -> 4 replicates each old stream twice (E_3 <- E_1, E_4 <- E_2): the same argument; 2 -> 3
    (E_3 <- E_1) repeats only stream 1, so token i's copies are weighted unevenly."""
    base = build_model("baseline", "debug", seed=3).double()
    hd2 = expand_streams(base, 2, cross_layers=(1,))
    with torch.no_grad():
        hd2.embed.W_E[1] += 0.5 * torch.randn_like(hd2.embed.W_E[1])  # a 2-stream model whose streams differ
    toks = tokens(2, 24)
    assert _logit_gap(hd2, expand_streams(hd2, 4), toks) < 1e-12
    assert _logit_gap(hd2, expand_streams(hd2, 3), toks) > 1e-4


@pytest.mark.parametrize("mode", ["intra", "cross"])
def test_shared_kv_lets_later_tokens_see_only_the_last_stream(mode):
    """The shared key/value cache ablation, read off the attention pattern of one layer: a query at
    (token i, stream s) puts weight on exactly the last stream of tokens j < i and, at token i, on
    its own stream (intra-stream layer) or on streams <= s (cross-stream layer). Written here as
    loops over (token, stream) pairs, independently of the model's mask."""
    n, L = 3, 5
    layer = 1
    cross = (layer,) if mode == "cross" else (0,)
    model = build_model("hd", "debug", n_streams=n, n_layers=2, cross_layers=cross, kv="shared")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(1, L), names_filter=lambda name: name.endswith("hook_pattern"))
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0]  # [n_heads, n * L, n * L], interleaved
    for i in range(L):
        for s in range(n):
            for j in range(L):
                for t in range(n):
                    own = t == s if mode == "intra" else t <= s
                    allowed = (j < i and t == n - 1) or (j == i and own)
                    weight = pattern[:, i * n + s, j * n + t]
                    assert bool((weight > 0).all()) if allowed else bool((weight == 0).all()), (i, s, j, t, weight)


def test_shared_kv_changes_the_function_only_after_the_first_token():
    """Same weights, separate vs shared cache: equal logits at token 0 (no earlier token to hide),
    different after it; with one stream the two are one model."""
    separate = build_model("hd", "debug", n_streams=3)
    shared = build_model("hd", "debug", n_streams=3, kv="shared")
    shared.load_state_dict(separate.state_dict())
    toks = tokens(2, 6)
    with torch.no_grad():
        a, b = separate(toks), shared(toks)
    torch.testing.assert_close(a[:, 0], b[:, 0], atol=1e-6, rtol=0)
    assert (a[:, 1:] - b[:, 1:]).abs().max() > 1e-3
    one, one_shared = build_model("hd", "debug", n_streams=1), build_model("hd", "debug", n_streams=1, kv="shared")
    one_shared.load_state_dict(one.state_dict())
    with torch.no_grad():
        assert torch.equal(one(toks), one_shared(toks))
    assert expand_streams(shared, 6).cfg.kv == "shared"  # expansion keeps the ablation


def test_kv_mirror_is_the_unmirrored_model_when_no_mirrored_layer_attends_across_streams():
    """Past the last cross-stream layer the other streams reach no output (each intra-stream layer
    keeps them apart and only the last stream is read out), so computing the last stream alone
    there gives the same logits, and the same gradients up to summation order."""
    toks = tokens(2, 9)
    models = [build_model("hd", "debug", n_streams=3, n_layers=4, cross_layers=(1,), kv_mirror=m) for m in (None, 2)]
    models[1].load_state_dict(models[0].state_dict())
    logits = [model(toks) for model in models]
    assert torch.equal(logits[0], logits[1])
    grads = []
    for model, out in zip(models, logits):
        F.cross_entropy(out[:, :-1].flatten(0, 1), toks[:, 1:].flatten()).backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-7, rtol=1e-5, msg=name)


def test_a_mirrored_cross_stream_layer_attends_to_the_source_layers_keys_and_values():
    """Recomputed by hand in fp64 from the hooks: the last stream's query at token i attends over
    every stream of tokens <= i, the other streams' keys and values being the source layer's
    (layer kv_mirror - 1) and the last stream's its own; the output is that attention."""
    n, L, H, dh = 3, 6, 4, 8
    model = build_model("hd", "debug", n_streams=n, n_layers=3, cross_layers=(2,), kv_mirror=2).double()
    names = [f"blocks.{i}.attn.hook_{x}" for i in (1, 2) for x in "qkvz"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(1, L), names_filter=lambda name: name in names)
    source_k, source_v = cache["blocks.1.attn.hook_k"][0], cache["blocks.1.attn.hook_v"][0]  # [n * L, heads, d_head]
    q, k, v, z = (cache[f"blocks.2.attn.hook_{x}"][0] for x in "qkvz")  # [L, heads, d_head]: the last stream
    assert q.shape == (L, H, dh) and z.shape == (L, H, dh)
    keys, values = source_k.clone(), source_v.clone()
    keys[n - 1 :: n], values[n - 1 :: n] = k, v
    for i in range(L):
        scores = torch.einsum("hd,phd->hp", q[i], keys[: (i + 1) * n]) / dh**0.5
        expected = torch.einsum("hp,phd->hd", scores.softmax(dim=-1), values[: (i + 1) * n])
        torch.testing.assert_close(z[i], expected, atol=1e-12, rtol=0)


def test_kv_mirror_settings_that_would_read_the_skipped_streams_are_refused():
    from workbench.storage.errors import BadInput

    for overrides, message in [
        ({"kv_mirror": 0}, r"layer in \[1, 2\)"),
        ({"kv_mirror": 2}, r"layer in \[1, 2\)"),
        ({"kv_mirror": 1, "readout": "sum"}, "readout='last'"),
        ({"kv_mirror": 1, "kv": "shared"}, "kv='separate'"),
    ]:
        with pytest.raises(BadInput, match=message):
            build_model("hd", "debug", n_streams=2, **overrides)
    assert expand_streams(build_model("hd", "debug", n_streams=2, kv_mirror=1), 4).cfg.kv_mirror == 1
