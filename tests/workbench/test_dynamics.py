"""Feedback-map dynamics on real FBT models."""

import pytest
import torch
from helpers import tokens

from workbench import build_model
from workbench.dynamics.feedback import RolloutDiverged, feedback_map, kpass_convergence, prefill_context, rollout
from workbench.dynamics.maps import eigenvalues, find_fixed_points, jacobian, jacobian_summary, spectral_norm, spectral_radius


@pytest.fixture(scope="module")
def fbt64():
    return build_model("fbt", "debug", dtype=torch.float64)


def test_feedback_map_is_the_next_soft_step(fbt64):
    prefix = tokens(1, 8)[0].tolist()
    cache, h_prev = prefill_context(fbt64, prefix)
    F = feedback_map(fbt64, cache, token=17)
    starts = torch.stack([h_prev, torch.zeros_like(h_prev), h_prev * 2])
    out = F(starts)
    assert out.shape == (3, 32) and cache.length == 8  # read-only: nothing was written
    with torch.no_grad():
        stepped = fbt64.final_states(torch.tensor([[17]]), cache=cache)[0, -1]
    torch.testing.assert_close(out[0], stepped, atol=1e-12, rtol=0)
    assert (out[1] - out[0]).abs().max() > 1e-3


@pytest.mark.slow
def test_spectral_routines_match_the_autograd_jacobian(fbt64):
    cache, h_prev = prefill_context(fbt64, tokens(1, 6)[0].tolist())
    F = feedback_map(fbt64, cache, token=5)
    J = torch.autograd.functional.jacobian(lambda h: F(h[None])[0], h_prev)
    torch.testing.assert_close(jacobian(F, h_prev), J)
    assert abs(spectral_norm(F, h_prev, iters=100) - float(torch.linalg.matrix_norm(J, 2))) < 1e-4
    rho = float(torch.linalg.eigvals(J).abs().max())
    assert abs(float(eigenvalues(F, h_prev).abs()[0]) - rho) < 1e-10
    assert abs(spectral_radius(F, h_prev, iters=200) - rho) < 0.05 * rho
    exact = jacobian_summary(F, h_prev)
    assert abs(exact["spectral_radius"] - rho) < 1e-10 and abs(exact["frobenius"] - float(J.norm())) < 1e-10
    assert abs(exact["spectral_norm"] - float(torch.linalg.matrix_norm(J, 2))) < 1e-10


def test_a_contracting_feedback_map_has_one_stable_fixed_point_from_every_start():
    model = build_model("fbt", "debug", dtype=torch.float64, seed=1)
    with torch.no_grad():
        model.fusion.W_U.weight.mul_(0.05)  # a weak value path: F is a contraction
    cache, h_prev = prefill_context(model, tokens(1, 6)[0].tolist())
    F = feedback_map(model, cache, token=5)
    gen = torch.Generator().manual_seed(0)
    starts = torch.cat(
        [h_prev[None], torch.zeros(1, 32, dtype=torch.float64), 3 * torch.randn(2, 32, dtype=torch.float64, generator=gen)]
    )
    points, report = find_fixed_points(F, starts, start_kinds=["previous", "zeros", "random", "random"])
    assert len(points) == 1 and points[0].n_starts == 4 and points[0].stable  # path independent
    with torch.no_grad():
        assert float((F(points[0].state[None])[0] - points[0].state).norm()) < 1e-8
    assert sorted(set(points[0].start_kinds)) == ["previous", "random", "zeros"]


def test_kpass_residual_is_zero_on_exact_positions(fbt64):
    report = kpass_convergence(fbt64, tokens(1, 10)[0].tolist(), max_passes=5)
    for row in report["rows"]:
        k = row["passes"]
        assert max(row["error_to_exact"][:k]) < 1e-12
        assert row["error_to_exact"][k] > 1e-6
        if k > 1:
            assert row["relative_residual"] > 0 and row["kl_to_previous"] >= 0


def test_rollout_tracks_norms_and_perturbation_growth():
    model = build_model("fbt", "debug")
    out = rollout(model, tokens(1, 4)[0].tolist(), 40, perturb_at=10)
    assert len(out.tokens) == 40 and out.state_norm.shape == (40,) and out.perturbation_ratio.shape == (30,)
    assert torch.all(torch.isfinite(out.perturbation_ratio)) and torch.all(out.perturbation_ratio > 0)
    unperturbed = rollout(model, tokens(1, 4)[0].tolist(), 40)
    torch.testing.assert_close(unperturbed.state_norm, out.state_norm)  # the perturbed copy is a separate row
    assert out.gate_mean.shape == (40,) and torch.all(out.gate_mean > 0) and torch.all(out.gate_mean < 1)
    assert out.standard_distance[0] > 0  # the first soft step already differs from standard


def test_rollout_beyond_the_context_slides_or_stops():
    model = build_model("fbt", "debug")  # n_ctx = 128
    prompt = tokens(1, 4)[0].tolist()
    slid = rollout(model, prompt, 300)
    assert len(slid.tokens) == 300 and slid.slid_at and slid.stopped is None
    stopped = rollout(model, prompt, 300, context_rule="stop")
    assert len(stopped.tokens) == 124 and "context full after 128 tokens" in stopped.stopped


def test_a_rollout_allocates_only_the_tokens_it_can_hold_and_decodes_the_same(monkeypatch):
    """Every row's buffers are preallocated: a short rollout of a long-context model asks for the
    prompt plus horizon, not n_ctx, and decodes exactly as with a cache of n_ctx."""
    from models.full_bandwidth import FullBandwidthLM

    model = build_model("fbt", "debug")  # n_ctx = 128
    prompt = tokens(1, 4)[0].tolist()
    asked = []
    make_cache = FullBandwidthLM.make_cache

    def recorded(capacity=None, **kw):
        asked.append(capacity)
        return make_cache(model, capacity, **kw)

    monkeypatch.setattr(model, "make_cache", recorded)
    short = rollout(model, prompt, 20, perturb_at=3, tangents=2)
    assert asked == [24]
    monkeypatch.setattr(model, "make_cache", lambda capacity=None, **kw: make_cache(model, None, **kw))
    full = rollout(model, prompt, 20, perturb_at=3, tangents=2)
    assert short.tokens == full.tokens
    for name in ("states", "perturbation_ratio", "tangent_log_growth", "tangent_full_log_growth"):
        torch.testing.assert_close(getattr(short, name), getattr(full, name), atol=0, rtol=0)
    monkeypatch.setattr(model, "make_cache", recorded)
    rollout(model, prompt, 300)
    assert asked[-1] == 128  # past the context: the window of n_ctx, sliding as before


def test_sliding_keeps_relative_positions_exact():
    # One layer: its cached keys depend only on the tokens, so after dropping the oldest half the
    # next step must equal a fresh pass over the kept window started at position 0 (rotary phases
    # are relative). With more layers the cached keys remember the dropped context, by design.
    model = build_model("baseline", "debug", dtype=torch.float64, n_layers=1)
    toks = tokens(1, 30)
    with torch.no_grad():
        cache = model.make_cache(24)
        model(toks[:, :24], cache=cache)
        cache.slide(12)
        stepped = model(toks[:, 24:25], cache=cache)[0, -1]
        window = model(toks[:, 12:25])[0, -1]  # the same 13 tokens from position 0
    torch.testing.assert_close(stepped, window, atol=1e-10, rtol=0)


def test_a_diverging_rollout_names_the_step():
    model = build_model("fbt", "debug")
    calls = []

    def blow_up(x, hook):
        calls.append(1)
        return x * float("inf") if len(calls) == 8 else x

    with model.hooks(fwd_hooks=[("fusion.hook_value", blow_up)]):
        with pytest.raises(RolloutDiverged, match="at step 7"):
            rollout(model, tokens(1, 4)[0].tolist(), 20)


@pytest.mark.slow
def test_dynamics_cli_compares_runs_and_writes_figures(tmp_path, capsys):
    import json

    from workbench import save_model
    from workbench.cli import main

    runs = [save_model(build_model("fbt", "debug", seed=s), tmp_path / f"fbt{s}") for s in (0, 1)]
    main(
        [
            "dynamics",
            *map(str, runs),
            "--prompt",
            "Q: Start with 12. Add 7. Multiply by 3. What is the result?\nA:",
            "--horizon",
            "150",
            "--perturb-at",
            "5",
            "--spectra",
            "2",
            "--fixed-points",
            "1",
            "--starts",
            "3",
            "--max-passes",
            "3",
            "--fp-steps",
            "20",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    report = json.loads((tmp_path / "out" / "dynamics.json").read_text())
    assert set(report["runs"]) == {"fbt0", "fbt1"}
    r = report["runs"]["fbt0"]
    assert r["horizon"] == 150 and r["slid_at"]  # past n_ctx=128: the window slid
    assert set(r["lyapunov"]) == {"1", "10", "100"} and len(r["spectra"]) == 2
    for key in ("lyapunov_tangent", "lyapunov_tangent_full"):
        assert set(r[key]) == set(r["lyapunov"]) and all(len(v) == 4 for v in r[key].values())
    assert r["lyapunov_tangent_full"]["1"] == pytest.approx(r["lyapunov_tangent"]["1"], abs=1e-12)  # no cached tangent yet
    assert all(p["label"] in ("stable", "marginal", "saddle", "unstable") for f in r["fixed_points"] for p in f["points"])
    assert len(r["spectra"][0]["eigenvalues"]) == 32 and len(r["kpass"]["rows"]) == 3
    for name in ("rollout", "spectra", "fixed_points", "kpass"):
        assert (tmp_path / "out" / f"{name}.png").is_file()
    assert "Lyapunov" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["dynamics", str(save_model(build_model("baseline", "debug"), tmp_path / "base")), "--out", str(tmp_path / "x")])
    assert "a baseline run; dynamics analyses FBT runs" in capsys.readouterr().err  # from its config, before loading


def test_fixed_points_share_the_states_pca_coordinates():
    from workbench.dynamics.study import state_pca

    X = torch.randn(50, 8, generator=torch.Generator().manual_seed(1))
    P, points = state_pca(X, [{"step": 3, "points": [{"state": X[7].tolist(), "stable": True, "spectral_radius": 0.5}]}])
    assert P.shape == (50, 2)
    torch.testing.assert_close(torch.tensor([points[0]["pc1"], points[0]["pc2"]], dtype=torch.float64), P[7])


def test_tangent_growth_along_a_rollout_is_the_exact_jacobians_volume_growth(fbt64):
    """With k = D tangent vectors, the QR log-growths of one step sum to log |det J_t| (the volume
    the step maps a unit cube to), J_t the exact Jacobian (reverse mode, ``jacobian``) of that
    step's feedback map at the soft state, rebuilt from the prefix alone; the leading one is at
    most log ||J_t||_2."""
    prompt, forced = tokens(1, 4)[0].tolist(), tokens(1, 6, seed=3)[0].tolist()
    D = fbt64.cfg.d_model
    roll = rollout(fbt64, prompt, 6, tokens=forced, perturb_at=2, tangents=D)
    assert roll.tangent_log_growth is not None and roll.tangent_log_growth.shape == (4, D)
    for i, t in enumerate(range(2, 6)):
        cache, h_prev = prefill_context(fbt64, prompt + forced[:t], plain=len(prompt))
        J = jacobian(feedback_map(fbt64, cache, forced[t]), h_prev)
        logdet = float(torch.linalg.slogdet(J).logabsdet)
        assert abs(float(roll.tangent_log_growth[i].sum()) - logdet) < 1e-8
        assert float(roll.tangent_log_growth[i, 0]) <= float(torch.linalg.matrix_norm(J, 2).log()) + 1e-10


@pytest.mark.slow
def test_full_step_tangent_is_the_perturbation_curves_linearisation(fbt64):
    """The full set's first tangent starts along the perturbation and goes where the perturbation
    goes (through the carried state and the keys and values each step writes), so in fp64 its
    growth exp(sum of log-growths) equals the finite perturbation's ||dh_t|| / ||dh_t0|| up to
    O(eps), past a window slide too; the frozen set agrees with it only at the first step (the
    cache holds no tangent yet) and not after."""
    prompt, forced = tokens(1, 4)[0].tolist(), tokens(1, 140, seed=3)[0].tolist()
    roll = rollout(fbt64, prompt, 140, tokens=forced, perturb_at=2, eps=1e-7, tangents=3)
    full, frozen, ratio = roll.tangent_full_log_growth, roll.tangent_log_growth, roll.perturbation_ratio
    assert full is not None and frozen is not None and ratio is not None and roll.slid_at
    assert full.shape == frozen.shape == (138, 3)
    torch.testing.assert_close(full[:, 0].cumsum(0).exp(), ratio, rtol=1e-5, atol=0)
    torch.testing.assert_close(full[0], frozen[0], rtol=0, atol=1e-12)
    assert (full[1:, 0] - frozen[1:, 0]).abs().max() > 1e-3
