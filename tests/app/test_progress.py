"""What a running job's line says (``app.jobs.progress_counts``) and what the verbs write for it:
the phase's count, the job's time so far, an estimate, and (a zoo) its members."""

import json

import pytest

pytest.importorskip("streamlit")

from app.jobs import progress_counts  # noqa: E402
from workbench.runtime.progress import PROGRESS_ENV, Bar  # noqa: E402
from workbench.training.zoo import zoo_status  # noqa: E402


def test_a_count_with_a_unit_gets_its_time_and_an_estimate_at_its_rate():
    steps = {"n": 10, "total": 40, "unit": "step", "started": 100.0, "updated": 120.0}
    # 10 steps in 20 s: 30 more take 60 s
    assert progress_counts(steps, created=90.0, now=125.0) == " (10 of 40 steps, 0:35 elapsed, about 1:00 left)"
    share = {"n": 250, "total": 1000, "unit": "it", "started": 0.0, "updated": 10.0}
    assert progress_counts(share, created=0.0, now=3725.0) == " (25%, 1:02:05 elapsed, about 0:30 left)"
    assert progress_counts({}, created=0.0, now=5.0) == " (0:05 elapsed)"  # a verb that reports no count


def test_the_bar_writes_its_count_and_a_milestone_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, str(tmp_path / "progress.json"))
    with Bar("zoo", 100, show=False, unit="step") as bar:
        bar.update(1, "training baseline")
        bar.update(2, "training baseline", milestone=1)  # within the write interval, but a member finished
        written = json.loads((tmp_path / "progress.json").read_text())
    assert (written["n"], written["total"], written["unit"], written["milestone"]) == (2, 100, "step", 1)
    assert written["started"] <= written["updated"]


def test_a_zoos_line_names_its_members():
    assert zoo_status(["baseline", "fbt"], 0, 4, "") == "training baseline, fbt"
    assert zoo_status([], 1, 4, "fbt took 67 s") == "1 of 4 done; fbt took 67 s"  # between members: no empty 'training'
    assert zoo_status(["hd2", "hd4"], 2, 4, "fbt took 67 s") == "training hd2, hd4; 2 of 4 done; fbt took 67 s"
