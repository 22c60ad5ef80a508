"""A training fingerprint: one hash of what this code trains and evaluates, so that results made at
different commits can be shown to come from the same training behaviour.

The organisms' zoo and its studies take hours on 2 cores, longer than a session, so a regeneration
runs in parts, at more than one commit. A commit hash cannot say whether two parts are comparable
(a commit may change only documentation; an optimizer change between them changes every weight).
``training_fingerprint`` trains, on each organism's own task and data settings, a few steps of
each kind of member the zoo and its studies train (a baseline; FBT through its single-pass phase,
the warm switch, the ramp and 3-pass batches; HD continued from the baseline by progressive
expansion 2 -> 4), at the ``debug`` model size with one thread, evaluates each, and hashes the
weights and the evaluation's numbers. Equal fingerprints: the same weights and readings from the
same settings, bit for bit, on this machine's torch; a change to the model, the data, the
optimizer, the training loop or the evaluation changes it. It says nothing about code it does
not run (a study's statistics, the analyses): those are recomputed from the saved runs. Each
organism also gets its own (``organisms``: its members' digests hashed), since a study on one
organism trains only that organism's members: a change to perm's task leaves the flip-flop's and
addition's results comparable.

The CPU's instruction set is part of the numerics: the same code on this machine gives one
fingerprint with PyTorch's AVX-512 kernels, others with its AVX2 and its generic ones, and
another with AVX2 and MKL's results pinned (measured); sessions land on different
machines. ``PINNED_NUMERICS`` is the environment that makes PyTorch, MKL and oneDNN take their AVX2
paths and MKL's results reproducible; a regeneration made in parts runs every part under it, and
the record says which path ran and on which CPU (``numerics``). The path does not make the CPU
model irrelevant: commit f7e5944 gave d8b51918 on the machine its runs were made on and 1daa2dff
on an AMD EPYC under the same variables (measured), so a part made on another CPU model is refused
by ``--expect`` and has to be made again there. It must be set before torch is imported, so it is set for a
new process (``python -m workbench.training.fingerprint``, ``workbench zoo``).

    python -m workbench.training.fingerprint     # this process's fingerprint, as JSON
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from workbench.runtime.process import PINNED_NUMERICS
from workbench.training.runconfig import RunConfig, make_run_config

STEPS = 8  # each member's training steps: FBT's switch at step 2, its ramp over 2, 3-pass batches after
HD_STEPS = 4  # HD's: expanded 2 -> 4 streams at step 2
COMMON = [
    "train.batch_size=4",
    "train.seq_len=48",
    "train.warmup=2",
    "train.log_every=4",
    "train.eval_examples=6",
    "data.n_train=200",
    "model.n_ctx=128",
]


def members(out: Path, tasks: tuple[str, ...] | None = None) -> list[tuple[str, RunConfig]]:
    """(name, run config) of each member the fingerprint trains on each organism's task (``tasks``:
    all by default), in order; HD's start from the baseline of its task, trained before them."""
    from workbench.training.zoo import ORGANISMS, SCALES

    runs = []
    for task, scale in ORGANISMS.items():
        if tasks is not None and task not in tasks:
            continue
        settings = [*SCALES[scale]["common"], *COMMON, f"train.checkpoint_every={STEPS}", "train.lr=3e-3"]  # later wins
        fbt = ["fbt.feedback_start=0.25", "fbt.ramp=0.25", "fbt.three_pass_fraction=0.5"]
        hd = [f"train.steps={HD_STEPS}", "hd.streams=2,4", "hd.expand_at=0,2"]
        for name, arch, extra, init in [
            ("baseline", "baseline", [f"train.steps={STEPS}"], None),
            ("fbt", "fbt", [f"train.steps={STEPS}", *fbt], None),
            ("hd4", "hd", hd, str(out / f"{task}-baseline")),
        ]:
            runs.append((f"{task}-{name}", make_run_config(arch, "debug", task, [*settings, *extra], init_from=init)))
    return runs


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if "second" not in k and k not in ("run", "path")}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def weights_digest(path: Path) -> str:
    """SHA-256 over a safetensors file's tensors (name, dtype, shape, bytes, by name): the weights,
    not the file's metadata."""
    h = hashlib.sha256()
    for name, tensor in sorted(load_file(str(path)).items()):
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def numerics() -> dict:
    """The CPU path this process's torch computes on: its kernels' instruction set, the CPU's
    model and the ``PINNED_NUMERICS`` variables as they are set here (None where unset)."""
    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": cpu_model(),
        **{k: os.environ.get(k) for k in PINNED_NUMERICS},
    }


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def training_fingerprint(work: str | Path | None = None, tasks: tuple[str, ...] | None = None) -> dict:
    """Train and evaluate ``members`` in ``work`` (a new temporary directory by default) and return
    ``{"sha256": ..., "organisms": {task: sha256}, "members": {name: sha256}, "steps": ..., "torch": ...,
    "numerics": ...}``: the first hashes every member's weights and evaluation in order, ``organisms``
    each organism's members alone (``organism_prints``). ``tasks`` (all organisms by default) is for
    tests; the record's fingerprint is always of all three."""
    from workbench.training.zoo import train_member

    with tempfile.TemporaryDirectory(prefix="workbench-fingerprint-") as tmp:
        out = Path(work) if work is not None else Path(tmp)
        digests = {}
        for name, cfg in members(out, tasks):
            evaluation = train_member(cfg, out / name, threads=1)["evaluation"]
            h = hashlib.sha256(weights_digest(out / name / "model.safetensors").encode())
            h.update(json.dumps(_without_timings(evaluation["tasks"]), sort_keys=True).encode())
            digests[name] = h.hexdigest()
    whole = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    return {
        "sha256": whole,
        "organisms": organism_prints(digests),
        "members": digests,
        "steps": STEPS,
        "hd_steps": HD_STEPS,
        "torch": torch.__version__,
        "numerics": numerics(),
    }


def organism_prints(digests: dict[str, str]) -> dict[str, str]:
    """Each organism's own fingerprint: the hash of its members' digests (``TASK-MEMBER``), so a
    change to one organism's task or budget leaves the others' results comparable."""
    tasks = dict.fromkeys(name.split("-")[0] for name in digests)
    return {
        task: hashlib.sha256(
            json.dumps({m: d for m, d in digests.items() if m.split("-")[0] == task}, sort_keys=True).encode()
        ).hexdigest()
        for task in tasks
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print this process's training fingerprint as JSON.")
    parser.add_argument("--task", action="append", default=None, help="only this organism's members (repeatable; tests)")
    args = parser.parse_args(argv)
    print(json.dumps(training_fingerprint(tasks=tuple(args.task) if args.task else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
