"""The training FLOP formula (``workbench.training.flops``) against a hand count and against
torch's FlopCounterMode, and the MFU the metrics report with it."""

import pytest
import torch
from helpers import FAST
from torch.nn.attention import SDPBackend, sdpa_kernel

from workbench.bench.train_steps import counted_train_flops
from workbench.runtime.config import build_model
from workbench.training.flops import peak_flops, train_flops_per_token
from workbench.training.metrics import read_metrics
from workbench.training.runconfig import make_run_config
from workbench.training.strategies import make_strategy
from workbench.training.train import train


def test_the_formula_on_a_hand_counted_model():
    model = build_model("baseline", "debug")  # d_model 32, 2 layers, d_mlp 96, d_vocab 128, tied
    # per block Q, K, V, O 4*32*32 = 4096 and SwiGLU 3*32*96 = 9216 entries; the readout 128*32 = 4096
    # (the input embedding is a lookup); norm gains are not matrices: 2 * 13312 + 4096 = 30720
    # 6 x 30720 + attention 12 * n_layers * d_model * seq at seq 64 = 184320 + 49152
    assert train_flops_per_token(model, 64) == 6 * 30720 + 12 * 2 * 32 * 64 == 233472


@pytest.mark.parametrize(
    "arch,extra,streams",
    [
        ("baseline", [], 1),
        ("fbt", ["fbt.three_pass_fraction=0"], 1),  # K = 2: the fusion once
        ("fbt", ["fbt.three_pass_fraction=1"], 1),  # K = 3: the fusion twice
        ("hd", ["hd.streams=2"], 2),  # intra-stream layer 0, cross-stream layer 1
        ("hd", ["hd.streams=3", "hd.supervise=all"], 3),
        ("hd", ["hd.streams=3", "model.cross_window=5"], 3),
        ("hd", ["hd.streams=3", "model.kv_mirror=1"], 3),  # layer 1 (cross-stream) runs the last stream only
    ],
)
def test_the_formula_counts_what_torch_counts_running_the_step(arch, extra, streams):
    """Each strategy's FLOPs per token x tokens == FlopCounterMode's count of the training loss's
    forward and backward, exactly, with SDPA on its math backend (so attention's QK^T and AV are
    matmuls the counter sees; the math backend multiplies whole windows, as the formula counts;
    a cross-stream window is applied as a mask, so it computes the full window too)."""
    B, T = 2, 16
    cfg = make_run_config(arch, "debug", "chain", [f"train.batch_size={B}", f"train.seq_len={T}", "fbt.feedback_start=0", *extra])
    hd = {"n_streams": streams, "cross_window": cfg.model.cross_window, "kv_mirror": cfg.model.kv_mirror} if arch == "hd" else {}
    model = build_model(arch, "debug", **hd)
    strategy = make_strategy(cfg)
    x = torch.randint(0, 100, (B, T + 1))
    with sdpa_kernel(SDPBackend.MATH):
        counted = counted_train_flops(lambda: strategy.loss(model.train(), x[:, :-1], x[:, 1:], 5, slice(0, B))[0])
    assert strategy.flops_per_token(model, 5) * B * T == counted


def test_metrics_report_flops_and_mfu_per_logging_interval(tmp_path):
    """Each metrics line: tokens/s and TFLOP/s over its interval, related by the formula; MFU
    against ``train.peak_tflops`` when set, and none on a CPU without it (no known peak)."""
    assert peak_flops(torch.device("cpu")) is None and peak_flops(torch.device("cpu"), 2.5) == 2.5e12
    for peak in (0.0, 0.001):
        cfg = make_run_config("baseline", "debug", "mix", FAST + ["train.steps=4", f"train.peak_tflops={peak}"])
        out = train(cfg, tmp_path / str(peak), progress=False)
        per_token = train_flops_per_token(out.model, cfg.train.seq_len)
        for r in read_metrics(tmp_path / str(peak) / "metrics.jsonl"):
            assert r["tflops_per_s"] * 1e12 == pytest.approx(r["tokens_per_s"] * per_token, rel=1e-9)
            assert ("mfu" in r) == (peak > 0)
            if peak:
                assert r["mfu"] == pytest.approx(r["tflops_per_s"] / peak, rel=1e-9)
