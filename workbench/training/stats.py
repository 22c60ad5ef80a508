"""Statistics for comparisons: what an accuracy or a difference between models is, with the
uncertainty of both the training seeds and the test problems, and a wording that never calls
noise an effect.

A readout of a zoo is a matrix ``y[seed, problem]`` (1/0 for a correct answer, or a per-problem
loss): every seed's model is scored on the same problems, so seeds and problems are crossed, and
the quantity of interest is the mean over the population of both (another seed, other problems).
Its interval comes from the two-way random-effects model ``y = mu + a_seed + b_problem + e``:

    Var(grand mean) = s_a^2 / S + s_b^2 / P + s_e^2 / (S P)

estimated from the ANOVA mean squares (MS_seed = P s_a^2 + s_e^2, MS_problem = S s_b^2 + s_e^2,
MS_residual = s_e^2; a component estimated below 0 is 0), with Satterthwaite's degrees of freedom
for the Student-t quantile. A paired comparison of two architectures at matched seeds is the same
interval on the matrix of differences. Why not a bootstrap over seeds and problems: in a pilot
(400 simulations per case, 5 seeds, 200 problems) a nominal 95% two-way bootstrap covered the
known mean in 0.87 of cases where seeds dominate the variance (the percentile interval ignores
that the seed spread is itself estimated from few seeds) and 0.98 where problems do, and its
studentised form in 0.95-1.00 (it counts the residual variance up to three times), while this
interval covered in 0.935-0.955; ``tests/workbench/test_stats.py`` measures its coverage on 1,000
simulations per case.

How soon a run reaches a threshold (a loss, an accuracy) is a time to an event: a run that never
reaches it within its budget is censored there, never dropped, and the times are summarised by the
Kaplan-Meier curve and its median.

A single proportion (k of n) gets the Wilson interval, which stays inside [0, 1]; an accuracy over
seeds and problems, the crossed interval on the logit scale (``accuracy_interval``). A family of
comparisons (a study's declared set) is corrected by Holm's step-down method, and a difference is
"detectable" only when its Holm-adjusted p-value is below 1 - level and its simultaneous interval
excludes 0 (``detectable``): an interval that includes 0 is reported as no detectable difference,
with the count of seeds on each side beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t


def wilson(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval for a proportion of ``successes`` in ``n`` trials (inside [0, 1],
    of nonzero width at 0 and at n)."""
    if not (isinstance(n, int) and isinstance(successes, int)) or n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson needs 0 <= successes <= n and n >= 1, got {successes} of {n}")
    return _wilson_score(successes / n, n, float(norm.ppf(0.5 + level / 2)))


def crossed_interval(y, level: float = 0.95, bounds: tuple[float, float] | None = None) -> dict:
    """Mean of ``y`` [seeds, problems] with its two-way random-effects interval (module docstring):
    ``{mean, low, high, se, df, p, n_seeds, n_problems, level}``, ``p`` the two-sided p-value of
    mean 0. One seed: problems are the only variance measured (said by ``n_seeds``); one problem
    (a per-seed number such as a loss): the Student-t interval across seeds. ``bounds``: the range
    the mean cannot leave (``(0, 1)`` for an accuracy, ``(-1, 1)`` for a difference of two), to
    which the interval is clipped: the true value lies inside, so clipping never loses coverage."""
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 1 or y.shape[1] < 1 or y.size < 2:
        raise ValueError(f"crossed_interval needs a [seeds, problems] matrix of at least 2 values, got shape {y.shape}")
    if not np.isfinite(y).all():
        raise ValueError("crossed_interval needs finite values")
    S, P = y.shape
    mean = float(y.mean())
    if S == 1 or P == 1:  # one way: the values along the other axis are the replicates
        values = y.ravel()
        var, df = float(values.var(ddof=1)) / values.size, values.size - 1
    else:
        var, df = mean_variance(*mean_squares(y), S, P)
    se = math.sqrt(max(var, 0.0))
    if se == 0.0:  # every value equal: no spread measured
        return _cell(mean, mean, mean, 0.0, df, 0.0 if mean else 1.0, S, P, level)
    q = float(student_t.ppf(0.5 + level / 2, df))
    p = float(2 * student_t.sf(abs(mean) / se, df))
    low, high = mean - q * se, mean + q * se
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
        return {**_cell(mean, low, high, se, df, p, S, P, level), "bounds": list(bounds)}
    return _cell(mean, low, high, se, df, p, S, P, level)


def mean_squares(y: np.ndarray) -> tuple[float, float, float]:
    """The two-way ANOVA mean squares ``(MS_seed, MS_problem, MS_residual)`` of a [seeds, problems]
    matrix with at least 2 of each."""
    S, P = y.shape
    ms_seed = P * float(y.mean(axis=1).var(ddof=1))
    ms_problem = S * float(y.mean(axis=0).var(ddof=1))
    resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + float(y.mean())
    return ms_seed, ms_problem, float((resid**2).sum()) / ((S - 1) * (P - 1))


def mean_variance(ms_seed: float, ms_problem: float, ms_resid: float, S: int, P: int) -> tuple[float, float]:
    """The grand mean's variance from the mean squares (module docstring; a component whose mean
    square is below the residual's is estimated as 0) and its Satterthwaite df: ``(var, df)``."""
    # var * S * P = c_seed MS_seed + c_problem MS_problem + c_resid MS_resid
    c_seed, c_problem = float(ms_seed > ms_resid), float(ms_problem > ms_resid)
    terms = [(c_seed, ms_seed, S - 1), (c_problem, ms_problem, P - 1), (1 - c_seed - c_problem, ms_resid, (S - 1) * (P - 1))]
    total = sum(c * ms for c, ms, _ in terms)
    denominator = sum((c * ms) ** 2 / d for c, ms, d in terms if c)
    return total / (S * P), (total**2 / denominator if denominator > 0 else float("inf"))


RARE = 10  # fewer answers of the rarer kind than this: no clustering can be estimated (accuracy_interval)


def accuracy_interval(correct, level: float = 0.95) -> dict:
    """An accuracy's interval from a [seeds, problems] matrix of 1/0 answers: ``crossed_interval``'s
    cell with ``low`` / ``high`` taken on the logit scale (the delta method: logit(p) +- t * se /
    (p (1 - p)), se at least the binomial one, t at Satterthwaite's df), which bends toward the bound
    the accuracy sits near, as the spread of the seeds does; where fewer than ``RARE`` answers are
    of the rarer kind, the variance components cannot be estimated, and it is the Wilson interval of
    all seeds' answers together (of nonzero width at 0 and 1). By simulation (tests/workbench/
    test_stats.py) it covers where the crossed interval does not: 0.98 of samples against 0.46 at a
    true accuracy of 0.9994 on 5 x 200 answers, 0.94 against 0.90 where seeds dominate."""
    y = np.asarray(correct, dtype=np.float64)
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("accuracy_interval needs a matrix of 1/0 answers")
    cell = crossed_interval(y, level, bounds=(0.0, 1.0))
    n, k = y.size, float(y.sum())
    p = k / n
    if min(k, n - k) < RARE:
        low, high = _wilson_score(p, n, float(norm.ppf(0.5 + level / 2)))
    else:
        se = max(cell["se"], math.sqrt(p * (1 - p) / n))
        half = float(student_t.ppf(0.5 + level / 2, cell["df"])) * se / (p * (1 - p))
        centre = math.log(p / (1 - p))
        low, high = 1 / (1 + math.exp(half - centre)), 1 / (1 + math.exp(-centre - half))
    return {**cell, "low": low, "high": high, "interval": "logit" if min(k, n - k) >= RARE else "wilson"}


def _wilson_score(p: float, n: float, z: float) -> tuple[float, float]:
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _cell(mean, low, high, se, df, p, S, P, level) -> dict:
    return {
        "mean": mean,
        "low": low,
        "high": high,
        "se": se,
        "df": float(df),
        "p": p,
        "n_seeds": S,
        "n_problems": P,
        "level": level,
    }


def paired_difference(a, b, level: float = 0.95, bounds: tuple[float, float] | None = None) -> dict:
    """``b - a`` for two models scored at matched seeds on the same problems ([seeds, problems]
    each): the crossed interval of the differences (clipped to ``bounds``), with ``seeds_higher`` /
    ``seeds_lower`` counting the seeds whose mean difference is above / below 0."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired_difference needs matrices of one shape, got {a.shape} and {b.shape}")
    d = b - a
    per_seed = d.mean(axis=1)
    return {
        **crossed_interval(d, level, bounds),
        "seeds_higher": int((per_seed > 0).sum()),
        "seeds_lower": int((per_seed < 0).sum()),
    }


def kaplan_meier(times: Sequence[float], events: Sequence[bool]) -> list[tuple[float, float]]:
    """The Kaplan-Meier estimate of the fraction of runs that have not yet reached a threshold:
    ``[(t, S(t))]`` just after each distinct time at which one did (``events`` true), S the
    product over those times of 1 - reached / still at risk. A run censored (never reached it
    within its budget, ``events`` false) at time t is at risk up to and including t, never dropped."""
    if len(times) != len(events) or not times:
        raise ValueError(f"kaplan_meier needs one event flag per time, got {len(times)} times and {len(events)} flags")
    curve, survival = [], 1.0
    for t in sorted({float(t) for t, e in zip(times, events) if e}):
        at_risk = sum(float(u) >= t for u in times)
        reached = sum(float(u) == t and bool(e) for u, e in zip(times, events))
        survival *= 1.0 - reached / at_risk
        curve.append((t, survival))
    return curve


def median_time(times: Sequence[float], events: Sequence[bool]) -> float | None:
    """The first time at which the Kaplan-Meier fraction not yet at the threshold is at most 1/2;
    None when more than half of the runs may never reach it (censored before that)."""
    return next((t for t, survival in kaplan_meier(times, events) if survival <= 0.5), None)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p times (m - i),
    made non-decreasing along that order and capped at 1."""
    ps = [float(p) for p in p_values]
    if not all(0.0 <= p <= 1.0 for p in ps):
        raise ValueError(f"holm needs p-values in [0, 1], got {ps}")
    m, adjusted, running = len(ps), [0.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(m), key=ps.__getitem__)):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def family(cells: Mapping[str, dict]) -> dict[str, dict]:
    """A study's declared family of comparisons (name -> ``paired_difference`` or ``crossed_interval``
    cell), each given ``p_holm`` (Holm over the family, named by ``family_size``), for a cell with
    an interval the simultaneous interval over the family ``family_low`` / ``family_high``
    (Bonferroni: the level 1 - (1 - level) / m interval, which holds for all m together), and
    ``detectable`` by the one reading rule (``detectable``)."""
    names = list(cells)
    adjusted = holm([cells[n]["p"] for n in names])
    out = {}
    for n, p in zip(names, adjusted):
        cell = {**cells[n], "p_holm": p, "family_size": len(names)}
        if "se" in cell and "df" in cell:
            q = float(student_t.ppf(1 - (1 - cell["level"]) / (2 * len(names)), cell["df"])) if cell["se"] > 0 else 0.0
            low, high = cell["mean"] - q * cell["se"], cell["mean"] + q * cell["se"]
            if "bounds" in cell:
                low, high = max(low, cell["bounds"][0]), min(high, cell["bounds"][1])
            cell["family_low"], cell["family_high"] = low, high
        out[n] = cell | {"detectable": detectable(cell)}
    return out


def detectable(cell: Mapping) -> bool:
    """The one reading rule: a difference is detectable when the interval printed beside it (the
    family's simultaneous one where there is one) excludes 0 and, in a family, Holm's adjusted p is
    below 1 - level. Holm is less conservative than the Bonferroni interval for all but the
    smallest p, so it alone could detect a difference whose printed interval holds 0; that reads
    "no detectable difference". A sign-test cell (in studies measured before their readouts had an
    interval) has none: Holm's p decides. Computed from the cell, so a stored ``detectable`` written under an older rule is
    not read."""
    if "p_holm" in cell and not cell["p_holm"] < 1 - cell.get("level", 0.95):
        return False
    if "earlier" in cell:
        return cell.get("p_holm", cell["p"]) < 1 - cell.get("level", 0.95)
    low, high = cell.get("family_low", cell["low"]), cell.get("family_high", cell["high"])
    return low > 0 or high < 0


def describe(cell: dict, digits: int = 3) -> str:
    """The wording rule: ``+0.052 [+0.013, +0.091], 5 of 5 seeds higher`` for a detectable
    difference; ``no detectable difference: +0.010 [-0.021, +0.041], 3 of 5 seeds higher`` for one
    whose interval includes 0, or whose Holm-adjusted p (when the cell has one) is not below
    1 - level (``detectable``). A family's cell shows its simultaneous interval."""
    low, high = cell.get("family_low", cell["low"]), cell.get("family_high", cell["high"])
    text = f"{cell['mean']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"
    if "seeds_higher" in cell:
        text += f", {cell['seeds_higher']} of {cell['n_seeds']} seeds higher"
    if "p_holm" in cell:
        text += f", Holm p = {cell['p_holm']:.3g} over {cell['family_size']}"
    return text if detectable(cell) else f"no detectable difference: {text}"
