"""The fair FBT-versus-baseline comparison (``workbench zoo --study fbt-vs-baseline``): its tuning
rule, its readouts on per-problem matrices with a planted effect (the positive control) and
without one (the negative control), the per-problem scores against the aggregate ones, and the
study end to end on the micro scale."""

import numpy as np
import pytest
from helpers import assert_usage_error, cli

from workbench import build_model
from workbench.data.splits import heldout_examples
from workbench.data.tasks import synthetic_examples
from workbench.runtime.tokenizer import CharTokenizer
from workbench.storage.files import read_json
from workbench.studies import fbt_vs_baseline as fvb
from workbench.training.evaluate import evaluate_examples


def test_the_rule_takes_the_lowest_validation_loss_and_the_first_of_ties():
    rows = [
        {"arch": "baseline", "lr": 1e-3, "validation_loss": 0.40},
        {"arch": "baseline", "lr": 2e-3, "validation_loss": 0.30},
        {"arch": "baseline", "lr": 5e-4, "validation_loss": 0.30},
        {"arch": "fbt", "lr": 1e-3, "validation_loss": 0.10},
    ]
    assert fvb.choose(rows, "baseline")["lr"] == 2e-3
    assert fvb.choose(rows, "fbt")["lr"] == 1e-3


def test_every_architecture_gets_the_same_learning_rates_and_fbt_its_starts():
    rows = fvb.stage_one("modsum")
    lrs = fvb.SCALES["modsum"]["lrs"]
    assert len(lrs) >= 3
    assert [s["lr"] for a, s in rows if a == "baseline"] == list(lrs)
    fbt = [(s["lr"], s["feedback_start"], s["ramp"]) for a, s in rows if a == "fbt"]
    assert fbt == [(lr, f, fvb.RAMPS[0]) for lr in lrs for f in fvb.FEEDBACK_STARTS]
    assert fvb.TUNING_SEED >= 10  # no comparison seed (0..MAX_SEEDS-1) is the sweep's


def test_validation_problems_are_neither_test_problems_nor_training_data():
    validation = {ex.prompt for ex in synthetic_examples("modsum", 300, 0, split="validation")}
    test = {ex.prompt for ex in heldout_examples("modsum", 300, 0)}
    train = {ex.prompt for ex in synthetic_examples("modsum", 300, 0)}
    # independent streams: modsum's 1-6 digit strings overlap only by chance (a few short ones)
    assert len(validation & test) < 30 and len(validation & train) < 30
    assert [ex.prompt for ex in synthetic_examples("modsum", 5, 0, split="validation")] != [
        ex.prompt for ex in heldout_examples("modsum", 5, 0)
    ]


def test_time_to_threshold_averages_a_window_and_censors_at_the_budget():
    steps = [10, 20, 30, 40]
    assert fvb.time_to_threshold(steps, [1.0, 0.4, 0.2, 0.1], 0.35, 2, 40) == (30, True)  # (0.4 + 0.2) / 2 = 0.3
    assert fvb.time_to_threshold(steps, [1.0, 0.2, 0.9, 0.1], 0.35, 2, 40) == (40, False)  # never, on average
    assert fvb.time_to_threshold(steps, [1.0, 0.2, 0.9, 0.1], 0.3, 1, 40) == (20, True)


def _per_seed(gain: float, seeds: int = 5, problems: int = 1000, seed: int = 0) -> dict:
    """Members scored on the same problems: per problem a difficulty, per seed a skill; FBT's
    probability of a correct answer is the baseline's plus ``gain`` in every regime, its loss the
    baseline's minus ``gain``, its plain-pass curve the baseline's; the control is the baseline."""
    rng = np.random.default_rng(seed)
    difficulty = rng.normal(0.0, 0.1, problems)
    steps = list(range(10, 110, 10))
    out = {}
    for s in range(seeds):
        skill = rng.normal(0.0, 0.03)
        p = np.clip(0.6 + skill + difficulty, 0.0, 1.0)
        base = (rng.random(problems) < p).astype(float)
        fbt = (rng.random(problems) < np.clip(p + gain, 0.0, 1.0)).astype(float)
        nll = 0.5 - difficulty + rng.normal(0.0, 0.1, problems)
        curve = list(np.linspace(1.0, 0.1, len(steps)) + rng.normal(0.0, 0.01, len(steps)))
        row = {"steps": steps, "losses": curve}
        out[s] = {
            "baseline": {**row, "correct": {"standard": base.tolist()}, "completion_nll": {"standard": nll.tolist()}},
            fvb.CONTROL: {**row, "correct": {"standard": base.tolist()}, "completion_nll": {"standard": nll.tolist()}},
            "fbt": {
                **row,
                "correct": dict.fromkeys(("standard", "soft", "fused"), fbt.tolist()),
                "completion_nll": dict.fromkeys(("standard", "soft", "fused"), (nll - gain).tolist()),
            },
        }
    return out


def test_a_planted_gain_of_a_tenth_is_detected_through_the_family_correction():
    """The positive control: at 5 seeds x 1,000 problems, a +0.10 accuracy gain and a -0.10 loss
    gain are detectable after Holm over the whole family; the control row, identical to the
    baseline, is not, and neither is the loss curve the two share."""
    readings = fvb.readings(_per_seed(0.10), threshold=0.3, window=2, budget=100)
    family = readings["family"]
    assert set(family) == set(fvb.FAMILY) and all(c["family_size"] == len(fvb.FAMILY) for c in family.values())
    for regime in ("standard", "soft", "fused"):
        cell = family[f"fbt {regime} - baseline: accuracy"]
        assert cell["detectable"] and cell["low"] > 0.05 and cell["seeds_higher"] == 5
        assert family[f"fbt {regime} - baseline: completion loss"]["detectable"]
    assert not family[f"{fvb.CONTROL} - baseline: accuracy"]["detectable"]
    assert not family["fbt - baseline: plain-pass training loss, last half"]["detectable"]
    assert readings["wording"][f"{fvb.CONTROL} - baseline: accuracy"].startswith("no detectable difference")
    assert not readings["wording"]["fbt fused - baseline: accuracy"].startswith("no detectable")


def test_no_planted_gain_reads_no_detectable_difference():
    """The negative control: the same data without the gain; across 20 draws the family reports a
    detectable accuracy difference at most once (Holm keeps the family's error rate at 5%)."""
    false = 0
    for seed in range(20):
        family = fvb.readings(_per_seed(0.0, seed=seed), threshold=0.3, window=2, budget=100)["family"]
        false += any(family[f"fbt {r} - baseline: accuracy"]["detectable"] for r in ("standard", "soft", "fused"))
    assert false <= 1


def test_steps_to_the_threshold_count_censored_seeds():
    per_seed = _per_seed(0.0)
    for s, members in per_seed.items():  # FBT reaches 0.3 at step 20 at every seed; the baseline at 4 seeds, at step 80
        members["fbt"]["losses"] = [1.0, 0.2, *[0.1] * 8]
        members["baseline"]["losses"] = [1.0] * 7 + ([0.2] * 3 if s else [1.0] * 3)
    readings = fvb.readings(per_seed, threshold=0.3, window=1, budget=100)
    times = readings["time_to_threshold"]
    assert times["fbt"]["median"] == 20 and times["baseline"]["median"] == 80
    assert times["baseline"]["per_seed"][0] == {"step": 100, "reached": False}
    cell = readings["family"]["fbt - baseline: steps to the loss threshold"]
    assert (cell["earlier"], cell["later"], cell["undetermined"]) == (5, 0, 0)
    assert cell["p"] == pytest.approx(2 / 2**5)


def test_per_problem_scores_agree_with_the_aggregates():
    model, tok = build_model("fbt", "debug"), CharTokenizer()
    examples = heldout_examples("modsum", 7, 0)
    row = evaluate_examples(model, examples, tok, batch_size=3, per_problem=True)
    for regime in model.regimes:
        assert len(row["correct"][regime]) == 7
        assert sum(row["correct"][regime]) / 7 == row["accuracy"][regime]
        lengths = [len(tok.encode(ex.completion)) + 1 for ex in examples]
        weighted = sum(n * l for n, l in zip(row["completion_nll"][regime], lengths)) / sum(lengths)
        assert weighted == pytest.approx(row["answer_loss"][regime], rel=1e-6)
    only = evaluate_examples(model, examples, tok, batch_size=3, regimes=["fused"])  # the same batches: the same sums
    assert list(only["accuracy"]) == ["fused"] and only["answer_loss"]["fused"] == row["answer_loss"]["fused"]
    with pytest.raises(Exception, match="regimes"):
        evaluate_examples(build_model("baseline", "debug"), examples, tok, regimes=["soft"])


@pytest.mark.slow
def test_the_study_end_to_end_on_the_micro_scale(tmp_path):
    """Tuning rows and choice as the rule says, the control bitwise the baseline at every seed
    (matched initialisation, identical batches, no loss on the feedback passes), every member
    scored on the same test problems, and the CLI's refusals."""
    out = tmp_path / "fvb"
    code, _, err = cli(
        ["zoo", "--study", "fbt-vs-baseline", "--preset", "micro", "--seeds", "2", "--out", str(out), "--no-progress"]
    )
    assert code is None, err
    study = read_json(out / "study.json")
    rows = study["tuning"]["rows"]
    assert len(rows) == 3 + 3 * len(fvb.FEEDBACK_STARTS) + len(fvb.RAMPS) - 1
    assert study["tuning"]["chosen"]["baseline"] == min(
        (r for r in rows if r["arch"] == "baseline"), key=lambda r: r["validation_loss"]
    )
    chosen = study["tuning"]["chosen"]
    assert study["models"]["baseline-seed1"]["seed"] == 1
    assert read_json(out / "baseline" / "config.json")["train"]["lr"] == chosen["baseline"]["lr"]
    assert read_json(out / "fbt" / "config.json")["fbt"]["ramp"] == chosen["fbt"]["ramp"]
    assert study["readings"]["control_bitwise_seeds"] == 2
    n = fvb.SCALES["micro"]["test"]
    for name in ("baseline", "fbt-seed1", "fbt-no-feedback"):
        assert all(len(v) == n for v in read_json(out / name / "results" / fvb.TEST_FILE)["correct"].values())
    assert set(study["family"]) == set(fvb.FAMILY)
    from workbench.comparisons import family_rows, reading_rows

    assert [r["comparison"] for r in family_rows(study)] == list(fvb.FAMILY)
    assert {(r["member"], r["regime"]) for r in reading_rows(study)} == {
        ("baseline", "standard"),
        *(("fbt", r) for r in ("standard", "soft", "fused")),
        (fvb.CONTROL, "standard"),
    }
    assert_usage_error(
        ["zoo", "--study", "fbt-vs-baseline", "--preset", "quick", "--seeds", "2", "--out", str(tmp_path / "q")],
        "quick",
        "modsum",
    )
    assert_usage_error(["zoo", "--study", "fbt-vs-baseline", "--seeds", "1", "--out", str(tmp_path / "q")], "seeds=1")


@pytest.mark.parametrize("task", ["flipflop", "perm", "addition"])
def test_the_fair_study_on_an_organism_trains_the_organisms_task_at_its_budget(task):
    from pathlib import Path

    from workbench.training.zoo import ORGANISMS, member_config, members

    scale = fvb.SCALES[ORGANISMS[task]]
    _, arch, overrides, init = members(ORGANISMS[task], Path("zoo"))[0]
    zoo = member_config(ORGANISMS[task], arch, overrides, init)
    lr = zoo.train.lr
    from workbench.training.runconfig import make_run_config

    study = make_run_config(
        "baseline", scale["preset"], scale["task"], [*scale["common"], f"train.lr={lr}", f"train.steps={scale['steps']}"]
    )
    assert scale["lrs"][1] == lr and scale["steps"] == zoo.train.steps
    differ = {k for k, v in study.to_dict()["train"].items() if zoo.to_dict()["train"][k] != v}
    assert differ == {"log_every"} and study.to_dict()["data"] == zoo.to_dict()["data"]
