"""Guarantee: a verb deletes only what it made and has superseded; a checkpoint a user put back
into a run's ``train_state/`` (a backup copied with its times) stays, whatever it resumes."""

import shutil

from helpers import FAST, cli

from workbench.storage.outputs import listed
from workbench.training.checkpointing import RUN, STATE_DIR

TRAIN = ["train", "--arch", "baseline", "--preset", "debug", "--task", "modsum", "--no-progress"]
STEPS = [f"--set={s}" for s in [*FAST, "train.steps=6", "train.checkpoint_every=2"]]


def test_a_checkpoint_restored_from_a_backup_survives_resumes(tmp_path):
    run, backup = tmp_path / "run", tmp_path / "backup"
    assert cli([*TRAIN, "--out", str(run), *STEPS, "--stop-after", "2"])[0] is None
    shutil.copytree(run / STATE_DIR, backup)  # same size and times: what ``cp -a`` keeps
    assert cli(["train", "--out", str(run), "--resume", "--no-progress", "--stop-after", "2"])[0] is None
    assert not (run / STATE_DIR / "model-2.safetensors").exists()  # superseded by step 4: deleted
    for name in ("model-2.safetensors", "optimizer-2.safetensors"):
        shutil.copy2(backup / name, run / STATE_DIR / name)
    # a resume that commits step 6 (superseding step 4), then one of the finished run that trains nothing
    for _ in range(2):
        assert cli(["train", "--out", str(run), "--resume", "--no-progress"])[0] is None
    kept = {p.name for p in (run / STATE_DIR).iterdir()}
    assert {"model-2.safetensors", "optimizer-2.safetensors", "model-6.safetensors"} <= kept, kept
    assert "model-4.safetensors" not in kept, kept
    # the restored backup is the user's: the run's manifest never lists it, so nothing takes it for the run's
    assert not {f"{STATE_DIR}/model-2.safetensors", f"{STATE_DIR}/optimizer-2.safetensors"} & listed(run, RUN)
    assert {STATE_DIR, f"{STATE_DIR}/model-6.safetensors", "model.safetensors"} <= listed(run, RUN)
