"""Guarantee: every size a user can set is checked against the memory it needs before anything is
allocated, with an estimate calibrated against measured peak memory."""

import importlib.util
import json
from pathlib import Path

import pytest
from helpers import assert_usage_error

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("memory_calibration", ROOT / "scripts" / "memory_calibration.py")
assert spec is not None and spec.loader is not None
calibration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibration)


def within(ratio: float, factor: float = 1.5) -> bool:
    return 1 / factor <= ratio <= factor


@pytest.mark.slow
@pytest.mark.parametrize("point", [("baseline", "debug", 256, 128), ("fbt", "debug", 256, 64)], ids=str)
def test_the_training_estimate_is_within_1_5x_of_the_peak_rss_a_step_reaches(point):
    """Measured from a parent larger than the step (as a test session is): the child's peak is its own."""
    ballast = b"\x01" * (1 << 30)  # written, so resident
    row = calibration.measure(*point)
    assert within(row["ratio"]), row
    del ballast


def test_the_estimate_on_a_gpu_is_within_1_5x_of_the_gpu_suites_measured_peaks():
    rows = calibration.gpu_rows()
    assert [r["run"] for r in rows] == ["fbt_2pass", "hd2"] and all(within(r["ratio"]) for r in rows), rows


def test_the_committed_calibration_is_what_the_estimate_gives_now():
    """docs/results/memory_calibration.json's estimates are the code's: a change to the estimate
    without a new measurement fails here."""
    from workbench.training.runconfig import make_run_config, run_sizes, training_bytes

    committed = json.loads((ROOT / "docs" / "results" / "memory_calibration.json").read_text())
    for row in committed["cpu"]:
        shape = [f"train.batch_size={row['batch_size']}", f"train.seq_len={row['seq_len']}"]
        cfg = make_run_config(row["arch"], row["preset"], "modsum", [*calibration.SETTINGS[row["arch"]], *shape])
        assert training_bytes(cfg, run_sizes(cfg)) == row["estimate"], row
        assert within(row["ratio"]), row
    assert [r["estimate"] for r in committed["gpu"]] == [r["estimate"] for r in calibration.gpu_rows()]


def test_train_refuses_a_batch_no_memory_holds_naming_it(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--arch", "baseline", "--preset", "debug", "--set", "train.batch_size=300000", "--out", str(out)]
    assert_usage_error(argv, "train.batch_size=300000", "more than the")
    assert not out.exists()


def test_an_sae_too_large_for_memory_is_refused_naming_the_expansion_before_any_work(micro_runs, tmp_path):
    run = next(p for p in micro_runs.iterdir() if p.is_dir() and "fbt" in p.name)
    out = tmp_path / "sae"
    argv = ["sae", str(run), "--hook", "blocks.0.hook_resid_pre", "--expansion", "50000", "--out", str(out), "--no-progress"]
    assert_usage_error(argv, "latents (--expansion x d_model)=", "more than the")
    assert not out.exists()


def test_generate_refuses_a_cache_no_memory_holds_before_allocating_it():
    """A config from elsewhere may claim a context of 10^12 positions: the cache is sized by what
    is asked, and checked first."""
    import resource

    from workbench.runtime.config import build_model
    from workbench.runtime.decoding import generate
    from workbench.storage.errors import BadInput

    model = build_model("baseline", "debug", n_ctx=10**12)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(BadInput, match=r"prompt \+ max_new_tokens=100000003: the key/value cache .* more than the"):
        generate(model, [[1, 2, 3]], max_new_tokens=10**8)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: nothing of its size was allocated
