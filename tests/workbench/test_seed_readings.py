"""The studies' readings across seeds, on reports whose values are written out by hand."""

import math

from workbench.experiments.seed_readings import across, dynamics_readings, probe_readings, trace_readings


def probe_row(prefill, passes, layer, accuracy, stream=0, **more):
    return {
        "prefill": prefill,
        "passes": passes,
        "layer": layer,
        "stream": stream,
        "accuracy": accuracy,
        "selectivity": accuracy - 0.5,
        **more,
    }


def test_probe_readings_name_regime_depth_and_stream():
    report = {"arch": "fbt", "rows": [probe_row("standard", 1, 0.0, 0.5), probe_row("recurrent", 2, 0.0, 0.75, compression=1.5)]}
    assert probe_readings(report) == {
        "standard/layer 0/accuracy": 0.5,
        "standard/layer 0/selectivity": 0.0,
        "recurrent K=2/layer 0/accuracy": 0.75,
        "recurrent K=2/layer 0/selectivity": 0.25,
        "recurrent K=2/layer 0/compression": 1.5,
    }
    hd = {"arch": "hd", "rows": [probe_row("standard", 1, 2.0, 0.6, stream=0), probe_row("standard", 1, 2.0, 0.7, stream=3)]}
    assert set(probe_readings(hd)) >= {"standard/layer 2/stream 0/accuracy", "standard/layer 2/stream 3/accuracy"}


def test_dynamics_readings_take_the_leading_exponent_the_residuals_and_the_regrowth_step():
    run = {
        "lyapunov_tangent": {"10": [-0.5, -0.7], "100": [-0.25, -0.3]},
        "lyapunov_tangent_full": {"100": [0.01, 0.0]},
        "lyapunov": {"10": -0.4},
        "kpass": {"rows": [{"passes": 1}, {"passes": 2, "relative_residual": 0.3}]},
        "per_step": {"perturbation_ratio": [1.0, 0.1, 0.5, 1.2, 3.0]},
        "fixed_points": [{"points": [{"stable": True}, {"stable": False}]}, {"points": []}],
    }
    assert dynamics_readings(run) == {
        "lambda tangent/T=10": -0.5,
        "lambda tangent/T=100": -0.25,
        "lambda whole step/T=100": 0.01,
        "lambda perturbation/T=10": -0.4,
        "K-pass residual/K=2": 0.3,
        "regrowth step (rollout length if never)": 3.0,
        "fixed points/found": 2.0,
        "fixed points/stable": 1.0,
    }
    run["per_step"]["perturbation_ratio"] = [1.0, 0.5, 0.25]  # never back: the rollout's length bounds it
    assert dynamics_readings(run)["regrowth step (rollout length if never)"] == 3.0


def test_trace_readings_and_their_interval_across_seeds():
    def summary(acc, diff):
        return {
            "groups": {"fbt/soft": {"accuracy": acc, "mean_trace": 40.0, "unfinished": 0.0}},
            "paired": {"fbt/standard - fbt/soft": {"trace_tokens": {"mean": diff}, "accuracy": {"mean": 0.0}}},
        }

    seeds = [trace_readings(summary(a, d)) for a, d in [(0.25, 1.0), (0.5, 2.0), (0.75, 3.0)]]
    result = across(seeds)
    acc = result["fbt/soft/accuracy"]
    # mean 0.5, sd 0.25, t(0.975, 2) = 4.302653: half-width 4.302653 * 0.25 / sqrt(3)
    assert acc["mean"] == 0.5 and math.isclose(acc["high"] - 0.5, 4.302653 * 0.25 / math.sqrt(3), rel_tol=1e-6)
    assert result["fbt/standard - fbt/soft/trace tokens"]["values"] == [1.0, 2.0, 3.0]
    partial = across([{"a": 1.0, "b": 2.0}, {"a": 3.0}])
    assert list(partial) == ["a"] and partial["a"]["mean"] == 2.0  # a reading one seed lacks is left out
    assert across([]) == {}


def test_trace_readings_of_seeded_runs_line_up_with_seed_zero():
    """Seed k's runs are ``NAME-seedK``: their readings carry the plain names, so ``across`` keeps them."""

    def summary(suffix, acc):
        b, f = f"baseline{suffix}/standard", f"fbt{suffix}/soft"
        return {
            "groups": {
                b: {"accuracy": 0.5, "mean_trace": 30.0, "unfinished": 0.0},
                f: {"accuracy": acc, "mean_trace": 28.0, "unfinished": 0.25},
            },
            "paired": {f"{f} - {b}": {"trace_tokens": {"mean": -2.0}, "accuracy": {"mean": acc - 0.5}}},
        }

    result = across(
        [trace_readings(summary("", 0.5)), trace_readings(summary("-seed1", 0.75)), trace_readings(summary("-seed12", 1.0))]
    )
    assert result["fbt/soft/accuracy"]["values"] == [0.5, 0.75, 1.0]
    assert result["fbt/soft - baseline/standard/accuracy"]["values"] == [0.0, 0.25, 0.5]
    assert result["fbt/soft/unfinished"]["values"] == [0.25, 0.25, 0.25]
    assert len(result) == 8
