"""Saved dynamics and trace studies as the app reads them back ("the app and its jobs"): a file
edited by hand, cut short or of other runs is one ``BadInput`` naming the file and the field, never a
``KeyError`` in a page; and the shape checker's known answers."""

import csv
import io
import json
import shutil

import pytest
from helpers import tally
from safetensors.torch import load_file, save_file

from workbench import build_model, save_model
from workbench.dynamics.study import STATES, dynamics_study
from workbench.dynamics.study import read_study as read_dynamics
from workbench.storage.errors import BadInput
from workbench.storage.shapes import COUNT, FRACTION, Each, check_shape
from workbench.studies.traces import read_study as read_traces_study
from workbench.studies.traces import trace_study

HOSTILE = tally("the app and its jobs")


@pytest.mark.parametrize(
    "value, shape, message",
    [
        ({"a": 1}, {"a": int}, None),
        ({"a": 1.5}, {"a": int}, "field 'a' must be a whole number, got 1.5"),
        ({"a": True}, {"a": float}, "field 'a' must be a number, got True"),
        ({"a": 3}, {"a": float}, None),
        ({}, {"a?": int}, None),
        ({}, {"a": int}, "field 'a' must be a whole number, got nothing"),
        ({"a": [1, "x"]}, {"a": [int]}, "field 'a[1]' must be a whole number, got 'x'"),
        ({"a": {"k": {"b": None}}}, {"a": Each({"b": (str, None)})}, None),
        ({"a": {"k": {"b": 2}}}, {"a": Each({"b": (str, None)})}, "field 'a.k.b' must be a string or null, got 2"),
        ([1], {"a": int}, "the file must be an object, got [1]"),
        ({"a": 5}, {"a": [[float]]}, "field 'a' must be a list of lists of numbers, got 5"),
        ({"a": 0}, {"a": COUNT}, None),
        ({"a": -1}, {"a": COUNT}, "field 'a' must be an integer >= 0, got -1"),
        ({"a": True}, {"a": COUNT}, "field 'a' must be an integer >= 0, got True"),
        ({"a": {"x": 1}}, {"a": Each(FRACTION)}, None),
        ({"a": {"x": 1.5}}, {"a": Each(FRACTION)}, "field 'a.x' must be a number in [0, 1], got 1.5"),
        ({"a": {"x": "1"}}, {"a": Each(FRACTION)}, "field 'a.x' must be a number in [0, 1], got '1'"),
    ],
)
def test_check_shape_known_answers(value, shape, message):
    if message is None:
        check_shape(value, shape, "f.json")
    else:
        with pytest.raises(BadInput) as err:
            check_shape(value, shape, "f.json")
        assert str(err.value) == f"f.json: {message}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real dynamics study and a real trace study of two debug runs."""
    root = tmp_path_factory.mktemp("saved")
    runs = [save_model(build_model("fbt", "debug", seed=s), root / f"fbt{s}") for s in (0, 1)]
    dyn = root / "dynamics"
    dynamics_study(
        list(map(str, runs)),
        dyn,
        prompt="Q: Start with 3.",
        horizon=12,
        perturb_at=2,
        n_spectra=1,
        n_fixed=1,
        n_starts=3,
        fp_steps=5,
        max_passes=2,
    )
    traces = root / "traces"
    trace_study([str(r) for r in runs], traces, task="chain", regimes=("standard", "soft"), n_problems=3, max_new_tokens=8)
    return root, ["fbt0", "fbt1"]


def damaged(source, tmp_path, name, content):
    copy = shutil.copytree(source, tmp_path / f"{source.name}-{len(list(tmp_path.iterdir()))}")
    (copy / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return copy


@pytest.mark.slow
def test_a_saved_dynamics_study_reads_back_and_every_damage_is_named(saved, tmp_path):
    root, names = saved
    found = read_dynamics(root / "dynamics", names)
    assert set(found) == set(names) and found["fbt0"][1].shape == (12, 32)
    report = json.loads((root / "dynamics" / "dynamics.json").read_text())
    run = report["runs"]["fbt0"]

    def with_run(**fields):
        return {**report, "runs": {**report["runs"], "fbt0": {**run, **fields}}}

    cases = [
        (report | {"runs": {"fbt1": run}}, "field 'runs.fbt0'"),
        (with_run(stopped=5), "field 'runs.fbt0.stopped'"),
        (with_run(per_step={**run["per_step"], "state_norm": "big"}), "field 'runs.fbt0.per_step.state_norm'"),
        (with_run(lyapunov={"12": None}), "field 'runs.fbt0.lyapunov.12'"),
        (with_run(spectra=[{**run["spectra"][0], "eigenvalues": [["x", 0]]}]), "field 'runs.fbt0.spectra[0].eigenvalues[0][0]'"),
        (
            with_run(fixed_points=[{**run["fixed_points"][0], "points": [{"stable": 1}]}]),
            "field 'runs.fbt0.fixed_points[0].points[0].stable'",
        ),
        (with_run(kpass={"rows": [{"passes": "2"}]}), "field 'runs.fbt0.kpass.rows[0].passes'"),
        (report | {"states": "../../elsewhere.safetensors"}, "field 'states' must name a file beside it"),
        ("[1, 2", "dynamics.json"),
    ]
    for content, named in cases:
        copy = damaged(root / "dynamics", tmp_path, "dynamics.json", content)
        with pytest.raises(BadInput, match="dynamics.json") as err:
            read_dynamics(copy, names)
        assert named in str(err.value) and str(copy) in str(err.value), (named, str(err.value))
    # the states: garbage, a run's missing, a rollout of another length, fixed points of another width
    states = load_file(str(root / "dynamics" / STATES))
    copy = damaged(root / "dynamics", tmp_path, STATES, "not safetensors")
    with pytest.raises(BadInput, match=f"{STATES}: not the study's rollout states"):
        read_dynamics(copy, names)
    point = {"stable": True, "spectral_radius": 0.5, "state": [0.0] * 3}
    narrow = with_run(fixed_points=[{"step": 2, "path_independent": False, "points": [point]}])
    for tensors, content, named in [
        ({"fbt1": states["fbt1"]}, report, "'fbt0' must be the 12 rollout states"),
        ({**states, "fbt0": states["fbt0"][:5]}, report, "'fbt0' must be the 12 rollout states"),
        (states, narrow, "a fixed point of 'fbt0' at step 2 is not of d_model=32"),
    ]:
        copy = damaged(root / "dynamics", tmp_path, "dynamics.json", content)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(copy / STATES))
        with pytest.raises(BadInput, match=named):
            read_dynamics(copy, names)
    HOSTILE["inputs_tried"] += len(cases) + 4
    HOSTILE["faults_injected"] += len(cases) + 4


def test_a_saved_trace_study_reads_back_and_every_damage_is_named(saved, tmp_path):
    root, names = saved
    summary, rows = read_traces_study(root / "traces", names)
    assert len(rows) == 2 * 2 * 3 and {r["model"] for r in rows} == set(names)
    table = (root / "traces" / "traces.csv").read_text()
    header, first, *rest = table.splitlines()
    fields = header.split(",")

    def row_with(field, value):
        cells = next(csv.reader([first]))
        cells[fields.index(field)] = value
        line = io.StringIO()
        csv.writer(line).writerow(cells)
        return "\n".join([header, line.getvalue().strip(), *rest]) + "\n"

    summary_cases = [
        ({**summary, "n_problems": "3"}, "field 'n_problems'"),
        ({**summary, "chat": {"runs": 5}}, "field 'chat'"),
        ({**summary, "paired": {"x": {"accuracy": {"mean": 0}}}}, "field 'paired.x.trace_tokens'"),
        ({k: v for k, v in summary.items() if k != "reference"}, "field 'reference'"),
    ]
    table_cases = [
        (row_with("trace_tokens", "many"), "line 2"),
        (row_with("correct", "yes"), "line 2: fields correct"),
        (row_with("state_norms", "[1, "), "line 2"),
        (row_with("state_norms", '"x"'), "field 'state_norms'"),
        (row_with("model", "someone-else"), "model 'someone-else'"),
        (row_with("problem_id", "99"), "problem 99"),
        (header.replace("difficulty", "hardness") + "\n" + "\n".join([first, *rest]), "line 2 has no field 'difficulty'"),
        ("model,regime\n", "holds no traces"),
        (b"\xff\xfe".decode("latin-1"), "holds no traces"),
    ]
    for content, named in summary_cases:
        copy = damaged(root / "traces", tmp_path, "summary.json", content)
        with pytest.raises(BadInput, match="summary.json") as err:
            read_traces_study(copy, names)
        assert named in str(err.value), (named, str(err.value))
    for content, named in table_cases:
        copy = damaged(root / "traces", tmp_path, "traces.csv", content)
        with pytest.raises(BadInput, match="traces.csv") as err:
            read_traces_study(copy, names)
        assert named in str(err.value), (named, str(err.value))
    HOSTILE["inputs_tried"] += len(summary_cases) + len(table_cases)
    HOSTILE["faults_injected"] += len(summary_cases) + len(table_cases)
