"""Where the results pages' numbers come from: the results folder, how a JSON file in it is read,
the command behind each JSON file that does not record its own, and the bullets with which every
page names its JSON files (``provenance``). Standard library only, as every module of this package
but the figures' drawing calls (``drawings.FigureSpec.draw``)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
SCRIPT = "python scripts/results_pages.py"

# The command behind each JSON file that does not record one itself, as the docs gave it.
DOCS_COMMANDS = {
    "zoo_cpu.json": [
        "workbench zoo --preset cpu --out runs/cpu",
        "workbench eval runs/cpu/NAME",
        "workbench eval runs/cpu/NAME --passes exact",
    ],
    "probe_baseline_memory.json": ["workbench probe runs/cpu/baseline --target memory --passes 2,3"],
    "probe_baseline_running_sum.json": ["workbench probe runs/cpu/baseline --target running_sum --passes 2,3"],
    "probe_fbt_memory.json": ["workbench probe runs/cpu/fbt --target memory --passes 2,3"],
    "probe_fbt_running_sum.json": ["workbench probe runs/cpu/fbt --target running_sum --passes 2,3"],
    "probe_hd4_memory.json": ["workbench probe runs/cpu/hd4 --target memory"],
    "capacity_fbt_memory.json": [
        "workbench zoo --preset cpu --out runs/cpu --only fbt --only fbt-no3pass",
        "workbench probe runs/cpu/fbt --target memory --passes 2,3 --out docs/results/capacity_fbt_memory.json",
    ],
    "capacity_fbt_running_sum.json": [
        "workbench probe runs/cpu/fbt --target running_sum --passes 2,3 --out docs/results/capacity_fbt_running_sum.json"
    ],
    "smollm2_import.json": ["workbench import smollm2 runs/smollm2 --json docs/results/smollm2_import.json"],
    "smollm2_traces_chain.json": [
        "workbench traces runs/smollm2 --chat --n 200 --max-new-tokens 160 --out runs/smollm2/traces-chain"
    ],
    "smollm2_traces_gsm8k.json": [
        "workbench traces runs/smollm2 --chat --task gsm8k-jsonl:../shared/data/gsm8k/train.jsonl --n 300 "
        "--difficulty 1..16 --max-new-tokens 256 --out runs/smollm2/traces-gsm8k"
    ],
    "smollm2_probe_value.json": [
        "workbench probe runs/smollm2 --target value --n 200 --hooks blocks.0.hook_resid_pre "
        "blocks.0.hook_resid_post blocks.4.hook_resid_post blocks.9.hook_resid_post blocks.14.hook_resid_post "
        "blocks.19.hook_resid_post blocks.24.hook_resid_post blocks.29.hook_resid_post --out docs/results/smollm2_probe_value.json"
    ],
    "smollm2_cpt.json": ["python scripts/cpt_smollm2.py --run runs/smollm2 --work /tmp/cpt-smollm2"],
    "traces_cpu_summary.json": [
        "workbench traces runs/cpu/fbt runs/cpu/baseline runs/cpu/hd2 runs/cpu/hd4 --task chain "
        "--regimes standard,soft,fused --passes 2 --n 1000 --difficulty 1..4 --out runs/cpu/traces"
    ],
    "study_fbt_vs_baseline.json": [
        "workbench zoo --study fbt-vs-baseline --preset modsum --seeds 5",
        "cp runs/studies/fbt-vs-baseline/study.json docs/results/study_fbt_vs_baseline.json",
    ],
    "study_fbt_vs_baseline_flipflop.json": [
        "workbench zoo --study fbt-vs-baseline --preset flipflop --seeds 5 --out runs/studies/fbt-vs-baseline-flipflop",
        "cp runs/studies/fbt-vs-baseline-flipflop/study.json docs/results/study_fbt_vs_baseline_flipflop.json",
    ],
    "bench_small.json": ["workbench bench --preset small --out docs/results/bench_small.json"],
    "bench_tiny.json": ["workbench bench --preset tiny --out docs/results/bench_tiny.json"],
    "bench_smollm2.json": [  # two runs, their entries in one file
        "OMP_NUM_THREADS=2 workbench bench --preset small --only smollm2_forward_vs_hf --only smollm2_decode_vs_hf "
        "--only smollm2_cache_vs_bridge --out /tmp/bench_smollm2.json",
        "OMP_NUM_THREADS=2 workbench bench --preset small --only smollm2_cache_peak_rss --out /tmp/bench_smollm2_rss.json",
    ],
}


def read(results: Path, name: str) -> dict:
    return json.loads((results / name).read_text())


def shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def provenance(name: str, data: dict) -> list[str]:
    """Bullets: the command behind one JSON file, and what it records about commit and settings."""
    lines = [f"- [`{name}`]({name})"]
    if data.get("command"):
        lines.append(f"  - command (recorded in the JSON): `{data['command']}`")
    elif data.get("argv"):
        argv = data["argv"]
        lines.append(f"  - command (recorded in the JSON): `{' '.join(argv) if isinstance(argv, list) else argv}`")
    else:
        if data.get("written_by"):
            lines.append(f"  - written by (recorded in the JSON): `{data['written_by']}`")
        for command in DOCS_COMMANDS.get(name, []):
            lines.append(f"  - command (as the docs give it; the JSON does not record it): `{command}`")
    commit = data.get("commit") or data.get("git_commit")
    lines.append(f"  - commit: `{commit}`" if commit else "  - commit: not recorded")
    settings = [
        f"{key} `{value}`"
        for key, value in data.items()
        if key not in ("command", "argv", "written_by", "commit", "git_commit", "note") and isinstance(value, str | int | float)
    ]
    settings += [
        f"{key} `{json.dumps(value)}`"
        for key, value in data.items()
        if isinstance(value, list) and len(value) <= 8 and all(isinstance(v, str | int | float) for v in value)
    ]
    if settings:
        lines.append("  - recorded settings: " + ", ".join(settings))
    if isinstance(data.get("machine"), dict):
        machine = ", ".join(f"{key} `{value}`" for key, value in data["machine"].items())
        lines.append(f"  - machine (recorded): {machine}")
    if data.get("note"):
        lines.append(f"  - note (recorded): {data['note']}")
    return lines
