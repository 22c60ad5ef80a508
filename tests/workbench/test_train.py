"""The training loop: exact resume, divergence, init and expansion, bf16, compile, checkpointing
(data parallel: test_parallel.py)."""

import json
from pathlib import Path

import pytest
import torch
from helpers import FAST, strip_timing
from safetensors.torch import load_file

from workbench.runtime.config import build_model
from workbench.training.metrics import read_metrics
from workbench.training.runconfig import make_run_config
from workbench.training.train import Strategy, TrainingDiverged, train


def weights(run: Path) -> dict:
    return load_file(str(run / "model.safetensors"))


def config(arch, *extra, steps=12):
    return make_run_config(arch, "debug", "mix", FAST + [f"train.steps={steps}", "train.checkpoint_every=4", *extra])


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,extra",
    [
        ("baseline", []),
        ("fbt", ["fbt.feedback_start=0.25", "fbt.three_pass_fraction=0.5"]),
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


@pytest.mark.slow
def test_fbt_schedule_logs_per_pass_losses(tmp_path):
    cfg = config("fbt", "fbt.feedback_start=0.5", "fbt.three_pass_fraction=1.0", steps=8)
    train(cfg, tmp_path / "run", progress=False)
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["passes"] for r in rows] == [1, 1, 3, 3]
    assert "loss_pass3" in rows[-1] and "loss_pass2" not in rows[0]
    assert all(set(r) >= {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_rss_mib"} for r in rows)


@pytest.mark.slow
def test_divergence_names_the_step_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    real = Strategy.loss

    def poisoned(self, model, x, y, step, rows):
        loss, info = real(self, model, x, y, step, rows)
        if step == 6:
            loss = loss * float("nan")
            info["loss"] = float("nan")
        return loss, info

    monkeypatch.setattr(Strategy, "loss", poisoned)
    with pytest.raises(TrainingDiverged, match=r"at step 6 .*last checkpoint \(step 4\)"):
        train(config("baseline"), tmp_path / "run", progress=False)
    from workbench import load_model

    load_model(tmp_path / "run")
    assert json.loads((tmp_path / "run" / "train_state" / "state.json").read_text())["step"] == 4


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
    from workbench.training.train import make_strategy

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
    assert counters["frames"]["ok"] >= 1 and not counters["graph_break"], dict(counters["graph_break"])  # compiled, whole
    for (name, a), b in zip(eager_model.state_dict().items(), compiled_model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)
