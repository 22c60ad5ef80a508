"""What the tests share (fixtures live in ``conftest.py``): random token batches, the FBT ground
truth computed without a cache, a tally per fault class of the inputs tried, the faults injected and
the data lost (which must stay zero), printed at the end of every pytest session that touched it
(see ``conftest.pytest_terminal_summary``), and helpers that run the CLI in-process and compare
directories before and after a fault."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from pathlib import Path

import torch

from workbench.cli import main
from workbench.runtime.checkpoint import load_weights, save_weights

FAULT_ARCHS = {"baseline": {}, "fbt": {}, "hd": {"n_streams": 2}}  # the architectures a fault suite damages
RUN_FAULTS = "checkpoints, resume, kills, NaN steps, rollouts, CLI fuzz"  # one fault class, several suites
FAST = ["train.batch_size=4", "train.seq_len=32", "train.warmup=3", "train.log_every=2", "data.n_train=300"]  # tiny runs
W, C, T = "model.safetensors", "config.json", "tokenizer.json"  # a checkpoint's files
VOCAB = 100  # ids the character tokenizer uses; every preset has d_vocab 128


def tokens(batch=2, length=12, seed=0):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def sequential_fbt_states(model, toks, fuse_start=0):
    """The FBT ground truth computed without a cache: at each step re-run the whole prefix on the
    explicit fused inputs u_0..u_t. u_t = e_t for t < max(fuse_start, 1)."""
    embed = model.embed(toks)
    inputs, states = [], []
    B, L = toks.shape
    for t in range(L):
        e = embed[:, t : t + 1]
        if t < max(fuse_start, 1):
            u = e
        else:
            u = model.fusion(states[-1][:, None], e, torch.ones(B, 1, dtype=torch.bool))
        inputs.append(u)
        prefix = toks[:, : t + 1]
        h = model.run_stack(torch.cat(inputs, dim=1), model.context(prefix, None, None))
        states.append(h[:, -1])
    return torch.stack(states, dim=1)


TALLY: dict[str, Counter] = {}


def tally(fault_class: str) -> Counter:
    """The counter of one fault class: keys ``inputs_tried``, ``faults_injected``, ``data_lost``."""
    return TALLY.setdefault(fault_class, Counter(inputs_tried=0, faults_injected=0, data_lost=0))


def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def stamps(directory: Path) -> dict:
    """Size and modification time of every file: any write changes them (a cheap snapshot)."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(directory).rglob("*"))}


def assert_nothing_lost(before: dict, after: dict, counts: Counter) -> None:
    if before != after:
        counts["data_lost"] += 1
    assert before == after, sorted(set(before.items()) ^ set(after.items()))


def cli(argv: list[str]) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of ``workbench ARGV`` run in-process; None when it returned."""
    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def assert_usage_error(argv: list[str], *named: str, match: str = "") -> str:
    """``workbench ARGV`` exits 2 with one line ``workbench VERB: error: ...`` naming ``named``."""
    code, _, err = cli(argv)
    assert code == 2 and "Traceback" not in err, err
    message = err.strip()
    assert "\n" not in message and message.startswith(f"workbench {argv[0]}: error:"), err
    for text in named:
        assert text in message, message
    assert not match or re.search(match, message), message
    return message


# ---- faults applied to a file -----------------------------------------------------------


def truncate(keep):
    return lambda p: p.write_bytes(
        p.read_bytes()[:keep] if isinstance(keep, int) else p.read_bytes()[: int(len(p.read_bytes()) * keep)]
    )


def flip(offset):
    def change(p):
        data = bytearray(p.read_bytes())
        data[offset] ^= 0xFF
        p.write_bytes(bytes(data))

    return change


def write(content):
    return lambda p: p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)


def remove(p):
    p.unlink()


def a_directory(p):
    p.unlink()
    p.mkdir()


def edit_json(change):
    def edit(p):
        data = json.loads(p.read_text())
        change(data)
        p.write_text(json.dumps(data))

    return edit


def edit_model(**fields):
    return edit_json(lambda c: c["model"].update(fields))


def nan_weight(p):  # a diverged model saved with a valid checksum
    tensors, meta = load_weights(p)
    tensors[sorted(tensors)[0]].view(-1)[0] = float("nan")
    save_weights(p, tensors, meta)


def other_arch(p):
    edit_json(lambda c: c.update(arch={"baseline": "fbt", "fbt": "baseline", "hd": "fbt"}[c["arch"]]))(p)


MACHINE_FIELDS = ("tokens_per_s", "tflops_per_s", "mfu", "peak_rss_mib")  # metrics fields that measure the machine, not the run


def strip_timing(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in MACHINE_FIELDS} for line in path.read_text().splitlines()]


def gaussian_rows(n_seq=120, per_seq=20, d=16, seed=0, n_types=50):
    """Probe inputs: X [n_seq * per_seq, d] standard normal, sequence ids, random token ids, and the
    generator (for labels drawn after them)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_seq * per_seq, d))
    groups = np.repeat(np.arange(n_seq), per_seq)
    tokens = rng.integers(0, n_types, size=len(X))
    return X, groups, tokens, rng


def fair_study(
    loss_gap: float, qualified: int = 5, seeds: int = 5, log_steps: float = -0.5, fbt_qualified: int | None = None
) -> dict:
    """A fair study whose FBT-minus-baseline training loss differs by ``loss_gap`` at every seed
    (plus seed noise of sd 0.01), its other comparisons null; ``qualified`` baselines and
    ``fbt_qualified`` FBT runs (default: all) reach their targets; after the switch FBT needs
    exp(``log_steps``) times the baseline's steps to the loss threshold (seed noise of sd 0.05)."""
    import numpy as np

    from workbench.experiments.fair_readings import AFTER_SWITCH
    from workbench.training import stats

    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.05, size=(seeds, 1))
    cells = {
        "fbt - baseline: plain-pass training loss, last half": stats.paired_difference(
            base, base + loss_gap + rng.normal(0, 0.01, size=(seeds, 1))
        ),
        AFTER_SWITCH: stats.paired_difference(np.zeros((seeds, 1)), log_steps + rng.normal(0, 0.05, size=(seeds, 1))),
    }
    correct = rng.integers(0, 2, size=(seeds, 200)).astype(float)
    cells["fbt fused - baseline: accuracy"] = stats.paired_difference(correct, rng.permuted(correct, axis=1), bounds=(-1, 1))
    fbt_qualified = seeds if fbt_qualified is None else fbt_qualified
    models = {
        **{
            f"baseline-seed{s}": {"member": "baseline", "seed": s, "competence": {"qualified": s < qualified}}
            for s in range(seeds)
        },
        **{f"fbt-seed{s}": {"member": "fbt", "seed": s, "competence": {"qualified": s < fbt_qualified}} for s in range(seeds)},
    }
    return {"study": "fbt-vs-baseline", "models": models, "family": stats.family(cells)}
