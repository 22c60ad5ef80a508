"""Analyses of a map F: R^D -> R^D given as a batched function ``F(h: [batch, D]) -> [batch, D]``:
Jacobian spectra (power iteration on JVP/VJP, exact eigenvalues for small D, Hutchinson Frobenius
norm), fixed points (damped Newton with the exact Jacobian from many independent starts,
deduplicate, classify), and Lyapunov exponents (tangent vectors, and finite perturbations). Nothing here knows about transformers: the FBT feedback map is one
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


def tangent_qr(JQ: Tensor) -> tuple[Tensor, Tensor]:
    """One Benettin step: the propagated tangent vectors JQ [k, D] (rows) re-orthonormalised by QR;
    returns the new orthonormal rows [k, D] and log |R_ii| [k] (the growth of each direction)."""
    Q, R = torch.linalg.qr(JQ.T)
    return Q.T, torch.diagonal(R).abs().log()


def tangent_qr_map(JQ: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``tangent_qr`` and the lower-triangular M [k, k] with M @ JQ = the new rows, to transform
    whatever else the tangents carry alike."""
    Q, R = torch.linalg.qr(JQ.T)
    eye = torch.eye(R.shape[0], dtype=R.dtype, device=R.device)
    return Q.T, torch.diagonal(R).abs().log(), torch.linalg.solve_triangular(R.T, eye, upper=False)


def tangent_basis(D: int, k: int, dtype: torch.dtype, device=None, seed: int = 0) -> Tensor:
    """k random orthonormal tangent vectors [k, D] to start the Benettin iteration from."""
    v = torch.randn(D, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.linalg.qr(v)[0].T.to(dtype=dtype, device=device)


def tangent_lyapunov(F: Map, h0: Tensor, steps: int, k: int = 1, seed: int = 0) -> Tensor:
    """The k leading Lyapunov exponents of the trajectory h_{t+1} = F(h_t) from h0, by Benettin's
    method: k tangent vectors pushed forward with JVPs (exact J_t v, never formed) and
    re-orthonormalised by QR every step; lambda_i(T) = (1/T) sum_{t<T} log |R_ii(t)|. Returns
    [steps, k]: row T-1 holds lambda_1..k(T). Unlike differencing two trajectories
    (``perturbation_growth``), nothing here subtracts nearby states, so there is no round-off floor:
    a contraction by 0.5 per step reads log 0.5 at every T, in fp32 as in fp64."""
    D = h0.numel()
    Q = tangent_basis(D, k, h0.dtype, h0.device, seed)
    h = h0.detach()[None]
    logs = torch.zeros(steps, k, dtype=torch.float64)
    for t in range(steps):
        h_next, JQ = jvp(F, (h.expand(k, D).clone(),), (Q,))[:2]
        Q, growth = tangent_qr(JQ.detach())
        logs[t] = growth.double()
        h = h_next[:1].detach()
    return logs.cumsum(0) / torch.arange(1, steps + 1, dtype=torch.float64)[:, None]


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


LABELS = ("stable", "marginal", "saddle", "unstable")


@dataclass
class FixedPoint:
    state: Tensor  # [D]
    residual: float  # ||F(h*) - h*||
    eigenvalues: Tensor  # complex, by decreasing modulus (empty when D is too large to compute)
    spectral_radius: float
    stable: bool  # label == "stable"
    n_starts: int  # how many starts converged here
    start_kinds: list[str] = field(default_factory=list)
    # stable: spectral radius < 1 - marginal_tol; marginal: within marginal_tol of 1; saddle: some
    # |eigenvalue| above 1 + marginal_tol and some below 1 - marginal_tol; unstable: the rest
    # (every |eigenvalue| >= 1 - marginal_tol, or the eigenvalues were not computed)
    label: str = "stable"


def batched_jacobians(F: Map, h: Tensor, max_rows: int = 8192) -> Tensor:
    """dF/dh [n, D, D] at every state of h [n, D], exactly: ``jacobian``'s one batched forward and
    backward for several states at once (D rows per state, at most ``max_rows`` rows per call)."""
    n, D = h.shape
    per_call = max(1, max_rows // D)
    out = []
    for chunk in h.detach().split(per_call):
        m = len(chunk)
        H = chunk[:, None, :].expand(m, D, D).reshape(m * D, D).clone().requires_grad_(True)
        with torch.enable_grad():
            Y = F(H).reshape(m, D, D)
            (J,) = torch.autograd.grad(torch.diagonal(Y, dim1=1, dim2=2).sum(), H)
        out.append(J.reshape(m, D, D))
    return torch.cat(out)


def newton_steps(F: Map, h: Tensor, r: Tensor, roundings: float = 4.0, max_rows: int = 8192) -> Tensor:
    """The undamped Newton step [n, D] at each state h [n, D] with residual r = F(h) - h: the least
    squares solution of (J - I) step = -r through the SVD of J - I, its singular values at most
    ``roundings`` x eps ||J||_F taken as 0 (the minimum-norm step). Where J is near I, J - I is
    known only to ~eps per entry (forming it cancels), and a direction it cannot resolve would
    otherwise get a step of rounding over rounding, of any size."""
    J = batched_jacobians(F, h, max_rows)
    finite = torch.isfinite(J).flatten(1).all(-1) & torch.isfinite(r).all(-1)  # else a NaN step, not an SVD error
    J, r = torch.where(finite[:, None, None], J, 0.0), torch.where(finite[:, None], r, 0.0)
    U, S, Vh = torch.linalg.svd(J - torch.eye(h.shape[-1], dtype=h.dtype, device=h.device))
    noise = roundings * torch.finfo(h.dtype).eps * torch.linalg.matrix_norm(J)
    kept = S > noise[:, None]
    inverse = torch.where(kept, 1 / torch.where(kept, S, 1.0), 0.0)
    coeffs = -(U.transpose(1, 2) @ r[..., None])[..., 0] * inverse
    step = (Vh.transpose(1, 2) @ coeffs[..., None])[..., 0]
    return torch.where(finite[:, None], step, float("nan"))


# why a start whose residual met the tolerance was refused (the report counts each)
IDENTITY = "F is the identity to working precision here"
FADING = "the Newton step does not vanish (a residual that fades without a root)"
NOT_SMALL = "the residual is not small relative to the map's step around it"


def neighbourhood_steps(
    F: Map, h: Tensor, radius: Tensor, n_pairs: int = 4, seed: int = 0, max_rows: int = 8192
) -> tuple[Tensor, Tensor, Tensor]:
    """The map's step around each state h [m, D], at the points x = h +- radius u_k (``n_pairs``
    random unit directions u_k, the same for every state), each as an RMS over those points [m]:
    ``step`` ||F(x) - x||; ``slope`` radius ||(J(x) - I)^T u_k||, the change J - I makes across the
    neighbourhood (one VJP per point); ``rounding`` eps || max(|x|, |F(x)|) || (elementwise max),
    about an ulp of each coordinate: how finely F(x) - x can be known there. One batched forward
    and backward per chunk of states."""
    m, D = h.shape
    u = torch.randn(n_pairs, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    u = (u / u.norm(dim=-1, keepdim=True)).to(dtype=h.dtype, device=h.device)
    u = torch.cat([u, -u])  # symmetric, so a linear residual averages to its value at h
    K, eps = len(u), torch.finfo(h.dtype).eps
    rms = lambda v: v.reshape(-1, K).pow(2).mean(-1).sqrt()
    out = []
    per_call = max(1, max_rows // K)
    for hc, rc in zip(h.detach().split(per_call), radius.detach().split(per_call)):
        U = u.repeat(len(hc), 1)  # [m K, D]
        X = (hc.repeat_interleave(K, 0) + rc.repeat_interleave(K)[:, None] * U).requires_grad_(True)
        with torch.enable_grad():
            Y = F(X)
            (UJ,) = torch.autograd.grad((Y * U).sum(), X)  # row i: u_i^T J(x_i) (rows do not interact)
        Y, X = Y.detach(), X.detach()
        step = (Y - X).norm(dim=-1)
        slope = rc.repeat_interleave(K) * (UJ - U).norm(dim=-1)
        rounding = eps * torch.maximum(X.abs(), Y.abs()).norm(dim=-1)
        out.append(torch.stack([rms(step), rms(slope), rms(rounding)]))
    step, slope, rounding = torch.cat(out, dim=1)
    return step, slope, rounding


def _residual_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol on the residual relative to the map's typical step, xtol on the last Newton step
    relative to 1 + ||h||): about eps^(2/3) and eps^(1/3), what a quadratically converging
    iteration reaches with room to spare."""
    eps = torch.finfo(dtype).eps
    return 10 * eps ** (2 / 3), 10 * eps ** (1 / 3)


def find_fixed_points(
    F: Map,
    starts: Tensor,
    *,
    start_kinds: list[str] | None = None,
    max_iter: int = 100,
    rtol: float | None = None,
    xtol: float | None = None,
    dedup: float = 1e-3,
    marginal_tol: float = 1e-3,
    exact_eig_max_dim: int = 512,
    max_rows: int = 8192,
    roundings: float = 4.0,
    max_order: int = 8,
) -> tuple[list[FixedPoint], dict]:
    """Fixed points h* = F(h*) from every start [n, D], each solved on its own (batched; nothing
    is shared between starts) by Levenberg-Marquardt, a damped Newton iteration on the residual
    r(h) = F(h) - h with the exact Jacobian: step = -(J_r^T J_r + mu I)^-1 J_r^T r, mu divided by
    10 after a step that lowers ||r|| and multiplied by 10 (step rejected) after one that does
    not, so it is Newton near a root and gradient descent far from one.

    A start converged when ||r|| <= rtol x the map's typical step (the median ||F(h0) - h0|| over
    the starts: an absolute tolerance in the map's own units), and then only if it passes a test
    in its neighbourhood, the points h +- rho u_k at rho = xtol x (1 + ||h||), the distance within
    which it is located (``neighbourhood_steps``): (1) the map's step there, or J - I there times
    rho, exceeds ``roundings`` x the rounding of F(x) - x, else a zero residual is rounding, not a
    root (``IDENTITY``: far out on h + 0.5 exp(-|h|^2), F(h) == h exactly); (2) the undamped Newton
    step (``newton_steps``) is <= rho and, where the residual is resolved (above ``roundings`` x
    its rounding), the distance to a root its first two steps predict, s0 / (1 - s1 / s0), is
    <= ``max_order`` x rho (a root of order k is k steps away), else the residual fades without a
    root, at infinity, where the steps shrink slowly or not at all, or at a ghost of a fold
    (``FADING``); (3) ||r|| is at most half the step around it and both the step and J - I are
    resolved there (``NOT_SMALL``). A degenerate root (J - I = 0 at the point, as for h - h^3 at
    0) passes: F is not the identity around it. Converged points closer than ``dedup`` (relative)
    merge; each is labelled from the eigenvalues of dF/dh (``FixedPoint.label``). The report
    counts the refused starts by reason (``refused``) and says, for every start that did not
    converge, how far it got (its residual) and how many were still improving at the end (a
    larger ``max_iter`` may find more) or had stalled (no fixed point within reach of them)."""
    kinds = start_kinds or ["given"] * len(starts)
    default_rtol, default_xtol = _residual_tolerances(starts.dtype)
    rtol, xtol = rtol or default_rtol, xtol or default_xtol
    h = starts.detach().clone()
    n, D = h.shape
    eye = torch.eye(D, dtype=h.dtype, device=h.device)
    with torch.no_grad():
        r = F(h) - h
    norm = r.norm(dim=-1)
    finite = torch.isfinite(norm)
    typical = float(norm[finite].median()) if finite.any() else 0.0
    atol = rtol * max(typical, float(torch.finfo(h.dtype).eps))
    mu = torch.full((n,), 1e-3, dtype=h.dtype, device=h.device)
    mu_min = max(1e-15, 4 * float(torch.finfo(h.dtype).eps))  # below eps the damping rounds away
    history = [norm.clone()]
    last_step = torch.full((n,), float("inf"), dtype=h.dtype, device=h.device)

    def settled() -> Tensor:  # a small residual and a small last step (a fading residual keeps stepping)
        return (norm <= atol) & (last_step <= xtol * (1 + h.norm(dim=-1)))

    active = finite & ~settled()
    for _ in range(max_iter):
        idx = torch.nonzero(active).flatten()
        if not len(idx):
            break
        Jr = batched_jacobians(F, h[idx], max_rows) - eye
        JtJ, Jtr = Jr.transpose(1, 2) @ Jr, (Jr.transpose(1, 2) @ r[idx, :, None])[..., 0]
        # damping relative to J_r's own scale (Marquardt), so it stays Newton near a singular root
        scale = (torch.diagonal(JtJ, dim1=1, dim2=2).mean(-1)).clamp(min=torch.finfo(h.dtype).tiny)
        step, info = torch.linalg.solve_ex(JtJ + (mu[idx] * scale)[:, None, None] * eye, -Jtr)
        # a system singular in working precision (J_r of rank < D, the damping rounded away) is a
        # rejected step: more damping next time, never an exception for the whole batch
        step[info != 0] = float("nan")
        trial = h[idx] + step
        with torch.no_grad():
            r_trial = F(trial) - trial
        n_trial = r_trial.norm(dim=-1)
        better = torch.isfinite(n_trial) & ((n_trial < norm[idx]) | (n_trial == 0))
        accept = idx[better]
        h[accept], r[accept], norm[accept] = trial[better], r_trial[better], n_trial[better]
        last_step[accept] = step[better].norm(dim=-1)
        mu[accept] = (mu[accept] / 10).clamp(min=mu_min)
        mu[idx[~better]] *= 10
        history.append(norm.clone())
        stuck = idx[~better][mu[idx[~better]] > 1e15]  # no descent direction left at any damping
        active[stuck] = False
        active &= ~settled()
    # the undamped Newton step at each final point (least squares where J_r is singular): its size
    # tells a root from a residual that fades without one; taken where it helps, it polishes the
    # point to round-off, so a point does not depend on the tolerance its batch of starts set
    converged = torch.zeros(n, dtype=torch.bool, device=h.device)
    refused_at = torch.zeros(n, dtype=torch.bool, device=h.device)
    refused: dict[str, int] = {}
    small = torch.nonzero(torch.isfinite(norm) & (norm <= atol)).flatten()
    if len(small):
        settled_norm = norm[small].clone()
        step = newton_steps(F, h[small], r[small], roundings, max_rows)
        newton = step.norm(dim=-1).nan_to_num(float("inf"))
        radius = xtol * (1 + h[small].norm(dim=-1))
        with torch.no_grad():
            polished = h[small] + step
            r_polished = F(polished) - polished
        n_polished = r_polished.norm(dim=-1)
        # Newton's next step: how fast the steps shrink says how far off the root they head for is
        next_step = newton_steps(F, polished, r_polished, roundings, max_rows).norm(dim=-1).nan_to_num(float("inf"))
        ahead = torch.where(next_step < newton, newton**2 / (newton - next_step), float("inf"))
        ahead[newton == 0] = 0.0
        better = (newton <= radius) & torch.isfinite(n_polished) & (n_polished < norm[small])
        h[small[better]], norm[small[better]] = polished[better], n_polished[better]
        radius = xtol * (1 + h[small].norm(dim=-1))
        # Where F(h) - h rounds to 0 the residual is 0 and so is Newton's step, root or not, and the
        # exact J - I can still be far above eps (autograd differentiates a bump that F's sum
        # rounds away): only the map's step around the point, against its rounding there, tells.
        # Measured around the point, not at it, so a degenerate root (J - I = 0 there) is kept.
        step_around, slope_around, rounding = neighbourhood_steps(F, h[small], radius, max_rows=max_rows)
        step_resolved = step_around > roundings * rounding
        slope_resolved = slope_around > roundings * rounding
        identity = ~step_resolved & ~slope_resolved
        resolved = settled_norm > roundings * rounding  # below it, Newton's steps are rounding's
        fading = ~identity & (~(newton <= radius) | (resolved & ~(ahead <= max_order * radius)))
        # half the step around it: a degenerate root located to ~radius (h - h^3) stays well below,
        # a residual that is merely flat there (a translation, a fading tail) does not
        small_here = step_resolved & slope_resolved & (norm[small] <= 0.5 * step_around)
        not_small = ~identity & ~fading & ~small_here
        converged[small] = ~(identity | fading | not_small)
        refused_at[small] = identity | fading | not_small
        for reason, mask in ((IDENTITY, identity), (FADING, fading), (NOT_SMALL, not_small)):
            if int(mask.sum()):
                refused[reason] = int(mask.sum())
    points: list[FixedPoint] = []
    for i in torch.nonzero(converged).flatten().tolist():
        for p in points:
            if (p.state - h[i]).norm() / max(1.0, float(p.state.norm())) < dedup:
                p.n_starts += 1
                p.start_kinds.append(kinds[i])
                break
        else:
            ev = eigenvalues(F, h[i]) if D <= exact_eig_max_dim else torch.empty(0, dtype=torch.complex128)
            rho = float(ev.abs().max()) if len(ev) else spectral_radius(F, h[i])
            label = fixed_point_label(ev, rho, marginal_tol)
            points.append(FixedPoint(h[i].clone(), float(norm[i]), ev, rho, label == "stable", 1, [kinds[i]], label))
    missed = ~converged
    tail = history[max(0, len(history) - 1 - max(1, len(history) // 10))]  # the residuals a tenth of the budget ago
    improving = missed & ~refused_at & torch.isfinite(norm) & (norm < 0.5 * tail)  # refused ones had settled
    residuals = norm[missed]
    report = {
        "n_starts": n,
        "n_converged": int(converged.sum()),
        "n_fixed_points": len(points),
        "iterations": len(history) - 1,
        "atol": atol,
        "typical_step": typical,
        # met the residual tolerance but were refused, by reason (also counted in unconverged)
        "refused": {"n": sum(refused.values()), "reasons": refused},
        "unconverged": {
            "n": int(missed.sum()),
            "still_improving": int(improving.sum()),
            "residual_quantiles": [
                float(q)
                for q in residuals.nan_to_num(float("inf")).quantile(torch.tensor([0.0, 0.5, 1.0], dtype=residuals.dtype))
            ]
            if len(residuals)
            else [],
        },
        "max_residual_unconverged": float(residuals.max()) if len(residuals) else 0.0,
    }
    return points, report


def fixed_point_label(ev: Tensor, rho: float, marginal_tol: float = 1e-3) -> str:
    """``FixedPoint.label`` from the eigenvalues ``ev`` of dF/dh (empty: unknown) and the spectral
    radius ``rho``."""
    if abs(rho - 1) <= marginal_tol:
        return "marginal"
    if rho < 1:
        return "stable"
    if len(ev) and float(ev.abs().min()) < 1 - marginal_tol:
        return "saddle"
    return "unstable"
