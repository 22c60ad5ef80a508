"""Positive and negative controls for every study: each study, run on a subject in
which its effect is present by construction, reports it, and on the same subject with the effect
removed, reports its absence. A test here fails when a study loses the power to see an effect of
known size (or starts seeing one that is not there). The fair FBT-versus-baseline study's own
controls are in test_fbt_vs_baseline.py (a planted accuracy gain, and the no-feedback member
bitwise the baseline)."""

import math

import numpy as np
import pytest
import torch

from workbench import build_model, save_model
from workbench.data.tasks import TaskConfig
from workbench.dynamics.study import analyse_run
from workbench.experiments.comparisons import study_family
from workbench.probing.study import probe_study
from workbench.studies.traces import summarise


def power_iteration_fbt(path, gains):
    """An FBT whose blocks write nothing (attention and MLP outputs zero), whose gate is constant
    (W_G = 0: sigmoid = 1/2) and whose final norm has unit weight: its carried-state map is
    F(h) = sqrt(D) W_U h / |W_U h|, power iteration on W_U = diag(gains). With gains[0] = 1 the
    largest and the next largest g_2, its stable fixed points are +-sqrt(D) e_1, where the
    Jacobian (I - e_1 e_1^T) W_U has spectral radius g_2, and the leading Lyapunov exponent of a
    rollout is log g_2."""
    model = build_model("fbt", "debug")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O.weight.zero_()
            block.mlp.W_out.weight.zero_()
        model.ln_final.w.fill_(1.0)
        model.fusion.W_U.weight.copy_(torch.diag(torch.as_tensor(gains, dtype=torch.float32)))
        model.fusion.W_G.weight.zero_()
    save_model(model, path)
    return model.cfg.d_model


PROMPT = "Q: Start with 12. Add 7. Multiply by 3. What is the result?\nA:"  # the planted maps ignore the tokens


@pytest.mark.slow
def test_the_dynamics_study_finds_a_planted_contraction_and_no_contraction_where_there_is_none(tmp_path):
    D = build_model("fbt", "debug").cfg.d_model
    gains = [1.0, 0.5, 0.5, 0.5, *np.linspace(0.4, 0.1, D - 4).tolist()]
    power_iteration_fbt(tmp_path / "contraction", gains)
    report = analyse_run(
        tmp_path / "contraction", prompt=PROMPT, horizon=120, perturb_at=20, n_spectra=1, n_fixed=1, max_passes=2, tangents=2
    ).report
    stable = [p for p in report["fixed_points"][0]["points"] if p["label"] == "stable"]
    assert len(stable) >= 1
    for point in stable:
        state = np.array(point["state"])
        # |h| = sqrt(D (1 - 4 eps)): the norm's epsilon (1e-6) under 1/sqrt(mean(x^2) + eps), x = h/2
        assert abs(state[0]) == pytest.approx(math.sqrt(D * (1 - 4e-6)), rel=1e-9) and np.abs(state[1:]).max() < 1e-9
        assert point["spectral_radius"] == pytest.approx(0.5, abs=1e-6)
    # lambda(T) approaches log 0.5 = -0.693 from below as the transient's share falls with T
    assert report["lyapunov_tangent"]["100"][0] == pytest.approx(math.log(0.5), abs=0.03)

    power_iteration_fbt(tmp_path / "identity", [1.0] * D)  # every state on the sphere is fixed: no contraction
    report = analyse_run(
        tmp_path / "identity", prompt=PROMPT, horizon=120, perturb_at=20, n_spectra=1, n_fixed=1, max_passes=2, tangents=2
    ).report
    assert abs(report["lyapunov_tangent"]["100"][0]) < 1e-3
    labels = {p["label"] for p in report["fixed_points"][0]["points"] if p["spectral_radius"] < 10}
    assert labels == {"marginal"}  # (the origin, F(0) = 0 through the norm's epsilon, is unstable and far)


@pytest.mark.slow
def test_the_probe_study_reads_a_target_planted_in_the_layer0_input_and_not_one_that_is_absent(tmp_path):
    """Running sums of one digit (mod 3): at the digit and answer positions the label is a function
    of the token, so the layer-0 input holds it linearly (4 of a problem's 5 positions; at '=' the
    same token carries any sum, 1/3 there): expected accuracy 0.87. Sums of 12-16 digits: at every
    digit after the first the sum is independent of the digit, so the token does not hold it."""
    save_model(build_model("baseline", "debug"), tmp_path / "run")
    readings = {}
    for name, lengths in (("planted", (1, 1)), ("absent", (12, 16))):
        data = TaskConfig(modsum_p=3, modsum_min_len=lengths[0], modsum_max_len=lengths[1])
        report = probe_study(
            tmp_path / "run",
            "running_sum",
            hooks=["blocks.0.hook_resid_pre"],
            n_sequences=200,
            data=data,
            out=tmp_path / name,
            mdl=False,
            ranks=(),
        )
        readings[name] = report["rows"][0]["accuracy"]
    assert readings["planted"] >= 0.8
    assert readings["absent"] <= 0.6


def test_the_hd_ablations_family_detects_a_planted_gain_and_not_its_absence():
    """Five seeds' paired differences: a member planted 0.05 above its reference (seed spread 0.01)
    is detectable after Holm over the family; the members planted at 0 are not."""
    rng = np.random.default_rng(0)

    def member(gain):
        values = (gain + rng.normal(0, 0.01, 5)).tolist()
        return {
            "paired": {"reference": "hd1", "accuracy": {"values": values}, "completion_loss": {"values": [-v for v in values]}}
        }

    readings = {"hd2": member(0.05), "hd4": member(0.0), "hd8": member(0.0)}
    # hd4's loss jumps at its expansions: none at 1->2 (cyclic replication keeps the function), 0.1 at 2->4
    jumps = {"1->2": rng.normal(0, 1e-7, 5), "2->4": 0.1 + rng.normal(0, 0.01, 5)}
    readings["hd4"]["expansion_jumps"] = {k: {"values": v.tolist()} for k, v in jumps.items()}
    family = study_family({"study": "hd-ablations", "readings": readings})
    assert len(family) == 8 and all(c["family_size"] == 8 for c in family.values())
    assert family["hd4: loss jump at expansion 2->4"]["detectable"]
    jump = family["hd4: loss jump at expansion 1->2"]
    assert not jump["detectable"] and max(abs(jump["family_low"]), abs(jump["family_high"])) < 1e-6
    assert family["hd2 - hd1: accuracy"]["detectable"] and family["hd2 - hd1: completion loss"]["detectable"]
    assert not any(family[f"{m} - hd1: {w}"]["detectable"] for m in ("hd4", "hd8") for w in ("accuracy", "completion loss"))


def test_the_stability_family_detects_a_knob_planted_to_help_and_not_the_others():
    """Five seeds: one knob planted +0.3 above the defaults in fused accuracy and 0.5 lower in
    lambda(1000) (seed spread 0.02), the others at the defaults' values plus noise: after Holm over
    the family (9 knobs x 4 readouts), only the planted cells are detectable."""
    from workbench.experiments.studies.stability import KNOBS, READOUTS, REFERENCE

    rng = np.random.default_rng(0)

    def member(accuracy: float, lam: float) -> dict:
        def cell(centre: float) -> dict:
            return {"values": (centre + rng.normal(0, 0.02, 5)).tolist()}

        return {
            "accuracy": {"fused": cell(accuracy), "soft": cell(0.5)},
            "lyapunov_tangent": {"1000": cell(lam)},
            "kpass_residual": {"8": cell(1.0)},
        }

    readings = {name: member(0.5, 0.0) for name in KNOBS}
    readings["fbt-deeper0.3"] = member(0.8, -0.5)
    family = study_family({"study": "stability", "readings": readings})
    assert len(family) == (len(KNOBS) - 1) * len(READOUTS)
    detected = {name for name, cell in family.items() if cell["detectable"]}
    assert detected == {f"fbt-deeper0.3 - {REFERENCE}: fused accuracy", f"fbt-deeper0.3 - {REFERENCE}: lambda(1000)"}


def _trace_rows(shorter: int, seed: int = 0) -> list[dict]:
    """Two models' traces on the same 400 problems at equal accuracy (the same correct answers);
    the second's traces ``shorter`` tokens shorter than the first's (lengths 20-60)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(400):
        length, correct = int(rng.integers(20, 60)), bool(rng.random() < 0.5)
        for model, tokens in (("a", length), ("b", length - shorter + int(rng.integers(-3, 4)))):
            rows.append(
                {
                    "model": model,
                    "regime": "standard",
                    "problem_id": i,
                    "difficulty": 1,
                    "trace_tokens": tokens,
                    "correct": correct,
                    "finished": True,
                }
            )
    return rows


def test_the_trace_study_detects_a_planted_length_difference_at_equal_accuracy():
    paired = summarise(_trace_rows(shorter=2), ("a", "standard"))["paired"]["b/standard - a/standard"]
    assert paired["trace_tokens"]["ci_high"] < 0 and paired["trace_tokens"]["mean"] == pytest.approx(-2, abs=0.5)
    assert paired["accuracy"]["ci_low"] == paired["accuracy"]["ci_high"] == 0.0  # equal accuracy, problem by problem
    # without the planted difference, a 95% interval excludes 0 in about 1 draw of 20 (here 2, one
    # of them seed 0's: +0.25 [+0.05, +0.45] tokens); 4 or more of 20 would have p < 0.02
    false = 0
    for seed in range(20):
        null = summarise(_trace_rows(shorter=0, seed=seed), ("a", "standard"))["paired"]["b/standard - a/standard"]
        false += not null["trace_tokens"]["ci_low"] < 0 < null["trace_tokens"]["ci_high"]
    assert false <= 3


def test_the_traces_family_detects_traces_planted_shorter_at_equal_accuracy_and_not_their_absence():
    """Five seeds x 200 problems through the traces study's family (``study_family``): FBT's fused
    traces 2 tokens shorter (problem lengths 20-60, noise of +-3 tokens), its answers the baseline's,
    reads a detectable difference in trace tokens and an accuracy difference within +-0.05; with
    nothing planted, at most 1 of 20 draws reads a detectable trace-token difference."""

    def readings(shorter: int, seed: int) -> dict:
        rng = np.random.default_rng(seed)
        lengths = rng.integers(20, 60, size=(5, 200)).astype(float)
        correct = (rng.random((5, 200)) < 0.6).astype(float)
        fused = lengths - shorter + rng.integers(-3, 4, size=lengths.shape)
        base = {"trace_tokens": lengths.tolist(), "correct": correct.tolist()}
        return {
            "per_problem": {"baseline/standard": base, "fbt/fused": {"trace_tokens": fused.tolist(), "correct": correct.tolist()}}
        }

    family = study_family({"study": "traces", "readings": readings(2, 0)})
    tokens, accuracy = family["fbt fused - baseline: trace tokens"], family["fbt fused - baseline: accuracy"]
    assert tokens["detectable"] and tokens["mean"] == pytest.approx(-2, abs=0.3)
    assert -0.05 <= accuracy["family_low"] and accuracy["family_high"] <= 0.05
    false = sum(
        study_family({"study": "traces", "readings": readings(0, seed)})["fbt fused - baseline: trace tokens"]["detectable"]
        for seed in range(1, 21)
    )
    assert false <= 1
