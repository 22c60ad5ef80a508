"""The probe page: the layer-0 probe sweeps on the CPU zoo (``probe_*.json``, ``workbench probe``),
accuracy by depth with the control task and selectivity per model, stream and prefill regime, then
the capacity-controlled measures (``capacity_*.json``: online-code MDL and rank-limited probes)."""

from __future__ import annotations

import math
from pathlib import Path

from .render import Page, fixed, named, same_or_span, span, table


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


def probes_body(sources: list[tuple[str, dict]]) -> list[str]:
    sweeps = [(name, sweep) for name, sweep in sources if name.startswith("probe_")]
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
    capacity = [(name, sweep) for name, sweep in sources if name.startswith("capacity_")]
    if capacity:
        body += capacity_section(capacity)
    return body


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


def probes(results: Path) -> Page:
    """The probe sweeps in ``results``, then the capacity-controlled ones; the figures drawn from the sweeps."""
    sweeps = tuple(path.name for path in sorted(results.glob("probe_*.json")))
    names = sweeps + tuple(path.name for path in sorted(results.glob("capacity_*.json")))
    return Page(names, "Layer-0 probe study on the CPU zoo (measured)", named(names, probes_body), figures=sweeps)
