"""The micro zoo trains and evaluates every reference model end to end (well under 2 minutes)."""

import json

from workbench.cli import main


def test_micro_zoo_trains_every_member_and_writes_eval(tmp_path, capsys):
    main(["zoo", "--preset", "micro", "--out", str(tmp_path), "--no-progress"])
    summary = json.loads((tmp_path / "zoo.json").read_text())
    assert list(summary["models"]) == ["baseline", "fbt", "fbt-no3pass", "hd2", "hd4"]
    for name, row in summary["models"].items():
        evaluation = json.loads((tmp_path / name / "results" / "eval.json").read_text())
        assert set(evaluation["tasks"]) == {"chain", "modsum", "flipflop"}
        regimes = {"standard", "soft", "fused"} if name.startswith("fbt") else {"standard"}
        for task in evaluation["tasks"].values():
            assert set(task["accuracy"]) == regimes == set(task["answer_loss"])
            assert all(0 <= a <= 1 for a in task["accuracy"].values())
            assert task["loss"]["standard"] < 4.6  # below uniform over the 100 ids: it learned something
    config = json.loads((tmp_path / "hd4" / "config.json").read_text())
    assert config["model"]["n_streams"] == 4 and config["init_from"].endswith("baseline")
    # a second call resumes finished runs instead of overwriting them
    main(["zoo", "--preset", "micro", "--out", str(tmp_path), "--only", "baseline", "--no-progress"])
    again = json.loads((tmp_path / "zoo.json").read_text())["models"]["baseline"]
    assert summary["models"]["baseline"]["resumed_from"] is None and again["resumed_from"] == 60
