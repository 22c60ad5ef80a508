"""Defects found in review, each pinned by a test that failed before its fix."""

import json

import pytest
import torch
from helpers import tokens

from models import expand_streams
from workbench import build_model
from workbench.runtime.export import export_hf

# ---- 1. the export's "exact" flag agrees with an actual logits comparison ------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: build_model("baseline", "debug", seed=3),
        lambda: expand_streams(build_model("baseline", "debug", seed=3), 1),
        lambda: build_model("hd", "debug", seed=3, n_streams=1, cross_window=2),
        lambda: build_model("hd", "debug", seed=3, n_streams=1, cross_window=2, cross_layers=(0, 1)),
        lambda: build_model(
            "hd", "debug", seed=3, n_streams=1, cross_window=128
        ),  # a window as long as the context restricts nothing
        lambda: build_model("hd", "debug", seed=3, n_streams=1, positions="interleaved", readout="sum"),
        lambda: build_model("hd", "debug", seed=3, n_streams=2),
    ],
    ids=["baseline", "hd1", "hd1-window2", "hd1-window2-all-cross", "hd1-window-n_ctx", "hd1-interleaved-sum", "hd2"],
)
def test_export_exact_flag_matches_the_exported_logits(make, tmp_path):
    from transformers import LlamaForCausalLM

    model = make()
    out = export_hf(model, tmp_path / "hf")
    hf = LlamaForCausalLM.from_pretrained(out).eval()
    toks = tokens(2, model.cfg.n_ctx)  # the whole context: a window shorter than it must show
    with torch.no_grad():
        gap = (hf(toks).logits - model(toks)).abs().max().item()
    note = json.loads((out / "workbench_export.json").read_text())
    assert note["exact"] == (gap < 1e-4), (note, gap)
    if not note["exact"] and model.arch == "hd" and model.n_streams == 1:
        assert any("cross_window" in d for d in note["dropped"]), note


# ---- 2. run_with_pass_cache: entry k of every hook is pass k + 1 -----------------------------------


def _hand_run(model, toks, k, past):
    """Every hook's last value and firing count in a k-pass call, whose last pass is pass k
    (TransformerLens's cache keeps a hook's last firing). ``past``: tokens run into a cache first."""
    cache = None
    if past is not None:
        cache = model.make_cache()
        model(past, cache=cache)
    counts = dict.fromkeys(model.hook_dict, 0)

    def count(x, hook):
        counts[hook.name] += 1

    for hp in model.hook_dict.values():
        hp.add_hook(count, dir="fwd")
    try:
        logits, tl = model.run_with_cache(toks, passes=k, cache=cache)
    finally:
        model.reset_hooks()
    return logits, tl, counts


@pytest.mark.parametrize("with_past", [False, True], ids=["prompt", "after-a-cached-past"])
def test_pass_cache_entry_k_is_pass_k_plus_one_for_every_hook(with_past):
    from workbench import run_with_pass_cache

    model = build_model("fbt", "debug", seed=4)
    toks, past = tokens(2, 7, seed=1), (tokens(2, 5, seed=2) if with_past else None)
    passes = 3
    with torch.no_grad():
        cache = None
        if with_past:
            cache = model.make_cache()
            model(past, cache=cache)
        logits, per_pass = run_with_pass_cache(model, toks, None, passes=passes, cache=cache)
        hand = {k: _hand_run(model, toks, k, past) for k in range(1, passes + 1)}
    torch.testing.assert_close(logits, hand[passes][0])
    assert set(per_pass) == {name for name, n in hand[passes][2].items() if n}  # every hook that fired at all
    for name, entries in per_pass.items():
        # the hook ran in pass k when a k-pass call fires it more often than a (k-1)-pass call
        fired = [k for k in range(1, passes + 1) if hand[k][2][name] > (hand[k - 1][2][name] if k > 1 else 0)]
        assert list(entries) == [k - 1 for k in fired], name  # 0-based pass index, only passes that ran it
        for k in fired:
            torch.testing.assert_close(entries[k - 1], hand[k][1][name], atol=1e-6, rtol=0, msg=f"{name}, pass {k}")
    if not with_past:  # no carried state: the fusion runs in passes 2..K only
        assert list(per_pass["fusion.hook_state"]) == [1, 2] and list(per_pass["hook_embed"]) == [0]
        with torch.no_grad():
            states = model.run_passes(toks, passes)
        for k in (1, 2):  # pass k + 1 reads pass k's states shifted right by one, zeros at position 0
            torch.testing.assert_close(per_pass["fusion.hook_state"][k][:, 1:], states[k - 1][:, :-1])
            assert not per_pass["fusion.hook_state"][k][:, 0].any()
    else:  # the first position fuses the cached state in every pass
        assert list(per_pass["fusion.hook_state"]) == [0, 1, 2]


def test_recorder_by_pass_refuses_a_hook_that_skipped_passes():
    from workbench import ActivationRecorder

    model = build_model("fbt", "debug")
    with torch.no_grad(), ActivationRecorder(model, ["blocks.0.hook_resid_pre", "fusion.hook_gate"]) as rec:
        model(tokens(1, 6), passes=3)
    assert rec.by_pass("blocks.0.hook_resid_pre").shape[0] == 3
    assert sorted(rec.per_pass("fusion.hook_gate")) == [1, 2]
    with pytest.raises(ValueError, match=r"fusion.hook_gate.*passes \[2, 3\] of 3.*per_pass"):
        rec.by_pass("fusion.hook_gate")


# ---- 3. which positions K passes make exact, as the docs state it ----------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _prose_files():
    files = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "models").glob("*.py")),
        *sorted((ROOT / "workbench").rglob("*.py")),
    ]
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(nb)
    return files


def test_no_doc_says_k_passes_make_the_first_k_fused_positions_exact():
    """With a plain prefix of p >= 1 positions, K passes make the positions below p + K - 1 exact:
    the prefix and the first K - 1 fused positions, not the first K."""
    import re

    wrong = re.compile(r"first (k|K) positions of the fused region", re.I)
    bad = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in _prose_files() for m in wrong.finditer(path.read_text())]
    assert not bad, bad
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    assert "p + K - 1" in concepts


@pytest.mark.parametrize("p", [1, 3])
def test_k_passes_make_exactly_the_positions_below_p_plus_k_minus_one_exact(p):
    from helpers import sequential_fbt_states

    model = build_model("fbt", "debug", dtype=torch.float64)
    toks = tokens(1, 9)
    fuse = (torch.arange(9) >= p)[None]
    with torch.no_grad():
        truth = sequential_fbt_states(model, toks, p)
        for K in (1, 2, 4):
            err = (model.run_passes(toks, K, fuse_mask=fuse)[-1] - truth).abs().amax(dim=(0, 2))
            exact = (err < 1e-12).tolist()
            assert exact == [t < p + K - 1 for t in range(9)], (p, K, err)


# ---- 4. bench: CUDA-synchronised timing (the FLOP count: test_flops.py) ------------------------------------


def test_bench_time_runs_on_cpu_without_touching_cuda():
    from workbench.bench.timing import _time

    ran = []
    t = _time(lambda: ran.append(1), torch.device("cpu"))
    assert ran == [1] and t >= 0
    assert _time(lambda: None, "cpu") >= 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_time_waits_for_queued_cuda_work():
    from workbench.bench.timing import _time

    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()

    def launch():  # returns as soon as the kernels are queued
        for _ in range(20):
            a @ a

    t = _time(launch, torch.device("cuda"))
    assert torch.cuda.current_stream().query(), "_time returned before the queued kernels finished"
    torch.cuda.synchronize()
    started = __import__("time").perf_counter()
    launch()
    torch.cuda.synchronize()
    assert t >= 0.5 * (__import__("time").perf_counter() - started)  # the timed span covers the kernels


# ---- 5. held-out problems come from their own random stream, not from a shifted training seed --------

TRAIN_SEEDS_TRIED = (0, 1, 7, 10_000, 10_001, 10_007, 12_345, 20_000)


def _large_space(ex) -> bool:
    """Problems drawn from a space of millions, where two independent streams of a few hundred
    share none by chance: chain with 4 steps, modsum with 7+ digits, flip-flop with 8+
    instructions. The rest of each task's space is small (chain's one-step problems number about
    650, modsum's 4-digit strings 10,000), so independent streams do share some of those by
    chance; there the test checks the streams' independence instead (no aligned or shifted copy)."""
    return ex.difficulty >= {"chain": 4, "modsum": 7, "flipflop": 8}[ex.task]


@pytest.mark.parametrize("task", ["chain", "modsum", "flipflop"])
@pytest.mark.parametrize("seed", [0, 7])
def test_heldout_examples_are_not_any_training_seeds_examples(task, seed):
    from workbench.data.splits import heldout_examples
    from workbench.data.tasks import synthetic_examples

    n = 300
    held = heldout_examples(task, n, seed)
    assert len(held) == n and all(ex.task == task for ex in held)
    assert [ex.text for ex in heldout_examples(task, n, seed)] == [ex.text for ex in held]  # reproducible
    held_texts = {ex.text for ex in held if _large_space(ex)}
    assert len(held_texts) > n // 5
    for train_seed in sorted({seed, seed + 10_000, *TRAIN_SEEDS_TRIED}):
        for source in (task, "mix"):  # a run trains on one task or on the mixture
            train = synthetic_examples(source, n, train_seed)
            shared = held_texts & {ex.text for ex in train}
            assert not shared, (task, seed, source, train_seed, sorted(shared)[:3])
            if source == task:  # independence: not the same stream, not a shifted copy of it
                same = sum(a.text == b.text for a, b in zip(held, train))
                assert same <= n // 20, (task, seed, train_seed, same)
                for shift in range(1, 4):
                    assert sum(a.text == b.text for a, b in zip(held[shift:], train)) <= n // 20


def test_training_stream_is_unchanged_by_the_split():
    import random

    from workbench.data.tasks import TaskConfig, make_modsum, synthetic_examples

    rng = random.Random("modsum:3")  # the stream existing runs were trained on
    want = [make_modsum(rng, TaskConfig()).text for _ in range(20)]
    assert [ex.text for ex in synthetic_examples("modsum", 20, 3)] == want
    assert [ex.text for ex in synthetic_examples("modsum", 20, 3, split="train")] == want
    with pytest.raises(ValueError, match="split 'test'"):
        synthetic_examples("modsum", 2, 3, split="test")


def test_no_study_derives_heldout_data_from_seed_arithmetic():
    import workbench.data.splits as splits

    assert not hasattr(splits, "EVAL_SEED_OFFSET")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "workbench").rglob("*.py") if "EVAL_SEED_OFFSET" in p.read_text()]
    assert not offenders, offenders


def test_studies_read_the_heldout_stream():
    from workbench.data.splits import heldout_examples
    from workbench.studies.traces import problems

    chain = problems("chain", 6, [2, 3], seed=5)
    assert [ex.difficulty for ex in chain] == [2, 3, 2, 3, 2, 3]
    from workbench.data.splits import heldout_rng
    from workbench.data.tasks import TaskConfig, make_chain

    rng = heldout_rng("traces", 5)
    assert [ex.text for ex in chain] == [make_chain(rng, TaskConfig(chain_max_steps=3), d).text for d in [2, 3, 2, 3, 2, 3]]
    assert heldout_examples("mix", 4, 0)[0].task in ("chain", "modsum", "flipflop")


# ---- 6. notebook 01 describes what the plot functions do to matplotlib ---------------------------


@pytest.mark.slow
def test_plot_functions_leave_the_matplotlib_backend_alone(tmp_path):
    import subprocess
    import sys

    script = f"""
import sys, matplotlib
matplotlib.use("svg")
from workbench.probing.study import plot_probe_rows
rows = [dict(prefill="standard", passes=1, stream=0, layer=d, accuracy=0.5, control_accuracy=0.9, chance=0.3) for d in (0, 1)]
plot_probe_rows(rows, __import__("pathlib").Path({str(tmp_path / "p.png")!r}), "t")
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert "matplotlib.pyplot" not in sys.modules
"""
    subprocess.run(
        [sys.executable, "-c", script], check=True, cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    )
    assert (tmp_path / "p.png").stat().st_size > 0
    for path in (ROOT / "workbench").rglob("*.py"):
        text = path.read_text()
        assert "matplotlib.use(" not in text and "pyplot" not in text.replace("no pyplot", ""), path


def test_notebook_01_does_not_claim_the_plot_functions_switch_to_agg():
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "01_layer0_probes.ipynb", as_version=4)
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Agg" not in prose
    assert "pyplot" in prose and "backend" in prose  # it says what they do instead
