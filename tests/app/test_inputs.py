"""The app's pages feed a run its own task by default, say so, and warn where a user's input is
another task's: on runs of two tasks (``two_tasks``: flip-flop and addition)."""

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

pytestmark = pytest.mark.slow  # every test here drives the app

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "main.py")
CHAIN = "Q: Start with 12. Add 7. Multiply by 3. What is the result?\nA:"


def page(monkeypatch, runs: Path, name: str) -> AppTest:
    monkeypatch.setenv("WORKBENCH_RUNS", str(runs))
    at = AppTest.from_file(MAIN, default_timeout=300).run()
    at.switch_page(f"views/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def warnings(at: AppTest) -> list[str]:
    return [w.value for w in at.warning]


def test_dynamics_prompt_is_each_runs_own_problem_and_a_chain_prompt_is_warned(monkeypatch, two_tasks):
    at = page(monkeypatch, two_tasks, "dynamics")
    at.multiselect(key="dyn_runs").set_value(["flipflop/fbt"]).run()
    assert at.text_area(key="dyn_prompt").value.startswith("F:") and not warnings(at)
    at.multiselect(key="dyn_runs").set_value(["addition/fbt"]).run()
    assert at.text_area(key="dyn_prompt").value.startswith("Q: ") and not warnings(at)
    at.text_area(key="dyn_prompt").set_value(CHAIN).run()
    assert any("addition/fbt trained on addition, and this input is chain" in w for w in warnings(at))


def test_playground_prompt_is_the_runs_own_problem(monkeypatch, two_tasks):
    at = page(monkeypatch, two_tasks, "playground")
    at.selectbox(key="pg_run").set_value("flipflop/fbt").run()
    assert at.text_area(key="pg_prompt").value.startswith("F:") and not warnings(at)
    at.text_area(key="pg_prompt").set_value(CHAIN).run()
    assert any("trained on flipflop" in w for w in warnings(at))


def test_traces_offer_the_runs_task_and_say_plainly_where_trace_length_is_undefined(monkeypatch, two_tasks):
    at = page(monkeypatch, two_tasks, "traces")
    at.multiselect(key="tr_runs").set_value(["flipflop/fbt"]).run()
    assert any("not defined on flipflop" in i.value and "org-addition" in i.value for i in at.info)
    assert not [b for b in at.button if b.key == "tr_compare"]
    at.multiselect(key="tr_runs").set_value(["addition/fbt"]).run()
    assert at.selectbox(key="tr_task").value == "addition" and at.multiselect(key="tr_difficulty").value == [1, 2, 3]
    at.selectbox(key="tr_task").set_value("chain").run()
    assert any("this input is chain" in w for w in warnings(at))


def test_streams_read_the_runs_task_at_the_positions_training_scored(monkeypatch, two_tasks):
    at = page(monkeypatch, two_tasks, "streams")
    at.selectbox(key="st_run").set_value("addition/hd").run()
    assert at.selectbox(key="st_task").value == "addition" and at.radio(key="st_scored").value == "scored positions"
    assert any("the completions training scored" in c.value for c in at.caption)
    at.radio(key="st_scored").set_value("all positions").run()
    assert any("every position, prompts included" in c.value for c in at.caption)


def test_probes_target_the_runs_own_label(monkeypatch, two_tasks):
    at = page(monkeypatch, two_tasks, "probes")
    at.selectbox(key="probe_run").set_value("addition/fbt").run()
    assert at.selectbox(key="probe_target").value == "carry" and not warnings(at)
    at.selectbox(key="probe_target").set_value("memory").run()
    assert any("this input is flipflop" in w for w in warnings(at))


def test_probes_page_flags_an_unconverged_probe_and_a_memorised_control(monkeypatch, two_tasks, tmp_path):
    import json
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(two_tasks / "addition" / "fbt", runs / "fbt")
    row = dict(hook="blocks.0.hook_resid_pre", layer=0, stream=0, chance=0.5, selectivity=0.0, n_train=10, n_test=10)
    rows = [
        {**row, "prefill": "standard", "passes": 1, "accuracy": 0.7, "control_accuracy": 0.995, "converged": True},
        {**row, "prefill": "recurrent", "passes": 2, "accuracy": 0.9, "control_accuracy": 0.995, "converged": False},
    ]
    rows = [{**r, "compression": 1.8, "control_compression": 1.1, "mdl_bits": 10.0, "uniform_bits": 18.0} for r in rows]
    (runs / "fbt" / "results").mkdir(exist_ok=True)
    (runs / "fbt" / "results" / "probe_carry.json").write_text(json.dumps({"n_sequences": 10, "task": "addition", "rows": rows}))
    at = page(monkeypatch, runs, "probes")
    assert "recurrent K=2 (not converged)" in [m.label for m in at.metric]
    assert any("did not converge" in w and "recurrent K=2" in w for w in warnings(at))
    assert any("memorisation" in i.value and "selectivity" in i.value for i in at.info)
    assert any("MDL compression 1.80 (control 1.10)" in c.value for c in at.caption)
