"""Every page of the Streamlit app through ``AppTest`` on the micro zoo: it renders without an
exception, its main widgets change what is drawn, and bad input shows an error element."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from helpers import assert_nothing_lost, snapshot, tally

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

pytestmark = pytest.mark.slow  # every test here drives the app over a trained zoo

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


@pytest.fixture(scope="module")
def zoo(micro_zoo, tmp_path_factory):
    """A copy of the micro zoo the pages may write results into."""
    return shutil.copytree(micro_zoo, tmp_path_factory.mktemp("app") / "runs")


def open_page(monkeypatch, runs: Path, page: str | None = None) -> AppTest:
    monkeypatch.setenv("WORKBENCH_RUNS", str(runs))
    at = AppTest.from_file(MAIN, default_timeout=600).run()
    if page:
        at.switch_page(f"views/{page}.py").run()
    assert_clean(at)
    return at


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def finish_jobs(at: AppTest, timeout: float = 600) -> AppTest:
    """Wait until every background job of the app is over, check that each did its work, and
    rerun the page (which then shows what the jobs wrote)."""
    from workbench.jobs import list_jobs

    root = Path(os.environ["WORKBENCH_RUNS"])
    deadline = time.monotonic() + timeout
    while any(j.running for j in list_jobs(root)):
        assert time.monotonic() < deadline, [j.title for j in list_jobs(root) if j.running]
        time.sleep(0.2)
    failed = [(j.title, j.state, j.log_tail(1000)) for j in list_jobs(root) if j.state not in ("done", "cancelled")]
    assert not failed, failed
    return at.run()


def charts(at: AppTest) -> list:
    return at.get("vega_lite_chart")


def test_runs_page_lists_the_zoo_and_switches_runs(monkeypatch, zoo):
    at = open_page(monkeypatch, zoo)
    assert at.title[0].value == "Runs" and not errors(at)
    table = at.dataframe[0].value
    assert sorted(table["run"]) == ["baseline", "fbt", "hd2", "hd4"] and set(table["status"]) == {"ok"}
    assert table["plumbing check"].all()
    # one accuracy column per task the runs were evaluated on, whatever it is (the
    # columns were chain's and flip-flop's, blank for every other organism)
    evaluated = {
        t for r in ("baseline", "fbt", "hd2", "hd4") for t in json.loads((zoo / r / "results" / "eval.json").read_text())["tasks"]
    }
    assert evaluated and {c for c in table.columns if " acc " in c} == {f"{t} acc (standard)" for t in evaluated}
    assert table[[f"{t} acc (standard)" for t in evaluated]].notna().all().all()
    at.selectbox(key="run").set_value("fbt").run()
    assert_clean(at)
    assert json.loads(at.json[0].value)["arch"] == "fbt"
    fbt_eval = at.dataframe[1].value
    assert set(fbt_eval["regime"]) == {"standard", "soft", "fused"}
    at.selectbox(key="run").set_value("hd4").run()
    assert set(at.dataframe[1].value["regime"]) == {"standard"}


def test_a_corrupt_checkpoint_is_an_error_on_runs_and_the_rest_keeps_working(monkeypatch, micro_zoo, tmp_path):
    runs = shutil.copytree(micro_zoo, tmp_path / "runs")
    weights = runs / "fbt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    at = open_page(monkeypatch, runs)
    assert any("fbt" in e and "model.safetensors" in e for e in errors(at)), errors(at)
    assert "broken" in set(at.dataframe[0].value["status"])
    # the broken run is not offered for analysis; the others still work
    at.switch_page("views/playground.py").run()
    assert_clean(at)
    assert "fbt" not in at.selectbox(key="pg_run").options and "baseline" in at.selectbox(key="pg_run").options


def test_a_run_training_from_the_cli_is_training_on_the_runs_page_not_broken(monkeypatch, micro_zoo, tmp_path):
    """A run whose directory another process (here, this one) holds and which has no
    weights yet is listed as training, with its step, and no error; released, it is broken."""
    from workbench.storage.outputs import hold

    root = shutil.copytree(micro_zoo, tmp_path / "runs")
    (root / "fbt" / "model.safetensors").unlink()
    with hold(root / "fbt"):
        at = open_page(monkeypatch, root)
        assert not [e for e in errors(at) if "fbt" in e], errors(at)
        steps = json.loads((root / "fbt" / "config.json").read_text())["train"]["steps"]
        infos = [i.value for i in at.info]
        assert any(f"fbt: training (step {steps} of {steps}" in i for i in infos), infos
        table = at.dataframe[0].value
        assert table.set_index("run").loc["fbt", "status"] == "training"
    at = open_page(monkeypatch, root)
    assert any("fbt: cannot be used" in e and "model.safetensors" in e for e in errors(at))


def test_an_empty_runs_directory_offers_to_train_the_zoo_with_progress(monkeypatch, tmp_path):
    at = open_page(monkeypatch, tmp_path)
    assert any("No runs" in i.value for i in at.info)
    at.button(key="train_zoo").click().run()
    finish_jobs(at)
    assert_clean(at)
    assert not errors(at)
    assert sorted(at.dataframe[0].value["run"]) == ["micro/baseline", "micro/fbt", "micro/hd2", "micro/hd4"]


def test_probes_page_trains_and_draws_the_layer0_comparison(monkeypatch, zoo):
    at = open_page(monkeypatch, zoo, "probes")
    assert any("press **Train probes**" in i.value for i in at.info)
    at.number_input(key="probe_n").set_value(40)
    at.multiselect(key="probe_passes").set_value([2])
    assert at.checkbox(key="probe_capacity").value is False  # the fast default; the capacity measures on request
    at.checkbox(key="probe_capacity").check()
    at.button(key="probe_train").click().run()
    finish_jobs(at)
    assert_clean(at)
    assert not errors(at)
    labels = [m.label.removesuffix(" (not converged)") for m in at.metric]  # 40 sequences: a solver may stop short
    assert labels == ["standard", "recurrent K=2", "recurrent K=exact"]
    assert len(charts(at)) == 1
    shown = set(at.dataframe[-1].value.columns)  # the capacity-controlled measures next to accuracy
    assert {"compression", "control_compression", "rank_accuracy", "rank_control"} <= shown, shown
    # another target: nothing saved for it yet
    at.selectbox(key="probe_target").set_value("running_sum").run()
    assert not at.metric and any("No saved probes for running_sum" in i.value for i in at.info)
    at.selectbox(key="probe_target").set_value("memory").run()
    assert len(at.metric) == 3  # the saved results come back without retraining
    # retraining says it replaces the saved sweep, and does (a sweep replaces only its own outputs)
    assert at.button(key="probe_train").label == "Retrain probes (replaces the saved ones)"
    at.multiselect(key="probe_passes").set_value([2, 3])
    at.checkbox(key="probe_capacity").uncheck().run()
    at.button(key="probe_train").click().run()
    finish_jobs(at)
    assert_clean(at)
    assert not errors(at)
    labels = [m.label.removesuffix(" (not converged)") for m in at.metric]
    assert labels == ["standard", "recurrent K=2", "recurrent K=3", "recurrent K=exact"]
    report = json.loads((zoo / "fbt" / "results" / "probe_memory.json").read_text())
    assert all(row["rank_sweep"] == [] for row in report["rows"])  # not asked for
    # the online code at layer 0 only, where the headline is read
    assert all((row["mdl_bits"] is None) == (row["layer"] != 0) for row in report["rows"])


def test_sae_page_trains_an_sae_and_lists_its_latents(monkeypatch, zoo):
    at = open_page(monkeypatch, zoo, "sae")
    assert any("press **Train an SAE**" in i.value for i in at.info)
    assert (
        at.selectbox(key="sae_hook").value == "ln_final.hook_normalized" and at.selectbox(key="sae_prefill").value == "recurrent"
    )
    at.number_input(key="sae_n").set_value(40)
    at.button(key="sae_train").click().run()
    finish_jobs(at)
    assert_clean(at)
    assert not errors(at)
    assert [m.label for m in at.metric] == ["Variance explained", "L0", "Dead latents", "MSE"]
    saved = zoo / "fbt" / "results" / "sae" / "ln_final.hook_normalized-recurrent-2"
    report = json.loads((saved / "sae.json").read_text())
    assert at.metric[0].value == f"{report['test']['explained']:.3f}" and report["n_sequences"] == 40
    latents = at.dataframe[-1].value
    assert list(latents.columns) == ["latent", "density", "top activation", "top contexts"]
    assert len(latents) == report["settings"]["d_sae"] - report["test"]["dead"] and (latents["density"] > 0).all()
    assert at.button(key="sae_train").label == "Retrain the SAE (replaces the saved one)"


GOOD_REPORT = {
    "test": {"explained": 0.9, "l0": 4.0, "dead": 0, "mse": 0.1},
    "settings": {"k": 4, "d_sae": 2},
    "rows": {"train": 10, "test": 2},
    "n_sequences": 4,
    "task": "flipflop",
}
GOOD_LATENT = {"latent": 0, "density": 0.5, "top": [{"activation": 1.0, "before": "ab", "token": "c"}]}
MALFORMED_SAE = {
    "explained not a number": ({**GOOD_REPORT, "test": {**GOOD_REPORT["test"], "explained": "high"}}, None, "'test.explained'"),
    "no settings": ({k: v for k, v in GOOD_REPORT.items() if k != "settings"}, None, "'settings'"),
    "rows a list": ({**GOOD_REPORT, "rows": [10, 2]}, None, "'rows'"),
    "latents not a list": (None, {"latents": {"0": GOOD_LATENT}}, "'latents'"),
    "a context not an object": (None, {"latents": [{**GOOD_LATENT, "top": [5]}]}, "'latents[0].top[0]'"),
    "a context without before": (None, {"latents": [{**GOOD_LATENT, "top": [{"activation": 1.0, "token": "c"}]}]}, "before"),
    "density a string": (None, {"latents": [{**GOOD_LATENT, "density": "0.5"}]}, "'latents[0].density'"),
    "activation null": (
        None,
        {"latents": [{**GOOD_LATENT, "top": [{**GOOD_LATENT["top"][0], "activation": None}]}]},
        "activation",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED_SAE))
def test_a_malformed_sae_report_is_an_error_on_the_sae_page_naming_the_field(case, monkeypatch, micro_zoo, tmp_path):
    report, latents, field = MALFORMED_SAE[case]
    runs = shutil.copytree(micro_zoo, tmp_path / "runs")
    saved = runs / "fbt" / "results" / "sae" / "ln_final.hook_normalized-recurrent-2"
    saved.mkdir(parents=True)
    (saved / "sae.json").write_text(json.dumps(report or GOOD_REPORT))
    (saved / "latents.json").write_text(json.dumps(latents or {"latents": [GOOD_LATENT]}))
    at = open_page(monkeypatch, runs, "sae")
    assert_clean(at)
    assert any(field in e and ("sae.json" in e or "latents.json" in e) for e in errors(at)), errors(at)
    assert not at.metric


def test_probes_page_rejects_an_empty_hook_list(monkeypatch, zoo):
    at = open_page(monkeypatch, zoo, "probes")
    at.multiselect(key="probe_hooks").set_value([])
    at.button(key="probe_train").click().run()
    assert_clean(at)
    assert "Pick at least one hook to probe." in errors(at)


def test_probes_page_hooks_follow_the_run_and_the_result_says_what_it_covers(monkeypatch, micro_zoo, tmp_path):
    """After switching from a 2-layer to a 3-layer FBT the Hooks box offers and holds
    the new run's 4 depths (not the first run's 3), the job probes all of them and the page says
    so; a sweep of part of the stack says that it is part; switching back restores that run's own."""
    from workbench import build_model
    from workbench.probing.study import default_hooks
    from workbench.runtime.checkpoint import save_model

    root = shutil.copytree(micro_zoo, tmp_path / "runs")
    save_model(build_model("fbt", "debug", n_layers=3), root / "deep" / "fbt3")
    at = open_page(monkeypatch, root, "probes")
    assert at.selectbox(key="probe_run").value == "fbt"
    assert at.multiselect(key="probe_hooks").value == default_hooks(2)
    at.selectbox(key="probe_run").set_value("deep/fbt3").run()
    assert at.multiselect(key="probe_hooks").value == default_hooks(3)
    at.number_input(key="probe_n").set_value(40)
    at.multiselect(key="probe_passes").set_value([2])
    at.checkbox(key="probe_exact").uncheck()
    at.button(key="probe_train").click().run()
    finish_jobs(at)
    assert_clean(at)
    report = json.loads((root / "deep" / "fbt3" / "results" / "probe_memory.json").read_text())
    assert {r["hook"] for r in report["rows"]} == set(default_hooks(3))
    captions = [c.value for c in at.caption]
    assert any("cover 4 of the run's 4 depths" in c and "40 sequences" in c for c in captions), captions
    assert not any("retrain with every hook" in w.value for w in at.warning)
    at.multiselect(key="probe_hooks").set_value(default_hooks(3)[:2])
    at.button(key="probe_train").click().run()
    finish_jobs(at)
    assert any("cover 2 of the 4 depths of deep/fbt3" in w.value for w in at.warning)
    at.selectbox(key="probe_run").set_value("fbt").run()
    assert at.multiselect(key="probe_hooks").value == default_hooks(2)


def test_dynamics_page_compares_two_runs_and_reacts_to_the_horizon(monkeypatch, micro_zoo, tmp_path):
    zoo = shutil.copytree(micro_zoo, tmp_path / "runs")
    shutil.copytree(zoo / "fbt", zoo / "fbt-seed1")  # a second FBT run, as a zoo at two seeds has
    at = open_page(monkeypatch, zoo, "dynamics")
    from workbench.dynamics.defaults import DEFAULTS  # the CLI's defaults, shown here too

    keys = {"horizon": "dyn_horizon", "perturb_at": "dyn_perturb", "max_passes": "dyn_passes", "n_spectra": "dyn_spectra"}
    keys |= {"n_starts": "dyn_starts", "fp_steps": "dyn_fp_steps"}
    assert {k: at.number_input(key=key).value for k, key in keys.items()} == {k: DEFAULTS[k] for k in keys}
    at.number_input(key="dyn_horizon").set_value(60)
    at.number_input(key="dyn_starts").set_value(3)
    at.number_input(key="dyn_fp_steps").set_value(20)
    at.run()
    assert_clean(at)
    assert not at.subheader and any("Press **Analyse**" in i.value for i in at.info)  # nothing computed on load
    at.button(key="dyn_run").click().run()
    assert any("the results appear here when the job is done" in i.value for i in at.info)
    finish_jobs(at)
    assert_clean(at)
    assert not errors(at)
    assert [s.value for s in at.subheader] == ["fbt", "fbt-seed1"]
    lyap = {m.label: m.value for m in at.metric}
    assert all(m.proto.direction == m.proto.NONE for m in at.metric if m.label.startswith("λ"))  # no arrow: estimates
    spectrum = next(json.loads(c.proto.spec) for c in charts(at) if "unit circle" not in c.proto.spec and '"Re"' in c.proto.spec)
    scales = [layer["encoding"][axis]["scale"] for layer in spectrum["layer"] for axis in ("x", "y")]
    assert all(sc == scales[0] and sc["nice"] is False for sc in scales) and spectrum["width"] == spectrum["height"]
    assert {"λ(1)", "λ(10)", "K-pass relative residual at K=8"} <= set(lyap)
    assert len(charts(at)) == 2 * 6  # norms, growth, spectrum, fixed points, K-pass residual, K-pass grid per run
    at.number_input(key="dyn_horizon").set_value(120).run()
    assert not at.metric  # other inputs: not analysed yet
    at.button(key="dyn_run").click().run()
    finish_jobs(at)
    assert "λ(100)" in {m.label for m in at.metric}
    at.number_input(key="dyn_horizon").set_value(60).run()
    assert [s.value for s in at.subheader] == ["fbt", "fbt-seed1"]  # the first analysis, saved: no new job
    assert len(list((zoo / ".jobs").iterdir())) == 2
    at.number_input(key="dyn_perturb").set_value(500).run()
    assert "Perturb at step 500 must come before the horizon (60 steps)." in errors(at)


def test_traces_page_compares_regimes_on_the_same_problems(monkeypatch, zoo):
    from workbench.jobs import list_jobs

    at = open_page(monkeypatch, zoo, "traces")
    at.multiselect(key="tr_runs").set_value(["fbt", "baseline"])
    at.number_input(key="tr_n").set_value(8)
    at.slider(key="tr_budget").set_value(48)
    at.button(key="tr_compare").click().run()
    assert_clean(at)
    finish_jobs(at)
    assert not errors(at)
    summary = at.dataframe[0].value
    assert sorted(summary["run"]) == ["baseline/standard", "fbt/fused", "fbt/soft", "fbt/standard"]
    assert set(summary["problems"]) == {8}
    assert len(at.get("html")) == 4  # one problem, side by side under each model/regime
    lines = [m.value for m in at.markdown if "trace tokens" in m.value]
    assert len(lines) == 4 and not any("nan" in line for line in lines), lines  # an unfinished trace: "no answer (...)"
    at.selectbox(key="tr_show").set_value(1).run()
    assert set(at.dataframe[0].value["problems"]) == {2}  # difficulties 1-4 spread evenly over 8 problems
    at.multiselect(key="tr_regimes").set_value(["soft", "fused"])  # no standard: pair against what ran
    at.multiselect(key="tr_runs").set_value(["fbt"]).run()
    at.button(key="tr_compare").click().run()
    finish_jobs(at)
    assert not errors(at)
    assert sorted(at.dataframe[0].value["run"]) == ["fbt/fused", "fbt/soft"]
    at.multiselect(key="tr_regimes").set_value(["standard", "soft", "fused"])
    at.multiselect(key="tr_runs").set_value(["fbt", "baseline"]).run()  # the first comparison: saved, no new job
    assert sorted(at.dataframe[0].value["run"]) == ["baseline/standard", "fbt/fused", "fbt/soft", "fbt/standard"]
    assert len(list_jobs(zoo, "traces")) == 2
    at.multiselect(key="tr_regimes").set_value([]).run()
    at.button(key="tr_compare").click().run()
    assert "Pick at least one regime and one difficulty." in errors(at)


def test_runs_of_one_directory_name_in_two_zoos_compare_on_the_traces_and_dynamics_pages(monkeypatch, micro_zoo, tmp_path):
    """``micro/fbt`` and ``quick/fbt`` share a directory name; the results name runs by
    their path under the runs root, so both pages compare them instead of refusing."""
    root = tmp_path / "runs"
    for zoo in ("micro", "quick"):
        shutil.copytree(micro_zoo / "fbt", root / zoo / "fbt")
    at = open_page(monkeypatch, root, "traces")
    at.multiselect(key="tr_runs").set_value(["micro/fbt", "quick/fbt"])
    at.multiselect(key="tr_regimes").set_value(["standard"])
    at.number_input(key="tr_n").set_value(4)
    at.slider(key="tr_budget").set_value(16)
    at.button(key="tr_compare").click().run()
    finish_jobs(at)
    assert not errors(at)
    assert sorted(at.dataframe[0].value["run"]) == ["micro/fbt/standard", "quick/fbt/standard"]
    at.switch_page("views/dynamics.py").run()
    at.multiselect(key="dyn_runs").set_value(["micro/fbt", "quick/fbt"])
    at.number_input(key="dyn_horizon").set_value(30)
    at.number_input(key="dyn_perturb").set_value(5)
    at.button(key="dyn_run").click().run()
    finish_jobs(at)
    assert not errors(at)
    assert [h.value for h in at.subheader][:2] == ["micro/fbt", "quick/fbt"]


def test_streams_page_draws_each_analysis_and_validates_the_length(monkeypatch, zoo):
    at = open_page(monkeypatch, zoo, "streams")
    assert not errors(at)
    assert at.selectbox(key="st_run").value == "hd4"
    lens = at.dataframe[0].value
    assert list(lens["stream"]) == [0, 1, 2, 3]
    before = at.get("vega_lite_chart")[0].proto.spec
    at.slider(key="st_layer").set_value(0).run()
    assert_clean(at)
    assert at.get("vega_lite_chart")[0].proto.spec != before  # the heatmap shows block 0 now
    at.selectbox(key="st_run").set_value("hd2").run()
    assert list(at.dataframe[0].value["stream"]) == [0, 1]
    at.number_input(key="st_len").set_value(4000).run()
    assert any("exceeds the model's context" in e for e in errors(at))


def test_playground_generates_under_each_regime_and_intervenes(monkeypatch, zoo):
    at = open_page(monkeypatch, zoo, "playground")
    assert any("plumbing check" in w.value for w in at.warning)  # a micro-zoo run says what it is
    at.slider(key="pg_new").set_value(12)
    at.checkbox(key="pg_eos").uncheck()  # an untrained model may end at once: generate the whole budget
    at.button(key="pg_generate").click().run()
    assert_clean(at)
    strips = [h.proto.body for h in at.get("html")]
    assert len(strips) == 3 and "gate" in strips[1] and "gate" not in strips[0]  # standard has no fed-back gate
    at.radio(key="pg_intervene").set_value("zero")
    at.button(key="pg_generate").click().run()
    assert_clean(at)
    assert len(at.get("html")) == 5  # soft and fused with and without the intervention; standard once (no carried state)
    assert any("state × 0.0" in m.value for m in at.markdown)
    at.text_area(key="pg_prompt").set_value("")
    at.button(key="pg_generate").click().run()
    assert_clean(at)
    assert any("prompt is empty" in e for e in errors(at))
    # the regimes follow the run: a baseline decodes in standard only; back on FBT, all three again
    at.multiselect(key="pg_regimes").set_value(["soft"])
    at.selectbox(key="pg_run").set_value("baseline").run()
    assert_clean(at)
    assert at.multiselect(key="pg_regimes").value == ["standard"]
    at.selectbox(key="pg_run").set_value("fbt").run()
    assert at.multiselect(key="pg_regimes").value == ["standard", "soft", "fused"]


def test_playground_ablates_hd_streams(monkeypatch, zoo):
    at = open_page(monkeypatch, zoo, "playground")
    at.selectbox(key="pg_run").set_value("hd4").run()
    at.selectbox(key="pg_ablate").set_value(3)
    at.slider(key="pg_new").set_value(8)
    at.button(key="pg_generate").click().run()
    assert_clean(at)
    assert any("stream 3 ablated" in m.value for m in at.markdown)


def test_app_verb_rejects_bad_ports_and_finds_its_script(tmp_path, capsys):
    from workbench.cli import app_script, main

    assert app_script().name == "main.py" and app_script().is_file()
    for argv, message in [
        (["app", "--port", "70000"], "invalid port 70000: expected 1..65535"),
        (["app", "--port", "http"], "invalid port 'http'"),
        (["app", "--runs", str(tmp_path / "f")], "expected a directory of run directories"),
    ]:
        (tmp_path / "f").write_text("not a directory")
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def sidebar_errors(at: AppTest) -> list[str]:
    return [e.value for e in at.sidebar.error]


def test_the_sidebar_refuses_directories_outside_the_runs_root_and_trains_nothing_there(monkeypatch, tmp_path):
    root, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    root.mkdir()
    (root / "link").symlink_to(elsewhere, target_is_directory=True)
    at = open_page(monkeypatch, root)
    for outside in [str(elsewhere), f"{root}/../x", str(root / "link"), "/"]:
        at.text_input(key="runs_root_input").set_value(outside).run()
        assert_clean(at)
        assert any("outside the runs root" in e and outside in e for e in sidebar_errors(at)), (outside, sidebar_errors(at))
        assert at.text_input(key="runs_root_input").value == str(root)  # the previous value is kept
        assert at.button(key="train_zoo").label == f"Train the micro zoo into {root / 'micro'}"
    at.text_input(key="runs_root_input").set_value(str(root / "sub")).run()
    assert not sidebar_errors(at) and at.text_input(key="runs_root_input").value == str(root / "sub")
    at.button(key="train_zoo").click().run()
    finish_jobs(at)
    assert_clean(at)
    assert not errors(at)
    assert sorted(at.dataframe[0].value["run"]) == ["micro/baseline", "micro/fbt", "micro/hd2", "micro/hd4"]
    assert (
        not elsewhere.exists()
        and not (tmp_path / "x").exists()
        and (root / "sub" / "micro" / "fbt" / "model.safetensors").is_file()
    )


def test_writes_through_a_symlink_out_of_the_root_are_refused(monkeypatch, micro_zoo, tmp_path):
    """A run or zoo directory under the root may link elsewhere: it is read, never written."""
    counts = tally("writes outside the runs root")
    root, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    shutil.copytree(micro_zoo / "fbt", elsewhere / "fbt")
    (elsewhere / "zoo").mkdir()
    root.mkdir()
    (root / "linked-fbt").symlink_to(elsewhere / "fbt", target_is_directory=True)
    (root / "micro").symlink_to(elsewhere / "zoo", target_is_directory=True)
    before = snapshot(elsewhere)
    at = open_page(monkeypatch, root, "probes")
    at.selectbox(key="probe_run").set_value("linked-fbt")
    at.number_input(key="probe_n").set_value(40)
    at.button(key="probe_train").click().run()
    assert_clean(at)
    assert any(e.startswith("Refused to write") and "outside the runs root" in e for e in errors(at)), errors(at)
    at.switch_page("views/runs.py").run()
    at.button(key="train_zoo").click().run()
    assert_clean(at)
    assert any(e.startswith("Refused to write") and str(root / "micro") in e for e in errors(at)), errors(at)
    counts["inputs_tried"] += 2
    counts["faults_injected"] += 2
    assert_nothing_lost(before, snapshot(elsewhere), counts)


def test_the_sidebar_warns_when_the_app_is_bound_beyond_loopback(monkeypatch, tmp_path, loopback):
    at = open_page(monkeypatch, tmp_path)
    assert not [w for w in at.sidebar.warning if "loopback" in w.value]
    loopback.set_option("server.address", "0.0.0.0")
    at.run()
    assert [w.value for w in at.sidebar.warning if "loopback" in w.value] == [
        f"--address 0.0.0.0 is not a loopback address: anyone who can reach it can start training and write files under {tmp_path.resolve()}"
    ]


def test_app_verb_warns_on_stderr_before_starting_when_the_address_is_not_loopback(monkeypatch, tmp_path, capsys):
    import subprocess

    from workbench.cli import main
    from workbench.runs import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "127.4.5.6", "::1", "[::1]", "localhost", "LocalHost", "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "", None, "192.168.1.7", "10.0.0.1", "example.org", "128.0.0.1"]))
    started = []

    class Server:  # what the verb starts, replaced: it records what stderr held by then
        def __init__(self, command, **kwargs):
            started.append(capsys.readouterr().err)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Server)
    for address, warned in [("0.0.0.0", True), ("127.0.0.1", False), ("localhost", False), ("192.168.1.7", True)]:
        main(["app", "--runs", str(tmp_path), "--address", address])
        lines = started.pop().splitlines()
        expected = [
            f"workbench app: warning: --address {address} is not a loopback address: anyone who can reach it can start "
            f"training and write files under {tmp_path.resolve()}"
        ]
        assert lines == (expected if warned else []), (address, lines)


# An imported pretrained model (`workbench import`): a baseline run whose tokenizer is a byte-level BPE
# with a chat template. Every page encodes and decodes with it; the FBT and HD pages say why it is not offered.


@pytest.fixture(scope="module")
def with_imported(micro_zoo, tmp_path_factory):
    """A runs directory holding a tiny imported model (``smol``, 300 BPE ids) beside the micro zoo's
    character-level ``baseline``."""
    from pretrained import imported_run

    root = tmp_path_factory.mktemp("imported") / "runs"
    shutil.copytree(micro_zoo / "baseline", root / "baseline")
    shutil.move(imported_run(tmp_path_factory.mktemp("hf")), root / "smol")
    return root


def strip_tokens(strip: str) -> list[str]:
    """The tokens of a ``token_strip``, each as its box's title holds it."""
    import html
    import re

    return [html.unescape(t) for t in re.findall(r"<div title='([^']*)'", strip)]


def test_runs_page_shows_an_imported_model_by_its_source_size_and_tokenizer(monkeypatch, with_imported):
    import pandas as pd

    from workbench.runtime.checkpoint import load_model

    at = open_page(monkeypatch, with_imported)
    table = at.dataframe[0].value.set_index("run")
    assert set(table["status"]) == {"ok"} and table.loc["baseline", "origin"] == "trained"
    assert table.loc["smol", "origin"] == "imported: hf" and pd.isna(table.loc["smol", "steps"])
    at.selectbox(key="run").set_value("smol").run()
    assert_clean(at)
    assert not errors(at)
    assert any("was imported" in i.value and "no training curves" in i.value for i in at.info)
    shown = " ".join(m.value for m in at.markdown)
    assert "Hugging Face (subword), 300 ids, chat template" in shown and "d_vocab is 300" in shown
    source = json.loads((with_imported / "smol" / "config.json").read_text())["source"]
    assert f"**Imported from** `{source['path']}`" in shown
    n_params = sum(p.numel() for p in load_model(with_imported / "smol").parameters())
    assert {m.label: m.value for m in at.metric}["Parameters"] == f"{n_params:,}"  # under a million: every digit
    assert "<|im_start|>" in at.code[0].value  # the chat template


def test_probes_page_probes_an_imported_model_with_standard_prefill(monkeypatch, with_imported):
    from workbench.probing.study import default_hooks

    at = open_page(monkeypatch, with_imported, "probes")
    at.selectbox(key="probe_run").set_value("smol").run()
    assert "probe_passes" not in [m.key for m in at.multiselect]  # a baseline has no recurrent prefill
    assert any("subword tokens" in c.value for c in at.caption)
    at.number_input(key="probe_n").set_value(40)
    at.button(key="probe_train").click().run()
    finish_jobs(at)
    assert_clean(at)
    assert not errors(at)
    rows = at.dataframe[0].value
    assert list(rows["hook"]) == default_hooks(2) and set(rows["regime"]) == {"standard"}
    assert (rows["n_test"] > 0).all() and [m.label for m in at.metric] == ["standard"]
    assert (with_imported / "smol" / "results" / "probe_memory.json").is_file()


def test_playground_chat_format_changes_the_prompt_ids_and_decodes_with_the_bpe(monkeypatch, with_imported):
    import workbench.studies.playground as playground
    from workbench.runtime.tokenizer import load_tokenizer

    prompt = "Q: Start with 12. Add 7. Multiply by 3. What is the result?\nA:"

    calls = []

    def spy(model, prompt_ids, **kwargs):
        out = playground_generate(model, prompt_ids, **kwargs)
        calls.append((list(prompt_ids[0]), out.completions()[0]))
        return out

    playground_generate = playground.generate
    monkeypatch.setattr(playground, "generate", spy)
    bpe = load_tokenizer(with_imported / "smol")
    at = open_page(monkeypatch, with_imported, "playground")
    assert at.selectbox(key="pg_run").value == "baseline"
    assert "pg_chat" not in [c.key for c in at.checkbox]  # the character tokenizer has no chat template
    at.selectbox(key="pg_run").set_value("smol").run()
    assert at.checkbox(key="pg_chat").value is False
    assert at.text_area(key="pg_prompt").value == ""  # an import records no task: no prompt of its own
    at.text_area(key="pg_prompt").set_value(prompt)
    at.slider(key="pg_new").set_value(8)
    for chat in (False, True):
        at.checkbox(key="pg_chat").set_value(chat)
        at.button(key="pg_generate").click().run()
        assert_clean(at)
        assert not errors(at)
        prompt_ids, new = calls[-1]
        sent = bpe.chat_prompt(prompt) if chat else prompt
        assert prompt_ids == bpe.encode(sent)
        # what is drawn is the BPE's decoding: one box per generated subword, and the text
        assert strip_tokens(at.get("html")[0].proto.body) == [bpe.decode([i], skip_special=False) for i in new]
        assert at.code[-1].value == bpe.decode(new)
    assert calls[0][0] != calls[1][0] and bpe.decode(calls[1][0], skip_special=False).startswith("<|im_start|>user\n")
    assert at.code[0].value == bpe.chat_prompt(prompt)  # the prompt sent, shown


def test_traces_page_prompts_an_imported_model_in_chat_format_and_compares_in_characters(monkeypatch, with_imported):
    from workbench.jobs import list_jobs
    from workbench.runtime.tokenizer import load_tokenizer
    from workbench.studies.traces import read_traces

    bpe = load_tokenizer(with_imported / "smol")
    at = open_page(monkeypatch, with_imported, "traces")
    at.multiselect(key="tr_runs").set_value(["baseline"]).run()
    assert "tr_chat" not in [c.key for c in at.checkbox]
    at.multiselect(key="tr_runs").set_value(["smol", "baseline"]).run()
    assert at.checkbox(key="tr_chat").value is False
    at.checkbox(key="tr_chat").check()
    at.number_input(key="tr_n").set_value(4)
    at.slider(key="tr_budget").set_value(16)
    at.button(key="tr_compare").click().run()
    assert_clean(at)
    finish_jobs(at)
    assert not errors(at)
    # the job prompted smol (a chat template) in chat format and the character-level baseline in the completion one
    (job,) = list_jobs(with_imported, "traces")
    assert job.argv[job.argv.index("--chat") + 1] == "smol"
    (out,) = (with_imported / "smol" / "results").glob("traces-*")
    rows = read_traces(out / "traces.csv")
    assert {(r["model"], r["format"]) for r in rows} == {("smol", "chat"), ("baseline", "completion")}
    summary = at.dataframe[0].value.set_index("run")
    assert sorted(summary.index) == ["baseline/standard", "smol/standard"] and set(summary["problems"]) == {4}
    assert summary.loc["smol/standard", "prompt"] == "chat" and "mean trace (characters)" in summary
    assert at.radio(key="tr_unit").value == "characters"
    assert any("different tokenizers" in i.value and "Hugging Face (subword)" in i.value for i in at.info)
    smol = [r for r in rows if r["model"] == "smol"]
    assert summary.loc["smol/standard", "mean trace (characters)"] == pytest.approx(
        sum(r["trace_chars"] for r in smol) / len(smol)
    )
    # the one-problem view splits smol's trace into its subwords, and shows the prompt it was sent
    strips = [h.proto.body for h in at.get("html")]
    first = next(r for r in smol if r["problem_id"] == 0)
    assert len(strips) == 2
    expected = [bpe.decode([i], skip_special=False) for i in bpe.encode(first["text"])]
    assert any(strip_tokens(s)[: len(expected)] == expected for s in strips)
    assert any("<|im_start|>user" in c.value for c in at.code)
    at.radio(key="tr_unit").set_value("tokens").run()
    assert_clean(at)
    assert "mean trace (tokens)" in at.dataframe[0].value


def test_dynamics_and_streams_pages_say_why_an_imported_model_is_not_offered(monkeypatch, with_imported):
    for page, needs in [("dynamics", "carried state"), ("streams", "embedding streams")]:
        at = open_page(monkeypatch, with_imported, page)
        assert not errors(at)
        [info] = [i.value for i in at.info]
        assert needs in info and "imported pretrained models" in info and "smol (baseline)" in info, info


@pytest.mark.slow
def test_the_app_verb_stops_its_server_on_sigterm(tmp_path):
    """``workbench app`` runs Streamlit as a child; a SIGTERM to the verb must stop the server,
    not leave it running without a parent."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    verb = subprocess.Popen(
        [sys.executable, "-c", "from workbench.cli import main; main()", "app", "--runs", str(tmp_path), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, children = time.time() + 90, []
        while time.time() < deadline and not children:
            children = psutil.Process(verb.pid).children()
            time.sleep(0.2)
        while time.time() < deadline:  # the server answers: it is fully up
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the app server did not start listening within 90 s")
        (server,) = children
        verb.send_signal(signal.SIGTERM)
        verb.wait(timeout=60)
        gone, alive = psutil.wait_procs([server], timeout=60)
        assert not alive and gone
    finally:
        for p in psutil.Process().children(recursive=True):
            p.kill()


def test_zoo_page_shows_seed_spread_and_a_studys_readings(monkeypatch, micro_zoo, micro_study, tmp_path):
    """A zoo with one seed, a member trained at two seeds, and the data-efficiency study: the page
    lists all three, labels micro results as a plumbing check, draws each member's interval, and
    shows the study's readings (mean [interval] across its two seeds)."""
    from workbench.cli import main

    runs = shutil.copytree(micro_zoo, tmp_path / "runs")
    shutil.copytree(micro_study, runs / "studies" / "data-efficiency")
    main(["zoo", "--preset", "micro", "--only", "baseline", "--seeds", "2", "--out", str(runs / "seeded"), "--no-progress"])
    traces = runs / "analyses" / "seed0" / "traces"  # where scripts/zoo_analyses.py has the verb write
    main(["traces", str(runs / "baseline"), str(runs / "fbt"), "--n", "6", "--out", str(traces), "--no-progress"])
    at = open_page(monkeypatch, runs, "zoo")
    assert at.title[0].value == "Zoo and studies" and not errors(at)
    # the runs directory's own zoo by its name ('.' says nothing)
    assert at.selectbox(key="summary").options == ["runs (this directory)", "seeded", "studies/data-efficiency"]
    assert any("plumbing check" in w.value for w in at.warning)
    assert at.selectbox(key="zoo_analyses").options == ["traces"]  # the only analysis run on this zoo
    analyses = at.dataframe[-1].value
    soft = analyses[analyses["reading"] == "fbt/soft/accuracy"]
    summary = json.loads((traces / "summary.json").read_text())
    assert soft["seeds"].tolist() == [f"{summary['groups']['fbt/soft']['accuracy']:.3g}"]  # one seed: its value
    at.selectbox(key="summary").set_value("seeded").run()
    assert_clean(at)
    assert "zoo_analyses" not in [box.key for box in at.selectbox]  # no analyses of that zoo
    table = at.dataframe[-1].value
    assert set(table["member"]) == {"baseline"} and set(table["seeds"]) == {2}
    assert (table["low"] <= table["accuracy"]).all() and (table["accuracy"] <= table["high"]).all()
    at.selectbox(key="summary").set_value("studies/data-efficiency").run()
    assert_clean(at)
    readings = at.dataframe[0].value
    assert len(readings) == 9 and set(readings["FBT regime"]) == {"standard", "soft", "fused"}
    assert readings["FBT loss"].str.contains(r"\[").all()  # two seeds: every loss has an interval
    family = at.dataframe[1].value  # the study's declared family, Holm-corrected
    assert len(family) == 9 and set(family["reading"]) <= {"detectable", "no detectable difference"}
    assert any("declared family of 9" in h.value for h in at.subheader)


# Hostile files under the runs root: a malformed job, probe report or zoo
# summary is an error element for that job or output, naming the file and the field; the page around
# it keeps working.

HOSTILE = tally("the app and its jobs")


def plant_job(root: Path, name: str, page, progress: dict | None = None, **fields) -> Path:
    """A job directory as the supervisor leaves a finished job of ``page``, with ``fields`` replaced."""
    from workbench.storage.files import write_json

    path = root / ".jobs" / name
    path.mkdir(parents=True)
    record = {
        "id": name,
        "title": f"planted {name}",
        "argv": ["presets", "--json", str(path / "result.json")],
        "page": page,
        "outputs": [],
        "created": time.time(),
        "state": "done",
        "returncode": 0,
        "finished": time.time(),
    }
    write_json(path / "job.json", record | fields)
    if progress is not None:
        write_json(path / "progress.json", {"desc": "phase", "fraction": 0.5, "what": "", "updated": time.time()} | progress)
    return path


def test_malformed_job_files_are_error_rows_and_every_page_with_jobs_works(monkeypatch, micro_zoo, tmp_path):
    runs = shutil.copytree(micro_zoo, tmp_path / "runs")
    planted = {  # page: [(the file, the field named)]
        "runs": [
            ("job.json", "created", {"created": "yesterday"}),
            ("progress.json", "fraction", {"progress": {"fraction": 7.5}}),
        ],
        "probes": [("job.json", "argv", {"argv": 5}), ("progress.json", "fraction", {"progress": {"fraction": "half"}})],
        "dynamics": [("job.json", "pid", {"state": "running", "pid": 2**80}), ("job.json", "finished", {"finished": 1e20})],
        "traces": [("job.json", "outputs", {"outputs": None}), ("job.json", "created", {"created": None})],
    }
    expected = {}
    for page, cases in planted.items():
        for i, (file, name, fields) in enumerate(cases):
            if "progress" in fields:  # a job still starting, so that its progress is drawn
                fields = {**fields, "state": "starting", "created": time.time()}
            path = plant_job(runs, f"{page}-{i}", page, **fields)
            expected.setdefault(page, []).append((str(path / file), f"'{name}'"))
    nowhere = plant_job(runs, "no-page", 5)  # its page cannot be read either: listed on every page
    widgets = {"runs": "train_zoo", "probes": "probe_train", "dynamics": "dyn_run", "traces": "tr_compare"}
    for page, cases in expected.items():
        at = open_page(monkeypatch, runs, None if page == "runs" else page)  # renders: no exception
        shown = errors(at)
        for file, field in [*cases, (str(nowhere / "job.json"), "'page'")]:
            assert any(file in e and field in e for e in shown), (page, file, field, shown)
        assert at.button(key=widgets[page]) is not None  # the page's own work is still offered
        HOSTILE["inputs_tried"] += len(cases)
        HOSTILE["faults_injected"] += len(cases)


VALID_ROW = {
    "hook": "hook_embed",
    "layer": 0.0,
    "prefill": "standard",
    "passes": 1,
    "stream": 0,
    "accuracy": 0.75,
    "chance": 0.5,
    "control_accuracy": 0.6,
    "control_chance": 0.1,
    "selectivity": 0.15,
    "n_train": 30,
    "n_test": 10,
    "C": 1.0,
    "converged": True,
    "mdl_bits": None,
    "control_mdl_bits": None,
    "uniform_bits": None,
    "compression": None,
    "control_compression": None,
    "rank_sweep": [],
}


def test_a_malformed_probe_report_is_an_error_on_the_probes_page(monkeypatch, micro_zoo, tmp_path):
    runs = shutil.copytree(micro_zoo, tmp_path / "runs")
    saved = runs / "fbt" / "results" / "probe_memory.json"
    report = {"run": str(runs / "fbt"), "target": "memory", "task": "flipflop", "n_sequences": 40, "rows": [VALID_ROW]}
    saved.write_text(json.dumps(report))
    at = open_page(monkeypatch, runs, "probes")
    assert not errors(at) and [m.label for m in at.metric] == ["standard"]  # a well-formed report is drawn
    malformed = [
        ({**report, "rows": 5}, "'rows'"),
        ({**report, "rows": []}, "'rows'"),
        ({**report, "rows": [{"hook": "hook_embed"}]}, "'rows[0].layer'"),
        ({**report, "rows": [VALID_ROW, {**VALID_ROW, "accuracy": "high"}]}, "'rows[1].accuracy'"),
        ({**report, "rows": [{**VALID_ROW, "passes": None}]}, "'rows[0].passes'"),
        ({**report, "rows": [{**VALID_ROW, "rank_sweep": ["low"]}]}, "'rows[0].rank_sweep'"),
        ({k: v for k, v in report.items() if k != "n_sequences"}, "'n_sequences'"),
        ([report], "must hold a JSON object"),
    ]
    for content, named in malformed:
        saved.write_text(json.dumps(content))
        at.run()
        assert_clean(at)
        assert any(str(saved) in e and named in e for e in errors(at)), (named, errors(at))
        assert not at.metric and at.button(key="probe_train").label == "Retrain probes (replaces the saved ones)"
    HOSTILE["inputs_tried"] += len(malformed)
    HOSTILE["faults_injected"] += len(malformed)


def test_a_malformed_zoo_summary_is_an_error_on_the_zoo_page(monkeypatch, micro_zoo, tmp_path):
    runs = shutil.copytree(micro_zoo, tmp_path / "runs")
    summary_path = runs / "zoo.json"
    summary = json.loads(summary_path.read_text())
    member = next(iter(summary["models"]))
    half = json.loads(json.dumps(summary))
    task = next(iter(half["models"][member]["tasks"]))
    half["models"][member]["tasks"][task]["accuracy"] = {"standard": "half"}
    malformed = [
        ({**summary, "models": 5}, "AttributeError"),
        ({**summary, "models": {member: {"tasks": 5}}}, "AttributeError"),
        (half, "ValueError"),
        ({**summary, "seeds": "x"}, "'seeds'"),
        ({**summary, "seeds": 10**9}, "'seeds'"),
        ({**summary, "study": 5}, "'study'"),
        ({**summary, "study": "data-efficiency", "readings": {"a": {"tokens": 1}}}, "KeyError"),
    ]
    (runs / "good").mkdir()
    shutil.copy(summary_path, runs / "good" / "zoo.json")  # another summary, still shown
    for content, named in malformed:
        summary_path.write_text(json.dumps(content))
        at = open_page(monkeypatch, runs, "zoo")
        assert any(str(summary_path) in e and named in e for e in errors(at)), (named, errors(at))
        at.selectbox(key="summary").set_value("good").run()
        assert_clean(at)
        assert not errors(at) and not at.dataframe[-1].value.empty
    HOSTILE["inputs_tried"] += len(malformed)
    HOSTILE["faults_injected"] += len(malformed)


def test_a_damaged_saved_analysis_is_an_error_on_the_dynamics_and_traces_pages(monkeypatch, micro_zoo, tmp_path):
    """The saved output a page finds by its inputs (``jobs.keyed_output``), damaged: an error element
    naming the file and the field (``read_study``'s checks, tested in test_saved_studies.py), and no
    exception."""
    from app import jobs

    runs = shutil.copytree(micro_zoo, tmp_path / "runs")
    saved = runs / "saved"
    saved.mkdir()
    (saved / "dynamics.json").write_text(json.dumps({"runs": {}}))
    (saved / "summary.json").write_text(json.dumps({"task": "chain"}))
    (saved / "traces.csv").write_text("model\n")
    monkeypatch.setattr(jobs, "keyed_output", lambda kind, chosen, settings: saved)
    for page, named in [
        ("dynamics", "dynamics.json: field 'runs.fbt' must be an object, got nothing"),
        ("traces", "field 'n_problems'"),
    ]:
        at = open_page(monkeypatch, runs, page)
        assert any(named in e and str(saved) in e for e in errors(at)), (page, errors(at))
        HOSTILE["inputs_tried"] += 1
        HOSTILE["faults_injected"] += 1


def test_the_empty_runs_page_offers_every_zoo_and_the_organisms_go_in_one_directory(monkeypatch, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    at = open_page(monkeypatch, root)
    assert list(at.radio(key="zoo_scale").options) == ["micro", "quick", "organisms", "cpu"]
    for zoo in ("quick", "organisms", "cpu"):
        at.radio(key="zoo_scale").set_value(zoo).run()
        assert_clean(at)
        assert at.button(key="train_zoo").label == f"Train the {zoo} zoo into {root / zoo}"


def test_the_zoo_page_shows_the_claims_read_from_the_organisms_studies(monkeypatch, tmp_path):
    from helpers import fair_study  # the claims tests' study with a known answer

    from workbench.experiments.claims import NOT_MEASURED, REPRODUCED, study_path
    from workbench.storage.files import write_json

    root = tmp_path / "runs"
    path = study_path(root / "organisms", "fbt-vs-baseline", "perm")
    path.parent.mkdir(parents=True)
    write_json(path, fair_study(-0.1))
    at = open_page(monkeypatch, root, "zoo")
    # a static table, which wraps its cells: a dataframe cut every 'why' short
    assert not any("verdict" in d.value.columns for d in at.dataframe)
    table = next(d.value for d in at.table if "verdict" in d.value.columns)
    rows = {(r["says"], r["organism"]): r["verdict"] for r in table.to_dict("records")}
    assert rows["lower training loss at equal data", "perm"] == REPRODUCED
    assert rows["lower training loss at equal data", "flipflop"] == NOT_MEASURED


def test_the_sidebars_device_reaches_every_analysis_job_and_is_refused_where_absent(monkeypatch, micro_zoo, tmp_path):
    """A device setting in the sidebar (default cpu, the CLI's) goes to every analysis
    job as --device; on a machine without CUDA choosing cuda is refused in one line and the page
    and its jobs stay on the cpu."""
    import torch

    from workbench.jobs import list_jobs

    root = shutil.copytree(micro_zoo, tmp_path / "runs")
    at = open_page(monkeypatch, root, "probes")
    assert at.selectbox(key="device").value == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    at.selectbox(key="device").set_value("cuda").run()
    refused = [e for e in errors(at) if e.startswith("Device cuda refused")]
    assert len(refused) == 1 and "\n" not in refused[0] and "run on the cpu" in refused[0]
    at.number_input(key="probe_n").set_value(20)
    at.button(key="probe_train").click().run()
    finish_jobs(at)
    [job] = list_jobs(root)
    assert "--device" not in job.argv  # the CLI's default, cpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with one: the job is told
    at.run()
    assert not [e for e in errors(at) if e.startswith("Device")]
    at.number_input(key="probe_n").set_value(30)
    at.button(key="probe_train").click().run()
    newest = max(list_jobs(root), key=lambda j: j.created)
    assert newest.argv[newest.argv.index("--device") + 1] == "cuda"
    from workbench.jobs import cancel_job

    cancel_job(newest)  # it cannot run here; its argv is what the test reads
