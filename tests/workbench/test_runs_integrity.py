"""Wrongly structured and unreadable entries under a runs root: each is an error row of
``list_runs`` naming the file and what was expected, the runs beside it stay usable, every page of
the app renders without an exception, and nothing under the root is written. Counted under
``faultkit.tally("unreadable entries")``."""

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import assert_nothing_lost, stamps, tally

from workbench.runs import find_run_dirs, inspect_run, list_runs

pytestmark = pytest.mark.slow  # every test here drives the app over a trained zoo

pytest.importorskip("streamlit")

REPO = Path(__file__).resolve().parents[2]
PAGES = ["runs", "probes", "dynamics", "traces", "streams", "playground"]
GOOD = ["baseline", "fbt", "hd2", "hd4"]
NOBODY = 65534
SMALL_DYNAMICS = {
    "dyn_horizon": 60,
    "dyn_starts": 3,
    "dyn_fp_steps": 20,
    "dyn_spectra": 2,
}  # its defaults take a minute on 2 cores
FAULTS = tally("unreadable entries")


def _task(edit):
    """An edit of the first task's result in eval.json."""
    return lambda e: e | {"tasks": {t: edit(r) if i == 0 else r for i, (t, r) in enumerate(e["tasks"].items())}}


# (run name, file, edit of its parsed JSON (a list of records for JSONL), what the error must say besides the file)
VARIANTS = [
    ("data-list", "config.json", lambda c: c | {"data": []}, "section 'data' must be a JSON object, got list"),
    ("train-text", "config.json", lambda c: c | {"train": "fast"}, "section 'train' must be a JSON object, got str"),
    ("model-list", "config.json", lambda c: c | {"model": []}, "the model config must be a JSON object, got list"),
    ("no-model", "config.json", lambda c: {k: v for k, v in c.items() if k != "model"}, "has no 'model' field"),
    ("arch-number", "config.json", lambda c: c | {"arch": 5}, "unknown architecture 5"),
    ("heads-zero", "config.json", lambda c: c | {"model": c["model"] | {"n_heads": 0}}, "n_heads=0: expected an integer >= 1"),
    ("steps-text", "config.json", lambda c: c | {"train": c["train"] | {"steps": "many"}}, "steps='many'"),
    ("a-section-missing", "config.json", lambda c: {k: v for k, v in c.items() if k != "hd"}, "but not ['hd']"),
    ("config-array", "config.json", lambda c: [c], "must hold a JSON object, got list"),
    ("tasks-number", "results/eval.json", lambda e: e | {"tasks": 5}, "field 'tasks' must be an object, got 5"),
    (
        "accuracy-text",
        "results/eval.json",
        _task(lambda r: r | {"accuracy": {"standard": "high"}}),
        "accuracy.standard' must be a number in [0, 1], got 'high'",
    ),
    (
        "accuracy-above-one",
        "results/eval.json",
        _task(lambda r: r | {"accuracy": {"standard": 2}}),
        "must be a number in [0, 1], got 2",
    ),
    (
        "accuracy-list",
        "results/eval.json",
        _task(lambda r: r | {"accuracy": []}),
        "accuracy' must be an object, got []",
    ),
    (
        "answer-loss-missing",
        "results/eval.json",
        _task(lambda r: {k: v for k, v in r.items() if k != "answer_loss"}),
        "answer_loss' must be an object, got nothing",
    ),
    ("n-text", "results/eval.json", _task(lambda r: r | {"n": "12"}), "n' must be an integer >= 0, got '12'"),
    ("task-list", "results/eval.json", lambda e: e | {"tasks": {"chain": [1]}}, "field 'tasks.chain' must be an object, got [1]"),
    ("eval-array", "results/eval.json", lambda e: [e], "must hold a JSON object, got list"),
    (
        "metrics-no-loss",
        "metrics.jsonl",
        lambda m: [{"step": r["step"]} for r in m],
        "record 1 (step 10) has loss=null, expected a number",
    ),
    (
        "metrics-lr-text",
        "metrics.jsonl",
        lambda m: m[:1] + [m[1] | {"lr": "fast"}] + m[2:],
        'record 2 (step 20) has lr="fast", expected a number',
    ),
]


def build_tree(micro_zoo: Path, root: Path) -> Path:
    """The micro zoo's five runs, and under ``bad/`` a copy of its baseline per variant."""
    for name in GOOD:
        shutil.copytree(micro_zoo / name, root / name)
    for name, file, edit, _ in VARIANTS:
        run = shutil.copytree(micro_zoo / "baseline", root / "bad" / name)
        if file.endswith(".jsonl"):
            records = edit([json.loads(line) for line in (run / file).read_text().splitlines()])
            (run / file).write_text("".join(json.dumps(r) + "\n" for r in records))
        else:
            (run / file).write_text(json.dumps(edit(json.loads((run / file).read_text()))))
    return root


@pytest.fixture(scope="module")
def tree(micro_zoo, tmp_path_factory):
    return build_tree(micro_zoo, tmp_path_factory.mktemp("integrity") / "runs")


@pytest.fixture(scope="module")
def listing(tree):
    return {r.name: r for r in list_runs(tree)}


def render_every_page(root: Path) -> dict:
    """Each page's exception and error elements, the app opened on ``root`` as ``workbench app`` would."""
    from streamlit.testing.v1 import AppTest

    previous = os.environ.get("WORKBENCH_RUNS")
    os.environ["WORKBENCH_RUNS"] = str(root)
    try:
        at = AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=600).run()
        for key, value in SMALL_DYNAMICS.items():
            at.session_state[key] = value
        shown = {}
        for page in PAGES:
            if page != "runs":
                at.switch_page(f"views/{page}.py").run()
            shown[page] = {
                "exceptions": [e.value for e in at.exception],
                "errors": [e.value for e in at.error],
                "options": list(at.selectbox(key="probe_run").options) if page == "probes" else [],
            }
        return shown
    finally:
        os.environ.pop("WORKBENCH_RUNS") if previous is None else os.environ.__setitem__("WORKBENCH_RUNS", previous)


@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_a_wrongly_structured_config_or_eval_is_an_error_row_naming_the_file(tree, listing, variant):
    name, file, _, expected = variant
    FAULTS["inputs_tried"] += 1
    FAULTS["faults_injected"] += 1
    run = listing[f"bad/{name}"]
    assert not run.usable and str(tree / "bad" / name / file) in run.error and expected in run.error, run.error
    assert "\n" not in run.error
    assert {"config.json": run.config == {}, "metrics.jsonl": run.metrics == []}.get(
        file, run.eval is None
    )  # nothing a page could trust by mistake
    assert [g for g in GOOD if not listing[g].usable] == []


def test_the_listing_finds_every_run_and_trusts_only_the_good_ones(tree, listing):
    assert [str(p.relative_to(tree)) for p in find_run_dirs(tree)] == sorted(GOOD + [f"bad/{v[0]}" for v in VARIANTS])
    assert sorted(n for n, r in listing.items() if r.usable) == GOOD
    # what the pages read of a usable run is there and of the written type
    fbt = listing["fbt"]
    assert isinstance(fbt.config["model"]["n_layers"], int) and isinstance(fbt.config["data"]["task"], str)
    assert all(isinstance(res["accuracy"]["standard"], float) for res in fbt.eval["tasks"].values())


def test_a_model_only_config_is_a_usable_run(micro_zoo, tmp_path):
    """What ``save_model`` writes ({"arch", "model"}) is valid; the model section is completed."""
    run = shutil.copytree(micro_zoo / "hd2", tmp_path / "hd2")
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({"arch": "hd", "model": config["model"]}))
    info = inspect_run(run, tmp_path)
    assert info.usable and info.arch == "hd" and info.config["model"]["n_streams"] == 2, info.error


def test_hidden_files_under_results_are_not_results(micro_zoo, tmp_path):
    run = shutil.copytree(micro_zoo / "fbt", tmp_path / "fbt")
    (run / "results" / ".workbench.lock").write_text("")
    (run / "results" / ".eval.json.x1y2.tmp").write_text("{")
    info = inspect_run(run, tmp_path)
    assert info.usable and info.results == ["eval.json"], info.results


def test_listing_and_every_page_write_nothing_and_show_no_exception(tree, monkeypatch):
    before = stamps(tree)
    runs = list_runs(tree)
    shown = render_every_page(tree)
    assert_nothing_lost(before, stamps(tree), FAULTS)
    assert {p: s["exceptions"] for p, s in shown.items()} == {p: [] for p in PAGES}
    broken = [r.name for r in runs if not r.usable]
    assert all(any(name in e for e in shown["runs"]["errors"]) for name in broken), shown["runs"]["errors"]
    assert sorted(shown["probes"]["options"]) == GOOD  # broken runs are not offered for analysis


# -- permission denied ----------------------------------------------------------------------------

# entry under the root -> (the part made unreadable, relative to the entry; the mode; named in the error)
LOCKS = {
    "locked-run": ("", 0o000, "locked-run"),
    "locked-config": ("config.json", 0o000, "locked-config/config.json"),
    "locked-results": ("results", 0o000, "locked-results/results"),
    "locked-metrics": ("metrics.jsonl", 0o000, "locked-metrics/metrics.jsonl"),
    "unlistable": ("", 0o111, "unlistable"),  # a directory of runs that can be entered but not listed
}


def survey(root: str, out: str) -> None:
    """What a user sees of ``root``: the listing, the app's cache stamps and every page (run as the
    unprivileged user in a subprocess when the tests run as root). Writes JSON to ``out``."""
    from app.state import stamp

    root = Path(root)
    dirs = find_run_dirs(root)
    result = {
        "dirs": [str(d.relative_to(root)) for d in dirs],
        "stamps": [stamp(d) for d in dirs],
        "runs": {r.name: r.error for r in list_runs(root)},
        "pages": render_every_page(root),
    }
    Path(out).write_text(json.dumps(result))


def _drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _drop_read_override() -> None:
    """Root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped from the bounding set, so the
    exec does not give them back): permission bits then apply to it as to the files' owner."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0):  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")


# the first of these under which the interpreter, the venv and the worktree can be read runs the survey
UNPRIVILEGED = [
    (f"uid {NOBODY}", _drop_to_nobody),
    ("root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH", _drop_read_override),
]


def _python(preexec, argv: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HOME": str(home),
        "MPLCONFIGDIR": str(home / "mpl"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "workbench"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, preexec_fn=preexec, capture_output=True, text=True, timeout=600
    )


def _unprivileged(home: Path):
    """The first identity of UNPRIVILEGED that can import the app; skips naming why none can."""
    reasons = []
    for what, preexec in UNPRIVILEGED:
        try:
            probe = _python(preexec, ["-c", "import app.state, workbench.runs, streamlit.testing.v1"], home)
        except OSError as err:  # the interpreter itself cannot be executed
            reasons.append(f"{what}: {err}")
            continue
        if probe.returncode == 0:
            return preexec
        reasons.append(f"{what}: {(probe.stderr.strip().splitlines() or ['exit ' + str(probe.returncode)])[-1]}")
    pytest.skip(f"no unprivileged identity can read {sys.executable} and {REPO}: {'; '.join(reasons)}")


def test_unreadable_entries_are_error_rows_and_every_page_still_renders(micro_zoo):
    as_root = os.geteuid() == 0  # root reads through permission bits: the survey then runs in a subprocess without that power
    base = Path(tempfile.mkdtemp(prefix="workbench-unreadable-"))
    base.chmod(0o755)  # the unprivileged uid must reach the tree (pytest's tmp_path is under a 0700 directory)
    locked = []
    try:
        root = base / "runs"
        for name in GOOD:
            shutil.copytree(micro_zoo / name, root / name)
        for entry in LOCKS:
            shutil.copytree(micro_zoo / "baseline", root / entry / ("fbt" if entry == "unlistable" else ""))
        home = base / "home"
        home.mkdir()
        home.chmod(0o777)  # the survey's HOME and output, whichever identity runs it
        preexec = _unprivileged(home) if as_root else None
        before = stamps(root)
        for entry, (part, mode, _) in LOCKS.items():
            target = root / entry / part
            locked.append((target, target.stat().st_mode & 0o777))
            target.chmod(mode)
            FAULTS["inputs_tried"] += 1
            FAULTS["faults_injected"] += 1
        out = home / "survey.json"
        if as_root:
            child = _python(preexec, ["-c", f"from test_runs_integrity import survey; survey({str(root)!r}, {str(out)!r})"], home)
            assert child.returncode == 0, child.stderr[-3000:]
        else:
            survey(str(root), str(out))
        result = json.loads(out.read_text())
        for target, mode in reversed(locked):
            target.chmod(mode)
        locked.clear()
        assert_nothing_lost(before, stamps(root), FAULTS)

        assert set(result["dirs"]) == set(GOOD) | set(LOCKS), result["dirs"]
        runs = result["runs"]
        assert sorted(n for n, e in runs.items() if e is None) == GOOD, runs
        for entry, (_, _, named) in LOCKS.items():
            assert runs[entry] and str(root / named) in runs[entry] and "Permission denied" in runs[entry], (entry, runs[entry])
        assert {p: s["exceptions"] for p, s in result["pages"].items()} == {p: [] for p in PAGES}
        assert all(any(entry in e for e in result["pages"]["runs"]["errors"]) for entry in LOCKS), result["pages"]["runs"][
            "errors"
        ]
        assert sorted(result["pages"]["probes"]["options"]) == GOOD
    finally:
        for target, mode in locked:
            target.chmod(mode)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("summary,expected", [("zoo.json", True), ("study.json", True), (None, False)])
def test_a_micro_zoo_or_study_member_is_a_plumbing_check(tmp_path, summary, expected):
    """A run whose directory's zoo.json or study.json says ``scale: micro`` is a plumbing check; a
    cpu zoo's member or a lone run is not."""
    from workbench import build_model, save_model

    save_model(build_model("baseline", "debug"), tmp_path / "zoo" / "baseline")
    if summary:
        (tmp_path / "zoo" / summary).write_text(json.dumps({"scale": "micro", "models": {}}))
    assert inspect_run(tmp_path / "zoo" / "baseline").plumbing_check is expected
    if summary:
        (tmp_path / "zoo" / summary).write_text(json.dumps({"scale": "cpu", "models": {}}))
        assert inspect_run(tmp_path / "zoo" / "baseline").plumbing_check is False


def test_a_run_being_written_is_training_not_broken(micro_zoo, tmp_path):
    """A run whose directory is held (as training holds it) and has no weights yet is
    "training" with its last logged step and budget, not broken; once released, the missing weights
    are its error. ``holder`` names the process holding it and takes nothing."""
    from workbench.runs import inspect_run
    from workbench.storage.outputs import hold, holder

    run = shutil.copytree(micro_zoo / "fbt", tmp_path / "fbt")
    (run / "model.safetensors").unlink()
    assert holder(run) is None
    with hold(run):
        held = holder(run)
        assert held["pid"] == os.getpid()
        info = inspect_run(run, tmp_path)
        steps = json.loads((run / "config.json").read_text())["train"]["steps"]
        assert info.training == {"holder": held, "step": info.metrics[-1]["step"], "steps": steps}
        assert info.error is None and not info.usable
    assert holder(run) is None  # released
    info = inspect_run(run, tmp_path)
    assert info.training is None and "model.safetensors" in info.error


def test_an_organism_studys_members_five_levels_down_are_listed(tmp_path):
    member = tmp_path / "organisms" / "addition" / "studies" / "three-pass" / "fbt-3pass0"
    member.mkdir(parents=True)
    (member / "config.json").write_text("{}")
    assert find_run_dirs(tmp_path) == [member]
