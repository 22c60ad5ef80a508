"""workbench.training.stats: known answers derived by hand or from scipy, and the coverage of the
seed-by-problem interval measured by simulation."""

import math

import numpy as np
import pytest
from scipy.stats import binomtest
from scipy.stats import t as student_t

from workbench.training import stats
from workbench.training.intervals import seed_interval


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (3, 10), (47, 96), (500, 1000), (1, 1)])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_wilson_is_scipys_wilson_interval_and_stays_in_0_1(k, n, level):
    expected = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    low, high = stats.wilson(k, n, level)
    assert low == pytest.approx(expected.low, abs=1e-12) and high == pytest.approx(expected.high, abs=1e-12)
    assert 0.0 <= low < high <= 1.0


def test_the_crossed_interval_of_a_two_by_two_matrix_by_hand():
    """y = [[1, 2], [3, 6]]: mean 3; seed means 1.5, 4.5 give MS_seed = 2 x 4.5 = 9; problem means
    2, 4 give MS_problem = 2 x 2 = 4; residuals +-0.5 give MS_resid = 1. Var = (9 + 4 - 1) / 4 = 3;
    Satterthwaite df = 12^2 / (9^2 + 4^2 + 1^2) = 144 / 98."""
    cell = stats.crossed_interval([[1.0, 2.0], [3.0, 6.0]])
    df = 144 / 98
    half = student_t.ppf(0.975, df) * math.sqrt(3)
    assert cell["mean"] == 3.0 and cell["se"] == pytest.approx(math.sqrt(3)) and cell["df"] == pytest.approx(df)
    assert cell["low"] == pytest.approx(3 - half) and cell["high"] == pytest.approx(3 + half)
    assert cell["p"] == pytest.approx(2 * student_t.sf(3 / math.sqrt(3), df))


def test_a_variance_component_estimated_below_zero_is_zero():
    """y = [[1, 0], [0, 1]]: seed and problem means are all 0.5 (MS 0), residuals +-0.5 (MS 1):
    both components are estimated at 0, leaving Var = MS_resid / 4 = 0.25 on 1 degree of freedom."""
    cell = stats.crossed_interval([[1.0, 0.0], [0.0, 1.0]])
    assert cell["se"] == pytest.approx(0.5) and cell["df"] == pytest.approx(1.0)
    assert cell["high"] - cell["mean"] == pytest.approx(student_t.ppf(0.975, 1) * 0.5)


def test_one_problem_is_the_student_t_interval_across_seeds_and_one_seed_across_problems():
    values = [0.61, 0.72, 0.55, 0.68]
    across_seeds = stats.crossed_interval(np.array(values)[:, None])
    reference = seed_interval(values)
    assert across_seeds["low"] == pytest.approx(reference["low"]) and across_seeds["high"] == pytest.approx(reference["high"])
    across_problems = stats.crossed_interval(np.array(values)[None, :])
    assert across_problems["low"] == pytest.approx(reference["low"]) and across_problems["n_seeds"] == 1


def _simulate_coverage(S, P, sd_seed, sd_problem, sd_resid, binary, sims=1000, seed=0, interval=stats.crossed_interval):
    rng = np.random.default_rng(seed)
    if binary:  # the mean of a logistic model over seeds and problems, by a large sample
        a, b = rng.normal(0, sd_seed, 2000)[:, None], rng.normal(0, sd_problem, 2000)[None]
        truth = float((1 / (1 + np.exp(-(0.8 + a + b)))).mean())
    covered = 0
    for _ in range(sims):
        a, b = rng.normal(0, sd_seed, (S, 1)), rng.normal(0, sd_problem, (1, P))
        if binary:
            y = (rng.random((S, P)) < 1 / (1 + np.exp(-(0.8 + a + b)))).astype(float)
        else:
            y, truth = 0.5 + a + b + rng.normal(0, sd_resid, (S, P)), 0.5
        cell = interval(y)
        covered += cell["low"] <= truth <= cell["high"]
    return covered / sims


@pytest.mark.parametrize(
    "case",
    [
        dict(S=5, P=200, sd_seed=0.1, sd_problem=0.01, sd_resid=0.3, binary=False),  # seeds dominate
        dict(S=5, P=200, sd_seed=0.0, sd_problem=0.2, sd_resid=0.3, binary=False),  # problems dominate
        dict(S=5, P=200, sd_seed=0.05, sd_problem=0.1, sd_resid=0.3, binary=False),
        dict(S=5, P=200, sd_seed=0.3, sd_problem=1.0, sd_resid=0.0, binary=True),  # accuracies
    ],
)
def test_the_95_percent_interval_covers_the_known_mean_in_93_to_97_percent_of_1000_simulations(case):
    coverage = _simulate_coverage(**case)
    assert 0.93 <= coverage <= 0.97, coverage


def test_the_coverage_simulation_fails_an_interval_that_ignores_the_problems():
    """The control: a Student-t interval across seed means alone, which treats the problems as
    fixed, covers the mean over problems far too rarely where problems vary."""

    def seeds_only(y):
        return seed_interval(y.mean(axis=1))

    case = dict(S=5, P=200, sd_seed=0.0, sd_problem=0.2, sd_resid=0.3, binary=False)
    assert _simulate_coverage(**case, interval=seeds_only) < 0.9


def test_holm_by_hand():
    """p = 0.01, 0.04, 0.03, 0.005: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 gives 0.02,
    0.03, 0.06, 0.04, made non-decreasing: 0.02, 0.03, 0.06, 0.06."""
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0] and stats.holm([]) == []


def test_a_paired_difference_counts_seeds_and_is_the_interval_of_the_differences():
    rng = np.random.default_rng(1)
    a = rng.random((3, 50))
    b = a + np.array([[0.02], [-0.01], [0.03]]) + rng.normal(0, 0.1, (3, 50))
    cell = stats.paired_difference(a, b)
    assert {k: cell[k] for k in ("seeds_higher", "seeds_lower")} == {"seeds_higher": 2, "seeds_lower": 1}
    assert cell["mean"] == pytest.approx(stats.crossed_interval(b - a)["mean"])
    with pytest.raises(ValueError, match="one shape"):
        stats.paired_difference(a, b[:, :10])


def test_the_wording_rule_never_calls_an_interval_through_zero_an_effect():
    noise = {"mean": 0.01, "low": -0.02, "high": 0.04, "n_seeds": 5, "seeds_higher": 5, "level": 0.95}
    assert stats.describe(noise).startswith("no detectable difference: +0.010 [-0.020, +0.040], 5 of 5 seeds higher")
    effect = {**noise, "low": 0.005, "p": 0.004}
    assert stats.describe(effect) == "+0.010 [+0.005, +0.040], 5 of 5 seeds higher"
    # the same effect in a family of three where Holm leaves it at 0.012 (detectable) or 0.06 (not)
    family = stats.family({"x": effect, "y": {**effect, "p": 0.5}, "z": {**effect, "p": 0.02}})
    assert family["x"]["p_holm"] == pytest.approx(0.012) and family["x"]["detectable"]
    assert family["z"]["p_holm"] == pytest.approx(0.04) and family["z"]["detectable"]
    weak = stats.family({"x": {**effect, "p": 0.02}, "y": {**effect, "p": 0.03}, "z": {**effect, "p": 0.5}})
    assert not weak["x"]["detectable"] and stats.describe(weak["x"]).startswith("no detectable difference")
    assert "Holm p = 0.06 over 3" in stats.describe(weak["x"])


@pytest.mark.parametrize("bad", [[[1.0]], [], [[1.0, float("nan")]], [1.0, 2.0]])
def test_crossed_interval_refuses_what_is_not_a_matrix_of_two_finite_values(bad):
    with pytest.raises(ValueError):
        stats.crossed_interval(bad)


def test_kaplan_meier_by_hand_keeps_censored_runs_at_risk():
    """Times 1, 2, 2, 3, 4, reached at 1, 2 (one of the two) and 3, censored at 2 and 4. At t=1, 1
    of 5 at risk: S = 4/5. At t=2, 1 of 4 (the run censored at 2 is still at risk): S = 4/5 x 3/4 =
    3/5. At t=3, 1 of 2: S = 3/10. The median is 3, the first time S <= 1/2."""
    times, events = [1, 2, 2, 3, 4], [True, True, False, True, False]
    curve = stats.kaplan_meier(times, events)
    assert [t for t, _ in curve] == [1.0, 2.0, 3.0]
    assert [s for _, s in curve] == pytest.approx([0.8, 0.6, 0.3])
    assert stats.median_time(times, events) == 3.0


def test_a_median_time_is_none_when_most_runs_never_reach_the_threshold():
    """Dropping the censored runs would give a median of 1; keeping them, S never falls to 1/2."""
    assert stats.median_time([1, 10, 10], [True, False, False]) is None
    assert stats.kaplan_meier([1, 10, 10], [True, False, False]) == [(1.0, pytest.approx(2 / 3))]


def test_bounds_clip_an_interval_to_the_range_its_mean_cannot_leave():
    """Accuracies 0.9 and 1.0 at two seeds (one problem each): t(1) = 12.71 x se 0.05 reaches 1.59;
    clipped to (0, 1) the upper end is 1, the lower end and the p-value are unchanged."""
    free = stats.crossed_interval([[0.9], [1.0]])
    clipped = stats.crossed_interval([[0.9], [1.0]], bounds=(0.0, 1.0))
    assert free["high"] > 1.5 and clipped["high"] == 1.0
    assert clipped["low"] == free["low"] and clipped["p"] == free["p"]
    assert stats.paired_difference([[0.0], [0.3]], [[0.9], [1.0]], bounds=(-1.0, 1.0))["high"] == 1.0  # 0.8 +- 12.7 x 0.1


def test_a_familys_simultaneous_interval_is_bonferronis_by_hand():
    """mean 1, se 0.5, df 4 in a family of 3: the simultaneous 95% interval is the 1 - 0.05/3 one,
    1 +- t(0.99167, 4) x 0.5 = 1 +- 1.981 (t = 3.961), wider than the single 1 +- 1.388; a bounded
    cell is clipped to its bounds."""
    cell = {"mean": 1.0, "low": 1 - 1.388, "high": 1 + 1.388, "se": 0.5, "df": 4.0, "p": 0.1, "level": 0.95}
    out = stats.family({"a": cell, "b": {**cell, "p": 0.5}, "c": {**cell, "bounds": [-1.0, 1.0], "p": 0.6}})
    half = student_t.ppf(1 - 0.05 / 6, 4) * 0.5
    assert half == pytest.approx(1.981, abs=1e-3)
    assert out["a"]["family_low"] == pytest.approx(1 - half) and out["a"]["family_high"] == pytest.approx(1 + half)
    assert out["c"]["family_high"] == 1.0
    assert stats.describe(out["a"]).startswith(f"no detectable difference: +1.000 [{1 - half:+.3f}, {1 + half:+.3f}]")


def test_a_seed_interval_of_accuracies_stays_in_0_1():
    """Flip-flop accuracies 0.906, 0.760, 0.667 (the zoo's baseline): the Student-t interval's upper
    end is 1.077; clipped to an accuracy's range it is 1, the mean and lower end unchanged."""
    from workbench.training.intervals import ACCURACY

    free, clipped = seed_interval([0.906, 0.760, 0.667]), seed_interval([0.906, 0.760, 0.667], bounds=ACCURACY)
    assert free["high"] == pytest.approx(1.077, abs=1e-3) and clipped["high"] == 1.0
    assert clipped["low"] == free["low"] and clipped["mean"] == free["mean"]


def test_a_difference_holm_detects_is_not_read_detectable_while_its_printed_interval_holds_0():
    """A family of 3, df 4, se 1: p 0.001, 0.02 (t = 3.747) and 0.5. Holm multiplies the second
    smallest by 2: 0.04 < 0.05, so Holm alone detects it; its simultaneous interval is
    3.747 +- 3.961 (Bonferroni's t(1 - 0.05/6, 4)), which holds 0. The one reading rule: a
    difference is detectable only when Holm's p is below 0.05 and the interval printed beside it
    excludes 0, so it reads "no detectable difference" in the cell, in ``describe`` and in
    ``detectable``; the first (t = 8.61 > 3.961) stays detectable."""
    q = student_t.ppf(1 - 0.01, 4)
    cell = {"mean": q, "low": q - 2.776, "high": q + 2.776, "se": 1.0, "df": 4.0, "p": 0.02, "level": 0.95}
    out = stats.family({"a": {**cell, "mean": 8.61, "p": 0.001}, "b": cell, "c": {**cell, "mean": 0.74, "p": 0.5}})
    assert out["b"]["p_holm"] == pytest.approx(0.04) and out["b"]["family_low"] < 0 < out["b"]["family_high"]
    assert not out["b"]["detectable"] and not stats.detectable(out["b"])
    assert stats.describe(out["b"]).startswith("no detectable difference")
    assert out["a"]["detectable"] and stats.detectable(out["a"]) and not stats.detectable(out["c"])
    # a stored cell written under the old rule (detectable by Holm alone) reads by the new one
    assert not stats.detectable({**out["b"], "detectable": True})
    # a sign-test cell has no interval: Holm's p alone decides
    assert stats.detectable({"earlier": 5, "later": 0, "undetermined": 0, "p": 0.01, "p_holm": 0.03, "level": 0.95})


def test_an_accuracy_at_the_ceiling_gets_the_wilson_interval_of_all_answers_never_zero_width():
    every = np.ones((5, 200))
    cell = stats.accuracy_interval(every)
    low, high = stats.wilson(1000, 1000)
    assert (cell["low"], cell["high"], cell["interval"]) == (pytest.approx(low), 1.0, "wilson") and cell["low"] < 0.997
    assert stats.crossed_interval(every, bounds=(0.0, 1.0))["low"] == 1.0  # what it replaces: zero width
    few = every.copy()
    few[2, :9] = 0  # nine wrong answers, all at one seed: too few to estimate the seeds' spread
    assert stats.accuracy_interval(few)["low"] == pytest.approx(stats.wilson(991, 1000)[0])


def test_an_accuracy_away_from_the_bounds_is_the_crossed_interval_on_the_logit_scale_by_hand():
    rng = np.random.default_rng(3)
    y = (rng.random((5, 200)) < np.array([[0.6], [0.7], [0.65], [0.8], [0.75]])).astype(float)
    crossed = stats.crossed_interval(y, bounds=(0.0, 1.0))
    p = y.mean()
    half = student_t.ppf(0.975, crossed["df"]) * crossed["se"] / (p * (1 - p))
    logit = math.log(p / (1 - p))
    cell = stats.accuracy_interval(y)
    assert cell["interval"] == "logit" and cell["mean"] == crossed["mean"] and cell["se"] == crossed["se"]
    assert cell["low"] == pytest.approx(1 / (1 + math.exp(-(logit - half))))
    assert cell["high"] == pytest.approx(1 / (1 + math.exp(-(logit + half))))
    with pytest.raises(ValueError, match="1/0 answers"):
        stats.accuracy_interval([[0.5, 1.0]])


def _accuracy_coverage(sd_seed, sd_problem, base, sims=1000, seed=0, interval=stats.accuracy_interval) -> float:
    """How often ``interval`` holds the mean accuracy of a logistic model over seeds and problems
    (5 seeds x 200 problems)."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, sd_seed, 4000)[:, None], rng.normal(0, sd_problem, 4000)[None]
    truth = float((1 / (1 + np.exp(-(base + a + b)))).mean())
    covered = 0
    for _ in range(sims):
        a, b = rng.normal(0, sd_seed, (5, 1)), rng.normal(0, sd_problem, (1, 200))
        y = (rng.random((5, 200)) < 1 / (1 + np.exp(-(base + a + b)))).astype(float)
        cell = interval(y)
        covered += cell["low"] <= truth <= cell["high"]
    return covered / sims


@pytest.mark.slow
@pytest.mark.parametrize(
    "sd_seed, sd_problem, base, band",
    [
        (0.3, 1.0, 0.8, (0.93, 0.97)),  # the accuracies case of the crossed interval's test
        (1.0, 0.3, 0.5, (0.93, 0.97)),  # seeds dominate
        (2.0, 0.3, 1.0, (0.93, 0.97)),  # seeds dominate more (the crossed interval: 0.90)
        # a true accuracy of 0.9994 on 1,000 answers: the count of wrong ones is about Poisson(0.6), so
        # every interval of the counts covers in 0.878 (X <= 1 covered) or at least 0.977 (X <= 2)
        (0.0, 0.0, math.log(0.9994 / 0.0006), (0.93, 0.99)),
    ],
)
def test_the_accuracy_interval_covers_where_seeds_dominate_and_at_the_ceiling(sd_seed, sd_problem, base, band):
    coverage = _accuracy_coverage(sd_seed, sd_problem, base)
    assert band[0] <= coverage <= band[1], coverage


@pytest.mark.slow
def test_the_crossed_interval_alone_misses_the_ceiling_and_the_dominant_seeds():
    """The control: on the same simulations the crossed interval, zero width at 100%, covers the
    ceiling case far less often, and the seed-dominated one below the band."""

    def crossed(y):
        return stats.crossed_interval(y, bounds=(0.0, 1.0))

    assert _accuracy_coverage(0.0, 0.0, math.log(0.9994 / 0.0006), interval=crossed) < 0.6
    assert _accuracy_coverage(2.0, 0.3, 1.0, interval=crossed) < 0.92
