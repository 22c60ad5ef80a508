"""workbench.experiments.power: known answers derived by hand or from scipy, exact agreement with the
interval ``workbench.training.stats`` prints, and the prediction against simulated studies."""

import math

import numpy as np
import pytest
from scipy.stats import t as student_t

from workbench.experiments import power
from workbench.training import stats


def _simulate(rng, comp, S, P):
    """One matrix of y = a_seed + b_problem + e with the given variance components."""
    a = rng.normal(0.0, math.sqrt(comp["seed"]), (S, 1))
    b = rng.normal(0.0, math.sqrt(comp["problem"]), (1, P))
    return a + b + rng.normal(0.0, math.sqrt(comp["residual"]), (S, P))


def _family_half_width(cell, m):
    """The half-width stats.family prints for ``cell`` in a family of m comparisons."""
    printed = stats.family({f"c{i}": cell for i in range(m)})["c0"]
    return (printed["family_high"] - printed["family_low"]) / 2


@pytest.mark.parametrize("m", [1, 6])
@pytest.mark.parametrize("S", [2, 5, 12])
def test_one_problem_is_the_t_interval_across_seeds_by_hand(S, m):
    """s_a^2 = 0.01 at one problem: se = 0.1 / sqrt(S) at S - 1 df, quantile 1 - 0.05 / (2 m)."""
    half = power.predicted_half_width({"seed": 0.01, "problem": 0.0, "residual": 0.0}, S, 1, m)
    assert half == pytest.approx(student_t.ppf(1 - 0.05 / (2 * m), S - 1) * 0.1 / math.sqrt(S), rel=1e-12)


def test_two_way_known_answers_by_hand():
    """Residual only: MS_seed = MS_problem = MS_resid, so only the residual term is kept: var = 1 / (S P)
    at (S-1)(P-1) df. Seed only: MS_seed = P, the others 0, so var = P / (S P) = 1 / S at df
    P^2 / (P^2 / (S - 1)) = S - 1. Zero variance: zero width, as stats.family prints it."""
    S, P = 5, 200
    residual = power.predicted_half_width({"seed": 0.0, "problem": 0.0, "residual": 1.0}, S, P, 1)
    assert residual == pytest.approx(student_t.ppf(0.975, (S - 1) * (P - 1)) / math.sqrt(S * P), rel=1e-12)
    seed = power.predicted_half_width({"seed": 1.0, "problem": 0.0, "residual": 0.0}, S, P, 3)
    assert seed == pytest.approx(student_t.ppf(1 - 0.05 / 6, S - 1) / math.sqrt(S), rel=1e-12)
    assert power.predicted_half_width({"seed": 0.0, "problem": 0.0, "residual": 0.0}, S, P, 6) == 0.0


def test_components_of_a_balanced_constructed_matrix_by_hand():
    """y = a[s] + b[p] + u[s] v[p] with u, v of mean 0: the seed and problem means carry a and b
    alone and the residual is u v, so MS_seed = P var(a), MS_problem = S var(b), MS_resid =
    sum(u^2) sum(v^2) / ((S-1)(P-1)) = var(u) var(v) (all sample variances, ddof 1)."""
    a, b = np.array([0.3, -0.1, 0.5, 0.2]), np.array([1.0, 0.0, -2.0, 0.5, 0.25, 3.0])
    u, v = np.array([1.0, -1.0, 0.5, -0.5]), np.array([0.2, -0.2, 0.1, -0.1, 0.0, 0.0])
    S, P = len(a), len(b)
    s_e = u.var(ddof=1) * v.var(ddof=1)
    got = power.components(a[:, None] + b[None, :] + np.outer(u, v))
    assert got["residual"] == pytest.approx(s_e, rel=1e-12)
    assert got["seed"] == pytest.approx(a.var(ddof=1) - s_e / P, rel=1e-12)
    assert got["problem"] == pytest.approx(b.var(ddof=1) - s_e / S, rel=1e-12)
    no_interaction = power.components(a[:, None] + b[None, :])  # residual 0: the variances of a and b
    assert no_interaction["residual"] == pytest.approx(0.0, abs=1e-24)
    assert no_interaction["seed"] == pytest.approx(a.var(ddof=1), rel=1e-12)
    assert no_interaction["problem"] == pytest.approx(b.var(ddof=1), rel=1e-12)
    clipped = power.components(np.zeros((S, 1)) + b[None, :] + np.outer(u, v))  # seed estimated at -s_e / P
    assert clipped["seed"] == 0.0 and clipped["residual"] == pytest.approx(s_e, rel=1e-12)
    one_problem = power.components(a[:, None])
    assert one_problem == {"seed": pytest.approx(a.var(ddof=1), rel=1e-12), "problem": 0.0, "residual": 0.0}


def test_components_of_a_large_simulated_matrix_are_the_true_ones():
    """40 x 2000 normal values: each estimate within 4 of its sampling standard deviations, about
    s^2 sqrt(2 / df) (seed df 39, problem 1999, residual 39 x 1999)."""
    true = {"seed": 0.04, "problem": 0.09, "residual": 0.25}
    got = power.components(_simulate(np.random.default_rng(0), true, 40, 2000))
    for name, df in [("seed", 39), ("problem", 1999), ("residual", 39 * 1999)]:
        assert abs(got[name] - true[name]) < 4 * true[name] * math.sqrt(2 / df), (name, got[name])


@pytest.mark.parametrize(
    "comp,S,P",
    [
        ({"seed": 0.01, "problem": 0.04, "residual": 0.2}, 5, 200),
        ({"seed": 0.0, "problem": 0.02, "residual": 0.2}, 5, 200),  # MS_seed below MS_resid for some draws
        ({"seed": 0.002, "problem": 0.0, "residual": 0.1}, 3, 50),
        ({"seed": 0.01, "problem": 0.0, "residual": 0.0}, 7, 1),
    ],
)
@pytest.mark.parametrize("m", [1, 6])
def test_a_pilots_own_components_predict_exactly_the_interval_stats_prints(comp, S, P, m):
    """At its own size, a pilot's components give back its mean squares (a clipped component's
    term is dropped in both), so the prediction is the family half-width stats prints for it."""
    rng = np.random.default_rng(1)
    kept = set()
    for _ in range(6):
        a, b = _simulate(rng, comp, S, P), _simulate(rng, comp, S, P)
        cell = stats.paired_difference(a, b)
        pilot = power.components(b - a)
        kept.add(pilot["seed"] > 0)
        assert power.predicted_half_width(pilot, S, P, m) == pytest.approx(_family_half_width(cell, m), rel=1e-9, abs=1e-15)
    if comp["seed"] == 0.0:
        assert kept == {True, False}  # both choices of the seed term were exercised


@pytest.mark.parametrize(
    "comp,tolerance",
    [
        ({"seed": 0.002, "problem": 0.05, "residual": 0.1}, 0.10),
        # seeds dominate: the realised se has about 4 df, and the mean of its square root is some
        # 8% below the square root of its mean, which the prediction is
        ({"seed": 0.01, "problem": 0.04, "residual": 0.2}, 0.15),
    ],
)
def test_the_prediction_is_the_mean_realised_half_width_of_simulated_studies(comp, tolerance):
    """200 simulated 5 x 200 studies: the mean half-width stats.family prints (families of 1 and
    6) is within the tolerance of the one predicted from the true components."""
    rng = np.random.default_rng(2)
    cells = [stats.crossed_interval(_simulate(rng, comp, 5, 200)) for _ in range(200)]
    for m in (1, 6):
        realised = np.mean([student_t.ppf(1 - 0.05 / (2 * m), c["df"]) * c["se"] for c in cells])
        assert realised == pytest.approx(power.predicted_half_width(comp, 5, 200, m), rel=tolerance)


def test_the_prediction_is_low_where_a_component_is_zero():
    """Seed variance 0: the realised interval keeps the seed term (4 df) in the draws where MS_seed
    exceeds MS_resid, which the prediction at the expected mean squares never does."""
    comp = {"seed": 0.0, "problem": 0.02, "residual": 0.2}
    rng = np.random.default_rng(3)
    cells = [stats.crossed_interval(_simulate(rng, comp, 5, 200)) for _ in range(200)]
    realised = np.mean([student_t.ppf(0.975, c["df"]) * c["se"] for c in cells])
    assert 1.1 < realised / power.predicted_half_width(comp, 5, 200, 1) < 1.3


def test_seeds_for_picks_the_fewest_seeds_that_reach_the_target():
    comp = {"seed": 0.01, "problem": 0.0, "residual": 0.0}
    width = {S: float(student_t.ppf(1 - 0.05 / 12, S - 1)) * 0.1 / math.sqrt(S) for S in range(5, 13)}
    plan = power.seeds_for(comp, 1, 6, target=(width[7] + width[8]) / 2)
    assert plan["seeds"] == 8 and plan["reason"] is None
    assert list(plan["predicted"]) == list(range(5, 13))
    assert all(plan["predicted"][S] == pytest.approx(width[S], rel=1e-12) for S in width)
    assert power.seeds_for(comp, 1, 6, target=width[5])["seeds"] == 5  # exactly at the target is enough
    two_way = power.seeds_for({"seed": 0.002, "problem": 0.05, "residual": 0.1}, 200, 6, target=0.07)
    halves = list(two_way["predicted"].values())
    assert all(x > y for x, y in zip(halves, halves[1:]))  # more seeds, narrower
    assert two_way["seeds"] == 8 and halves[8 - 5] <= 0.07 < halves[7 - 5]


def test_seeds_for_declines_a_study_that_cannot_reach_its_target():
    comp = {"seed": 0.01, "problem": 0.0, "residual": 0.0}
    plan = power.seeds_for(comp, 1, 6, target=power.EFFECTS["loss"])
    at_high = student_t.ppf(1 - 0.05 / 12, 11) * 0.1 / math.sqrt(12)
    assert plan["seeds"] is None and plan["target"] == 0.02
    assert (
        plan["reason"]
        == f"the predicted half-width at 12 seeds ({at_high:.4g}) exceeds the target 0.02, so the readout is not run"
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"low": 1}, {"low": 6, "high": 5}, {"target": 0.0}, {"target": -0.1}, {"target": float("nan")}, {"family_size": 0}],
)
def test_seeds_for_rejects_bad_arguments(kwargs):
    args = {"problems": 200, "family_size": 6, "target": 0.05} | kwargs
    with pytest.raises(ValueError):
        power.seeds_for({"seed": 0.01, "problem": 0.01, "residual": 0.1}, **args)


@pytest.mark.parametrize("y", [np.ones((1, 10)), np.ones(5), np.array([[0.1, np.nan], [0.2, 0.3]]), np.array([[np.inf], [0.0]])])
def test_components_rejects_too_few_seeds_and_non_finite_values(y):
    with pytest.raises(ValueError):
        power.components(y)


def test_predicted_half_width_rejects_negative_components():
    with pytest.raises(ValueError):
        power.predicted_half_width({"seed": -0.01, "problem": 0.0, "residual": 0.1}, 5, 200, 1)
