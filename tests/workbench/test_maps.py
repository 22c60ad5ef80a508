"""Map analyses on maps with known answers."""

import math

import pytest
import torch

from workbench.dynamics.maps import (
    FADING,
    eigenvalues,
    find_fixed_points,
    frobenius_hutchinson,
    jacobian,
    lyapunov_from_growth,
    newton_steps,
    perturbation_growth,
    spectral_norm,
    spectral_radius,
    tangent_lyapunov,
    tangent_qr_map,
)


def linear_map(eigs, seed=0):
    """F(h) = A h with A = Q diag-ish(eigs) Q^-1: known eigenvalues, non-normal in general."""
    D = len(eigs)
    gen = torch.Generator().manual_seed(seed)
    Q = torch.randn(D, D, generator=gen, dtype=torch.float64) + 3 * torch.eye(D, dtype=torch.float64)
    A = Q @ torch.diag(torch.tensor(eigs, dtype=torch.float64)) @ torch.linalg.inv(Q)
    return (lambda h: h @ A.T), A


def test_spectra_of_a_linear_map_recover_its_eigenvalues():
    F, A = linear_map([0.9, -0.5, 0.3, 0.1, 0.05])
    h = torch.zeros(5, dtype=torch.float64)
    torch.testing.assert_close(jacobian(F, h), A)
    ev = eigenvalues(F, h)
    torch.testing.assert_close(ev.abs(), torch.tensor([0.9, 0.5, 0.3, 0.1, 0.05], dtype=torch.float64))
    assert abs(spectral_radius(F, h, iters=400) - 0.9) < 1e-3
    assert abs(spectral_norm(F, h) - float(torch.linalg.matrix_norm(A, 2))) < 1e-6
    assert abs(frobenius_hutchinson(F, h, samples=2000) / float(torch.linalg.matrix_norm(A)) - 1) < 0.05


def test_spectral_radius_with_a_complex_dominant_pair():
    r, theta = 0.95, 0.7
    rot = torch.tensor(
        [[r * math.cos(theta), -r * math.sin(theta), 0.0], [r * math.sin(theta), r * math.cos(theta), 0.0], [0.0, 0.0, 0.2]],
        dtype=torch.float64,
    )
    F = lambda h: h @ rot.T
    assert abs(spectral_radius(F, torch.zeros(3, dtype=torch.float64), iters=400) - r) < 1e-6


@pytest.mark.parametrize("rho", [0.8, 1.25])
def test_lyapunov_estimate_recovers_log_of_the_spectral_radius(rho):
    F, _ = linear_map([rho, 0.5, 0.2])
    growth = perturbation_growth(F, torch.zeros(3, dtype=torch.float64), steps=200)
    lam = lyapunov_from_growth(growth)
    assert abs(float(lam[-1]) - math.log(rho)) < 0.02
    assert (lam[-1] < 0) == (rho < 1)


def test_scalar_map_with_two_stable_and_one_unstable_fixed_point():
    F = lambda h: h + 0.1 * (h - h**3)  # fixed points -1, 0, 1; F'(+-1) = 0.8, F'(0) = 1.1
    starts = torch.linspace(-2, 2, 41, dtype=torch.float64)[:, None]
    points, report = find_fixed_points(F, starts)
    found = sorted((round(float(p.state[0]), 6), p.stable) for p in points)
    assert found == [(-1.0, True), (0.0, False), (1.0, True)]
    for p in points:
        assert p.residual < 1e-8
        want = 0.8 if abs(abs(float(p.state[0])) - 1) < 1e-6 else 1.1
        assert abs(p.spectral_radius - want) < 1e-6
    assert report["n_converged"] == sum(p.n_starts for p in points)


@pytest.mark.slow
def test_contraction_fixed_point_found_and_outliers_dropped():
    D = 8
    F_lin, A = linear_map([0.6, 0.5, 0.4, 0.3, 0.3, 0.2, 0.1, 0.05])
    b = torch.arange(D, dtype=torch.float64) / D
    F = lambda h: F_lin(h) + b
    want = torch.linalg.solve(torch.eye(D, dtype=torch.float64) - A, b)
    starts = torch.randn(16, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    points, report = find_fixed_points(F, starts, start_kinds=["random"] * 16)
    assert len(points) == 1 and points[0].stable and points[0].n_starts == 16
    torch.testing.assert_close(points[0].state, want, atol=1e-7, rtol=0)

    G = lambda h: 2.0 * h + 1.0  # a single, unstable fixed point at -1
    points, report = find_fixed_points(G, torch.tensor([[-0.5], [3.0]], dtype=torch.float64))
    assert [round(float(p.state[0]), 6) for p in points] == [-1.0] and not points[0].stable


# ---- fixed points: damped Newton from independent starts -------------------------------------


def affine_contraction(D: int, seed: int = 0):
    """F(h) = A h + b, A non-normal with eigenvalues in [0.05, 0.9]: one stable fixed point
    (I - A)^-1 b."""
    gen = torch.Generator().manual_seed(seed)
    Q = torch.randn(D, D, generator=gen, dtype=torch.float64) / D**0.5 + 2 * torch.eye(D, dtype=torch.float64)
    A = Q @ torch.diag(torch.linspace(0.9, 0.05, D, dtype=torch.float64)) @ torch.linalg.inv(Q)
    b = torch.randn(D, generator=gen, dtype=torch.float64)
    return (lambda h: h @ A.T + b), torch.linalg.solve(torch.eye(D, dtype=torch.float64) - A, b)


@pytest.mark.slow
@pytest.mark.parametrize("D", [128, 512])
def test_an_affine_contraction_at_width_128_and_512_has_its_one_fixed_point_found_from_every_start(D):
    F, want = affine_contraction(D)
    starts = torch.randn(8, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    points, report = find_fixed_points(F, starts)
    assert report["n_converged"] == 8 and len(points) == 1 and points[0].n_starts == 8
    assert points[0].label == "stable" and abs(points[0].spectral_radius - 0.9) < 1e-6
    torch.testing.assert_close(points[0].state, want, atol=1e-9, rtol=0)


def cubic_2d(h):
    """x + 0.3 (x - x^3) in each coordinate: fixed points {-1, 0, 1}^2, F'(+-1) = 0.4, F'(0) = 1.3."""
    return h + 0.3 * (h - h**3)


def expected_cubic_label(x: float, y: float) -> str:
    outside = [abs(c) < 0.5 for c in (x, y)]  # the 0 coordinate has |F'| = 1.3
    return "unstable" if all(outside) else "saddle" if any(outside) else "stable"


def test_the_2d_cubic_map_has_all_9_fixed_points_found_and_labelled():
    grid = torch.linspace(-1.6, 1.6, 7, dtype=torch.float64)
    starts = torch.cartesian_prod(grid, grid)
    points, report = find_fixed_points(cubic_2d, starts)
    found = {(round(float(p.state[0]), 9), round(float(p.state[1]), 9)): p.label for p in points}
    want = {(float(x), float(y)): expected_cubic_label(x, y) for x in (-1, 0, 1) for y in (-1, 0, 1)}
    assert found == want
    assert report["n_converged"] == sum(p.n_starts for p in points)


def test_starts_are_solved_independently():
    """The same points and the same convergence whether a start is solved alone or with 48 others
    (one shared optimiser used to couple them)."""
    grid = torch.linspace(-1.6, 1.6, 7, dtype=torch.float64)
    starts = torch.cartesian_prod(grid, grid)
    together, _ = find_fixed_points(cubic_2d, starts)
    alone = [find_fixed_points(cubic_2d, s[None])[0] for s in starts]
    assert sum(len(a) for a in alone) == sum(p.n_starts for p in together)
    for a in alone:
        assert any(torch.allclose(a[0].state, p.state, atol=1e-10, rtol=0) for p in together)


def tanh_root(w: float) -> float:
    """The positive root of h = tanh(w h), w > 1, by bisection."""
    lo, hi = 1e-6, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.tanh(w * mid) > mid else (lo, mid)
    return (lo + hi) / 2


def test_a_tanh_rnn_has_its_known_fixed_points_and_labels():
    """F(h) = tanh(W h), W = diag(2, 2, 0.5): coordinates 1, 2 in {-r, 0, r} with r = tanh(2 r) and
    coordinate 3 = 0: 9 points; F' = 2 (1 - r^2) ~ 0.17 at +-r, 2 at 0, and 0.5 in coordinate 3."""
    W = torch.diag(torch.tensor([2.0, 2.0, 0.5], dtype=torch.float64))
    F = lambda h: torch.tanh(h @ W.T)
    r = tanh_root(2.0)
    starts = torch.randn(64, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    points, _ = find_fixed_points(F, starts)
    found = {tuple(round(float(c), 8) for c in p.state): p.label for p in points}
    want = {}
    for x in (-r, 0.0, r):
        for y in (-r, 0.0, r):
            want[(round(x, 8), round(y, 8), 0.0)] = "stable" if x and y else "saddle"
    assert found == want
    stable = [p for p in points if p.label == "stable"]
    assert all(abs(p.spectral_radius - 0.5) < 1e-9 for p in stable)  # coordinate 3's 0.5 dominates 2 (1 - r^2)


@pytest.mark.parametrize(
    "F,D,closest",
    [
        (lambda h: h + 0.5 * torch.exp(-h.pow(2).sum(-1, keepdim=True)), 2, 0.0),  # the residual vanishes only at infinity
        (lambda h: h + 0.1 * (h**2 + 1e-7), 1, 1e-8),  # a near-ghost: a fold that just missed, min residual 1e-8 at 0
    ],
    ids=["vanishing-at-infinity", "near-ghost"],
)
def test_maps_without_fixed_points_report_none(F, D, closest):
    """Far out, h + 0.5 exp(-|h|^2) rounds to h exactly: F(h) - h = 0 there without a root, and
    such points (F's step around them is below rounding too) are refused. The ghost's residual never falls below its
    gap, 1e-8, which the absolute tolerance (~1e-11 x the map's step) does not forgive."""
    starts = torch.randn(16, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    points, report = find_fixed_points(F, starts)
    assert points == [] and report["n_converged"] == 0 and report["unconverged"]["n"] == 16
    assert report["unconverged"]["residual_quantiles"][0] >= closest * (1 - 1e-6)


def bump(h):
    """h + 0.5 exp(-|h|^2): no fixed point anywhere, and for |h| above ~5.8 the bump is below half
    an ulp of h, so F(h) == h exactly in fp64."""
    return h + 0.5 * torch.exp(-h.pow(2).sum(-1, keepdim=True))


IDENTITY = "F is the identity to working precision here"


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
def test_where_the_map_is_the_identity_to_working_precision_no_point_is_accepted(scale):
    """Starts near the bump are pushed out to where F(h) - h rounds to 0; far starts begin there.
    A zero residual there is rounding, not a root: the step and J - I vanish across the point's
    neighbourhood, so it is refused, and counted as refused with that reason. Scale 3 is the
    issue's case (two 'marginal' points at |h| ~ 6 with residual 0)."""
    starts = torch.randn(16, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale
    points, report = find_fixed_points(bump, starts)
    assert points == [] and report["n_converged"] == 0 and report["unconverged"]["n"] == 16
    refused = report["refused"]
    assert refused["n"] == 16 and refused["reasons"] == {IDENTITY: 16}


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
def test_in_fp32_the_bump_has_no_fixed_point_and_the_solver_does_not_fail(scale):
    """In fp32 the damped system J_r^T J_r + mu s I is singular where J_r has rank < D (rank 1 on
    the bump) once mu s falls below eps of J_r^T J_r: that start's step is rejected (more damping),
    where it used to raise for the whole batch. Every start that settles is refused."""
    starts = torch.randn(16, 2, generator=torch.Generator().manual_seed(0)) * scale
    points, report = find_fixed_points(bump, starts)
    assert points == [] and report["n_converged"] == 0 and report["refused"]["n"] > 0


def known_answer_cases():
    """(map, starts at a given scale, the fixed points it has, their labels): the grid of starts
    that reaches every point of the cubic and tanh maps, plus random starts at the scale, which
    set the map's typical step (the median over the starts) and so the residual tolerance."""
    grid = torch.cartesian_prod(*[torch.linspace(-1.6, 1.6, 7, dtype=torch.float64)] * 2)
    W = torch.diag(torch.tensor([2.0, 2.0, 0.5], dtype=torch.float64))
    r = tanh_root(2.0)
    tanh_points = {(round(x, 8), round(y, 8), 0.0): "stable" if x and y else "saddle" for x in (-r, 0.0, r) for y in (-r, 0.0, r)}
    cubic_points = {(float(x), float(y)): expected_cubic_label(x, y) for x in (-1, 0, 1) for y in (-1, 0, 1)}
    F_affine, want = affine_contraction(32)
    return {
        "affine": (F_affine, lambda s, g: s * torch.randn(16, 32, generator=g, dtype=torch.float64), want, None),
        "cubic": (
            cubic_2d,
            lambda s, g: torch.cat([grid, s * torch.randn(64, 2, generator=g, dtype=torch.float64)]),
            cubic_points,
            9,
        ),
        "tanh": (
            lambda h: torch.tanh(h @ W.T),
            lambda s, g: torch.cat(
                [
                    torch.cartesian_prod(*[torch.linspace(-1.6, 1.6, 5, dtype=torch.float64)] * 3),
                    s * torch.randn(64, 3, generator=g, dtype=torch.float64),
                ]
            ),
            tanh_points,
            8,
        ),
    }


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
@pytest.mark.parametrize("case", ["affine", "cubic", "tanh"])
def test_known_fixed_points_are_accepted_from_starts_at_every_scale(case, scale):
    """The neighbourhood test refuses nothing real: the affine contraction's one point, the cubic
    map's 9 and the tanh RNN's 9 are all found, with their labels, whatever the scale of the
    starts (and so of the typical step), and no converged start is refused."""
    F, make_starts, want, digits = known_answer_cases()[case]
    starts = make_starts(scale, torch.Generator().manual_seed(1))
    points, report = find_fixed_points(F, starts)
    assert report["n_converged"] == sum(p.n_starts for p in points)
    if case == "affine":
        assert len(points) == 1 and points[0].label == "stable" and report["n_converged"] == 16
        torch.testing.assert_close(points[0].state, want, atol=1e-9, rtol=0)
    else:
        assert {tuple(round(float(c), digits) for c in p.state): p.label for p in points} == want
    assert IDENTITY not in report["refused"]["reasons"]


@pytest.mark.parametrize("D", [1, 2])
def test_a_degenerate_fixed_point_exactly_at_a_start_is_accepted(D):
    """h - h^3 started exactly at its fixed point 0: the residual is 0 and J - I is 0 there, yet
    F is not the identity around it (the step is -x^3 at x): a real, marginal point."""
    points, report = find_fixed_points(lambda h: h - h**3, torch.zeros(1, D, dtype=torch.float64))
    assert len(points) == 1 and points[0].label == "marginal" and float(points[0].state.abs().max()) == 0.0
    assert report["n_converged"] == 1 and report["refused"]["n"] == 0


def test_a_residual_that_fades_without_a_root_is_refused_for_its_newton_step():
    """h + exp(-h) on h > 0: at h = 25 the residual, 1.4e-11, is below the tolerance the other
    starts' large steps set and well above rounding, but Newton's step there is 1: no root."""
    starts = torch.tensor([[-3.0], [-2.0], [-1.0], [25.0]], dtype=torch.float64)
    points, report = find_fixed_points(lambda h: h + torch.exp(-h), starts, max_iter=0)
    assert points == [] and report["refused"]["n"] == 1
    assert list(report["refused"]["reasons"]) == ["the Newton step does not vanish (a residual that fades without a root)"]


def test_in_fp32_a_gaussian_tail_within_newtons_reach_is_refused_as_fading():
    """h + 0.5 exp(-h^2) in fp32 at h = 3.2, the tail one CPU path settled on (CI, AVX2, in 2-D):
    the residual 0.5 exp(-h^2) = 1.8e-5 meets the tolerance the starts near 0 set (1.7e-4) and is
    45x its rounding (4e-7), and Newton's step, 1 / (2h) = 0.156 outward, is inside the fp32
    neighbourhood (radius 10 eps^(1/3) (1 + h) = 0.21). Its next step, from h + 0.156, is 0.149:
    the steps shrink by h / (h + 1/(2h)), so they predict a root ~h = 3.5 away, 17 radii, where a
    root of order k is k steps away."""
    starts = torch.tensor([[3.2], [0.1], [0.0], [-0.1]])
    points, report = find_fixed_points(lambda h: h + 0.5 * torch.exp(-h.pow(2)), starts, max_iter=0)
    assert points == [] and report["refused"] == {"n": 1, "reasons": {FADING: 1}}


def test_in_fp32_the_bump_tail_is_refused_as_fading_where_j_minus_i_is_rank_deficient():
    """The same tail in 2-D at the point CI's AVX2 path settled on (|h| = 3.23): J - I is rank 1
    and formed in fp32 with ~1e-3 relative error in its entries (1 - 5.7e-5 cancels), so least
    squares used to take a step of ~2 along the direction J - I cannot resolve (whose size is
    rounding over rounding, and so whose refusal depended on the CPU path). The minimum-norm
    step is the 1-D one, 0.155, and the tail is refused for where its steps head."""
    starts = torch.tensor([[-1.9774, -2.5584], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1]])
    step = newton_steps(bump, starts[:1], bump(starts[:1]) - starts[:1])
    assert abs(float(step.norm()) - 1 / (2 * float(starts[0].norm()))) < 1e-3
    points, report = find_fixed_points(bump, starts, max_iter=0)
    assert points == [] and report["refused"] == {"n": 1, "reasons": {FADING: 1}}


def test_a_newton_step_where_the_map_is_not_finite_is_nan_for_that_state_only():
    """A state whose Jacobian holds a NaN gets a NaN step (refused, as an infinite Newton step),
    where the SVD would otherwise fail for the whole batch."""
    F = lambda h: h - h**3 + torch.where(h > 5, torch.log(5 - h), 0.0)
    h = torch.tensor([[0.1], [6.0]], dtype=torch.float64)
    step = newton_steps(F, h, F(h) - h)
    assert torch.isnan(step[1]).all() and float(step[0, 0]) == pytest.approx(-0.1 / 3)


@pytest.mark.parametrize("start", [0.3, -0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_triple_root_approached_from_a_start_is_accepted_in_either_precision(dtype, start):
    """h - h^3 from a start: Newton approaches the triple root linearly, each step 2/3 of the
    last, so the root its steps predict is 3 steps away, within the neighbourhood test's reach of
    roots of order up to 8 (in fp32 too, where the radius is 0.05)."""
    points, report = find_fixed_points(lambda h: h - h**3, torch.tensor([[start]], dtype=dtype), max_iter=200)
    assert len(points) == 1 and report["n_converged"] == 1 and report["refused"]["n"] == 0


def test_a_small_residual_that_is_flat_around_the_point_is_refused_as_not_small():
    """h + 1e-12 + relu(-h)^2: on h > 0 F translates by 1e-12, a thousand ulps at h = 5, below the
    tolerance the other starts set (~4e-10) and with a zero Newton step (J - I = 0), yet no root:
    the residual is the step all around the point, not small relative to it."""
    F = lambda h: h + 1e-12 + torch.relu(-h) ** 2
    starts = torch.tensor([[-3.0], [-2.0], [-1.0], [5.0]], dtype=torch.float64)
    points, report = find_fixed_points(F, starts, max_iter=0)
    assert points == [] and report["refused"]["n"] == 1
    assert list(report["refused"]["reasons"]) == ["the residual is not small relative to the map's step around it"]


def test_a_marginal_fixed_point_is_labelled_marginal():
    """F(h) = h - h^3: F'(0) = 1, the point is neither stable nor unstable. The residual -h^3 has a
    triple root, which Newton approaches linearly and resolves only to ~tolerance^(1/3): ~1e-4."""
    F = lambda h: h - h**3
    points, _ = find_fixed_points(F, torch.tensor([[0.5], [-0.3]], dtype=torch.float64), max_iter=200)
    assert len(points) == 1 and points[0].label == "marginal" and not points[0].stable
    assert abs(float(points[0].state[0])) < 1e-4


def test_the_report_tells_a_small_budget_from_no_fixed_point():
    """Stopped early, the starts are still improving (more iterations would converge); given the
    budget, they converge."""
    W = torch.diag(torch.tensor([2.0, 2.0, 0.5], dtype=torch.float64))
    F = lambda h: torch.tanh(h @ W.T)
    starts = torch.randn(8, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    _, short = find_fixed_points(F, starts, max_iter=2)
    assert short["n_converged"] < 8 and short["unconverged"]["still_improving"] > 0
    _, full = find_fixed_points(F, starts)
    assert full["n_converged"] == 8 and full["unconverged"]["n"] == 0


# ---- Lyapunov exponents from tangent vectors ---------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tangent_lyapunov_of_a_uniform_contraction_has_no_round_off_floor(dtype):
    """F(h) = 0.5 h + 1: lambda = log 0.5 = -0.693 at every T. Differencing two trajectories
    reaches round-off within tens of steps (the difference becomes exactly 0: lambda = -inf);
    tangent vectors never subtract nearby states."""
    F = lambda h: 0.5 * h + 1.0
    h0 = torch.zeros(4, dtype=dtype)
    lam = tangent_lyapunov(F, h0, steps=200, k=2)
    assert torch.allclose(lam, torch.full_like(lam, math.log(0.5)), atol=1e-6, rtol=0)
    floor = lyapunov_from_growth(perturbation_growth(F, h0, steps=60))
    assert math.isinf(float(floor[-1]))  # the finite-perturbation estimate's floor, in fp32 and fp64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tangent_lyapunov_of_a_non_normal_contraction(dtype):
    """A = [[0.5, 10], [0, 0.25]]: exponents log 0.5 and log 0.25; the transient (the eigenvector
    basis's condition, ~40) fades as log(40) / T: < 0.01 at T = 1000."""
    A = torch.tensor([[0.5, 10.0], [0.0, 0.25]], dtype=dtype)
    lam = tangent_lyapunov(lambda h: h @ A.T, torch.ones(2, dtype=dtype), steps=1000, k=2)
    assert abs(float(lam[-1, 0]) - math.log(0.5)) < 0.01 and abs(float(lam[-1, 1]) - math.log(0.25)) < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tangent_lyapunov_with_a_complex_dominant_pair(dtype):
    """A rotation by 0.7 rad scaled by 0.95, and 0.2 on the third axis, conjugated by a random
    matrix (non-normal): exponents log 0.95 (twice: the pair) and log 0.2."""
    r, theta = 0.95, 0.7
    block = torch.tensor(
        [[r * math.cos(theta), -r * math.sin(theta), 0.0], [r * math.sin(theta), r * math.cos(theta), 0.0], [0.0, 0.0, 0.2]],
        dtype=torch.float64,
    )
    S = torch.randn(3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 2 * torch.eye(3, dtype=torch.float64)
    A = (S @ block @ torch.linalg.inv(S)).to(dtype)
    lam = tangent_lyapunov(lambda h: h @ A.T, torch.ones(3, dtype=dtype), steps=2000, k=3)
    want = [math.log(r), math.log(r), math.log(0.2)]
    assert all(abs(float(a) - b) < 0.01 for a, b in zip(lam[-1], want)), lam[-1]


@pytest.mark.slow
def test_tangent_lyapunov_of_a_nonlinear_map_at_its_stable_point():
    """Along a trajectory that settles on the stable fixed point 1 of x + 0.3 (x - x^3), the
    exponent tends to log F'(1) = log 0.4."""
    lam = tangent_lyapunov(cubic_2d, torch.tensor([0.7, 1.4], dtype=torch.float64), steps=2000, k=2)
    assert abs(float(lam[-1, 0]) - math.log(0.4)) < 0.01 and abs(float(lam[-1, 1]) - math.log(0.4)) < 0.01


def test_the_renormalising_map_sends_the_tangents_to_their_orthonormal_rows():
    """M @ JQ is the new orthonormal basis (so whatever else a tangent carries can be mixed alike),
    M is lower triangular, and its diagonal is 1 / |R_ii| up to sign: the same growths."""
    JQ = torch.randn(3, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    Q, logs, M = tangent_qr_map(JQ)
    torch.testing.assert_close(M @ JQ, Q, rtol=0, atol=1e-12)
    torch.testing.assert_close(Q @ Q.T, torch.eye(3, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(M, M.tril())
    torch.testing.assert_close(M.diagonal().abs().log(), -logs, rtol=0, atol=1e-12)
