"""``Run.open`` and ``RunTask``: what a run trained on, what its instruments read by default, and
what is said when an input is not that."""

import json
import random

import pytest

from workbench.data.tasks import MAKERS, SYNTHETIC, TaskConfig, task_of_prompt
from workbench.storage.errors import BadInput, MissingFile
from workbench.training.run import BY_HAND, Run, RunTask, run_task


@pytest.mark.parametrize("task", SYNTHETIC)
def test_every_tasks_prompts_are_recognised_as_that_task(task):
    for seed in range(40):
        example = MAKERS[task](random.Random(seed), TaskConfig())
        assert task_of_prompt(example.prompt) == task, example.prompt


@pytest.mark.parametrize("text", ["", "hello world", "Q: What is 2+2?\nA:", "F:x9", "P:abc-", "S:12a"])
def test_text_that_no_task_writes_is_recognised_as_none(text):
    assert task_of_prompt(text) is None


def test_a_mix_covers_its_weighted_tasks_and_no_other():
    mix = RunTask("mix", TaskConfig(mix_weights=(1.0, 0.0, 3.0)))
    assert mix.kinds == ("chain", "flipflop") and mix.labels == ("value", "memory")
    assert mix.covers("flipflop") and mix.covers("mix") and not mix.covers("modsum") and not mix.covers(BY_HAND)


def test_the_input_record_warns_exactly_where_the_input_is_not_the_runs_task(caplog):
    flip = RunTask("flipflop", TaskConfig())
    assert flip.input_record() == {"run_task": "flipflop", "input_task": "flipflop"}
    assert flip.input_record(prompt="F:a1--?a") == {"run_task": "flipflop", "input_task": "flipflop"}
    chain = flip.input_record(prompt="Q: Start with 12. Add 7. What is the result?\nA:", run="quick/fbt")
    assert chain["input_task"] == "chain" and chain["warning"].startswith(
        "quick/fbt trained on flipflop, and this input is chain"
    )
    assert "quick/fbt trained on flipflop" in caplog.text  # the CLI's line on stderr
    assert "warning" in flip.input_record(prompt="hello")  # not a flip-flop problem
    assert "warning" in flip.input_record("addition")
    corpus = RunTask("prepared:/data/c", TaskConfig())
    assert "warning" not in corpus.input_record(prompt="Once upon a time")  # text is a corpus's kind
    assert "warning" in corpus.input_record(prompt="F:a1?a")
    imported = RunTask(None, TaskConfig())
    assert imported.input_record(prompt="anything") == {"run_task": None, "input_task": BY_HAND}


def test_trace_tasks_follow_the_runs_task_and_one_token_answers_have_none():
    assert RunTask("addition", TaskConfig()).trace_task() == "addition"
    assert RunTask("mix", TaskConfig(mix_weights=(0.0, 1.0, 1.0))).kinds == ("modsum", "flipflop")
    assert RunTask("mix", TaskConfig()).trace_task() == "chain"
    assert RunTask("jsonl:d/x.jsonl", TaskConfig()).trace_task() == "gsm8k-jsonl:d/x.jsonl"
    for task in ("flipflop", "perm"):
        with pytest.raises(BadInput, match=f"not defined on {task}: its answers are one token.*org-addition"):
            RunTask(task, TaskConfig()).trace_task()
    with pytest.raises(BadInput, match="give --task"):
        RunTask(None, TaskConfig()).trace_task()


def test_run_open_reads_the_task_its_settings_and_scored_positions(tmp_path):
    from workbench import build_model, save_model

    model = build_model("baseline", "debug")
    save_model(model, tmp_path / "imported")  # no training sections: a model that records no task
    assert Run.open(tmp_path / "imported").task.spec is None
    config = json.loads((tmp_path / "imported" / "config.json").read_text())
    config |= {"train": {}, "fbt": {}, "hd": {}, "data": {"task": "perm", "perm_max_len": 3, "loss_on": "completion"}}
    (tmp_path / "imported" / "config.json").write_text(json.dumps(config))
    task = Run.open(tmp_path / "imported").task
    assert (task.spec, task.settings.perm_max_len, task.loss_on) == ("perm", 3, "completion")
    assert all(len(ex.prompt) <= 2 + 3 + 1 for ex in task.heldout(20))  # "P:", at most 3 letters, "="
    assert task.prompt() == task.heldout(1)[0].prompt
    with pytest.raises(MissingFile, match="no run at"):
        Run.open(tmp_path / "nothing")
    assert run_task("baseline:debug").spec is None  # a fresh model records no task
