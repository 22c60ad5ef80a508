"""The comparison studies' pages, each from the study's JSON (``workbench zoo --study``): FBT's data
efficiency, FBT's stability knob (the three-pass fraction), Hidden Decoding's ablations, and FBT
against the baseline; and what every study page shares: its declared family of comparisons
(``family_section``, from the study's own JSON or, for the studies measured before ``run_study``
wrote one, from study_families.json)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .render import ACCURACY, DIFFERENCE, Page, crossed, sci, seed_cell, table
from .sources import read

FAMILIES_JSON = "study_families.json"  # scripts/study_families.py: the families of the studies measured before


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


def with_family(name: str, title: str, body: Callable[[dict], list[str]]) -> Callable[[Path], Page]:
    """The page of study file ``name``: ``body`` of the study, then its declared family, from the
    study's own ``family`` (a study run since ``run_study`` writes one), else from
    study_families.json (for the studies measured before), which is then one of the page's sources."""

    def page(results: Path) -> Page:
        if "family" in read(results, name):
            return Page((name,), title, lambda study: [*body(study), *family_section(study["family"])])
        return Page(
            (name, FAMILIES_JSON),
            title,
            lambda study, families: [*body(study), *family_section(families["families"][name])],
        )

    return page


# ---------------------------------------------------------------- data efficiency


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


def data_efficiency_body(study: dict) -> list[str]:
    return [
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


DATA_EFFICIENCY = with_family(
    "study_data_efficiency.json",
    "FBT data efficiency, `{scale}` zoo at {seeds} seeds (measured)",
    data_efficiency_body,
)


# ---------------------------------------------------------------- three-pass fraction


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
    largest K, lambda at the longest horizon (F_t's, then the whole step's) and the accuracy of
    `soft` and `fused` decoding, across seeds with the seeds' differences."""
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
                *[
                    seed_cell(
                        [a - b for a, b in zip(r["accuracy"][regime]["values"], none["accuracy"][regime]["values"], strict=True)],
                        bounds=(-1.0, 1.0),
                    )
                    for regime in ("soft", "fused")
                ],
            ]
        )
    header = [f"K-pass residual at K={K}", *[f"{EXPONENTS[key]}({T})" for key in keys], "soft accuracy", "fused accuracy"]
    return table(["3-pass fraction", *[f"{h}, minus fraction 0" for h in header]], rows)


def three_pass_body(study: dict) -> list[str]:
    residual, stable = three_pass_tables(study)
    return [
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
        "Each seed's member minus the fraction-0 member of the same training seed; each cell's interval is",
        "95% on its own. The accuracies are outside the declared family below (exploratory, uncorrected).",
        "",
        three_pass_paired_table(study),
    ]


def three_pass(name: str) -> Callable[[Path], Page]:
    """The three-pass study's page (``workbench zoo --study three-pass``): ``name``, its JSON."""
    title = "FBT's stability knob (`three_pass_fraction`), `{scale}` zoo at {seeds} seeds (measured)"
    return with_family(name, title, three_pass_body)


# ---------------------------------------------------------------- Hidden Decoding's ablations


HD_BAND_KEYS = ("band", "band_pilot", "curves", "scores", "unmeasured")  # hd_ablations.BAND_KEYS


def hd_members(study: dict) -> dict:
    """The members' entries of an HD study's readings."""
    return {member: r for member, r in study["readings"].items() if member not in HD_BAND_KEYS}


def hd_ablations_table(study: dict) -> str:
    """The HD ablations' readings, one row per member: accuracy (mean of the tasks and per task),
    completion loss per task, the loss jump at each expansion and training time over ``hd1``."""
    readings = hd_members(study)
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
        for member, r in hd_members(study).items()
        if "paired" in r
    ]
    return table(["member", "minus", "accuracy", "completion loss"], rows)


def hd_band_section(study: dict) -> list[str]:
    """Where the HD claims are read: the band declared from the baseline's pilot and each member's
    accuracy there; nothing for a study measured before bands."""
    readings = study["readings"]
    declared = readings.get("band_pilot")
    if declared is None:
        return []
    pilot = ", ".join(f"{name} {a:.3f}" for name, a in declared["pilot"].items()) or "no bands"
    band = readings["band"]
    low, high = declared["headroom"]
    rows = [
        [f"`{member}`", crossed(regimes["standard"], sign=False)]
        for member, regimes in readings.get("curves", {}).get(band, {}).items()
    ]
    return [
        "## The band the claims are read on",
        "",
        f"Declared from the first seed's `{declared['run']}` on {declared['problems']} validation problems of each band",
        f"({pilot}), which no comparison reads: the band between {low:g} and {high:g} nearest the middle,",
        (f"`{band}`." if band else f"none: {declared['why']}."),
        *(
            [
                f"Each member's accuracy on {readings['scores'][band]['n']} test problems of it, mean [95% interval over seeds",
                "and problems crossed]; the family compares each member with its reference on these answers.",
                "",
                table(["member", f"accuracy, {band}"], rows),
            ]
            if band
            else []
        ),
    ]


def hd_ablations_body(study: dict) -> list[str]:
    return [
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
        *hd_band_section(study),
    ]


def hd_ablations(name: str) -> Callable[[Path], Page]:
    """The HD ablations' page (``workbench zoo --study hd-ablations``): ``name``, its JSON."""
    return with_family(name, "Hidden Decoding ablations, `{scale}` zoo at {seeds} seeds (measured)", hd_ablations_body)


# ---------------------------------------------------------------- FBT against the baseline


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


def band_section(study: dict) -> list[str]:
    """The difficulty band accuracy claims are read on, declared from the baseline's pilot, and
    every member's accuracy against difficulty; nothing for a study measured before bands."""
    band, curves = study.get("band"), study["readings"].get("curves", {})
    if band is None:
        return []
    pilot = ", ".join(f"{name} {a:.3f}" for name, a in band["pilot"].items())
    declared = f"`{band['band']}`" if band["band"] else f"none ({band['why']})"
    rows = [
        [name, f"`{member}`", regime, crossed(cell, sign=False)]
        for name, members in curves.items()
        for member, regimes in members.items()
        for regime, cell in regimes.items()
    ]
    low, high = band["headroom"]
    return [
        "## Accuracy against difficulty, and the band the claims are read on",
        "",
        "Declared before the comparison trained, from the baseline's accuracy on each band's validation problems",
        f"at its tuning runs ({pilot}): the band between {low:g} and {high:g} nearest the middle, {declared}.",
        "",
        *([table(["band", "member", "regime", "accuracy"], rows)] if rows else []),
    ]


def power_section(study: dict) -> list[str]:
    """The power step: the seeds it chose, and per comparison the half-width predicted from the
    pilot at those seeds against the one achieved; nothing for a study measured before it."""
    power = study.get("power")
    if power is None:
        return []
    seeds = str(study["seeds"])
    rows = [
        [
            name,
            f"{plan['target']:g}",
            str(plan["seeds"]) if plan["seeds"] is not None else "not run",
            f"{plan['predicted'][seeds]:.4f}" if seeds in plan["predicted"] else "-",
            f"{power['achieved'][name]:.4f}" if name in power.get("achieved", {}) else "-",
        ]
        for name, plan in power["comparisons"].items()
    ]
    return [
        "## Seeds, by a power step on the tuning runs",
        "",
        f"The study ran {seeds} seeds (the power step asked for {power['seeds']}); per comparison the target",
        "half-width, the seeds it needs, and the simultaneous half-width predicted at the seeds run against",
        "the one achieved.",
        "",
        table(["comparison", "target", "seeds needed", f"predicted at {seeds}", "achieved"], rows),
    ]


def efficiency_words(readings: dict) -> list[str]:
    """How the study read data efficiency: from FBT's switch on (``after_switch``), or, in a study
    measured before, as a sign test at a fixed threshold that both arms could cross before feedback
    started."""
    after, times = readings.get("after_switch"), readings["time_to_threshold"]
    if after is None:
        return [
            f"which of the pair first brings its plain-pass training loss (averaged over {times['window']} logged steps)",
            f"to {times['threshold']:g}, a run that never does censored at its budget (exact sign test; measured before",
            "the readout started at FBT's switch, so a threshold crossed before the switch compares two identical",
            "computations or two learning rates).",
        ]
    if after["threshold"] is None:
        return [f"the steps from FBT's switch (step {after['switch']}) to a common loss: not measured, {after['why']}."]
    low, high = after["between"]
    return [
        f"the steps from FBT's switch (step {after['switch']}) until the plain-pass loss (averaged over {after['window']}",
        f"logged steps) reaches {after['threshold']:.4g}, midway between {low:.4g}, which every run reaches after the switch,",
        f"and {high:.4g}, below every run at it; the readout is log(FBT's steps / the baseline's) by seed (FBT:",
        f"{', '.join(map(str, after['fbt_steps']))}; baseline: {', '.join(map(str, after['baseline_steps']))}).",
    ]


def fbt_vs_baseline_body(study: dict) -> list[str]:
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
    if "tuning_seeds" in tuning:  # each row at two seeds, read by the worse; else at one seed
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
    matched = study.get("compute_matched", [])
    compute = (
        f"; `baseline-compute`, the baseline trained for FBT's training FLOPs ({matched[0]['flops_ratio']:.3f}x the"
        f" baseline's: {', '.join(str(r['steps']) for r in matched)} steps by seed)"
        if matched
        else ""
    )
    rounds = [
        [
            str(i),
            "; ".join(f"{arch}: {', '.join(f'{lr:g}' for lr in lrs)}" for arch, lrs in r["lrs"].items()),
            ", ".join(f"`{n}`" for n in r["chosen"].values()),
        ]
        for i, r in enumerate(tuning.get("rounds", []))
    ]
    return [
        "## Tuning, by a rule fixed before the sweep",
        "",
        f"Rule: {tuning['rule']} {trained}",
        f"each is scored on {tuning['validation_problems']} validation problems (a split of its own: neither",
        "training data nor the test problems).",
        "",
        table(["sweep run", "lr", "feedback_start", "ramp", "regime", "validation loss by seed", "validation loss"], sweep),
        *(
            ["Rounds of the learning-rate grid (it grows past an edge choice):", "", table(["round", "grid", "chosen"], rounds)]
            if rounds
            else []
        ),
        f"## Accuracy on the same test problems, {seeds} seeds",
        "",
        "Each cell: mean [95% interval over seeds and problems] (two-way random effects, Satterthwaite df;",
        "`workbench.training.stats.crossed_interval`); `fbt-no-feedback` is FBT's model at the baseline's",
        f"setting with no loss on its feedback passes{compute}.",
        "",
        table(["member", "regime", "accuracy", "seeds x problems"], accuracy),
        *beyond_section(readings),
        *band_section(study),
        *power_section(study),
        "Compared: each member minus the baseline of its seed, on the same problems (accuracy: 1/0 per",
        "problem; completion loss: per problem), the plain-pass training loss on identical batches averaged",
        "over the last half of the logged steps, and",
        *efficiency_words(readings),
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


def fbt_vs_baseline(name: str) -> Page:
    """The fair comparison's page (``workbench zoo --study fbt-vs-baseline``): ``name``, its JSON."""
    title = "FBT against the baseline, fair by construction: `{scale}` at {seeds} seeds (measured)"
    return Page((name,), title, fbt_vs_baseline_body)
