"""Training FLOPs per token, one formula for every architecture, and the MFU it gives.

Per token of the batch, forward + backward = 3 x the forward, and the forward does 2 FLOPs per
matrix entry it multiplies by (the PaLM / Kaplan 6N convention, counted per matrix use):

    6 x (copies x stack + readouts x d_model x d_vocab + fusions x fusion)
      + 12 x d_model x copies x sum over layers of the keys a query sees

- ``stack``: the entries of the blocks' matrices; ``copies``: how often the stack runs per token
  (1; FBT: the step's passes K; HD: n_streams positions per token), per layer where layers differ
  (HD's KV-Mirror: the layers from ``kv_mirror`` on run the last stream only, once);
- ``readouts``: the unembedding's uses per token (1; FBT: one per pass, every pass is scored;
  HD: 1, or n with ``supervise=all``); the input embedding is a lookup and costs nothing;
- ``fusion``: the entries of FBT's fusion matrices, used by passes 2..K (``fusions = K - 1``);
- attention (QK^T and attention-times-V, 2 x 2 x d_model FLOPs per key per query, x3): as nanoGPT
  counts it, every query against every key of the sequence it attends over, masked or not (the
  causal mask's saving is not subtracted): ``seq_len`` keys per layer; HD's intra-stream layers
  attend over their stream's ``seq_len`` positions, its cross-stream layers over all
  ``n x seq_len`` (a ``cross_window`` is a mask, so it saves nothing). RMSNorm gains, softmax
  and the elementwise work are left out (below 1% at these shapes).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# dense bf16 tensor-core peaks (no sparsity), by a substring of torch.cuda.get_device_name()
BF16_PEAK_TFLOPS = {  # first match wins: NVL and PCIe parts before their SXM namesakes
    "H200 NVL": 835.0,
    "H200": 989.4,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H100": 989.4,
    "A100": 312.0,
}


def matrix_entries(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.dim() == 2)


def train_flops_per_token(
    model,
    seq_len: int,
    *,
    copies: int | Sequence[int] = 1,
    readouts: int = 1,
    fusions: int = 0,
    keys_per_layer: Sequence[int] | None = None,
) -> float:
    """The module docstring's formula; ``keys_per_layer`` defaults to ``seq_len`` for every layer,
    and ``copies`` is one number for every layer or one per layer."""
    cfg = model.cfg
    keys = [seq_len] * cfg.n_layers if keys_per_layer is None else list(keys_per_layer)
    per_layer = [copies] * cfg.n_layers if isinstance(copies, int) else list(copies)
    fusion = matrix_entries(model.fusion) if fusions else 0
    stack = sum(c * matrix_entries(block) for c, block in zip(per_layer, model.blocks))
    matmuls = stack + readouts * cfg.d_model * cfg.d_vocab + fusions * fusion
    return 6.0 * matmuls + 12.0 * cfg.d_model * sum(c * k for c, k in zip(per_layer, keys))


def peak_flops(device: torch.device, override_tflops: float = 0.0) -> float | None:
    """FLOP/s the MFU is measured against: ``override_tflops`` when > 0, else the device's dense
    bf16 peak when it is a GPU in ``BF16_PEAK_TFLOPS``; None (no MFU) otherwise."""
    if override_tflops > 0:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tflops * 1e12 for key, tflops in BF16_PEAK_TFLOPS.items() if key in name), None)
