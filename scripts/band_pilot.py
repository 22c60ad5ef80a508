"""Trained runs' accuracy on difficulty bands: the pilot that says whether an organism has a band
with room (a baseline between 0.6 and 0.9, ``bands.HEADROOM``) before a fair study runs
on it. Bands are the run's task's (``bands.BANDS``) unless given as JSON.

    python scripts/band_pilot.py [LABEL=]RUN [...] [--n 500] [--bands '{"NAME": {SETTING: VALUE}}'] [--out FILE]

``--out`` keeps the entries of other runs already in FILE; each entry records its commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
from pathlib import Path

import torch

from workbench.experiments.bands import BANDS, band_accuracy
from workbench.storage.files import write_json
from workbench.training.runconfig import load_run_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="[LABEL=]RUN: the entry's name (default: the path) and run")
    parser.add_argument("--n", type=int, default=500, help="problems per band")
    parser.add_argument("--bands", type=json.loads, help="name -> task settings (lists for tuples)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = json.loads(args.out.read_text())["runs"] if args.out and args.out.is_file() else {}
    for arg in args.runs:
        label, _, path = arg.rpartition("=")
        run = Path(path)
        cfg = load_run_config(run / "config.json")
        bands = args.bands or BANDS[cfg.data.task]
        bands = {name: {k: tuple(v) if isinstance(v, list) else v for k, v in s.items()} for name, s in bands.items()}
        accuracy = band_accuracy(run, bands, args.n)
        train = {k: getattr(cfg.train, k) for k in ("steps", "lr", "batch_size", "seq_len", "seed")}
        rows[label or path] = {"commit": commit, "task": cfg.data.task, "steps": cfg.train.steps, "train": train,
                          "data": dataclasses.asdict(cfg.data), "bands": bands, "accuracy": accuracy}  # fmt: skip
        print(run, json.dumps(accuracy))
        if args.out:  # after each run: a long pilot keeps what it has measured
            write_json(args.out, {"n": args.n, "runs": rows})


if __name__ == "__main__":
    main()
