"""Kernel-launching operations per decode step, per layer and outside the layers, for each
architecture and engine (``workbench.runtime.kernels``), written as JSON and printed as the table
in docs/benchmarks.md. Exact counts, not timings: any machine gives the same numbers.

    python scripts/kernel_counts.py --out docs/results/kernel_counts.json
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import torch

from workbench.runtime.config import build_model
from workbench.runtime.kernels import per_layer, per_step
from workbench.storage.files import write_json

PRESET = "debug"  # counts depend on the architecture, not the width
CASES = [  # (label, arch, regime, config overrides)
    ("baseline", "baseline", "standard", {}),
    ("baseline, grouped-query (4 heads, 1 key/value head)", "baseline", "standard", {"n_kv_heads": 1}),
    ("fbt, soft", "fbt", "soft", {}),
    ("hd, n = 2", "hd", "standard", {"n_streams": 2}),
    ("hd, n = 4", "hd", "standard", {"n_streams": 4}),
]
ENGINES = ("eager", "static")


def guard_cost(arch: str, regime: str, overrides: dict, engine: str) -> float:
    """Launching operations the numerics guard adds to a step (on minus off)."""
    model = build_model(arch, PRESET, **overrides)
    on, off = (per_step(model, [[1, 2, 3, 4]], regime=regime, engine=engine, check_numerics=c) for c in (True, False))
    return on["launching"] - off["launching"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/results/kernel_counts.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for label, arch, regime, overrides in CASES:
        for engine in ENGINES:
            counts = per_layer(arch, PRESET, overrides=overrides, regime=regime, engine=engine)
            rows.append({"label": label, "arch": arch, "regime": regime, "overrides": overrides, "engine": engine,
                         "per_layer": counts, "guard_per_step": guard_cost(arch, regime, overrides, engine)})  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    write_json(args.out, {"preset": PRESET, "torch": torch.__version__, "commit": commit, "rows": rows})
    print("| model | engine | per layer | views per layer | outside the layers | the guard's |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        c = r["per_layer"]
        print(
            f"| {r['label']} | {r['engine']} | {c['launching']:g} | {c['views']:g} | {c['outside_layers']:.1f} | {r['guard_per_step']:.2f} |"
        )


if __name__ == "__main__":
    main()
