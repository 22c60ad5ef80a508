"""Training FLOPs per token of SmolLM2 continued pretraining (baseline, FBT K=2, HD n=2), counted
by torch on one real step, and the time of the README's GPU recipes on one H200 from them.

    python scripts/cpt_flops.py runs/smollm2 [--out docs/results/smollm2_cpt_flops.json]

The counter sees every matmul as it runs (``workbench.bench.train_steps.counted_train_flops``) but
not CPU's fused attention kernel, so attention is added by formula: 12 L d_model T per token, once
per pass (FBT) or stream (HD), at the recipe's sequence length. The MFU is an assumption, stated in
the output: no GPU has run this project's training yet.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from workbench.bench.train_steps import counted_train_flops
from workbench.training.runconfig import make_run_config
from workbench.training.strategies import make_strategy
from workbench.training.train import init_from

ROOT = Path(__file__).resolve().parents[1]
H200_BF16_DENSE = 989e12  # FLOP/s, H200 SXM (the same tensor cores as H100 SXM)
ASSUMED_MFU = 0.35
RECIPES = {  # name: (tokens, sequence length, batch in sequences)
    "gsm8k_3_epochs": (3 * 1_350_610, 512, 64),
    "cpt_1B_tokens": (1_000_000_000, 2048, 256),
}
ARCHS = {"baseline": ([], 1), "fbt": (["fbt.feedback_start=0", "fbt.three_pass_fraction=0"], 2), "hd": (["hd.streams=2"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="the imported SmolLM2 run")
    parser.add_argument("--seq", type=int, default=256, help="sequence length of the counted step")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    result: dict = {
        "command": "python scripts/cpt_flops.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "counted_seq_len": args.seq,
        "h200_bf16_dense_flops": H200_BF16_DENSE,
        "assumed_mfu": ASSUMED_MFU,
        "archs": {},
    }
    for arch, (extra, copies) in ARCHS.items():
        cfg = make_run_config(
            arch, None, "chain", ["train.batch_size=1", f"train.seq_len={args.seq}", *extra], init_from=args.run
        )
        model = init_from(args.run, cfg, "cpu").train()
        x = torch.randint(0, 1000, (1, args.seq + 1))
        strategy = make_strategy(cfg)
        counted = counted_train_flops(lambda m=model, s=strategy, x=x: s.loss(m, x[:, :-1], x[:, 1:], 0, slice(0, 1))[0])
        per_token = counted / args.seq
        attention = {T: 12 * cfg.model.n_layers * cfg.model.d_model * T * copies for T in (256, 512, 2048)}
        row = {"matmul_flops_per_token": per_token, "attention_flops_per_token": attention, "recipes": {}}
        for name, (tokens, T, batch) in RECIPES.items():
            flops = tokens * (per_token + attention[T])
            row["recipes"][name] = {
                "tokens": tokens,
                "seq_len": T,
                "batch": batch,
                "steps": -(-tokens // (batch * T)),
                "flops": flops,
                "h200_hours": flops / (H200_BF16_DENSE * ASSUMED_MFU) / 3600,
            }
        result["archs"][arch] = row
        print(
            f"{arch}: {per_token / 1e9:.3f} GFLOP/token counted at T={args.seq}; "
            + ", ".join(f"{name} {r['h200_hours'] * 60:.1f} min" for name, r in row["recipes"].items())
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
