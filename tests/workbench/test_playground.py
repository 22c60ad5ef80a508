"""The Playground's generation inspector: per-token statistics and interventions."""

import pytest
import torch

from workbench import build_model
from workbench.studies.playground import Intervention, inspect_generation

PROMPT = "Q: Start with 3. Add 4.\nA:"


@pytest.fixture
def fbt():
    return build_model("fbt", "debug").eval()


def test_soft_reports_the_gate_and_value_each_token_reentered_with(fbt):
    out = inspect_generation(fbt, PROMPT, regime="soft", max_new_tokens=6, stop_at_eos=False)
    assert len(out["tokens"]) == len(out["state_norm"]) == len(out["gate_mean"]) == 6
    embed = fbt.embed.W_E[torch.tensor(out["ids"][:-1])]
    expected = torch.sigmoid(fbt.fusion.W_G(embed)).mean(-1)
    torch.testing.assert_close(torch.tensor(out["gate_mean"][:-1]), expected)
    spread = torch.sigmoid(fbt.fusion.W_G(embed)).std(-1)  # over d_model: which features the gate passes
    torch.testing.assert_close(torch.tensor(out["gate_sd"][:-1]), spread)
    assert out["gate_mean"][-1] is None  # the last token is never fed back
    assert all(v > 0 for v in out["value_norm"][:-1])


def test_state_scale_multiplies_the_value_path(fbt):
    plain = inspect_generation(fbt, PROMPT, regime="soft", max_new_tokens=6, stop_at_eos=False)
    doubled = inspect_generation(
        fbt, PROMPT, regime="soft", max_new_tokens=6, stop_at_eos=False, intervention=Intervention(state_scale=2.0)
    )
    # the first fed-back state comes from the plain prefill, identical in both runs; W_U is linear
    assert doubled["value_norm"][0] == pytest.approx(2 * plain["value_norm"][0], rel=1e-5)
    zero = inspect_generation(
        fbt, PROMPT, regime="soft", max_new_tokens=6, stop_at_eos=False, intervention=Intervention(state_scale=0.0)
    )
    assert zero["value_norm"][:-1] == [0.0] * 5
    assert zero["state_norm"][0] == plain["state_norm"][0]  # the first token comes from the plain prefill
    assert zero["state_norm"][1:] != plain["state_norm"][1:]


def test_state_intervention_cannot_touch_the_standard_regime(fbt):
    plain = inspect_generation(fbt, PROMPT, regime="standard", max_new_tokens=6, stop_at_eos=False)
    scaled = inspect_generation(
        fbt, PROMPT, regime="standard", max_new_tokens=6, stop_at_eos=False, intervention=Intervention(state_scale=0.0)
    )
    assert scaled["state_norm"] == plain["state_norm"] and plain["gate_mean"] == [None] * 6


@pytest.mark.slow
def test_stream_ablation_changes_hd_and_is_validated():
    hd = build_model("hd", "debug", n_streams=2).eval()
    plain = inspect_generation(hd, PROMPT, max_new_tokens=4, stop_at_eos=False)
    ablated = inspect_generation(hd, PROMPT, max_new_tokens=4, stop_at_eos=False, intervention=Intervention(ablate_stream=0))
    assert ablated["state_norm"] != plain["state_norm"] and plain["gate_mean"] == [None] * 4
    with pytest.raises(ValueError, match="ablate_stream=2: expected a stream index 0..1"):
        inspect_generation(hd, PROMPT, intervention=Intervention(ablate_stream=2))
    with pytest.raises(ValueError, match="needs an FBT model"):
        inspect_generation(hd, PROMPT, intervention=Intervention(state_scale=0.5))


def test_bad_prompts_are_named(fbt):
    with pytest.raises(ValueError, match="prompt is empty"):
        inspect_generation(fbt, "")
    with pytest.raises(ValueError, match="leaves no room in the context"):
        inspect_generation(fbt, "x" * fbt.cfg.n_ctx)


def test_a_state_intervention_changes_only_the_fed_back_regimes():
    # the Playground offers and applies it there only: on standard it would change nothing (see
    # test_state_intervention_cannot_touch_the_standard_regime), so standard runs once, plainly
    scaled = Intervention(state_scale=0.0)
    assert [r for r in ("standard", "soft", "fused") if scaled.changes(r)] == ["soft", "fused"]
    assert Intervention(ablate_stream=1).changes("standard")  # a stream's embedding enters every regime
    assert not Intervention().changes("soft")
