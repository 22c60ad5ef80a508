"""The training memory estimate (``runconfig.training_bytes``) against the peak RSS a CPU training
run reaches, for each architecture at three presets and several batch and sequence sizes. Each
configuration trains in a fresh process (three steps, FBT's three passes and HD's four streams
from the first); its figure is the peak RSS less the RSS the process had once imported torch and
the workbench. Beside them, the estimate on a CUDA device under bf16 against the peak GPU memory
the GPU suite measured (docs/results/gpu_suite.json, continued pretraining at SmolLM2-135M's
shape, 16 x 1024 tokens).

    python scripts/memory_calibration.py --out docs/results/memory_calibration.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

GRID = [
    (arch, preset, batch, seq)
    for arch in ("baseline", "fbt", "hd")
    for preset, seq, batch in (
        ("debug", 128, 1),
        ("debug", 128, 256),
        ("debug", 64, 256),
        ("tiny", 512, 8),
        ("small", 256, 8),
        ("small", 128, 32),
    )
]
SETTINGS = {
    "baseline": [],
    "fbt": ["fbt.feedback_start=0", "fbt.three_pass_fraction=1.0", "fbt.ramp=0"],
    "hd": ["hd.streams=[4]"],
}


def measure(arch: str, preset: str, batch: int, seq: int) -> dict:
    """One configuration in a fresh process: its peak RSS (``VmHWM``: ``ru_maxrss`` would start at
    a large parent's, such as a test session's) over its RSS after imports, and the estimate."""
    child = f"""
import json, sys, tempfile, torch
torch.set_num_threads(1)
from workbench.runtime.process import peak_rss_mib
from workbench.training.runconfig import make_run_config, training_bytes, run_sizes
from workbench.training.train import train
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) * 1024
base = rss()
cfg = make_run_config({arch!r}, {preset!r}, "modsum", {SETTINGS[arch]!r} + [
    "train.steps=3", "train.batch_size={batch}", "train.seq_len={seq}", "train.eval_examples=0",
    "train.log_every=1", "train.checkpoint_every=1000", "data.n_train=2000"])
with tempfile.TemporaryDirectory() as out:
    train(cfg, out + "/run", progress=False)
print(json.dumps({{"measured": peak_rss_mib() * 2**20 - base, "estimate": training_bytes(cfg, run_sizes(cfg))}}))
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{arch} {preset} batch {batch}: {done.stderr.strip().splitlines()[-1]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "arch": arch,
        "preset": preset,
        "batch_size": batch,
        "seq_len": seq,
        **row,
        "ratio": row["estimate"] / row["measured"],
    }


SMOLLM2 = [  # SmolLM2-135M's shape, as its config gives it
    "model.d_model=576",
    "model.n_layers=30",
    "model.d_mlp=1536",
    "model.n_heads=9",
    "model.n_kv_heads=3",
    "model.d_vocab=49152",
    "model.n_ctx=2048",
    "model.tie_embeddings=true",
]
GPU_SUITE = Path(__file__).resolve().parents[1] / "docs" / "results" / "gpu_suite.json"


def gpu_rows() -> list[dict]:
    """The estimate on a CUDA device against the GPU suite's measured peaks (its cpt section). The
    config is built at batch 1 (this machine's memory check passes it) and estimated at the suite's."""
    from workbench.training.runconfig import make_run_config, run_sizes, training_bytes

    suite = json.loads(GPU_SUITE.read_text())
    cpt = suite["sections"]["cpt"]
    rows = []
    for name, arch in (("fbt_2pass", "fbt"), ("hd2", "hd")):
        run = cpt.get(f"{name}_eager") or cpt[name]  # a suite that also times compiled runs names them by mode
        shape = [f"train.seq_len={cpt['seq_len']}", "train.batch_size=1"]
        cfg = make_run_config(arch, "small", "modsum", [*SMOLLM2, *shape, *run["overrides"]])
        measured = run["peak_gpu_memory_gib"] * 2**30
        estimate = training_bytes(cfg, {**run_sizes(cfg), "batch_size": cpt["batch"]}, device="cuda")
        rows.append(
            {"run": name, "device": suite["device"], "measured": measured, "estimate": estimate, "ratio": estimate / measured}
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="write the rows here as JSON")
    args = parser.parse_args()
    rows = []
    for point in GRID:
        rows.append(measure(*point))
        r = rows[-1]
        print(
            f"{r['arch']:8} {r['preset']:5} batch {r['batch_size']:3} seq {r['seq_len']:3}: "
            f"measured {r['measured'] / 2**20:8.1f} MiB, estimate {r['estimate'] / 2**20:8.1f} MiB, ratio {r['ratio']:.2f}",
            flush=True,
        )
    gpu = gpu_rows()
    for r in gpu:
        print(
            f"{r['run']} on {r['device']}: measured {r['measured'] / 2**30:.1f} GiB, estimate {r['estimate'] / 2**30:.1f} GiB, ratio {r['ratio']:.2f}"
        )
    if args.out:
        record = {"written_by": "python scripts/memory_calibration.py --out " + str(args.out), "cpu": rows, "gpu": gpu}
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
