"""Map analyses on maps with known answers."""

import math

import pytest
import torch

from workbench.dynamics.maps import (
    eigenvalues,
    find_fixed_points,
    frobenius_hutchinson,
    jacobian,
    lyapunov_from_growth,
    perturbation_growth,
    spectral_norm,
    spectral_radius,
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
