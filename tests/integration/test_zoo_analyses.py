"""scripts/zoo_analyses.py end to end on a two-seed micro zoo with small settings: every verb runs
as a process on each seed's runs, and every reading lines up across the seeds (the seeded runs'
trace readings once did not, and the table lost them)."""

import importlib.util
import json
import shutil
from pathlib import Path

from workbench.training.zoo import train_zoo

ROOT = Path(__file__).resolve().parents[2]


def test_the_analyses_of_every_seed_line_up(tmp_path, monkeypatch, micro_zoo):
    spec = importlib.util.spec_from_file_location("zoo_analyses", ROOT / "scripts" / "zoo_analyses.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(
        script,
        "PROBE",
        ["--passes", "2", "--no-exact", "--n", "12", "--no-mdl", "--ranks", "none", "--hooks", "blocks.0.hook_resid_pre"],
    )
    monkeypatch.setattr(
        script, "DYNAMICS", ["--horizon", "30", "--spectra", "1", "--fixed-points", "1", "--starts", "2", "--tangents", "1"]
    )
    monkeypatch.setattr(script, "TRACES", ["--n", "6", "--difficulty", "1..2", "--passes", "2"])
    zoo = tmp_path / "zoo"
    shutil.copytree(micro_zoo, zoo)  # seed 0 as the session trained it: only seed 1 trains here
    train_zoo("micro", zoo, progress=False, seeds=2)
    out = tmp_path / "analyses.json"
    script.main([str(zoo), "--seeds", "2", "--jobs", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    groups = [
        "probe/baseline/memory",
        "probe/baseline/running_sum",
        "probe/fbt/memory",
        "probe/fbt/running_sum",
        "dynamics/fbt",
        "traces",
    ]
    assert list(data["readings"]) == groups
    assert all(r["n"] == 2 for readings in data["readings"].values() for r in readings.values())
    assert {"recurrent K=2/layer 0/accuracy", "standard/layer 0/accuracy"} <= set(data["readings"]["probe/fbt/memory"])
    assert {"lambda tangent/T=10", "K-pass residual/K=2", "fixed points/found"} <= set(data["readings"]["dynamics/fbt"])
    traces = data["readings"]["traces"]
    assert {"fbt/soft/accuracy", "hd4/standard/unfinished", "fbt/fused - baseline/standard/trace tokens"} <= set(traces)
    assert data["seconds"] > 0 and "readings_commit" not in data
    script.main([str(zoo), "--seeds", "2", "--out", str(out)])  # every output is there: only the readings again
    again = json.loads(out.read_text())
    assert again["readings"] == data["readings"] and again["seconds"] == data["seconds"] and again["commit"] == data["commit"]
    assert "readings_commit" in again
