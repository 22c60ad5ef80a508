"""The Zoo page's table (``zoo.seed_rows``): each regime row counts its own seeds at the target,
and one seed gives no interval."""

from workbench.training.zoo import seed_rows


def member(seed: int, standard: float, soft: float) -> dict:
    tasks = {"addition": {"accuracy": {"standard": standard, "soft": soft}, "answer_loss": {"standard": 0.1, "soft": 2.0}}}
    competence = {"qualified": standard >= 0.9, "plumbing_check": False, "tasks": {"addition": {"target": 0.9}}}
    return {"member": "fbt", "seed": seed, "tasks": tasks, "competence": competence}


def test_a_regime_that_misses_the_target_is_not_counted_as_qualified():
    rows = {r["regime"]: r for r in seed_rows({"models": {"fbt": member(0, 0.97, 0.125)}})}
    assert rows["standard"]["qualified seeds"] == "1/1" and rows["soft"]["qualified seeds"] == "0/1"


def test_one_seed_has_no_interval_and_two_have_one():
    [one, _] = seed_rows({"models": {"fbt": member(0, 0.97, 0.125)}})
    assert one["low"] is None and one["high"] is None and one["accuracy"] == 0.97
    two = seed_rows({"models": {"fbt": member(0, 0.97, 0.125), "fbt-seed1": member(1, 0.91, 0.2)}})[0]
    assert two["low"] < two["accuracy"] < two["high"] and two["qualified seeds"] == "2/2"
