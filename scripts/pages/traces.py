"""The traces page: trace lengths and accuracy on the CPU zoo, from the summary of ``workbench
traces`` (``traces_cpu_summary.json``): per model and decoding regime, paired against the reference
on the same problems, by difficulty, and at matched trace length."""

from __future__ import annotations

from .render import Page, fixed, interval, table


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


def traces_body(summary: dict) -> list[str]:
    levels = sorted({stat["level"] for pair in summary["paired"].values() for stat in pair.values()})
    seconds = sum(t["seconds"] for t in summary.get("timing", {}).values())
    return [
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


TRACES = Page(
    ("traces_cpu_summary.json",),
    "Trace lengths on the CPU zoo (measured)",
    traces_body,
    figures=("traces_cpu_summary.json",),
)
