"""The verbs that compare runs side by side: ``dynamics`` (the FBT feedback map) and ``traces``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from workbench.cli.common import (
    FRACTION_BAR,
    check_text,
    compute_arguments,
    engine_argument,
    parse_passes,
    parse_seed,
    renamed,
)
from workbench.dynamics.defaults import DEFAULTS as DYNAMICS


def register(sub) -> None:
    """Add this group's verbs, in the order --help lists them."""
    for add in (_add_dynamics, _add_traces):
        add(sub)


def cmd_dynamics(args) -> dict:
    from workbench.dynamics.study import dynamics_study

    default_out(args, "dynamics")
    if args.prompt is not None:
        check_text(args.prompt, "--prompt")
    settings = dict(
        horizon=args.horizon,
        perturb_at=args.perturb_at,
        n_spectra=args.spectra,
        n_fixed=args.fixed_points,
        n_starts=args.starts,
        max_passes=args.max_passes,
        fp_steps=args.fp_steps,
        tangents=args.tangents,
        **({} if args.prompt is None else {"prompt": args.prompt}),
    )
    from workbench.runtime.progress import PhaseBars

    # a bar per run and phase (rollout steps, spectra, fixed-point searches, K-pass), each opening
    # with its first update, once the inputs are checked
    with PhaseBars("dynamics", show=not args.no_progress, unit="it") as bars:
        report = dynamics_study(
            args.runs,
            args.out,
            overwrite=args.overwrite,
            progress=bars,
            device=args.device,
            names=args.names,
            **settings,
        )
    for name, r in report["runs"].items():
        lyap = " ".join(f"T={t}: {v:+.3f}" for t, v in r["lyapunov"].items())
        tangent = " ".join(f"T={t}: {v[0]:+.3f}" for t, v in r["lyapunov_tangent"].items())
        full = " ".join(f"T={t}: {v[0]:+.3f}" for t, v in r["lyapunov_tangent_full"].items())
        rho = " ".join(f"{s['spectral_radius']:.2f}" for s in r["spectra"])
        fps = [(len(f["points"]), sum(p["stable"] for p in f["points"])) for f in r["fixed_points"]]
        source = r["input"]["input_task"] + ("" if "warning" in r["input"] else ", the run's task")
        print(
            f"{name} ({source}): {r['horizon']} steps{' (' + r['stopped'] + ')' if r['stopped'] else ''}; "
            f"final ||h|| {r['per_step']['state_norm'][-1]:.2f}; Lyapunov (perturbation) {lyap}; "
            f"leading Lyapunov exponent (tangent through F_t) {tangent}; (tangent through the whole step) {full}; "
            f"spectral radius along rollout {rho}; "
            f"fixed points (found, stable) {fps}"
        )
    print(f"figures: {', '.join(report['figures'])}")
    print(f"wrote {Path(args.out) / 'dynamics.json'}")
    return {"out": args.out}


def _add_dynamics(sub) -> None:
    """``workbench dynamics``'s arguments."""
    p = sub.add_parser("dynamics", help="feedback-map stability: rollouts, Lyapunov, spectra, fixed points, K-pass convergence")
    p.add_argument("runs", nargs="+", help="FBT run directories, analysed side by side")
    # the defaults are the app's and analyse_run's too (workbench.dynamics.defaults)
    p.add_argument("--horizon", type=int, default=DYNAMICS["horizon"], help="rollout steps")
    p.add_argument("--perturb-at", type=int, default=DYNAMICS["perturb_at"], help="step at which the carried state is perturbed")
    p.add_argument("--spectra", type=int, default=DYNAMICS["n_spectra"], help="rollout steps at which dF/dh is analysed")
    p.add_argument("--fixed-points", type=int, default=DYNAMICS["n_fixed"], help="rollout steps at which fixed points are sought")
    p.add_argument("--starts", type=int, default=DYNAMICS["n_starts"], help="fixed-point starts per step")
    p.add_argument("--max-passes", type=int, default=DYNAMICS["max_passes"], help="K-pass convergence up to this many passes")
    p.add_argument(
        "--fp-steps", type=int, default=DYNAMICS["fp_steps"], help="fixed-point finder: damped Newton iterations per start"
    )
    p.add_argument(
        "--tangents", type=int, default=DYNAMICS["tangents"], help="leading Lyapunov exponents from tangent vectors (1..64)"
    )
    p.add_argument(
        "--prompt",
        default=None,
        help="the text the rollout continues (default: the first held-out problem of each run's own task)",
    )
    p.add_argument(
        "--names", nargs="+", default=None, help="what the results call each run, one per run (default: their directory names)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="output directory (JSON, figures and the rollout states; default: the first run's results/dynamics, "
        "results/dynamics-with-OTHERS for several)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a previous dynamics study there (never anything else)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", dest="json_out", help="also write a pointer JSON here")
    compute_arguments(p)
    p.set_defaults(func=cmd_dynamics)


def cmd_traces(args) -> dict:
    from workbench.runtime.progress import Bar
    from workbench.studies.traces import trace_study

    default_out(args, "traces")
    # the bar opens with its first update, once the inputs are checked
    with Bar("traces", 1000, show=not args.no_progress, bar_format=FRACTION_BAR) as bar:
        summary = trace_study(
            args.runs,
            args.out,
            names=args.names,
            task=args.task,
            regimes=args.regimes.split(","),
            passes=args.passes,
            n_problems=args.n,
            difficulties=args.difficulty,
            seed=args.seed,
            max_new_tokens=args.max_new_tokens,
            overwrite=args.overwrite,
            engine=args.engine,
            chat=args.chat,
            reference=args.reference,
            device=args.device,
            progress=lambda fraction, what: bar.update(round(1000 * fraction), what),
        )
    print(f"task: {summary['task']} ({summary['n_problems']} problems, difficulties {summary['difficulties']})")
    for key, g in summary["groups"].items():
        print(
            f"{key:24s} mean trace {g['mean_trace']:6.1f}  median {g['median_trace']:6.1f}  accuracy {g['accuracy']:.3f}  "
            f"unfinished {g['unfinished']:.3f}  ({summary['timing'][key]['problems_per_s']} problems/s)"
        )
    for key, p in summary["paired"].items():
        t, a = p["trace_tokens"], p["accuracy"]
        print(
            f"{key}: length {t['mean']:+.1f} [{t['ci_low']:+.1f}, {t['ci_high']:+.1f}]  "
            f"accuracy {a['mean']:+.3f} [{a['ci_low']:+.3f}, {a['ci_high']:+.3f}]"
        )
    for name, skipped in summary["skipped"].items():
        if skipped["n"]:
            print(
                f"{name}: skipped {skipped['n']} of {summary['n_problems']} problems ({skipped['rule']}): {skipped['problem_ids']}"
            )
    for name, lost in summary["lost_characters"].items():
        if lost:
            print(f"{name}: its tokenizer cannot represent {lost} prompt characters (per problem: lost_characters in traces.csv)")
    print(f"wrote {Path(args.out) / 'summary.json'}, traces.csv, traces.png")
    return summary


def _add_traces(sub) -> None:
    """``workbench traces``'s arguments."""
    p = sub.add_parser("traces", help="trace lengths and accuracy per model and regime on the same problems")
    p.add_argument("runs", nargs="+", help="run directories; the first one's first regime is the paired reference")
    p.add_argument(
        "--task",
        default=None,
        help="chain | addition | gsm8k-jsonl:PATH | prepared:DIR (default: the first run's own task, held-out problems)",
    )
    p.add_argument(
        "--names", nargs="+", default=None, help="what the results call each run, one per run (default: their directory names)"
    )
    p.add_argument("--regimes", default="standard,soft,fused", help="FBT regimes (other models: standard)")
    p.add_argument(
        "--reference", default=None, help="MODEL/REGIME every other pair is compared with (default: the first run's first regime)"
    )
    p.add_argument("--passes", type=parse_passes, default=2, help="K of the fused regime's K-pass prefill: an integer or 'exact'")
    p.add_argument("--n", type=int, default=200, help="problems, the same for every model and regime")
    renamed(p, "--n-problems", "--n", "n", int)
    p.add_argument(
        "--difficulty",
        type=_difficulty_range,
        default=None,
        help="steps (chain) or digits (addition), e.g. 1..4 or 1,3 (default: the run's range; any for a file or corpus)",
    )
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument(
        "--chat",
        nargs="?",
        const=True,
        default=False,
        type=lambda text: [name for name in text.split(",") if name],
        metavar="NAMES",
        help="prompt through each run's chat template (instruct models); with NAMES (comma-separated run directory "
        "names), only those runs, the others in the completion format",
    )
    p.add_argument("--seed", type=parse_seed, default=0)
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default: the first run's results/traces, results/traces-with-OTHERS for several)",
    )
    engine_argument(p)
    p.add_argument("--overwrite", action="store_true", help="replace a previous trace study there (never anything else)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", dest="json_out", help="also write the summary here")
    compute_arguments(p)
    p.set_defaults(func=cmd_traces)


def default_out(args, verb: str) -> None:
    """``--out`` where none is given, by one rule for the verbs that analyse runs side by side: the
    first run's ``results/VERB`` (as ``probe`` writes into the run's ``results/``), and
    ``results/VERB-with-OTHERS`` when there are several (the others by their names)."""
    if args.out is not None:
        return
    others = (args.names or [Path(r).name for r in args.runs])[1:]
    name = verb + ("-with-" + "-".join(re.sub(r"[^A-Za-z0-9.]+", "-", n).strip("-") for n in others) if others else "")
    args.out = str(Path(args.runs[0]) / "results" / name)


def _difficulty_range(text: str) -> list[int]:
    from workbench.data.tasks import LIMITS

    top = LIMITS["chain_max_steps"]
    steps: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("..")
            lo, hi = int(lo), int(hi or lo)
            steps += range(lo, hi + 1) if 1 <= lo <= hi <= top else [0]
    except ValueError:
        steps = [0]
    if not steps or 0 in steps:
        raise argparse.ArgumentTypeError(f"expected steps like 1..4 or 1,3,5 within 1..{top}, got {text!r}")
    return sorted(set(steps))
