"""The claims table: each verdict from a study built by hand, whose answer is known."""

import ast
from pathlib import Path

import numpy as np
import pytest
from helpers import fair_study

from workbench.experiments import claims
from workbench.training import stats

ROOT = Path(__file__).resolve().parents[2]
CLAIM = {c.key: c for c in claims.CLAIMS}


def test_a_detectable_difference_with_the_predicted_sign_is_reproduced():
    row = claims.read_claim(CLAIM["fbt-loss"], "perm", fair_study(-0.1))
    assert row["verdict"] == claims.REPRODUCED and row["difference"] == pytest.approx(-0.1, abs=0.02)
    assert row["high"] < 0 and row["family_size"] == 3 and row["seeds"] == 5
    assert row["control"].split("::")[0] == "tests/workbench/test_fbt_vs_baseline.py"


def test_the_opposite_sign_detectable_is_contradicted_and_says_so():
    row = claims.read_claim(CLAIM["fbt-loss"], "perm", fair_study(+0.1))
    assert row["verdict"] == claims.CONTRADICTED and row["why"].startswith("the opposite is detectable: +0.1")


def test_no_detectable_difference_gives_the_minimum_detectable_effect():
    row = claims.read_claim(CLAIM["fbt-fused-accuracy"], "flipflop", fair_study(-0.1))
    assert row["verdict"] == claims.NO_DIFFERENCE and row["low"] < 0 < row["high"]
    half = (row["high"] - row["low"]) / 2
    assert row["mde"] == pytest.approx(half) and f"beyond +-{half:.3f}" in row["why"]


def test_data_efficiency_reads_the_log_ratio_of_steps_after_the_switch():
    faster = claims.read_claim(CLAIM["fbt-data-efficiency"], "perm", fair_study(-0.1))
    assert faster["verdict"] == claims.REPRODUCED and faster["difference"] == pytest.approx(-0.5, abs=0.05)
    slower = claims.read_claim(CLAIM["fbt-data-efficiency"], "perm", fair_study(-0.1, log_steps=0.5))
    assert slower["verdict"] == claims.CONTRADICTED and slower["why"].startswith("the opposite is detectable: +0.4")
    study = fair_study(-0.1)  # no loss both arms reach only after the switch: the study says why
    del study["family"][CLAIM["fbt-data-efficiency"].comparison]
    study["readings"] = {"unmeasured": {CLAIM["fbt-data-efficiency"].comparison: "some run never gets below 0.3"}}
    row = claims.read_claim(CLAIM["fbt-data-efficiency"], "perm", study)
    assert row["verdict"] == claims.NOT_TESTABLE and row["why"] == "some run never gets below 0.3"


def test_an_arm_short_of_its_targets_makes_the_claim_untestable_and_a_missing_study_unmeasured():
    row = claims.read_claim(CLAIM["fbt-loss"], "perm", fair_study(-0.1, qualified=4))
    assert row["verdict"] == claims.NOT_TESTABLE
    assert row["why"] == "baseline did not learn the task at its setting: 4 of 5 seeds reached its competence target"
    # FBT that never learned its task says nothing of the claim, even where the opposite is detectable
    untrained = claims.read_claim(CLAIM["fbt-loss"], "perm", fair_study(+0.1, fbt_qualified=0))
    assert untrained["verdict"] == claims.NOT_TESTABLE and untrained["why"].startswith("fbt did not learn the task")
    missing = claims.read_claim(CLAIM["fbt-loss"], "perm", None)
    assert missing["verdict"] == claims.NOT_MEASURED
    assert missing["why"] == "run `workbench zoo --study fbt-vs-baseline --preset org-perm --seeds power`"
    older = claims.read_claim(CLAIM["fbt-soft-over-standard"], "addition", fair_study(-0.1))
    assert older["verdict"] == claims.NOT_MEASURED and "has no 'fbt soft - fbt standard: accuracy'" in older["why"]


def test_soft_decoding_can_only_show_where_answers_are_longer_than_a_token():
    row = claims.read_claim(CLAIM["fbt-soft-over-standard"], "perm", fair_study(-0.1))
    assert row["verdict"] == claims.NOT_TESTABLE and row["why"] == "the claim cannot show on perm"


def _hd_study(cross_minus_hd4: float, noise: float) -> dict:
    rng = np.random.default_rng(1)
    hd4 = rng.normal(0.8, 0.05, size=(5, 1))
    cells = {
        "hd4-cross-every-layer - hd4: accuracy, band": stats.paired_difference(
            hd4, hd4 + cross_minus_hd4 + rng.normal(0, noise, (5, 1))
        )
    }
    models = {f"baseline-seed{s}": {"member": "baseline", "competence": {"qualified": True}} for s in range(5)}
    return {"study": "hd-ablations", "models": models, "family": stats.family(cells)}


def test_a_claim_of_closeness_needs_the_whole_interval_within_the_margin():
    close = claims.read_claim(CLAIM["hd-few-cross-layers"], "perm", _hd_study(0.0, 0.005))
    assert close["verdict"] == claims.REPRODUCED and -claims.CLOSE <= close["low"] and close["high"] <= claims.CLOSE
    wide = claims.read_claim(CLAIM["hd-few-cross-layers"], "perm", _hd_study(0.0, 0.2))
    assert wide["verdict"] == claims.INCONCLUSIVE and wide["why"].endswith(f"is wider than +-{claims.CLOSE}")
    apart = claims.read_claim(CLAIM["hd-few-cross-layers"], "perm", _hd_study(-0.2, 0.005))
    assert apart["verdict"] == claims.CONTRADICTED and apart["why"].startswith("a detectable difference")


def test_an_interval_wider_than_the_papers_effect_is_inconclusive_and_one_within_it_is_no_difference():
    """n = 2 over 1: the HD release gains at most 3.4 points, so a half-width of 0.040 could miss a
    paper-sized effect and 0.030 could not; n = 4's largest gain, 5.3 points, is within 0.040."""

    def band(comparison: str, half: float) -> dict:
        cell = {"mean": 0.001, "low": -half, "high": half, "family_low": -half, "family_high": half, "p_holm": 0.9}
        models = {"hd1": {"member": "hd1", "competence": {"qualified": True}}}
        return {"study": "hd-ablations", "models": models, "family": {comparison: cell}}

    assert CLAIM["hd-streams"].effect == 0.034 and CLAIM["hd-streams-4"].effect == 0.053
    wide = claims.read_claim(CLAIM["hd-streams"], "flipflop", band("hd2 - hd1: accuracy, band", 0.04))
    assert wide["verdict"] == claims.INCONCLUSIVE and wide["paper_effect"] == 0.034
    assert wide["why"].startswith("+0.001 [-0.040, +0.040]: the study could call only a difference beyond +-0.040")
    assert "more than the largest effect the paper reports, 0.034 (the HD release: n = 2 gains 0.4-3.4" in wide["why"]
    narrow = claims.read_claim(CLAIM["hd-streams"], "flipflop", band("hd2 - hd1: accuracy, band", 0.03))
    assert narrow["verdict"] == claims.NO_DIFFERENCE and narrow["mde"] == pytest.approx(0.03)
    assert (
        claims.read_claim(CLAIM["hd-streams-4"], "flipflop", band("hd4 - hd1: accuracy, band", 0.04))["verdict"]
        == claims.NO_DIFFERENCE
    )
    # a claim whose paper reports no effect in these units keeps its minimum detectable effect
    unsized = claims.read_claim(CLAIM["hd-separate-kv"], "flipflop", band("hd4-shared-kv - hd4: accuracy, band", 0.2))
    assert unsized["verdict"] == claims.NO_DIFFERENCE and unsized["paper_effect"] is None


def test_every_arm_of_a_comparison_is_checked_and_only_the_arms():
    assert claims.arms(CLAIM["fbt-fused-accuracy"]) == ["fbt", "baseline"]
    assert claims.arms(CLAIM["fbt-layer0-state"]) == ["fbt"]
    assert claims.arms(CLAIM["fbt-contraction"]) == ["fbt-3pass0.03", "fbt-3pass0"]
    competence = {"qualified": False, "tasks": {"perm": {"accuracy": 0.61}}}
    study = {
        "models": {
            **{f"fbt-3pass0-seed{s}": {"member": "fbt-3pass0", "competence": {"qualified": True}} for s in range(3)},
            **{f"fbt-3pass0.03-seed{s}": {"member": "fbt-3pass0.03", "competence": {"qualified": True}} for s in range(3)},
            "fbt-3pass0.3-seed0": {"member": "fbt-3pass0.3", "competence": competence},  # not an arm of this claim
        },
        "family": {"fbt-3pass0.03 - fbt-3pass0: lambda(1000)": {"mean": -0.1, "low": -0.2, "high": -0.05, "p": 0.01}},
    }
    assert claims.read_claim(CLAIM["fbt-contraction"], "perm", study)["verdict"] == claims.REPRODUCED
    study["models"]["fbt-3pass0-seed2"]["competence"] = competence
    row = claims.read_claim(CLAIM["fbt-contraction"], "perm", study)
    assert row["verdict"] == claims.NOT_TESTABLE
    assert row["why"] == (
        "fbt-3pass0 did not learn the task at its setting: 2 of 3 seeds reached its competence target "
        "(lowest standard accuracy 0.610)"
    )


def test_the_table_has_a_row_per_claim_and_organism_and_every_control_is_a_test_that_exists():
    table = claims.claims_table(lambda study, organism: None)
    assert len(table) == len(claims.CLAIMS) * 3 and {r["verdict"] for r in table} == {claims.NOT_MEASURED, claims.NOT_TESTABLE}
    for path in claims.CONTROLS.values():
        file, name = path.split("::")
        tree = ast.parse((ROOT / file).read_text())
        assert name in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, path
    assert {c.study for c in claims.CLAIMS} <= set(claims.CONTROLS)


def test_every_comparison_a_claim_reads_is_one_its_study_declares():
    from workbench.experiments import fbt_vs_baseline
    from workbench.experiments.fair_readings import family_names
    from workbench.experiments.studies.hd_ablations import band_cell
    from workbench.experiments.studies.three_pass import THREE_PASS

    three = {f"fbt-3pass{f:g} - fbt-3pass0: lambda(1000)" for f in THREE_PASS if f}
    hd = {
        band_cell(m)
        for m in ("hd2", "hd4", "hd8", "hd4-supervise-all", "hd4-readout-sum", "hd4-cross-every-layer", "hd4-shared-kv")
    }
    for c in claims.CLAIMS:
        for organism in c.organisms:  # the fair study's family is its scale's: FAMILY and the tests beyond training
            fair = set(family_names(fbt_vs_baseline.SCALES[f"org-{organism}"]["beyond"]))
            probes = {"fbt recurrent K=2 - fbt standard: layer-0 probe accuracy"}
            traces = {f"fbt fused - baseline: {what}" for what in ("trace tokens", "accuracy")}
            declared = {"fbt-vs-baseline": fair, "three-pass": three, "hd-ablations": hd, "probes": probes, "traces": traces}
            assert c.comparison in declared[c.study], (c.key, organism)


def test_the_table_reads_each_study_where_the_cli_writes_it_by_default(tmp_path, monkeypatch):
    from workbench.cli import study_out
    from workbench.storage.files import write_json

    assert study_out("fbt-vs-baseline", "org-perm") / "study.json" == claims.study_path(
        Path("runs") / "organisms", "fbt-vs-baseline", "perm"
    )
    assert study_out("three-pass", "cpu") == Path("runs") / "studies" / "three-pass"
    path = claims.study_path(tmp_path, "fbt-vs-baseline", "perm")
    path.parent.mkdir(parents=True)
    write_json(path, fair_study(-0.1))
    reads = []
    monkeypatch.setattr(claims, "read_json", lambda p: reads.append(p) or fair_study(-0.1))
    rows = {(r["claim"], r["organism"]): r for r in claims.claims_from(tmp_path)}
    assert reads == [path]  # one read, though four claims ask the fair study on perm
    assert rows["fbt-loss", "perm"]["verdict"] == claims.REPRODUCED
    assert rows["fbt-loss", "flipflop"]["verdict"] == claims.NOT_MEASURED


def _at_accuracy(study: dict, member: str, regime: str, mean: float, test_set: str | None = None) -> dict:
    """``study`` whose readings give ``member`` in ``regime`` a mean accuracy of ``mean``."""
    readings = study.setdefault("readings", {})
    where = readings.setdefault("beyond", {}).setdefault(test_set, {}) if test_set else readings.setdefault("accuracy", {})
    where.setdefault(member, {})[regime] = {"mean": mean}
    return study


def test_a_claim_of_more_accuracy_over_a_member_at_the_ceiling_is_not_testable():
    """The flip-flop: a baseline that answers 99.98% leaves FBT at most +0.0002, which no interval
    could call; that reads 'not testable here', not 'no detectable difference'. The rule: the
    member the paper predicts lower leaves less room below 1 than the study's simultaneous
    half-width, so even a perfect other member would not be detectable."""
    study = fair_study(0.0)
    cell = study["family"]["fbt fused - baseline: accuracy"]
    half = (cell["family_high"] - cell["family_low"]) / 2
    assert 0.05 < half < 0.5  # the helper's null accuracy comparison
    at_ceiling = _at_accuracy(fair_study(0.0), "baseline", "standard", 1 - half / 2)
    row = claims.read_claim(CLAIM["fbt-fused-accuracy"], "perm", at_ceiling)
    assert row["verdict"] == claims.NOT_TESTABLE
    assert row["why"].startswith(f"at the ceiling: baseline answers {1 - half / 2:.3f}") and f"{half:.3f}" in row["why"]
    room = _at_accuracy(fair_study(0.0), "baseline", "standard", 1 - 2 * half)  # room for a detectable gain
    assert claims.read_claim(CLAIM["fbt-fused-accuracy"], "perm", room)["verdict"] == claims.NO_DIFFERENCE
    # at the ceiling, the opposite detectable is read before the ceiling rule: it needs no room to show
    worse = _at_accuracy(fair_study(0.0), "baseline", "standard", 1 - half / 2)
    worse["family"]["fbt fused - baseline: accuracy"] = {
        **cell,
        "mean": -0.9,
        "family_low": -1.0,
        "family_high": -0.8,
        "p_holm": 1e-6,
    }
    row = claims.read_claim(CLAIM["fbt-fused-accuracy"], "perm", worse)
    assert row["verdict"] == claims.CONTRADICTED and row["why"] == "the opposite is detectable: -0.900 [-1.000, -0.800]"
    # beyond training: the member's accuracy on that test set; a lower-is-predicted claim: its left member
    sparser = _at_accuracy(fair_study(0.0), "baseline", "standard", 1.0, "sparser")
    sparser["family"]["fbt fused - baseline: accuracy, sparser"] = dict(cell)
    assert claims.read_claim(CLAIM["fbt-glitches-sparser"], "flipflop", sparser)["verdict"] == claims.NOT_TESTABLE
    # HD: read on the declared band (the members' accuracy there, not on the test problems)
    on_band = {m: {"standard": {"mean": 1.0}} for m in ("hd4-supervise-all", "hd4")}
    hd = {
        "study": "hd-ablations",
        "models": {"baseline": {"member": "baseline", "competence": {"qualified": True}}},
        "readings": {m: {"accuracy": {"mean": 0.5}} for m in on_band} | {"band": "length5", "curves": {"length5": on_band}},
        "family": {"hd4-supervise-all - hd4: accuracy, band": {**cell, "mean": 0.0}},
    }
    row = claims.read_claim(CLAIM["hd-supervise-last"], "perm", hd)
    assert row["verdict"] == claims.NOT_TESTABLE
    assert row["why"].startswith("at the ceiling: hd4-supervise-all answers 1.000 of the band problems")
    # closeness: both sides at the ceiling are close whatever the architectures do; one with room is a reading
    on_band["hd4-cross-every-layer"] = {"standard": {"mean": 1.0}}
    zero = {**cell, "mean": 0.0, "low": 0.0, "high": 0.0, "family_low": 0.0, "family_high": 0.0}
    hd["family"]["hd4-cross-every-layer - hd4: accuracy, band"] = zero
    row = claims.read_claim(CLAIM["hd-few-cross-layers"], "perm", hd)
    assert row["verdict"] == claims.NOT_TESTABLE and "hd4 answers 1.000 and hd4-cross-every-layer answers 1.000" in row["why"]
    on_band["hd4"]["standard"]["mean"] = 0.8
    assert claims.read_claim(CLAIM["hd-few-cross-layers"], "perm", hd)["verdict"] == claims.REPRODUCED
    # no band with room: the comparison was not made, and the row says why
    hd |= {"family": {}, "readings": {"band": None, "unmeasured": {"hd2 - hd1: accuracy, band": "no difficulty band leaves"}}}
    row = claims.read_claim(CLAIM["hd-streams"], "perm", hd)
    assert row["verdict"] == claims.NOT_TESTABLE and row["why"] == "no difficulty band leaves"


def _three_pass(inputs: list[dict | None]) -> dict:
    """A three-pass study whose 3% fraction contracts detectably (lambda(1000) lower by 0.5 at every
    seed), its per-seed rollouts with ``inputs`` (None: a row made before rollouts recorded one)."""
    rng = np.random.default_rng(2)
    none = rng.normal(0.0, 0.05, size=(len(inputs), 1))
    cells = {"fbt-3pass0.03 - fbt-3pass0: lambda(1000)": stats.paired_difference(none, none - 0.5)}
    rows = [{"lyapunov_tangent": {"1000": -0.5}, **({} if i is None else {"input": i})} for i in inputs]
    models = {f"fbt-3pass0-seed{s}": {"member": "fbt-3pass0", "competence": {"qualified": True}} for s in range(len(inputs))}
    readings = {"fbt-3pass0.03": {"per_seed": rows}, "fbt-3pass0": {"per_seed": rows}}
    return {"study": "three-pass", "models": models, "family": stats.family(cells), "readings": readings}


def test_a_contraction_read_on_another_tasks_prompt_is_not_testable():
    own = {"run_task": "flipflop", "input_task": "flipflop"}
    assert claims.read_claim(CLAIM["fbt-contraction"], "flipflop", _three_pass([own] * 5))["verdict"] == claims.REPRODUCED
    before = claims.read_claim(CLAIM["fbt-contraction"], "flipflop", _three_pass([None] * 5))
    assert before["verdict"] == claims.NOT_TESTABLE and before["why"].startswith("its rollouts continued a chain prompt")
    chain = {"run_task": "flipflop", "input_task": "chain", "warning": "fbt trained on flipflop, and this input is chain: ..."}
    other = claims.read_claim(CLAIM["fbt-contraction"], "flipflop", _three_pass([own] * 4 + [chain]))
    assert other["verdict"] == claims.NOT_TESTABLE and "this input is chain" in other["why"]


def test_a_band_claims_arms_are_read_on_the_band_the_study_declared():
    curves = {name: {"baseline": {"standard": {"mean": a}}} for name, a in (("length5", 0.93), ("length6", 0.75))}
    study = {"readings": {"band": "length6", "curves": curves, "accuracy": {"baseline": {"standard": {"mean": 0.99}}}}}
    assert claims.arm_accuracy(study, "baseline", "band") == 0.75
    assert claims.arm_accuracy(study, "baseline", "length5") == 0.93 and claims.arm_accuracy(study, "baseline") == 0.99
    assert claims.arm_accuracy({"readings": {"band": None, "curves": curves}}, "baseline", "band") is None
