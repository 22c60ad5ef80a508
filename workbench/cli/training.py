"""The verbs that make runs: ``prepare`` (a tokenized corpus), ``train``, ``eval`` and ``zoo``."""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench.cli.common import (
    JOBS_MAX,
    THREADS_MAX,
    check_count,
    compute_arguments,
    parse_count,
    parse_passes,
    parse_seed,
)
from workbench.names import ALL_ORGANISMS, ARCHS, FAIR_STUDY, STUDIES, ZOO_PRESETS
from workbench.storage.errors import BadInput


def register(sub) -> None:
    """Add this group's verbs, in the order --help lists them."""
    for add in (_add_prepare, _add_train, _add_eval, _add_zoo):
        add(sub)


def cmd_prepare(args) -> dict:
    from workbench.data.prepared import prepare_corpus
    from workbench.runtime.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    bar = None

    def progress(done: int) -> None:  # the bar opens once the sources are checked
        nonlocal bar
        if bar is None and not args.no_progress:
            from tqdm.auto import tqdm

            bar = tqdm(desc=f"prepare {Path(args.out).name}", unit="doc", dynamic_ncols=True)
        if bar is not None:
            bar.update(done - bar.n)

    try:
        meta = prepare_corpus(
            args.source,
            tokenizer,
            args.out,
            tokenizer_source=str(Path(args.tokenizer).resolve()),
            heldout_fraction=args.heldout,
            seed=args.seed,
            shard_tokens=args.shard_tokens,
            overwrite=args.overwrite,
            progress=progress,
        )
    finally:
        if bar is not None:
            bar.close()
    from workbench.runtime.process import peak_rss_mib

    train, heldout = meta["splits"]["train"], meta["splits"]["heldout"]
    lost, peak = meta["lost_characters"], peak_rss_mib()
    print(
        f"prepared {args.out}: train {train['documents']:,} documents, {train['tokens']:,} tokens; "
        f"held out {heldout['documents']:,} documents, {heldout['tokens']:,} tokens ({meta['dtype']}); "
        f"{lost['total']} characters in {lost['documents']} documents the tokenizer cannot represent; "
        f"{meta['seconds']}s, peak resident memory {peak} MiB"
    )
    return {"out": str(args.out), **meta, "peak_rss_mib": peak}


def _add_prepare(sub) -> None:
    """``workbench prepare``'s arguments."""
    p = sub.add_parser("prepare", help="tokenize JSONL / text / a saved dataset into memory-mapped token shards")
    p.add_argument("source", nargs="+", help="JSONL (GSM8K question/answer, or text), plain text, or a save_to_disk dataset")
    p.add_argument(
        "--tokenizer", required=True, help="a run directory (or any directory with tokenizer.json) whose tokenizer to use"
    )
    p.add_argument(
        "--out", required=True, help="the corpus directory to write (new, empty, or a previous corpus with --overwrite)"
    )
    p.add_argument("--heldout", type=float, default=0.05, help="fraction of documents held out for eval (default 0.05)")
    p.add_argument("--seed", type=parse_seed, default=0, help="seed of the held-out rule")
    p.add_argument("--shard-tokens", type=int, default=1 << 26, help="tokens per shard (default 2^26)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous prepared corpus there (never anything else)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", dest="json_out", help="also write the metadata here")
    p.set_defaults(func=cmd_prepare)


def cmd_train(args) -> dict:
    from workbench.training.runconfig import (
        check_device_here,
        check_run_fits,
        load_run_config,
        make_run_config,
        with_execution_overrides,
    )
    from workbench.training.train import train

    if args.resume:
        cfg = with_execution_overrides(load_run_config(Path(args.out) / "config.json"), args.set or [])
        given = [
            flag
            for flag, value in (
                ("--init-from", args.init_from),
                ("--task", args.task),
                ("--preset", args.preset),
            )
            if value
        ]
        if given:
            raise BadInput(
                f"--resume continues the saved config of {args.out}; {', '.join(given)} cannot change it (leave them out)"
            )
        if args.arch is not None and args.arch != cfg.arch:
            raise BadInput(f"--resume: {args.out} holds an {cfg.arch!r} run, not --arch {args.arch!r}")
    else:
        cfg = make_run_config(args.arch or "baseline", args.preset, args.task, args.set, init_from=args.init_from)
    check_device_here(cfg)
    if args.resume:  # make_run_config checked a new run's; a resumed one's config may have been edited
        check_run_fits(cfg)
    summary = train(cfg, args.out, resume=args.resume, progress=not args.no_progress, stop_after=args.stop_after).summary
    print(f"trained {cfg.arch} to step {summary['steps']} in {summary['seconds']:.1f}s -> {args.out}")
    return summary


def _add_train(sub) -> None:
    """``workbench train``'s arguments."""
    p = sub.add_parser("train", help="train a baseline, FBT or HD model into a run directory")
    p.add_argument("--arch", choices=ARCHS, default=None, help="default baseline; with --resume, the run's")
    p.add_argument("--preset", default=None, help="model sizes (default debug; with --init-from: the source run's)")
    p.add_argument(
        "--task",
        default=None,
        help="chain | modsum | flipflop | perm | addition | mix | jsonl:PATH | text:PATH | hf:NAME | prepared:DIR",
    )
    p.add_argument("--out", required=True, help="run directory, e.g. runs/NAME")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="typed override, e.g. train.lr=3e-4, model.d_model=96, fbt.three_pass_fraction=0 (repeatable)",
    )
    p.add_argument(
        "--init-from", default=None, help="continue from this run's weights and tokenizer (e.g. FBT or HD from an imported model)"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--stop-after", type=parse_count, default=None, help="stop after N steps this session (resume later)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", dest="json_out", help="write the summary as JSON here")
    p.set_defaults(func=cmd_train)


def cmd_eval(args) -> dict:
    from workbench.runtime.progress import PhaseBars
    from workbench.training.evaluate import evaluate_run

    with PhaseBars("eval", show=not args.no_progress) as bars:  # a bar per task and phase, as each starts
        result = evaluate_run(
            args.run, n_examples=args.n, fused_passes=args.passes, task=args.task, device=args.device, progress=bars
        )
    for task, row in result["tasks"].items():
        acc = " ".join(f"{r}={v:.3f}" for r, v in row["accuracy"].items())
        loss = " ".join(f"{r}={v:.4f}" for r, v in row["loss"].items())
        print(f"{task:9s} loss {loss}  accuracy {acc}")
    print(f"wrote {result['path']}")
    return result


def _add_eval(sub) -> None:
    """``workbench eval``'s arguments."""
    p = sub.add_parser(
        "eval",
        help="validation loss and accuracy per task (and per regime) -> results/eval.json, or "
        "results/eval_<what differs>.json for another configuration",
    )
    p.add_argument("run")
    p.add_argument("--n", type=int, default=None, help="examples per task (default: the run's train.eval_examples)")
    p.add_argument("--passes", type=parse_passes, default=2, help="K of the fused regime's K-pass prefill: an integer or 'exact'")
    p.add_argument("--task", default=None, help="evaluate on another task than the run's")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (a bar per task and phase otherwise)")
    p.add_argument("--json", dest="json_out", help="also write the result here")
    compute_arguments(p)
    p.set_defaults(func=cmd_eval)


def study_out(study: str, preset: str) -> Path:
    """A study's default output: ``runs/organisms/TASK/studies/STUDY`` on an organism (where the
    claims table looks, ``workbench.experiments.claims.study_path``), else ``runs/studies/STUDY``."""
    if preset.startswith("org-"):
        return Path("runs") / "organisms" / preset.removeprefix("org-") / "studies" / study
    return Path("runs") / "studies" / study


def seeds_count(text: str) -> int | str:
    """``--seeds``: a count, or ``power`` (the fair study chooses its own)."""
    if text == "power":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected a whole number or 'power'") from None


def cmd_zoo(args) -> dict:
    power = args.seeds == "power"
    if power and args.study != FAIR_STUDY:
        raise BadInput(f"--seeds power: only --study {FAIR_STUDY} chooses its seeds by a power step")
    seeds = 0 if power else int(args.seeds)
    check_count(args.threads, "--threads", THREADS_MAX)
    check_count(args.jobs, "--jobs", JOBS_MAX)
    if args.study is None and args.reuse is not None:
        raise BadInput(f"--reuse {args.reuse} without --study: only a study copies a zoo's members")
    if args.study == FAIR_STUDY:
        from workbench.experiments.fbt_vs_baseline import run_comparison

        if args.only or args.reuse is not None:
            raise BadInput(f"--only/--reuse with --study {args.study}: it tunes and trains all of its members itself")
        out = Path(args.out) if args.out is not None else study_out(args.study, args.preset)
        summary = run_comparison(
            args.preset,
            out,
            seeds=None if power else seeds,
            threads=args.threads,
            jobs=args.jobs,
            progress=not args.no_progress,
        )
        for name, words in summary["readings"]["wording"].items():
            print(f"{name}: {words}")
        written = out / "study.json"
    elif args.study is not None:
        from workbench.experiments.comparisons import run_study

        if args.only:
            raise BadInput(f"--only {args.only[0]} with --study {args.study}: a study trains all of its members")
        out = Path(args.out) if args.out is not None else study_out(args.study, args.preset)
        summary = run_study(
            args.study,
            args.preset,
            out,
            seeds=seeds,
            threads=args.threads,
            jobs=args.jobs,
            reuse=args.reuse,
            progress=not args.no_progress,
        )
        written = out / "study.json"
    elif args.preset == ALL_ORGANISMS:
        from workbench.training.zoo import ORGANISMS_FILE, train_organisms

        if args.only:
            raise BadInput(f"--only {args.only[0]} with --preset organisms: train one organism with --preset org-TASK")
        out = Path(args.out) if args.out is not None else Path("runs") / "organisms"
        organisms = train_organisms(out, seeds=seeds, threads=args.threads, jobs=args.jobs, progress=not args.no_progress)
        for task, row in organisms["organisms"].items():
            print(f"{task:10s} qualified seeds {row['qualified_seeds']}, {row['session_wall_seconds']} s")
        print(f"wrote {out / ORGANISMS_FILE} in {organisms['session_wall_seconds']} s")
        return organisms
    else:
        from workbench.training.zoo import train_zoo

        out = Path(args.out) if args.out is not None else Path("runs") / args.preset
        summary = train_zoo(
            args.preset,
            out,
            progress=not args.no_progress,
            only=args.only,
            seeds=seeds,
            threads=args.threads,
            jobs=args.jobs,
        )
        written = out / "zoo.json"
    for name, row in summary["models"].items():
        print(f"{name:16s} trained in {row['train_seconds']}s")
    print(f"wrote {written}")
    return summary


def _add_zoo(sub) -> None:
    """``workbench zoo``'s arguments."""
    p = sub.add_parser("zoo", help="train and evaluate the reference models, or a comparison study's members")
    p.add_argument(
        "--preset",
        choices=ZOO_PRESETS,
        default="micro",
        help="micro: seconds, a plumbing check; quick: minutes, a flip-flop learned; org-TASK: one model organism; "
        "organisms: all three, the reference zoo (into --out/TASK); cpu: the earlier reference zoo; "
        "modsum, flipflop: --study fbt-vs-baseline's settings (docs/studies.md)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="directory (default: runs/PRESET, as the app trains them; organisms: runs/organisms; with --study: "
        "runs/studies/STUDY, on an organism runs/organisms/TASK/studies/STUDY)",
    )
    p.add_argument(
        "--study",
        choices=STUDIES,
        default=None,
        help="train and measure a comparison study instead of the zoo (docs/studies.md)",
    )
    p.add_argument("--only", action="append", default=None, help="train only this member (repeatable)")
    p.add_argument(
        "--reuse",
        default=None,
        help="with --study: a zoo directory whose finished members the study copies instead of retraining",
    )
    p.add_argument(
        "--seeds",
        type=seeds_count,
        default=1,
        help="train every member at training seeds 0..N-1; `power` (--study fbt-vs-baseline): as many as its power step asks",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per member (recorded: the same count trains the same model); default: micro 2, quick 1, org-flipflop 1, org-perm 1, org-addition 1, cpu 1",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="members trained at once, each in its own process; default: micro 1, quick 2, org-flipflop 2, org-perm 2, org-addition 2, cpu 2",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", dest="json_out", help="also write the summary here")
    p.set_defaults(func=cmd_zoo)
