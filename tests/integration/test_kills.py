"""A training process killed, for real, at every file write of a checkpoint leaves a loadable run
that resumes exactly.

``COUNTS`` tallies the inputs tried, the faults injected and the data lost (which must stay zero);
pytest prints every fault class's tally at the end of the session (``tests/helpers.py``)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers import (
    FAST,
    RUN_FAULTS,
    C,
    T,
    W,
    cli,
    strip_timing,
    tally,
)
from safetensors.torch import load_file

import workbench.runtime.checkpoint as checkpoint
import workbench.runtime.tokenizer as tokenizer
import workbench.storage.files as files
import workbench.training.train as training
from workbench import CharTokenizer, load_model

COUNTS = tally(RUN_FAULTS)


# ---- 2. a training process killed during a checkpoint write, for real ---------------------

KILL_ARGV = [
    "train",
    "--arch",
    "fbt",
    "--task",
    "mix",
    "--no-progress",
    *[a for s in FAST + ["train.steps=6", "train.checkpoint_every=2", "fbt.feedback_start=0.25"] for a in ("--set", s)],
]

# One interpreter, forked once per kill point so the imports are paid once. Child i runs the
# training command and, at the i-th file write of its second checkpoint, leaves the temporary
# file half written, says so in a marker file and sleeps until the test kills it with SIGKILL.
HARNESS = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    import workbench.runtime.checkpoint as checkpoint
    import workbench.runtime.tokenizer as tokenizer
    import workbench.storage.files as files
    import workbench.training.train as training
    from workbench.cli import main

    def say(marker, text):  # atomically: the test polls the marker
        Path(f"{marker}.part").write_text(text)
        os.replace(f"{marker}.part", marker)

    def stall(write_index, marker, argv):
        real_write, real_save = files.atomic_write, training.save_checkpoint
        seen = {"checkpoints": 0, "writes": 0, "inside": False}

        def save(*args, **kwargs):
            seen["checkpoints"] += 1
            seen["inside"] = True
            try:
                return real_save(*args, **kwargs)
            finally:
                seen["inside"] = False

        def write(path, fill):
            if seen["inside"] and seen["checkpoints"] == 2:
                seen["writes"] += 1
                if seen["writes"] == write_index:
                    def torn(tmp):
                        fill(tmp)
                        data = Path(tmp).read_bytes()
                        os.unlink(tmp)  # a new file: a temp that is a hard link must not truncate its source
                        Path(tmp).write_bytes(data[: len(data) // 2])
                        say(marker, f"{os.getpid()} {path}")
                        time.sleep(600)
                    return real_write(path, torn)
            return real_write(path, fill)

        files.atomic_write = checkpoint.atomic_write = tokenizer.atomic_write = training.atomic_write = write
        training.save_checkpoint = save
        main(argv)
        say(marker, "finished")

    base, points = Path(sys.argv[1]), [int(i) for i in sys.argv[2].split(",")]
    children = []
    for index in points:
        pid = os.fork()
        if pid == 0:
            try:
                stall(index, base / f"marker{index}", sys.argv[3:] + ["--out", str(base / f"run{index}")])
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the harness forks one process per kill point")
def test_a_process_killed_at_any_checkpoint_write_leaves_a_loadable_run_that_resumes_exactly(tmp_path, no_unpickling):
    # the uninterrupted run, recording every file write of each checkpoint and the weights it saved
    writes, saved, saving = [], {}, []
    real_write, real_save = files.atomic_write, training.save_checkpoint
    writers = [files, checkpoint, tokenizer, training]  # every module that binds the name

    def record_write(path, fill):
        if saving:
            writes.append((saving[-1], Path(path).name))
        return real_write(path, fill)

    def record_save(run_dir, model, opt, cfg, step, tokenizer):
        saved[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        saving.append(step)
        try:
            real_save(run_dir, model, opt, cfg, step, tokenizer)
        finally:
            saving.pop()

    with pytest.MonkeyPatch.context() as patch:
        for module in writers:
            patch.setattr(module, "atomic_write", record_write)
        patch.setattr(training, "save_checkpoint", record_save)
        assert cli(KILL_ARGV + ["--out", str(tmp_path / "straight")])[0] is None
    second = [name for step, name in writes if step == 4]  # the writes of the second checkpoint
    assert {"state.json", W, C, T} <= set(second), second

    points = list(range(1, len(second) + 1))
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), ",".join(map(str, points)), *KILL_ARGV],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        started = time.monotonic()
        while not all((tmp_path / f"marker{i}").is_file() for i in points):
            assert proc.poll() is None and time.monotonic() - started < 240, "the harness did not reach every write"
            time.sleep(0.05)
        for i in points:
            pid, path = (tmp_path / f"marker{i}").read_text().split(" ", 1)
            assert Path(path).name == second[i - 1]
            os.kill(int(pid), signal.SIGKILL)  # a child of the harness, which reaps it
            COUNTS["faults_injected"] += 1
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:  # the test failed: end the harness and its children (its own process group)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    straight = load_file(str(tmp_path / "straight" / W))
    for i in points:
        run = tmp_path / f"run{i}"
        assert any(p.name.endswith(".tmp") for p in run.rglob("*")), "the kill did not land in a write"
        # what is there loads: the previous checkpoint's weights, or the new ones once published
        weights = load_model(run).state_dict()
        if not any(all(torch.equal(weights[k], saved[step][k]) for k in weights) for step in (2, 4)):
            COUNTS["data_lost"] += 1
            pytest.fail(f"killed while writing {second[i - 1]}: the run's weights are neither checkpoint's")
        CharTokenizer.load(run)
        code, _, err = cli(["train", "--out", str(run), "--resume", "--no-progress"])
        if code is not None:
            COUNTS["data_lost"] += 1
            pytest.fail(f"killed while writing {second[i - 1]}: resume failed: {err}")
        final = load_file(str(run / W))
        assert all(torch.equal(final[k], straight[k]) for k in straight), f"killed while writing {second[i - 1]}"
        assert strip_timing(run / "metrics.jsonl") == strip_timing(tmp_path / "straight" / "metrics.jsonl")
        assert not list(run.rglob("*.tmp")), "temporary files outlived the resume"
