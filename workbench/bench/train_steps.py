"""The training keys' pieces: one optimiser step per architecture, the FLOP count, transformers' Llama."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable

import torch

from models import PRESETS
from workbench.bench.timing import paired
from workbench.runtime.config import build_model
from workbench.training.runconfig import make_run_config
from workbench.training.strategies import FBTStrategy


def optimiser_step(model, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], sizes: dict, seed: int = 0) -> Callable:
    """One optimiser step on a fixed random batch: ``loss(x, y)``, backward, AdamW; on the model's
    device, in bf16 autocast on CUDA (as training runs there)."""
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, 100, (sizes["batch"], sizes["seq"]), generator=g).to(device)
    y = torch.randint(4, 100, (sizes["batch"], sizes["seq"]), generator=g).to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()

    def step():
        with autocast:
            value = loss(x, y)
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


class _FixedPasses(FBTStrategy):
    """The training loop's FBT loss at one fixed pass count (the schedule would mix counts)."""

    def __init__(self, cfg, passes: int):
        super().__init__(cfg)
        self.fixed = passes

    def passes(self, step: int) -> int:
        return self.fixed


def _fbt_train_step(preset: str, sizes: dict, passes: int, device: str = "cpu") -> Callable:
    """The training loop's FBT loss with ``passes`` passes."""
    cfg = make_run_config("fbt", preset, "chain", [f"train.batch_size={sizes['batch']}", f"train.seq_len={sizes['seq']}"])
    model = build_model("fbt", preset, device=device)
    strategy = _FixedPasses(cfg, passes)
    return optimiser_step(model, lambda x, y: strategy.loss(model, x, y, 0, slice(0, sizes["batch"]))[0], sizes)


def _plain_train_step(model, sizes: dict, hf: bool = False) -> Callable:
    """Next-token loss on the batch itself (``hf``: a ``transformers`` model, logits in ``.logits``)."""

    def loss(x, y):
        logits = model(x).logits if hf else model(x)
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())

    return optimiser_step(model, loss, sizes)


def _hd_model(preset: str, n: int, dense: bool, seed: int = 0, device: str = "cpu", kv_mirror: int | None = None):
    n_layers = PRESETS[preset]["n_layers"]
    cross = tuple(range(n_layers)) if dense else None
    return build_model("hd", preset, seed=seed, n_streams=n, cross_layers=cross, device=device, kv_mirror=kv_mirror)


def counted_train_flops(loss: Callable[[], torch.Tensor]) -> int:
    """FLOPs of ``loss()`` and its backward as torch's ``FlopCounterMode`` counts them: every matmul
    executed, so FBT's passes and fusion and HD's streams are counted as they run. On CPU it does not
    count the fused attention kernel (QK^T and attention-times-V) unless SDPA runs its math backend
    (``torch.nn.attention.sdpa_kernel``); ``workbench.training.flops`` adds it by formula."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss().backward()
    return counter.get_total_flops()


def matmul_flops(size: int = 1024) -> tuple[Callable, float]:
    a, b = torch.randn(size, size), torch.randn(size, size)
    return (lambda: a @ b), 2.0 * size**3


def _vs_hf(preset: str, sizes: dict, reps: int) -> dict:
    from transformers import LlamaForCausalLM

    from workbench.runtime.export import export_hf

    ours = build_model("baseline", preset)
    with tempfile.TemporaryDirectory() as tmp:
        hf = LlamaForCausalLM.from_pretrained(export_hf(ours, tmp), attn_implementation="sdpa")
    return paired(
        "vs_hf_llama_train",
        _plain_train_step(hf, sizes, hf=True),
        _plain_train_step(ours, sizes),
        what_a="transformers LlamaForCausalLM forward+backward+AdamW",
        what_b="our baseline forward+backward+AdamW",
        reps=reps,
    )
