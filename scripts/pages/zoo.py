"""The zoo's pages: the earlier one-seed reference zoo (``ZOO``), a zoo trained at several seeds
(``zoo_seeds``: the reference, quick and organisms' zoos) with each accuracy's interval across
seeds and paired with the baseline of the same seed, and the probes, dynamics and traces read on
every seed of the zoo (``SEED_READINGS``)."""

from __future__ import annotations

import math
from collections.abc import Callable

from .render import ACCURACY, DIFFERENCE, Page, fixed, seed_cell, table

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


def zoo_body(zoo: dict) -> list[str]:
    models = zoo["models"]
    sizes = sorted({task["n"] for model in models.values() for task in model["tasks"].values()})
    total = sum(model["train_seconds"] + model["eval_seconds"] for model in models.values())
    half = 1.96 * math.sqrt(0.25 / min(sizes))
    return [
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


ZOO = Page(
    ("zoo_cpu.json",),
    lambda zoo: f"Reference zoo, `{zoo.get('scale', '?')}` scale (measured)",
    zoo_body,
    figures=("zoo_cpu.json",),
)


def zoo_seeds_body(zoo: dict) -> list[str]:
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
    return [
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


def zoo_seeds_title(zoo: dict) -> str:
    seeds = f"{zoo['seeds']} seeds" if zoo["seeds"] > 1 else "one seed"
    return f"The `{zoo['scale']}` zoo at {seeds} (measured)"


def zoo_seeds(name: str) -> Page:
    """The page of a zoo trained at one or more seeds (``workbench zoo --seeds``): ``name``, its JSON."""
    return Page((name,), zoo_seeds_title, zoo_seeds_body)


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


def seed_readings_body(data: dict) -> list[str]:
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
    return body


SEED_READINGS = Page(("zoo_analyses.json",), "Probes, dynamics and traces at {seeds} seeds (measured)", seed_readings_body)
