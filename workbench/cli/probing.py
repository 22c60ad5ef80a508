"""The verbs that read a model's activations: ``cache`` (an activation store), ``sae`` and ``probe``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workbench.cli.common import (
    FRACTION_BAR,
    compute_arguments,
    dtype_argument,
    parse_count,
    parse_passes,
    parse_seed,
    renamed,
    tokenizer_for,
    torch_dtype,
)
from workbench.names import PREFILLS, SAE_ARCHITECTURES
from workbench.storage.errors import BadInput

PROBE_SEQUENCES = 400  # probing.study.N_SEQUENCES (a test keeps them equal), spelled here to keep torch out


def register(sub) -> None:
    """Add this group's verbs, in the order --help lists them."""
    for add in (_add_cache, _add_sae, _add_probe):
        add(sub)


def cmd_cache(args) -> dict:
    import time

    from workbench.data.splits import heldout_task
    from workbench.probing.store import cache_activations
    from workbench.runtime.checkpoint import resolve_model
    from workbench.training.run import run_task

    own = run_task(args.run)  # none recorded for ARCH:PRESET
    task = args.task or own.spec
    if task is None:
        raise BadInput(f"{args.run} records no task: give --task")
    source = own.input_record(task, run=args.run)
    model = resolve_model(args.run, device=args.device, dtype=torch_dtype(args))
    tokenizer = tokenizer_for(args.run)
    data = own.settings if task == own.spec else None
    examples = heldout_task(task, args.n, args.seed, data, tokenizer)[: args.n]
    started = time.perf_counter()
    out = cache_activations(
        model,
        examples,
        args.hooks,
        args.out,
        prefill=args.prefill,
        passes=args.passes,
        tokenizer=tokenizer,
        overwrite=args.overwrite,
        on_estimate=lambda e: print(f"storing about {e['rows']:,} rows, {e['bytes'] / 2**30:.2f} GiB, in {args.out}", flush=True),
    )
    meta = json.loads((out / "store.json").read_text())
    from workbench.runtime.process import peak_rss_mib

    meta["peak_rss_mib"] = peak_rss_mib()
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["input"] = source
    print(
        f"stored {meta['n_rows']} rows ({len(meta['hooks'])} hooks, labels {meta['labels']}) in {out} "
        f"in {meta['seconds']}s; peak resident memory {meta['peak_rss_mib']} MiB"
    )
    return meta


def _add_cache(sub) -> None:
    """``workbench cache``'s arguments."""
    p = sub.add_parser("cache", help="store hook activations with per-position labels as an Arrow dataset")
    p.add_argument("run", help="run directory, or ARCH:PRESET[:SEED] for a fresh model")
    p.add_argument("--hooks", nargs="+", required=True, help="hook names or glob patterns, e.g. 'blocks.*.hook_resid_post'")
    p.add_argument("--task", default=None, help="a task spec (default: the run's own task)")
    p.add_argument("--n", type=int, default=1000, help="held-out sequences to store")
    renamed(p, "--n-sequences", "--n", "n", int)
    p.add_argument("--prefill", choices=PREFILLS, default="standard")
    p.add_argument(
        "--passes", type=parse_passes, default=1, help="K of a recurrent K-pass prefill: an integer or 'exact' (one row per pass)"
    )
    p.add_argument("--seed", type=parse_seed, default=0, help="seed of the task's held-out stream (never a run's training data)")
    p.add_argument("--out", required=True)
    p.add_argument("--json", dest="json_out", help="also write the store's metadata here")
    p.add_argument("--overwrite", action="store_true", help="replace a previous store there (never anything else)")
    compute_arguments(p)
    dtype_argument(p)
    p.set_defaults(func=cmd_cache)


def cmd_sae(args) -> dict:
    from workbench.probing.sae_study import sae_study
    from workbench.runtime.progress import Bar

    with Bar(f"sae {args.hook}", 1000, show=not args.no_progress, bar_format=FRACTION_BAR) as bar:
        report = sae_study(
            args.run,
            args.hook,
            prefill=args.prefill,
            passes=args.passes,
            stream=args.stream,
            n_sequences=args.n,
            seed=args.seed,
            expansion=args.expansion,
            k=args.k,
            architecture=args.architecture,
            steps=args.steps,
            lr=args.lr,
            out=args.out,
            overwrite=args.overwrite,
            device=args.device,
            saelens_activations=args.saelens_activations,
            context_size=args.context_size,
            progress=lambda fraction, what: bar.update(round(1000 * fraction), what),
        )
    test, settings = report["test"], report["settings"]
    print(
        f"{report['hook']} ({report['prefill']}, K={report['passes']}): {settings['architecture']}, "
        f"{settings['d_sae']} latents, k={settings['k']}, "
        f"{report['rows']['train']:,} training rows; on {test['rows']:,} held-out rows: variance explained "
        f"{test['explained']:.3f}, MSE {test['mse']:.4g}, L0 {test['l0']:.1f}, dead {test['dead']} "
        f"({test['dead_fraction']:.1%}); {report['seconds']}s"
    )
    return report


def _add_sae(sub) -> None:
    """``workbench sae``'s arguments."""
    p = sub.add_parser("sae", help="a sparse autoencoder (TopK or BatchTopK) on one hook's activations, saved for SAELens")
    p.add_argument("run")
    p.add_argument("--hook", required=True, help="one hook name or pattern, e.g. fusion.hook_state, blocks.0.hook_resid_pre")
    p.add_argument("--prefill", choices=PREFILLS, default="standard")
    p.add_argument(
        "--passes", type=parse_passes, default=1, help="K of a recurrent K-pass prefill (its last pass's rows) or 'exact'"
    )
    p.add_argument("--stream", type=int, default=None, help="an HD run's stream (default: every stream's rows)")
    p.add_argument("--n", type=int, default=512, help="held-out sequences stored (a tenth held out for the report)")
    p.add_argument("--seed", type=parse_seed, default=0)
    p.add_argument("--expansion", type=int, default=4, help="latents = expansion x d_model (default 4)")
    p.add_argument("--k", type=int, default=None, help="active latents a row (default d_model / 8, within 4..32)")
    p.add_argument(
        "--architecture",
        choices=SAE_ARCHITECTURES,
        default="topk",
        help="topk: k latents every row; batchtopk: k on average over a training batch, then a threshold (saved as jumprelu)",
    )
    p.add_argument("--steps", type=int, default=2000, help="training steps of 1,024 rows (default 2000)")
    p.add_argument("--lr", type=float, default=None, help="Adam's learning rate (default 2e-4 / sqrt(latents / 2^14))")
    p.add_argument("--out", default=None, help="default RUN/results/sae/HOOK-PREFILL[-K]")
    p.add_argument("--overwrite", action="store_true", help="replace a previous SAE there (never anything else)")
    p.add_argument(
        "--saelens-activations",
        action="store_true",
        help="also write the training rows in SAELens's cached-activations layout (OUT/activations)",
    )
    p.add_argument("--context-size", type=parse_count, default=32, help="rows per sequence of that export (default 32)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", dest="json_out", help="also write the report here")
    compute_arguments(p)
    p.set_defaults(func=cmd_sae)


def cmd_probe(args) -> dict:
    from workbench.probing.probes import RANKS
    from workbench.probing.study import probe_study
    from workbench.runtime.progress import Bar

    out, report_name = args.out, None
    if out is not None and out.endswith(".json"):  # the old spelling: --out named the report file
        out, report_name = str(Path(out).parent), Path(out).name
        print(f"workbench: --out FILE.json is deprecated and will be removed: use --out {out} (a directory)", file=sys.stderr)
    # the bar opens with its first update, once the inputs are checked
    with Bar(f"probe {args.target or ''}".strip(), 1000, show=not args.no_progress, bar_format=FRACTION_BAR) as bar:
        report = probe_study(
            args.run,
            args.target,
            hooks=args.hooks,
            passes=[k for k in args.passes if k != "exact"],
            exact="exact" in args.passes or not args.no_exact,
            n_sequences=args.n,
            seed=args.seed,
            out=out,
            report_name=report_name,
            device=args.device,
            overwrite=args.overwrite,
            mdl=not args.no_mdl,
            mdl_hooks=args.mdl_hooks,
            ranks=RANKS if args.ranks is None else args.ranks,
            progress=lambda fraction, what: bar.update(round(1000 * fraction), what),
        )
    for row in report["rows"]:
        mdl = (
            f"  MDL {row['mdl_bits'] / 1000:.2f} kbit, compression {row['compression']:.2f} (control {row['control_compression']:.2f})"
            if row.get("mdl_bits") is not None
            else ""
        )
        low = row["rank_sweep"][0] if row.get("rank_sweep") else None
        rank = f"  rank {low['rank']}: acc {low['accuracy']:.3f} control {low['control_accuracy']:.3f}" if low is not None else ""
        print(
            f"{row['hook']:28s} {row['prefill']:9s} K={str(row['passes']):5s} stream {row['stream']}  "
            f"acc {row['accuracy']:.3f}  control {row['control_accuracy']:.3f}  chance {row['chance']:.3f}{mdl}{rank}"
        )
    print(f"figure: {report['figure']}")
    return report


def _add_probe(sub) -> None:
    """``workbench probe``'s arguments."""
    p = sub.add_parser("probe", help="layer-0 study: linear probes by hook x prefill regime")
    p.add_argument("run")
    p.add_argument(
        "--target",
        default=None,
        help="label to probe: memory (flipflop), perm_state (perm), carry (addition), running_sum (modsum), value (chain); "
        "default: the run's own task's",
    )
    p.add_argument("--hooks", nargs="+", default=None, help="default: blocks.0.hook_resid_pre and every hook_resid_post")
    p.add_argument(
        "--passes",
        type=_pass_list,
        default=[2, 3],
        help="the K of each recurrent K-pass prefill swept: integers or 'exact', comma-separated (exact is swept "
        "unless --no-exact)",
    )
    p.add_argument("--no-exact", action="store_true", help="skip the exact-recurrence prefill")
    p.add_argument("--n", type=int, default=PROBE_SEQUENCES, help="held-out sequences to store and probe")
    renamed(p, "--n-sequences", "--n", "n", int)
    p.add_argument("--seed", type=parse_seed, default=0)
    p.add_argument("--no-mdl", action="store_true", help="skip the online-code description lengths (the slowest measure)")
    p.add_argument(
        "--mdl-hooks",
        nargs="+",
        default=None,
        help="description lengths at these hooks only (names or patterns; default: every hook)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--ranks",
        type=_rank_list,
        default=None,
        help="ranks of the capacity-limited probes, e.g. 1,2,4 (default 1,2,4,8,16); 'none' skips them",
    )
    p.add_argument(
        "--out", default=None, help="directory for probe_TARGET.json, its figure and probes/TARGET/ (default: RUN/results)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a previous probe sweep (report, figure and probe weights) there (never anything else)",
    )
    p.add_argument("--json", dest="json_out", help="also write the report here")
    compute_arguments(p)
    p.set_defaults(func=cmd_probe)


def _positive_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
    return values


def _rank_list(text: str) -> list[int]:
    return [] if text.strip().lower() == "none" else _positive_list(text, "ranks >= 1 or 'none'")


def _pass_list(text: str) -> list[int | str]:
    """Several K, each as ``--passes`` takes one (a positive integer or 'exact')."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    counts = [int(v) for v in values if v.isdigit() and int(v) >= 1]
    exact = ["exact"] if "exact" in values else []
    if not values or len(counts) + values.count("exact") != len(values):
        raise argparse.ArgumentTypeError(f"expected comma-separated pass counts >= 1 or 'exact', got {text!r}")
    return [*counts, *exact]
