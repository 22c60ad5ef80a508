"""Every instrument reads the run it is given: by default, held-out problems of the run's own task
(never another task's), and an input from elsewhere is analysed with its task and a warning
recorded beside the run's. One test per instrument, on runs of two tasks (flip-flop and addition)
trained a few steps: what they learned does not matter here, what they are fed does."""

import json

import pytest

from workbench.data.tasks import LABELS
from workbench.storage.errors import BadInput
from workbench.training.run import Run

pytestmark = pytest.mark.slow  # trains four runs (a few seconds) before its first test

CHAIN = "Q: Start with 12. Add 7. Multiply by 3. What is the result?\nA:"
ORGANISMS = ("flipflop", "addition")  # the tasks of the ``two_tasks`` runs


def test_dynamics_rolls_out_from_the_runs_own_problem_and_says_when_told_otherwise(two_tasks):
    from workbench.dynamics.study import analyse_run

    settings = dict(horizon=12, perturb_at=2, n_spectra=1, n_fixed=0, max_passes=2, tangents=1)
    for task, start in (("flipflop", "F:"), ("addition", "Q: ")):
        report = analyse_run(two_tasks / task / "fbt", **settings).report
        assert report["prompt"].startswith(start) and report["prompt"] == Run.open(two_tasks / task / "fbt").task.prompt()
        assert report["input"] == {"run_task": task, "input_task": task}
    told = analyse_run(two_tasks / "flipflop" / "fbt", prompt=CHAIN, **settings).report
    assert told["input"]["input_task"] == "chain" and "trained on flipflop" in told["input"]["warning"]


def test_the_three_pass_studys_stability_reads_the_members_own_task(two_tasks):
    from workbench.experiments.studies.three_pass import stability

    for task in ORGANISMS:
        assert stability(two_tasks / task / "fbt", horizon=4)["input"] == {"run_task": task, "input_task": task}


def test_traces_default_to_the_runs_task_and_refuse_one_token_answers(two_tasks, tmp_path):
    from workbench.studies.traces import trace_study

    common = dict(regimes=["standard"], n_problems=3, max_new_tokens=8)
    summary = trace_study([str(two_tasks / "addition" / "fbt")], tmp_path / "own", **common)
    assert summary["task"] == "addition" and summary["difficulties"] == [1, 2, 3]
    assert summary["inputs"] == {"fbt": {"run_task": "addition", "input_task": "addition"}}
    with pytest.raises(BadInput, match="not defined on flipflop.*org-addition"):
        trace_study([str(two_tasks / "flipflop" / "fbt")], tmp_path / "flip", **common)
    told = trace_study([str(two_tasks / "addition" / "fbt")], tmp_path / "chain", task="chain", **common)
    assert told["inputs"]["fbt"]["input_task"] == "chain" and "warning" in told["inputs"]["fbt"]


def test_probes_target_the_runs_own_label_by_default(two_tasks, tmp_path):
    from workbench.probing.study import probe_study

    quick = dict(hooks=["blocks.0.hook_resid_pre"], passes=(), exact=False, n_sequences=12, mdl=False, ranks=())
    for task, label in (("flipflop", "memory"), ("addition", "carry")):
        report = probe_study(two_tasks / task / "fbt", out=tmp_path / task, **quick)
        assert (report["target"], report["task"], report["input"]) == (label, task, {"run_task": task, "input_task": task})
    other = probe_study(two_tasks / "addition" / "fbt", "memory", out=tmp_path / "other", **quick)
    assert other["task"] == "flipflop" and "trained on addition" in other["input"]["warning"]


def test_an_sae_trains_on_the_runs_own_problems(two_tasks, tmp_path):
    from workbench.probing.sae_study import sae_study

    for task in ORGANISMS:
        report = sae_study(two_tasks / task / "fbt", "blocks.0.hook_resid_pre", n_sequences=10, steps=2, out=tmp_path / task)
        assert (report["task"], report["input"]) == (task, {"run_task": task, "input_task": task})


def test_the_activation_store_caches_the_runs_own_task(two_tasks, tmp_path):
    from workbench.cli import main

    for task in ORGANISMS:
        hooks = ["--hooks", "blocks.0.hook_resid_pre", "--n", "4"]
        main(
            [
                "cache",
                str(two_tasks / task / "fbt"),
                *hooks,
                "--out",
                str(tmp_path / task),
                "--json",
                str(tmp_path / f"{task}.json"),
            ]
        )
        meta = json.loads((tmp_path / f"{task}.json").read_text())
        assert meta["input"] == {"run_task": task, "input_task": task} and meta["labels"] == [LABELS[task][0]]


def test_stream_windows_score_the_positions_training_scored(two_tasks):
    from workbench.data.windows import IGNORE
    from workbench.studies.streams import stream_logit_lens, task_windows

    run = Run.open(two_tasks / "addition" / "hd")
    task = run.task
    x, y = task_windows(task.spec, 4, 48, tokenizer=run.tokenizer, data=task.settings, completion_only=True)
    _, every = task_windows(task.spec, 4, 48, tokenizer=run.tokenizer, data=task.settings)
    scored = y != IGNORE
    assert 0 < scored.sum() < (every != IGNORE).sum()  # completions only: fewer than every position
    prompt_chars = set(run.tokenizer.encode("QA:"))  # only prompts hold these
    assert not any(int(t) in prompt_chars for t in y[scored])  # a prompt's tokens are never a scored target
    lens = stream_logit_lens(run.model(), x, y)
    assert lens["positions"] == int(scored.sum())
