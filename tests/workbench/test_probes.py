"""Activation store and linear probes."""

import json

import numpy as np
import pytest
import torch
from helpers import assert_usage_error, cli, gaussian_rows

from workbench import build_model, run_with_pass_cache
from workbench.data.tasks import synthetic_examples
from workbench.probing.probes import control_labels, save_probe, split_by_sequence, train_probe
from workbench.probing.store import cache_activations, load_store
from workbench.runtime.tokenizer import CharTokenizer


def planted(**sizes):
    return gaussian_rows(**sizes)


def test_probe_recovers_a_planted_linear_direction():
    X, groups, tokens, rng = planted()
    w = rng.normal(size=X.shape[1])
    y = (X @ w > 0).astype(np.int64)
    result = train_probe(X, y, groups, tokens)
    assert result.accuracy > 0.95 and result.selectivity > 0.4
    direction = result.weights["coef"][0] / result.weights["scale"]
    assert np.dot(direction, w) / np.linalg.norm(direction) / np.linalg.norm(w) > 0.95


def test_probe_fails_on_a_planted_nonlinear_label():
    X, groups, tokens, _ = planted()
    y = ((X[:, 0] > 0) ^ (X[:, 1] > 0)).astype(np.int64)  # XOR: no linear separator
    assert train_probe(X, y, groups, tokens).accuracy < 0.6


def test_selectivity_is_near_zero_on_random_activations():
    # 2000 test rows: each accuracy has sampling sd ~0.011, a difference ~0.015; 0.05 is ~3 sd.
    # Many token types, so the control labels follow the label distribution closely.
    X, groups, tokens, rng = planted(n_seq=500, n_types=2000)
    y = rng.integers(0, 3, size=len(X))
    result = train_probe(X, y, groups, tokens)
    assert result.n_test == 2000 and abs(result.control_chance - result.chance) < 0.03
    assert abs(result.selectivity) < 0.05 and abs(result.accuracy - result.chance) < 0.05


def test_control_task_is_a_fixed_label_per_token_type():
    tokens = np.array([1, 2, 1, 3, 2, 1])
    labels = np.array([0, 1, 1, 0, 0, 1])
    control = control_labels(tokens, labels, seed=0)
    assert control[0] == control[2] == control[5] and control[1] == control[4]
    assert set(control) <= {0, 1}


def test_regression_probe_reports_r2():
    X, groups, tokens, rng = planted()
    y = X[:, :3].sum(1) + 0.1 * rng.normal(size=len(X))
    result = train_probe(X, y, groups, tokens, kind="regression")
    assert result.accuracy > 0.95 and result.chance == 0.0


def test_split_never_shares_a_sequence():
    groups = np.repeat(np.arange(50), 7)
    train, val, test = split_by_sequence(groups, seed=3)
    assert (train.astype(int) + val + test == 1).all()
    for a, b in ((train, val), (train, test), (val, test)):
        assert not set(groups[a]) & set(groups[b])
    with pytest.raises(ValueError, match="at least 3 sequences"):
        split_by_sequence(np.zeros(10), 0)


def test_probe_weights_round_trip(tmp_path):
    from safetensors.numpy import load_file

    X, groups, tokens, rng = planted()
    result = train_probe(X, (X[:, 0] > 0).astype(np.int64), groups, tokens)
    path = save_probe(result, tmp_path / "p.safetensors", {"hook": "blocks.0.hook_resid_pre"})
    loaded = load_file(str(path))
    assert set(loaded) == {"coef", "intercept", "mean", "scale", "classes"} and loaded["coef"].shape == (1, 16)


def _rows(ds, seq, pass_=0, stream=0):
    t = ds.with_format("numpy")[:]
    keep = (t["seq"] == seq) & (t["pass"] == pass_) & (t["stream"] == stream)
    order = np.argsort(t["pos"][keep])
    return {k: np.asarray(t[k])[keep][order] for k in ds.column_names}


@pytest.mark.parametrize("arch,prefill,passes", [("baseline", "standard", 1), ("fbt", "recurrent", 3), ("hd", "standard", 1)])
def test_stored_activations_equal_a_direct_run(tmp_path, arch, prefill, passes):
    model = build_model(arch, "debug", **({"n_streams": 3} if arch == "hd" else {}))
    examples = synthetic_examples("modsum", 5, 0)
    hooks = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post"]
    store = cache_activations(model, examples, hooks, tmp_path / "store", prefill=prefill, passes=passes, batch_size=2)
    ds, meta = load_store(store)
    assert meta["n_rows"] == len(ds) == sum(len(e.text) for e in examples) * passes * model.n_streams
    tok = CharTokenizer()
    ids = torch.tensor([tok.encode(examples[3].text)])
    kwargs = {"passes": passes} if arch == "fbt" else {}
    _, cache = run_with_pass_cache(model, ids, hooks, **kwargs)
    for p in range(passes):
        for s in range(model.n_streams):
            rows = _rows(ds, 3, p, s)
            assert (rows["label.running_sum"] == examples[3].labels["running_sum"]).all()
            assert (rows["token"] == ids[0].numpy()).all()
            for hook in hooks:
                want = cache[hook][p][0].view(ids.shape[1], model.n_streams, -1)[:, s]
                np.testing.assert_allclose(rows[f"act.{hook}"], want.numpy(), atol=1e-5, rtol=1e-5)


def test_store_rejects_bad_hooks_and_regimes(tmp_path):
    model = build_model("baseline", "debug")
    examples = synthetic_examples("modsum", 2, 0)
    with pytest.raises(ValueError, match=r"unknown hook name 'blocks.0.hook_resid_pr'.*blocks.0.hook_resid_pre"):
        cache_activations(model, examples, ["blocks.0.hook_resid_pr"], tmp_path / "s")
    with pytest.raises(ValueError, match="prefill 'recurrent' needs a Full-Bandwidth model"):
        cache_activations(model, examples, ["hook_embed"], tmp_path / "s", prefill="recurrent", passes=2)
    with pytest.raises(FileNotFoundError, match="no activation store"):
        load_store(tmp_path / "nowhere")
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_probe_study_sweeps_hooks_and_regimes(tmp_path, capsys):
    from workbench import save_model
    from workbench.cli import main

    run = save_model(build_model("fbt", "debug"), tmp_path / "run")
    main(["probe", str(run), "--target", "running_sum", "--passes", "2", "--n", "30"])
    bar = capsys.readouterr().err
    assert "probe running_sum: 100%" in bar and "probed blocks.1.hook_resid_post (recurrent, K=exact" in bar
    report = json.loads((run / "results" / "probe_running_sum.json").read_text())
    combos = {(r["hook"], r["prefill"], str(r["passes"])) for r in report["rows"]}
    hooks = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert combos == {(h, p, k) for h in hooks for p, k in [("standard", "1"), ("recurrent", "2"), ("recurrent", "exact")]}
    assert [r["layer"] for r in report["rows"][:3]] == [0.0, 1.0, 2.0]
    row = report["rows"][0]
    assert set(row) >= {"accuracy", "chance", "control_accuracy", "selectivity", "n_train", "n_test"}
    assert row["n_train"] > row["n_test"] > 0
    assert (run / "results" / "probe_running_sum.png").is_file()
    assert len(list((run / "results" / "probes" / "running_sum").glob("*.safetensors"))) == 9
    assert row["mdl_bits"] > 0 and row["rank_sweep"]  # the capacity measures are on by default
    main(
        [
            "probe",
            str(run),
            "--target",
            "running_sum",
            "--passes",
            "2",
            "--n",
            "30",
            "--no-mdl",
            "--ranks",
            "none",
            "--overwrite",
        ]
    )
    row = json.loads((run / "results" / "probe_running_sum.json").read_text())["rows"][0]
    assert row["mdl_bits"] is None and row["rank_sweep"] == [] and row["accuracy"] >= 0
    capsys.readouterr()
    main(["probe", str(run), "--target", "running_sum", "--passes", "2", "--n", "30", "--no-progress", "--overwrite"])
    assert "probe running_sum" not in capsys.readouterr().err


@pytest.mark.slow
def test_probe_out_is_a_directory_and_the_old_file_spelling_still_works(tmp_path, capsys):
    """--out is a directory in every verb: the sweep's report, figure and probe weights land there
    (not in the run). The old spelling, --out naming the report file, still writes that file for one
    release and says so; a file where the directory should be is refused before any work."""
    from workbench import save_model
    from workbench.cli import main

    run = save_model(build_model("baseline", "debug"), tmp_path / "run")
    argv = ["probe", str(run), "--target", "memory", "--n", "12", "--no-mdl", "--ranks", "none", "--no-progress"]
    argv += ["--hooks", "blocks.0.hook_resid_pre"]
    main([*argv, "--out", str(tmp_path / "sweep")])
    assert json.loads((tmp_path / "sweep" / "probe_memory.json").read_text())["target"] == "memory"
    assert (tmp_path / "sweep" / "probe_memory.png").is_file()
    assert len(list((tmp_path / "sweep" / "probes" / "memory").glob("*.safetensors"))) == 1
    assert not (run / "results").exists()
    capsys.readouterr()
    main([*argv, "--out", str(tmp_path / "old" / "mine.json")])
    assert "--out FILE.json is deprecated" in capsys.readouterr().err
    assert json.loads((tmp_path / "old" / "mine.json").read_text())["target"] == "memory"
    (tmp_path / "file").write_text("mine")
    assert_usage_error([*argv, "--out", str(tmp_path / "file")], "is a file: --out takes the directory")
    assert (tmp_path / "file").read_text() == "mine"
    config = (run / "config.json").read_text()  # the old spelling never writes over what is not a probe report
    code, _, err = cli([*argv, "--out", str(run / "config.json"), "--overwrite"])
    assert code == 2 and "no probe sweep of this workbench wrote (config.json)" in err.splitlines()[-1]
    assert (run / "config.json").read_text() == config


def test_probe_rank_option_shows_the_default_and_refuses_bad_ranks(capsys):
    from workbench.cli import build_parser
    from workbench.probing.probes import RANKS

    parser = build_parser()
    probe = next(a for a in parser._subparsers._group_actions[0].choices["probe"]._actions if a.dest == "ranks")
    assert f"default {','.join(map(str, RANKS))}" in probe.help
    assert parser.parse_args(["probe", "R", "--target", "memory", "--ranks", "1,4"]).ranks == [1, 4]
    with pytest.raises(SystemExit):
        parser.parse_args(["probe", "R", "--target", "memory", "--ranks", "0,2"])
    assert "expected comma-separated ranks >= 1 or 'none', got '0,2'" in capsys.readouterr().err


def test_probe_and_cache_errors_list_valid_names(tmp_path, capsys):
    from workbench import save_model
    from workbench.cli import main

    run = save_model(build_model("hd", "debug", n_streams=2), tmp_path / "run")
    with pytest.raises(SystemExit):
        main(["probe", str(run), "--target", "sum"])
    err = capsys.readouterr().err
    assert "unknown probe target 'sum'" in err and "'running_sum'" in err and "'memory'" in err
    with pytest.raises(SystemExit):
        main(["cache", str(run), "--task", "modsum", "--hooks", "blocks.*.hook_resid_postt", "--out", str(tmp_path / "s")])
    assert "matches no hook point" in capsys.readouterr().err
    main(
        [
            "cache",
            str(run),
            "--task",
            "modsum",
            "--hooks",
            "blocks.*.hook_resid_post",
            "hook_stream_embed",
            "--n",
            "4",
            "--out",
            str(tmp_path / "s"),
        ]
    )
    ds, meta = load_store(tmp_path / "s")
    assert meta["hooks"] == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post", "hook_stream_embed"]
    assert set(np.asarray(ds.with_format("numpy")[:]["stream"])) == {0, 1}


@pytest.mark.slow
def test_probe_study_reports_progress_up_to_done(tmp_path):
    from workbench import save_model
    from workbench.probing.study import probe_study

    run = save_model(build_model("hd", "debug", n_streams=2), tmp_path / "run")
    seen = []
    probe_study(run, "memory", hooks=["blocks.0.hook_resid_pre"], n_sequences=20, progress=lambda f, what: seen.append((f, what)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert sum("probed" in w for _, w in seen) == 2  # one hook x standard prefill x 2 streams


def test_probe_study_draws_the_problems_the_run_trained_on(micro_runs, tmp_path):
    """The micro zoo trains modsum mod 3 over 1-6 digits (the zoo's TASK), not the defaults (mod 7
    over 4-16): probing its running sum on default problems asked for a sum mod 7 of a model that
    computes one mod 3, and found nothing. The sweep now draws the run's own problems, records
    their settings, and its labels are sums mod 3."""
    import shutil

    from workbench.data.splits import heldout_examples
    from workbench.probing.study import probe_study
    from workbench.training.runconfig import task_config

    run = shutil.copytree(micro_runs / "baseline", tmp_path / "baseline")
    data = task_config(run)
    assert (data.modsum_p, data.modsum_min_len, data.modsum_max_len) == (3, 1, 6)
    report = probe_study(
        run, "running_sum", hooks=["blocks.0.hook_resid_pre"], passes=(), exact=False, n_sequences=12, mdl=False, ranks=()
    )
    assert report["data"]["modsum_p"] == 3 and report["data"]["modsum_max_len"] == 6
    labels = [v for ex in heldout_examples("modsum", 12, 0, data) for v in ex.labels["running_sum"]]
    assert set(labels) == {0, 1, 2}
    assert task_config(tmp_path) is None  # no run config: the tasks' defaults
