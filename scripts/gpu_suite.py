#!/usr/bin/env python3
"""The GPU suite (issue #39): what this project checks on a GPU, in one call, into one JSON.

    bash scripts/gpu_suite.sh [--dry] [--out FILE]      # the shell wrapper installs carried wheels first
    python scripts/gpu_suite.py [--dry] [--out FILE]

1. ``workbench gpu-check``: the gpu preset trained in bf16 with torch.compile (baseline, FBT 1-
   and 2-pass, HD n=4), tokens/s and MFU, cached decoding == the full forward, the device bench keys;
2. host synchronisations per decode step, counted by ``SyncCounter`` for every architecture,
   regime and engine (0 between the reads every ``sync_every`` steps), and on a GPU the warnings of
   ``torch.cuda.set_sync_debug_mode("warn")`` over the same steps;
3. decode tokens/s at batch 1 for the eager, static and compiled engines, side by side in this
   process (the compiled one over the eager one is the ratio the CPU measures at 1.5-2.1).

``--dry`` runs every step at the debug preset on the CPU in seconds (CI runs it, so the script
cannot rot where no GPU is lent) and writes nothing into docs/ unless ``--out`` says so. Not yet
here (the next part of #39): HD n=4 decode at batch 32 after a 2k context, and a 200-step bf16
continued-pretraining run of a SmolLM2-shaped FBT and HD n=2 (the GGUF file is larger than what
travels to the GPU machine, so it would start from random weights of that shape).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

OUT = ROOT / "docs" / "results" / "gpu_suite.json"
CASES = [("baseline", "standard"), ("fbt", "soft"), ("fbt", "fused"), ("hd", "standard")]


def sync_counts(device, preset: str, engines: list[str], compiled_cases: int) -> dict:
    """Per (arch, regime, engine): host reads in 16 decode steps minus those in 8 (the steps
    between the reads every ``sync_every`` = 32 steps), and on CUDA the sync-debug warnings; the
    compiled engine on the first ``compiled_cases`` cases (each compiles for seconds on a CPU)."""
    import torch

    from workbench import build_model, generate
    from workbench.runtime.syncs import count_syncs

    rows = {}
    for i, (arch, regime) in enumerate(CASES):
        model = build_model(arch, preset, device=device)
        prompts = torch.randint(4, 100, (4, 8), generator=torch.Generator().manual_seed(0)).tolist()
        for engine in [e for e in engines if e != "compiled" or i < compiled_cases]:

            def run(new: int, model=model, prompts=prompts, regime=regime, engine=engine):
                return generate(
                    model, prompts, regime=regime, passes=2, max_new_tokens=new, engine=engine, eos_token_id=3, sync_every=32
                )

            run(8)  # a compiled engine compiles here
            counts = [count_syncs(run, new)[1].total for new in (8, 16)]
            row = {"per_8_steps": counts[1] - counts[0], "calls": counts}
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        run(8)
                        first = len(caught)
                        run(16)
                    row["cuda_sync_warnings"] = [first, len(caught) - first]
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            rows[f"{arch}/{regime}/{engine}"] = row
    return rows


def decode_speed(device, preset: str, new: int, reps: int) -> dict:
    """Tokens/s of batch-1 greedy decoding of the preset's baseline per engine, interleaved and
    synchronised by the bench's ``measure``."""
    import torch

    from workbench import build_model, generate
    from workbench.bench.timing import measure

    model = build_model("baseline", preset, device=device)
    prompt = [torch.randint(4, 100, (16,), generator=torch.Generator().manual_seed(1)).tolist()]
    engines = ("eager", "static", "compiled")
    times, dynamo = measure(
        {e: (lambda e=e: generate(model, prompt, max_new_tokens=new, engine=e)) for e in engines}, reps, device
    )
    median = {e: statistics.median(t) for e, t in times.items()}
    return {
        "preset": preset,
        "new_tokens": new,
        "reps": reps,
        "tokens_per_s": {e: new / t for e, t in median.items()},
        "compiled_over_eager": median["eager"] / median["compiled"],
        "static_over_eager": median["eager"] / median["static"],
        **dynamo,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--dry", action="store_true", help="every step at the debug preset on the CPU (CI)")
    parser.add_argument("--out", type=Path, help=f"the JSON (default {OUT.relative_to(ROOT)}; with --dry, none)")
    args = parser.parse_args(argv)
    import torch

    from workbench.bench.gpu_check import gpu_check
    from workbench.storage.provenance import source_commit

    if not args.dry and not torch.cuda.is_available():
        print("gpu_suite: no CUDA device here; --dry runs every step at debug size on the CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry else "cuda")
    preset = "debug" if args.dry else "gpu"
    started = time.perf_counter()
    report = {
        "command": "bash scripts/gpu_suite.sh" + (" --dry" if args.dry else ""),
        "commit": source_commit(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "gpu_check": gpu_check(dry=args.dry, progress=lambda line: print(line, flush=True)),
    }
    print("counting host synchronisations per decode step...", flush=True)
    engines = ["eager", "static", "compiled"]
    report["syncs_per_8_decode_steps"] = sync_counts(device, preset, engines, compiled_cases=1 if args.dry else len(CASES))
    print("decode tokens/s per engine...", flush=True)
    report["decode"] = decode_speed(device, preset, new=16 if args.dry else 256, reps=5)
    report["seconds"] = round(time.perf_counter() - started, 1)
    out = args.out if args.out is not None else (None if args.dry else OUT)
    text = json.dumps(report, indent=2, default=str) + "\n"
    if out is not None:
        out.write_text(text)
        print(f"wrote {out}")
    bad = {k: v["per_8_steps"] for k, v in report["syncs_per_8_decode_steps"].items() if v["per_8_steps"]}
    print(f"decode steps with host reads: {bad or 'none'}; compiled/eager {report['decode']['compiled_over_eager']:.2f}x")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
