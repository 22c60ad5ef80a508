"""The training strategies: how a batch becomes a loss, per architecture. The loop
(``train.py``) knows nothing of FBT passes or HD streams; a ``Strategy`` does:

- ``Strategy``: plain next-token prediction (the baseline);
- ``FBTStrategy``: single-pass batches, then (warm switch: the fusion fitted by ``fit_fusion``,
  the feedback passes' weights ramped) 2-pass batches with a few 3-pass ones, drawn per step;
- ``HDStrategy``: progressive stream expansion at stage boundaries, last-stream or all-stream
  supervision.
"""

from __future__ import annotations

import logging
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from models import DecoderLM, HDConfig, expand_streams
from workbench.data.windows import IGNORE, Windows, step_generator
from workbench.runtime.config import model_from_config
from workbench.runtime.syncs import host_value
from workbench.training.flops import train_flops_per_token
from workbench.training.runconfig import RunConfig

logger = logging.getLogger(__name__)


def ntp_loss(logits: Tensor, targets: Tensor, weight: Tensor | None = None) -> Tensor:
    """Mean next-token loss over the scored targets (``IGNORE`` ones are skipped), weighted by
    ``weight`` (the targets' shape) when given; 0, with a graph, where none is scored."""
    if weight is None:
        total = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE, reduction="sum")
        return total / (targets != IGNORE).sum().clamp(min=1)
    each = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE, reduction="none")
    weight = weight.flatten().to(each.dtype)
    return (each * weight).sum() / weight.sum().clamp(min=torch.finfo(each.dtype).tiny)


class Strategy:
    """Plain next-token prediction; subclasses add passes (FBT) or streams (HD)."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg

    def grows(self, model: DecoderLM, step: int) -> bool:
        """Whether ``prepare`` changes the model at ``step``."""
        return False

    def prepare(self, model: DecoderLM, step: int) -> DecoderLM:
        """The model to train at ``step`` (HD returns a grown model at a stage boundary)."""
        return model

    def flops_per_token(self, model: DecoderLM, step: int) -> float:
        """Training FLOPs per token of ``step`` (``flops.train_flops_per_token``)."""
        return train_flops_per_token(model, self.cfg.train.seq_len)

    def loss(self, model, x: Tensor, y: Tensor, step: int, rows: slice, weight: Tensor | None = None) -> tuple[Tensor, dict]:
        """The loss of rows ``rows`` of ``step``'s batch (inputs ``x``, targets ``y``, target
        weights ``weight`` or None) and what to log of it."""
        loss = ntp_loss(model(x), y, weight)
        return loss, {"loss": loss.detach()}


class FBTStrategy(Strategy):
    """Single-pass batches first; then 2-pass batches with a few deeper ones (``fbt.deepest``
    passes, 3 by default). The pass count, the plain prefixes and the state jitter of a step
    depend only on (seed, step) and the global row, so every process and every resume draws the
    same. The switch to feedback is warm by default:
    at its step the fusion is fitted from the backbone (``fit_fusion`` on ``stream``) and the
    feedback passes' loss weights ramp up from 0 (``fbt.switch``, ``fbt.ramp``)."""

    def __init__(self, cfg: RunConfig, stream: Windows | None = None):
        super().__init__(cfg)
        self.stream = stream
        self.fit: dict | None = None  # the last fit, with the step it was made at

    def switch_step(self) -> int:
        return round(self.cfg.fbt.feedback_start * self.cfg.train.steps)

    def grows(self, model, step):
        """At the switch step (after a single-pass phase), a warm switch fits a GLU fusion."""
        fbt = self.cfg.fbt
        return fbt.switch == "warm" and getattr(model.cfg, "fusion", None) == "glu" and step == self.switch_step() > 0

    def prepare(self, model, step):
        if not self.grows(model, step):
            return model
        if self.stream is None:
            raise ValueError("a warm feedback switch fits the fusion on the training stream: make_strategy(cfg, stream)")
        self.fit = {"step": step, **fit_fusion(model, self.stream, self.cfg)}
        logger.info("step %d: feedback switches on; fusion fitted (R^2 %.3f)", step, self.fit["r2"])
        return model

    def ramp(self, step: int) -> float:
        """The factor on the feedback passes' loss weights at ``step``: (step - switch + 1) / ramp
        steps, at most 1."""
        length = round(self.cfg.fbt.ramp * self.cfg.train.steps)
        return 1.0 if length <= 0 else min(1.0, (step - self.switch_step() + 1) / length)

    def passes(self, step: int) -> int:
        fbt, train = self.cfg.fbt, self.cfg.train
        if step < round(fbt.feedback_start * train.steps):
            return 1
        u = torch.rand((), generator=step_generator(train.seed, step, purpose=1))
        return fbt.deepest if host_value(u) < fbt.three_pass_fraction else 2

    def flops_per_token(self, model, step):
        K = self.passes(step)  # the stack and the readout once per pass, the fusion in passes 2..K
        return train_flops_per_token(model, self.cfg.train.seq_len, copies=K, readouts=K, fusions=K - 1)

    def loss(self, model, x, y, step, rows, weight=None):
        fbt, train = self.cfg.fbt, self.cfg.train
        K = self.passes(step)
        B, T = train.batch_size, train.seq_len
        prefix = torch.randint(0, int(fbt.prefix_max * T) + 1, (B,), generator=step_generator(train.seed, step, purpose=2))
        fuse = torch.arange(T)[None] >= prefix[rows, None]
        noise_gen = step_generator(train.seed, step, purpose=3)
        noise = {}

        def jitter(states: Tensor, pass_index: int) -> Tensor:
            if fbt.state_noise == 0:
                return states
            if pass_index not in noise:  # one global draw per pass, sliced to this process's rows
                noise[pass_index] = torch.randn((B, T, states.shape[-1]), generator=noise_gen)[rows]
            return states + fbt.state_noise * noise[pass_index].to(states.device, states.dtype)

        states = model.run_passes(x, K, fuse_mask=fuse.to(x.device), perturb=jitter, detach_states=fbt.detach)
        losses = [ntp_loss(model.readout(h), y, weight) for h in states]
        later = [*fbt.pass_weights[1:], *fbt.pass_weights[-1:] * (K - len(fbt.pass_weights))]  # pass 4 weighs as pass 3
        weights = [fbt.pass_weights[0], *(w * self.ramp(step) for w in later)]
        total = cast(Tensor, sum(w * l for w, l in zip(weights, losses)))
        return total, {"loss": total.detach(), "passes": K, **{f"loss_pass{k + 1}": l.detach() for k, l in enumerate(losses)}}


class HDStrategy(Strategy):
    """Progressive expansion n = streams[0] -> streams[1] -> ... at ``expand_at`` steps, each by
    cyclic replication of the embedding tables; last-stream or all-stream supervision."""

    def grows(self, model, step):
        return self.cfg.stage(step) != model.n_streams

    def prepare(self, model, step):
        n = self.cfg.stage(step)
        if n == model.n_streams:
            return model
        logger.info("step %d: expanding %d -> %d streams", step, model.n_streams, n)
        return expand_streams(model, n)

    def loss(self, model, x, y, step, rows, weight=None):
        if self.cfg.hd.supervise == "all":
            logits = model(x, all_streams=True)  # [batch, pos, n_streams, d_vocab]

            def every(t: Tensor) -> Tensor:  # one copy of a target (or its weight) per stream
                return t[:, :, None].expand(-1, -1, model.n_streams)

            loss = ntp_loss(logits, every(y), None if weight is None else every(weight))
        else:
            loss = ntp_loss(model(x), y, weight)
        return loss, {"loss": loss.detach(), "n_streams": model.n_streams}

    def flops_per_token(self, model, step):
        n, T, cfg = model.n_streams, self.cfg.train.seq_len, cast(HDConfig, model.cfg)
        keys = [n * T if layer in (cfg.cross_layers or ()) else T for layer in range(cfg.n_layers)]  # a window is a mask
        mirror = cfg.kv_mirror if cfg.kv_mirror is not None else cfg.n_layers
        copies = [n if layer < mirror else 1 for layer in range(cfg.n_layers)]  # KV-Mirror: the last stream only
        readouts = n if self.cfg.hd.supervise == "all" else 1
        return train_flops_per_token(model, T, copies=copies, readouts=readouts, keys_per_layer=keys)


def make_strategy(cfg: RunConfig, stream: Windows | None = None) -> Strategy:
    """The run's strategy; ``stream``, the training stream, is what a warm FBT switch fits on."""
    if cfg.arch == "fbt":
        return FBTStrategy(cfg, stream)
    return {"baseline": Strategy, "hd": HDStrategy}[cfg.arch](cfg)


def run_flops(cfg: RunConfig) -> float:
    """The training FLOPs of a whole baseline or FBT run: every step's ``flops_per_token`` (FBT's
    passes as the run draws them, one pass before the switch) times the tokens of a step. HD's
    model grows during training, so its count would need the model of each stage: not counted."""
    if cfg.arch not in ("baseline", "fbt"):
        raise ValueError(f"run_flops counts baseline and FBT runs, not {cfg.arch}")
    model = model_from_config(cfg.arch, cfg.model, device="meta")
    strategy = make_strategy(cfg)
    tokens = cfg.train.batch_size * cfg.train.seq_len
    return float(sum(strategy.flops_per_token(model, step) for step in range(cfg.train.steps))) * tokens


FIT_POSITIONS = 4  # x d_model: positions the regression init of the fusion is fitted on


@torch.no_grad()
def fit_fusion(model, stream: Windows, cfg: RunConfig) -> dict:
    """The ``regression`` fusion init: with W_G = 0 the gate is 1/2 everywhere, and W_U = 2 W where
    W (ridge least squares, fp64) maps the carried state h_{t-1} to the next token's embedding e_t
    on ``FIT_POSITIONS * d_model`` positions of the training stream. The fused input u_t = W h_{t-1}
    then starts as the state's best linear guess of the plain input e_t (with a tied readout h_{t-1}
    already scores e_t highest). Returns the number of positions and the fit's R^2 on them."""
    d, T = cfg.model.d_model, cfg.train.seq_len
    rows = -(-FIT_POSITIONS * d // (T - 1))
    gen = step_generator(cfg.train.seed, 0, purpose=5)  # not a training batch's windows
    starts = torch.randint(0, len(stream) - T - 1, (rows,), generator=gen).numpy()
    device = model.embed.W_E.device
    gram = torch.zeros(d, d, dtype=torch.float64, device=device)
    cross = torch.zeros(d, d, dtype=torch.float64, device=device)
    e_sum = torch.zeros(d, dtype=torch.float64, device=device)
    e_sq = 0.0
    was_training = model.training
    model.eval()
    for chunk in range(0, rows, 8):
        tokens = torch.from_numpy(stream.take(starts[chunk : chunk + 8], T)).to(device)
        h = model.run_passes(tokens, 1)[0][:, :-1].reshape(-1, d).double()
        e = model.input_table[tokens[:, 1:]].reshape(-1, d).double()
        gram += h.T @ h
        cross += h.T @ e
        e_sum += e.sum(0)
        e_sq += float(e.pow(2).sum())
    model.train(was_training)
    ridge = 1e-6 * gram.diagonal().mean()
    W = torch.linalg.solve(gram + ridge * torch.eye(d, dtype=torch.float64, device=device), cross).T  # e ~ W h
    n = rows * (T - 1)
    residual = e_sq - 2 * float((W * cross.T).sum()) + float((W @ gram * W).sum())  # sum |e - W h|^2
    total = e_sq - float(e_sum.pow(2).sum()) / n
    model.fusion.W_U.weight.copy_(2 * W)
    model.fusion.W_G.weight.zero_()
    return {"positions": n, "r2": 1 - residual / total}
