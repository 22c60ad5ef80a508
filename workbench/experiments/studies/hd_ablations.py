"""``hd-ablations`` (the Hidden Decoding paper's ablations): from a ``baseline`` per seed, HD
continued for the zoo's HD steps at n = 1 (the baseline continued alike), 2, 4 and 8 streams by
progressive expansion, and at n = 4: every stream supervised, the sum-of-streams readout,
cross-stream attention in every layer, and the shared key/value cache (later tokens see only the
last stream's keys and values). Per member: held-out accuracy and completion loss per task, the
loss jump at each expansion, the training time relative to n = 1 (from the runs' logs), the
cost of one training step relative to n = 1, measured side by side, and its answers on the
difficulty band where the baseline has room (``band_readings``), where the accuracy comparisons
the paper's claims are read from are made."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from workbench.experiments.bands import BANDS, HEADROOM, band_accuracy, declare_band, score_member
from workbench.experiments.fair_readings import pack_bits, unpacked
from workbench.experiments.studies.common import Member, add_paired, completion_loss, interval_text, mean_accuracy, torch_threads
from workbench.runtime.config import make_config
from workbench.training import stats
from workbench.training.intervals import ACCURACY, ACCURACY_DIFFERENCE, seed_interval
from workbench.training.runconfig import load_run_config
from workbench.training.zoo import ORGANISMS, SCALES

# test problems per member and seed on the declared band: HD n = 8 at 128 flip-flop instructions
# reads a 2,000-position sequence per problem, and 500 keep the readout near the study's own cost
BAND_PROBLEMS = 500
PILOT_PROBLEMS = 500  # validation problems per band in the baseline's pilot (the fair study's)
BAND = "band"  # the declared band's comparisons are named for its role, whichever band it is
# the keys of an HD study's readings that are not a member's
BAND_KEYS = ("band", "band_pilot", "curves", "scores", "unmeasured")


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
    cost of its training step over ``hd1``'s (``hd_step_times``, at one member's ``threads``), and
    the members' answers on the declared band (``band_readings``, at all the threads)."""
    readings = hd_ablations(models)
    for member, ratio in hd_step_times(out, sorted(readings), threads).items():
        readings[member]["step_time_vs_hd1"] = ratio
    bands = next((BANDS.get(task, {}) for task, name in ORGANISMS.items() if name == scale), {})
    with torch_threads(threads * jobs):
        return readings | band_readings(models, out, bands, BAND_PROBLEMS, PILOT_PROBLEMS)


def member_readings(readings: dict) -> dict:
    """The members' entries of an HD study's readings (those of ``BAND_KEYS`` left out)."""
    return {member: r for member, r in readings.items() if member not in BAND_KEYS}


def band_cell(member: str) -> str:
    """The family's name for ``member`` minus its reference on the declared band."""
    return f"{member} - {hd_reference(member)}: accuracy, {BAND}"


def band_readings(
    models: dict, out: Path, bands: dict[str, dict], n: int, pilot_n: int, headroom: tuple[float, float] = HEADROOM
) -> dict:
    """Where the HD members' accuracy comparisons are read, and what they answer there.

    The band is declared (``declare_band``, within ``headroom``) from the pilot: the first seed's
    ``baseline`` on ``pilot_n`` validation problems of each of ``bands``. No comparison of the
    family reads the baseline, and no HD member is consulted. Every member, the baseline included
    (where ``hd1`` starts), then answers ``n`` test problems of the declared band at each seed
    (``score_member``, standard regime). ``{band, band_pilot, curves: {band: {member: {standard:
    accuracy}}}, scores: {band: {n, member: {seeds, standard: [bits per seed]}}}}``; with no band,
    ``unmeasured`` says why for each band comparison."""
    runs: dict[str, dict[int, str]] = {}
    for name, row in models.items():
        runs.setdefault(row["member"], {})[int(row["seed"])] = name
    first = min(runs["baseline"])
    if bands:
        declared = declare_band(band_accuracy(out / runs["baseline"][first], bands, pilot_n), headroom)
    else:
        why = "this zoo's task has no graded test sets (``bands.BANDS``)"
        declared = {"band": None, "pilot": {}, "headroom": list(headroom), "why": why}
    result: dict = {"band": declared["band"], "band_pilot": {**declared, "run": runs["baseline"][first], "problems": pilot_n}}
    band = declared["band"]
    if band is None:
        compared = [m for m in runs if m != "baseline" and hd_reference(m) is not None]
        return result | {"unmeasured": {band_cell(m): declared["why"] for m in sorted(compared)}}
    curves: dict[str, dict] = {}
    scores: dict[str, int | dict] = {"n": n}
    for member, by_seed in sorted(runs.items()):
        seeds = sorted(by_seed)
        answers = [score_member(out / by_seed[s], ["standard"], n, (band, bands[band]))["correct"]["standard"] for s in seeds]
        curves[member] = {"standard": stats.accuracy_interval(np.array(answers, dtype=np.float64))}
        scores[member] = {"seeds": seeds, "standard": [pack_bits(a) for a in answers]}
    return result | {"curves": {band: curves}, "scores": {band: scores}}


def band_matrix(readings: dict, member: str, seeds: list[int]) -> np.ndarray:
    """``member``'s [seeds, problems] answers on the declared band at ``seeds``."""
    band = readings["band"]
    rows = unpacked(readings["scores"], band, member, "standard")
    at = readings["scores"][band][member]["seeds"]
    return rows[[at.index(s) for s in seeds]]


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
    """Each member minus its reference in accuracy and completion loss, on the declared band in
    accuracy over seeds and problems crossed (where a band was declared), and ``hd4``'s training
    loss jump at each expansion."""
    cells: dict[str, dict] = {}
    for member, r in member_readings(readings).items():
        if "paired" in r:
            for what in ("accuracy", "completion_loss"):
                values = r["paired"][what]["values"]
                bounds = ACCURACY_DIFFERENCE if what == "accuracy" else None
                name = f"{member} - {r['paired']['reference']}: {what.replace('_', ' ')}"
                add_paired(cells, name, [0.0] * len(values), values, bounds)
            scored = readings.get("scores", {}).get(readings.get("band"), {})
            if member in scored and r["paired"]["reference"] in scored:
                reference = r["paired"]["reference"]
                seeds = sorted(set(scored[member]["seeds"]) & set(scored[reference]["seeds"]))
                if len(seeds) >= 2:
                    a, b = band_matrix(readings, reference, seeds), band_matrix(readings, member, seeds)
                    cells[band_cell(member)] = stats.paired_difference(a, b, bounds=ACCURACY_DIFFERENCE)
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
        for key, r in member_readings(study.get("readings", {})).items()
    ]
