"""``workbench gpu-check``: its dry mode runs the GPU script's every step on the CPU, so the
script cannot rot on machines without a GPU (CI); without --dry it needs CUDA."""

import json

import pytest
import torch
from helpers import assert_usage_error

from workbench.bench.suite import DEVICE_KEYS
from workbench.cli import main


@pytest.mark.slow
def test_the_dry_run_trains_every_architecture_checks_the_cache_and_benches(tmp_path, capsys):
    main(["gpu-check", "--dry", "--json", str(tmp_path / "gpu.json")])
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["dry"] is True and report["shape"]["preset"] == "debug"
    assert set(report["runs"]) == {"baseline", "fbt_1pass", "fbt_2pass", "hd4"}
    for name, r in report["runs"].items():
        assert r["tokens_per_s"] > 0 and r["tflops_per_s"] > 0 and r["mfu"] is None, name  # no CPU peak on record
    assert report["runs"]["fbt_1pass"]["passes"] == 1 and report["runs"]["fbt_2pass"]["passes"] == 2
    assert report["runs"]["hd4"]["n_streams"] == 4
    assert report["cache_parity_ok"] and max(report["cache_parity_max_abs"].values()) < 1e-5  # fp32 on the CPU
    targets = report["targets"]
    assert set(targets) == {"baseline_mfu", "fbt_2pass_over_1pass_step", "hd4_over_baseline_step"}
    assert all(t["met"] is None for t in targets.values())  # a dry run judges nothing
    assert targets["fbt_2pass_over_1pass_step"]["value"] > 1
    assert [e["key"] for e in report["bench"]["entries"]] == list(DEVICE_KEYS)
    assert "cached decoding == full forward" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: gpu-check would run")
def test_without_cuda_it_asks_for_dry_and_the_bench_refuses_the_device():
    assert_usage_error(["gpu-check"], "no CUDA device", "--dry")
    assert_usage_error(["bench", "--device", "cuda", "--preset", "debug"], "device='cuda'", "expected cpu")
    assert_usage_error(["bench", "--preset", "gpu"], "preset 'gpu' is for a CUDA device")
