"""Rollouts past the context and to divergence: reported with the step, never plotted.

``COUNTS`` tallies the inputs tried, the faults injected and the data lost (which must stay zero);
pytest prints every fault class's tally at the end of the session (``tests/helpers.py``)."""

import re

import pytest
import torch
from helpers import (
    RUN_FAULTS,
    assert_usage_error,
    tally,
    tokens,
)

from workbench import build_model, save_model
from workbench.dynamics.feedback import RolloutDiverged, rollout

COUNTS = tally(RUN_FAULTS)


# ---- 5. rollouts past the context and to divergence --------------------------------------


def inf_at_step(step: int):
    """A hook that makes the value path W_U h infinite from rollout step ``step`` on (it fires once per step)."""
    calls = []

    def hook(x, hook):
        calls.append(1)
        return x * float("inf") if len(calls) > step else x

    return hook


def test_a_rollout_past_the_context_that_then_diverges_names_the_step():
    model = build_model("fbt", "debug")  # n_ctx 128: a 4-token prompt slides at steps 124 and 188
    COUNTS["faults_injected"] += 1
    with model.hooks(fwd_hooks=[("fusion.hook_value", inf_at_step(200))]):
        with pytest.raises(RolloutDiverged, match="at step 200 "):
            rollout(model, tokens(1, 4)[0].tolist(), 400, perturb_at=150)
    assert len(rollout(model, tokens(1, 4)[0].tolist(), 300).slid_at) == 3  # and without the fault it runs on


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_exploding_feedback_map_is_reported_not_plotted_as_zeros(dtype):
    """W_U scaled so the fused input overflows: RMSNorm would turn the overflowing stream into a
    finite zero state, so the rollout must look at the residual stream, not only at h."""
    model = build_model("fbt", "debug", dtype=dtype)
    with torch.no_grad():
        model.fusion.W_U.weight.mul_(1e30 if dtype == torch.float32 else 1e300)
    COUNTS["faults_injected"] += 1
    with pytest.raises(RolloutDiverged, match="overflowed at step 0 "):
        rollout(model, tokens(1, 4)[0].tolist(), 20)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(horizon=0), "horizon=0"),
        (dict(prompt=[]), "at least one token"),
        (dict(prompt=list(range(4, 100)) * 2), "192 tokens is longer than the context n_ctx=128"),
        (dict(tokens=[500] * 5), "token id 500 is outside the vocabulary"),
        (dict(tokens=[5, 6]), "needs 5 tokens, got 2"),
        (dict(perturb_at=5), r"perturb_at=5: expected a step in \[0, 5\)"),
        (dict(context_rule="wrap"), "context_rule='wrap'"),
    ],
)
def test_bad_rollout_arguments_name_the_value(kwargs, match):
    model = build_model("fbt", "debug")
    args = {"prompt": [5, 6, 7], "horizon": 5, **kwargs}
    with pytest.raises(ValueError, match=match):
        rollout(model, args.pop("prompt"), args.pop("horizon"), **args)


def test_a_prompt_that_fills_the_context_stops_at_once_with_the_reason():
    out = rollout(build_model("fbt", "debug"), list(range(4, 100)) + list(range(4, 36)), 10, context_rule="stop")
    assert out.tokens == [] and out.states.shape == (0, 32) and "context full after 128 tokens" in out.stopped


@pytest.mark.slow
def test_the_dynamics_cli_reports_a_rollout_that_diverges_past_the_context(tmp_path, monkeypatch):
    import workbench.training.run as runs

    run = save_model(build_model("fbt", "debug"), tmp_path / "fbt")
    real = runs.load_model

    def diverging(path, *args, **kwargs):
        model = real(path, *args, **kwargs)
        model.add_hook("fusion.hook_value", inf_at_step(90), is_permanent=True)
        return model

    monkeypatch.setattr(runs, "load_model", diverging)
    COUNTS["faults_injected"] += 1
    # the prompt is 62 tokens, so the 128-token window slides at step 66, before the fault; the
    # hook's first 8 calls are the own-dtype check's soft steps, then one per fp64 rollout step (the
    # tangents ride in the same call as extra rows): call 91 is step 82's
    assert_usage_error(
        [
            "dynamics",
            str(run),
            "--prompt",
            "Q: Start with 12. Add 7. Multiply by 3. What is the result?\nA:",
            "--horizon",
            "150",
            "--perturb-at",
            "5",
            "--spectra",
            "1",
            "--fixed-points",
            "0",
            "--max-passes",
            "2",
            "--tangents",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ],  # names the run, the site and the step
        match=re.escape(str(run)) + r": blocks\.0\.ln1 input overflowed at step 82 \(token \d+\): the carried state diverged$",
    )
    assert not (tmp_path / "out" / "dynamics.json").exists()
