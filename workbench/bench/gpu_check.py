"""``workbench gpu-check``: the GPU path, proven in one command and one JSON.

On a CUDA device it trains the ``gpu`` preset (85M) through the real training loop in bf16 with
``torch.compile``: the baseline, FBT single-pass and 2-pass steps, and HD n=4; reports tokens/s and
MFU (against the device's dense bf16 peak, ``workbench.training.flops``) over the last logging
interval (the first holds the compilation); checks cached decoding == the full forward for each
trained model on the device; and runs ``workbench bench``'s device keys. ``dry`` does the same at
the debug preset on the CPU in a few steps (no MFU: a CPU has no peak on record), so the script
cannot rot where no GPU is lent.
"""

from __future__ import annotations

import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from workbench.bench.suite import DEVICE_KEYS, run_bench
from workbench.demo import cache_parity
from workbench.runtime.checkpoint import load_model
from workbench.storage.errors import BadInput
from workbench.training.flops import peak_flops
from workbench.training.metrics import read_metrics
from workbench.training.runconfig import make_run_config
from workbench.training.train import train

TARGETS = {  # the targets on one H200, each (what, comparison, value)
    "baseline_mfu": ("baseline MFU in bf16 at the gpu preset", ">=", 0.40),
    "fbt_2pass_over_1pass_step": ("FBT 2-pass step time over the 1-pass step", "<=", 2.1),
    "hd4_over_baseline_step": ("HD n=4 step time over the baseline step", "<=", 4.6),
}
RUNS = {  # name: (arch, overrides)
    "baseline": ("baseline", []),
    "fbt_1pass": ("fbt", ["fbt.feedback_start=1.0"]),  # every step single-pass
    "fbt_2pass": ("fbt", ["fbt.feedback_start=0", "fbt.three_pass_fraction=0"]),  # every step K=2
    "hd4": ("hd", ["hd.streams=4"]),
}
SHAPES = {  # preset, batch, seq, steps, log_every (the last interval is the measurement)
    "gpu": ("gpu", 16, 1024, 60, 20),
    "dry": ("debug", 4, 32, 4, 2),
}


def measured_run(batch: int, seq: int, steps: int, log_every: int, device: torch.device, *, warmup: int) -> list[str]:
    """The overrides of a timed bf16 training run: one checkpoint at the end, the last logging
    interval the measurement (on a CPU the bf16 autocast path runs too, so it cannot rot)."""
    return [
        f"train.batch_size={batch}",
        f"train.seq_len={seq}",
        f"train.steps={steps}",
        f"train.log_every={log_every}",
        f"train.checkpoint_every={steps}",
        f"train.warmup={warmup}",
        "train.bf16=true",
        f"train.cpu_bf16={device.type == 'cpu'}",
        f"train.device={device.type}",
    ]


def gpu_check(*, dry: bool = False, progress: Callable[[str], None] = lambda line: None) -> dict:
    """The report ``workbench gpu-check`` writes (see the module docstring)."""
    cuda = torch.cuda.is_available()
    if not dry and not cuda:
        raise BadInput("gpu-check: no CUDA device here; --dry runs the same steps at debug size on the CPU")
    device = torch.device("cuda" if cuda and not dry else "cpu")
    preset, batch, seq, steps, log_every = SHAPES["dry" if dry else "gpu"]
    peak = peak_flops(device)
    runs, parity = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (arch, extra) in RUNS.items():
            overrides = [
                *measured_run(batch, seq, steps, log_every, device, warmup=steps // 4),
                "train.compile=true",
                "data.n_train=2000",
                *extra,
            ]
            cfg = make_run_config(arch, preset, "mix", overrides)
            progress(f"training {name}: {arch} at {preset}, batch {batch} x {seq}, {steps} steps")
            started = time.perf_counter()
            train(cfg, Path(tmp) / name, progress=False)
            last = read_metrics(Path(tmp) / name / "metrics.jsonl")[-1]
            runs[name] = {
                "arch": arch,
                "overrides": extra,
                "seconds": time.perf_counter() - started,
                "loss": last["loss"],
                **{k: last.get(k) for k in ("tokens_per_s", "tflops_per_s", "mfu", "passes", "n_streams")},
            }
            model = load_model(Path(tmp) / name, device=device)  # as saved, uncompiled, fp32
            tokens = torch.randint(4, 100, (2, min(64, seq)), generator=torch.Generator().manual_seed(0)).to(device)
            parity[name] = cache_parity(model, tokens, split=tokens.shape[1] // 2)  # prefill, then one token a step
            del model
    step = {name: 1 / r["tokens_per_s"] for name, r in runs.items()}  # seconds per token: the steps' batches are equal
    measured = {
        "baseline_mfu": runs["baseline"]["mfu"],
        "fbt_2pass_over_1pass_step": step["fbt_2pass"] / step["fbt_1pass"],
        "hd4_over_baseline_step": step["hd4"] / step["baseline"],
    }
    targets = {}
    for key, (what, op, value) in TARGETS.items():
        got = measured[key]
        met = None if got is None or dry else (got >= value if op == ">=" else got <= value)
        targets[key] = {"what": what, "value": got, "target": f"{op} {value}", "met": met}
    progress("workbench bench on the device: " + ", ".join(DEVICE_KEYS))
    bench = run_bench(
        "debug" if dry else "gpu", reps=5, device=str(device) if device.type == "cuda" else "cpu", only=list(DEVICE_KEYS)
    )
    return {
        "dry": dry,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "peak_tflops": peak / 1e12 if peak else None,
        "shape": {
            "preset": preset,
            "batch": batch,
            "seq_len": seq,
            "steps": steps,
            "measured_interval": [steps - log_every + 1, steps],
        },
        "runs": runs,
        "targets": targets,
        "cache_parity_max_abs": parity,
        "cache_parity_ok": all(v < 1e-3 for v in parity.values()),
        "bench": bench,
    }
