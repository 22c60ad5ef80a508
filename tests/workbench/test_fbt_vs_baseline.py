"""The fair FBT-versus-baseline comparison (``workbench zoo --study fbt-vs-baseline``): its tuning
rule, its readouts on per-problem matrices with a planted effect (the positive control) and
without one (the negative control), the per-problem scores against the aggregate ones, and the
study end to end on the micro scale."""

import dataclasses
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_usage_error, cli

from workbench import build_model
from workbench.data.splits import heldout_examples
from workbench.data.tasks import synthetic_examples
from workbench.experiments import bands, tuning
from workbench.experiments import fair_readings as fr
from workbench.experiments import fbt_vs_baseline as fvb
from workbench.experiments.power import EFFECTS, power_step
from workbench.runtime.checkpoint import load_model
from workbench.runtime.tokenizer import CharTokenizer, load_tokenizer
from workbench.storage.files import read_json
from workbench.training.evaluate import evaluate_examples
from workbench.training.flops import train_flops_per_token
from workbench.training.runconfig import load_run_config, task_settings
from workbench.training.strategies import make_strategy

ROOT = Path(__file__).resolve().parents[2]


def test_the_rule_takes_the_lowest_validation_loss_and_the_first_of_ties():
    rows = [
        {"arch": "baseline", "lr": 1e-3, "validation_loss": 0.40},
        {"arch": "baseline", "lr": 2e-3, "validation_loss": 0.30},
        {"arch": "baseline", "lr": 5e-4, "validation_loss": 0.30},
        {"arch": "fbt", "lr": 1e-3, "validation_loss": 0.10},
    ]
    assert tuning.choose(rows, "baseline")["lr"] == 2e-3
    assert tuning.choose(rows, "fbt")["lr"] == 1e-3


def test_a_row_is_scored_by_its_worse_tuning_seed():
    """The addition organism's case: lr 5e-4 had the lowest loss at one tuning seed
    (0.0397 against 0.0431) but learned late at two of five comparison seeds. Scored by the worse
    of two seeds, a setting that fails at one of them loses to one that learns at both."""
    rows = [
        tuning.scored_row("slow", "baseline", {"lr": 5e-4}, [0.0397, 0.30]),
        tuning.scored_row("steady", "baseline", {"lr": 1e-3}, [0.0431, 0.045]),
    ]
    assert [r["validation_loss"] for r in rows] == [0.30, 0.045]
    assert tuning.choose(rows, "baseline")["name"] == "steady"
    assert rows[1]["validation_losses"] == [0.0431, 0.045] and rows[1]["regime"] == "standard"


def test_a_row_whose_loss_is_not_finite_is_the_worst_wherever_it_is_listed():
    """A diverged run evaluates to a NaN loss, and NaN compares false with everything: ``max`` and
    ``min`` would then answer by the order rows and seeds are listed in."""
    nan = float("nan")
    for losses in ([nan, 0.05], [0.05, nan]):
        assert tuning.scored_row("diverged", "baseline", {"lr": 4e-3}, losses)["validation_loss"] == float("inf")
    rows = [
        tuning.scored_row("steady", "baseline", {"lr": 1e-3}, [0.04, 0.05]),
        tuning.scored_row("diverged", "baseline", {"lr": 4e-3}, [nan, nan]),
        tuning.scored_row("worse", "baseline", {"lr": 2e-3}, [0.07, 0.10]),
    ]
    for order in (rows, rows[::-1], rows[1:] + rows[:1]):
        assert tuning.choose(order, "baseline")["name"] == "steady"
    assert tuning.choose(rows[1:], "baseline")["name"] == "worse"


def test_a_choice_at_the_grids_edge_grows_the_grid_a_factor_2_past_it():
    lrs = (5e-4, 1e-3, 2e-3)
    assert tuning.beyond_edge(lrs, 2e-3) == 4e-3 and tuning.beyond_edge(lrs, 5e-4) == 2.5e-4
    assert tuning.beyond_edge(lrs, 1e-3) is None
    assert tuning.beyond_edge((*lrs, 4e-3), 4e-3) == 8e-3  # the grown grid's edge is the new one


def test_a_setting_that_did_not_learn_is_not_eligible_whatever_its_loss():
    """FBT's fused loss can be lowest at a setting whose model never answers in the standard
    regime; the rule passes it over, and with no eligible row keeps the best, marked not eligible."""
    rows = [
        tuning.scored_row("fused-only", "fbt", {"lr": 4e-3}, [0.01, 0.02], eligible=False),
        tuning.scored_row("learned", "fbt", {"lr": 1e-3}, [0.05, 0.06]),
    ]
    assert tuning.choose(rows, "fbt")["name"] == "learned"
    none = tuning.choose([rows[0]], "fbt")
    assert none["name"] == "fused-only" and not none["eligible"]
    models = {"a": {"competence": {"qualified": False, "plumbing_check": False}}}
    models["b"] = {"competence": {"qualified": True, "plumbing_check": False}}
    models["c"] = {"competence": {"qualified": False, "plumbing_check": True}}
    assert [tuning.learned(models, n) for n in "abc"] == [False, True, True]


def test_every_architecture_gets_the_same_learning_rates_and_fbt_its_starts():
    rows = tuning.stage_one(fvb.SCALES["modsum"]["lrs"])
    lrs = fvb.SCALES["modsum"]["lrs"]
    assert len(lrs) >= 3
    assert [s["lr"] for a, s in rows if a == "baseline"] == list(lrs)
    fbt = [(s["lr"], s["feedback_start"], s["ramp"]) for a, s in rows if a == "fbt"]
    assert fbt == [(lr, f, tuning.RAMPS[0]) for lr in lrs for f in tuning.FEEDBACK_STARTS]
    assert len(tuning.TUNING_SEEDS) == 2 and min(tuning.TUNING_SEEDS) >= 10  # no comparison seed (0..MAX_SEEDS-1) is the sweep's
    assert tuning.tuning_run("baseline", {"lr": 1e-3}, tuning.TUNING_SEEDS[1]) == "tune-baseline-lr0.001-seed1001"


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
    assert fr.time_to_threshold(steps, [1.0, 0.4, 0.2, 0.1], 0.35, 2, 40) == (30, True)  # (0.4 + 0.2) / 2 = 0.3
    assert fr.time_to_threshold(steps, [1.0, 0.2, 0.9, 0.1], 0.35, 2, 40) == (40, False)  # never, on average
    assert fr.time_to_threshold(steps, [1.0, 0.2, 0.9, 0.1], 0.3, 1, 40) == (20, True)


def _per_seed(gain: float, seeds: int = 5, problems: int = 1000, seed: int = 0, beyond: dict | None = None) -> dict:
    """Members scored on the same problems: per problem a difficulty, per seed a skill; FBT's
    probability of a correct answer is the baseline's plus ``gain`` in every regime, its loss the
    baseline's minus ``gain``, its plain-pass curve the baseline's; the control is the baseline.
    ``beyond``: per test set beyond training, per FBT regime its gain there (from 0.3, lower)."""
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
            fr.CONTROL: {**row, "correct": {"standard": base.tolist()}, "completion_nll": {"standard": nll.tolist()}},
            fr.COMPUTE: {**row, "correct": {"standard": base.tolist()}, "completion_nll": {"standard": nll.tolist()}},
            "fbt": {
                **row,
                "correct": dict.fromkeys(("standard", "soft", "fused"), fbt.tolist()),
                "completion_nll": dict.fromkeys(("standard", "soft", "fused"), (nll - gain).tolist()),
            },
        }
        for name, gains in (beyond or {}).items():
            q = np.clip(0.3 + skill + difficulty, 0.0, 1.0)
            for member, regimes in (("baseline", {"standard": 0.0}), ("fbt", gains)):
                scores = {r: (rng.random(problems) < np.clip(q + g, 0.0, 1.0)).astype(float).tolist() for r, g in regimes.items()}
                out[s][member].setdefault("beyond", {})[name] = {"correct": scores}
            out[s][fr.COMPUTE].setdefault("beyond", {})[name] = out[s]["baseline"]["beyond"][name]
    return out


def test_a_planted_gain_of_a_tenth_is_detected_through_the_family_correction():
    """The positive control: at 5 seeds x 1,000 problems, a +0.10 accuracy gain and a -0.10 loss
    gain are detectable after Holm over the whole family; the control row, identical to the
    baseline, is not, and neither is the loss curve the two share."""
    readings = fr.readings(_per_seed(0.10), threshold=0.3, window=2, budget=100, switch=30)
    family = readings["family"]
    declared = [c for c in fr.FAMILY if c not in fr.BAND_CELLS]  # no band declared: its cells are not run
    assert list(family) == declared and all(c["family_size"] == len(declared) for c in family.values())
    for regime in ("standard", "soft", "fused"):
        cell = family[f"fbt {regime} - baseline: accuracy"]
        assert cell["detectable"] and cell["low"] > 0.05 and cell["seeds_higher"] == 5
        assert family[f"fbt {regime} - baseline: completion loss"]["detectable"]
    assert not family[f"{fr.CONTROL} - baseline: accuracy"]["detectable"]
    assert not family["fbt - baseline: plain-pass training loss, last half"]["detectable"]
    assert readings["wording"][f"{fr.CONTROL} - baseline: accuracy"].startswith("no detectable difference")
    assert not readings["wording"]["fbt fused - baseline: accuracy"].startswith("no detectable")


def test_a_gain_beyond_training_is_detected_in_its_regime_and_corrected_with_the_family():
    """A +0.10 gain of fused decoding on a test set beyond training (none in-distribution, none in
    standard decoding there): only that cell of the whole family is detectable, the family is
    ``FAMILY`` and the set's two cells, and each set's accuracies are read per member and regime."""
    beyond = {"longer": {"standard": 0.0, "fused": 0.10}, "sparser": {"standard": 0.0, "fused": 0.0}}
    readings = fr.readings(_per_seed(0.0, beyond=beyond), threshold=0.3, window=2, budget=100, beyond=tuple(beyond), switch=30)
    family = readings["family"]
    assert list(family) == [c for c in fr.family_names(beyond) if c not in fr.BAND_CELLS]
    assert len(family) == len(fr.FAMILY) - len(fr.BAND_CELLS) + 4
    assert all(c["family_size"] == len(family) for c in family.values())
    detected = {name for name, cell in family.items() if cell["detectable"] and "accuracy" in name}
    assert detected == {"fbt fused - baseline: accuracy, longer"}
    assert family["fbt fused - baseline: accuracy, longer"]["low"] > 0.05
    longer = readings["beyond"]["longer"]
    assert set(longer) == {"baseline", "fbt"} and set(longer["fbt"]) == set(fr.BEYOND_REGIMES)
    assert longer["fbt"]["fused"]["mean"] - longer["baseline"]["standard"]["mean"] == pytest.approx(0.10, abs=0.02)


def test_the_band_declared_is_the_one_with_the_baselines_pilot_nearest_the_middle_of_its_room():
    pilot = {"length4": 0.97, "length5": 0.88, "length6": 0.71, "length7": 0.52, "length8": 0.41}
    declared = bands.declare_band(pilot)
    assert declared["band"] == "length6" and declared["why"] is None  # |0.71 - 0.75| < |0.88 - 0.75|
    assert bands.declare_band({"a": 0.65, "b": 0.85})["band"] == "a"  # equally near: the first listed
    assert bands.declare_band({"a": 0.6, "b": 0.95})["band"] == "a"  # the edges count as room
    none = bands.declare_band({"digits4": 0.31, "digits5": 0.02})
    assert none["band"] is None and none["why"] == (
        "no difficulty band leaves the baseline between 0.6 and 0.9 in the pilot (digits4 0.310, digits5 0.020)"
    )


def test_a_gain_on_the_declared_band_is_read_there_at_equal_tokens_and_equal_flops():
    """A +0.10 fused gain on one graded set, declared the band: its band cells are detectable
    against the baseline and the compute-matched baseline (here the same scores), the standard
    regime's is not, and every graded set's accuracies form the curves. Without a band its cells
    are not run, with the reason."""
    graded = {"length5": {"standard": 0.0, "fused": 0.0}, "length6": {"standard": 0.0, "fused": 0.10}}
    per_seed = _per_seed(0.0, beyond=graded)
    got = fr.readings(per_seed, 0.3, 2, 100, switch=30, band="length6", curves=tuple(graded))
    family = got["family"]
    assert family["fbt fused - baseline: accuracy, band"]["detectable"]
    assert family["fbt fused - baseline-compute: accuracy, band"]["detectable"]
    assert not family["fbt standard - baseline: accuracy, band"]["detectable"]
    assert set(got["curves"]) == set(graded) and set(got["curves"]["length5"]) == {"baseline", "fbt", fr.COMPUTE}
    assert got["band"] == "length6" and set(got["beyond"]) == set()  # the bands are curves, not sets beyond
    unbanded = fr.readings(per_seed, 0.3, 2, 100, switch=30, not_run=dict.fromkeys(fr.BAND_CELLS, "no room"))
    assert not set(fr.BAND_CELLS) & set(unbanded["family"]) and unbanded["unmeasured"] == dict.fromkeys(fr.BAND_CELLS, "no room")


def test_answers_pack_to_one_bit_each_and_every_accuracy_interval_recomputes_from_them():
    assert fr.pack_bits([1, 0, 1, 1, 0, 0, 0, 0, 1]) == "sIA="  # bytes 0b10110000, 0b10000000
    assert fr.unpack_bits("sIA=", 9).tolist() == [1, 0, 1, 1, 0, 0, 0, 0, 1]
    graded = {"length6": {"standard": 0.0, "fused": 0.10}}
    per_seed = _per_seed(0.05, beyond=graded)
    got = fr.readings(per_seed, 0.3, 2, 100, switch=30, band="length6", curves=tuple(graded))
    study = {"scores": fr.packed_scores(per_seed), "band": {"band": "length6"}, "family": got["family"]}
    assert study["scores"]["test"]["n"] == 1000 and len(study["scores"]["test"]["fbt"]["fused"]) == 5
    accuracy = [name for name in got["family"] if ": accuracy" in name]
    assert len(accuracy) == 10  # 3 regimes, the control, FBT's own two, the compute-matched one, the band's three
    for name in accuracy:
        again = fr.recompute_accuracy(study, name)
        assert {k: again[k] for k in ("mean", "low", "high", "p")} == {
            k: got["family"][name][k] for k in ("mean", "low", "high", "p")
        }, name


def test_the_organisms_bands_grow_harder_from_the_trained_level():
    assert list(bands.BANDS["perm"]) == [f"length{k}" for k in range(1, 9)]
    assert list(bands.BANDS["addition"]) == [f"digits{k}" for k in range(1, 6)]
    assert all(fvb.SCALES[f"org-{task}"]["bands"] == bands.BANDS[task] for task in ("flipflop", "perm", "addition"))
    lengths = [(v["flipflop_min_len"], v["flipflop_max_len"]) for v in bands.BANDS["flipflop"].values()]
    assert lengths[0] == (8, 24) and all(a[1] <= b[0] for a, b in zip(lengths, lengths[1:]))  # trained, then longer
    for weights in (v["flipflop_weights"] for v in bands.BANDS["flipflop"].values()):  # writes : reads as trained
        assert sum(weights) == pytest.approx(1.0) and weights[0] / weights[2] == pytest.approx(1.5)
    cfg = fvb.member_config("org-flipflop", "baseline", [])
    settings = dataclasses.replace(task_settings(cfg.data), **bands.BANDS["flipflop"]["length64-96"])
    assert {ex.difficulty for ex in heldout_examples("flipflop", 50, 0, settings)} <= set(range(64, 97))
    cfg = fvb.member_config("org-perm", "baseline", [])
    examples = heldout_examples("perm", 50, 0, dataclasses.replace(task_settings(cfg.data), **bands.BANDS["perm"]["length7"]))
    assert {ex.difficulty for ex in examples} == {7}


def test_the_organisms_test_sets_beyond_training_are_drawn_beyond_it():
    """Perm's longer set holds products of 4-6 permutations (training: 1-3); the flip-flop's sparser
    set has more ignores per instruction than training and the denser fewer; addition has none."""

    def drawn(task: str, settings: dict) -> list:
        cfg = fvb.member_config(f"org-{task}", "baseline", [])
        return heldout_examples(task, 400, 0, dataclasses.replace(task_settings(cfg.data), **settings))

    assert set(fvb.SCALES["org-perm"]["beyond"]) == {"longer"} and fvb.SCALES["org-addition"]["beyond"] == {}
    assert {ex.difficulty for ex in drawn("perm", fvb.BEYOND["perm"]["longer"])} == {4, 5, 6}
    assert {ex.difficulty for ex in drawn("perm", {})} == {1, 2, 3}

    def ignored(examples: list) -> float:  # "--" per instruction
        return sum(ex.prompt.count("--") for ex in examples) / sum(ex.difficulty for ex in examples)

    trained = ignored(drawn("flipflop", {}))
    assert ignored(drawn("flipflop", fvb.BEYOND["flipflop"]["sparser"])) > trained + 0.2
    assert ignored(drawn("flipflop", fvb.BEYOND["flipflop"]["denser"])) < trained - 0.2


def test_a_member_is_scored_beyond_training_on_problems_drawn_with_the_sets_settings(micro_runs, tmp_path):
    run = shutil.copytree(micro_runs / "fbt", tmp_path / "fbt")
    longer = ("longer", {"modsum_min_len": 7, "modsum_max_len": 9})
    scores = bands.score_member(run, list(fr.BEYOND_REGIMES), 6, longer)
    assert read_json(run / "results" / "comparison_test_longer.json") == scores
    assert scores["settings"] == longer[1] and set(scores["correct"]) == set(fr.BEYOND_REGIMES)
    cfg = load_run_config(run / "config.json")
    examples = heldout_examples(cfg.data.task, 6, 0, dataclasses.replace(task_settings(cfg.data), **longer[1]))
    row = evaluate_examples(load_model(run), examples, load_tokenizer(run), regimes=["fused"], per_problem=True)
    assert scores["correct"]["fused"] == row["correct"]["fused"]
    assert bands.score_member(run, list(fr.BEYOND_REGIMES), 6, ("longer", {"modsum_min_len": 7, "modsum_max_len": 7}))[
        "settings"
    ] == {
        "modsum_min_len": 7,
        "modsum_max_len": 7,
    }  # other settings: scored again, not read back
    assert set(bands.score_member(run, ["standard"], 6, longer)["correct"]) == {"standard"}  # other regimes: scored again


def test_no_planted_gain_reads_no_detectable_difference():
    """The negative control: the same data without the gain; across 20 draws the family reports a
    detectable accuracy difference at most once (Holm keeps the family's error rate at 5%)."""
    false = 0
    for seed in range(20):
        family = fr.readings(_per_seed(0.0, seed=seed), threshold=0.3, window=2, budget=100, switch=30)["family"]
        false += any(family[f"fbt {r} - baseline: accuracy"]["detectable"] for r in ("standard", "soft", "fused"))
    assert false <= 1


def test_steps_to_the_threshold_count_censored_seeds():
    per_seed = _per_seed(0.0)
    for s, members in per_seed.items():  # FBT reaches 0.3 at step 20 at every seed; the baseline at 4 seeds, at step 80
        members["fbt"]["losses"] = [1.0, 0.2, *[0.1] * 8]
        members["baseline"]["losses"] = [1.0] * 7 + ([0.2] * 3 if s else [1.0] * 3)
    times = fr.readings(per_seed, threshold=0.3, window=1, budget=100, switch=30)["time_to_threshold"]
    assert times["fbt"]["median"] == 20 and times["baseline"]["median"] == 80
    assert times["baseline"]["per_seed"][0] == {"step": 100, "reached": False}


def test_data_efficiency_is_read_after_the_switch_by_hand():
    """Logged every 10 steps, the switch at 30. At step 30 the runs stand at 0.9 and 0.8 (high:
    0.8); afterwards their lowest losses are 0.2 and 0.4 (low: 0.4), so the threshold is 0.6. The
    baseline first gets to it at step 70 and FBT at 50: 40 and 20 steps after the switch, a log
    ratio of log(1/2) at every seed. A loss crossed before the switch (0.5 at step 20) is not a
    crossing: the two arms were one computation then."""
    steps = [10, 20, 30, 40, 50, 60, 70, 80]
    base = np.array([[1.0, 0.5, 0.9, 0.8, 0.7, 0.65, 0.6, 0.4]] * 3)
    fbt = np.array([[1.0, 0.5, 0.8, 0.7, 0.55, 0.3, 0.2, 0.2]] * 3)
    got = fr.after_switch(steps, base, fbt, switch=30, window=1)
    assert got["between"] == [0.4, 0.8] and got["threshold"] == pytest.approx(0.6)
    assert got["baseline_steps"] == [40] * 3 and got["fbt_steps"] == [20] * 3
    assert got["cell"]["mean"] == pytest.approx(np.log(0.5)) and got["cell"]["seeds_lower"] == 3
    smoothed = fr.after_switch(steps, base, fbt, switch=30, window=2)  # FBT at step 30: (0.5 + 0.8) / 2
    assert smoothed["between"] == [pytest.approx(0.5), pytest.approx(0.65)]  # the baseline's last: (0.6 + 0.4) / 2
    stalled = fr.after_switch(steps, base, np.full((3, 8), 0.9), switch=30, window=1)
    assert stalled["threshold"] is None and "never gets below 0.9" in stalled["why"]
    per_seed = _per_seed(0.0)
    for members in per_seed.values():
        members["fbt"]["losses"] = [*np.full(8, 0.9)]
        members["fbt"]["steps"] = members["baseline"]["steps"] = steps
        members["baseline"]["losses"] = list(base[0])
    readings = fr.readings(per_seed, threshold=0.3, window=1, budget=100, switch=30)
    assert fr.AFTER_SWITCH not in readings["family"] and "never gets below" in readings["unmeasured"][fr.AFTER_SWITCH]


def test_the_power_step_asks_the_seeds_the_neediest_comparison_needs_and_leaves_out_what_none_can_resolve():
    """Pilot differences at two seeds: one accuracy comparison with a problem spread alone (resolved
    at the fewest seeds), one loss comparison with a seed spread of sd 0.01 (needs more), one
    accuracy comparison whose seeds differ by 0.5 (no affordable count resolves 0.05)."""
    rng = np.random.default_rng(0)
    pilot = {
        "fbt standard - baseline: accuracy": rng.normal(0.0, 0.3, (2, 1000)),
        "fbt fused - baseline: completion loss": np.array([[0.0], [0.01 * np.sqrt(2)]]) + np.zeros((2, 1000)),
        "fbt soft - baseline: accuracy": np.array([[0.0], [0.5]]) + np.zeros((2, 1000)),
    }
    targets = {f"comparison {i}": 0.05 for i in range(14 - len(pilot))}  # the rest of a family of 14
    targets |= {name: EFFECTS["accuracy" if name.endswith("accuracy") else "loss"] for name in pilot}
    power = power_step(pilot, problems=1000, targets=targets)
    plans = power["comparisons"]
    assert plans["fbt standard - baseline: accuracy"]["seeds"] == 5
    need = plans["fbt fused - baseline: completion loss"]["seeds"]
    assert need is not None and 5 < need <= 12 and power["seeds"] == need
    assert power["not_run"] == {"fbt soft - baseline: accuracy": plans["fbt soft - baseline: accuracy"]["reason"]}
    readings = fr.readings(_per_seed(0.10), threshold=0.3, window=2, budget=100, switch=30, not_run=power["not_run"])
    assert "fbt soft - baseline: accuracy" not in readings["family"]
    assert all(c["family_size"] == len(fr.FAMILY) - len(fr.BAND_CELLS) - 1 for c in readings["family"].values())
    assert readings["unmeasured"]["fbt soft - baseline: accuracy"].startswith("the predicted half-width at 12 seeds")


def test_the_compute_matched_baseline_spends_fbts_training_flops():
    """FBT's passes: one before the switch, then 2 (3 on a few batches). The baseline-compute
    member trains the ratio of the two runs' FLOPs times the baseline's steps."""
    fbt = fvb.member_config("micro", "fbt", ["fbt.feedback_start=0.5"])
    base = fvb.member_config("micro", "baseline", [])
    strategy = make_strategy(fbt)
    passes = [strategy.passes(step) for step in range(fbt.train.steps)]
    assert passes[:20] == [1] * 20 and set(passes[20:]) <= {2, 3}
    model = build_model("fbt", "debug")
    per_token = {k: train_flops_per_token(model, 64, copies=k, readouts=k, fusions=k - 1) for k in (1, 2, 3)}
    plain = train_flops_per_token(build_model("baseline", "debug"), 64)
    assert per_token[1] == pytest.approx(plain)  # one pass is the baseline's computation
    expected = sum(per_token[k] for k in passes) / (plain * fbt.train.steps)
    assert fvb.flops_ratio(fbt, base) == pytest.approx(expected, rel=1e-12)
    assert 1.5 < expected < 2.0


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
def test_the_study_end_to_end_on_the_micro_scale(tmp_path, monkeypatch):
    """Tuning rows and choice as the rule says, the control bitwise the baseline at every seed
    (matched initialisation, identical batches, no loss on the feedback passes), every member
    scored on the same test problems, the power step's pilot on each test set, and the CLI's
    refusals."""
    out = tmp_path / "fvb"
    longer = {"modsum_min_len": 7, "modsum_max_len": 8}  # a set beyond training, as the organisms have
    monkeypatch.setitem(fvb.SCALES["micro"], "beyond", {"longer": longer})
    code, _, err = cli(
        ["zoo", "--study", "fbt-vs-baseline", "--preset", "micro", "--seeds", "2", "--out", str(out), "--no-progress"]
    )
    assert code is None, err
    study = read_json(out / "study.json")
    rows, rounds = study["tuning"]["rows"], study["tuning"]["rounds"]
    grown = len(rounds) - 1  # each round after the first added one learning rate to one architecture or both
    grids = rounds[-1]["lrs"]
    assert len(rows) == len(grids["baseline"]) + len(grids["fbt"]) * len(tuning.FEEDBACK_STARTS) + len(tuning.RAMPS) - 1
    assert 0 <= grown <= tuning.EXTENSIONS
    for earlier, later in zip(rounds, rounds[1:]):  # a grid grows only past an edge choice, a factor 2 beyond it
        for arch in ("baseline", "fbt"):
            added = set(later["lrs"][arch]) - set(earlier["lrs"][arch])
            chosen = next(r for r in rows if r["name"] == earlier["chosen"][arch])
            assert added == ({tuning.beyond_edge(earlier["lrs"][arch], chosen["lr"])} - {None} if chosen["eligible"] else set())
    assert study["tuning"]["chosen"]["baseline"] == min(
        (r for r in rows if r["arch"] == "baseline"), key=lambda r: r["validation_loss"]
    )
    for row in rows:  # each row trained and scored at both tuning seeds, read by the worse
        runs = [out / tuning.tuning_run(row["arch"], row, seed) for seed in tuning.TUNING_SEEDS]
        assert [read_json(run / "config.json")["train"]["seed"] for run in runs] == list(tuning.TUNING_SEEDS)
        assert row["validation_losses"] == [
            tuning.validation_loss(run, row["arch"], fvb.SCALES["micro"]["validation"]) for run in runs
        ]
        assert row["validation_loss"] == max(row["validation_losses"])
    chosen = study["tuning"]["chosen"]
    assert study["models"]["baseline-seed1"]["seed"] == 1
    assert read_json(out / "baseline" / "config.json")["train"]["lr"] == chosen["baseline"]["lr"]
    assert read_json(out / "fbt" / "config.json")["fbt"]["ramp"] == chosen["fbt"]["ramp"]
    assert study["readings"]["control_bitwise_seeds"] == 2
    n = fvb.SCALES["micro"]["test"]
    for name in ("baseline", "fbt-seed1", "fbt-no-feedback"):
        assert all(len(v) == n for v in read_json(out / name / "results" / bands.TEST_FILE)["correct"].values())
    assert set(study["family"]) | set(study["readings"]["unmeasured"]) == set(fr.family_names(("longer",)))
    for entry in study["compute_matched"]:  # the compute-matched baseline trained FBT's FLOPs
        run = out / fvb.seed_name(fr.COMPUTE, entry["seed"])
        assert read_json(run / "config.json")["train"]["steps"] == round(entry["flops_ratio"] * fvb.SCALES["micro"]["steps"])
    from workbench.experiments.comparisons import family_rows, reading_rows

    assert [r["comparison"] for r in family_rows(study)] == [c for c in fr.family_names(("longer",)) if c in study["family"]]
    power = study["power"]  # predicted on the tuning runs, achieved on the study's own
    assert set(power["comparisons"]) == {
        *(f"fbt {r} - baseline: {w}" for r in ("standard", "soft", "fused") for w in ("accuracy", "completion loss")),
        *(f"fbt {r} - baseline: accuracy, longer" for r in ("standard", "fused")),
    }
    # the pilot on a test set: each tuning seed's answers there, FBT's minus the baseline's, by problem
    piloted = tuning.pilot(out, chosen, 6, {"longer": longer})
    runs = [out / tuning.tuning_run(arch, chosen[arch], tuning.TUNING_SEEDS[1]) for arch in ("baseline", "fbt")]
    drawn = dataclasses.replace(task_settings(load_run_config(runs[0] / "config.json").data), **longer)
    examples = synthetic_examples("modsum", 6, 0, drawn, split="validation")
    answers = [
        evaluate_examples(load_model(run), examples, load_tokenizer(run), regimes=[regime], per_problem=True)["correct"][regime]
        for run, regime in zip(runs, ("standard", "fused"))
    ]
    assert piloted["fbt fused - baseline: accuracy, longer"].shape == (2, 6)
    assert piloted["fbt fused - baseline: accuracy, longer"][1].tolist() == np.subtract(answers[1], answers[0]).tolist()
    assert set(power["achieved"]) == set(power["comparisons"]) - set(power["not_run"])
    assert study["band"]["band"] is None and set(fr.BAND_CELLS) <= set(study["readings"]["unmeasured"])  # micro: no bands
    for name in (n for n in study["family"] if ": accuracy" in n):  # every accuracy interval, from its committed bits
        again = fr.recompute_accuracy(study, name)
        assert (again["mean"], again["low"], again["high"]) == tuple(study["family"][name][k] for k in ("mean", "low", "high"))
    spec = importlib.util.spec_from_file_location("results_pages", ROOT / "scripts" / "results_pages.py")
    pages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pages)
    page = "\n".join(pages.studies.fbt_vs_baseline_body(study))  # the results page reads the new record
    assert "## Seeds, by a power step on the tuning runs" in page and f"predicted at {study['seeds']}" in page
    assert "Rounds of the learning-rate grid" in page and "the steps from FBT's switch" in page
    assert {(r["member"], r["regime"]) for r in reading_rows(study)} == {
        ("baseline", "standard"),
        *(("fbt", r) for r in ("standard", "soft", "fused")),
        (fr.CONTROL, "standard"),
        (fr.COMPUTE, "standard"),
    }
    assert_usage_error(
        ["zoo", "--study", "fbt-vs-baseline", "--preset", "quick", "--seeds", "2", "--out", str(tmp_path / "q")],
        "quick",
        "modsum",
    )
    assert_usage_error(["zoo", "--study", "fbt-vs-baseline", "--seeds", "1", "--out", str(tmp_path / "q")], "seeds=1")


@pytest.mark.parametrize("task", ["flipflop", "perm", "addition"])
def test_the_fair_study_on_an_organism_trains_the_organisms_task_at_its_budget(task):

    from workbench.training.zoo import ORGANISMS, member_config, members

    scale = fvb.SCALES[ORGANISMS[task]]
    _, arch, overrides, init = members(ORGANISMS[task], Path("zoo"))[0]
    zoo = member_config(ORGANISMS[task], arch, overrides, init)
    lr = zoo.train.lr
    from workbench.training.runconfig import make_run_config

    study = make_run_config(
        "baseline", scale["preset"], scale["task"], [*scale["common"], f"train.lr={lr}", f"train.steps={scale['steps']}"]
    )
    # the organism's learning rate in the sweep's middle; addition's sweep starts at it (below, its
    # baseline learns late by seed: fbt_vs_baseline's note on the learning rates)
    assert scale["lrs"].index(lr) == (0 if task == "addition" else 1) and scale["steps"] == zoo.train.steps
    differ = {k for k, v in study.to_dict()["train"].items() if zoo.to_dict()["train"][k] != v}
    assert differ == {"log_every"} and study.to_dict()["data"] == zoo.to_dict()["data"]


def test_evaluation_tells_each_phase_its_progress_to_the_last_example():
    """An evaluation can run for minutes, so every phase, losses first then each regime's
    generation, is told batch by batch up to the number of examples, in the order it runs."""
    model, tok = build_model("fbt", "debug"), CharTokenizer()
    examples = heldout_examples("modsum", 7, 0)
    told = []
    evaluate_examples(model, examples, tok, batch_size=3, progress=lambda *a: told.append(a))
    phases = list(dict.fromkeys(phase for phase, _, _ in told))
    assert phases == [
        "loss[standard]",
        "loss[recurrent]",
        *(f"answer_loss[{r}]" for r in model.regimes),
        *(f"accuracy[{r}]" for r in model.regimes),
    ]
    for phase in phases:
        counts = [done for p, done, total in told if p == phase]
        assert counts == sorted(counts) and counts[-1] == 7 and all(t == 7 for p, _, t in told if p == phase)
    assert [done for p, done, _ in told if p == "accuracy[fused]"] == [3, 6, 7]  # one report per batch of 3


def test_every_accuracy_comparison_is_powered_for_an_accuracy_effect_whatever_its_set():
    """The power step's target is the readout's: 0.05 for an accuracy on the test problems, on a
    set beyond training and on the declared band alike, 0.02 nats for a loss."""
    targets = fvb.power_targets({"sparser": {}})
    for name in ("fbt fused - baseline: accuracy", "fbt fused - baseline: accuracy, sparser", *fr.BAND_CELLS):
        assert targets[name] == 0.05, name
    for name in ("fbt fused - baseline: completion loss", "fbt - baseline: plain-pass training loss, last half"):
        assert targets[name] == 0.02, name
