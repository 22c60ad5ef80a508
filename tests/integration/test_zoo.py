"""The micro zoo trains and evaluates every reference model end to end (well under 2 minutes)."""

import json
import shutil

from workbench.cli import main
from workbench.training.zoo import ensure_zoo, member_names, train_zoo


def test_micro_zoo_trains_every_member_and_writes_eval(micro_zoo):
    summary = json.loads((micro_zoo / "zoo.json").read_text())
    assert list(summary["models"]) == member_names("micro") == ["baseline", "fbt", "hd2", "hd4"]
    for name, _row in summary["models"].items():
        evaluation = json.loads((micro_zoo / name / "results" / "eval.json").read_text())
        assert set(evaluation["tasks"]) == {"chain", "modsum", "flipflop"}
        regimes = {"standard", "soft", "fused"} if name.startswith("fbt") else {"standard"}
        for task in evaluation["tasks"].values():
            assert set(task["accuracy"]) == regimes == set(task["answer_loss"])
            assert all(0 <= a <= 1 for a in task["accuracy"].values())
        # it learned something: below uniform over the 100 ids on what the zoo trains, completions
        # (a prompt's tokens are read, never predicted, so the whole-example loss is no measure),
        # averaged over the tasks (chain is a tenth of the draws: 60 steps barely touch it)
        answers = [task["answer_loss"]["standard"] for task in evaluation["tasks"].values()]
        assert sum(answers) / len(answers) < 4.6, answers
    config = json.loads((micro_zoo / "hd4" / "config.json").read_text())
    assert config["model"]["n_streams"] == 4 and config["init_from"].endswith("baseline")


def test_rerunning_a_member_resumes_it_and_keeps_the_others(micro_zoo, tmp_path):
    zoo = shutil.copytree(micro_zoo, tmp_path / "zoo")
    before = json.loads((zoo / "zoo.json").read_text())["models"]
    main(["zoo", "--preset", "micro", "--out", str(zoo), "--only", "baseline", "--no-progress"])
    after = json.loads((zoo / "zoo.json").read_text())["models"]
    assert before["baseline"]["resumed_from"] is None and after["baseline"]["resumed_from"] == 60
    assert list(after) == list(before) and after["hd4"] == before["hd4"]


def test_ensure_zoo_trains_only_what_is_missing_and_reports_progress(micro_zoo, tmp_path):
    zoo = shutil.copytree(micro_zoo, tmp_path / "zoo")
    shutil.rmtree(zoo / "fbt")
    calls = []
    assert ensure_zoo("micro", zoo, progress=lambda name, step, total, record: calls.append((name, step, total, record))) == zoo
    assert {c[0] for c in calls} == {"fbt"}
    assert [c[1] for c in calls] == list(range(1, 61)) and {c[2] for c in calls} == {60}
    logged = [c[3]["step"] for c in calls if c[3] is not None]
    assert logged == [10, 20, 30, 40, 50, 60]
    assert (zoo / "fbt" / "results" / "eval.json").is_file()
    calls.clear()
    ensure_zoo("micro", zoo, progress=lambda *a: calls.append(a))
    assert calls == []  # nothing missing: nothing trained


def test_unknown_zoo_preset_is_named(tmp_path):
    import pytest

    for call in (train_zoo, ensure_zoo):
        with pytest.raises(ValueError, match="unknown zoo preset 'huge'"):
            call("huge", tmp_path)
