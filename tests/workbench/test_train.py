"""The training loop: exact resume, divergence, init and expansion, bf16, compile, checkpointing
(data parallel: test_parallel.py)."""

import json
from pathlib import Path

import pytest
import torch
from helpers import FAST, strip_timing
from safetensors.torch import load_file

from workbench.data.tasks import Example, synthetic_examples
from workbench.data.windows import IGNORE, TokenStream, batch_weights, batch_windows
from workbench.runtime.config import build_model
from workbench.runtime.tokenizer import CharTokenizer
from workbench.training.metrics import read_metrics
from workbench.training.runconfig import make_run_config
from workbench.training.strategies import FBTStrategy, HDStrategy, Strategy, ntp_loss
from workbench.training.train import TrainingDiverged, train


def weights(run: Path) -> dict:
    return load_file(str(run / "model.safetensors"))


def config(arch, *extra, steps=12):
    return make_run_config(arch, "debug", "mix", FAST + [f"train.steps={steps}", "train.checkpoint_every=4", *extra])


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,extra",
    [
        ("baseline", []),
        ("fbt", ["fbt.feedback_start=0.25", "fbt.three_pass_fraction=0.5"]),  # the warm switch at step 3
        ("fbt", ["fbt.feedback_start=0.34", "fbt.ramp=0.5"]),  # at step 4, where the resume starts, mid-ramp
        ("hd", ["hd.streams=1,2,3", "hd.expand_at=0,5,9"]),
    ],
)
def test_resume_reaches_the_uninterrupted_weights(tmp_path, arch, extra):
    cfg = config(arch, *extra)
    train(cfg, tmp_path / "straight", progress=False)
    train(cfg, tmp_path / "split", progress=False, stop_after=6)  # checkpoint at 4; steps 5-6 are lost
    assert json.loads((tmp_path / "split" / "train_state" / "state.json").read_text())["step"] == 4
    out = train(cfg, tmp_path / "split", resume=True, progress=False)
    assert out.summary["resumed_from"] == 4
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "split")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert strip_timing(tmp_path / "straight" / "metrics.jsonl") == strip_timing(tmp_path / "split" / "metrics.jsonl")
    switch = [
        (run / "feedback_switch.json").read_text()
        for run in (tmp_path / "straight", tmp_path / "split")
        if (run / "feedback_switch.json").is_file()
    ]
    assert len(switch) == (2 if arch == "fbt" else 0) and len(set(switch)) <= 1


def test_a_resume_from_python_with_other_settings_is_refused_naming_them(tmp_path):
    """``workbench train --resume`` refuses a ``--set`` that changes what the run computes, and a
    zoo refuses a member of other settings; ``train(cfg, resume=True)`` took any ``cfg``, went on
    from the checkpoint under it and published it as the run's config.json, so the file no longer
    said how the weights were trained. How a run executes (``EXECUTION_FIELDS``) may change."""
    from workbench.storage.errors import BadInput
    from workbench.training.runconfig import load_run_config

    cfg = config("baseline", "train.steps=4", "train.checkpoint_every=2")
    train(cfg, tmp_path / "run", progress=False, stop_after=2)
    before = (tmp_path / "run" / "config.json").read_text()
    other = config("baseline", "train.steps=4", "train.checkpoint_every=2", "train.lr=0.5", "train.seed=3")
    with pytest.raises(BadInput, match=r"train\.lr, train\.seed"):
        train(other, tmp_path / "run", resume=True, progress=False)
    assert (tmp_path / "run" / "config.json").read_text() == before
    logged = config("baseline", "train.steps=4", "train.checkpoint_every=2", "train.log_to=none", "train.compile=false")
    assert train(logged, tmp_path / "run", resume=True, progress=False).summary["steps"] == 4
    assert load_run_config(tmp_path / "run" / "config.json").train.lr == cfg.train.lr


def test_the_feedback_passes_weights_ramp_up_from_the_switch():
    """feedback_start 0.3 of 100 steps, ramp 0.1: pass 1 keeps its weight, passes 2-3 get
    (step - 30 + 1) / 10 of theirs from step 30 to 39, then all of it; ramp 0 gives all at once."""
    cfg = make_run_config("fbt", "debug", "mix", FAST + ["train.steps=100", "fbt.feedback_start=0.3", "fbt.ramp=0.1"])
    strategy = FBTStrategy(cfg)
    assert [strategy.ramp(s) for s in (30, 31, 38, 39, 60)] == [0.1, 0.2, 0.9, 1.0, 1.0]
    assert FBTStrategy(make_run_config("fbt", "debug", "mix", FAST + ["fbt.ramp=0"])).ramp(0) == 1.0
    model = build_model("fbt", "debug")
    B, T = cfg.train.batch_size, cfg.train.seq_len
    x, y = torch.randint(0, model.cfg.d_vocab, (2, B, T))
    total, info = strategy.loss(model, x, y, 32, slice(0, B))
    parts = info["loss_pass1"].item() + 0.3 * info["loss_pass2"].item()  # the readings stay on the device until read
    assert info["passes"] == 2 and total.item() == pytest.approx(parts, rel=1e-6)


def test_the_deepest_pass_runs_four_passes_and_weighs_the_fourth_as_the_third():
    """``fbt.deepest=4`` with every feedback batch deep: four passes, the loss the sum of the
    first's and the ramped weights of the others, pass 4 at pass 3's weight (0.5 here)."""
    extra = ["train.steps=100", "fbt.feedback_start=0.3", "fbt.three_pass_fraction=1", "fbt.deepest=4"]
    cfg = make_run_config("fbt", "debug", "mix", FAST + [*extra, "fbt.pass_weights=1,1,0.5"])
    strategy = FBTStrategy(cfg)
    assert {strategy.passes(s) for s in range(30, 60)} == {4} and strategy.passes(29) == 1
    model = build_model("fbt", "debug")
    B, T = cfg.train.batch_size, cfg.train.seq_len
    x, y = torch.randint(0, model.cfg.d_vocab, (2, B, T))
    total, info = strategy.loss(model, x, y, 40, slice(0, B))  # past the ramp: full weights
    parts = info["loss_pass1"].item() + info["loss_pass2"].item() + 0.5 * (info["loss_pass3"].item() + info["loss_pass4"].item())
    assert info["passes"] == 4 and total.item() == pytest.approx(parts, rel=1e-6)


@pytest.mark.slow
def test_a_warm_switch_starts_pass_2_within_twice_pass_1_where_a_cold_one_starts_past_it(tmp_path):
    """Settings where a cold switch is seen: --preset tiny --task mix, seq 64, 150 steps, feedback_start 0.8, every
    step logged. With the warm switch (the default) the first 2-pass step's pass-2 loss is within
    2x its pass-1 loss; feedback_switch.json records the fit and, on the same rows before it, the
    fused loss the cold fusion gives: past 2x the plain loss (the control: a cold switch is seen)."""
    extra = ["train.seq_len=64", "train.steps=150", "fbt.feedback_start=0.8", "train.log_every=1"]
    train(make_run_config("fbt", "tiny", "mix", extra), tmp_path / "warm", progress=False)
    first = next(r for r in read_metrics(tmp_path / "warm" / "metrics.jsonl") if r["passes"] > 1)
    assert first["step"] == 121 and first["loss_pass2"] < 2 * first["loss_pass1"], first
    switch = json.loads((tmp_path / "warm" / "feedback_switch.json").read_text())
    assert switch["step"] == 120 and switch["r2"] > 0.5, switch
    assert switch["loss_fused_cold"] > 2 * switch["loss_plain"] > switch["loss_fused_warm"], switch
    config = json.loads((tmp_path / "warm" / "config.json").read_text())["fbt"]
    assert (config["switch"], config["ramp"]) == ("warm", 0.1)


@pytest.mark.slow
def test_fbt_schedule_logs_per_pass_losses(tmp_path):
    cfg = config("fbt", "fbt.feedback_start=0.5", "fbt.three_pass_fraction=1.0", steps=8)
    train(cfg, tmp_path / "run", progress=False)
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["passes"] for r in rows] == [1, 1, 3, 3]
    assert "loss_pass3" in rows[-1] and "loss_pass2" not in rows[0]
    assert all(set(r) >= {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_rss_mib"} for r in rows)


def poison(monkeypatch, strategy, at_step: int) -> None:
    """Make ``strategy``'s loss NaN at step ``at_step`` (a divergence at a known step)."""
    real = strategy.loss

    def poisoned(self, model, x, y, step, rows, weight=None):
        loss, info = real(self, model, x, y, step, rows, weight)
        if step == at_step:
            loss = loss * float("nan")
            info["loss"] = loss.detach()
        return loss, info

    monkeypatch.setattr(strategy, "loss", poisoned)


@pytest.mark.slow
@pytest.mark.parametrize("log_every", [1, 1000], ids=["read-every-step", "read-at-checkpoints"])
def test_divergence_names_the_step_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, log_every):
    """The host reads the loss on logging and checkpoint steps only: a NaN at step 6
    is still named exactly, and found before the checkpoint at step 8 would be written."""
    poison(monkeypatch, Strategy, at_step=6)
    with pytest.raises(TrainingDiverged, match=r"non-finite loss at step 6 \(loss nan, .*last checkpoint \(step 4\)"):
        train(config("baseline", f"train.log_every={log_every}"), tmp_path / "run", progress=False)
    from workbench import load_model

    load_model(tmp_path / "run")
    assert json.loads((tmp_path / "run" / "train_state" / "state.json").read_text())["step"] == 4


def test_a_divergence_before_a_growth_step_stops_before_the_model_is_grown(tmp_path, monkeypatch):
    """The host reads the losses at logging steps only, but an HD expansion (or FBT's switch) is
    fitted and recorded from the current weights: a NaN at step 1 with logging every 1000 steps
    is named before the expansion at step 3 records losses of a broken model."""
    poison(monkeypatch, HDStrategy, at_step=1)
    cfg = config("hd", "train.log_every=1000", "hd.streams=1,2", "hd.expand_at=0,3", steps=6)
    with pytest.raises(TrainingDiverged, match=r"non-finite loss at step 1 "):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "expansions.json").exists()


@pytest.mark.slow
def test_hd_continues_from_a_baseline_and_expands_cyclically(tmp_path):
    train(config("baseline", steps=4), tmp_path / "base", progress=False)
    cfg = make_run_config(
        "hd", "debug", "mix", FAST + ["train.steps=4", "hd.streams=2,4", "hd.expand_at=0,2"], init_from=str(tmp_path / "base")
    )
    out = train(cfg, tmp_path / "hd4", progress=False)
    assert out.model.n_streams == 4
    saved = json.loads((tmp_path / "hd4" / "config.json").read_text())
    assert saved["model"]["n_streams"] == 4 and saved["init_from"] == str(tmp_path / "base")
    # one middle cross layer: the expansion in training (2 -> 4; 1 -> 2 happened at the init) keeps the
    # function, so the loss does not jump
    jumps = json.loads((tmp_path / "hd4" / "expansions.json").read_text())["expansions"]
    assert [(e["step"], e["from"], e["to"]) for e in jumps] == [(2, 2, 4)]
    assert all(abs(e["loss_after"] - e["loss_before"]) < 1e-6 for e in jumps), jumps
    # two cross layers: the expansion changes the function and the loss jumps
    cfg = make_run_config(
        "hd",
        "debug",
        "mix",
        FAST + ["train.steps=2", "hd.streams=2,4", "hd.expand_at=0,1", "model.cross_layers=0,1"],
        init_from=str(tmp_path / "base"),
    )
    train(cfg, tmp_path / "hd2x", progress=False)
    (jump,) = json.loads((tmp_path / "hd2x" / "expansions.json").read_text())["expansions"]
    assert abs(jump["loss_after"] - jump["loss_before"]) > 1e-5, jump


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,init,extra,match",
    [
        ("hd", "fbt", [], "a 'fbt' run cannot initialise arch 'hd'"),
        ("hd", "baseline", ["model.d_model=64"], "model.d_model=32 there but 64 here"),
        ("baseline", "hd", [], "a 'hd' run cannot initialise arch 'baseline'"),
    ],
)
def test_init_from_a_wrong_run_fails_before_training(tmp_path, arch, init, extra, match):
    train(config(init, steps=2), tmp_path / "src", progress=False)
    cfg = make_run_config(arch, "debug", "mix", FAST + ["train.steps=2", *extra], init_from=str(tmp_path / "src"))
    with pytest.raises(ValueError, match=match):
        train(cfg, tmp_path / "dst", progress=False)
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["data.task=sudoku"], "task='sudoku'"),
        (["train.lr=-0.1"], "lr=-0.1"),
        (["hd.streams=4,2", "hd.expand_at=0,5"], "must be increasing"),
        (["hd.streams=2,4", "hd.expand_at=0,0"], "expand_at"),
        (["train.batch_size=6", "train.grad_accum=4"], "batch_size=6 is not divisible by grad_accum=4"),
        (["train.seq_len=4096"], "seq_len=4096 is longer than the context"),
        (["fbt.three_pass_fraction=1.5"], "three_pass_fraction=1.5"),
        (["fbt.deepest=5"], "deepest=5"),
        (["data.loss_on=prompt"], "loss_on='prompt'"),
        (["data.task=prepared:corpus", "data.loss_on=completion"], "prepared corpus keeps no prompt boundaries"),
        (["data.windows=doc"], "windows='doc'"),
        (["data.loss_weight=task"], "loss_weight='task'"),
    ],
)
def test_bad_configs_fail_before_training(overrides, match):
    with pytest.raises(ValueError, match=match):
        make_run_config("hd", "debug", None, overrides)


@pytest.mark.slow
def test_an_existing_run_is_never_overwritten(tmp_path):
    train(config("baseline", steps=2), tmp_path / "run", progress=False)
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="--resume"):
        train(config("baseline", steps=2), tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before


def test_eval_refuses_to_score_a_run_on_its_own_training_file(tmp_path):
    """A run trained on ``jsonl:FILE`` used to be evaluated on FILE itself: its training examples."""
    from pathlib import Path

    from helpers import FAST, assert_usage_error, cli

    sample = Path(__file__).resolve().parents[1] / "data" / "gsm8k_sample.jsonl"
    sets = [a for s in FAST + ["train.steps=2", "train.seq_len=64"] for a in ("--set", s)]
    code, _, err = cli(
        ["train", "--arch", "baseline", "--preset", "debug", "--task", f"jsonl:{sample}"]
        + ["--out", str(tmp_path / "run"), "--no-progress", *sets]
    )
    assert code is None, err
    assert_usage_error(["eval", str(tmp_path / "run"), "--n", "4"], "would score its own training examples", str(sample))
    same_file = f"jsonl:{sample.parent / '.' / sample.name}"  # the same file by another path
    assert_usage_error(["eval", str(tmp_path / "run"), "--n", "4", "--task", same_file], "would score its own training")
    code, _, err = cli(["eval", str(tmp_path / "run"), "--n", "4", "--task", "chain"])  # a held-out stream is fine
    assert code is None, err


@pytest.mark.parametrize("arch", ["baseline", "fbt", "hd"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(arch):
    from workbench.training.strategies import make_strategy

    cfg = make_run_config(arch, "debug", "mix", FAST + ["fbt.feedback_start=0", "fbt.state_noise=0"])
    x = torch.randint(0, 100, (4, 33))  # inputs and targets of FAST's seq_len=32
    results = []
    for recompute in (False, True):
        model = build_model(arch, "debug", **({"n_streams": 2} if arch == "hd" else {})).train()
        model.checkpoint_blocks = recompute
        loss, _ = make_strategy(cfg).loss(model, x[:, :-1], x[:, 1:], 0, slice(0, 4))
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b) and grads_a.keys() == grads_b.keys()
    for name in grads_a:  # recomputation replays the same kernels on the same inputs
        assert torch.allclose(grads_a[name], grads_b[name], rtol=0, atol=1e-7), name


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["baseline", "fbt", "hd"])
def test_bf16_autocast_on_cpu_trains_within_a_stated_tolerance_of_fp32(tmp_path, arch):
    """bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ~ 0.2%); over 20 steps the loss curves
    of a debug model stay within 2% of fp32's (measured: see the assertion's message)."""
    losses = {}
    for bf16 in (False, True):
        cfg = config(arch, f"train.cpu_bf16={bf16}", "train.log_every=1", steps=20)
        train(cfg, tmp_path / f"{arch}-{bf16}", progress=False)
        losses[bf16] = [r["loss"] for r in read_metrics(tmp_path / f"{arch}-{bf16}" / "metrics.jsonl")]
    worst = max(abs(a - b) / a for a, b in zip(losses[False], losses[True]))
    assert losses[False] != losses[True] and worst < 0.02, f"largest relative loss difference {worst:.4f}"


@pytest.mark.slow
def test_compiled_training_gives_the_eager_losses_within_rounding(tmp_path):
    """train.compile=true (each block through torch.compile, CPU inductor) for 4 FBT steps, two of
    them 2-pass so a compiled block runs twice per forward: the losses and the weights are
    eager's up to the reassociation inductor's fused kernels may do (measured: bit for bit on
    this CPU, where the matmuls stay aten's; 1e-5 allows a backend that reorders sums)."""
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    counters.clear()
    runs = {}
    for compiled in (False, True):
        cfg = config("fbt", f"train.compile={compiled}", "fbt.feedback_start=0.5", "train.log_every=1", steps=4)
        out = train(cfg, tmp_path / str(compiled), progress=False)
        runs[compiled] = [r["loss"] for r in read_metrics(tmp_path / str(compiled) / "metrics.jsonl")], out.model
    (eager, eager_model), (compiled, compiled_model) = runs[False], runs[True]
    worst = max(abs(a - b) / a for a, b in zip(eager, compiled))
    assert worst < 1e-5, f"largest relative loss difference {worst:.2e}"
    assert [r["passes"] for r in read_metrics(tmp_path / "True" / "metrics.jsonl")] == [1, 1, 2, 2]
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(
        counters["graph_break"]
    )  # compiled, whole
    for (name, a), b in zip(eager_model.state_dict().items(), compiled_model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,extra,graphs",
    [
        # one graph for every step: 1-, 2- and 3-pass steps, before and after the warm switch at step 10
        ("fbt", ["fbt.feedback_start=0.5", "fbt.three_pass_fraction=0.5"], 1),
        # one per block kind (intra- and cross-stream) and stage: the expansion at step 10 doubles the length
        ("hd", ["hd.streams=1,2", "hd.expand_at=0,10"], 4),
    ],
)
def test_compiled_training_compiles_each_shape_once(tmp_path, arch, extra, graphs):
    """20 compiled training steps through FBT's switch or HD's expansion: the blocks compile whole
    (``fullgraph``), and only for a new shape or block kind; the growth's one-off forwards (the
    switch's fit and records, the expansion's) run eagerly and add no graph."""
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    counters.clear()
    cfg = config(arch, "train.compile=true", "train.checkpoint_every=20", *extra, steps=20)
    train(cfg, tmp_path / "run", progress=False)
    assert counters["stats"]["unique_graphs"] == graphs and not counters["graph_break"], dict(counters["stats"])


# ---- data.loss_on -------------------------------------------------------------------------


def test_completion_only_streams_score_exactly_the_completions():
    """Hand-written examples whose prompts and answers share no character: a completion-only
    stream scores each answer's characters and <eos>, nothing of a prompt, and in every training
    window a target is scored exactly when it is one of those."""
    tok = CharTokenizer()
    examples = [Example("x", "ab=", "Z", "Z", 1), Example("x", "cde=", "YX", "YX", 1)] * 8
    stream = TokenStream.from_examples(examples, tok, completion_only=True)
    assert stream.scored is not None and TokenStream.from_examples(examples, tok).scored is None
    scored = [tok.decode([int(i)]) if i != tok.eos_id else "<eos>" for i in stream.ids[stream.scored]]
    assert scored == ["Z", "<eos>", "Y", "X", "<eos>"] * 8
    answer_ids = {tok.eos_id, *tok.encode("ZYX")}
    x, y = batch_windows(stream, seed=0, step=0, batch_size=16, seq_len=6)
    assert (y == IGNORE).any() and (y != IGNORE).any()
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        for t in range(5):  # the raw target of position t is the input at t + 1
            assert (row_y[t] != IGNORE) == (row_x[t + 1] in answer_ids)
            assert row_y[t] in (IGNORE, row_x[t + 1])


def test_example_weights_give_each_example_one_unit():
    """Weighting examples: each example's scored targets share a weight of 1 (a 2-target answer
    0.5 each, the 4-target one 0.25 each); unscored targets weigh 0; in a batch the weights sit
    exactly where the targets are scored."""
    tok = CharTokenizer()
    examples = [Example("x", "ab=", "Z", "Z", 1), Example("x", "cde=", "YXW", "YXW", 1)] * 8
    stream = TokenStream.from_examples(examples, tok, completion_only=True, example_weight=True)
    assert stream.weight is not None
    first = stream.weight[: 5 + 8].tolist()  # "ab=Z" <eos>, "cde=YXW" <eos>
    assert first == [0, 0, 0, 0.5, 0.5] + [0, 0, 0, 0, 0.25, 0.25, 0.25, 0.25]
    whole = TokenStream.from_examples(examples, tok, example_weight=True).weight
    assert whole is not None and whole[:5].tolist() == pytest.approx([0.2] * 5) and whole.sum() == pytest.approx(16)
    _, y = batch_windows(stream, 0, 2, 8, 6)
    w = batch_weights(stream, 0, 2, 8, 6)
    assert w is not None and ((w > 0) == (y != IGNORE)).all()
    assert batch_weights(TokenStream.from_examples(examples, tok), 0, 2, 8, 6) is None


def test_the_weighted_loss_is_the_weighted_mean_by_hand():
    logits = torch.randn(1, 4, 7)
    targets = torch.tensor([[1, IGNORE, 3, 0]])
    weight = torch.tensor([[0.5, 0.0, 0.25, 0.25]])
    each = [-torch.log_softmax(logits[0, t], -1)[int(targets[0, t])] for t in (0, 2, 3)]
    want = (0.5 * each[0] + 0.25 * each[1] + 0.25 * each[2]) / 1.0
    torch.testing.assert_close(ntp_loss(logits, targets, weight), want, rtol=1e-6, atol=0)


def test_the_loss_is_the_mean_over_scored_targets_and_zero_where_none_is():
    logits = torch.randn(2, 5, 7, requires_grad=True)
    targets = torch.tensor([[1, IGNORE, 3, IGNORE, 0], [IGNORE] * 5])
    keep = targets != IGNORE
    want = torch.nn.functional.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(ntp_loss(logits, targets), want, rtol=1e-6, atol=0)
    none = ntp_loss(logits, torch.full((2, 5), IGNORE))
    none.backward()
    assert none.item() == 0.0 and logits.grad is not None and not logits.grad.any()


@pytest.mark.parametrize("weighting", ["token", "example"])
def test_completion_only_accumulation_reaches_the_whole_batch_weights(tmp_path, weighting):
    """With loss_on=completion the micro-batches of a step score different numbers of targets
    (and, weighting examples, different total weights); each is scaled by its share, so
    accumulating two halves reaches the weights of the whole batch up to summation order (1e-6,
    as in test_parallel.py). Unscaled means of the halves would move them by ~1e-4."""
    extra = ["train.steps=3", "train.batch_size=8", "data.loss_on=completion", f"data.loss_weight={weighting}"]
    for name, accum in (("one", 1), ("accum", 2)):
        cfg = make_run_config("baseline", "debug", "modsum", FAST + extra + [f"train.grad_accum={accum}"])
        train(cfg, tmp_path / name, progress=False)
    one, accum = weights(tmp_path / "one"), weights(tmp_path / "accum")
    for k in one:
        torch.testing.assert_close(one[k], accum[k], atol=1e-6, rtol=0, msg=k)
    assert json.loads((tmp_path / "one" / "config.json").read_text())["data"]["loss_on"] == "completion"


def test_example_windows_start_where_examples_start():
    """With example_starts every training window begins with a prompt's first character, and the
    windows reach examples throughout the stream (not only the first)."""
    tok = CharTokenizer()
    examples = [Example("x", f"{c}b=", "Z", "Z", 1) for c in "PQRSTUVW"] * 4
    stream = TokenStream.from_examples(examples, tok, example_starts=True)
    x, _ = batch_windows(stream, seed=0, step=3, batch_size=32, seq_len=7)
    firsts = {tok.decode([int(i)]) for i in x[:, 0]}
    assert firsts <= set("PQRSTUVW") and len(firsts) >= 6
    anywhere = {tok.decode([int(i)]) for i in batch_windows(TokenStream.from_examples(examples, tok), 0, 3, 32, 7)[0][:, 0]}
    assert not anywhere <= set("PQRSTUVW")  # the default cuts anywhere


def test_completion_only_flipflop_scores_the_answer_of_every_query():
    """A flip-flop prompt answers its earlier queries; completion-only training scores those
    answers (the character after each '?c'), the final answer and <eos>, and nothing else."""
    tok = CharTokenizer()
    examples = synthetic_examples("flipflop", 20, seed=0)
    stream = TokenStream.from_examples(examples, tok, completion_only=True)
    assert stream.scored is not None
    at = 0
    for ex in examples:
        text = ex.text + "\0"  # <eos>
        want = [i > 0 and (text[i - 2] == "?" or i == len(text) - 1) for i in range(len(text))]
        assert stream.scored[at : at + len(text)].tolist() == want
        at += len(text)
    assert sum(len(ex.prompt_answers) for ex in examples) > 10  # the sample has earlier queries
