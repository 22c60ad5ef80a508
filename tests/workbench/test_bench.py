"""``workbench bench``: the report's structure and validation (tests never judge speed)."""

import json

import pytest

from workbench.bench import TARGETS, entry, paired
from workbench.cli import main


@pytest.mark.slow
def test_bench_report_has_both_measurements_ratio_reps_and_spread(tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(
        [
            "bench",
            "--preset",
            "debug",
            "--only",
            "hook_overhead",
            "--only",
            "fbt_k2_train_step",
            "--only",
            "numerics_guard_decode",
            "--only",
            "store_verify_load",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert report["preset"] == "debug" and report["machine"]["torch"]
    keys = [e["key"] for e in report["entries"]]
    assert sorted(keys) == ["fbt_k2_train_step", "hook_overhead", "numerics_guard_decode", "store_verify_load"]
    for e in report["entries"]:
        assert e["a"]["median_s"] > 0 and e["b"]["median_s"] > 0 and e["reps"] >= 5
        assert e["spread"][0] <= e["ratio"] <= e["spread"][1]
        assert e["target"] == (None if TARGETS[e["key"]][1] is None else "{} {}".format(*TARGETS[e["key"]]))
    assert "hook_overhead" in capsys.readouterr().out


def test_targets_are_judged_in_their_direction():
    assert entry("kv_cache_speedup", 12.0)["met"] and not entry("kv_cache_speedup", 9.0)["met"]
    assert entry("hook_overhead", 1.01)["met"] and not entry("hook_overhead", 1.2)["met"]
    assert entry("hd4_dense_train_step", 7.0)["met"] is None


@pytest.mark.slow
def test_paired_calls_each_side_once_per_repetition_plus_warmup():
    calls = []
    e = paired(
        "hook_overhead",
        lambda: calls.append("a"),
        lambda: calls.append("b"),
        what_a="a",
        what_b="b",
        reps=5,
        ratio=lambda ta, tb: 1.0,
    )
    assert calls == ["a", "b"] * 6 and e["ratio"] == 1.0 and e["spread"] == [1.0, 1.0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--reps", "3", "--only", "hook_overhead", "--preset", "debug"], "reps=3: the benchmark wants 5..1000 paired"),
        (
            ["bench", "--reps", "1000000000", "--only", "hook_overhead", "--preset", "debug"],
            "reps=1000000000: the benchmark wants 5..1000",
        ),
        (
            ["bench", "--store-positions", "10000000000", "--preset", "debug"],
            "store_positions=10000000000: expected 1,000..10,000,000",
        ),
        (["bench", "--only", "warp_speed", "--preset", "debug"], "unknown bench keys ['warp_speed']"),
        (["bench", "--preset", "huge"], "invalid choice: 'huge'"),
    ],
)
def test_bad_bench_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
