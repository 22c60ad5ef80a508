"""Full-Bandwidth semantics: Jacobi exactness, the standard regime, gradients, fusions."""

from pathlib import Path

import pytest
import torch
from helpers import sequential_fbt_states, tokens

from models import expand_streams
from workbench import build_model


@pytest.mark.parametrize("fuse_start", [0, 3])
def test_k_pass_equals_recurrence_on_exact_positions(fuse_start):
    model = build_model("fbt", "debug", dtype=torch.float64)
    toks = tokens(2, 10)
    L = toks.shape[1]
    fuse = (torch.arange(L) >= fuse_start).expand(2, L)
    with torch.no_grad():
        exact = sequential_fbt_states(model, toks, fuse_start)
        for k in range(1, L + 1):
            h = model.run_passes(toks, k, fuse_mask=fuse)[-1]
            n_exact = max(fuse_start, 1) + k - 1  # after k passes: positions below max(p, 1) + k - 1 are exact
            err = (h - exact).abs().amax(dim=(0, 2))
            assert err[:n_exact].max() < 1e-12, (k, err)
            if n_exact < L:  # and the next position is not yet exact (the test can fail)
                assert err[n_exact] > 1e-6, (k, err)


def test_fused_prefill_with_cache_continues_the_recurrence():
    """K-pass prefill of the whole prompt with K = prompt length, then cached steps, is the exact
    recurrence everywhere."""
    model = build_model("fbt", "debug", dtype=torch.float64)
    toks = tokens(2, 9)
    with torch.no_grad():
        cache = model.make_cache()
        h = [model.final_states(toks[:, :5], passes=5, cache=cache)]
        h += [model.final_states(toks[:, t : t + 1], cache=cache) for t in range(5, 9)]
        torch.testing.assert_close(torch.cat(h, 1), sequential_fbt_states(model, toks), atol=1e-12, rtol=0)


def test_the_models_regimes_at_the_prompt_and_at_a_step():
    """``prefill``/``step`` own what a regime means: fused + 'exact' is the recurrence at every
    position (all states returned), fused K-pass is exact on its first K positions, soft steps
    continue the recurrence, standard is plain; a baseline knows only standard."""
    model = build_model("fbt", "debug", dtype=torch.float64)
    toks = tokens(2, 9)
    truth = sequential_fbt_states(model, toks)
    with torch.no_grad():
        torch.testing.assert_close(model.prefill(toks, regime="fused", passes="exact"), truth, atol=1e-12, rtol=0)
        err = (model.prefill(toks, regime="fused", passes=4) - truth).abs().amax(dim=(0, 2))
        assert err[:4].max() < 1e-12 and err[4] > 1e-6
        cache = model.make_cache()
        h = [model.prefill(toks[:, :1], regime="soft", cache=cache)]
        h += [model.step(toks[:, t : t + 1], regime="soft", cache=cache) for t in range(1, 9)]
        torch.testing.assert_close(torch.cat(h, 1), truth, atol=1e-12, rtol=0)
        plain = model.final_states(toks, fuse_mask=torch.zeros_like(toks, dtype=torch.bool))
        assert torch.equal(model.prefill(toks, regime="soft"), plain) and torch.equal(model.prefill(toks), plain)
    with pytest.raises(ValueError, match="regime 'soft' needs a Full-Bandwidth model; arch 'baseline' decodes only standard"):
        build_model("baseline", "debug").prefill(toks, regime="soft")


def test_standard_regime_is_the_plain_backbone():
    fbt = build_model("fbt", "debug", seed=3)
    baseline = build_model("baseline", "debug")
    missing, unexpected = baseline.load_state_dict(fbt.state_dict(), strict=False)
    assert not missing and set(unexpected) == {"fusion.W_U.weight", "fusion.W_G.weight"}
    toks = tokens(2, 12)
    with torch.no_grad():
        assert torch.equal(fbt(toks), baseline(toks))  # passes=1, no cache: nothing is fused
        assert not torch.equal(fbt(toks, passes=2), baseline(toks))


def test_gradients_flow_into_earlier_passes_unless_detached():
    model = build_model("fbt", "debug").train()
    toks = tokens(2, 8)
    for detach, expect_grad in [(False, True), (True, False)]:
        states = model.run_passes(toks, 2, detach_states=detach)
        states[0].retain_grad()
        states[1].sum().backward()
        got = states[0].grad is not None and states[0].grad.abs().sum() > 0
        assert got == expect_grad
        model.zero_grad()


def test_perturb_applies_only_to_fed_back_states():
    model = build_model("fbt", "debug")
    toks = tokens(1, 8)
    seen = []

    def perturb(states, pass_index):
        seen.append((pass_index, states.shape))
        return states + 0.1

    a = model.run_passes(toks, 3, perturb=perturb)
    clean = model.run_passes(toks, 3)
    assert seen == [(1, (1, 8, 32)), (2, (1, 8, 32))]
    assert torch.equal(a[0], clean[0]) and not torch.equal(a[1], clean[1])


def test_additive_fusion_ablation():
    model = build_model("fbt", "debug", fusion="add")
    assert model.fusion.W_G is None
    toks = tokens(1, 6)
    with torch.no_grad():
        h1 = model.final_states(toks[:, :1])
        u = model.fusion(h1[:, None, 0], model.embed(toks[:, 1:2]), torch.ones(1, 1, dtype=torch.bool))
    torch.testing.assert_close(u, model.embed(toks[:, 1:2]) + model.fusion.W_U(h1[:, None, 0]))


def test_fbt_backbone_into_hd_is_rejected_cleanly():
    # expand_streams takes a baseline or an HD model; an FBT's extra weights must not vanish silently
    with pytest.raises(ValueError, match="fusion"):
        expand_streams(build_model("fbt", "debug"), 2)


# ---- which positions K passes make exact, as the docs state it -----------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _prose_files():
    files = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "models").glob("*.py")),
        *sorted((ROOT / "workbench").rglob("*.py")),
    ]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(nb)
    return files


def test_no_doc_says_k_passes_make_the_first_k_fused_positions_exact():
    """With a plain prefix of p >= 1 positions, K passes make the positions below p + K - 1 exact:
    the prefix and the first K - 1 fused positions, not the first K."""
    import re

    wrong = re.compile(r"first (k|K) positions of the fused region", re.I)
    bad = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in _prose_files() for m in wrong.finditer(path.read_text())]
    assert not bad, bad
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    assert "p + K - 1" in concepts


@pytest.mark.parametrize("p", [1, 3])
def test_k_passes_make_exactly_the_positions_below_p_plus_k_minus_one_exact(p):
    from helpers import sequential_fbt_states

    model = build_model("fbt", "debug", dtype=torch.float64)
    toks = tokens(1, 9)
    fuse = (torch.arange(9) >= p)[None]
    with torch.no_grad():
        truth = sequential_fbt_states(model, toks, p)
        for K in (1, 2, 4):
            err = (model.run_passes(toks, K, fuse_mask=fuse)[-1] - truth).abs().amax(dim=(0, 2))
            exact = (err < 1e-12).tolist()
            assert exact == [t < p + K - 1 for t in range(9)], (p, K, err)
