"""The summary of a ``workbench dynamics`` study that docs/results/dynamics.md is generated from.

    python scripts/dynamics_summary.py runs/cpu/dynamics/dynamics.json --command "workbench dynamics ..." \
        --out docs/results/dynamics_cpu_summary.json

Keeps what the page shows (the per-step curves stay in the study's own dynamics.json) and records
the commit the study ran at. Steps are absolute rollout steps: the perturbation ratio's entry i is
step ``perturb_at + i``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path


def summarise_run(r: dict) -> dict:
    ratio = r["per_step"]["perturbation_ratio"]
    t0 = r["perturb_at"]
    low = min(range(len(ratio)), key=ratio.__getitem__)
    back = next((i for i in range(low, len(ratio)) if ratio[i] >= 1), None)
    norms = r["per_step"]["state_norm"]
    rows = r["kpass"]["rows"]
    return {
        "horizon": r["horizon"],
        "slid_at": r["slid_at"],
        "lyapunov": r["lyapunov"],
        "lyapunov_tangent": r["lyapunov_tangent"],
        "lyapunov_tangent_full": r.get("lyapunov_tangent_full"),
        "min_ratio": ratio[low],
        "argmin_ratio_step": t0 + low,
        "first_step_ratio_above_1": None if back is None else t0 + back,
        "final_ratio": ratio[-1],
        "max_ratio": max(ratio),
        "state_norm_mean": sum(norms) / len(norms),
        "spectra": [{k: s[k] for k in ("step", "spectral_radius", "spectral_norm", "frobenius")} for s in r["spectra"]],
        "fixed_points": [
            {
                **{k: f[k] for k in ("step", "n_converged", "n_starts", "iterations", "unconverged")},
                "points": [{k: v for k, v in p.items() if k != "state"} for p in f["points"]],
            }
            for f in r["fixed_points"]
        ],
        "kpass_relative_residual": [row.get("relative_residual") for row in rows],
        "kpass_kl": [row.get("kl_to_previous") for row in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a dynamics.json written by workbench dynamics")
    parser.add_argument("--command", required=True, help="the workbench dynamics command that wrote it")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", help="the commit the study ran at (default: HEAD now)")
    args = parser.parse_args()
    study = json.loads(args.study.read_text())
    commit = (
        args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    )
    summary = {
        "command": args.command,
        "commit": commit,
        "runs": {name: summarise_run(r) for name, r in study["runs"].items()},
    }
    args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
