"""Experiment tracking (``train.log_to``): TensorBoard's event files and a W&B offline run hold the
metrics lines' numbers at their steps, read back by TensorBoard's own reader and by parsing W&B's
record log; a resumed run continues the same curves."""

import json
import struct
import sys

import numpy as np
import pytest

from workbench.storage.errors import BadInput
from workbench.storage.outputs import Output, contents
from workbench.training.metrics import read_metrics
from workbench.training.runconfig import make_run_config
from workbench.training.tracking import parse_log_to, scalars
from workbench.training.train import RUN, train

SETTINGS = [
    "train.steps=6",
    "train.batch_size=4",
    "train.seq_len=32",
    "train.log_every=2",
    "train.checkpoint_every=2",
    "train.eval_examples=0",
    "data.n_train=200",
]


def _config(log_to: str, arch: str = "fbt"):
    return make_run_config(arch, "debug", "modsum", [*SETTINGS, f"train.log_to={log_to}"])


def test_log_to_names_trackers_and_a_bad_one_is_a_one_line_error():
    assert parse_log_to("none") == () and parse_log_to("wandb") == ("wandb",)
    assert parse_log_to("wandb, tensorboard") == ("tensorboard", "wandb")
    for bad in ("tensorbord", "wandb,wandb", ""):
        with pytest.raises(BadInput, match=f"log_to={bad!r}: expected 'none' or one or more of tensorboard, wandb"):
            _config(bad)


def test_a_tracker_not_installed_is_named_with_the_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(BadInput, match=r"names wandb, which is not installed: pip install 'latent-workbench\[tracking\]'"):
        train(_config("wandb"), tmp_path / "run", progress=False)


def test_a_wandb_mode_wandb_does_not_know_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offlne")
    with pytest.raises(BadInput, match=r"WANDB_MODE='offlne' in the environment: expected one of offline, online, disabled"):
        train(_config("wandb"), tmp_path / "run", progress=False)


def test_a_resume_may_start_logging_to_a_tracker():
    """Where a run logs is not what it computes: ``--resume --set train.log_to=...`` is allowed."""
    from workbench.training.runconfig import with_execution_overrides

    assert with_execution_overrides(_config("none"), ["train.log_to=tensorboard"]).train.log_to == "tensorboard"


def test_scalars_are_a_lines_numbers_but_its_step():
    line = {"step": 4, "loss": 1.5, "loss_pass2": 2, "tokens_per_s": 10.0, "note": "x", "flag": True}
    assert scalars(line) == {"loss": 1.5, "loss_pass2": 2.0, "tokens_per_s": 10.0}


def _tensorboard(run) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _expected(run) -> dict[str, list[tuple[int, float]]]:
    """``metrics.jsonl`` as curves: ``train/NAME`` -> [(step, value)], values as float32 (TensorBoard
    stores its scalars so)."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for line in read_metrics(run / "metrics.jsonl"):
        for name, value in scalars(line).items():
            curves.setdefault(f"train/{name}", []).append((line["step"], float(np.float32(value))))
    return curves


@pytest.mark.slow
def test_tensorboard_holds_the_metrics_lines_and_a_resume_continues_the_same_curves(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    train(_config("tensorboard"), whole, progress=False)
    expected = _expected(whole)
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/peak_rss_mib"} <= set(expected)
    assert len(expected["train/loss"]) == 3 and _tensorboard(whole) == expected
    # stopped after step 4 (a checkpoint), resumed to 6: the steps after 4 are logged once
    train(_config("tensorboard"), resumed, progress=False, stop_after=4)
    train(_config("tensorboard"), resumed, progress=False, resume=True)
    curves = _tensorboard(resumed)
    assert [s for s, _ in curves["train/loss"]] == [2, 4, 6] and curves == _expected(resumed)
    assert not Output(resumed, RUN).foreign(contents(resumed))  # the event files are the run's


def _wandb_records(run) -> list:
    """Every record of the run's W&B offline logs (``run-ID.wandb``: a 7-byte header, then records
    in 32 KiB blocks, each a 7-byte header (crc, length, type: 1 full, 2 first, 3 middle, 4 last)
    and a protobuf ``Record``), in the order written."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    for path in sorted((run / "wandb").glob("offline-run-*/run-*.wandb")):
        data, block = path.read_bytes(), 32768
        assert data[:4] == b":W&B", path
        pos, chunks = 7, b""
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a header is padding
                pos += block - pos % block
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if length == 0 and kind == 0:
                break
            chunks += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(chunks)
                records.append(record)
                chunks = b""
    return records


def _wandb_curves(records) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for name, value in row.items():
                if name.startswith("train/"):
                    curves.setdefault(name, []).append((row["_step"], float(np.float32(value))))
    return curves


@pytest.mark.slow
def test_a_wandb_offline_run_holds_the_metrics_lines_and_the_config_and_a_resume_is_the_same_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    train(_config("wandb", arch="baseline"), run, progress=False, stop_after=4)
    train(_config("wandb", arch="baseline"), run, progress=False, resume=True)
    records = _wandb_records(run)
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    wandb_id = json.loads((run / "tracking.json").read_text())["wandb_id"]
    assert len(runs) == 2 and {r.run_id for r in runs} == {wandb_id}  # two sessions, one run
    config = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in runs[0].config.update}
    assert config["train"]["log_to"] == "wandb" and config["model"]["d_model"] == 32
    assert _wandb_curves(records) == _expected(run)
    assert not Output(run, RUN).foreign(contents(run))
