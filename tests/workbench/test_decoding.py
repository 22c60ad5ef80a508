"""Generation: batching, regimes, sampling, stopping."""

import pytest
import torch
from helpers import sequential_fbt_states, tokens

from workbench import build_model, generate


def _prompts():
    rows = tokens(3, 9, seed=4).tolist()
    return [rows[0][:9], rows[1][:4], rows[2][:6]]


@pytest.mark.parametrize(
    "arch,regime", [("baseline", "standard"), ("hd", "standard"), ("fbt", "standard"), ("fbt", "soft"), ("fbt", "fused")]
)
def test_batched_ragged_generation_equals_one_prompt_at_a_time(arch, regime):
    model = build_model(arch, "debug", **({"n_streams": 2} if arch == "hd" else {}))
    prompts = _prompts()
    passes = 3
    batch = generate(model, prompts, regime=regime, passes=passes, max_new_tokens=8)
    for i, p in enumerate(prompts):
        alone = generate(model, [p], regime=regime, passes=passes, max_new_tokens=8)
        assert batch.new_tokens[i].tolist() == alone.new_tokens[0].tolist()
        torch.testing.assert_close(batch.states[i], alone.states[0], atol=1e-5, rtol=1e-5)
    assert batch.prompt_lengths == [9, 4, 6]


def test_regimes_give_the_documented_recurrences():
    model = build_model("fbt", "debug", dtype=torch.float64)
    prompt = tokens(1, 6)
    soft = generate(model, prompt, regime="soft", max_new_tokens=6)
    exact = generate(model, prompt, regime="fused", passes="exact", max_new_tokens=6)
    full_k = generate(model, prompt, regime="fused", passes=6, max_new_tokens=6)
    # soft: plain prompt, then fused steps, i.e. the recurrence with the fused region after the prompt
    seq = sequential_fbt_states(model, soft.tokens[:, :-1], fuse_start=6)
    torch.testing.assert_close(soft.states, seq[:, 5:], atol=1e-10, rtol=0)
    # fused with K = prompt length equals the exact sequential prefill
    assert torch.equal(exact.new_tokens, full_k.new_tokens)
    torch.testing.assert_close(exact.states, full_k.states, atol=1e-10, rtol=0)
    seq = sequential_fbt_states(model, exact.tokens[:, :-1], fuse_start=0)
    torch.testing.assert_close(exact.states, seq[:, 5:], atol=1e-10, rtol=0)


def test_standard_fbt_generation_is_the_backbone():
    fbt = build_model("fbt", "debug")
    baseline = build_model("baseline", "debug")
    baseline.load_state_dict(fbt.state_dict(), strict=False)
    prompt = tokens(2, 5)
    a = generate(fbt, prompt, max_new_tokens=10)
    b = generate(baseline, prompt, max_new_tokens=10)
    assert torch.equal(a.new_tokens, b.new_tokens)


def test_greedy_matches_argmax_of_full_forward():
    model = build_model("hd", "debug", n_streams=2)
    prompt = tokens(2, 5)
    out = generate(model, prompt, max_new_tokens=6)
    with torch.no_grad():
        logits = model(out.tokens[:, :-1])
    assert torch.equal(logits[:, 4:].argmax(-1), out.new_tokens)


def test_sampling_is_seeded_and_top_k_restricts():
    model = build_model("baseline", "debug")
    prompt = tokens(2, 4)
    a = generate(model, prompt, temperature=1.0, top_k=3, seed=7, max_new_tokens=20)
    b = generate(model, prompt, temperature=1.0, top_k=3, seed=7, max_new_tokens=20)
    c = generate(model, prompt, temperature=1.0, top_k=3, seed=8, max_new_tokens=20)
    assert torch.equal(a.new_tokens, b.new_tokens) and not torch.equal(a.new_tokens, c.new_tokens)
    with torch.no_grad():
        logits = model(a.tokens[:, :-1])[:, 3:]
    top3 = logits.topk(3, dim=-1).indices
    assert torch.all((top3 == a.new_tokens[..., None]).any(-1))


def test_eos_stops_rows_and_pads_after():
    model = build_model("baseline", "debug")
    prompt = tokens(2, 4)
    kw = dict(max_new_tokens=12, temperature=1.0, seed=3)
    free = generate(model, prompt, **kw).new_tokens
    row = free[0].tolist()
    k = next(i for i in range(1, 12) if row[i] not in row[:i])  # a token first emitted at step k
    out = generate(model, prompt, eos_token_id=row[k], pad_token_id=0, **kw)
    assert int(out.lengths[0]) == k + 1 and out.finished[0]
    assert out.completions()[0] == row[: k + 1]
    assert torch.all(out.new_tokens[0, k + 1 :] == 0)
    other = free[1].tolist()
    stop = other.index(row[k]) + 1 if row[k] in other else 12
    assert out.completions()[1] == other[:stop]


@pytest.mark.parametrize("arch", ["baseline", "fbt", "hd"])
def test_bfloat16_models_run_and_track_fp32(arch):
    kw = {"n_streams": 2} if arch == "hd" else {}
    ref = build_model(arch, "debug", **kw)
    half = build_model(arch, "debug", dtype=torch.bfloat16, **kw)
    toks = tokens(2, 100)  # late positions: rotary angles must not be rounded to bf16
    with torch.no_grad():
        a, b = ref(toks), half(toks).float()
    assert b.dtype == torch.float32 and (a - b).abs().max() < 0.05 * a.abs().max()
    out = generate(half, toks[:, :10], regime="soft" if arch == "fbt" else "standard", max_new_tokens=4)
    assert out.states.dtype == torch.bfloat16


def test_scored_completions_match_the_full_forward_and_the_recurrence():
    import torch.nn.functional as F

    from workbench.runtime.decoding import score_completions

    toks = tokens(2, 10)
    prompts = [toks[0, :4].tolist(), toks[1, :6].tolist()]
    completions = [toks[0, 4:].tolist(), toks[1, 6:9].tolist()]
    baseline = build_model("baseline", "debug")
    nll = score_completions(baseline, prompts, completions)
    with torch.no_grad():
        logp = F.log_softmax(baseline(toks[:1]), -1)
    want = -logp[0, 3:9].gather(1, toks[0, 4:10, None])[:, 0]
    torch.testing.assert_close(nll[0], want, atol=1e-5, rtol=1e-5)
    assert torch.isnan(nll[1, 3:]).all() and not torch.isnan(nll[1, :3]).any()

    fbt = build_model("fbt", "debug", dtype=torch.float64)
    soft = score_completions(fbt, prompts[:1], completions[:1], regime="soft")
    h = sequential_fbt_states(fbt, toks[:1], fuse_start=4)
    logp = fbt.readout(h).log_softmax(-1)
    torch.testing.assert_close(soft[0], -logp[0, 3:9].gather(1, toks[0, 4:10, None])[:, 0].float(), atol=1e-5, rtol=1e-5)


def test_sampling_at_extreme_temperatures_is_greedy_or_uniform_never_nan():
    """softmax(l / T) is shift-invariant, so sample() divides l - max(l): at T = 1e-300 every
    non-maximal logit goes to -inf (the draw is the argmax), at T = 1e300 all go to 0 (uniform);
    dividing l itself overflowed to inf and NaN probabilities."""
    from workbench.runtime.decoding import sample

    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(0)) * 5
    gen = torch.Generator().manual_seed(1)
    assert torch.equal(sample(logits, 1e-300, None, gen), logits.argmax(dim=-1))
    draws = sample(logits[:1].expand(20000, -1), 1e300, None, gen)
    counts = torch.bincount(draws, minlength=100).float()
    assert counts.min() > 100 and counts.max() < 300  # uniform: 200 per id, 6 sigma ~ 84
