"""The seed papers' claims, each read from the study that tests it on a model organism.

A claim names its study, the organisms it can show on, the comparison of the study's declared
family that tests it (``study.json``'s ``family``: Holm-corrected, with Bonferroni simultaneous
intervals) and the sign the paper predicts. ``read_claim`` gives one verdict per claim and
organism, by these rules in this order:

- ``not testable here``: the claim cannot show on the organism; an arm of the comparison did not
  learn the task (a member short of its competence target in its own standard regime at any
  seed: a tuning failure, never evidence against the claim); the readout was taken on another
  task's input; or the study could not measure the comparison (its ``unmeasured`` says why);
- ``contradicted``: the opposite of the predicted difference is detectable (checked before any
  ceiling rule: a detectable difference needs no room to show);
- ``not testable here`` again for an accuracy at the ceiling: the side predicted lower answers so
  nearly all problems that even a perfect other side would stay within the half-width;
- ``reproduced``: the predicted difference is detectable (for a claim of closeness, the whole
  simultaneous interval within +-``CLOSE``);
- ``inconclusive at this power``: the interval holds 0 but is wider than the largest effect the
  paper reports for the comparison (``Claim.effect``), so a paper-sized effect could have gone
  unseen; or a claim of closeness whose interval is wider than +-``CLOSE``;
- ``no detectable difference``: the interval holds 0, with the minimum detectable effect
  (``mde``: the half-width of the simultaneous interval, the smallest difference this study could
  have called), within the paper's effect where the paper reports one in these units;
- ``not measured yet``: the study has not been run on the organism (the command is given).

Each study's positive control is a test that plants an effect of known size through the same
readout and detects it (``CONTROLS``), so a "no detectable difference" comes from a study that
could see one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from workbench.storage.files import read_json
from workbench.training import stats

REPRODUCED, CONTRADICTED, NO_DIFFERENCE, INCONCLUSIVE, NOT_TESTABLE, NOT_MEASURED = (
    "reproduced",
    "contradicted",
    "no detectable difference",
    "inconclusive at this power",
    "not testable here",
    "not measured yet",
)
VERDICTS = (REPRODUCED, CONTRADICTED, NO_DIFFERENCE, INCONCLUSIVE, NOT_TESTABLE, NOT_MEASURED)

# the test that plants an effect through each study's readouts and detects it, and its null
CONTROLS = {
    "fbt-vs-baseline": "tests/workbench/test_fbt_vs_baseline.py::test_a_planted_gain_of_a_tenth_is_detected_through_the_family_correction",
    "hd-ablations": "tests/workbench/test_controls.py::test_the_hd_ablations_family_detects_a_planted_gain_and_not_its_absence",
    "three-pass": "tests/workbench/test_controls.py::"
    "test_the_dynamics_study_finds_a_planted_contraction_and_no_contraction_where_there_is_none",
    "traces": "tests/workbench/test_controls.py::"
    "test_the_traces_family_detects_traces_planted_shorter_at_equal_accuracy_and_not_their_absence",
    "probes": "tests/workbench/test_controls.py::"
    "test_the_probe_study_reads_a_target_planted_in_the_layer0_input_and_not_one_that_is_absent",
}
CLOSE = 0.05  # a claim that two members are close: the simultaneous interval within +-CLOSE


@dataclass(frozen=True)
class Claim:
    key: str
    paper: str  # FBT or HD
    claim: str  # what the paper says, in a line
    study: str  # the study that reads it (``workbench zoo --study STUDY``)
    organisms: tuple[str, ...]  # where it can show (``workbench.training.zoo.ORGANISMS``)
    comparison: str | None  # the member of the study's family that tests it
    # the sign of the difference the paper predicts (+1 higher, -1 lower; 0: close, within
    # +-CLOSE)
    sign: int
    # the largest effect the paper reports in the comparison's units (None: it reports none), and
    # where: a study whose half-width exceeds it could not have seen a paper-sized effect
    effect: float | None = None
    effect_source: str | None = None


ALL = ("flipflop", "perm", "addition")
# The papers' effects, each the largest reported in the units of the comparison that reads it (the
# most a study needs to see): the HD release's seven benchmarks on Qwen3-8B-Base (accuracy points
# read as differences of accuracy) and FBT's token efficiency (as a log ratio of steps).
HD_N2 = "the HD release: n = 2 gains 0.4-3.4 points over its baseline on seven benchmarks (HellaSwag +3.4)"
HD_N4 = "the HD release: n = 4 gains 0.5-5.3 points over its baseline on seven benchmarks (HellaSwag +5.3)"
FBT_TOKENS = "the FBT paper: FBT matches a baseline trained on 1.5-2x its tokens (ln 2 = 0.693)"
CLAIMS = (
    Claim("fbt-loss", "FBT", "lower training loss at equal data", "fbt-vs-baseline", ALL,
          "fbt - baseline: plain-pass training loss, last half", -1),
    Claim("fbt-data-efficiency", "FBT", "reaches a loss in fewer steps (data efficiency)", "fbt-vs-baseline", ALL,
          "fbt - baseline: log steps to the loss threshold after the switch", -1, 0.693, FBT_TOKENS),
    Claim("fbt-fused-accuracy", "FBT", "fused decoding answers better than the baseline", "fbt-vs-baseline", ALL,
          "fbt fused - baseline: accuracy", 1),
    # on the difficulty band declared from the baseline's pilot, where it answers 0.6-0.9
    # (``bands.declare_band``), at equal tokens and at FBT's training FLOPs
    Claim("fbt-fused-accuracy-band", "FBT", "fused decoding answers better than the baseline where the baseline has "
          "room (the declared difficulty band)", "fbt-vs-baseline", ALL, "fbt fused - baseline: accuracy, band", 1),
    Claim("fbt-fused-accuracy-compute", "FBT", "... and better than a baseline trained on FBT's training FLOPs",
          "fbt-vs-baseline", ALL, "fbt fused - baseline-compute: accuracy, band", 1),
    Claim("fbt-soft-over-standard", "FBT", "soft decoding above standard on the same weights", "fbt-vs-baseline",
          ("addition",), "fbt soft - fbt standard: accuracy", 1),
    Claim("fbt-fused-over-standard", "FBT", "fused decoding above standard on the same weights", "fbt-vs-baseline", ALL,
          "fbt fused - fbt standard: accuracy", 1),
    # beyond training, where the organisms' ceilings leave room (``fbt_vs_baseline.BEYOND``)
    Claim("fbt-longer", "FBT", "feedback adds serial computation: fused decoding composes products longer than trained "
          "on better than the baseline", "fbt-vs-baseline", ("perm",), "fbt fused - baseline: accuracy, longer", 1),
    Claim("fbt-glitches-sparser", "FBT", "feedback lowers the flip-flop's glitches at a sparser ignore density",
          "fbt-vs-baseline", ("flipflop",), "fbt fused - baseline: accuracy, sparser", 1),
    Claim("fbt-glitches-denser", "FBT", "feedback lowers the flip-flop's glitches at a denser ignore density",
          "fbt-vs-baseline", ("flipflop",), "fbt fused - baseline: accuracy, denser", 1),
    Claim("fbt-layer0-state", "FBT", "recurrent prefill exposes the global state at layer 0", "probes", ALL,
          "fbt recurrent K=2 - fbt standard: layer-0 probe accuracy", 1),
    Claim("fbt-shorter-traces", "FBT", "shorter traces than the baseline's (fused decoding)", "traces", ("addition",),
          "fbt fused - baseline: trace tokens", -1),
    Claim("fbt-traces-equal-accuracy", "FBT", "... at equal accuracy (fused within +-0.05 of the baseline)", "traces",
          ("addition",), "fbt fused - baseline: accuracy", 0),
    Claim("fbt-contraction", "FBT", "a few percent of 3-pass batches make the feedback map a contraction",
          "three-pass", ALL, "fbt-3pass0.03 - fbt-3pass0: lambda(1000)", -1),
    Claim("hd-streams", "HD", "gains grow with the stream count n (2 over 1)", "hd-ablations", ALL,
          "hd2 - hd1: accuracy, band", 1, 0.034, HD_N2),
    Claim("hd-streams-4", "HD", "gains grow with the stream count n (4 over 1)", "hd-ablations", ALL,
          "hd4 - hd1: accuracy, band", 1, 0.053, HD_N4),
    Claim("hd-supervise-last", "HD", "last-stream supervision above all streams", "hd-ablations", ALL,
          "hd4-supervise-all - hd4: accuracy, band", -1),
    Claim("hd-readout-last", "HD", "last-stream readout above summed readouts", "hd-ablations", ALL,
          "hd4-readout-sum - hd4: accuracy, band", -1),
    Claim("hd-separate-kv", "HD", "separate key/value caches per stream above a shared one", "hd-ablations", ALL,
          "hd4-shared-kv - hd4: accuracy, band", -1),
    Claim("hd-few-cross-layers", "HD", "a few cross-stream layers close to all layers", "hd-ablations", ALL,
          "hd4-cross-every-layer - hd4: accuracy, band", 0),
)  # fmt: skip


def command(claim: Claim, organism: str) -> str:
    """The command that runs ``claim``'s study on ``organism`` (the fair study chooses its seeds by
    its power step)."""
    seeds = "power" if claim.study == "fbt-vs-baseline" else 5
    return f"workbench zoo --study {claim.study} --preset org-{organism} --seeds {seeds}"


def read_claim(claim: Claim, organism: str, study: Mapping | None) -> dict:
    """One row of the claims table: the claim on ``organism`` read from ``study`` (its
    ``study.json``, or None when it has not been run), with the verdict and why."""
    row = {
        "claim": claim.key,
        "paper": claim.paper,
        "says": claim.claim,
        "organism": organism,
        "study": claim.study,
        "comparison": claim.comparison,
        "control": CONTROLS.get(claim.study),
        "paper_effect": claim.effect,
    }
    if organism not in claim.organisms:
        return {**row, "verdict": NOT_TESTABLE, "why": f"the claim cannot show on {organism}"}
    if study is None:
        return {**row, "verdict": NOT_MEASURED, "why": f"run `{command(claim, organism)}`"}
    cell = study.get("family", {}).get(claim.comparison)
    unmeasured = study.get("readings", {}).get("unmeasured", {}).get(claim.comparison)
    if cell is None and unmeasured:
        return {**row, "verdict": NOT_TESTABLE, "why": unmeasured}
    if cell is None:
        return {**row, "verdict": NOT_MEASURED, "why": f"the study's family has no '{claim.comparison}' (an older run)"}
    row |= {
        "family_size": cell.get("family_size"),
        "p_holm": cell.get("p_holm"),
        "seeds": cell.get("n_seeds", study.get("seeds")),
    }
    untrained = _arm_not_learned(claim, study)
    if untrained is not None:
        return {**row, **_interval(cell), "verdict": NOT_TESTABLE, "why": untrained}
    elsewhere = _read_elsewhere(study)
    if elsewhere is not None:
        return {**row, **_interval(cell), "verdict": NOT_TESTABLE, "why": elsewhere}
    opposite = _opposite(cell, claim.sign)
    if opposite is not None:
        return {**row, **_interval(cell), "verdict": CONTRADICTED, "why": opposite}
    ceiling = _ceiling(claim, study, cell)
    if ceiling is not None:
        return {**row, **_interval(cell), "verdict": NOT_TESTABLE, "why": ceiling}
    verdict, why = _verdict(cell, claim)
    return {**row, **_interval(cell), "verdict": verdict, "why": why}


def arms(claim: Claim) -> list[str]:
    """The members the two sides of ``claim``'s comparison are read from (``fbt fused - baseline:
    accuracy``: fbt and baseline; ``fbt recurrent K=2 - fbt standard``: fbt)."""
    sides = (claim.comparison or "").partition(": ")[0].split(" - ")
    return list(dict.fromkeys(side.split(" ")[0] for side in sides if side))


def _arm_not_learned(claim: Claim, study: Mapping) -> str | None:
    """Why a side of the comparison says nothing of the claim: its member missed its competence
    target (held-out accuracy in its own standard regime, ``zoo.competence``) at some seed; None
    when every arm's runs qualified, or the study records no runs of that member."""
    models = [r for r in study.get("models", {}).values() if isinstance(r, Mapping)]
    for member in arms(claim):
        runs = [r for r in models if r.get("member") == member]
        missed = [r for r in runs if not r.get("competence", {}).get("qualified")]
        if missed:
            accuracies = [t.get("accuracy") for r in missed for t in r.get("competence", {}).get("tasks", {}).values()]
            lowest = min((a for a in accuracies if isinstance(a, (int, float))), default=None)
            shown = f" (lowest standard accuracy {lowest:.3f})" if lowest is not None else ""
            return (
                f"{member} did not learn the task at its setting: {len(runs) - len(missed)} of {len(runs)} seeds "
                f"reached its competence target{shown}"
            )
    return None


def _opposite(cell: Mapping, sign: int) -> str | None:
    """The reading when the difference opposite to the one predicted is detectable, else None."""
    if sign == 0 or not stats.detectable(cell):
        return None
    return None if (cell["mean"] > 0) == (sign > 0) else f"the opposite is detectable: {_described(cell)}"


def _described(cell: Mapping) -> str:
    """The difference and its simultaneous interval."""
    low, high = cell.get("family_low", cell["low"]), cell.get("family_high", cell["high"])
    return f"{cell['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


def _read_elsewhere(study: Mapping) -> str | None:
    """Why a study's rollouts say nothing of its members' own task: a member rolled out from a
    prompt of another task (its per-seed ``input`` warns), or rolled out before the rollouts read
    the run's task (no ``input``: from a chain prompt, whatever the organism); None otherwise."""
    readings = [m for m in study.get("readings", {}).values() if isinstance(m, Mapping)]
    rows = [r for m in readings for r in m.get("per_seed", []) if isinstance(r, Mapping) and "lyapunov_tangent" in r]
    if not rows:  # no rollouts: a study of other readouts
        return None
    if any("input" not in r for r in rows):
        return "its rollouts continued a chain prompt, not the organism's own problems (made before the rollouts read the run's task): rerun the study"
    warned = next((r["input"]["warning"] for r in rows if "warning" in r["input"]), None)
    return f"read on another task's input: {warned}" if warned else None


def arm_accuracy(study: Mapping, arm: str, test_set: str | None = None) -> float | None:
    """The mean accuracy of one side of a comparison (``fbt fused``, ``baseline``, ``hd4``: a member
    and its regime, ``standard`` unless named) in ``study``'s readings, on ``test_set`` (a set
    beyond training, a graded band, or ``band``: the one declared) or the test problems; None where
    the study does not record it."""
    member, _, regime = arm.partition(" ")
    readings = study.get("readings", {})
    test_set = readings.get("band") if test_set == "band" else test_set
    if not test_set and isinstance(readings.get(member), Mapping):  # readings by member (hd-ablations)
        found = readings[member].get("accuracy")
    else:
        sets = {**readings.get("beyond", {}), **readings.get("curves", {})}
        where = sets.get(test_set, {}) if test_set else readings.get("accuracy", {})
        found = where.get(member, {}).get(regime or "standard") if isinstance(where.get(member), Mapping) else None
    return float(found["mean"]) if isinstance(found, Mapping) and "mean" in found else None


def _ceiling(claim: Claim, study: Mapping, cell: Mapping) -> str | None:
    """Why an accuracy claim cannot show: the side the paper predicts lower (for a claim of
    closeness, each side) answers so nearly all problems that the room left above it is within the
    study's simultaneous half-width, so even a perfect other side would not be detectable (None
    when there is room, or it is not an accuracy claim)."""
    name = claim.comparison or ""
    arms, _, readout = name.partition(": ")
    if not readout.startswith("accuracy") or " - " not in arms:
        return None
    left, right = arms.split(" - ")
    test_set = readout.partition(", ")[2] or None
    half = (cell.get("family_high", cell["high"]) - cell.get("family_low", cell["low"])) / 2
    # the side that must leave room: the one predicted lower; for a claim of closeness, both (the
    # two at the ceiling are close whatever the architectures do)
    sides = [right, left] if claim.sign == 0 else [right] if claim.sign > 0 else [left]
    found = [arm_accuracy(study, side, test_set) for side in sides]
    accuracies = [a for a in found if a is not None]
    if len(accuracies) < len(sides) or any(1.0 - a > half for a in accuracies):
        return None
    what = " and ".join(f"{side} answers {a:.3f}" for side, a in zip(sides, accuracies))
    problems = f"of the {test_set or 'test'} problems"
    if claim.sign == 0:
        return f"at the ceiling: {what} {problems}, so no difference beyond the half-width {half:.3f} could show"
    higher = left if claim.sign > 0 else right
    room = 1.0 - accuracies[0]
    return (
        f"at the ceiling: {what} {problems}, so {higher} can gain at most {room:+.3f}, within the study's "
        f"simultaneous half-width {half:.3f}"
    )


def _interval(cell: Mapping) -> dict:
    """The comparison's difference, its simultaneous interval and ``mde``, the interval's half-width."""
    low, high = cell.get("family_low", cell["low"]), cell.get("family_high", cell["high"])
    return {"difference": cell["mean"], "low": low, "high": high, "mde": (high - low) / 2}


def _verdict(cell: Mapping, claim: Claim) -> tuple[str, str]:
    """The verdict once every rule before it passed, the opposite sign included (``read_claim``)."""
    detectable, text = stats.detectable(cell), _described(cell)
    low, high = cell.get("family_low", cell["low"]), cell.get("family_high", cell["high"])
    if claim.sign == 0:  # "close": the whole simultaneous interval within +-CLOSE
        if -CLOSE <= low and high <= CLOSE:
            return REPRODUCED, f"within +-{CLOSE}: {text}"
        if detectable:
            return CONTRADICTED, f"a detectable difference: {text}"
        return INCONCLUSIVE, f"{text} is wider than +-{CLOSE}"
    if detectable:
        return REPRODUCED, text
    half = (high - low) / 2
    if claim.effect is not None and half > claim.effect:
        return INCONCLUSIVE, (
            f"{text}: the study could call only a difference beyond +-{half:.3f}, more than the largest effect the "
            f"paper reports, {claim.effect:.3f} ({claim.effect_source})"
        )
    return NO_DIFFERENCE, f"{text}; the study could call a difference beyond +-{half:.3f}"


def claims_table(studies: Callable[[str, str], Mapping | None]) -> list[dict]:
    """Every claim on every organism, ``studies(study, organism)`` giving that study's
    ``study.json`` on the organism or None."""
    return [read_claim(c, o, studies(c.study, o) if o in c.organisms else None) for c in CLAIMS for o in ALL]


def study_path(root: str | Path, study: str, organism: str) -> Path:
    """Where ``workbench zoo --study STUDY --preset org-ORGANISM`` writes its ``study.json`` by
    default, under the organisms' directory ``root`` (``runs/organisms``)."""
    return Path(root) / organism / "studies" / study / "study.json"


def claims_from(root: str | Path) -> list[dict]:
    """The claims table from the studies found under the organisms' directory ``root`` (each
    ``study.json`` read once, however many claims it answers)."""
    read: dict[tuple[str, str], Mapping | None] = {}

    def found(study: str, organism: str) -> Mapping | None:
        if (study, organism) not in read:
            path = study_path(root, study, organism)
            read[study, organism] = read_json(path) if path.is_file() else None
        return read[study, organism]

    return claims_table(found)
