"""``hd-ablations`` (the Hidden Decoding paper's ablations): from a ``baseline`` per seed, HD
continued for the zoo's HD steps at n = 1 (the baseline continued alike), 2, 4 and 8 streams by
progressive expansion, and at n = 4: every stream supervised, the sum-of-streams readout,
cross-stream attention in every layer, and the shared key/value cache (later tokens see only the
last stream's keys and values). Per member: held-out accuracy and completion loss per task, the
loss jump at each expansion, the training time relative to n = 1 (from the runs' logs), and the
cost of one training step relative to n = 1, measured side by side."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workbench.experiments.studies.common import Member, add_paired, completion_loss, interval_text, mean_accuracy, torch_threads
from workbench.runtime.config import make_config
from workbench.training.intervals import ACCURACY, ACCURACY_DIFFERENCE, seed_interval
from workbench.training.runconfig import load_run_config
from workbench.training.zoo import SCALES


def members(scale: str) -> list[Member]:
    steps, hd = SCALES[scale]["steps"], SCALES[scale]["hd_steps"]
    layers = make_config("baseline", SCALES[scale]["preset"]).n_layers
    stages = {1: ([1], [0]), 2: ([2], [0]), 4: ([2, 4], [0, hd // 2]), 8: ([2, 4, 8], [0, hd // 3, 2 * hd // 3])}

    def grown(n: int) -> list[str]:
        streams, at = stages[n]
        return [f"train.steps={hd}", f"hd.streams={','.join(map(str, streams))}", f"hd.expand_at={','.join(map(str, at))}"]

    rows: list[Member] = [("baseline", "baseline", [f"train.steps={steps}"], None)]
    rows += [(f"hd{n}", "hd", grown(n), "baseline") for n in stages]
    rows += [
        ("hd4-supervise-all", "hd", grown(4) + ["hd.supervise=all"], "baseline"),
        ("hd4-readout-sum", "hd", grown(4) + ["model.readout=sum"], "baseline"),
        ("hd4-cross-every-layer", "hd", grown(4) + [f"model.cross_layers={','.join(map(str, range(layers)))}"], "baseline"),
        ("hd4-shared-kv", "hd", grown(4) + ["model.kv=shared"], "baseline"),
    ]
    return rows


def measure(models: dict, out: Path, scale: str, threads: int, jobs: int) -> dict:
    """The readings of the runs' evaluations and logs (``hd_ablations``), each member's with the
    cost of its training step over ``hd1``'s (``hd_step_times``, at one member's ``threads``)."""
    readings = hd_ablations(models)
    for member, ratio in hd_step_times(out, sorted(readings), threads).items():
        readings[member]["step_time_vs_hd1"] = ratio
    return readings


def hd_reference(member: str) -> str | None:
    """The member an HD ablation is paired against: ``hd1`` (the baseline continued alike) for a
    stream count, ``hd4`` for an n = 4 ablation; None for ``hd1``."""
    if member == "hd1":
        return None
    return "hd4" if member.startswith("hd4-") else "hd1"


def hd_ablations(models: dict) -> dict:
    """Per HD member: accuracy and completion loss per task, the training loss jump at each
    expansion, and training seconds over those of ``hd1`` (the baseline continued alike) of the same
    seed, each across seeds; and ``paired``: the member minus its ``hd_reference`` at the same seed
    (accuracy and completion loss, each the mean of the tasks), across the seeds both have."""
    by_member: dict[str, dict[int, dict]] = {}
    for row in models.values():
        by_member.setdefault(row["member"], {})[int(row["seed"])] = row
    readings = {}
    for member, rows in sorted(by_member.items()):
        if member == "baseline":
            continue
        seeds = sorted(rows)
        first = rows[seeds[0]]
        tasks = {
            task: {
                "accuracy": seed_interval([rows[s]["tasks"][task]["accuracy"]["standard"] for s in seeds], bounds=ACCURACY),
                "completion_loss": seed_interval([rows[s]["tasks"][task]["answer_loss"]["standard"] for s in seeds]),
            }
            for task in first["tasks"]
        }
        jumps = {}
        for k, expansion in enumerate(first.get("expansions", [])):
            values = [rows[s]["expansions"][k]["loss_after"] - rows[s]["expansions"][k]["loss_before"] for s in seeds]
            jumps[f"{expansion['from']}->{expansion['to']}"] = seed_interval(values)
        plain = by_member.get("hd1", {})
        ratios = [rows[s]["train_seconds"] / plain[s]["train_seconds"] for s in seeds if s in plain and plain[s]["train_seconds"]]
        readings[member] = {
            "seeds": seeds,
            "tasks": tasks,
            "accuracy": seed_interval([mean_accuracy(rows[s], "standard") for s in seeds], bounds=ACCURACY),
            "expansion_jumps": jumps,
            "time_vs_hd1": seed_interval(ratios) if ratios else None,
        }
    for member, reading in readings.items():
        reference = hd_reference(member)
        mine, theirs = by_member[member], by_member.get(reference or "", {})
        seeds = sorted(set(mine) & set(theirs))
        if not seeds:
            continue
        reading["paired"] = {
            "reference": reference,
            "seeds": seeds,
            "accuracy": seed_interval(
                [mean_accuracy(mine[s], "standard") - mean_accuracy(theirs[s], "standard") for s in seeds],
                bounds=ACCURACY_DIFFERENCE,
            ),
            "completion_loss": seed_interval(
                [completion_loss(mine[s], "standard") - completion_loss(theirs[s], "standard") for s in seeds]
            ),
        }
    return readings


def hd_step_times(out: Path, members: list[str], threads: int, reps: int = 5) -> dict:
    """The training cost of each HD member (seed 0) against ``hd1``, side by side in this process:
    one optimiser step (its strategy's loss, backward, AdamW) of the trained model at its final
    stream count on a fixed batch of the run's shape, every member's steps interleaved ``reps``
    times after a warm-up (``workbench.bench.timing.measure``) with ``threads`` torch threads (a
    member's own training threads: more threads than free cores slow small steps most, which
    squeezes the ratios).
    Member -> ``{ratio, spread}``: the median over the repetitions of its step time over ``hd1``'s
    in the same repetition, and their min and max."""
    from workbench.bench.timing import measure, ratio_of
    from workbench.bench.train_steps import optimiser_step
    from workbench.runtime.checkpoint import load_model
    from workbench.training.strategies import make_strategy

    def step_of(name: str) -> Callable:
        cfg = load_run_config(out / name / "config.json")
        model, strategy = load_model(out / name), make_strategy(cfg)
        B, last = cfg.train.batch_size, cfg.train.steps - 1
        sizes = {"batch": B, "seq": cfg.train.seq_len}
        return optimiser_step(model, lambda x, y: strategy.loss(model, x, y, last, slice(0, B))[0], sizes)

    with torch_threads(threads):
        times, _ = measure({name: step_of(name) for name in ["hd1", *[m for m in members if m != "hd1"]]}, reps)
    ratios = {}
    for name in members:
        r = ratio_of(times, "hd1", name, what_a="hd1 train step", what_b=f"{name} train step")
        ratios[name] = {"ratio": r["ratio"], "spread": r["spread"]}
    return ratios


def family(readings: dict) -> dict[str, dict]:
    """Each member minus its reference in accuracy and completion loss, and ``hd4``'s training loss
    jump at each expansion."""
    cells: dict[str, dict] = {}
    for member, r in readings.items():
        if "paired" in r:
            for what in ("accuracy", "completion_loss"):
                values = r["paired"][what]["values"]
                bounds = ACCURACY_DIFFERENCE if what == "accuracy" else None
                name = f"{member} - {r['paired']['reference']}: {what.replace('_', ' ')}"
                add_paired(cells, name, [0.0] * len(values), values, bounds)
    for expansion, jump in readings.get("hd4", {}).get("expansion_jumps", {}).items():
        # cyclic replication keeps the function: the training loss after an expansion minus
        # before it, on the same rows (``train._record_expansion``)
        add_paired(cells, f"hd4: loss jump at expansion {expansion}", [0.0] * len(jump["values"]), jump["values"])
    return cells


def rows(study: dict) -> list[dict]:
    return [
        {
            "member": key,
            "accuracy (mean of tasks)": interval_text(r["accuracy"]),
            **{f"{task} accuracy": interval_text(v["accuracy"]) for task, v in r["tasks"].items()},
            **{f"{task} completion loss": interval_text(v["completion_loss"]) for task, v in r["tasks"].items()},
            "loss jumps": ", ".join(f"{k}: {interval_text(v, 2)}" for k, v in r["expansion_jumps"].items()) or "-",
            "time / hd1": interval_text(r["time_vs_hd1"], 2),
            "step time / hd1": f"{r['step_time_vs_hd1']['ratio']:.2f}" if "step_time_vs_hd1" in r else "-",
            "paired against": r["paired"]["reference"] if "paired" in r else "-",
            "accuracy, minus it": interval_text(r["paired"]["accuracy"]) if "paired" in r else "-",
            "completion loss, minus it": interval_text(r["paired"]["completion_loss"]) if "paired" in r else "-",
        }
        for key, r in study.get("readings", {}).items()
    ]
