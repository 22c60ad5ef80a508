"""The results pages in docs/results/ are what scripts/results_pages.py renders from the JSON next
to them: a hand edit, or a JSON re-measured without regenerating, fails here. The committed figures
and screenshots are drawn by the code as it is now: the commit rule on a synthetic git history, then
on this repository."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("results_pages", ROOT / "scripts" / "results_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pages = _script()


def test_committed_pages_match_their_json(capsys):
    assert pages.main(["--check"]) == 0, capsys.readouterr().err


def test_every_committed_reading_is_the_current_rule():
    """Every cell the results hold with a ``detectable`` reading (a study's family) reads as
    ``stats.detectable`` reads it now: the pages, standard library only, print the stored word,
    so a rule changed without its results rewritten would print the old one."""
    from workbench.training import stats

    def cells(o, where):
        if isinstance(o, dict):
            if "detectable" in o and ("low" in o or "earlier" in o):
                yield where, o
            for k, v in o.items():
                yield from cells(v, f"{where}/{k}")
        elif isinstance(o, list):
            for i, v in enumerate(o):
                yield from cells(v, f"{where}/{i}")

    stale = [
        where
        for path in sorted((ROOT / "docs" / "results").glob("*.json"))
        for where, cell in cells(json.loads(path.read_text()), path.name)
        if cell["detectable"] != stats.detectable(cell)
    ]
    assert not stale, stale


def test_check_names_the_stale_page(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    assert pages.main(["--check", "--results", str(results)]) == 0
    page = results / "traces.md"
    page.write_text(page.read_text().replace("| 0.489 |", "| 0.500 |"))  # a hand edit
    (results / "zoo.md").unlink()  # a page never generated
    capsys.readouterr()
    assert pages.main(["--check", "--results", str(results)]) == 1
    err = capsys.readouterr().err
    assert "traces.md is stale" in err and "zoo.md is stale" in err and "probes.md" not in err
    assert pages.main(["--results", str(results)]) == 0  # regenerating repairs both
    assert pages.main(["--check", "--results", str(results)]) == 0


TINY_ZOO = {
    "scale": "test",
    "models": {
        "baseline": {
            "train_seconds": 12.34,
            "eval_seconds": 1.0,
            "resumed_from": None,
            "tasks": {
                "chain": {
                    "n": 8,
                    "loss": {"standard": 0.12345},
                    "answer_loss": {"standard": 0.5},
                    "accuracy": {"standard": 0.375},
                },
                "flipflop": {"n": 8, "loss": {"standard": 0.9}, "answer_loss": {"standard": 0.25}, "accuracy": {"standard": 1.0}},
            },
        },
        "fbt": {
            "train_seconds": 20.5,
            "eval_seconds": 2.0,
            "resumed_from": None,
            "tasks": {
                "chain": {
                    "n": 8,
                    "loss": {"standard": 0.1, "recurrent": 1.6},
                    "answer_loss": {"standard": 0.4, "fused": 0.7},
                    "accuracy": {"standard": 0.5, "fused": 0.125},
                },
                "flipflop": {
                    "n": 8,
                    "loss": {"standard": 0.95, "recurrent": 1.0},
                    "answer_loss": {"standard": 0.3, "fused": 0.6},
                    "accuracy": {"standard": 0.875, "fused": 0.625},
                },
            },
        },
    },
}


def test_zoo_table_known_answer():
    assert pages.zoo_table(TINY_ZOO) == (
        "| model, regime | train time | chain val loss | chain acc | flipflop acc |\n"
        "|---|---|---|---|---|\n"
        "| `baseline` standard | 12 s | 0.123 | 0.38 | 1.00 |\n"
        "| `fbt` standard | 20 s | 0.100 | 0.50 | 0.88 |\n"
        "| `fbt` fused |  |  | 0.12 | 0.62 |\n"
    )
    assert pages.zoo_loss_table(TINY_ZOO, "loss") == (
        "| model, regime | chain | flipflop |\n"
        "|---|---|---|\n"
        "| `baseline` standard | 0.123 | 0.900 |\n"
        "| `fbt` standard | 0.100 | 0.950 |\n"
        "| `fbt` recurrent | 1.600 | 1.000 |\n"
    )


def test_traces_table_known_answer():
    group = {"mean_trace": 10.04, "median_trace": 9.5, "accuracy": 0.5, "unfinished": 0.0}
    summary = {
        "reference": "a/standard",
        "timing": {"a/standard": {"problems_per_s": 9.6}, "a/soft": {"problems_per_s": 20.4}},
        "groups": {"a/soft": dict(group, accuracy=0.25, unfinished=0.125), "a/standard": group},
        "paired": {
            "a/soft - a/standard": {
                "trace_tokens": {"mean": 0.26, "ci_low": -0.04, "ci_high": 0.51},
                "accuracy": {"mean": -0.25, "ci_low": -0.3004, "ci_high": -0.19},
            }
        },
    }
    assert pages.traces_table(summary) == (
        "| model/regime | mean trace tokens | median | accuracy | unfinished | length vs a standard "
        "| accuracy vs a standard | problems/s |\n"
        "|---|---|---|---|---|---|---|---|\n"
        "| `a` standard | 10.0 | 9.5 | 0.500 | 0 |  |  | 10 |\n"
        "| `a` soft | 10.0 | 9.5 | 0.250 | 0.125 | +0.3 [-0.0, +0.5] | -0.250 [-0.300, -0.190] | 20 |\n"
    )


def test_a_seed_cell_is_the_workbench_interval_across_seeds():
    """The page's mean and interval (stdlib, a tabulated t) equal ``seed_interval``'s (scipy's t)."""
    from workbench.training.intervals import seed_interval

    for values in ([0.25, 0.5, 1.0], [0.1, 0.2], [0.3, 0.31, 0.35, 0.2, 0.9]):
        r = seed_interval(values)
        assert pages.seed_cell(values).startswith(f"{r['mean']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (")
    assert pages.seed_cell([0.5]) == "0.500"


def test_readings_table_rows_by_place_and_columns_by_measure():
    """An accuracy's interval is clipped to [0, 1] (its Student-t one here is [-0.671, 1.871]); other readings are not."""
    readings = {
        "standard/layer 0/accuracy": {"values": [0.5, 0.7]},
        "standard/layer 0/selectivity": {"values": [0.1, 0.1]},
        "recurrent K=2/layer 0/accuracy": {"values": [0.75]},
        "recurrent K=2/layer 0/selectivity": {"values": [0.25]},
        "regrowth step": {"values": [3.0, 5.0]},
    }
    assert pages.readings_table(readings) == (
        "| reading | accuracy | selectivity |\n"
        "|---|---|---|\n"
        "| standard/layer 0 | 0.600 [0.000, 1.000] (0.500, 0.700) | 0.100 [0.100, 0.100] (0.100, 0.100) |\n"
        "| recurrent K=2/layer 0 | 0.750 | 0.250 |\n"
        "\n"
        "| reading | value |\n"
        "|---|---|\n"
        "| regrowth step | 4.000 [-8.706, 16.706] (3.000, 5.000) |\n"
    )


@pytest.mark.parametrize(
    ("rerun_file", "resumed"),
    [
        ("zoo_cpu_seeds_rerun.json", {"fbt-seed1": 600, "fbt-seed2": 300}),
        ("zoo_cpu_seeds_idle.json", {"fbt-seed1": None, "fbt-seed2": None}),
    ],
)
def test_the_three_seed_zoo_rerun_equals_the_reported_zoo_as_floats(rerun_file, resumed):
    """docs/organisms.md: the cpu zoo trained again gives every member's held-out evaluation
    exactly, the claim this pins: once with two fbt seeds resumed from checkpoints, once from
    nothing on an idle machine (the budget's measurement)."""
    reported = json.loads((ROOT / "docs" / "results" / "zoo_cpu_seeds.json").read_text())["models"]
    rerun = json.loads((ROOT / "docs" / "results" / rerun_file).read_text())["models"]
    assert sorted(rerun) == sorted(reported) and len(reported) == 12
    assert {r: rerun[r]["resumed_from"] for r in resumed} == resumed
    for run, row in reported.items():
        for task, evaluation in row["tasks"].items():
            for field in ("loss", "answer_loss", "accuracy"):
                assert rerun[run]["tasks"][task][field] == evaluation[field], (run, task, field)


def test_data_efficiency_table_known_answer():
    study = {
        "readings": {
            "100/standard": {
                "tokens": 100,
                "regime": "standard",
                "fbt_loss": {"values": [1.0, 2.0]},
                "baseline_loss": {"values": [1.5, 1.5]},
                "token_ratio": {"values": [1.5]},
                "censored": [">2"],
            },
            "1000/soft": {
                "tokens": 1000,
                "regime": "soft",
                "fbt_loss": {"values": [0.5]},
                "baseline_loss": None,
                "token_ratio": None,
                "censored": [],
            },
        }
    }
    assert pages.data_efficiency_table(study) == (
        "| FBT tokens | FBT regime | FBT loss | baseline loss, same tokens | token ratio | bounds |\n"
        "|---|---|---|---|---|---|\n"
        "| 100 | standard | 1.500 [-4.853, 7.853] (1.000, 2.000) | 1.500 [1.500, 1.500] (1.500, 1.500) | 1.50 | >2 |\n"
        "| 1,000 | soft | 0.500 |  | - | - |\n"
    )


def test_three_pass_tables_known_answer():
    """Rows by fraction (0.1 sorts before 0.3 by value, not by name), the residual as mean
    [interval], each seed's regrowth step or 'never', and the standard accuracy, which the page
    averages over the tasks of each seed's row."""

    def run(standard: float) -> dict:
        return {"tasks": {"a": {"accuracy": {"standard": standard}}, "b": {"accuracy": {"standard": standard + 0.2}}}}

    def reading(runs: list[str], residual: list[float], lam: list[float], full: list[float], regrowth: list, soft: list) -> dict:
        return {
            "runs": runs,
            "kpass_residual": {"2": {"values": residual}},
            "lyapunov_tangent": {"100": {"values": lam}},
            "lyapunov_tangent_full": {"100": {"values": full}},
            "per_seed": [
                {
                    "kpass_residual": {"2": k},
                    "lyapunov_tangent": {"100": v},
                    "lyapunov_tangent_full": {"100": w},
                    "regrowth_step": r,
                }
                for k, v, w, r in zip(residual, lam, full, regrowth, strict=True)
            ],
            "accuracy": {"soft": {"values": soft}, "fused": {"values": [v / 2 for v in soft]}},
        }

    study = {
        "models": {"x": run(0.1), "x-seed1": run(0.3), "y": run(0.5), "y-seed1": run(0.5)},
        "readings": {
            "fbt-3pass0.3": reading(["y", "y-seed1"], [0.5, 0.5], [-1.0, -1.0], [0.0, 0.0], [None, None], [0.5, 0.5]),
            "fbt-3pass0.1": reading(["x", "x-seed1"], [1.0, 2.0], [0.0, 0.5], [1.0, 2.0], [3, None], [0.25, 0.75]),
        },
    }
    study["readings"]["fbt-3pass0"] = reading(["z", "z-seed1"], [0.0, 0.5], [-2.0, -1.0], [0.5, 0.5], [None, None], [0.5, 0.5])
    study["models"] |= {"z": run(0.0), "z-seed1": run(0.0)}
    assert pages.three_pass_paired_table(study).splitlines()[2:] == [
        "| 0.1 | 1.250 [-1.927, 4.427] (1.000, 1.500) | 1.750 [-1.427, 4.927] (2.000, 1.500) "
        "| 1.000 [-5.353, 7.353] (0.500, 1.500) | 0.000 [-1.000, 1.000] (-0.250, 0.250) "
        "| 0.000 [-1.000, 1.000] (-0.125, 0.125) |",  # accuracy differences clipped to [-1, 1]
        "| 0.3 | 0.250 [-2.927, 3.427] (0.500, 0.000) | 0.500 [-5.853, 6.853] (1.000, 0.000) "
        "| -0.500 [-0.500, -0.500] (-0.500, -0.500) | 0.000 [0.000, 0.000] (0.000, 0.000) "
        "| 0.000 [0.000, 0.000] (0.000, 0.000) |",
    ]
    del study["readings"]["fbt-3pass0"]
    residual, stable = pages.three_pass_tables(study)
    assert residual == ("| 3-pass fraction | K=2 |\n|---|---|\n| 0.1 | 1.50 [-4.85, 7.85] |\n| 0.3 | 0.50 [0.50, 0.50] |\n")
    assert stable.splitlines()[2:] == [
        "| 0.1 | 0.250 [-2.927, 3.427] (0.000, 0.500) | 1.500 [-4.853, 7.853] (1.000, 2.000) | 3, never | 0.300 [0.000, 1.000] (0.200, 0.400) "
        "| 0.500 [0.000, 1.000] (0.250, 0.750) | 0.250 [0.000, 1.000] (0.125, 0.375) |",  # accuracies clipped to [0, 1]
        "| 0.3 | -1.000 [-1.000, -1.000] (-1.000, -1.000) | 0.000 [0.000, 0.000] (0.000, 0.000) | never, never | 0.600 [0.600, 0.600] (0.600, 0.600) "
        "| 0.500 [0.500, 0.500] (0.500, 0.500) | 0.250 [0.250, 0.250] (0.250, 0.250) |",
    ]


def test_hd_ablations_table_known_answer():
    """One row per member in the readings' order; tasks as sorted columns, accuracy then loss; the
    jumps by expansion, each seed's; '-' where a member has no expansion or no hd1 to time against."""
    cell = {"values": [0.25, 0.75]}
    study = {
        "readings": {
            "hd2": {
                "accuracy": {"values": [0.5, 0.5]},
                "tasks": {
                    "b": {"accuracy": cell, "completion_loss": {"values": [1.0]}},
                    "a": {"accuracy": cell, "completion_loss": cell},
                },
                "expansion_jumps": {"1->2": {"values": [0.5, 1.5]}},
                "time_vs_hd1": {"values": [2.0, 2.0]},
                "step_time_vs_hd1": {"ratio": 1.75, "spread": [1.5, 2.25]},
            },
            "hd1": {
                "accuracy": {"values": [0.25]},
                "tasks": {"a": {"accuracy": cell, "completion_loss": cell}, "b": {"accuracy": cell, "completion_loss": cell}},
                "expansion_jumps": {},
                "time_vs_hd1": None,
            },
        }
    }
    assert pages.hd_ablations_table(study).splitlines() == [
        "| member | accuracy | a acc. | b acc. | a loss | b loss | loss jump | time / hd1 | step time / hd1 |",
        "|---|---|---|---|---|---|---|---|---|",
        "| `hd2` | 0.500 [0.500, 0.500] (0.500, 0.500) | 0.500 [0.000, 1.000] | 0.500 [0.000, 1.000] "
        "| 0.500 [-2.677, 3.677] | 1.000 | 1->2: 5.0e-1, 1.5e0 | 2.00 [2.00, 2.00] | 1.75 (1.50-2.25) |",
        "| `hd1` | 0.250 | 0.500 [0.000, 1.000] | 0.500 [0.000, 1.000] | 0.500 [-2.677, 3.677] "
        "| 0.500 [-2.677, 3.677] | - | - | - |",  # accuracies clipped to [0, 1], losses not
    ]
    study["readings"]["hd2"]["paired"] = {
        "reference": "hd1",
        "accuracy": {"values": [0.25, -0.25]},
        "completion_loss": {"values": [-1.0, -0.5]},
    }
    assert pages.hd_ablations_paired_table(study).splitlines() == [
        "| member | minus | accuracy | completion loss |",
        "|---|---|---|---|",
        "| `hd2` | `hd1` | 0.000 [-1.000, 1.000] (0.250, -0.250) | -0.750 [-3.927, 2.427] (-1.000, -0.500) |",
    ]


# ---------------------------------------------------------------- figures and screenshots


def _git(repo: Path, *args: str) -> str:
    import subprocess

    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _commit(repo: Path, path: str, text: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    _git(repo, "add", path)
    _git(repo, "commit", "-q", "-m", f"change {path}")
    return _git(repo, "rev-parse", "HEAD")


def _record(repo: Path, folder: Path, code: list[str], png: str = "fig.png") -> dict:
    """Draw ``png`` now (its bytes: the drawing code's text) and record it as the pipeline does."""
    (folder / png).write_bytes(b"".join((repo / c).read_bytes() for c in code if (repo / c).is_file()) or b"png")
    entry = {**pages.record_drawing(code, repo), "code": code, "sha256": pages.sha256(folder / png)}
    (folder / "manifest.json").write_text(json.dumps({png: entry}))
    return entry


def _problems(repo: Path, folder: Path, code: list[str]) -> list[str]:
    return pages.drawing_problems(folder, "manifest.json", {"fig.png": {"code": code}}, "REDRAW", repo)


@pytest.fixture
def history(tmp_path):
    """A git repository with a drawing file and an unrelated one committed; a folder of figures."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    _commit(repo, "draw.py", "def draw(): ...\n")
    _commit(repo, "other.py", "x = 1\n")
    folder = tmp_path / "figures"
    folder.mkdir()
    return repo, folder


def test_a_figure_is_stale_once_its_drawing_code_changes_in_a_later_commit(history):
    repo, folder = history
    drawn = _record(repo, folder, ["draw.py"])
    assert drawn["commit"] == _git(repo, "rev-parse", "HEAD") and drawn["uncommitted"] == []
    assert _problems(repo, folder, ["draw.py"]) == []
    _commit(repo, "other.py", "x = 2\n")  # a later commit that leaves the drawing code alone
    assert _problems(repo, folder, ["draw.py"]) == []
    changed = _commit(repo, "draw.py", "def draw(): return 1\n")
    (problem,) = _problems(repo, folder, ["draw.py"])
    assert problem.endswith(
        f"fig.png is stale: drawn at {drawn['commit'][:10]}, and the code that draws it (draw.py) changed since, "
        f"in {changed[:7]}: run `REDRAW` and commit the result"
    )
    _record(repo, folder, ["draw.py"])  # redrawn at the commit that changed it
    assert _problems(repo, folder, ["draw.py"]) == []


def test_a_folder_of_drawing_code_and_uncommitted_changes(history):
    """A directory as drawing code (the app) counts every file under it; a figure drawn while any
    of its drawing code differs from HEAD, or is untracked, records that and fails the check."""
    repo, folder = history
    _commit(repo, "app/page.py", "page = 1\n")
    drawn = _record(repo, folder, ["app"])
    assert _problems(repo, folder, ["app"]) == []
    (repo / "app" / "new.py").write_text("new = 1\n")  # untracked
    (repo / "draw.py").write_text("def draw(): return 2\n")  # changed, not committed
    drawn = _record(repo, folder, ["app", "draw.py"])
    assert drawn["uncommitted"] == ["app/new.py", "draw.py"]
    (problem,) = _problems(repo, folder, ["app", "draw.py"])
    assert "fig.png was drawn from uncommitted changes to app/new.py, draw.py: commit them, then run `REDRAW`" in problem
    _git(repo, "add", "app/new.py", "draw.py")
    _git(repo, "commit", "-q", "-m", "both")
    assert _problems(repo, folder, ["app", "draw.py"]) == [problem]  # still drawn from the uncommitted code
    _record(repo, folder, ["app", "draw.py"])
    assert _problems(repo, folder, ["app", "draw.py"]) == []
    _commit(repo, "app/page.py", "page = 2\n")
    assert "is stale" in _problems(repo, folder, ["app", "draw.py"])[0]


def test_a_figure_without_a_true_record_fails(history):
    repo, folder = history
    entry = _record(repo, folder, ["draw.py"])
    manifest = folder / "manifest.json"
    (folder / "fig.png").write_bytes(b"another drawing")  # replaced by hand
    assert "fig.png is not the file" in _problems(repo, folder, ["draw.py"])[0]
    entry = _record(repo, folder, ["draw.py"])
    (folder / "extra.png").write_bytes(b"x")  # a PNG nothing records
    assert "extra.png is not drawn by anything that records it" in _problems(repo, folder, ["draw.py"])[0]
    (folder / "extra.png").unlink()
    manifest.write_text(json.dumps({"fig.png": dict(entry, commit="0" * 40)}))  # a commit of no history here
    assert "its recorded commit '0000000000" in _problems(repo, folder, ["draw.py"])[0]
    manifest.write_text(json.dumps({"fig.png": dict(entry, code=[])}))  # a record that claims less drawing code
    assert "was drawn with other code than now" in _problems(repo, folder, ["draw.py"])[0]
    manifest.write_text("{}")
    assert "fig.png has no record in" in _problems(repo, folder, ["draw.py"])[0]
    _git(repo, "checkout", "-q", "-b", "side", "HEAD~1")  # the recorded commit is not in HEAD's history
    _commit(repo, "other.py", "x = 3\n")
    manifest.write_text(json.dumps({"fig.png": entry}))
    assert "which is not in HEAD's history" in _problems(repo, folder, ["draw.py"])[0]


def test_the_committed_figures_are_drawn_by_the_current_code():
    """The real check: every PNG in docs/results is a figure this script draws, recorded with the
    data and the commit it was drawn from, and its drawing code has not changed since."""
    if not pages.git_checkout(ROOT):
        pytest.skip(f"{ROOT} is not a git checkout: the recorded commits cannot be checked")
    assert sorted(p.name for p in (ROOT / "docs" / "results").glob("*.png")) == sorted(pages.FIGURES)
    assert pages.figure_and_screenshot_problems(ROOT / "docs" / "results", None, ROOT) == []


def test_the_screenshots_are_every_page_drawn_by_the_current_app():
    if not pages.git_checkout(ROOT):
        pytest.skip(f"{ROOT} is not a git checkout: the recorded commits cannot be checked")
    folder = ROOT / "docs" / "app"
    assert sorted(p.name for p in folder.glob("*.png")) == sorted(f"{page}.png" for page in pages.SCREENSHOT_PAGES)
    expected = {f"{page}.png": {"code": list(pages.SCREENSHOT_CODE)} for page in pages.SCREENSHOT_PAGES}
    assert pages.drawing_problems(folder, pages.SCREENSHOTS_MANIFEST, expected, pages.SCREENSHOTS_COMMAND, ROOT) == []


def test_a_figure_drawn_from_other_data_is_stale_until_redrawn(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    sweep = json.loads((results / "probe_fbt_memory.json").read_text())
    sweep["rows"][0]["accuracy"] = 0.99  # re-measured, the figure not redrawn
    (results / "probe_fbt_memory.json").write_text(json.dumps(sweep))
    capsys.readouterr()
    assert pages.main(["--check", "--results", str(results)]) == 1
    err = capsys.readouterr().err
    assert "probe_fbt_memory.png was drawn with other data than now" in err and "probes.md is stale" in err
    assert pages.main(["--figures", "--results", str(results)]) == 0
    assert json.loads((results / "figures.json").read_text())["probe_fbt_memory.png"]["data"] == {
        "probe_fbt_memory.json": pages.sha256(results / "probe_fbt_memory.json")
    }
    capsys.readouterr()
    pages.main(["--check", "--results", str(results)])
    err = capsys.readouterr().err
    assert "probe_fbt_memory.png was drawn with other data" not in err and "is stale" not in err


def test_the_organisms_zoo_is_what_the_docs_say():
    """docs/organisms.md, "The organisms' zoo at five seeds": within the 60-minute budget, every
    baseline at its target at 5 of 5 seeds, each organism's zoo.json beside the summary."""
    from workbench.training.zoo import ORGANISMS, TARGETS

    summary = json.loads((ROOT / "docs" / "results" / "zoo_organisms.json").read_text())
    assert summary["seeds"] == 5 and summary["session_wall_seconds"] < 3600 and summary["commit"]
    for task, row in summary["organisms"].items():
        zoo = json.loads((ROOT / "docs" / "results" / f"zoo_org_{task}.json").read_text())
        assert row["preset"] == ORGANISMS[task] == zoo["scale"] and row["targets"] == TARGETS[zoo["scale"]]
        baselines = [m for m in zoo["models"].values() if m["member"] == "baseline"]
        assert len(baselines) == 5 and all(m["competence"]["qualified"] for m in baselines), task
        assert row["qualified_seeds"]["baseline"] == "5/5" and row["session_wall_seconds"] == zoo["session_wall_seconds"]
    assert sum(r["session_wall_seconds"] for r in summary["organisms"].values()) <= summary["session_wall_seconds"]


def _regenerate():
    spec = importlib.util.spec_from_file_location("regenerate_organisms", ROOT / "scripts" / "regenerate_organisms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_organisms_pages_name_what_the_claims_read():
    from workbench.experiments import claims

    assert pages.ORGANISM_NAMES == claims.ALL
    assert set(pages.ORGANISM_STUDIES) - {"stability"} == {c.study for c in claims.CLAIMS} == set(claims.CONTROLS)


def test_the_claims_page_reads_the_studies_in_the_results_folder(tmp_path):
    """A study on an organism in the results folder gets its page; the claims table read from it
    (by scripts/regenerate_organisms.py) gives that organism's rows their verdicts and the rest
    "not measured yet"; the claims page shows each row and links the study's page."""
    from helpers import fair_study

    from workbench.experiments import claims

    study = fair_study(-0.2)
    name = pages.organism_study_name("fbt-vs-baseline", "perm")
    assert name == "study_fbt_vs_baseline_org_perm.json"
    (tmp_path / name).write_text(json.dumps(study))
    table = _regenerate().claims_json(tmp_path)["rows"]
    assert table == claims.claims_table(lambda s, o: study if (s, o) == ("fbt-vs-baseline", "perm") else None)
    loss = next(r for r in table if (r["claim"], r["organism"]) == ("fbt-loss", "perm"))
    assert loss["verdict"] == claims.REPRODUCED
    assert {r["verdict"] for r in table if r["organism"] == "flipflop"} <= {claims.NOT_MEASURED, claims.NOT_TESTABLE}
    assert "claims.md" not in pages.organism_pages(tmp_path)
    (tmp_path / pages.CLAIMS_JSON).write_text(json.dumps({"rows": table}))
    found = pages.organism_pages(tmp_path)
    assert set(found) == {"study_fbt_vs_baseline_org_perm.md", "claims.md"}
    text = pages.claims_page(tmp_path)
    assert text.count("\n| FBT |") + text.count("\n| HD |") == len(table)
    assert f"[fbt-vs-baseline](study_fbt_vs_baseline_org_perm.md) | {loss['comparison']} | {loss['difference']:+.3f}" in text
    assert "**reproduced**" in text


def test_regenerating_by_copy_reproduces_the_committed_organism_study_and_claims(tmp_path):
    """``scripts/regenerate_organisms.py --copy`` on a runs tree holding the committed three-pass
    study on perm writes that JSON (with its command), the claims table the committed one holds,
    and pages that pass the check."""
    committed = json.loads((ROOT / "docs" / "results" / "study_three_pass_org_perm.json").read_text())
    runs, results = tmp_path / "runs", tmp_path / "results"
    study = runs / "perm" / "studies" / "three-pass"
    study.mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({k: v for k, v in committed.items() if k != "command"}))
    shutil.copytree(ROOT / "docs" / "results", results)
    (results / "study_three_pass_org_perm.json").unlink()
    argv = ["--copy", "--no-zoo", "--organism", "perm", "--study", "three-pass", "--runs", str(runs), "--results", str(results)]
    assert _regenerate().main(argv) == 0
    copied = json.loads((results / "study_three_pass_org_perm.json").read_text())
    assert copied.pop("command") == f"workbench zoo --study three-pass --preset org-perm --seeds 5 --out {study}"
    assert copied == {k: v for k, v in committed.items() if k != "command"}
    claims_now = json.loads((results / "claims.json").read_text())["rows"]
    assert claims_now == json.loads((ROOT / "docs" / "results" / "claims.json").read_text())["rows"]
    assert pages.main(["--check", "--results", str(results)]) == 0


def test_a_step_run_again_replaces_its_record_whatever_its_output_folder():
    regenerate = _regenerate()
    zoo = "workbench zoo --preset organisms --seeds 5 --out runs/organisms --no-progress"
    before = "workbench zoo --study three-pass --preset org-perm --seeds 5 --out runs/organisms/perm/studies/three-pass"
    again = "workbench zoo --study three-pass --preset org-perm --seeds 5 --out /elsewhere/perm/studies/three-pass"
    other = "workbench zoo --study three-pass --preset org-flipflop --seeds 5 --out runs/organisms/flipflop/studies/three-pass"
    assert [regenerate.step_name(c) for c in (zoo, before, other)] == [
        regenerate.ZOO_STEP,
        "three-pass org-perm",
        "three-pass org-flipflop",
    ]
    steps = {zoo: {"wall_seconds": 1.0}, before: {"wall_seconds": 2.0}, other: {"wall_seconds": 3.0}}
    regenerate.record_step(steps, again, {"wall_seconds": 4.0})
    assert steps == {zoo: {"wall_seconds": 1.0}, other: {"wall_seconds": 3.0}, again: {"wall_seconds": 4.0}}


def test_copy_brings_in_a_step_made_elsewhere_and_the_claims_say_what_trained_each_study(tmp_path):
    """A study run in another tree (a worktree) leaves its step's record beside its output;
    ``--copy`` takes that record into ``organisms_regenerated.json`` and the study's JSON keeps the
    command as it ran there; the claims table says which training fingerprint made each result,
    and its page lists them."""
    committed = json.loads((ROOT / "docs" / "results" / "study_three_pass_org_perm.json").read_text())
    runs, results = tmp_path / "elsewhere" / "runs" / "organisms", tmp_path / "results"
    study = runs / "perm" / "studies" / "three-pass"
    study.mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({k: v for k, v in committed.items() if k != "command"}))
    ran = "workbench zoo --study three-pass --preset org-perm --seeds 5 --out runs/organisms/perm/studies/three-pass"
    step = {"commit": "c" * 40, "training_fingerprint": "f" * 64, "wall_seconds": 1.0, "rc": 0, "finished": "then"}
    regenerate = _regenerate()
    assert regenerate.step_file(study) == study.parent / "three-pass.step.json"
    regenerate.step_file(study).write_text(json.dumps({"command": f"{ran} --no-progress", "step": step}))
    shutil.copytree(ROOT / "docs" / "results", results)
    argv = ["--copy", "--no-zoo", "--organism", "perm", "--study", "three-pass", "--runs", str(runs), "--results", str(results)]
    assert regenerate.main(argv) == 0
    steps = json.loads((results / regenerate.RECORD).read_text())["steps"]
    assert steps[f"{ran} --no-progress"] == step
    # the committed record of this step, made under another output folder, is replaced; the rest kept
    committed_steps = json.loads((ROOT / "docs" / "results" / regenerate.RECORD).read_text())["steps"]
    names = [regenerate.step_name(c) for c in steps]
    assert names.count("three-pass org-perm") == 1 and sorted(names) == sorted(regenerate.step_name(c) for c in committed_steps)
    assert json.loads((results / "study_three_pass_org_perm.json").read_text())["command"] == ran
    made_under = json.loads((results / "claims.json").read_text())["made_under"]
    assert made_under["study_three_pass_org_perm.json"] == "f" * 64  # no organism's own recorded: the whole
    assert set(made_under) == {"zoo_organisms.json"} | {p.name for p in results.glob("study_*_org_*.json")}
    page = (results / "claims.md").read_text()
    assert "| perm | `ffffffffffff` | `study_three_pass_org_perm` |" in page
    perm = {f for name, f in made_under.items() if name.endswith("_org_perm.json") and f}  # the fake one and the rest's
    assert "f" * 64 in perm and f"{len(perm)} fingerprints for perm" in page
    # a step that recorded only the whole fingerprint is read under its organism's own where the
    # record knows that fingerprint's organisms
    record = json.loads((results / regenerate.RECORD).read_text())
    record["fingerprints"]["f" * 64] = {"perm": "e" * 64}
    (results / regenerate.RECORD).write_text(json.dumps(record))
    assert regenerate.claims_json(results)["made_under"]["study_three_pass_org_perm.json"] == "e" * 64
    took = json.loads((results / "claims.json").read_text())["took"]
    assert took["study_three_pass_org_perm.json"] == 1.0 and "| `study_three_pass_org_perm` | 0.0 |" in page
    recorded = [t for t in took.values() if t is not None]
    assert f"the {len(recorded)} results with a recorded time ran {sum(recorded) / 3600:.1f} h in all" in page
    assert pages.main(["--check", "--results", str(results)]) == 0
    running = runs / "flipflop" / "studies" / "three-pass"  # a study still training: its rows so far, no readings
    running.mkdir(parents=True)
    (running / "study.json").write_text(json.dumps({k: v for k, v in committed.items() if k != "readings"}))
    argv = ["--copy", "--no-zoo", "--study", "three-pass", "--runs", str(runs), "--results", str(results)]
    before = results / "study_three_pass_org_flipflop.json"
    before = before.read_text() if before.is_file() else None
    assert regenerate.main(argv) == 0
    after = results / "study_three_pass_org_flipflop.json"
    assert (after.read_text() if after.is_file() else None) == before  # what the results held, untouched


@pytest.mark.slow
def test_the_regeneration_fingerprints_on_the_pinned_cpu_path():
    """The regeneration's fingerprint is computed in a new process under ``PINNED_NUMERICS`` (they
    act only before torch is imported), which takes PyTorch's AVX2 kernels on this AVX-512 machine:
    a part made in a later session on another CPU is compared on the same path."""
    from workbench.training.fingerprint import PINNED_NUMERICS, cpu_model

    made = _regenerate().pinned_fingerprint(("flipflop",))
    assert made["numerics"] == {"cpu_capability": "AVX2", "cpu": cpu_model(), **PINNED_NUMERICS}
    assert set(made["members"]) == {"flipflop-baseline", "flipflop-fbt", "flipflop-hd4"}


def test_a_later_part_under_another_fingerprint_trains_nothing(tmp_path, monkeypatch):
    """``--expect``: a part of the regeneration made in a later session refuses to train when this
    code and machine give a fingerprint other than the one the earlier parts were made under."""
    regenerate = _regenerate()
    monkeypatch.setattr(regenerate, "pinned_fingerprint", lambda: {"sha256": "ab" * 32, "numerics": {"cpu_capability": "X"}})
    ran = []
    monkeypatch.setattr(regenerate.subprocess, "call", lambda command, **kw: ran.append(command) or 1)  # fails
    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    argv = ["--no-zoo", "--organism", "perm", "--study", "probes", "--runs", str(tmp_path / "runs"), "--results", str(results)]
    refused = "--expect d8b5: this code on this machine trains perm under another fingerprint than the parts made under d8b5"
    with pytest.raises(SystemExit, match=refused):
        regenerate.main([*argv, "--expect", "d8b5"])
    assert ran == [] and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit, match="exited 1: the steps after it were not run"):  # the one expected: it runs
        regenerate.main([*argv, "--expect", "abab"])
    assert len(ran) == 1 and ran[0][1:4] == ["zoo", "--study", "probes"]
    step = json.loads(regenerate.step_file(tmp_path / "runs" / "perm" / "studies" / "probes").read_text())["step"]
    assert step["rc"] == 1 and step["training_fingerprint"] == "ab" * 32  # a failed step is recorded too


def test_a_later_part_trains_an_organism_whose_own_fingerprint_is_the_expected_ones():
    """``--expect`` names a whole fingerprint; where the record knows its organisms' own, a code
    that changed one organism's training still makes parts for the others."""
    regenerate = _regenerate()
    known = {"d8b5" + "0" * 60: {"flipflop": "f1", "perm": "p1"}}
    now = {"sha256": "ab" * 32, "organisms": {"flipflop": "f1", "perm": "p2"}, "numerics": {}}
    assert regenerate.refusal("d8b5", now, known, ["flipflop"]) is None
    assert "trains perm under another fingerprint than the parts made under d8b5" in regenerate.refusal(
        "d8b5", now, known, ["flipflop", "perm"]
    )
    assert regenerate.refusal("abab", now, known, ["perm"]) is None  # this code's own
    assert "trains under fingerprint abab" in regenerate.refusal("9999", now, known, ["flipflop"])  # not known


def test_the_band_pilots_the_studies_page_quotes_are_the_committed_ones():
    pilots = json.loads((ROOT / "docs/results/band_pilots.json").read_text())["runs"]
    text = " ".join((ROOT / "docs/studies.md").read_text().split())
    assert ", ".join(f"{v:g}" for v in pilots["flipflop"]["accuracy"].values()) in text
    quoted = [("perm1-3", "length3"), ("perm1-3", "length4"), ("addition1-3", "digits3"), ("addition1-3", "digits4"),
              ("perm1-4-1400steps", "length4"), ("perm1-4-2000steps", "length4"), ("perm1-4-2000steps", "length5"), ("addition1-3-seq96", "digits4"), ("addition1-4-seq96", "digits4"),
              ("addition1-4-seq96", "digits5"), ("addition1-3-carries", "carries1"), ("addition1-3-carries", "carries2"),
              ("addition1-3-carries", "carries3"), ("addition1-4-seq96-carries", "carries2"),
              ("addition1-4-seq96-carries", "carries3"), ("addition1-4-seq96-carries", "carries4")]  # fmt: skip
    for label, band in quoted:
        assert f"{pilots[label]['accuracy'][band]:g}" in text, (label, band)


def test_the_kv_mirror_step_time_the_concepts_page_quotes_is_the_committed_one():
    entries = json.loads((ROOT / "docs/results/bench_small.json").read_text())["entries"]
    mirror = next(e for e in entries if e["key"] == "hd4_kv_mirror_train_step")
    lo, hi = mirror["spread"]
    assert f"takes {mirror['ratio']:.3f} [{lo:.3f}, {hi:.3f}] of the unmirrored one" in (ROOT / "docs/concepts.md").read_text()


def test_the_stability_pilot_the_docs_quote_is_the_committed_one():
    from workbench.experiments.studies.stability import KNOBS

    pilot = json.loads((ROOT / "docs/results/stability_pilot_org_addition.json").read_text())
    earlier = json.loads((ROOT / "docs/results/stability_pilot_org_addition_ee3c094.json").read_text())["members"]
    studies = " ".join((ROOT / "docs/studies.md").read_text().split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    accuracy = {m: r["tasks"]["addition"]["accuracy"] for m, r in pilot["models"].items()}
    seed = {m: r["per_seed"][0] for m, r in pilot["readings"].items()}
    assert pilot["study"] == "stability" and pilot["seeds"] == 1 and set(accuracy) == set(seed) == set(KNOBS)
    for m in KNOBS:  # the page's table, a row per member
        a, r = accuracy[m], seed[m]
        cells = [f"{a[regime]:g}" for regime in ("standard", "soft", "fused")]
        cells += [
            f"{r['lyapunov_tangent']['1000']:.3g}",
            f"{r['lyapunov_tangent_full']['1000']:.2g}",
            f"{r['kpass_residual']['8']:.3g}",
        ]
        assert " | ".join(cells) + " |" in studies, m
    shares = ("fbt-deeper0", "fbt", "fbt-deeper0.1", "fbt-deeper0.3", "fbt-deeper0.6", "fbt-deeper1")
    listed = ", ".join(f"{accuracy[m]['soft']:g}" for m in shares[:-1]) + f" and {accuracy[shares[-1]]['soft']:g}"
    assert f"accuracy {listed} at shares 0, 0.03, 0.1, 0.3, 0.6 and 1" in readme
    assert max(a["soft"] for m, a in accuracy.items() if m not in shares) <= 0.21
    contracting = sum(r["lyapunov_tangent"]["1000"] < 0 for r in seed.values())
    neutral = sum(abs(r["lyapunov_tangent_full"]["1000"]) < 0.01 for r in seed.values())
    assert f"contracts (lambda(1000) below 0) in {contracting} of 12 members" in studies
    assert f"contracts (lambda(1000) below 0) in {contracting} of 12 members" in readme
    assert f"(|lambda| below 0.01 in {neutral} of 12)" in studies
    residuals = [r["kpass_residual"]["8"] for r in seed.values()]
    assert f"is {min(residuals):.2f}-{max(residuals):.2f} of the state's size" in studies
    for m in ("fbt-deeper0", "fbt-deeper0.3"):
        assert f"{earlier[m]['accuracy']['soft']:g} / {earlier[m]['accuracy']['fused']:g}" in studies, m
    assert f"{accuracy['fbt-deeper1']['soft']:g} / {accuracy['fbt-deeper1']['fused']:g} with every batch deeper" in studies
    assert f"{accuracy['fbt-deeper0']['soft']:g} / {accuracy['fbt-deeper0']['fused']:g} with none" in studies
    moved = max(abs(accuracy[m][r] - earlier[m]["accuracy"][r]) for m in earlier for r in ("soft", "fused"))
    assert f"moves a member's `soft` or `fused` accuracy by up to {moved:.2f})" in studies


def test_the_stability_study_the_docs_quote_is_the_committed_one():
    study = json.loads((ROOT / "docs/results/study_stability_org_addition.json").read_text())
    studies = " ".join((ROOT / "docs/studies.md").read_text().split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    readings, models, family, power = study["readings"], study["models"], study["family"], study["power"]
    seeds = study["seeds"]
    assert seeds == 5 and "--seeds 5 " in study["command"] and all(len(r["runs"]) == seeds for r in readings.values())
    assert not any(c["detectable"] for c in family.values())
    for page in (studies, readme):
        assert f"family of {len(family)} comparisons detects none after Holm's correction" in page
    assert f"(the smallest Holm p is {min(c['p_holm'] for c in family.values()):.3g})" in studies
    shares = ("fbt-deeper0", "fbt", "fbt-deeper0.1", "fbt-deeper0.3", "fbt-deeper0.6", "fbt-deeper1")
    for regime, where in (("soft", "`soft` accuracy "), ("fused", "(`fused` ")):
        listed = [f"{readings[m]['accuracy'][regime]['mean']:.3g}" for m in shares]
        assert (
            f"{where}{', '.join(listed[:-1])} and {listed[-1]} at" in studies
            or f"{where}{', '.join(listed[:-1])} and {listed[-1]})" in studies
        )
    every = family["fbt-deeper1 - fbt: soft accuracy"]
    assert (
        f"+{every['mean']:.3g} in `soft` accuracy ({every['seeds_higher']} seeds higher, {every['seeds_lower']} lower) "
        f"with a simultaneous interval of [{every['family_low']:+.3g}, {every['family_high']:+.3g}]"
    ) in studies
    values = readings["fbt-deeper1"]["accuracy"]["soft"]["values"]
    assert f"ranges from {min(values):.3g} to {max(values):.3g}" in studies
    soft = readings["fbt"]["accuracy"]["soft"]["mean"]
    moved = max(abs(r["accuracy"]["soft"]["mean"] - soft) for m, r in readings.items() if m not in shares)
    assert f"No other knob moves `soft` by more than {moved:.2g} on average" in studies
    lam = [(m, v) for m, r in readings.items() for v in r["lyapunov_tangent"]["1000"]["values"]]
    contracting = sum(v < 0 for _, v in lam)
    assert all(v < 0 for v in readings["fbt-deeper0"]["lyapunov_tangent"]["1000"]["values"])
    assert f"contracts (lambda(1000) below 0) in {contracting} of {len(lam)} runs, every share-0 run" in studies
    assert f"contraction in {contracting} of {len(lam)} runs" in readme
    ends = (readings["fbt-deeper0"]["accuracy"]["soft"]["mean"], readings["fbt-deeper1"]["accuracy"]["soft"]["mean"])
    assert f"`soft` {ends[0]:.3g} to {ends[1]:.3g} from no deeper batches to all" in readme

    def standard(run: str) -> float:
        tasks = models[run]["tasks"].values()
        return sum(t["accuracy"]["standard"] for t in tasks) / len(tasks)

    short = [standard(run) for r in readings.values() for run in r["runs"] if not models[run]["competence"]["qualified"]]
    assert all(value < 0.9 for value in short)
    assert (
        f"{len(short)} of the {len(lam)} runs fall short of the 0.9 competence target in `standard` ({min(short):.2g}-{max(short):.3g})"
        in studies
    )
    assert f"predicts that {len(power['not_run'])} of the {len(family)} comparisons cannot reach a half-width of 0.05" in studies


def test_the_hd_band_readings_the_docs_quote_are_the_committed_ones():
    study = json.loads((ROOT / "docs/results/study_hd_ablations_org_flipflop.json").read_text())
    text = " ".join((ROOT / "docs/claims.md").read_text().split())
    readings, family = study["readings"], study["family"]
    band = readings["band"]
    pilot = ", ".join(f"{a:.3f}" for a in list(readings["band_pilot"]["pilot"].values())[:-1])
    assert f"answers {pilot} and {list(readings['band_pilot']['pilot'].values())[-1]:.3f} of the validation" in text
    assert f"so the band is `{band}`" in text
    on_band = [c["standard"]["mean"] for m, c in readings["curves"][band].items() if m != "baseline"]
    assert f"every member answers {min(on_band):.3f}-{max(on_band):.3f}" in text
    assert not any(c["detectable"] for c in family.values())
    assert f"None of the family's {len(family)} comparisons is detectable after Holm" in text
    for member in ("hd2", "hd4", "hd4-supervise-all", "hd4-shared-kv", "hd4-readout-sum", "hd4-cross-every-layer"):
        cell = next(c for name, c in family.items() if name.startswith(f"{member} - ") and name.endswith(", band"))
        assert f"{cell['mean']:+.3f} [{cell['family_low']:+.3f}, {cell['family_high']:+.3f}]" in text, member
    readout = family["hd4-readout-sum - hd4: accuracy, band"]
    assert f"at {readout['seeds_higher']} of {readout['n_seeds']} seeds" in text and readout["seeds_higher"] == 5
    members = study["models"]
    assert f"all {len(members)} runs' test-set evaluations" in text
    lo, hi = band.removeprefix("length").split("-")
    baseline = readings["curves"][band]["baseline"]["standard"]["mean"]
    assert f"read on sequences of {lo}-{hi} instructions, where its baseline answers {baseline:.3f}" in text
    for organism, what in (("perm", "products of 1 to {} permutations"), ("addition", "sums of 1 to {} digits")):
        other = json.loads((ROOT / f"docs/results/study_hd_ablations_org_{organism}.json").read_text())["readings"]
        assert other["band"] is None and "no difficulty band" in other["band_pilot"]["why"]
        pilot = [f"{a:.3f}" for a in other["band_pilot"]["pilot"].values()]
        assert f"answers {', '.join(pilot[:-1])} and {pilot[-1]} of {what.format(len(pilot))}" in text
    steps = json.loads((ROOT / "docs/results/organisms_regenerated.json").read_text())["steps"]
    for organism, words in (("flipflop", "5 seeds, {:.1f} min on 2 cores"), ("perm", "{:.0f} min"), ("addition", "{:.0f} min")):
        command = json.loads((ROOT / f"docs/results/study_hd_ablations_org_{organism}.json").read_text())["command"]
        assert words.format(steps[f"{command} --no-progress"]["wall_seconds"] / 60) in text, organism
    assert f"{study['session_wall_seconds'] / 60:.1f} of them training" in text


@pytest.mark.parametrize("organism", ["flipflop", "perm", "addition"])
def test_the_committed_hd_families_recompute_from_their_readings(organism):
    """Each committed HD study's declared family, the band comparisons among it, is what its own
    readings give, to the last bit (the band's from the stored answers, one bit per problem and
    seed)."""
    from workbench.experiments.comparisons import study_family

    study = json.loads((ROOT / f"docs/results/study_hd_ablations_org_{organism}.json").read_text())
    again = json.loads(json.dumps(study_family(study)))  # as the study wrote it
    assert again == study["family"]
    assert any(name.endswith(", band") for name in again) == (study["readings"]["band"] is not None)


def _three_pass_on_own_problems(organism: str) -> tuple[dict, str, dict]:
    """A committed three-pass study, rolled out on its organism's own problems at every seed, the
    claims page's text, and each of the two members the contraction claim reads' lambda(1000)
    (quoted on the page with its interval)."""
    study = json.loads((ROOT / f"docs/results/study_three_pass_org_{organism}.json").read_text())
    text = " ".join((ROOT / "docs/claims.md").read_text().split())
    readings = study["readings"]
    assert all(row["input"]["input_task"] == organism for r in readings.values() for row in r["per_seed"])
    lams = {m: readings[m]["lyapunov_tangent"]["1000"] for m in ("fbt-3pass0", "fbt-3pass0.03")}
    for member, lam in lams.items():
        assert f"{lam['mean']:+.3f} [{lam['low']:+.3f}, {lam['high']:+.3f}]" in text, member
    return study, text, lams


def test_the_three_pass_addition_readings_the_docs_quote_are_the_committed_ones():
    study, text, lams = _three_pass_on_own_problems("addition")
    family = study["family"]
    assert all(max(lam["values"]) < 0 for lam in lams.values())  # "every seed below 0 in both"
    for name in ("fbt-3pass0.03 - fbt-3pass0: lambda(1000)", "fbt-3pass0.3 - fbt-3pass0: residual K=8"):
        cell = family[name]
        assert f"{cell['mean']:+.3f} [{cell['family_low']:+.3f}, {cell['family_high']:+.3f}]" in text, name
    assert not any(c["detectable"] for c in family.values()) and f"after Holm over the {len(family)}" in text
    steps = json.loads((ROOT / "docs/results/organisms_regenerated.json").read_text())["steps"]
    assert f"{steps[study['command'] + ' --no-progress']['wall_seconds'] / 60:.0f} min on 2 cores" in text
    assert f"All {len(study['models'])} runs' evaluations equal the committed study's" in text


def test_the_three_pass_flipflop_readings_the_docs_quote_are_the_committed_ones():
    study, text, lams = _three_pass_on_own_problems("flipflop")
    readings, family = study["readings"], study["family"]
    assert [sum(v < 0 for v in lam["values"]) for lam in lams.values()] == [4, 5]
    claim, residual = family["fbt-3pass0.03 - fbt-3pass0: lambda(1000)"], family["fbt-3pass0.03 - fbt-3pass0: residual K=8"]
    assert (
        f"{claim['mean']:+.3f} [{claim['family_low']:+.3f}, {claim['family_high']:+.3f}] after Holm over the {len(family)}"
        in text
    )
    assert [n for n, c in family.items() if c["detectable"]] == ["fbt-3pass0.03 - fbt-3pass0: residual K=8"]
    assert f"{residual['mean']:+.3f} [{residual['family_low']:+.3f}, {residual['family_high']:+.3f}]" in text
    assert f"(Holm p {residual['p_holm']:.2g}, lower at {residual['seeds_lower']} of 5 seeds)" in text
    steps = json.loads((ROOT / "docs/results/organisms_regenerated.json").read_text())["steps"]
    assert f"{steps[study['command'] + ' --no-progress']['wall_seconds'] / 60:.1f} min" in text
    answers = [a["mean"] for r in readings.values() for a in r["accuracy"].values()]
    assert f"Every member answers {min(answers):.3f}-{max(answers):.3f} in `soft` and `fused`" in text
