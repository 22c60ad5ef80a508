"""Guarantee: no verb replaces an output it did not make; one configuration's output never
replaces another's."""

from workbench.training.evaluate import eval_file_name
from workbench.training.runconfig import make_run_config


def test_two_eval_tasks_never_share_an_output_file():
    cfg = make_run_config("baseline", "debug", "chain", [])
    n = cfg.train.eval_examples
    names = {task: eval_file_name(cfg, n, 2, task) for task in ("jsonl:d/x.jsonl", "jsonl:d_x.jsonl", "jsonl:d-x.jsonl")}
    assert len(set(names.values())) == 3, names
    assert all(name.startswith("eval_task-jsonl-d-x.jsonl-") for name in names.values()), names
    # a spec the name spells whole keeps its plain name; the run's own configuration keeps eval.json
    assert eval_file_name(cfg, n, 2, "addition") == "eval_task-addition.json"
    assert eval_file_name(cfg, n, 2, None) == eval_file_name(cfg, n, 2, "chain") == "eval.json"


def test_regenerating_the_organisms_refuses_a_results_folder_it_did_not_write(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    import pytest

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("regenerate_organisms", root / "scripts" / "regenerate_organisms.py")
    assert spec is not None and spec.loader is not None
    regenerate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regenerate)
    results = tmp_path / "mine"
    results.mkdir()
    (results / "README.md").write_text("my notes")
    (results / "claims.json").write_text('{"mine": true}')
    with pytest.raises(SystemExit) as stop:
        regenerate.main(["--copy", "--no-zoo", "--runs", str(tmp_path / "runs"), "--results", str(results)])
    assert stop.value.code == 2 and "is not a results directory this wrote" in capsys.readouterr().err
    assert (results / "README.md").read_text() == "my notes" and (results / "claims.json").read_text() == '{"mine": true}'
