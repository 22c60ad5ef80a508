"""How many training seeds a study needs, chosen before it runs: from a pilot's variance components,
the half-width of the interval the study will print, so a study too small to detect its target
effect is known as such in advance rather than read as "no detectable difference" afterwards.

The prediction is the interval of ``workbench.training.stats`` itself, not a normal approximation:
the pilot matrix ``y[seed, problem]`` gives the components of ``y = mu + a_seed + b_problem + e``
(``components``), their expected mean squares at S seeds and P problems (MS_seed = P s_a^2 + s_e^2,
MS_problem = S s_b^2 + s_e^2, MS_resid = s_e^2) go through ``crossed_interval``'s variance, its
choice of terms and its Satterthwaite df (the same functions), and the quantile is ``family``'s Bonferroni one for a
family of m comparisons. Plugging a pilot's own components back in at its own size therefore gives
exactly the half-width ``family`` prints for it (``tests/workbench/test_power.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from scipy.stats import t as student_t

from workbench.training.stats import mean_squares, mean_variance

# The smallest effects the studies must be able to detect: 0.05 of accuracy, 0.02 nats of loss, 0.05 in lambda.
EFFECTS = {"accuracy": 0.05, "loss": 0.02, "lambda": 0.05}


def components(y) -> dict[str, float]:
    """The variance components ``{"seed": s_a^2, "problem": s_b^2, "residual": s_e^2}`` of a pilot
    [seeds, problems] matrix (a paired comparison's differences), from the mean squares as
    ``stats.crossed_interval`` computes them; a component estimated below 0 is 0. One problem (a
    per-seed number such as a loss): the spread across seeds is all there is, and it is the seed's."""
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 2 or y.shape[1] < 1:
        raise ValueError(f"components needs a [seeds, problems] pilot with at least 2 seeds, got shape {y.shape}")
    if not np.isfinite(y).all():
        raise ValueError("components needs finite values")
    S, P = y.shape
    if P == 1:
        return {"seed": float(y.var(ddof=1)), "problem": 0.0, "residual": 0.0}
    ms_seed, ms_problem, ms_resid = mean_squares(y)
    return {
        "seed": max(0.0, (ms_seed - ms_resid) / P),
        "problem": max(0.0, (ms_problem - ms_resid) / S),
        "residual": ms_resid,
    }


def predicted_half_width(
    components: Mapping[str, float], seeds: int, problems: int, family_size: int, level: float = 0.95
) -> float:
    """The half-width of the simultaneous (Bonferroni) interval ``stats.family`` would print for
    one of ``family_size`` comparisons measured at ``seeds`` x ``problems``, had the mean squares
    their expected values under ``components``. One problem: ``crossed_interval``'s one-way interval
    across seeds, se^2 = (s_a^2 + s_e^2) / S at S - 1 df (the one problem's own effect is fixed).
    A plug-in, not the mean of the realised half-width: over simulated 5 x 200 studies that mean is
    within 10% of it, some 8% below where seeds dominate, but about 20% above where a component is
    0, since the realised interval keeps that term whenever its mean square exceeds the residual's."""
    s_a, s_b, s_e = (float(components[k]) for k in ("seed", "problem", "residual"))
    if not all(math.isfinite(v) and v >= 0 for v in (s_a, s_b, s_e)):
        raise ValueError(f"predicted_half_width needs finite components >= 0, got {dict(components)}")
    if seeds < 2 or problems < 1 or family_size < 1:
        raise ValueError(
            f"predicted_half_width needs seeds >= 2, problems >= 1, family_size >= 1, got {seeds}, {problems}, {family_size}"
        )
    S, P = seeds, problems
    if P == 1:
        var, df = (s_a + s_e) / S, float(S - 1)
    else:
        var, df = mean_variance(P * s_a + s_e, S * s_b + s_e, s_e, S, P)
    if var <= 0.0:  # no spread: stats.family prints a zero-width interval
        return 0.0
    return float(student_t.ppf(1 - (1 - level) / (2 * family_size), df)) * math.sqrt(var)


def seeds_for(
    components: Mapping[str, float],
    problems: int,
    family_size: int,
    target: float,
    low: int = 5,
    high: int = 12,
    level: float = 0.95,
) -> dict:
    """The fewest seeds in [``low``, ``high``] whose predicted half-width is at most ``target``:
    ``{seeds, target, predicted: {S: half-width}, reason}``. When even ``high`` seeds fall short,
    ``seeds`` is None and ``reason`` says so: a study that cannot resolve its target effect is
    not run, since its "no detectable difference" would say nothing about the effect."""
    if not (isinstance(low, int) and isinstance(high, int) and 2 <= low <= high):
        raise ValueError(f"seeds_for needs integers 2 <= low <= high, got low={low}, high={high}")
    if not (isinstance(family_size, int) and family_size >= 1):
        raise ValueError(f"seeds_for needs family_size >= 1, got {family_size}")
    if not target > 0:
        raise ValueError(f"seeds_for needs a target > 0, got {target}")
    predicted = {S: predicted_half_width(components, S, problems, family_size, level) for S in range(low, high + 1)}
    seeds = next((S for S, half in predicted.items() if half <= target), None)
    reason = None
    if seeds is None:
        reason = f"the predicted half-width at {high} seeds ({predicted[high]:.4g}) exceeds the target {target:g}, so the readout is not run"
    return {"seeds": seeds, "target": target, "predicted": predicted, "reason": reason}


def power_step(pilot: Mapping[str, np.ndarray], problems: int, targets: Mapping[str, float]) -> dict:
    """The seeds a study needs (``seeds_for``, 5 to 12) so that each comparison of the ``pilot``
    (its name -> [pilot seeds, problems] differences) resolves its target effect (``targets``, by
    name) at ``problems`` problems in the family of all of them: the most any of them needs. A
    comparison that even 12 seeds cannot resolve is not run (``not_run``, with why): its "no
    detectable difference" would say nothing."""
    plans = {name: seeds_for(components(d), problems, len(targets), targets[name]) for name, d in pilot.items()}
    return {
        "seeds": max((p["seeds"] for p in plans.values() if p["seeds"] is not None), default=5),
        "comparisons": plans,
        "not_run": {name: p["reason"] for name, p in plans.items() if p["seeds"] is None},
    }
