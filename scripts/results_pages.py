#!/usr/bin/env python3
"""Render the measured-results pages in docs/results/ from the JSON files next to them, and check
that every committed figure and screenshot was drawn by the code as it is now.

    python scripts/results_pages.py              # (re)write docs/results/*.md
    python scripts/results_pages.py --figures    # also redraw docs/results/*.png (the venv: matplotlib, workbench)
    python scripts/results_pages.py --check      # exit 1, naming the page or figure, if any is stale

Every number on a generated page is read from a JSON file in docs/results/; the only text typed
in here is prose, column names, and the command behind a JSON file that does not record its own
(copied from the docs that quoted it). The topic pages (docs/*.md) keep the interpretation and
link to these pages. The pages and the check are standard library only (and git); only
``--figures`` imports the workbench's drawing functions.

A figure (docs/results/figures.json) or screenshot (docs/app/screenshots.json, written by
tests/integration/test_browser.py) is recorded with the commit HEAD was at when it was drawn, the
code that draws it, any of that code that differed from the commit then, and the PNG's sha256.
``--check`` fails naming the PNG when the code that draws it changed in a commit after the recorded
one, when it was drawn from uncommitted code, when the PNG or (for a figure) its JSON data is not
what was recorded, or when a PNG has no record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
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

# ---------------------------------------------------------------- formatting


def table(header: list[str], rows: Iterable[list[str]]) -> str:
    """A markdown table; every cell is already a string."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def fixed(x: float | None, digits: int, sign: bool = False) -> str:
    if x is None:
        return ""
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def sci(x: float) -> str:
    """1 significant decimal in scientific notation: 1.7e-4, 1.0e3."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def small(x: float, sign: bool = True) -> str:
    """Two decimals, or three below 0.1 in magnitude (-1.31, -0.45, -0.074, +0.002)."""
    return fixed(x, 2 if abs(x) >= 0.1 else 3, sign)


def interval(stat: dict, digits: int) -> str:
    return f"{fixed(stat['mean'], digits, True)} [{fixed(stat['ci_low'], digits, True)}, {fixed(stat['ci_high'], digits, True)}]"


def code(text: str) -> str:
    return f"`{text}`"


def span(values: list[float], digits: int) -> str:
    lo, hi = fixed(min(values), digits), fixed(max(values), digits)
    return lo if lo == hi else f"{lo} to {hi}"


def same_or_span(values: list, digits: int) -> str:
    return span([float(v) for v in values], digits)


# ---------------------------------------------------------------- page frame


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


def frame(title: str, sources: list[tuple[str, dict]], body: str, figures: list[str], results: Path) -> str:
    names = ", ".join(f"[`{name}`]({name})" for name, _ in sources)
    out = [
        f"# {title}",
        "",
        f"Generated by `{SCRIPT}` from {names}; do not edit by hand.",
        "",
        "To change it, rerun the command below that writes the JSON (or change the script), then regenerate;",
        f"`{SCRIPT} --check`, which the tests run, fails while this page differs from what the JSON gives.",
        "",
        "## Where the numbers come from",
        "",
    ]
    for name, data in sources:
        out += provenance(name, data)
    out += ["", body.rstrip("\n")]
    if figures:
        out += ["", "## Figures", ""]
        for figure in figures:
            if not (results / figure).is_file():
                raise FileNotFoundError(f"{results / figure}: a figure the {title!r} page shows is missing")
            out += [f"![{figure}]({figure})", ""]
        out.pop()
    return "\n".join(out) + "\n"


def figures_of(name: str, data: dict | None = None) -> list[str]:
    """The committed figures drawn from the JSON file ``name`` (``FIGURES``); a figure a JSON file
    lists (its study's own output directory) is not one of them unless this script draws it."""
    return [figure for figure, spec in FIGURES.items() if name in spec.data]


# ---------------------------------------------------------------- zoo

REGIME_ORDER = ["standard", "recurrent", "soft", "fused", "fused_exact"]


def _regimes(models: dict, field: str) -> Callable[[dict], list[str]]:
    def of(model: dict) -> list[str]:
        seen = {regime for task in model["tasks"].values() for regime in task[field]}
        return [r for r in REGIME_ORDER if r in seen] + sorted(seen - set(REGIME_ORDER))

    return of


def zoo_table(zoo: dict) -> str:
    """Accuracy per model and decoding regime, with train time and the first task's validation loss."""
    models = zoo["models"]
    tasks = list(next(iter(models.values()))["tasks"])
    header = ["model, regime", "train time", f"{tasks[0]} val loss"] + [f"{task} acc" for task in tasks]
    rows = []
    for name, model in models.items():
        for i, regime in enumerate(_regimes(models, "accuracy")(model)):
            first = i == 0
            rows.append(
                [
                    f"`{name}` {regime}",
                    f"{model['train_seconds']:.0f} s" if first else "",
                    fixed(model["tasks"][tasks[0]]["loss"].get(regime), 3) if first else "",
                ]
                + [fixed(model["tasks"][task]["accuracy"].get(regime), 2) for task in tasks]
            )
    return table(header, rows)


def zoo_loss_table(zoo: dict, field: str) -> str:
    models = zoo["models"]
    tasks = list(next(iter(models.values()))["tasks"])
    rows = [
        [f"`{name}` {regime}"] + [fixed(model["tasks"][task][field].get(regime), 3) for task in tasks]
        for name, model in models.items()
        for regime in _regimes(models, field)(model)
    ]
    return table(["model, regime"] + tasks, rows)


def zoo_page(results: Path) -> str:
    name = "zoo_cpu.json"
    zoo = read(results, name)
    models = zoo["models"]
    sizes = sorted({task["n"] for model in models.values() for task in model["tasks"].values()})
    total = sum(model["train_seconds"] + model["eval_seconds"] for model in models.values())
    half = 1.96 * math.sqrt(0.25 / min(sizes))
    body = [
        "## Accuracy, train time, validation loss",
        "",
        f"Held-out problems per task: {', '.join(map(str, sizes))} (binomial 95% half-width of an accuracy at 0.5:",
        f"+-{half:.2f}). Train plus eval time, all models: {total:.0f} s ({total / 60:.1f} min). Regimes as the",
        "JSON names them: `fused` at `workbench eval`'s default `--passes`, `fused_exact` from `--passes exact`.",
        "",
        zoo_table(zoo),
        "## Whole-example validation loss",
        "",
        "Mean NTP over whole held-out examples: `standard` is the plain pass, `recurrent` (FBT) feedback at",
        "every position, the exact recurrence.",
        "",
        zoo_loss_table(zoo, "loss"),
        "## Answer loss",
        "",
        zoo_loss_table(zoo, "answer_loss"),
        "## Time",
        "",
        table(
            ["model", "train seconds", "eval seconds", "resumed from a checkpoint"],
            [
                [f"`{n}`", f"{m['train_seconds']:.1f}", f"{m['eval_seconds']:.2f}", str(m["resumed_from"] or "no")]
                for n, m in models.items()
            ],
        ),
    ]
    return frame(
        f"Reference zoo, `{zoo.get('scale', '?')}` scale (measured)",
        [(name, zoo)],
        "\n".join(body),
        figures_of(name, zoo),
        results,
    )


ACCURACY, DIFFERENCE = (0.0, 1.0), (-1.0, 1.0)  # where an accuracy's (a difference of two's) interval is clipped


def seed_cell(values: list[float], digits: int = 3, listed: bool = True, bounds: tuple[float, float] | None = None) -> str:
    """Mean [95% Student-t interval] over the seeds, then (``listed``) the seeds' values; the
    interval's t quantiles are tabulated for 2..10 seeds (this page imports nothing beyond the
    standard library). ``bounds``: the range the mean cannot leave, to which the interval is
    clipped (an accuracy's [0, 1]; ``workbench.training.intervals.seed_interval`` does the same)."""
    t975 = {2: 12.706205, 3: 4.302653, 4: 3.182446, 5: 2.776445, 6: 2.570582, 7: 2.446912, 8: 2.364624, 9: 2.306004, 10: 2.262157}
    n, mean = len(values), sum(values) / len(values)
    shown = ", ".join(fixed(v, digits) for v in values)
    if n < 2:
        return fixed(mean, digits)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975[n] * sd / math.sqrt(n)  # t(0.975, n - 1), keyed by n
    low, high = (max(mean - half, bounds[0]), min(mean + half, bounds[1])) if bounds else (mean - half, mean + half)
    interval = f"{fixed(mean, digits)} [{fixed(low, digits)}, {fixed(high, digits)}]"
    return f"{interval} ({shown})" if listed else interval


def zoo_seeds_page(results: Path, name: str = "zoo_cpu_seeds.json") -> str:
    zoo = read(results, name)
    models = zoo["models"]
    members: dict[str, list[str]] = {}
    for run, row in models.items():
        members.setdefault(row["member"], []).append(run)
    tasks = list(next(iter(models.values()))["tasks"])
    rows = []
    for member, runs in members.items():
        runs = sorted(runs, key=lambda r: models[r]["seed"])
        for regime in _regimes(models, "accuracy")(models[runs[0]]):
            cells = [seed_cell([models[r]["tasks"][t]["accuracy"][regime] for r in runs], bounds=ACCURACY) for t in tasks]
            qualified = sum(bool(models[r]["competence"]["qualified"]) for r in runs)
            rows.append([f"`{member}`, {regime}", *cells, f"{qualified}/{len(runs)}"])
    base = sorted(members["baseline"], key=lambda r: models[r]["seed"])
    paired = []
    for member, runs in members.items():
        runs = sorted(runs, key=lambda r: models[r]["seed"])
        if member == "baseline" or len(runs) != len(base):
            continue
        for regime in _regimes(models, "accuracy")(models[runs[0]]):
            cells = [
                seed_cell(
                    [
                        models[r]["tasks"][t]["accuracy"][regime] - models[b]["tasks"][t]["accuracy"]["standard"]
                        for r, b in zip(runs, base)
                    ],
                    bounds=DIFFERENCE,
                )
                for t in tasks
            ]
            paired.append([f"`{member}`, {regime}", *cells])
    targets = next(iter(models.values()))["competence"]["tasks"]
    times = [
        [
            f"`{member}`",
            seed_cell([models[r]["train_seconds"] for r in sorted(runs, key=lambda r: models[r]["seed"])], 0),
            seed_cell([models[r]["eval_seconds"] for r in sorted(runs, key=lambda r: models[r]["seed"])], 1),
        ]
        for member, runs in members.items()
    ]
    body = [
        "## Held-out accuracy across training seeds",
        "",
        (
            f"Each cell: the mean over {zoo['seeds']} training seeds, its 95% Student-t interval, and the seeds' values in\nseed order."
            if zoo["seeds"] > 1
            else "Each cell: held-out accuracy at one training seed (no interval)."
        ),
        "FBT's `fused` prefills 2 passes. Competence targets (`standard` accuracy): "
        + ", ".join(f"{t} {v['target']}" for t, v in targets.items())
        + "; the last column counts the seeds that reached all of them.",
        "",
        table(["member, regime", *tasks, "qualified seeds"], rows),
        "## Paired with the baseline of the same seed",
        "",
        "A member's accuracy minus the `baseline`'s (`standard`) at the same training seed: FBT trains on the",
        "baseline's batches, HD continues from that baseline. Mean over the seeds, its 95% interval, the",
        "seeds' differences.",
        "",
        table(["member, regime", *tasks], paired),
        "## Time",
        "",
        f"Seconds per member (training, then evaluation), {zoo['jobs']} members at a time with {zoo['threads']} torch",
        "thread each.",
        "",
        table(["member", "train seconds", "eval seconds"], times),
    ]
    seeds = f"{zoo['seeds']} seeds" if zoo["seeds"] > 1 else "one seed"
    return frame(f"The `{zoo['scale']}` zoo at {seeds} (measured)", [(name, zoo)], "\n".join(body), [], results)


def readings_table(readings: dict[str, dict]) -> str:
    """Readings named ``WHERE/WHAT`` as tables: a row per ``WHERE``, a column per ``WHAT`` (in the
    order they first appear), each cell ``seed_cell`` of the seeds' values; a name without ``/``
    is its own row, in the column ``value``. Consecutive rows with the same measures share a
    table; a row with other measures starts the next."""
    rows: dict[str, dict[str, list[float]]] = {}
    for key, reading in readings.items():
        where, _, what = key.rpartition("/")
        where, what = (where, what) if where else (key, "value")
        rows.setdefault(where, {})[what] = reading["values"]
    tables: list[tuple[list[str], list[list[str]]]] = []
    for where, cells in rows.items():
        if not tables or tables[-1][0] != list(cells):
            tables.append((list(cells), []))
        tables[-1][1].append([where, *(seed_cell(v, bounds=accuracy_bounds(where, what)) for what, v in cells.items())])
    return "\n".join(table(["reading", *columns], body) for columns, body in tables)


def accuracy_bounds(where: str, what: str) -> tuple[float, float] | None:
    """An analysis reading's bounds: an accuracy's [0, 1], a difference of accuracies' [-1, 1]."""
    if what != "accuracy" and not what.endswith(" accuracy"):
        return None
    return DIFFERENCE if " - " in where else ACCURACY


def seed_readings_page(results: Path, name: str = "zoo_analyses.json") -> str:
    data = read(results, name)
    body = [
        "## Readings across training seeds",
        "",
        f"The probes, dynamics and traces of each of {data['seeds']} training seeds of the zoo, run by the commands above",
        "(`ZOO` = the zoo's directory, seed k's runs in `NAME-seedK`). Each cell: the mean over the seeds,",
        "its 95% Student-t interval, then the seeds' values in seed order.",
        "",
        "\n".join(f"- `{' '.join(argv)}`" for argv in data["commands"]),
        "",
    ]
    for group, readings in data["readings"].items():
        body += [f"### {group}", "", readings_table(readings)]
    seeds = data["seeds"]
    return frame(f"Probes, dynamics and traces at {seeds} seeds (measured)", [(name, data)], "\n".join(body), [], results)


def data_efficiency_table(study: dict) -> str:
    """The data-efficiency study's readings: per FBT budget and regime, FBT's and the baseline's
    validation loss and the token ratio, each across seeds (``seed_cell``), and the seeds whose
    ratio lies outside the baseline's budgets (bounds)."""
    rows = []
    for r in study["readings"].values():
        ratio = r["token_ratio"]
        rows.append(
            [
                f"{r['tokens']:,}",
                r["regime"],
                seed_cell(r["fbt_loss"]["values"]),
                seed_cell(r["baseline_loss"]["values"]) if r["baseline_loss"] else "",
                seed_cell(ratio["values"], 2) if ratio else "-",
                ", ".join(r["censored"]) or "-",
            ]
        )
    header = ["FBT tokens", "FBT regime", "FBT loss", "baseline loss, same tokens", "token ratio", "bounds"]
    return table(header, rows)


def data_efficiency_page(results: Path, name: str = "study_data_efficiency.json") -> str:
    study = read(results, name)
    body = [
        "## FBT's validation loss against the baseline's tokens",
        "",
        "Validation loss: the held-out completion loss averaged over the three tasks. Token ratio: the tokens",
        "at which the seed's baseline curve (its three budgets, linear in log tokens) reaches FBT's loss, over",
        "FBT's tokens (above 1: the baseline needs more data). A seed whose FBT loss lies outside the",
        "baseline's budgets gives a bound instead (`>2`: more than twice; `<1`: fewer than FBT's tokens);",
        f"the interval is over the seeds with a ratio. Each cell: mean over {study['seeds']} training seeds, its",
        "95% Student-t interval, the seeds' values.",
        "",
        data_efficiency_table(study),
    ]
    title = f"FBT data efficiency, `{study['scale']}` zoo at {study['seeds']} seeds (measured)"
    sources, section = families(results, name)
    return frame(title, [(name, study), *sources], "\n".join([*body, *section]), [], results)


def three_pass_tables(study: dict) -> tuple[str, str]:
    """The three-pass study's readings, one row per 3-pass fraction: the K-pass residual by K
    (mean [interval] across seeds), then the stability exponents, the regrowth step of each seed
    and the accuracies under every regime (mean of the tasks), each with the seeds' values."""
    readings = sorted(study["readings"].items(), key=lambda item: float(fraction_of(item[0])))
    passes = sorted({K for _, r in readings for K in r["kpass_residual"]}, key=int)
    residual = [
        [fraction_of(member), *[seed_cell(r["kpass_residual"][K]["values"], 2, listed=False) for K in passes]]
        for member, r in readings
    ]
    horizons = sorted({T for _, r in readings for T in r["lyapunov_tangent"]}, key=int)
    exponents = [(key, T) for key in exponent_keys([r for _, r in readings]) for T in horizons]
    stable = []
    for member, r in readings:
        standard = [mean_accuracy(study["models"][run], "standard") for run in r["runs"]]
        stable.append(
            [
                fraction_of(member),
                *[seed_cell(r[key][T]["values"], 3) if T in r[key] else "-" for key, T in exponents],
                ", ".join("never" if s["regrowth_step"] is None else str(s["regrowth_step"]) for s in r["per_seed"]),
                seed_cell(standard, bounds=ACCURACY),
                *[seed_cell(r["accuracy"][regime]["values"], bounds=ACCURACY) for regime in ("soft", "fused")],
            ]
        )
    return (
        table(["3-pass fraction", *[f"K={K}" for K in passes]], residual),
        table(
            [
                "3-pass fraction",
                *[f"{EXPONENTS[key]}({T})" for key, T in exponents],
                "regrowth step",
                "standard",
                "soft",
                "fused",
            ],
            stable,
        ),
    )


def three_pass_paired_table(study: dict) -> str:
    """Each nonzero fraction minus the fraction 0 of the same seed: the K-pass residual at the
    largest K and lambda at the longest horizon (F_t's, then the whole step's), across seeds with
    the seeds' differences."""
    readings = dict(sorted(study["readings"].items(), key=lambda item: float(fraction_of(item[0]))))
    none = readings.pop("fbt-3pass0")
    K = max(none["per_seed"][0]["kpass_residual"], key=int)
    T = max(none["per_seed"][0]["lyapunov_tangent"], key=int)
    keys = exponent_keys([none, *readings.values()])
    rows = []
    for member, r in readings.items():
        pairs = list(zip(r["per_seed"], none["per_seed"], strict=True))
        rows.append(
            [
                fraction_of(member),
                seed_cell([a["kpass_residual"][K] - b["kpass_residual"][K] for a, b in pairs], 3),
                *[seed_cell([a[key][T] - b[key][T] for a, b in pairs], 3) for key in keys],
            ]
        )
    header = [f"K-pass residual at K={K}", *[f"{EXPONENTS[key]}({T})" for key in keys]]
    return table(["3-pass fraction", *[f"{h}, minus fraction 0" for h in header]], rows)


EXPONENTS = {"lyapunov_tangent": "lambda", "lyapunov_tangent_full": "whole step lambda"}


def exponent_keys(readings: list[dict]) -> list[str]:
    """The exponents every reading has (a study measured before the whole step's has only F_t's)."""
    return [key for key in EXPONENTS if all(key in r for r in readings)]


def fraction_of(member: str) -> str:
    """``0.03`` of the member ``fbt-3pass0.03``."""
    return member.removeprefix("fbt-3pass")


def mean_accuracy(row: dict, regime: str) -> float:
    values = [task["accuracy"][regime] for task in row["tasks"].values()]
    return sum(values) / len(values)


def three_pass_page(results: Path, name: str = "study_three_pass.json") -> str:
    study = read(results, name)
    residual, stable = three_pass_tables(study)
    body = [
        "## The K-pass residual",
        "",
        "The relative change of the carried states from K-1 to K parallel passes, on the default prompt (the",
        "K-pass objective trains with 2 passes, and a `3-pass fraction` of its batches with 3). Each cell:",
        f"mean [95% Student-t interval] over {study['seeds']} training seeds.",
        "",
        residual,
        "## Stability of the recurrence, and accuracy by regime",
        "",
        "lambda(T): the leading Lyapunov exponent of the carried-state map F_t (context frozen) from tangent",
        "vectors, T steps after a 1e-3 perturbation of the carried state 20 steps into a `soft` rollout (fp64);",
        "whole step: the same through the whole decoding step (the tangent carried in the cache too).",
        "Regrowth step: the first step at which that perturbation is back to its size, per seed (`never`",
        f"within the rollout). Accuracy: held-out accuracy averaged over {tasks_of(study)}. Each cell: mean",
        "[95% interval], then the seeds' values.",
        "",
        stable,
        "## Paired by seed against no 3-pass batches",
        "",
        "Each seed's member minus the fraction-0 member of the same training seed.",
        "",
        three_pass_paired_table(study),
    ]
    title = f"FBT's stability knob (`three_pass_fraction`), `{study['scale']}` zoo at {study['seeds']} seeds (measured)"
    sources, section = families(results, name)
    return frame(title, [(name, study), *sources], "\n".join([*body, *section]), [], results)


def hd_ablations_table(study: dict) -> str:
    """The HD ablations' readings, one row per member: accuracy (mean of the tasks and per task),
    completion loss per task, the loss jump at each expansion and training time over ``hd1``."""
    readings = study["readings"]
    tasks = sorted({task for r in readings.values() for task in r["tasks"]})
    rows = []
    for member, r in readings.items():
        rows.append(
            [
                f"`{member}`",
                seed_cell(r["accuracy"]["values"], bounds=ACCURACY),
                *[seed_cell(r["tasks"][t]["accuracy"]["values"], listed=False, bounds=ACCURACY) for t in tasks],
                *[seed_cell(r["tasks"][t]["completion_loss"]["values"], listed=False) for t in tasks],
                "; ".join(f"{k}: {', '.join(sci(x) for x in v['values'])}" for k, v in r["expansion_jumps"].items()) or "-",
                seed_cell(r["time_vs_hd1"]["values"], 2, listed=False) if r["time_vs_hd1"] else "-",
                step_ratio(r["step_time_vs_hd1"]) if "step_time_vs_hd1" in r else "-",
            ]
        )
    header = [
        "member",
        "accuracy",
        *[f"{t} acc." for t in tasks],
        *[f"{t} loss" for t in tasks],
        "loss jump",
        "time / hd1",
        "step time / hd1",
    ]
    return table(header, rows)


def step_ratio(entry: dict) -> str:
    """A side-by-side time ratio: the median, then the range over the repetitions."""
    low, high = entry["spread"]
    return f"{entry['ratio']:.2f} ({low:.2f}-{high:.2f})"


def hd_ablations_paired_table(study: dict) -> str:
    """Each member that has a reference (``hd1`` for a stream count, ``hd4`` for an n = 4 ablation)
    minus it at the same seed: accuracy and completion loss, each the mean of the tasks."""
    rows = [
        [
            f"`{member}`",
            f"`{r['paired']['reference']}`",
            seed_cell(r["paired"]["accuracy"]["values"], bounds=DIFFERENCE),
            seed_cell(r["paired"]["completion_loss"]["values"]),
        ]
        for member, r in study["readings"].items()
        if "paired" in r
    ]
    return table(["member", "minus", "accuracy", "completion loss"], rows)


def hd_ablations_page(results: Path, name: str = "study_hd_ablations.json") -> str:
    study = read(results, name)
    body = [
        "## Hidden Decoding's ablations",
        "",
        "Every member continues the seed's `baseline` for the zoo's HD steps: `hd1` the baseline continued",
        "alike, `hd2`/`hd4`/`hd8` by progressive expansion, and at n = 4 every stream supervised, the",
        "sum-of-streams readout, cross-stream attention in every layer, and the shared key/value cache.",
        "Accuracy and completion loss: held-out problems per task (accuracy: then the mean of the tasks).",
        "Loss jump: the training loss just after an expansion minus just before, per seed. Time: training seconds",
        "(from the runs' logs, so it carries whatever else loaded the machine while each trained) over `hd1`'s",
        "of the same seed. Step time: one training step of the seed-0 model over `hd1`'s, measured side by side",
        "in one process (median, then the range, over 5 interleaved repetitions). Each other cell: mean [95%",
        f"Student-t interval] over {study['seeds']} training seeds (the mean accuracy also lists the seeds' values).",
        "",
        hd_ablations_table(study),
        "## Paired by seed",
        "",
        "Each member minus its reference of the same training seed: `hd1` (the baseline continued alike) for",
        "a stream count, `hd4` for an ablation at n = 4. Accuracy and completion loss are each the mean of the",
        "tasks; each cell: mean [95% interval], then the seeds' differences.",
        "",
        hd_ablations_paired_table(study),
    ]
    title = f"Hidden Decoding ablations, `{study['scale']}` zoo at {study['seeds']} seeds (measured)"
    sources, section = families(results, name)
    return frame(title, [(name, study), *sources], "\n".join([*body, *section]), [], results)


def crossed(cell: dict, digits: int = 3, sign: bool = True) -> str:
    """A ``workbench.training.stats`` cell: ``+0.052 [+0.013, +0.091]`` (``0.52 [...]`` unsigned)."""
    return f"{fixed(cell['mean'], digits, sign)} [{fixed(cell['low'], digits, sign)}, {fixed(cell['high'], digits, sign)}]"


def family_section(family: dict[str, dict]) -> list[str]:
    """A study's declared family: per comparison the mean difference with its simultaneous 95%
    interval over the family (Bonferroni), the seeds on each side, p, Holm's p and the reading."""
    rows = []
    for comparison, cell in family.items():
        if "earlier" in cell:
            estimate = "-"
            signs = f"FBT first {cell['earlier']}, baseline first {cell['later']}, undetermined {cell['undetermined']}"
        else:
            low, high = cell.get("family_low", cell["low"]), cell.get("family_high", cell["high"])
            estimate = crossed({"mean": cell["mean"], "low": low, "high": high})
            signs = f"{cell['seeds_higher']} higher, {cell['seeds_lower']} lower"
        verdict = "detectable" if cell["detectable"] else "no detectable difference"
        rows.append([comparison, estimate, signs, f"{cell['p']:.3g}", f"{cell['p_holm']:.3g}", verdict])
    return [
        f"## The declared family of {len(family)} comparisons, Holm-corrected",
        "",
        "Each comparison paired by seed; the interval is simultaneous over the family (Bonferroni: each at",
        f"1 - 0.05/{len(family)}). A difference is detectable when Holm's adjusted p is below 0.05 and that",
        "interval excludes 0 (`stats.detectable`): an interval through 0 reads no detectable difference,",
        "with the seeds on each side beside it.",
        "",
        table(["comparison", "difference [simultaneous 95% interval]", "seeds", "p", "Holm p", "reading"], rows),
    ]


def tasks_of(study: dict) -> str:
    """The tasks a study's members were evaluated on, in words (``the three tasks``, or the one)."""
    tasks = sorted({task for row in study["models"].values() for task in row.get("tasks", {})})
    return f"the {len(tasks)} tasks ({', '.join(tasks)})" if len(tasks) > 1 else f"its one task ({tasks[0]})"


def families(results: Path, name: str) -> tuple[list[tuple[str, dict]], list[str]]:
    """The source entry and the family section of study file ``name``: its own ``family`` (a study
    run since ``run_study`` writes one), else study_families.json's for the studies measured before."""
    study = read(results, name)
    if "family" in study:
        return [], family_section(study["family"])
    data = read(results, "study_families.json")
    return [("study_families.json", data)], family_section(data["families"][name])


def same_start(chosen: dict) -> str:
    """Whether the tuned FBT is the baseline until its feedback starts (the same learning rate)."""
    fbt, base = chosen["fbt"], chosen["baseline"]
    if fbt["lr"] == base["lr"]:
        return f"At one learning rate FBT is the baseline until its feedback starts (feedback_start {fbt['feedback_start']:g})."
    return f"FBT trains at lr {fbt['lr']:g}, the baseline at {base['lr']:g}: they differ from the first step."


def beyond_section(readings: dict) -> list[str]:
    """The accuracies on the test sets beyond training (an organism's), with the settings each
    set's problems were drawn with; nothing for a study without them."""
    if not readings.get("beyond"):
        return []
    rows = [
        [
            name,
            ", ".join(f"{k}={v}" for k, v in readings["beyond_settings"][name].items()),
            f"`{member}`",
            regime,
            crossed(cell, sign=False),
        ]
        for name, members in readings["beyond"].items()
        for member, regimes in members.items()
        for regime, cell in regimes.items()
    ]
    return [
        "Beyond training: the same members on test problems drawn with other task settings (the",
        "training ones otherwise), where the in-distribution ceiling leaves room; single-token answers,",
        "so soft decoding is standard's there.",
        "",
        table(["test set", "drawn with", "member", "regime", "accuracy"], rows),
    ]


def fbt_vs_baseline_page(results: Path, name: str = "study_fbt_vs_baseline.json") -> str:
    study = read(results, name)
    tuning, readings = study["tuning"], study["readings"]
    chosen = {row["name"] for row in tuning["chosen"].values()}
    sweep = [
        [
            f"`{row['name']}`" + (" (chosen)" if row["name"] in chosen else ""),
            f"{row['lr']:g}",
            f"{row['feedback_start']:g}" if "feedback_start" in row else "-",
            f"{row['ramp']:g}" if "ramp" in row else "-",
            row["regime"],
            ", ".join(f"{loss:.4f}" for loss in row.get("validation_losses", [row["validation_loss"]])),
            f"{row['validation_loss']:.4f}",
        ]
        for row in tuning["rows"]
    ]
    if "tuning_seeds" in tuning:  # from issue #37 on: each row at two seeds, read by the worse
        seeds = " and ".join(str(seed) for seed in tuning["tuning_seeds"])
        trained = f"Every sweep row trains at seeds {seeds} (no comparison member's) and is read by the worse of them;"
    else:
        trained = f"Every sweep run trains at seed {tuning['tuning_seed']} (no comparison member's)"
    accuracy = [
        [f"`{member}`", regime, crossed(cell, sign=False), f"{cell['n_seeds']} x {cell['n_problems']}"]
        for member, regimes in readings["accuracy"].items()
        for regime, cell in regimes.items()
    ]
    gap = readings["loss_gap_per_step"]
    every = max(1, len(gap["steps"]) // 10)
    gaps = [[str(step), crossed(cell)] for i, (step, cell) in enumerate(zip(gap["steps"], gap["cells"])) if (i + 1) % every == 0]
    times = readings["time_to_threshold"]
    reach = [
        [
            f"`{member}`",
            ", ".join(str(r["step"]) if r["reached"] else f">{r['step']}" for r in times[member]["per_seed"]),
            f"{times[member]['median']:g}" if times[member]["median"] is not None else "not reached by half",
        ]
        for member in ("baseline", "fbt", "fbt-no-feedback")
    ]
    seeds = study["seeds"]
    body = [
        "## Tuning, by a rule fixed before the sweep",
        "",
        f"Rule: {tuning['rule']} {trained}",
        f"each is scored on {tuning['validation_problems']} validation problems (a split of its own: neither",
        "training data nor the test problems).",
        "",
        table(["sweep run", "lr", "feedback_start", "ramp", "regime", "validation loss by seed", "validation loss"], sweep),
        f"## Accuracy on the same test problems, {seeds} seeds",
        "",
        "Each cell: mean [95% interval over seeds and problems] (two-way random effects, Satterthwaite df;",
        "`workbench.training.stats.crossed_interval`); `fbt-no-feedback` is FBT's model at the baseline's",
        "setting with no loss on its feedback passes.",
        "",
        table(["member", "regime", "accuracy", "seeds x problems"], accuracy),
        *beyond_section(readings),
        "Compared: each member minus the baseline of its seed, on the same problems (accuracy: 1/0 per",
        "problem; completion loss: per problem), the plain-pass training loss on identical batches averaged",
        "over the last half of the logged steps, and which of the pair first brings its plain-pass training",
        f"loss (averaged over {times['window']} logged steps) to {times['threshold']:g}, a run that never does",
        "censored at its budget (exact sign test).",
        "",
        *family_section(study["family"]),
        f"The control's weights are bitwise the baseline's at {readings['control_bitwise_seeds']} of {seeds} seeds; its",
        "plain-pass training loss equals the baseline's to the last bit until it first differs, at logged step",
        ", ".join(str(step) for step in readings.get("control_same_loss_until", [])) + " by seed: the first logs after",
        "its first 2-pass step, where clipping's gradient norm starts to sum the fusion's zero gradients too",
        "and rounds differently: from there the two are different sample paths, which sets the noise floor",
        "of a paired comparison at this budget.",
        "",
        "## Plain-pass training loss, FBT minus the baseline, by step",
        "",
        "Identical batches at each step (the same seed's data order); mean [95% interval over seeds].",
        same_start(tuning["chosen"]),
        "",
        table(["step", "FBT - baseline"], gaps),
        "## Steps to the loss threshold",
        "",
        "Per seed (seed 0 first; `>N`: censored at the budget), and the Kaplan-Meier median.",
        "",
        table(["member", "steps by seed", "median"], reach),
    ]
    title = f"FBT against the baseline, fair by construction: `{study['scale']}` at {seeds} seeds (measured)"
    return frame(title, [(name, study)], "\n".join(body), [], results)


# ---------------------------------------------------------------- probes


def prefill_label(row: dict) -> str:
    if row["prefill"] != "recurrent":
        return row["prefill"]
    return "recurrent, exact" if row["passes"] == "exact" else f"recurrent K={row['passes']}"


def depth(layer: float) -> str:
    return f"{layer:g}"


def _groups(sweeps: list[tuple[str, dict]]) -> dict[tuple[str, str], list[dict]]:
    """(model label, prefill label) -> rows by depth, in the order the sweeps list them."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for _, sweep in sweeps:
        model = Path(sweep["run"]).name
        streams = {row["stream"] for row in sweep["rows"]}
        for row in sweep["rows"]:
            label = f"`{model}` stream {row['stream']}" if len(streams) > 1 else f"`{model}`"
            groups.setdefault((label, prefill_label(row)), []).append(row)
    return groups


def probe_table(sweeps: list[tuple[str, dict]]) -> str:
    """Probe accuracy by depth (columns), one row per model, stream and prefill regime."""
    groups = _groups(sweeps)
    depths = sorted({row["layer"] for rows in groups.values() for row in rows})
    rows = []
    for (model, prefill), found in groups.items():
        by_depth = {row["layer"]: row["accuracy"] for row in found}
        rows.append([model, prefill] + [fixed(by_depth.get(d), 3) for d in depths])
    return table(["model", "prefill"] + [depth(d) for d in depths], rows)


def probe_protocol_table(sweeps: list[tuple[str, dict]]) -> str:
    rows = []
    for (model, prefill), found in _groups(sweeps).items():
        rows.append(
            [
                model,
                prefill,
                span([r["control_accuracy"] for r in found], 2),
                span([r["selectivity"] for r in found], 2),
                f"{sum(bool(r['converged']) for r in found)} of {len(found)}",
                same_or_span([r["n_train"] for r in found], 0),
                same_or_span([r["n_test"] for r in found], 0),
            ]
        )
    return table(["model", "prefill", "control accuracy", "selectivity", "probes converged", "n_train", "n_test"], rows)


def probes_page(results: Path) -> str:
    sweeps = [(path.name, read(results, path.name)) for path in sorted(results.glob("probe_*.json"))]
    targets: dict[str, list[tuple[str, dict]]] = {}
    for name, sweep in sweeps:
        targets.setdefault(sweep["target"], []).append((name, sweep))
    body = [
        "Depth 0 is `blocks.0.hook_resid_pre` (under recurrent prefill: the fused input); depth d is the",
        "output of block d-1. Each regime's last pass is probed.",
    ]
    for target, group in targets.items():
        rows = [row for _, sweep in group for row in sweep["rows"]]
        n_test = sorted({row["n_test"] for row in rows})
        tasks = sorted({sweep["task"] for _, sweep in group})
        sequences = sorted({sweep["n_sequences"] for _, sweep in group})
        body += [
            "",
            f"## `{target}` (task {', '.join(f'`{t}`' for t in tasks)})",
            "",
            f"Held-out sequences: {', '.join(map(str, sequences))}; chance (majority class): "
            f"{span([row['chance'] for row in rows], 3)}; test positions: {', '.join(map(str, n_test))} "
            f"(standard error of an accuracy at 0.5: {math.sqrt(0.25 / min(n_test)):.3f}).",
            "",
            "Accuracy by depth:",
            "",
            probe_table(group).rstrip("\n"),
            "",
            "Control task (a fixed random label per token type), selectivity (accuracy - control accuracy),",
            "each as the range over depths, and how many of the chosen probes converged:",
            "",
            probe_protocol_table(group).rstrip("\n"),
        ]
    capacity = [(path.name, read(results, path.name)) for path in sorted(results.glob("capacity_*.json"))]
    if capacity:
        body += capacity_section(capacity)
    figures = [figure for name, sweep in sweeps for figure in figures_of(name, sweep)]
    return frame("Layer-0 probe study on the CPU zoo (measured)", sweeps + capacity, "\n".join(body), figures, results)


def capacity_section(sweeps: list[tuple[str, dict]]) -> list[str]:
    """Online-code compression and rank-1 probes by depth, per target and prefill regime."""
    body = [
        "",
        "## Capacity-controlled measures: online-code MDL and rank-limited probes",
        "",
        "On the retrained `fbt` that the dynamics page studies (not the model of the tables above).",
        "Compression = uniform-code bits / online-code bits of the training split's labels (1 = the",
        "activations tell nothing; the layer-0 standard row is the token embedding, the token-only",
        "reference); the control labels are a function of the token, so their compression measures how",
        "readable token identity is. Rank 1: accuracy of a logistic probe on the one direction that",
        "keeps most of the full probe's logits, real / control.",
    ]
    for _, sweep in sweeps:
        groups: dict[str, list[dict]] = {}
        for row in sweep["rows"]:
            groups.setdefault(prefill_label(row), []).append(row)
        depths = sorted({row["layer"] for row in sweep["rows"]})
        by = lambda rows, f: {row["layer"]: f(row) for row in rows}
        first_rank = lambda row: row["rank_sweep"][0] if row.get("rank_sweep") else None
        rows = []
        for prefill, found in groups.items():
            comp = by(found, lambda r: r.get("compression"))
            control = by(found, lambda r: r.get("control_compression"))
            rank = by(found, first_rank)
            rows.append([prefill, "compression"] + [fixed(comp.get(d), 2) for d in depths])
            rows.append([prefill, "control compression"] + [fixed(control.get(d), 1) for d in depths])
            rows.append(
                [prefill, "rank 1: real / control"]
                + [f"{rank[d]['accuracy']:.3f} / {rank[d]['control_accuracy']:.3f}" if rank.get(d) else "" for d in depths]
            )
        chance = span([row["chance"] for row in sweep["rows"]], 3)
        body += [
            "",
            f"### `{sweep['target']}` (task `{sweep['task']}`; {sweep['n_sequences']} held-out sequences; chance {chance})",
            "",
            table(["prefill", "measure"] + [depth(d) for d in depths], rows).rstrip("\n"),
        ]
    return body


# ---------------------------------------------------------------- dynamics


def fixed_points_cell(entries: list[dict]) -> str:
    cells = []
    for entry in entries:
        missed = entry.get("unconverged")
        tail = ""
        if missed and missed["n"]:
            low, _, high = missed["residual_quantiles"]
            tail = (
                f"; {missed['n']} start{'s' if missed['n'] > 1 else ''} did not converge (residual {sci(low)} to {sci(high)},"
                f" {missed['still_improving']} still improving after {entry['iterations']} iterations)"
            )
        if not entry["points"]:
            cells.append(f"step {entry['step']}: none converged ({entry['n_converged']} of {entry['n_starts']} starts){tail}")
            continue
        points = "; ".join(
            f"{p.get('label', 'stable' if p['stable'] else 'unstable')} (rho {p['spectral_radius']:.2f}, reached from "
            f"{p['n_starts']} of {entry['n_starts']} starts, distance to the rollout state "
            f"{p['distance_to_rollout_state']:.1f})"
            for p in entry["points"]
        )
        count = len(entry["points"])
        cells.append(f"step {entry['step']}: {count} point{'s' if count > 1 else ''}, {points}{tail}")
    return " / ".join(cells)


def dynamics_table(summary: dict) -> str:
    runs = summary["runs"]
    first = next(iter(runs.values()))
    horizons = sorted(first["lyapunov"], key=float)
    steps = [str(s["step"]) for s in first["spectra"]]
    ks = range(2, len(first["kpass_relative_residual"]) + 1)
    quantities: list[tuple[str, Callable[[dict], str]]] = [
        (
            "finite-time Lyapunov lambda(T) from the perturbation, T = " + " / ".join(horizons),
            lambda r: " / ".join(small(r["lyapunov"][t]) for t in horizons),
        ),
        *(
            [
                (
                    "leading Lyapunov exponent from tangent vectors through F_t (context frozen), lambda_1(T), T = "
                    + " / ".join(horizons),
                    lambda r: " / ".join(small(r["lyapunov_tangent"][t][0]) for t in horizons),
                ),
                (
                    f"leading {len(first['lyapunov_tangent'][horizons[-1]])} exponents at T = {horizons[-1]} (tangent)",
                    lambda r: ", ".join(small(v) for v in r["lyapunov_tangent"][horizons[-1]]),
                ),
            ]
            if "lyapunov_tangent" in first
            else []
        ),
        *(
            [
                (
                    "the same through the whole decoding step (tangent in the cache too), T = " + " / ".join(horizons),
                    lambda r: " / ".join(small(r["lyapunov_tangent_full"][t][0]) for t in horizons),
                ),
                (
                    f"leading {len(first['lyapunov_tangent_full'][horizons[-1]])} exponents at T = {horizons[-1]} (whole step)",
                    lambda r: ", ".join(small(v) for v in r["lyapunov_tangent_full"][horizons[-1]]),
                ),
            ]
            if first.get("lyapunov_tangent_full")
            else []
        ),
        ("smallest perturbation ratio (step)", lambda r: f"{sci(r['min_ratio'])} ({r['argmin_ratio_step']})"),
        ("first step the ratio is back above 1", lambda r: str(r["first_step_ratio_above_1"])),
        ("ratio at the last step (horizon)", lambda r: f"{sci(r['final_ratio'])} ({r['horizon']})"),
        ("largest ratio", lambda r: sci(r["max_ratio"])),
        ("window slid at steps", lambda r: ", ".join(map(str, r["slid_at"]))),
        (
            "spectral radius of dF/dh at steps " + ", ".join(steps),
            lambda r: ", ".join(fixed(s["spectral_radius"], 2) for s in r["spectra"]),
        ),
        ("spectral norm of dF/dh at the same steps", lambda r: ", ".join(fixed(s["spectral_norm"], 2) for s in r["spectra"])),
        ("mean state norm", lambda r: fixed(r["state_norm_mean"], 1)),
        ("fixed points", lambda r: fixed_points_cell(r["fixed_points"])),
        (
            "K-pass relative residual, K = " + ", ".join(map(str, ks)),
            lambda r: ", ".join(fixed(v, 3) for v in r["kpass_relative_residual"][1:]),
        ),
        (
            "K-pass KL between successive passes, K = " + ", ".join(map(str, ks)),
            lambda r: ", ".join(sci(v) for v in r["kpass_kl"][1:]),
        ),
    ]
    return table(
        [""] + [f"`{name}`" for name in runs], [[label] + [cell(run) for run in runs.values()] for label, cell in quantities]
    )


def dynamics_page(results: Path) -> str:
    name = "dynamics_cpu_summary.json"
    summary = read(results, name)
    body = [
        "## Stability of the feedback map",
        "",
        "Perturbation ratio = ||dh_t|| / ||dh_t0|| between the rollout and its perturbed copy (a finite",
        "perturbation of 1e-3: the nonlinear measure, with a round-off floor); tangent exponents: Benettin's",
        "method, k tangent vectors pushed forward by forward-mode derivatives and re-orthonormalised (no floor),",
        "through each step's feedback map F_t (the context frozen) and through the whole decoding step (the",
        "tangent also in the cached keys and values: the linearisation of the perturbation curve).",
        "Fixed points: damped Newton with the exact Jacobian from each start independently; labels from the",
        "eigenvalues of dF/dh (stable, marginal within 1e-3 of the unit circle, saddle, unstable).",
        "",
        dynamics_table(summary),
        "## Figures",
        "",
        "None committed. The study's figures (`rollout.png`, `spectra.png`, `fixed_points.png`, `kpass.png`) are",
        "drawn from the per-step curves and rollout states in its own `dynamics.json` and `states.safetensors`, which",
        "this folder does not keep (the summary keeps what the table shows); `workbench dynamics` draws them into its",
        "output directory.",
    ]
    return frame(
        "Feedback-map stability on the CPU zoo (measured)", [(name, summary)], "\n".join(body), figures_of(name, summary), results
    )


# ---------------------------------------------------------------- traces


def _label(group: str) -> str:
    model, _, regime = group.partition("/")
    return f"`{model}` {regime}"


def _group_order(summary: dict) -> list[str]:
    order = [summary["reference"]] + list(summary.get("timing", {})) + list(summary["groups"])
    return [g for g in dict.fromkeys(order) if g in summary["groups"]]


def traces_table(summary: dict) -> str:
    reference = summary["reference"]
    rows = []
    for group in _group_order(summary):
        g = summary["groups"][group]
        paired = summary["paired"].get(f"{group} - {reference}")
        timing = summary.get("timing", {}).get(group)
        rows.append(
            [
                _label(group),
                fixed(g["mean_trace"], 1),
                fixed(g["median_trace"], 1),
                fixed(g["accuracy"], 3),
                f"{g['unfinished']:.3g}",
                interval(paired["trace_tokens"], 1) if paired else "",
                interval(paired["accuracy"], 3) if paired else "",
                f"{timing['problems_per_s']:.0f}" if timing else "",
            ]
        )
    ref = reference.replace("/", " ")
    return table(
        [
            "model/regime",
            "mean trace tokens",
            "median",
            "accuracy",
            "unfinished",
            f"length vs {ref}",
            f"accuracy vs {ref}",
            "problems/s",
        ],
        rows,
    )


def traces_difficulty_table(summary: dict) -> str:
    rows = [
        [
            _label(group),
            str(d),
            str(s["n"]),
            fixed(s["mean_trace"], 1),
            fixed(s["median_trace"], 1),
            fixed(s["accuracy"], 3),
            f"{s['unfinished']:.3g}",
        ]
        for group in _group_order(summary)
        for d, s in summary["groups"][group]["by_difficulty"].items()
    ]
    return table(["model/regime", "difficulty", "problems", "mean trace tokens", "median", "accuracy", "unfinished"], rows)


def traces_matched_table(summary: dict) -> str:
    groups = _group_order(summary)
    bins = list(summary["groups"][groups[0]]["accuracy_at_matched_length"])
    rows = [
        [_label(group)]
        + [
            f"{cell['accuracy']:.3f} ({cell['n']})" if cell else ""
            for cell in (summary["groups"][group]["accuracy_at_matched_length"].get(b) for b in bins)
        ]
        for group in groups
    ]
    return table(["model/regime"] + [f"trace tokens {b}" for b in bins], rows)


def traces_page(results: Path) -> str:
    name = "traces_cpu_summary.json"
    summary = read(results, name)
    levels = sorted({stat["level"] for pair in summary["paired"].values() for stat in pair.values()})
    seconds = sum(t["seconds"] for t in summary.get("timing", {}).values())
    body = [
        "## Trace length and accuracy",
        "",
        f"{summary['n_problems']} `{summary['task']}` problems, difficulties "
        f"{', '.join(map(str, summary['difficulties']))}; `fused` with a {summary['passes']}-pass prefill. Paired",
        f"differences against `{summary['reference']}` on the same problems, with "
        f"{', '.join(f'{level:.0%}' for level in levels)} percentile-bootstrap intervals.",
        f"Generation time, all model/regimes: {seconds:.0f} s.",
        "",
        traces_table(summary),
        "## By difficulty",
        "",
        traces_difficulty_table(summary),
        "## Accuracy at matched length",
        "",
        "Accuracy (problems) within shared trace-length bins.",
        "",
        traces_matched_table(summary),
        "## Figures",
        "",
        "None committed. The study's `traces.png` is drawn from its per-problem rows (`traces.csv`), which this",
        "folder does not keep (the summary keeps what the tables show); `workbench traces` draws it into its output",
        "directory.",
    ]
    return frame(
        "Trace lengths on the CPU zoo (measured)", [(name, summary)], "\n".join(body), figures_of(name, summary), results
    )


# ---------------------------------------------------------------- bench


def bench_ratio(entry: dict) -> str:
    ratio = entry["ratio"]
    if ratio is None:  # a key not measured where the bench ran; entry["skipped"] says why
        return "skipped"
    if entry.get("unit"):
        return f"{ratio:.0f} {entry['unit']}"
    return f"{ratio:.3f}" if abs(ratio - 1) < 0.1 else f"{ratio:.3g}"


def bench_target(entry: dict) -> str:
    target = entry.get("target")
    if target is None:
        return "reported"
    if entry.get("unit"):
        op, _, value = target.partition(" ")
        return f"{op} {float(value):g} {entry['unit']}"
    return target


def bench_what(entry: dict, reps: int) -> str:
    if entry.get("skipped"):
        return entry["skipped"]
    if "a" in entry and "b" in entry:
        a, b = entry["a"], entry["b"]
        if "achieved_gflops" in entry:
            what = f"{entry['achieved_gflops']:.0f} GFLOP/s {b['what']} vs {entry['matmul_gflops']:.0f} GFLOP/s {a['what']}"
        else:
            what = f"{b['what']} / {a['what']} ({b['median_s']:#.3g} s vs {a['median_s']:#.3g} s)"
    elif isinstance(entry.get("runs"), list):  # one process per size: peak memory at each
        what = " vs ".join(f"{run['peak_rss_mib']:.0f} MiB at {run['tokens']:,} tokens" for run in reversed(entry["runs"]))
    else:
        what = ", ".join(
            text.format(entry[key]) for key, text in (("positions", "{:,} positions"), ("seconds", "{:g} s")) if key in entry
        )
    extras = [entry["note"]] if entry.get("note") else []
    if "same_tokens" in entry:
        extras.append(f"same tokens: {'yes' if entry['same_tokens'] else '**no**'}")
    if "max_abs_logit_diff" in entry:
        extras.append(f"max abs logit difference {sci(entry['max_abs_logit_diff'])}")
    for other in ("eager", "static", "compiled"):  # the same pair on another decoding engine, timed in the same interleave
        if isinstance(entry.get(other), dict) and "ratio" in entry[other]:
            extras.append(f"{other} engine: {bench_ratio(entry[other])}")
    if entry.get("reps") not in (None, reps):
        extras.append(f"{entry['reps']} pairs")
    return "; ".join([what] + extras)


def bench_table(bench: dict) -> str:
    rows = []
    for entry in bench["entries"]:
        spread = entry.get("spread")
        met = {True: "yes", False: "**no**", None: ""}[entry.get("met")]
        rows.append(
            [
                f"`{entry['key']}`",
                bench_ratio(entry),
                f"{spread[0]:.2f}-{spread[1]:.2f}" if spread else "",
                bench_target(entry),
                met,
                bench_what(entry, bench.get("reps")),
            ]
        )
    return table(["key", "ratio (median)", "spread", "target", "met", "what was timed (numerator / denominator)"], rows)


BENCH_HEADINGS = {"bench_smollm2.json": "Pretrained SmolLM2-135M-Instruct against transformers and TransformerBridge"}


def bench_page(results: Path) -> str:
    names = [
        name
        for name in ("bench_small.json", "bench_tiny.json", "bench_smollm2.json")
        if name == "bench_small.json" or (results / name).is_file()
    ]
    benches = [(name, read(results, name)) for name in names]
    body = []
    for name, bench in benches:
        body += [
            f"## {BENCH_HEADINGS.get(name, 'Ratios')}, `{bench.get('preset', '?')}` preset",
            "",
            "Each pair timed interleaved in one process; ratio = median of the per-pair ratios, spread = their",
            f"min and max; {bench.get('reps')} pairs unless the row says otherwise.",
            "",
            bench_table(bench),
            "",
        ]
    shown_presets = list(dict.fromkeys(f"`{bench.get('preset', '?')}`" for _, bench in benches))
    presets = " and ".join(shown_presets)
    return frame(
        f"Benchmarks, {presets} presets (measured)" if len(shown_presets) > 1 else f"Benchmarks, {presets} preset (measured)",
        benches,
        "\n".join(body),
        [f for name, bench in benches for f in figures_of(name, bench)],
        results,
    )


# ---------------------------------------------------------------- pretrained


def pretrained_traces_table(studies: list[dict]) -> str:
    rows = []
    for summary in studies:
        for key, g in summary["groups"].items():
            rows.append(
                [
                    f"`{summary['task'].split(':')[0]}`",
                    f"`{key}`",
                    str(g["n"]),
                    fixed(g["accuracy"], 3),
                    fixed(g["answered"], 3),
                    fixed(g["accuracy_last_number"], 3),
                    fixed(g["unfinished"], 3),
                    fixed(g["mean_trace"], 1),
                    fixed(g["mean_trace_chars"], 1),
                    fixed(summary["timing"][key]["problems_per_s"], 2),
                ]
            )
    return table(
        [
            "task",
            "run/regime",
            "problems",
            "accuracy (#### rule)",
            "wrote ####",
            "last number right",
            "unfinished",
            "mean trace (tokens)",
            "mean trace (characters)",
            "problems/s",
        ],
        rows,
    )


def pretrained_difficulty_table(summary: dict) -> str:
    rows = [
        [f"`{key}`", d, str(v["n"]), fixed(v["accuracy"], 3), fixed(v["unfinished"], 3), fixed(v["mean_trace"], 1)]
        for key, g in summary["groups"].items()
        for d, v in g["by_difficulty"].items()
    ]
    return table(["run/regime", "steps", "problems", "accuracy", "unfinished", "mean trace (tokens)"], rows)


def pretrained_page(results: Path) -> str:
    imported = read(results, "smollm2_import.json")
    chain, gsm8k = read(results, "smollm2_traces_chain.json"), read(results, "smollm2_traces_gsm8k.json")
    probe = read(results, "smollm2_probe_value.json")
    model, parity = imported["model"], imported["source"]["parity"]
    instruction = chain["chat"]["instruction"] if chain.get("chat") else None
    body = [
        "## The imported model",
        "",
        table(
            ["d_model", "layers", "heads (key/value)", "d_mlp", "vocabulary", "context", "tied", "source sha256"],
            [
                [
                    str(model["d_model"]),
                    str(model["n_layers"]),
                    f"{model['n_heads']} ({model['n_kv_heads']})",
                    str(model["d_mlp"]),
                    f"{model['d_vocab']:,}",
                    f"{model['n_ctx']:,}",
                    str(model["tie_embeddings"]).lower(),
                    f"`{imported['source']['sha256'][:16]}...`",
                ]
            ],
        ),
        f"Parity with `transformers` (recorded by the import, fp32, {parity['text_tokens']} tokens of text): "
        f"max |logit difference| {sci(parity['max_abs_logit_diff'])}, greedy next tokens "
        f"{'identical at every position' if parity['argmax_agree'] else 'different'}.",
        "",
        "## Trace studies (chat format)",
        "",
        f"Every problem is a user turn of the model's chat template: the question and the instruction {instruction!r}"
        if instruction
        else "Completion format.",
        "The `####` rule is GSM8K's; `last number right` is a lenient diagnostic (the last number of the text is the answer).",
        "",
        pretrained_traces_table([chain, gsm8k]),
        "### By difficulty: `chain` (steps of the problem)",
        "",
        pretrained_difficulty_table(chain),
        "### By difficulty: GSM8K (`<<...>>` steps of the reference solution)",
        "",
        pretrained_difficulty_table(gsm8k),
        f"## Probe: the `{probe['target']}` label of `{probe['task']}` ({probe['n_sequences']} held-out sequences)",
        "",
        table(
            ["hook", "accuracy", "chance", "control accuracy", "selectivity", "train / test rows"],
            [
                [
                    f"`{r['hook']}`",
                    fixed(r["accuracy"], 3),
                    fixed(r["chance"], 3),
                    fixed(r["control_accuracy"], 3),
                    small(r["selectivity"]),
                    f"{r['n_train']} / {r['n_test']}",
                ]
                for r in probe["rows"]
            ],
        ),
    ]
    sources = ["smollm2_import.json", "smollm2_traces_chain.json", "smollm2_traces_gsm8k.json", "smollm2_probe_value.json"]
    return frame(
        "SmolLM2-135M-Instruct, imported (measured)", [(n, read(results, n)) for n in sources], "\n".join(body), [], results
    )


def curve_rows(curve: list[dict], keys: list[str], every: int = 5) -> list[list[str]]:
    last = curve[-1]["step"]
    return [
        [str(r["step"])] + [fixed(r.get(k), 3) for k in keys] for r in curve if r["step"] in (1, last) or r["step"] % every == 0
    ]


def cpt_eval_table(runs: dict) -> str:
    rows = []
    for name, run in runs.items():
        for row in run["eval"]["tasks"].values():
            for regime, accuracy in row["accuracy"].items():
                rows.append(
                    [
                        f"`{name}`",
                        str(row["n"]),
                        fixed(row["loss"]["standard"], 3),
                        fixed(row["loss"].get("recurrent"), 3),
                        f"`{regime}`",
                        fixed(row["answer_loss"][regime], 3),
                        fixed(accuracy, 3),
                    ]
                )
    return table(
        ["run", "held-out problems", "loss (plain)", "loss (recurrent)", "regime", "answer loss", "accuracy (#### rule)"], rows
    )


def cpt_page(results: Path) -> str:
    cpt, flops = read(results, "smollm2_cpt.json"), read(results, "smollm2_cpt_flops.json")
    corpus, fbt, hd, control = cpt["corpus"], cpt["runs"]["fbt"], cpt["runs"]["hd"], cpt["runs"]["baseline"]
    memory = cpt["train_step_memory"]
    commands = cpt["runs"]["commands"] + cpt["runs"]["control_commands"] + cpt["resume"]["commands"] + memory["commands"]
    body = [
        "## The corpus",
        "",
        table(
            ["split", "documents", "tokens"],
            [[name, f"{split['documents']:,}", f"{split['tokens']:,}"] for name, split in corpus.items()],
        ),
        "## Training at batch 4 x 256: peak resident memory of the whole process",
        "",
        "Each row is its own 3-step `workbench train` process: the checkpoint loaded, the model, gradients, AdamW's two",
        "moments (made by the first step) and a step's activations; the peak after steps 1, 2 and 3 shows the moments",
        "arriving. tokens/s: the third step, on a shared 2-core machine.",
        "",
        table(
            ["arch", "activation checkpointing", "peak RSS after steps 1, 2, 3 (MiB)", "tokens/s"],
            [
                [
                    f"`{r['arch']}`",
                    "yes" if r["checkpoint_blocks"] else "no",
                    ", ".join(f"{v:,.0f}" for v in r["peak_rss_mib_by_step"]),
                    fixed(r["tokens_per_s"], 1),
                ]
                for r in memory["rows"]
            ],
        ),
        "## Before training (`init.json`, step 0's batch)",
        "",
        "The `fbt` row's losses skip each window's first position, which has no previous state to fuse (so its plain",
        "and fused losses score the same positions); the `hd` and control rows score every position, as the curves'",
        "step 1 does.",
        "",
        table(
            ["run", "loss, plain inputs", "loss, every position after the first fused", "fusion init", "fit R^2 (positions)"],
            [
                [
                    "`fbt`",
                    fixed(fbt["init"]["loss_plain"], 3),
                    fixed(fbt["init"]["loss_fused"], 3),
                    f"`{fbt['init']['fusion_init']}`",
                    f"{fixed(fbt['init']['fusion_fit']['r2'], 3)} ({fbt['init']['fusion_fit']['positions']:,})",
                ],
                ["`hd` (n=2)", fixed(hd["init"]["loss_plain"], 3), "", "", ""],
                ["`baseline` (the control)", fixed(control["init"]["loss_plain"], 3), "", "", ""],
            ],
        ),
        f"## Loss curves ({cpt['steps']} steps; every 5th step)",
        "",
        "### FBT (`loss` = pass 1 + pass 2 (+ pass 3 on a 3-pass step))",
        "",
        table(
            ["step", "loss", "pass 1 (plain)", "pass 2 (fused)", "passes"],
            curve_rows(fbt["curve"], ["loss", "loss_pass1", "loss_pass2", "passes"]),
        ),
        "### HD, n=2 streams",
        "",
        table(["step", "loss"], curve_rows(hd["curve"], ["loss"])),
        "### The control: plain continued pretraining of the baseline on the same batches",
        "",
        table(["step", "loss"], curve_rows(control["curve"], ["loss"])),
        "## Held-out eval (`workbench eval RUN --n 32`: the corpus's held-out GSM8K documents)",
        "",
        cpt_eval_table(
            {"smollm2 (before CPT)": cpt["runs"]["baseline_before_cpt"], "baseline CPT": control, "fbt": fbt, "hd": hd}
        ),
        "## Resume",
        "",
        f"FBT, {cpt['resume']['steps']} steps in one process against 2 steps, stop, resume, 2 more "
        f"({cpt['resume']['threads']} thread): {cpt['resume']['tensors']} tensors, "
        f"{'identical bit for bit' if cpt['resume']['identical'] else 'max |difference| ' + sci(cpt['resume']['max_abs_diff'])}.",
        "",
        "## Commands (recorded in the JSON, with their wall time)",
        "",
        table(["command", "seconds"], [[code(c["command"]), fixed(c["seconds"], 1)] for c in commands]),
        f"## Training FLOPs per token and one H200 (assumed MFU {flops['assumed_mfu']})",
        "",
        f"Counted by torch on one step at T={flops['counted_seq_len']} (every matmul; the fused attention kernel is added by",
        "formula, 12 L d_model T per token per pass or stream). H200 SXM bf16 dense peak "
        f"{flops['h200_bf16_dense_flops'] / 1e12:.0f} TFLOP/s.",
        "",
        table(
            ["arch", "matmul GFLOP/token", "recipe", "tokens", "T", "batch", "steps", "PFLOP", "H200 time"],
            [
                [
                    f"`{arch}`",
                    fixed(row["matmul_flops_per_token"] / 1e9, 3),
                    f"`{name}`",
                    f"{r['tokens']:,}",
                    str(r["seq_len"]),
                    str(r["batch"]),
                    f"{r['steps']:,}",
                    fixed(r["flops"] / 1e15, 1),
                    f"{r['h200_hours'] * 60:.1f} min",
                ]
                for arch, row in flops["archs"].items()
                for name, r in row["recipes"].items()
            ],
        ),
    ]
    sources = ["smollm2_cpt.json", "smollm2_cpt_flops.json"]
    return frame(
        "SmolLM2-135M-Instruct, continued pretraining on GSM8K (measured)",
        [(n, read(results, n)) for n in sources],
        "\n".join(body),
        [],
        results,
    )


# ---------------------------------------------------------------- figures and screenshots

FIGURES_MANIFEST = "figures.json"  # beside the figures in docs/results
SCREENSHOTS = ROOT / "docs" / "app"
SCREENSHOTS_MANIFEST = "screenshots.json"  # beside the screenshots; tests/integration/test_browser.py writes both
FIGURES_COMMAND = f"{SCRIPT} --figures"
# The browser test shoots every page of the app, in this order, over a copy of the quick zoo.
SCREENSHOT_PAGES = ("runs", "zoo", "probes", "sae", "dynamics", "traces", "streams", "playground")
SCREENSHOTS_COMMAND = (
    "WORKBENCH_SCREENSHOTS=docs/app WORKBENCH_BROWSER_RUNS=runs/quick WORKBENCH_REQUIRE_BROWSER=1 "
    ".venv/bin/python -m pytest tests/integration/test_browser.py -k every_page"
)
# What draws a screenshot: the pages and their charts, the regime palette, and the test that drives the
# browser (what it clicks and the viewport). The workbench functions behind the numbers a page shows are
# not counted: a screenshot shows a page, not a study's result.
SCREENSHOT_CODE = ("app", "workbench/runtime/palette.py", "tests/integration/test_browser.py")


class FigureSpec(NamedTuple):
    """A committed figure: the JSON files in docs/results it is drawn from, the code that draws it
    (repository paths: what the check's commit rule watches), what the drawing call takes besides
    the data (made from the data; recorded and compared), and the call."""

    data: tuple[str, ...]
    code: tuple[str, ...]
    args: Callable[[Path], dict]
    draw: Callable[[Path, Path, dict], object]


def probe_sweep_figure(name: str) -> FigureSpec:
    """A probe sweep's figure as ``workbench probe`` draws it (``plot_probe_rows``: its size, dpi,
    ticks and palette), from the sweep's committed rows."""

    def args(results: Path) -> dict:
        sweep = read(results, name)
        return {"title": f"{Path(sweep['run']).name}: probing {sweep['target']}", "arch": sweep.get("arch")}

    def draw(results: Path, path: Path, args: dict):
        from workbench.probing.study import plot_probe_rows

        return plot_probe_rows(read(results, name)["rows"], path, args["title"], args["arch"])

    return FigureSpec((name,), ("workbench/probing/study.py", "workbench/runtime/palette.py"), args, draw)


FIGURES: dict[str, FigureSpec] = {"probe_fbt_memory.png": probe_sweep_figure("probe_fbt_memory.json")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def git_checkout(repo: Path) -> bool:
    """Whether ``repo`` is the top of a git work tree (and git runs)."""
    try:
        top = git(repo, "rev-parse", "--show-toplevel")
    except OSError:
        return False
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == repo.resolve()


def record_drawing(code: Iterable[str], repo: Path = ROOT) -> dict:
    """What to record of a figure drawn now: HEAD's commit, and which of the ``code`` paths differ
    from it (changed, staged or untracked files under them); a figure drawn from those is not drawn
    from the commit, and the check says so until it is redrawn from a commit that has them."""
    code = list(code)
    head = git(repo, "rev-parse", "HEAD")
    if head.returncode != 0:
        raise RuntimeError(f"{repo}: no commit to record a drawing against ({head.stderr.strip()})")
    changed = git(repo, "diff", "--name-only", "HEAD", "--", *code).stdout.split("\n")
    untracked = git(repo, "ls-files", "--others", "--exclude-standard", "--", *code).stdout.split("\n")
    return {"commit": head.stdout.strip(), "uncommitted": sorted({p for p in changed + untracked if p})}


def commit_problems(name: str, entry: dict, code: list[str], command: str, repo: Path) -> list[str]:
    """The commit rule: ``name`` was drawn at ``entry['commit']``, a commit of HEAD's history, from
    committed code, and no later commit changed the ``code`` that draws it."""
    redraw = f"run `{command}` and commit the result"
    if entry.get("uncommitted"):
        return [f"{name} was drawn from uncommitted changes to {', '.join(entry['uncommitted'])}: commit them, then {redraw}"]
    commit = entry.get("commit")
    if not isinstance(commit, str) or git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return [f"{name}: its recorded commit {commit!r} is not in this repository: {redraw}"]
    if git(repo, "merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        return [f"{name} was drawn at {commit[:10]}, which is not in HEAD's history: {redraw}"]
    last = git(repo, "log", "-1", "--format=%H", "HEAD", "--", *code).stdout.strip()
    if last and git(repo, "merge-base", "--is-ancestor", last, commit).returncode != 0:
        later = git(repo, "log", "--format=%h", f"{commit}..HEAD", "--", *code).stdout.split()
        return [
            f"{name} is stale: drawn at {commit[:10]}, and the code that draws it ({', '.join(code)}) changed "
            f"since, in {', '.join(later)}: {redraw}"
        ]
    return []


def drawing_problems(
    folder: Path,
    manifest: str,
    expected: dict[str, dict],
    command: str,
    repo: Path | None,
) -> list[str]:
    """Everything wrong with the PNGs in ``folder`` against their ``manifest``: ``expected`` gives,
    per PNG that must be there, the ``code`` that draws it and any other recorded field that must
    equal what it is now (a figure's data hashes and drawing arguments). A PNG with no record, or a
    record with no PNG or another PNG's bytes, fails; ``repo`` None skips the commit rule."""
    path = folder / manifest
    entries = json.loads(path.read_text()) if path.is_file() else {}
    problems = []
    pngs = sorted(p.name for p in folder.glob("*.png"))
    for name in sorted(set(pngs) | set(entries) | set(expected)):
        shown_name = shown(folder / name)
        if name not in expected:
            what = "" if name in pngs else f", named in {shown(path)},"
            problems.append(
                f"{shown_name}{what} is not drawn by anything that records it: remove it, or draw it by code that does"
            )
            continue
        if name not in entries:
            problems.append(f"{shown_name} has no record in {shown(path)}: run `{command}`")
            continue
        if name not in pngs:
            problems.append(f"{shown_name}, recorded in {shown(path)}, is missing: run `{command}`")
            continue
        entry, want = entries[name], expected[name]
        if entry.get("sha256") != sha256(folder / name):
            problems.append(f"{shown_name} is not the file {shown(path)} records (sha256 differs): run `{command}`")
            continue
        differs = [key for key, value in want.items() if entry.get(key) != value]
        if differs:
            problems.append(f"{shown_name} was drawn with other {', '.join(differs)} than now: run `{command}`")
            continue
        if repo is not None:
            problems += commit_problems(shown_name, entry, list(want["code"]), command, repo)
    return problems


def expected_figures(results: Path) -> dict[str, dict]:
    return {
        name: {
            "code": list(spec.code),
            "data": {data: sha256(results / data) for data in spec.data},
            "args": spec.args(results),
        }
        for name, spec in FIGURES.items()
    }


def draw_figures(results: Path = RESULTS, repo: Path = ROOT) -> list[Path]:
    """Draw every figure of ``FIGURES`` into ``results`` with the current drawing code, and record
    each (``figures.json``)."""
    import matplotlib

    entries = {}
    for name, spec in FIGURES.items():
        drawing = record_drawing(spec.code, repo)  # before drawing: the code a figure is drawn with
        args = spec.args(results)
        spec.draw(results, results / name, args)
        entries[name] = {
            **drawing,
            "code": list(spec.code),
            "data": {data: sha256(results / data) for data in spec.data},
            "args": args,
            "matplotlib": matplotlib.__version__,
            "command": FIGURES_COMMAND,
            "sha256": sha256(results / name),
        }
    (results / FIGURES_MANIFEST).write_text(json.dumps(entries, indent=1) + "\n")
    return [results / name for name in entries]


def figure_and_screenshot_problems(results: Path, screenshots: Path | None, repo: Path) -> list[str]:
    """``--check``'s figures part: the result figures in ``results`` and (unless None) the app's
    screenshots; the commit rule where ``repo`` is a git checkout with its history."""
    checked: Path | None = repo
    if not git_checkout(repo):
        print(f"{repo} is not a git checkout: the commits figures were drawn at are not checked", file=sys.stderr)
        checked = None
    elif git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return [f"{repo} is a shallow clone: the commits figures were drawn at cannot be checked (git fetch --unshallow)"]
    problems = drawing_problems(results, FIGURES_MANIFEST, expected_figures(results), FIGURES_COMMAND, checked)
    if screenshots is not None:
        expected = {f"{page}.png": {"code": list(SCREENSHOT_CODE)} for page in SCREENSHOT_PAGES}
        problems += drawing_problems(screenshots, SCREENSHOTS_MANIFEST, expected, SCREENSHOTS_COMMAND, checked)
    return problems


# ---------------------------------------------------------------- index and driver

PAGES: dict[str, tuple[str, Callable[[Path], str]]] = {
    "zoo.md": ("the earlier reference zoo (one seed): accuracy, losses, train time", zoo_page),
    "zoo_seeds.md": ("the reference zoo at three seeds: accuracy with intervals, competence, time", zoo_seeds_page),
    "zoo_quick.md": (
        "the earlier quick first-run zoo (before the organisms): accuracy, competence, time",
        lambda r: zoo_seeds_page(r, "zoo_quick.json"),
    ),
    **{
        f"zoo_org_{task}.md": (
            f"the {task} organism's zoo at five seeds: accuracy with intervals, competence, time",
            lambda r, task=task: zoo_seeds_page(r, f"zoo_org_{task}.json"),
        )
        for task in ("flipflop", "perm", "addition")
    },
    "study_data_efficiency.md": (
        "FBT data efficiency: validation loss and the baseline's token ratio across seeds",
        data_efficiency_page,
    ),
    "study_three_pass.md": (
        "FBT's stability knob: K-pass residual, Lyapunov exponents, regrowth and accuracy by 3-pass fraction",
        three_pass_page,
    ),
    "study_hd_ablations.md": (
        "Hidden Decoding's ablations: accuracy, loss jumps at expansion and step cost by member, paired by seed",
        hd_ablations_page,
    ),
    "study_fbt_vs_baseline.md": (
        "FBT against the baseline on modsum: matched initialisation, per-architecture tuning, Holm-corrected family",
        fbt_vs_baseline_page,
    ),
    "study_fbt_vs_baseline_flipflop.md": (
        "FBT against the baseline on flip-flop, the same study",
        lambda r: fbt_vs_baseline_page(r, "study_fbt_vs_baseline_flipflop.json"),
    ),
    "zoo_analyses.md": ("the three-seed zoo's probes, dynamics and traces, each reading across seeds", seed_readings_page),
    "probes.md": ("the layer-0 probe study", probes_page),
    "dynamics.md": ("feedback-map stability", dynamics_page),
    "traces.md": ("trace lengths", traces_page),
    "bench.md": ("speed ratios", bench_page),
    "pretrained.md": ("SmolLM2-135M-Instruct imported: parity, traces, a probe", pretrained_page),
    "cpt.md": ("SmolLM2-135M-Instruct continued on GSM8K as FBT and HD: memory, curves, eval, FLOPs", cpt_page),
}


def layer0_probes_page(results: Path, name: str) -> str:
    """The ``probes`` study (``workbench.experiments.comparisons.layer0_probes``) on one organism."""
    study = read(results, name)
    readings = study["readings"]
    rows = [
        [
            f"`{member}`",
            regime,
            seed_cell(r["accuracy"][regime]["values"], bounds=(0.0, 1.0)),
            seed_cell(r["selectivity"][regime]["values"], bounds=(-1.0, 1.0)),
            ", ".join(fixed(seed[regime]["chance"], 3) for seed in r["per_seed"]),
        ]
        for member, r in readings.items()
        for regime in r["accuracy"]
    ]
    target, hook = next(iter(readings.values()))["target"], next(iter(readings.values()))["hook"]
    body = [
        f"## A linear probe of `{target}` on `{hook}`, {study['seeds']} seeds",
        "",
        "Per member and prefill regime, the probe's held-out accuracy and selectivity (accuracy minus a",
        "control task's, Hewitt and Liang), each mean [95% Student-t interval over seeds] then the seeds'",
        "values, and the majority-class chance per seed. Recurrent prefill feeds each position the last",
        "layer's state of the pass before, so the input to block 0 can hold what the sequence so far implies.",
        "",
        table(["member", "prefill", "accuracy", "selectivity", "chance by seed"], rows),
        *family_section(study.get("family", {})),
    ]
    title = f"Layer-0 probes: `{study['scale']}` at {study['seeds']} seeds (measured)"
    return frame(title, [(name, study)], "\n".join(body), [], results)


def trace_lengths_page(results: Path, name: str) -> str:
    """The ``traces`` study (``workbench.experiments.comparisons.trace_lengths``) on one organism."""
    study = read(results, name)
    readings = study["readings"]
    rows = [
        [f"`{pair}`", crossed(g["trace_tokens"], 1, sign=False), crossed(g["accuracy"], sign=False)]
        for pair, g in readings["groups"].items()
    ]
    body = [
        f"## Trace length and accuracy on `{readings['task']}`, {study['seeds']} seeds x {readings['problems']} problems",
        "",
        "Every seed's baseline and FBT answer the same held-out problems (a problem some run had no room",
        "for is left out of all); each cell: mean [95% interval over seeds and problems crossed].",
        "",
        table(["member/regime", "trace tokens", "accuracy"], rows),
        *family_section(study.get("family", {})),
    ]
    title = f"Trace lengths: `{study['scale']}` at {study['seeds']} seeds (measured)"
    return frame(title, [(name, study)], "\n".join(body), [], results)


# ---------------------------------------------------------------- the organisms' studies and claims

ORGANISM_STUDIES = {  # scripts/regenerate_organisms.py writes each study on each organism
    "fbt-vs-baseline": fbt_vs_baseline_page,
    "three-pass": three_pass_page,
    "hd-ablations": hd_ablations_page,
    "probes": layer0_probes_page,
    "traces": trace_lengths_page,
}
ORGANISM_NAMES = ("flipflop", "perm", "addition")  # workbench.experiments.claims.ALL
CLAIMS_JSON = "claims.json"


def organism_study_name(study: str, organism: str) -> str:
    """The JSON of ``study`` on ``organism`` in docs/results (``study_fbt_vs_baseline_org_perm.json``)."""
    return f"study_{study.replace('-', '_')}_org_{organism}.json"


def organism_pages(results: Path) -> dict[str, tuple[str, Callable[[Path], str]]]:
    """A page per organism study whose JSON is in ``results``, and the claims page once the
    claims table is there."""
    pages: dict[str, tuple[str, Callable[[Path], str]]] = {}
    for study, render in ORGANISM_STUDIES.items():
        for organism in ORGANISM_NAMES:
            name = organism_study_name(study, organism)
            if (results / name).is_file():
                pages[name.replace(".json", ".md")] = (
                    f"the {study} study on the {organism} organism",
                    lambda r, render=render, name=name: render(r, name),
                )
    if (results / CLAIMS_JSON).is_file():
        pages["claims.md"] = ("the seed papers' claims read on the organisms, one verdict per claim and organism", claims_page)
    return pages


def claims_page(results: Path) -> str:
    data = read(results, CLAIMS_JSON)

    def cell(row: dict) -> str:
        if row.get("difference") is None:
            return "-"
        return f"{row['difference']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}]"

    def source(row: dict) -> str:
        name = organism_study_name(row["study"], row["organism"])
        return f"[{row['study']}]({name.replace('.json', '.md')})" if (results / name).is_file() else row["study"]

    rows = [
        [
            row["paper"],
            row["says"],
            row["organism"],
            source(row),
            row["comparison"] or "-",
            cell(row),
            f"**{row['verdict']}**",
            row["why"],
        ]
        for row in data["rows"]
    ]
    body = [
        "## The claims",
        "",
        "Each claim of the seed papers on each organism, read from the study that tests it: the comparison",
        "of the study's declared family, its mean difference [simultaneous 95% interval under Holm], and",
        'the verdict (`workbench/experiments/claims.py`; docs/training.md, "The claims", says what each means).',
        "",
        table(["paper", "claim", "organism", "study", "comparison", "difference", "verdict", "why"], rows),
    ]
    return frame("The seed papers' claims on the model organisms (measured)", [(CLAIMS_JSON, data)], "\n".join(body), [], results)


def all_pages(results: Path) -> dict[str, tuple[str, Callable[[Path], str]]]:
    return {**PAGES, **organism_pages(results)}


def index_page(results: Path) -> str:
    lines = [
        "# Measured results",
        "",
        f"Generated by `{SCRIPT}`; do not edit by hand. One page per study, each rendered from the JSON",
        "files in this folder, which the command named on the page wrote. The topic pages in `docs/` say",
        "what the numbers mean.",
        "",
    ]
    lines += [f"- [{page}]({page}): {what}" for page, (what, _) in all_pages(results).items()]
    lines += [
        "",
        f"Figures: {', '.join(f'[`{name}`]({name})' for name in FIGURES)}, drawn from the JSON here by "
        f"`{FIGURES_COMMAND}` with the",
        f"workbench's drawing functions; [`{FIGURES_MANIFEST}`]({FIGURES_MANIFEST}) records the commit each was drawn "
        f"from, and `{SCRIPT} --check`",
        "fails once the code that draws one changes in a later commit (docs/development.md).",
    ]
    return "\n".join(lines) + "\n"


def read(results: Path, name: str) -> dict:
    return json.loads((results / name).read_text())


def render_all(results: Path = RESULTS) -> dict[str, str]:
    pages = {page: render(results) for page, (_, render) in all_pages(results).items()}
    pages["README.md"] = index_page(results)
    return pages


def shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if any generated page differs from what it would render now, or a figure is stale",
    )
    parser.add_argument("--figures", action="store_true", help="also redraw the figures with the current drawing code")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the folder of JSON files, pages and figures (default: docs/results)"
    )
    parser.add_argument(
        "--screenshots",
        type=Path,
        help="the app's screenshots to check (default: docs/app, unless --results names another folder)",
    )
    args = parser.parse_args(argv)
    screenshots = args.screenshots or (SCREENSHOTS if args.results == RESULTS else None)
    if args.check:
        pages = render_all(args.results)
        stale = [
            page
            for page, text in pages.items()
            if not (args.results / page).is_file() or (args.results / page).read_text() != text
        ]
        for page in stale:
            print(f"{shown(args.results / page)} is stale: run `{SCRIPT}` and commit the result", file=sys.stderr)
        figures = figure_and_screenshot_problems(args.results, screenshots, ROOT)
        for problem in figures:
            print(problem, file=sys.stderr)
        return 1 if stale or figures else 0
    if args.figures:
        for path in draw_figures(args.results):
            print(f"drew {shown(path)}")
    for page, text in render_all(args.results).items():
        path = args.results / page
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
