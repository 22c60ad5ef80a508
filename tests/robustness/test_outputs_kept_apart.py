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
