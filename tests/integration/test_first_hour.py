"""The README's first hour is reproduced at HEAD: the layer-0 probe the walk recorded
(``docs/results/first_hour.json``, from ``scripts/first_hour.py``) is recomputed here from the
``quick`` zoo's own settings and the probe job's own arguments, on the walk's numerics, and must
give the same accuracies (on a CPU model recorded under ``layer-0 probe on other CPUs``, that
model's: the pinned numerics make one CPU model repeat itself, not two models agree). A change that
moves what a newcomer sees fails here until the walk is run again (and the README quotes its new
numbers).

It trains the quick zoo's ``fbt`` (500 steps on one thread), minutes on 2 cores: ``.ci/run`` runs
it beside its last checks rather than inside the suite (``WORKBENCH_FIRST_HOUR_BESIDE=1`` there)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.runtime.process import PINNED_NUMERICS
from workbench.training.fingerprint import cpu_model

ROOT = Path(__file__).resolve().parents[2]
LAYER0 = "blocks.0.hook_resid_pre"

pytestmark = pytest.mark.skipif(
    os.environ.get("WORKBENCH_FIRST_HOUR_BESIDE") == "1", reason=".ci/run runs it beside its last checks"
)


def workbench(*argv: str) -> None:
    env = {**os.environ, **PINNED_NUMERICS}  # set before torch loads, as the walk sets it for its jobs
    done = subprocess.run([sys.executable, "-m", "workbench.cli", *argv], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_first_hours_layer0_probe_recomputes_at_head(tmp_path):
    walk = json.loads((ROOT / "docs" / "results" / "first_hour.json").read_text())
    assert walk["numerics"] == PINNED_NUMERICS
    runs = tmp_path / "runs"
    # the quick zoo's fbt exactly as the zoo trains it (its member's config, one thread, a worker process)
    workbench("zoo", "--preset", "quick", "--only", "fbt", "--out", str(runs / "quick"), "--no-progress")
    argv = [a.replace("RUNS", str(runs)) for a in walk["shown"]["probe job"]]
    assert argv[:2] == ["probe", str(runs / "quick" / "fbt")]
    # layer 0 alone: each hook's probe is fitted on its own activations of the same forward passes,
    # so the other depths change nothing of it (and take most of the job's time)
    start, end = argv.index("--hooks") + 1, argv.index("--passes")
    assert LAYER0 in argv[start:end]
    argv[start:end] = [LAYER0]
    workbench(*argv, "--json", str(tmp_path / "probe.json"))
    report = json.loads((tmp_path / "probe.json").read_text())
    layer0 = {
        "standard" if r["prefill"] == "standard" else f"recurrent K={r['passes']}": r["accuracy"]
        for r in report["rows"]
        if r["hook"] == LAYER0
    }
    assert report["target"] == walk["shown"]["layer-0 probe"]["target"]
    # pinned numerics make runs alike on one CPU model, not across models: one whose numbers differ is recorded
    quoted = walk.get("layer-0 probe on other CPUs", {}).get(cpu_model(), walk["shown"]["layer-0 probe"])
    assert layer0 == {k: quoted[k] for k in layer0}, cpu_model()  # counts of correct rows over the same rows: equal, not close
    assert set(layer0) == {k for k in walk["shown"]["layer-0 probe"] if k != "target"}
