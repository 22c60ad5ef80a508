"""The dynamics page: the stability of FBT's feedback map on the CPU zoo, from the summary of
``workbench dynamics`` (``dynamics_cpu_summary.json``): perturbation ratios, Lyapunov exponents,
spectra of the map's Jacobian, fixed points and the K-pass residual, a column per model."""

from __future__ import annotations

from collections.abc import Callable

from .render import Page, fixed, sci, small, table


def fixed_points_cell(entries: list[dict]) -> str:
    cells = []
    for entry in entries:
        missed = entry.get("unconverged")
        tail = ""
        if missed and missed["n"]:
            low, _, high = missed["residual_quantiles"]
            tail = (
                f"; {missed['n']} start{'s' if missed['n'] > 1 else ''} did not converge (residual {sci(low)} to {sci(high)},"
                f" {missed['still_improving']} still improving after {entry['iterations']} iterations)"
            )
        if not entry["points"]:
            cells.append(f"step {entry['step']}: none converged ({entry['n_converged']} of {entry['n_starts']} starts){tail}")
            continue
        points = "; ".join(
            f"{p.get('label', 'stable' if p['stable'] else 'unstable')} (rho {p['spectral_radius']:.2f}, reached from "
            f"{p['n_starts']} of {entry['n_starts']} starts, distance to the rollout state "
            f"{p['distance_to_rollout_state']:.1f})"
            for p in entry["points"]
        )
        count = len(entry["points"])
        cells.append(f"step {entry['step']}: {count} point{'s' if count > 1 else ''}, {points}{tail}")
    return " / ".join(cells)


def dynamics_table(summary: dict) -> str:
    runs = summary["runs"]
    first = next(iter(runs.values()))
    horizons = sorted(first["lyapunov"], key=float)
    steps = [str(s["step"]) for s in first["spectra"]]
    ks = range(2, len(first["kpass_relative_residual"]) + 1)
    quantities: list[tuple[str, Callable[[dict], str]]] = [
        (
            "finite-time Lyapunov lambda(T) from the perturbation, T = " + " / ".join(horizons),
            lambda r: " / ".join(small(r["lyapunov"][t]) for t in horizons),
        ),
        *(
            [
                (
                    "leading Lyapunov exponent from tangent vectors through F_t (context frozen), lambda_1(T), T = "
                    + " / ".join(horizons),
                    lambda r: " / ".join(small(r["lyapunov_tangent"][t][0]) for t in horizons),
                ),
                (
                    f"leading {len(first['lyapunov_tangent'][horizons[-1]])} exponents at T = {horizons[-1]} (tangent)",
                    lambda r: ", ".join(small(v) for v in r["lyapunov_tangent"][horizons[-1]]),
                ),
            ]
            if "lyapunov_tangent" in first
            else []
        ),
        *(
            [
                (
                    "the same through the whole decoding step (tangent in the cache too), T = " + " / ".join(horizons),
                    lambda r: " / ".join(small(r["lyapunov_tangent_full"][t][0]) for t in horizons),
                ),
                (
                    f"leading {len(first['lyapunov_tangent_full'][horizons[-1]])} exponents at T = {horizons[-1]} (whole step)",
                    lambda r: ", ".join(small(v) for v in r["lyapunov_tangent_full"][horizons[-1]]),
                ),
            ]
            if first.get("lyapunov_tangent_full")
            else []
        ),
        ("smallest perturbation ratio (step)", lambda r: f"{sci(r['min_ratio'])} ({r['argmin_ratio_step']})"),
        ("first step the ratio is back above 1", lambda r: str(r["first_step_ratio_above_1"])),
        ("ratio at the last step (horizon)", lambda r: f"{sci(r['final_ratio'])} ({r['horizon']})"),
        ("largest ratio", lambda r: sci(r["max_ratio"])),
        ("window slid at steps", lambda r: ", ".join(map(str, r["slid_at"]))),
        (
            "spectral radius of dF/dh at steps " + ", ".join(steps),
            lambda r: ", ".join(fixed(s["spectral_radius"], 2) for s in r["spectra"]),
        ),
        ("spectral norm of dF/dh at the same steps", lambda r: ", ".join(fixed(s["spectral_norm"], 2) for s in r["spectra"])),
        ("mean state norm", lambda r: fixed(r["state_norm_mean"], 1)),
        ("fixed points", lambda r: fixed_points_cell(r["fixed_points"])),
        (
            "K-pass relative residual, K = " + ", ".join(map(str, ks)),
            lambda r: ", ".join(fixed(v, 3) for v in r["kpass_relative_residual"][1:]),
        ),
        (
            "K-pass KL between successive passes, K = " + ", ".join(map(str, ks)),
            lambda r: ", ".join(sci(v) for v in r["kpass_kl"][1:]),
        ),
    ]
    return table(
        [""] + [f"`{name}`" for name in runs], [[label] + [cell(run) for run in runs.values()] for label, cell in quantities]
    )


def dynamics_body(summary: dict) -> list[str]:
    return [
        "## Stability of the feedback map",
        "",
        "Perturbation ratio = ||dh_t|| / ||dh_t0|| between the rollout and its perturbed copy (a finite",
        "perturbation of 1e-3: the nonlinear measure, with a round-off floor); tangent exponents: Benettin's",
        "method, k tangent vectors pushed forward by forward-mode derivatives and re-orthonormalised (no floor),",
        "through each step's feedback map F_t (the context frozen) and through the whole decoding step (the",
        "tangent also in the cached keys and values: the linearisation of the perturbation curve).",
        "Fixed points: damped Newton with the exact Jacobian from each start independently; labels from the",
        "eigenvalues of dF/dh (stable, marginal within 1e-3 of the unit circle, saddle, unstable).",
        "",
        dynamics_table(summary),
        "## Figures",
        "",
        "None committed. The study's figures (`rollout.png`, `spectra.png`, `fixed_points.png`, `kpass.png`) are",
        "drawn from the per-step curves and rollout states in its own `dynamics.json` and `states.safetensors`, which",
        "this folder does not keep (the summary keeps what the table shows); `workbench dynamics` draws them into its",
        "output directory.",
    ]


DYNAMICS = Page(
    ("dynamics_cpu_summary.json",),
    "Feedback-map stability on the CPU zoo (measured)",
    dynamics_body,
    figures=("dynamics_cpu_summary.json",),
)
