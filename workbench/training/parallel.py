"""Data parallel on PyTorch's own engines, chosen by ``train.parallel`` under ``torchrun``.

- ``ddp``: ``DistributedDataParallel`` over the step's loss (``StepLoss``), so every FBT pass and
  HD stream runs inside DDP's forward and gradients are all-reduced in buckets while backward
  still runs. FBT runs with ``find_unused_parameters=True``: in a single-pass step the fusion
  takes no part in the loss, and DDP then leaves the gradients of parameters no process used
  at ``None`` (not zero), so AdamW skips them as it does in one process. Micro-batches of
  ``grad_accum`` run under ``no_sync`` except the last.
- ``fsdp``: FSDP2 ``fully_shard`` on every block, on the FBT fusion and on the root (embeddings,
  final norm, readout): each process holds 1/N of the parameters, gradients and optimizer
  moments. The fusion is its own group for the same reason as above: a group that did not run
  in forward reduces nothing, so its gradients stay ``None``. With bf16 the mixed precision
  policy computes in bf16 and reduces gradients in fp32.

Checkpoints are gathered: ``gather`` returns an unsharded model and optimizer (a collective under
``fsdp``), rank 0 writes them in the single-process format, and every process reads that format
and ``shard``s it again, so a run saved under N processes resumes under M. HD's expansion goes
the same way: gather, grow, carry the moments, shard the grown model.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from models import DecoderLM
from workbench.runtime.config import model_from_config

PARALLEL = ("ddp", "fsdp")


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device_pref: str) -> tuple[Dist, torch.device]:
    """This process's rank and device: one process unless ``torchrun`` set ``WORLD_SIZE``; then
    the process group is NCCL on CUDA (one device per local rank) and gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = device_pref == "cuda" or (device_pref == "auto" and torch.cuda.is_available())
    if world > 1:
        if not dist.is_initialized():
            dist.init_process_group("nccl" if use_cuda else "gloo")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if use_cuda:
            torch.cuda.set_device(local)
        return Dist(dist.get_rank(), world), torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    return Dist(), torch.device("cuda" if use_cuda else device_pref if device_pref != "auto" else "cpu")


def leave_distributed(code: int) -> None:
    """End a ``torchrun`` worker: destroy the process group, flush, and leave without the
    interpreter's finalization (``os._exit``); does nothing in a process that no ``torchrun``
    started. DDP keeps gloo's process group alive past ``destroy_process_group`` (torch 2.13: its
    worker threads outlive the DDP wrapper and its module, collected), and tearing those threads
    down while the interpreter finalizes aborts the process now and then ("terminate called
    without an active exception", exit -6): measured in 1 of 53 exits of a 2-process DDP script
    whose ranks had both finished, and once in CI. Everything the verb wrote is closed by then."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


class StepLoss(nn.Module):
    """``strategy.loss(model, ...)`` as a module's forward: the engines act on calls of a module's
    forward, and the strategies call ``run_passes``, ``readout`` and the model itself."""

    def __init__(self, model: DecoderLM, strategy):
        super().__init__()
        self.model = model
        self.strategy = strategy

    def forward(self, x, y, step: int, rows: slice, weight=None):
        return self.strategy.loss(self.model, x, y, step, rows, weight)


class Engine:
    """How the loop's model is laid over the processes. ``shard`` takes an unsharded model and
    optimizer and returns ``(model, step_loss, optimizer)`` to train; ``gather`` the reverse."""

    def __init__(self, kind: str, rank_info: Dist, device: torch.device, *, bf16: bool, compile: bool, checkpoint_blocks: bool):
        if kind not in PARALLEL:
            raise ValueError(f"train.parallel={kind!r}: expected one of {PARALLEL}")
        self.kind = kind if rank_info.world > 1 else "none"
        self.rank_info, self.device = rank_info, device
        self.bf16, self.compile, self.checkpoint_blocks = bf16, compile, checkpoint_blocks

    def shard(
        self, model: DecoderLM, opt: torch.optim.Optimizer, strategy, make_optimizer
    ) -> tuple[DecoderLM, nn.Module, torch.optim.Optimizer]:
        model.train()
        model.checkpoint_blocks = self.checkpoint_blocks
        if self.compile:
            for block in model.blocks:  # whole: a graph break would fail here, not split a block
                block.compile(fullgraph=True)
        step_loss: nn.Module = StepLoss(model, strategy)
        if self.kind == "ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            step_loss = nn.parallel.DistributedDataParallel(step_loss, device_ids=ids, find_unused_parameters=model.carries_state)
        elif self.kind == "fsdp":
            opt = self._fully_shard(model, step_loss, opt, make_optimizer)
        return model, step_loss, opt

    def _fully_shard(self, model: DecoderLM, step_loss: nn.Module, opt, make_optimizer) -> torch.optim.Optimizer:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.tensor import distribute_tensor

        mesh = init_device_mesh(self.device.type, (self.rank_info.world,))
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16 else MixedPrecisionPolicy()
        )
        groups = [*model.blocks, *([model.fusion] if hasattr(model, "fusion") else []), step_loss]
        full = opt.state_dict()
        for module in groups:
            fully_shard(module, mesh=mesh, mp_policy=policy)
        sharded = make_optimizer(model)
        params = [p for group in sharded.param_groups for p in group["params"]]
        for index, state in full["state"].items():  # the moments sharded like their parameters
            p = params[index]
            for key, value in state.items():
                if torch.is_tensor(value) and value.dim():
                    state[key] = distribute_tensor(value.to(self.device), p.device_mesh, p.placements)
        sharded.load_state_dict(full)
        return sharded

    def gather(self, model: DecoderLM, opt: torch.optim.Optimizer, make_optimizer) -> tuple[DecoderLM, torch.optim.Optimizer]:
        """The unsharded model and optimizer (the same objects unless ``fsdp``, where every process
        must call this: it all-gathers every parameter and moment)."""
        if self.kind != "fsdp":
            return model, opt
        from torch.distributed.tensor import DTensor

        def full(value):
            return value.full_tensor() if isinstance(value, DTensor) else value

        plain = model_from_config(model.arch, model.cfg, device=self.device)
        plain.load_state_dict({name: full(value) for name, value in model.state_dict().items()})
        plain.train()
        sd = opt.state_dict()
        sd["state"] = {i: {k: full(v) for k, v in state.items()} for i, state in sd["state"].items()}
        plain_opt = make_optimizer(plain)
        plain_opt.load_state_dict(sd)
        return plain, plain_opt

    def clip_grad_norm(self, model: DecoderLM, max_norm: float) -> Tensor:
        """Clip the gradients to ``max_norm`` in global norm; the norm before clipping, a 0-d
        tensor on the device (under ``fsdp`` computed over the shards of all processes)."""
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if self.kind == "fsdp":
            from torch.distributed.tensor import DTensor

            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        return norm

    def no_sync(self, step_loss: nn.Module, last_micro: bool):
        """DDP all-reduces once per step, after the last micro-batch."""
        if isinstance(step_loss, nn.parallel.DistributedDataParallel) and not last_micro:
            return step_loss.no_sync()
        return nullcontext()
