"""The seed papers' claims, each read from the study that tests it on a model organism.

A claim names its study, the organisms it can show on, the comparison of the study's declared
family that tests it (``study.json``'s ``family``: Holm-corrected, with simultaneous intervals)
and the sign the paper predicts. ``read_claim`` gives one verdict per claim and organism:

- ``reproduced at this scale``: the comparison is detectable with the predicted sign;
- ``not reproduced``: no detectable difference (with the smallest difference the study could
  have called, the half-width of its simultaneous interval), or the opposite sign detectable;
- ``not testable here``: the baseline did not reach its competence target at every seed, or the
  claim needs what this scale lacks (the reason is given);
- ``not measured yet``: the study has not been run on the organism (the command is given).

Each study's positive control is a test that plants an effect of known size through the same
readout and detects it (``CONTROLS``), so a "not reproduced" comes from a study that could see one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from workbench.storage.files import read_json
from workbench.training import stats

REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE, NOT_MEASURED = (
    "reproduced at this scale",
    "not reproduced",
    "not testable here",
    "not measured yet",
)
VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_TESTABLE, NOT_MEASURED)

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
    # the sign of the difference the paper predicts (+1 higher, -1 lower / earlier; 0: close, within
    # +-CLOSE)
    sign: int


ALL = ("flipflop", "perm", "addition")
CLAIMS = (
    Claim("fbt-loss", "FBT", "lower training loss at equal data", "fbt-vs-baseline", ALL,
          "fbt - baseline: plain-pass training loss, last half", -1),
    Claim("fbt-data-efficiency", "FBT", "reaches a loss in fewer steps (data efficiency)", "fbt-vs-baseline", ALL,
          "fbt - baseline: steps to the loss threshold", -1),
    Claim("fbt-fused-accuracy", "FBT", "fused decoding answers better than the baseline", "fbt-vs-baseline", ALL,
          "fbt fused - baseline: accuracy", 1),
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
          "hd2 - hd1: accuracy", 1),
    Claim("hd-streams-4", "HD", "gains grow with the stream count n (4 over 1)", "hd-ablations", ALL,
          "hd4 - hd1: accuracy", 1),
    Claim("hd-supervise-last", "HD", "last-stream supervision above all streams", "hd-ablations", ALL,
          "hd4-supervise-all - hd4: accuracy", -1),
    Claim("hd-readout-last", "HD", "last-stream readout above summed readouts", "hd-ablations", ALL,
          "hd4-readout-sum - hd4: accuracy", -1),
    Claim("hd-separate-kv", "HD", "separate key/value caches per stream above a shared one", "hd-ablations", ALL,
          "hd4-shared-kv - hd4: accuracy", -1),
    Claim("hd-cyclic", "HD", "cyclic replication keeps the function at an expansion (2 to 4 streams)", "hd-ablations",
          ALL, "hd4: loss jump at expansion 2->4", 0),
    Claim("hd-few-cross-layers", "HD", "a few cross-stream layers close to all layers", "hd-ablations", ALL,
          "hd4-cross-every-layer - hd4: accuracy", 0),
)  # fmt: skip


def command(claim: Claim, organism: str, seeds: int = 5) -> str:
    """The command that runs ``claim``'s study on ``organism``."""
    return f"workbench zoo --study {claim.study} --preset org-{organism} --seeds {seeds}"


def baseline_competence(study: Mapping) -> tuple[int, int]:
    """``(qualified, runs)`` of the study's baseline runs (one per seed): how many reached every
    competence target. A study without a ``baseline`` member (``three-pass``) counts the runs of its
    reference member (the first of its family's names after `` - ``), so its own models."""
    models = list(study.get("models", {}).values())
    reference = next((n.split(" - ")[1].split(":")[0] for n in study.get("family", {}) if " - " in n), None)
    for member in ("baseline", reference):
        runs = [r for r in models if r.get("member") == member]
        if runs:
            return sum(bool(r.get("competence", {}).get("qualified")) for r in runs), len(runs)
    return 0, 0


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
    }
    if organism not in claim.organisms:
        return {**row, "verdict": NOT_TESTABLE, "why": f"the claim cannot show on {organism}"}
    if study is None:
        return {**row, "verdict": NOT_MEASURED, "why": f"run `{command(claim, organism)}`"}
    qualified, seeds = baseline_competence(study)
    cell = study.get("family", {}).get(claim.comparison)
    if cell is None:
        return {**row, "verdict": NOT_MEASURED, "why": f"the study's family has no '{claim.comparison}' (an older run)"}
    row |= {"family_size": cell.get("family_size"), "p_holm": cell.get("p_holm"), "seeds": seeds}
    if seeds == 0 or qualified < seeds:
        return {
            **row,
            "verdict": NOT_TESTABLE,
            "why": f"the reference member reached its targets at {qualified} of {seeds} seeds",
        }
    elsewhere = _read_elsewhere(study)
    if elsewhere is not None:
        return {**row, **_interval(cell), "verdict": NOT_TESTABLE, "why": elsewhere}
    ceiling = _ceiling(claim, study, cell)
    if ceiling is not None:
        return {**row, **_interval(cell), "verdict": NOT_TESTABLE, "why": ceiling}
    verdict, why = _verdict(cell, claim.sign)  # NOT_TESTABLE too: a readout that cannot reach significance
    return {**row, **_interval(cell), "verdict": verdict, "why": why}


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
    beyond training) or the test problems; None where the study does not record it."""
    member, _, regime = arm.partition(" ")
    readings = study.get("readings", {})
    if study.get("study") == "hd-ablations":
        found = readings.get(member, {}).get("accuracy")
    else:
        where = readings.get("beyond", {}).get(test_set, {}) if test_set else readings.get("accuracy", {})
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
    if "earlier" in cell:
        return {"difference": None, "low": None, "high": None}
    return {"difference": cell["mean"], "low": cell.get("family_low", cell["low"]), "high": cell.get("family_high", cell["high"])}


def _verdict(cell: Mapping, sign: int) -> tuple[str, str]:
    detectable = stats.detectable(cell)
    if "earlier" in cell:  # steps to a threshold: a sign test of who got there first
        first = f"FBT first at {cell['earlier']} seeds, the baseline at {cell['later']}"
        pairs = cell["earlier"] + cell["later"] + cell["undetermined"]
        # all pairs one way, before any correction (Holm can only raise it): the best this readout can do
        smallest, alpha = min(1.0, 2 * 0.5**pairs), 1 - cell.get("level", 0.95)
        if smallest >= alpha:
            return NOT_TESTABLE, (
                f"at {pairs} seeds the sign test's smallest two-sided p is {smallest:.3g} (every seed one way), "
                f"not below {alpha:g} before any correction: {first}"
            )
        if detectable and (cell["earlier"] > cell["later"]) == (sign < 0):
            return REPRODUCED, first
        return NOT_REPRODUCED, ("the opposite is detectable: " if detectable else "no detectable difference: ") + first
    low, high = cell.get("family_low", cell["low"]), cell.get("family_high", cell["high"])
    text = f"{cell['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"
    if sign == 0:  # "close": the whole simultaneous interval within +-CLOSE
        if -CLOSE <= low and high <= CLOSE:
            return REPRODUCED, f"within +-{CLOSE}: {text}"
        if detectable:
            return NOT_REPRODUCED, f"a detectable difference: {text}"
        return NOT_REPRODUCED, f"undetermined: {text} is wider than +-{CLOSE}"
    if detectable and (cell["mean"] > 0) == (sign > 0):
        return REPRODUCED, text
    if detectable:
        return NOT_REPRODUCED, f"the opposite is detectable: {text}"
    return NOT_REPRODUCED, f"no detectable difference: {text}; the study could call a difference beyond +-{(high - low) / 2:.3f}"


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
