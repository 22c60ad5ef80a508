"""``workbench dynamics``: every feedback-map analysis on one or more FBT runs, side by side, as
JSON and figures under the output directory."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from workbench.dynamics.defaults import DEFAULTS
from workbench.dynamics.feedback import RolloutDiverged, feedback_map, feedback_model, kpass_convergence, prefill_context, rollout
from workbench.dynamics.maps import find_fixed_points, jacobian_summary, lyapunov_from_growth
from workbench.runtime.checkpoint import run_labels
from workbench.runtime.decoding import NonFinite
from workbench.storage.errors import BadInput
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import output
from workbench.storage.provenance import source_commit
from workbench.storage.shapes import Each, check_shape
from workbench.training.run import Run

MAX_HORIZON = 100_000  # states are kept for every step: 100k steps of d_model 1024 in float32 is 400 MB


def check_params(**settings) -> None:
    """Reject settings the analyses cannot use (``analyse_run``'s, the rest at ``DEFAULTS``),
    naming each, before any work (or output) starts."""
    given = {**DEFAULTS, **{k: v for k, v in settings.items() if k in DEFAULTS}}
    horizon, perturb_at, n_spectra, n_fixed = (given[k] for k in ("horizon", "perturb_at", "n_spectra", "n_fixed"))
    n_starts, max_passes, fp_steps, tangents = (given[k] for k in ("n_starts", "max_passes", "fp_steps", "tangents"))
    rules = [
        ("horizon", horizon, 1 <= horizon <= MAX_HORIZON, f"1..{MAX_HORIZON:,} steps"),
        ("perturb_at", perturb_at, 1 <= perturb_at < horizon, f"1 <= perturb_at < horizon={horizon}"),
        ("spectra", n_spectra, 1 <= n_spectra <= min(horizon, 1000), f"1..{min(horizon, 1000)} (at most one per step)"),
        ("fixed_points", n_fixed, 0 <= n_fixed <= n_spectra, f"0..spectra={n_spectra} (they are sought at the spectra's steps)"),
        ("starts", n_starts, 2 <= n_starts <= 4096, "2..4096 (the previous state and zeros come first)"),
        ("max_passes", max_passes, 2 <= max_passes <= 256, "2..256"),
        ("fp_steps", fp_steps, 2 <= fp_steps <= 100_000, "2..100,000"),
        ("tangents", tangents, 1 <= tangents <= 64, "1..64 leading exponents"),
    ]
    for name, value, ok, expected in rules:
        if not ok:
            raise BadInput(f"{name}={value}: expected {expected}")


@dataclass
class DynamicsResult:
    """What ``analyse_run`` finds on one run. ``report`` is JSON-serialisable (one run's entry in
    ``dynamics.json``: per-step norms, Lyapunov estimates, spectra, fixed points, K-pass
    convergence); ``states`` [steps, d_model] holds the rollout's carried states (float32, CPU),
    which the figures project and the JSON leaves out."""

    report: dict
    states: torch.Tensor


def analyse_run(
    run_dir: str | Path,
    *,
    prompt: str | None = None,
    horizon: int = DEFAULTS["horizon"],
    perturb_at: int = DEFAULTS["perturb_at"],
    n_spectra: int = DEFAULTS["n_spectra"],
    n_fixed: int = DEFAULTS["n_fixed"],
    n_starts: int = DEFAULTS["n_starts"],
    max_passes: int = DEFAULTS["max_passes"],
    fp_steps: int = DEFAULTS["fp_steps"],
    tangents: int = DEFAULTS["tangents"],
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: Callable[[str, int, int], None] | None = None,
) -> DynamicsResult:
    """Every feedback-map analysis of the FBT run in ``run_dir`` (see ``dynamics_study``), rolled
    out from ``prompt``: by default the prompt of the first held-out problem of the run's own task
    (``Run.task``); a prompt of another task is analysed, and the report's ``input`` says so.
    ``progress(phase, done, total)`` is told of each piece of each phase as it is done: the
    rollout's steps, the spectra, the fixed-point searches, the K-pass convergence. The phases
    differ in cost per piece by orders of magnitude (a spectrum is a Jacobian, a fixed-point search
    many), so each is its own count: in one count over all of them the rollout's many cheap steps
    would bring a bar almost to its end before the costly pieces start."""
    name = Path(run_dir).name

    def tick(phase: str, done: int, total: int) -> None:
        if progress is not None:
            progress(f"{name}: {phase}", done, total)

    check_params(
        horizon=horizon,
        perturb_at=perturb_at,
        n_spectra=n_spectra,
        n_fixed=n_fixed,
        n_starts=n_starts,
        max_passes=max_passes,
        fp_steps=fp_steps,
        tangents=tangents,
    )
    from workbench.runtime.decoding import check_passes

    run = Run.open(run_dir)
    model = feedback_model(run.model(device=device))
    check_passes(model, max_passes, "max_passes")  # before any work: K passes cost K forwards
    tok = run.tokenizer
    given = prompt is not None
    if not given and run.task.spec is None:
        raise BadInput(f"{run_dir} records no task (a model saved or imported without training data): give a prompt (--prompt)")
    prompt = prompt if given else run.task.prompt(tokenizer=tok)
    source = run.task.input_record(prompt=prompt if given else None, run=name)
    ids = tok.encode(prompt)
    if model.embed.W_E.dtype != torch.float64:
        # fp64 absorbs what overflows in the checkpoint's own precision (a 1e30 weight squares to
        # 1e60): without this check the analyses would describe a model that does not exist
        try:
            rollout(model, ids, min(horizon, 8))  # the prompt's prefill and a few soft steps, guarded
        except RolloutDiverged as err:
            raise RolloutDiverged(
                f"in the checkpoint's own dtype ({str(model.embed.W_E.dtype).removeprefix('torch.')}): {err}"
            ) from err
    model = model.double()
    roll = rollout(
        model,
        ids,
        horizon,
        perturb_at=perturb_at,
        seed=seed,
        tangents=min(tangents, model.cfg.d_model),
        on_step=lambda step: tick("rollout steps", step + 1, horizon),
    )
    ratios, growth, full = roll.perturbation_ratio, roll.tangent_log_growth, roll.tangent_full_log_growth
    assert ratios is not None and growth is not None and full is not None  # perturb_at and tangents are set
    lyap = lyapunov_from_growth(ratios)
    mean = lambda g: g.cumsum(0) / torch.arange(1, len(g) + 1, dtype=torch.float64)[:, None]  # [T, k]
    tangent, tangent_full = mean(growth), mean(full)
    horizons = [T for T in (1, 10, 100, 1000, 10_000) if T <= len(lyap)]
    # spectra (and fixed points) at steps whose context fits the window without sliding
    reach = min(len(roll.tokens), model.cfg.n_ctx - len(ids) - 1)
    steps = sorted({int(round(x)) for x in torch.linspace(1, max(1, reach - 1), n_spectra).tolist()})
    spectra, fixed = [], []
    gen = torch.Generator().manual_seed(seed)

    def map_at(t: int):  # the feedback map at step t and the state it maps from
        cache, h_prev = prefill_context(model, ids + roll.tokens[:t], plain=len(ids))
        return feedback_map(model, cache, roll.tokens[t]), h_prev

    # all spectra, then all fixed-point searches: each phase in one stretch, so its bar closes once
    for i, t in enumerate(steps):
        F, h_prev = map_at(t)
        J = jacobian_summary(F, h_prev)
        tick("spectra", i + 1, len(steps))
        spectra.append(
            {
                "step": t,
                "spectral_radius": J["spectral_radius"],
                "spectral_norm": J["spectral_norm"],
                "frobenius": J["frobenius"],
                "eigenvalues": [[z.real, z.imag] for z in J["eigenvalues"].tolist()],
            }
        )
    for i, t in enumerate(steps[:n_fixed]):
        F, h_prev = map_at(t)  # rebuilt rather than kept: n_fixed caches would hold the context n_fixed times
        scale = float(h_prev.norm()) / math.sqrt(h_prev.numel())
        starts = torch.cat(
            [
                h_prev[None],
                torch.zeros_like(h_prev)[None],
                h_prev + 0.3 * scale * torch.randn(n_starts - 2, h_prev.numel(), generator=gen, dtype=h_prev.dtype),
            ]
        )
        kinds = ["previous", "zeros"] + ["near-rollout"] * (n_starts - 2)
        points, report = find_fixed_points(F, starts, start_kinds=kinds, max_iter=fp_steps)
        tick("fixed-point searches", i + 1, min(n_fixed, len(steps)))
        fixed.append(
            {
                "step": t,
                **report,
                "points": [
                    {
                        "residual": p.residual,
                        "spectral_radius": p.spectral_radius,
                        "stable": p.stable,
                        "label": p.label,
                        "n_starts": p.n_starts,
                        "start_kinds": sorted(set(p.start_kinds)),
                        "distance_to_rollout_state": float((p.state - h_prev).norm()),
                        "state": p.state.tolist(),
                    }
                    for p in points
                ],
                "path_independent": len(points) == 1 and points[0].n_starts == n_starts,
            }
        )
    tick("K-pass convergence", 0, 1)
    conv = kpass_convergence(model, (ids + roll.tokens)[: min(len(ids) + 32, model.cfg.n_ctx)], max_passes)
    tick("K-pass convergence", 1, 1)
    report = {
        "run": str(run_dir),
        "prompt": prompt,
        "input": source,
        "horizon": len(roll.tokens),
        "stopped": roll.stopped,
        "slid_at": roll.slid_at,
        "generated": tok.decode(roll.tokens[:200]),
        "per_step": {
            "state_norm": roll.state_norm.tolist(),
            "input_norm": roll.input_norm.tolist(),
            "gate_mean": roll.gate_mean.tolist(),
            "gate_entropy": roll.gate_entropy.tolist(),
            "logit_entropy": roll.logit_entropy.tolist(),
            "standard_distance": roll.standard_distance.tolist(),
            "perturbation_ratio": ratios.tolist(),
            "tangent_log_growth": growth[:, 0].tolist(),  # the leading direction's log-growth per step
            "tangent_full_log_growth": full[:, 0].tolist(),  # the same through the whole step
        },
        "perturb_at": perturb_at,
        "lyapunov": {str(T): float(lyap[T - 1]) for T in horizons},  # finite perturbation (nonlinear; has a floor)
        # k leading exponents from tangent vectors (no floor): through the feedback maps F_t (the
        # context frozen), and through the whole decoding step (the tangent also in the cache)
        "lyapunov_tangent": {str(T): tangent[T - 1].tolist() for T in horizons},
        "lyapunov_tangent_full": {str(T): tangent_full[T - 1].tolist() for T in horizons},
        "spectra": spectra,
        "fixed_points": fixed,
        "kpass": conv,
    }
    return DynamicsResult(report, roll.states.cpu())


FIGURES = ("rollout.png", "spectra.png", "fixed_points.png", "kpass.png")
STATES = "states.safetensors"  # each run's rollout states [steps, d_model] (the app draws them)
FIXED_POINT_MARKERS = {"stable": ("*", "red"), "marginal": ("D", "orange"), "saddle": ("x", "black"), "unstable": ("+", "black")}


def dynamics_study(
    runs: list[str],
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    names: list[str] | None = None,
    **kwargs,
) -> dict:
    """Analyse ``runs`` side by side into ``out_dir`` (``dynamics.json``, figures and the rollout
    states in ``states.safetensors``, by run name): a new or
    empty directory, or a previous dynamics study there, replaced only with ``overwrite``.
    ``progress`` as in ``analyse_run``, run by run.
    ``names``: what the results call each run (default its directory name), one per run, all
    different (``checkpoint.run_labels``)."""
    names = run_labels(runs, names)
    check_params(**kwargs)
    out_dir = Path(out_dir)
    with output(out_dir, "dynamics", overwrite=overwrite) as out:
        found = {}
        for r, name in zip(runs, names):
            try:
                found[name] = analyse_run(r, progress=progress, **kwargs)
            except RolloutDiverged as err:  # several runs side by side: say which one diverged
                raise RolloutDiverged(f"{r}: {err}") from err
            except NonFinite as err:
                raise NonFinite.wrap(err, str(r)) from err
        results = {name: f.report for name, f in found.items()}
        states = {name: f.states for name, f in found.items()}
        plotted = plot_dynamics(results, states, out.staging)
        figures = [str(out_dir / Path(f).name) for f in plotted]
        report = {"runs": results, "figures": figures, "states": STATES, "commit": source_commit()}
        save_file({name: s.contiguous() for name, s in states.items()}, str(out.staging / STATES))
        write_json(out.staging / "dynamics.json", report)
        out.publish()
    return report


# What readers of a saved study use of each run's report (``analyse_run``): checked by ``read_study``.
RUN_REPORT = {
    "prompt": str,
    "input?": {"run_task": (str, None), "input_task": (str, None), "warning?": str},
    "stopped": (str, None),
    "perturb_at": int,
    "per_step": {"state_norm": [float], "input_norm": [float], "perturbation_ratio": [float]},
    "lyapunov": Each(float),
    "lyapunov_tangent?": Each([float]),
    "lyapunov_tangent_full?": Each([float]),
    "spectra": [{"step": int, "spectral_radius": float, "spectral_norm": float, "frobenius": float, "eigenvalues": [[float]]}],
    "fixed_points": [
        {
            "step": int,
            "path_independent": bool,
            "n_starts?": int,
            "unconverged?": {"n?": int, "still_improving?": int},
            "points": [{"stable": bool, "label?": str, "spectral_radius": float, "state": [float]}],
        }
    ],
    "kpass": {"rows": [{"passes": int, "relative_residual?": float, "kl_to_previous?": float}]},
}


def read_study(out_dir: str | Path, names: list[str]) -> dict[str, tuple[dict, torch.Tensor]]:
    """The saved study in ``out_dir`` for the runs named ``names`` (their directory names): each
    run's report and its rollout states [steps, d_model]. ``BadInput`` naming the file and the field
    where the files are not what ``dynamics_study`` writes (edited, cut short, or of other runs)."""
    path = Path(out_dir) / "dynamics.json"
    report = read_json(path)
    check_shape(report, {"runs": {name: RUN_REPORT for name in names}, "states?": str}, path)
    file = report.get("states", STATES)
    if Path(file).name != file:
        raise BadInput(f"{path}: field 'states' must name a file beside it, got {file!r}")
    try:
        states = load_file(str(Path(out_dir) / file))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for a damaged file
        raise BadInput(f"{Path(out_dir) / file}: not the study's rollout states ({type(err).__name__}: {err})") from None
    found = {}
    for name in names:
        run = report["runs"][name]
        steps = len(run["per_step"]["state_norm"])
        tensor = states.get(name)
        if tensor is None or tensor.dim() != 2 or tensor.shape[0] != steps or not tensor.is_floating_point():
            shape = None if tensor is None else list(tensor.shape)
            raise BadInput(f"{Path(out_dir) / file}: {name!r} must be the {steps} rollout states [steps, d_model], got {shape}")
        for fp in run["fixed_points"]:
            if any(len(p["state"]) != tensor.shape[1] for p in fp["points"]):
                raise BadInput(f"{path}: a fixed point of {name!r} at step {fp['step']} is not of d_model={tensor.shape[1]}")
        found[name] = (run, tensor)
    return found


def state_pca(states: torch.Tensor, fixed_points: list[dict]) -> tuple[torch.Tensor, list[dict]]:
    """The rollout's states [steps, d_model] projected on their first two principal components,
    and every fixed point found (``analyse_run``'s ``report['fixed_points']``) in the same coordinates."""
    X = states.double()
    mean = X.mean(0)
    _, _, V = torch.pca_lowrank(X - mean, q=2, center=False)
    points = []
    for fp in fixed_points:
        for p in fp["points"]:
            q = (torch.tensor(p["state"], dtype=torch.float64) - mean) @ V
            points.append(
                {
                    "step": fp["step"],
                    "pc1": float(q[0]),
                    "pc2": float(q[1]),
                    "stable": p["stable"],
                    "label": p.get("label", "stable" if p["stable"] else "unstable"),  # studies before labels
                    "spectral_radius": p["spectral_radius"],
                }
            )
    return (X - mean) @ V, points


def plot_dynamics(results: dict, states: dict, out_dir: Path) -> list[str]:
    return [_save(fig, out_dir / name) for name, fig in dynamics_figures(results, states).items()]


def dynamics_figures(results: dict, states: dict) -> dict:
    """``FIGURES`` by file name, as matplotlib ``Figure`` objects (``plot_dynamics`` saves them)."""
    from matplotlib.figure import Figure  # no pyplot: the global backend (e.g. a notebook's inline one) stays as it is
    from matplotlib.ticker import MaxNLocator

    figures = {}
    fig = Figure(figsize=(14, 3.8))
    axes = fig.subplots(1, 3)
    for name, r in results.items():
        axes[0].plot(r["per_step"]["state_norm"], label=f"{name} ||h||")
        axes[0].plot(r["per_step"]["input_norm"], ls=":", label=f"{name} ||u||")
        steps = range(r["perturb_at"], r["perturb_at"] + len(r["per_step"]["perturbation_ratio"]))
        line = axes[1].semilogy(steps, r["per_step"]["perturbation_ratio"], label=f"{name} perturbation")[0]
        for key, ls, what in (("tangent_log_growth", ":", "F_t tangent"), ("tangent_full_log_growth", "--", "full tangent")):
            if key in r["per_step"]:  # the linearised growth: exp of the summed log-growth
                tangent = torch.tensor(r["per_step"][key]).cumsum(0).exp()
                axes[1].semilogy(steps[: len(tangent)], tangent, ls=ls, color=line.get_color(), label=f"{name} {what}")
        axes[2].plot(r["per_step"]["standard_distance"], label=name)
    axes[0].set(xlabel="step", title="norms (dotted: fused input)")
    axes[1].set(xlabel="step", title="growth ||dh_t|| / ||dh_t0|| (dotted: F_t tangent; dashed: full)")
    axes[1].axhline(1.0, color="grey", ls="--")
    axes[2].set(xlabel="step", title="||h_t(soft) - h_t(standard)||")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    figures["rollout.png"] = fig

    # the per-run figures below put the run's name on a line of its own in each title: side by side,
    # one-line titles of long names ran into each other
    fig = Figure(figsize=(4.2 * len(results), 4.4))
    axes = fig.subplots(1, len(results), squeeze=False)
    theta = torch.linspace(0, 2 * math.pi, 200)
    for ax, (name, r) in zip(axes[0], results.items()):
        ax.plot(theta.cos(), theta.sin(), color="grey", lw=0.8)
        reach = 1.05
        for s in r["spectra"]:
            z = torch.tensor(s["eigenvalues"])
            ax.scatter(z[:, 0], z[:, 1], s=6, label=f"step {s['step']}")
            reach = max(reach, 1.05 * float(z.norm(dim=1).max()))
        # equal aspect keeps the unit circle round; one symmetric range on both axes keeps every
        # run's panel square and centred on the origin, however the eigenvalues spread
        ax.set(xlim=(-reach, reach), ylim=(-reach, reach), title=f"{name}\neigenvalues of dF/dh", xlabel="Re", ylabel="Im")
        ax.set_aspect("equal", adjustable="box")
        ax.legend(fontsize=6)
    fig.tight_layout()
    figures["spectra.png"] = fig

    fig = Figure(figsize=(5.2 * len(results), 4.4))
    axes = fig.subplots(1, len(results), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        P, points = state_pca(states[name], r["fixed_points"])
        trajectory = ax.scatter(P[:, 0], P[:, 1], s=3, c=range(len(P)), cmap="viridis")
        fig.colorbar(trajectory, ax=ax, label="rollout step")
        for p in points:
            marker, color = FIXED_POINT_MARKERS[p["label"]]
            ax.scatter(p["pc1"], p["pc2"], marker=marker, s=120, color=color)
        ax.set(
            title=f"{name}\nrollout states (PCA) and fixed points",
            xlabel="principal component 1 of the states",
            ylabel="principal component 2 of the states",
        )
        for label, (marker, color) in FIXED_POINT_MARKERS.items():
            ax.scatter([], [], marker=marker, color=color, label=label)
        ax.legend(fontsize=7, title="fixed points", title_fontsize=7)
    fig.tight_layout()
    figures["fixed_points.png"] = fig

    fig = Figure(figsize=(4.2 * len(results), 3.5))
    axes = fig.subplots(1, len(results), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items()):
        grid = torch.tensor([row["error_to_exact"] for row in r["kpass"]["rows"]]).clamp(min=1e-16).log10()
        im = ax.imshow(grid, aspect="auto", origin="lower", extent=(-0.5, grid.shape[1] - 0.5, 0.5, grid.shape[0] + 0.5))
        ax.set(title=f"{name}\nlog10 ||H^k_t - H*_t||", xlabel="position", ylabel="passes k")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # pass counts
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    figures["kpass.png"] = fig
    return figures


def _save(fig, path: Path) -> str:
    fig.savefig(path, dpi=110)
    return str(path)
