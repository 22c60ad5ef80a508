"""Analyses of a map F: R^D -> R^D given as a batched function ``F(h: [batch, D]) -> [batch, D]``:
Jacobian spectra (power iteration on JVP/VJP, exact eigenvalues for small D, Hutchinson Frobenius
norm), fixed points (minimise 0.5 ||F(h) - h||^2 from many starts, deduplicate, classify), and
finite-time Lyapunov estimates. Nothing here knows about transformers: the FBT feedback map is one
such F (``workbench.dynamics.feedback``), and the tests use maps with known answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.func import jvp, vjp

Map = Callable[[Tensor], Tensor]


def _single(F: Map) -> Callable[[Tensor], Tensor]:
    """F on one state [D] (torch.func transforms want unbatched functions)."""
    return lambda h: F(h[None])[0]


def jacobian(F: Map, h: Tensor) -> Tensor:
    """dF/dh [D, D] at one state h [D] (exact; memory ~ D batched evaluations of F). One batched
    forward and one backward: F on D copies of h, and row i of J is the gradient of output i of
    copy i (rows of a batched map do not interact)."""
    D = h.numel()
    H = h.detach().expand(D, D).clone().requires_grad_(True)
    with torch.enable_grad():
        Y = F(H)
        (J,) = torch.autograd.grad(torch.diagonal(Y).sum(), H)
    return J


def jacobian_summary(F: Map, h: Tensor) -> dict:
    """Everything the power-iteration routines estimate, exactly, from one Jacobian (small D):
    eigenvalues sorted by decreasing modulus, spectral radius, spectral norm, Frobenius norm."""
    J = jacobian(F, h).double()
    ev = _sorted_eigvals(J)
    return {
        "eigenvalues": ev,
        "spectral_radius": float(ev.abs()[0]),
        "spectral_norm": float(torch.linalg.matrix_norm(J, 2)),
        "frobenius": float(torch.linalg.matrix_norm(J)),
    }


def eigenvalues(F: Map, h: Tensor) -> Tensor:
    """All eigenvalues (complex) of dF/dh at h, sorted by decreasing modulus."""
    return _sorted_eigvals(jacobian(F, h))


def _sorted_eigvals(J: Tensor) -> Tensor:
    ev = torch.linalg.eigvals(J.double())
    return ev[ev.abs().argsort(descending=True)]


def spectral_norm(F: Map, h: Tensor, iters: int = 50, seed: int = 0) -> float:
    """Largest singular value of dF/dh at h by power iteration on J^T J (one JVP and one VJP per
    iteration, never forming J)."""
    f = _single(F)
    v = torch.randn(h.shape, generator=torch.Generator().manual_seed(seed), dtype=h.dtype).to(h.device)
    v = v / v.norm()
    pullback = vjp(f, h)[1]
    sigma = 0.0
    for _ in range(iters):
        Jv = jvp(f, (h,), (v,))[1]
        (JtJv,) = pullback(Jv)
        sigma = float(Jv.detach().norm())
        norm = JtJv.detach().norm()
        if norm == 0:
            return 0.0
        v = JtJv / norm
    return sigma


def spectral_radius(F: Map, h: Tensor, iters: int = 200, seed: int = 0) -> float:
    """Largest |eigenvalue| of dF/dh at h from the growth of ||J^k v|| (robust when the dominant
    eigenvalues are a complex pair, where the plain power method's vector does not settle)."""
    f = _single(F)
    v = torch.randn(h.shape, generator=torch.Generator().manual_seed(seed), dtype=h.dtype).to(h.device)
    v = v / v.norm()
    log_growth, tail = [], max(1, iters // 2)
    for _ in range(iters):
        v = jvp(f, (h,), (v,))[1]
        norm = float(v.detach().norm())
        if norm == 0 or not math.isfinite(norm):
            return 0.0 if norm == 0 else float("inf")
        log_growth.append(math.log(norm))
        v = v / norm
    # average growth over the second half, after transients from the start vector die out
    return math.exp(sum(log_growth[-tail:]) / tail)


def frobenius_hutchinson(F: Map, h: Tensor, samples: int = 32, seed: int = 0) -> float:
    """||dF/dh||_F estimated as sqrt(E ||J v||^2) over Rademacher v."""
    f = _single(F)
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(samples):
        v = (torch.randint(0, 2, h.shape, generator=gen) * 2 - 1).to(h.dtype).to(h.device)
        Jv = jvp(f, (h,), (v,))[1]
        total += float(Jv.detach().pow(2).sum())
    return math.sqrt(total / samples)


def lyapunov_from_growth(ratios: Tensor) -> Tensor:
    """Finite-time Lyapunov estimates lambda(T) = log(ratio_T) / T from perturbation growth ratios
    ||dh_{t0+T}|| / ||dh_{t0}||, T = 1..len(ratios). Negative means contracting."""
    steps = torch.arange(1, len(ratios) + 1, dtype=torch.float64)
    return ratios.double().log() / steps


def perturbation_growth(F: Map, h0: Tensor, steps: int, eps: float = 1e-4, seed: int = 0) -> Tensor:
    """||F^t(h0 + d) - F^t(h0)|| / ||d|| for t = 1..steps, for an autonomous map (a fixed token
    and context). Model rollouts, whose tokens change, use ``workbench.dynamics.feedback``."""
    d = torch.randn(h0.shape, generator=torch.Generator().manual_seed(seed), dtype=h0.dtype).to(h0.device)
    d = eps * d / d.norm()
    a, b = h0[None], (h0 + d)[None]
    out = []
    with torch.no_grad():
        for _ in range(steps):
            a, b = F(a), F(b)
            out.append(float((b - a).norm() / eps))
    return torch.tensor(out, dtype=torch.float64)


@dataclass
class FixedPoint:
    state: Tensor  # [D]
    residual: float  # ||F(h*) - h*||
    eigenvalues: Tensor  # complex, by decreasing modulus (empty when D is too large to compute)
    spectral_radius: float
    stable: bool  # spectral radius < 1
    n_starts: int  # how many starts converged here
    start_kinds: list[str] = field(default_factory=list)


def find_fixed_points(
    F: Map,
    starts: Tensor,
    *,
    start_kinds: list[str] | None = None,
    steps: int = 500,
    lr: float = 0.05,
    tol: float = 1e-6,
    dedup: float = 1e-3,
    polish_iters: int = 200,
    exact_eig_max_dim: int = 512,
) -> tuple[list[FixedPoint], dict]:
    """Minimise 0.5 ||F(h) - h||^2 jointly from every start [n, D] (Adam, then keep the runs whose
    residual relative to ||h|| is below ``tol``), merge points closer than ``dedup`` (relative),
    and classify each by the eigenvalues of dF/dh. Runs that did not converge (outliers, escapes
    to infinity) are counted in the report, never returned as fixed points."""
    kinds = start_kinds or ["given"] * len(starts)
    h = starts.detach().clone().requires_grad_(True)

    def objective() -> Tensor:
        return 0.5 * (F(h) - h).pow(2).sum()  # the starts are independent: a sum of their losses

    # Adam with a decaying step finds the basin from far starts; L-BFGS then polishes to tolerance
    adam = torch.optim.Adam([h], lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(adam, steps, eta_min=lr * 1e-3)
    for _ in range(steps):
        adam.zero_grad()
        objective().backward()
        adam.step()
        schedule.step()
    lbfgs = torch.optim.LBFGS(
        [h], lr=1.0, max_iter=polish_iters, tolerance_grad=1e-14, tolerance_change=1e-16, line_search_fn="strong_wolfe"
    )

    def closure() -> Tensor:
        lbfgs.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    lbfgs.step(closure)
    h = h.detach()
    with torch.no_grad():
        residual = (F(h) - h).norm(dim=-1)
        scale = h.norm(dim=-1).clamp(min=1.0)
    converged = (residual / scale < tol) & torch.isfinite(residual)
    points: list[FixedPoint] = []
    for i in torch.nonzero(converged).flatten().tolist():
        for p in points:
            if (p.state - h[i]).norm() / max(1.0, float(p.state.norm())) < dedup:
                p.n_starts += 1
                p.start_kinds.append(kinds[i])
                break
        else:
            ev = eigenvalues(F, h[i]) if h.shape[-1] <= exact_eig_max_dim else torch.empty(0, dtype=torch.complex128)
            rho = float(ev.abs().max()) if len(ev) else spectral_radius(F, h[i])
            points.append(FixedPoint(h[i].clone(), float(residual[i]), ev, rho, rho < 1.0, 1, [kinds[i]]))
    report = {
        "n_starts": len(starts),
        "n_converged": int(converged.sum()),
        "n_fixed_points": len(points),
        "max_residual_unconverged": float(residual[~converged].max()) if (~converged).any() else 0.0,
    }
    return points, report
