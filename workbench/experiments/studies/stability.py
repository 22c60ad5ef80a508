"""``stability`` (why FBT's feedback decoding works or collapses): FBT trained with one of the
seeds' stabilising knobs moved from its default at a time, against FBT at the defaults (``fbt``).
The knobs: the share of deeper feedback batches (``fbt.three_pass_fraction``, default 0.03, up to
every batch, since a one-seed pilot's accuracy still rose at 0.3), the deepest pass
(``fbt.deepest``, 3), the jitter on fed-back states (``fbt.state_noise``, 0.01), the plain prefix
mixed into each sequence (``fbt.prefix_max``, 0.5) and whether fed-back states carry gradients
(``fbt.detach``, false). The readouts are ``three-pass``'s, on each member's own task: ``soft``
and ``fused`` accuracy, the K-pass residual at K = 8 and lambda(1000) of the carried-state map.
Its family: each knob minus the defaults in those four. Where a knob makes the feedback map
contract and decoding work, or none does, is the finding."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.experiments.power import EFFECTS, power_step
from workbench.experiments.studies import three_pass
from workbench.experiments.studies.common import Member, add_paired
from workbench.training.intervals import ACCURACY_DIFFERENCE
from workbench.training.zoo import SCALES

REFERENCE = "fbt"  # the seeds' defaults
KNOBS = {
    REFERENCE: [],
    "fbt-deeper0": ["fbt.three_pass_fraction=0"],
    "fbt-deeper0.1": ["fbt.three_pass_fraction=0.1"],
    "fbt-deeper0.3": ["fbt.three_pass_fraction=0.3"],
    "fbt-deeper0.6": ["fbt.three_pass_fraction=0.6"],
    "fbt-deeper1": ["fbt.three_pass_fraction=1"],
    "fbt-deepest4": ["fbt.deepest=4"],
    "fbt-jitter0": ["fbt.state_noise=0"],
    "fbt-jitter0.05": ["fbt.state_noise=0.05"],
    "fbt-prefix0": ["fbt.prefix_max=0"],
    "fbt-prefix1": ["fbt.prefix_max=1"],
    "fbt-detached": ["fbt.detach=true"],
}
READOUTS = (  # (name in the family, where in a member's readings)
    ("fused accuracy", ("accuracy", "fused")),
    ("soft accuracy", ("accuracy", "soft")),
    ("lambda(1000)", ("lyapunov_tangent", "1000")),
    ("residual K=8", ("kpass_residual", "8")),
)
# the effect each readout's comparisons must resolve: ``power.EFFECTS``'s accuracy and lambda; the
# K = 8 residual, a fraction of the state's size, is held to lambda's
TARGETS = {
    "fused accuracy": EFFECTS["accuracy"],
    "soft accuracy": EFFECTS["accuracy"],
    "lambda(1000)": EFFECTS["lambda"],
    "residual K=8": EFFECTS["lambda"],
}


def members(scale: str) -> list[Member]:
    steps = SCALES[scale]["steps"]
    return [(name, "fbt", [f"train.steps={steps}", *overrides], None) for name, overrides in KNOBS.items()]


def measure(models: dict, out: Path, scale: str, threads: int, jobs: int) -> dict:
    return three_pass.three_pass(models, out, three_pass.HORIZONS[scale], threads, jobs)


def family(readings: dict) -> dict[str, dict]:
    """Each knob minus the defaults, paired by seed, in each of ``READOUTS`` it was measured in."""
    cells: dict[str, dict] = {}
    reference = readings.get(REFERENCE)
    for member, r in readings.items():
        if reference is None or member == REFERENCE:
            continue
        for label, (key, at) in READOUTS:
            if at in r[key] and at in reference[key]:
                bounds = ACCURACY_DIFFERENCE if key == "accuracy" else None
                add_paired(cells, f"{member} - {REFERENCE}: {label}", reference[key][at]["values"], r[key][at]["values"], bounds)
    return cells


def seeds_needed(readings: dict) -> dict:
    """``power.power_step`` with a run of this study at two or more seeds as its pilot: the seeds (5
    to 12) at which each comparison of the family resolves its readout's target (``TARGETS``) in
    the simultaneous interval over all of them, from the spread of the per-seed differences the run
    measured; what 12 seeds cannot resolve is listed with why."""
    reference = readings[REFERENCE]
    pilot = {
        f"{member} - {REFERENCE}: {label}": np.subtract(r[key][at]["values"], reference[key][at]["values"])[:, None]
        for member, r in readings.items()
        if member != REFERENCE
        for label, (key, at) in READOUTS
        if at in r[key] and at in reference[key]  # a horizon short of 1000 steps has no lambda(1000)
    }
    return power_step(pilot, 1, {name: TARGETS[name.rsplit(": ", 1)[1]] for name in pilot})


rows = three_pass.rows
