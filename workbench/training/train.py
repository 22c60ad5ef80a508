"""One training loop for every architecture.

The loop knows nothing of FBT passes or HD streams: a ``Strategy`` (``strategies.py``) turns
a batch into a loss (and, for HD, grows the model at stage boundaries). Data parallel runs under ``torchrun`` on
PyTorch's engines (``parallel.py``: DDP or FSDP2): each process takes its rows of the step's
global batch, so N processes reach the weights of one process accumulating the same rows.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor

from models import DecoderLM, HDConfig, expand_streams, trusted_ids
from workbench.data.prepared import PreparedCorpus, corpus_dir
from workbench.data.tasks import load_task
from workbench.data.windows import IGNORE, TokenStream, Windows, batch_weights, batch_windows
from workbench.runtime.checkpoint import load_model
from workbench.runtime.config import model_from_config
from workbench.runtime.process import peak_rss_mib
from workbench.runtime.progress import Bar
from workbench.runtime.syncs import host_value
from workbench.runtime.tokenizer import CharTokenizer, TokenizerBase, load_tokenizer, tokenizer_of
from workbench.storage.errors import BadInput, MissingFile, OutputBusy, OutputExists, WorkbenchError
from workbench.storage.files import atomic_write, read_json, write_json
from workbench.storage.outputs import Output, contents, listing, output
from workbench.training.checkpointing import (
    RUN,
    STATE_DIR,
    TOKENIZER_FILES,
    last_checkpoint_step,
    load_checkpoint,
    save_checkpoint,
)
from workbench.training.flops import peak_flops
from workbench.training.metrics import read_metrics
from workbench.training.parallel import Dist, Engine, setup_distributed
from workbench.training.readings import Reading, StepReadings
from workbench.training.runconfig import EXECUTION_FIELDS, RunConfig, config_differences, load_run_config
from workbench.training.strategies import FBTStrategy, fit_fusion, make_strategy, ntp_loss
from workbench.training.tracking import FILES as TRACKING_FILES
from workbench.training.tracking import Tracking, tracked

logger = logging.getLogger(__name__)


class TrainingDiverged(WorkbenchError, RuntimeError):
    """The loss or the gradient norm of a step went non-finite; the message names the step and the
    last intact checkpoint. A fact about the run's settings and data, not a bug."""


# ---- optimiser and schedule ---------------------------------------------------------------


def lr_at(cfg: RunConfig, step: int) -> float:
    t = cfg.train
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    progress = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def make_optimizer(model: DecoderLM, cfg: RunConfig) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.train.weight_decay}, {"params": other, "weight_decay": 0.0}]
    # fused: one kernel per step, with the step counters beside the parameters, so a step reads
    # nothing on the host (the default for-each AdamW reads each parameter's counter with .item())
    return torch.optim.AdamW(groups, lr=cfg.train.lr, betas=(cfg.train.beta1, cfg.train.beta2), fused=True)


def carry_optimizer(old_model, old_opt, new_model, cfg: RunConfig) -> torch.optim.AdamW:
    """A fresh optimizer for ``new_model`` (an expanded HD model) that keeps the moments of every
    shared parameter; embedding-table moments are replicated like the tables."""
    new_opt = make_optimizer(new_model, cfg)
    old_params = dict(old_model.named_parameters())
    for name, p in new_model.named_parameters():
        state = old_opt.state.get(old_params[name]) if name in old_params else None
        if not state:
            continue
        moved = {}
        for key, value in state.items():
            if key in ("exp_avg", "exp_avg_sq") and value.shape != p.shape:
                value = value[None] if value.dim() == p.dim() - 1 else value
                value = value[torch.arange(p.shape[0]) % value.shape[0]]
            moved[key] = value.clone()
        new_opt.state[p] = moved
    return new_opt


# ---- data and tokenizer -------------------------------------------------------------------


def run_tokenizer(cfg: RunConfig, run_dir: Path, resume: bool) -> TokenizerBase:
    """The run's tokenizer: on resume, the one its checkpoints committed (``train_state/``; the
    published copy beside the weights may be torn, and is rewritten from it); else its
    ``init_from`` run's, else the character tokenizer. Its ids must fit the model's vocabulary."""
    committed = run_dir / STATE_DIR
    if resume and all((committed / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = load_tokenizer(committed)
    elif cfg.init_from:
        tokenizer = tokenizer_of(cfg.init_from)
    else:
        tokenizer = CharTokenizer()
    if tokenizer.id_limit > cfg.model.d_vocab:
        raise BadInput(
            f"model.d_vocab={cfg.model.d_vocab} is smaller than the run's {tokenizer.kind} tokenizer "
            f"(ids up to {tokenizer.id_limit - 1})"
        )
    return tokenizer


def training_stream(cfg: RunConfig, tokenizer: TokenizerBase) -> Windows:
    """What training batches are cut from: a prepared corpus's train split (its tokenizer must be
    the run's), or the task's examples tokenized by the run's tokenizer."""
    directory = corpus_dir(cfg.data.task)
    if directory is not None:
        corpus = PreparedCorpus.open(directory)
        corpus.check_tokenizer(tokenizer, "this run's tokenizer" + (f" (from {cfg.init_from})" if cfg.init_from else ""))
        return corpus.split("train")
    examples = load_task(cfg.data.task, cfg.data.n_train, cfg.train.seed, cfg.data)
    return TokenStream.from_examples(
        examples,
        tokenizer,
        completion_only=cfg.data.loss_on == "completion",
        example_starts=cfg.data.windows == "example",
        example_weight=cfg.data.loss_weight == "example",
    )


# ---- initialisation -----------------------------------------------------------------------

INIT_SOURCES = {"baseline": ("baseline",), "fbt": ("baseline", "fbt"), "hd": ("baseline", "hd")}
SHAPE_FIELDS = ("d_vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_mlp", "rope_base", "norm_eps", "tie_embeddings")


def init_from(path: str | Path, cfg: RunConfig, device) -> DecoderLM:
    """A model for ``cfg`` whose shared weights come from the run at ``path`` (an FBT model made
    from a baseline has its fusion's own init; ``fit_fusion`` may replace it)."""
    source = load_model(path, device=device)
    if source.arch not in INIT_SOURCES[cfg.arch]:
        raise BadInput(
            f"--init-from {path}: a {source.arch!r} run cannot initialise arch {cfg.arch!r} "
            f"(expected one of {INIT_SOURCES[cfg.arch]})"
        )
    for name in SHAPE_FIELDS:
        theirs, ours = getattr(source.cfg, name), getattr(cfg.model, name)
        if theirs != ours:
            raise BadInput(f"--init-from {path}: model.{name}={theirs} there but {ours} here")
    if cfg.arch == "hd":
        hd_fields = {
            k: getattr(cfg.model, k) for k in ("cross_layers", "cross_window", "positions", "readout", "kv", "kv_mirror", "n_ctx")
        }
        try:
            return expand_streams(source, cast(HDConfig, cfg.model).n_streams, **hd_fields)
        except ValueError as err:  # its argument checks: the source run does not fit this config
            raise BadInput(f"--init-from {path}: {err}") from err
    model = model_from_config(cfg.arch, cfg.model, seed=cfg.train.seed, device=device)
    missing, unexpected = model.load_state_dict(source.state_dict(), strict=False)
    if unexpected or any(not k.startswith("fusion.") for k in missing):
        raise BadInput(f"--init-from {path}: weights do not fit (missing {missing}, unexpected {unexpected})")
    return model


def load_model_arch(run: str | Path) -> str | None:
    """The architecture the run at ``run`` holds (its config.json's ``arch``)."""
    return read_json(Path(run) / "config.json").get("arch")


@torch.no_grad()
def initial_losses(model, stream: Windows, cfg: RunConfig) -> dict:
    """The loss of a model made by ``--init-from``, before any training, on step 0's batch: plain
    next-token loss, and for FBT the loss with every position after the first fused with the
    previous position's state (pass 2 of the K-pass objective, no prefix, no jitter)."""
    x, y = batch_windows(stream, cfg.train.seed, 0, min(cfg.train.batch_size, 8), cfg.train.seq_len)
    x, y = x.to(model.embed.W_E.device), y.to(model.embed.W_E.device)
    if model.carries_state:
        plain, fused = plain_and_fused_losses(model, x, y)
        return {"loss_plain": plain, "loss_fused": fused, "fusion_init": cfg.fbt.fusion_init}
    was_training = model.training
    model.eval()
    try:
        return {"loss_plain": ntp_loss(model(x), y).item()}
    finally:
        model.train(was_training)


@torch.no_grad()
def plain_and_fused_losses(model, x: Tensor, y: Tensor) -> tuple[float, float]:
    """An FBT model's loss on ``x``/``y`` (eval mode) plain, and with every position after the
    first fused with the previous position's state (pass 2, no prefix, no jitter); both skip the
    first position, which has no state to fuse."""
    was_training = model.training
    model.eval()
    try:
        plain, fused = model.run_passes(x, 2)
        return ntp_loss(model.readout(plain)[:, 1:], y[:, 1:]).item(), ntp_loss(model.readout(fused)[:, 1:], y[:, 1:]).item()
    finally:
        model.train(was_training)


# ---- the loop -----------------------------------------------------------------------------


@dataclass
class TrainResult:
    """What ``train`` returns. ``model`` is the trained model (as the last step left it: train
    mode, on the run's device; HD grown to its last stage); ``summary`` is JSON-serialisable:
    ``run``, ``steps`` (the last step reached), ``resumed_from`` (the checkpoint step a resume
    started at, else None), ``seconds`` and ``last`` (the last metrics record)."""

    model: DecoderLM
    summary: dict


def _trim_metrics(path: Path, before_step: int) -> None:
    """Keep the metrics lines up to ``before_step`` (``read_metrics`` drops a torn last line and
    names a corrupt one before it)."""
    if path.is_file():
        kept = [r for r in read_metrics(path) if r["step"] <= before_step]
        atomic_write(path, lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in kept)))


INIT_FILE = "init.json"  # a run made by --init-from: its losses before training (``initial_losses``)
EXPANSIONS_FILE = "expansions.json"  # an HD run: its loss before and after each expansion in training
SWITCH_FILE = "feedback_switch.json"  # an FBT run with a warm switch: the fusion's fit and the losses around it
RUN_FILES = {
    INIT_FILE,
    EXPANSIONS_FILE,
    SWITCH_FILE,
    "config.json",
    "metrics.jsonl",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    STATE_DIR,
    "results",
    *TRACKING_FILES,
}


def check_new_run_dir(run_dir: Path) -> None:
    """A new run goes into a new or empty directory, or one holding only what a run killed (or
    diverged) before its first checkpoint left, by that run's manifest; never over a run or
    anything else, and never over a file of a run's name that no run wrote."""
    found = contents(run_dir)
    if (run_dir / "model.safetensors").exists() or (run_dir / STATE_DIR / "state.json").exists():
        raise OutputExists(f"{run_dir} already holds a run; pass --resume to continue it or choose a new --out")
    if not found:
        return
    foreign = [n for n in found if n not in RUN_FILES] or Output(run_dir, RUN).foreign(found)
    if foreign:
        raise OutputExists(
            f"{run_dir} holds files that are not a workbench run ({listing(foreign)}): choose a new or empty --out"
        )


@contextmanager
def held_by_main_process(run_dir: Path, rank_info: Dist, device):
    """The run directory as an output (``Output``), held by the process that writes (rank 0; the
    others get None); the other processes stop too when it cannot be held."""
    if rank_info.world == 1:
        with output(run_dir, RUN) as out:
            yield out
        return
    with ExitStack() as stack:
        failure, out = None, None
        if rank_info.main:
            try:
                out = stack.enter_context(output(run_dir, RUN))
            except (OutputBusy, OSError) as err:
                failure = err
        flag = torch.tensor([failure is not None], dtype=torch.int32, device=device)
        dist.broadcast(flag, src=0)
        if failure is not None:
            raise failure
        if flag.item():
            raise OutputBusy(f"rank 0 could not lock {run_dir} (its error says why)")
        yield out


def train(
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, progress: bool | Callable = True, stop_after: int | None = None
) -> TrainResult:
    """Train ``cfg`` into ``out_dir``; returns the model and a summary (``TrainResult``). ``resume`` continues from the last
    checkpoint there and reaches the same weights as an uninterrupted run. ``stop_after`` ends
    the process after that many steps as if interrupted (the schedule still spans train.steps).
    ``progress``: True for a tqdm bar, or a callable ``progress(step, total, record)`` called after
    every step (``record`` is the metrics line when one was logged at that step, else None).
    The run directory is held exclusively while training writes it (``workbench.storage.outputs.output``)."""
    run_dir = Path(out_dir)
    rank_info, device = setup_distributed(cfg.train.device)
    t = cfg.train
    if t.batch_size % (rank_info.world * t.grad_accum):
        raise BadInput(
            f"train.batch_size={t.batch_size} is not divisible by processes x grad_accum = {rank_info.world} x {t.grad_accum}"
        )
    # everything that can be checked is checked before the run directory is created or held
    if resume and not (run_dir / STATE_DIR / "state.json").is_file():
        raise MissingFile(f"--resume: no checkpoint in {run_dir} (missing {STATE_DIR}/state.json)")
    if not resume:
        check_new_run_dir(run_dir)
    tokenizer = run_tokenizer(cfg, run_dir, resume)
    stream = training_stream(cfg, tokenizer)
    if len(stream) <= t.seq_len + 1:
        raise BadInput(f"task {cfg.data.task!r} gives {len(stream)} tokens, fewer than train.seq_len={t.seq_len}")
    if not resume:
        before: dict | None = None
        if cfg.init_from:
            fresh = init_from(cfg.init_from, cfg, device)
            before = {"init_from": cfg.init_from}
            glu = getattr(cfg.model, "fusion", None) == "glu"  # FBT; the additive ablation keeps its own init
            if glu and cfg.fbt.fusion_init == "regression" and load_model_arch(cfg.init_from) == "baseline":
                before["fusion_fit"] = fit_fusion(fresh, stream, cfg)
            before.update(initial_losses(fresh, stream, cfg))
        else:
            fresh = model_from_config(cfg.arch, cfg.model, seed=t.seed, device=device)
    with held_by_main_process(run_dir, rank_info, device) as out:
        if resume:
            saved = load_run_config(run_dir / "config.json")
            if saved.arch != cfg.arch:
                raise BadInput(f"--resume: {run_dir} holds an {saved.arch!r} run, not {cfg.arch!r}")
            # a resume continues what the run computes: its config.json must go on saying how the weights were trained
            differ = [f for f in config_differences(saved.to_dict(), cfg.to_dict()) if f not in EXECUTION_FIELDS]
            if differ:
                raise BadInput(
                    f"--resume: {run_dir} holds a run of other settings ({', '.join(differ[:6])}); a resume may change "
                    f"only {', '.join(EXECUTION_FIELDS)}: train into a new directory"
                )
            if (run_dir / "metrics.jsonl").is_file():
                read_metrics(run_dir / "metrics.jsonl")  # a corrupt log stops the resume before it writes anything
            model, opt, start = load_checkpoint(run_dir, cfg, device, lambda m: make_optimizer(m, cfg), tokenizer, out)
        else:
            check_new_run_dir(run_dir)  # again, now that it is held
            model, opt, start = fresh, make_optimizer(fresh, cfg), 0
            if out is not None:
                out.wrote()  # the directory is a run's from now on (kept if a killed run started it)
            if before is not None and out is not None:
                write_json(run_dir / INIT_FILE, before)
                out.wrote(run_dir / INIT_FILE)
        config = {**cfg.to_dict(), "model": model.cfg.to_dict()}
        log_to = t.log_to if rank_info.main else "none"
        with tracked(run_dir, log_to, config, start, resume, out.wrote if out else lambda *paths: None) as tracking:
            return _train_loop(
                cfg, out, run_dir, rank_info, device, model, opt, start, stream, tokenizer, resume, progress, stop_after, tracking
            )


@torch.no_grad()
def _record_expansion(out: Output, strategy, plain, grown, stream, cfg: RunConfig, step: int, device, rows: int) -> None:
    """Add to ``expansions.json`` (``{"expansions": [...]}``) the training loss of the model before and after an expansion
    on the same rows of the step's batch (the first micro-batch): the loss jump the expansion
    causes, 0 up to round-off where cyclic replication keeps the function."""
    x, y = batch_windows(stream, cfg.train.seed, step, cfg.train.batch_size, cfg.train.seq_len)
    x, y = x[:rows].to(device), y[:rows].to(device)
    # the model before, as Hidden Decoding with its own number of streams (a baseline is HD with one,
    # the same function): the strategy's loss then applies to both
    same = expand_streams(plain, plain.n_streams)
    before, after = (float(strategy.loss(m, x, y, step, slice(0, rows))[0]) for m in (same, grown))
    path = out.directory / EXPANSIONS_FILE
    entries = [
        e for e in (read_json(path)["expansions"] if path.is_file() else []) if e["step"] != step
    ]  # a resumed run redoes its step
    entries.append({"step": step, "from": plain.n_streams, "to": grown.n_streams, "loss_before": before, "loss_after": after})
    write_json(path, {"expansions": sorted(entries, key=lambda e: e["step"])})
    out.wrote(path)


def _switch_batch(stream, cfg: RunConfig, step: int, device, rows: int) -> tuple[Tensor, Tensor]:
    """The rows of ``step``'s batch (its first micro-batch) that ``feedback_switch.json`` scores."""
    x, y = batch_windows(stream, cfg.train.seed, step, cfg.train.batch_size, cfg.train.seq_len)
    return x[:rows].to(device), y[:rows].to(device)


def _record_switch(out: Output, fit: dict, before: tuple[float, float], model, batch: tuple[Tensor, Tensor]) -> None:
    """``feedback_switch.json``: the warm switch's fit and, on the switch step's first micro-batch,
    the plain loss and the fused (pass-2) loss with the fusion before the fit (the jump a cold
    switch causes) and after it (the one the warm switch causes)."""
    plain, cold = before
    warm = plain_and_fused_losses(model, *batch)[1]
    path = out.directory / SWITCH_FILE
    write_json(path, {**fit, "loss_plain": plain, "loss_fused_cold": cold, "loss_fused_warm": warm})
    out.wrote(path)


class Trainer:
    """A run between two steps: the (sharded) model, its optimizer and strategy, the step's readings
    on the device, and what the next metrics line counts. ``train_step`` is one optimizer step's
    forward and backward passes; the loop (``_train_loop``) decides when to read, log and save."""

    def __init__(self, cfg: RunConfig, out: Output | None, rank_info: Dist, device, model, opt, stream: Windows):
        t = cfg.train
        self.cfg, self.out, self.rank_info, self.device, self.stream = cfg, out, rank_info, device, stream
        self.per_rank = t.batch_size // rank_info.world
        self.micro = self.per_rank // t.grad_accum
        self.strategy = make_strategy(cfg, stream)
        bf16 = (device.type == "cuda" and t.bf16) or (device.type == "cpu" and t.cpu_bf16)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
        self.engine = Engine(t.parallel, rank_info, device, bf16=bf16, compile=t.compile, checkpoint_blocks=t.checkpoint_blocks)
        self.model, self.step_loss, self.opt = self.engine.shard(model, opt, self.strategy, self.new_optimizer)
        self.peak = peak_flops(device, t.peak_tflops)
        self.readings = StepReadings(device)
        self.last_log, self.tokens_since, self.flops_since = time.perf_counter(), 0, 0.0

    def new_optimizer(self, model: DecoderLM) -> torch.optim.AdamW:
        return make_optimizer(model, self.cfg)

    def grow(self, step: int, run_dir: Path) -> None:
        """The strategy's growth at ``step`` (HD's expansion, FBT's feedback switch), on the unsharded
        model, with its record; the grown model is sharded again."""
        if self.readings.last:  # never fit or record a growth from weights a step since the last read broke
            _stop_if_diverged(self.readings.read(self.rank_info.world), run_dir)
        plain, plain_opt = self.engine.gather(self.model, self.opt, self.new_optimizer)
        switching = self.rank_info.main and isinstance(self.strategy, FBTStrategy)
        # the growth's fit and records are one-off forwards (no_grad, their own shapes): compiled,
        # each would add graphs that no training step reuses
        with torch.compiler.set_stance("force_eager"):
            if switching:
                batch = _switch_batch(self.stream, self.cfg, step, self.device, self.micro)
                before = plain_and_fused_losses(plain, *batch)
            grown = self.strategy.prepare(plain, step)
            if switching:
                _record_switch(cast(Output, self.out), cast(dict, cast(FBTStrategy, self.strategy).fit), before, grown, batch)
            elif self.rank_info.main:
                _record_expansion(
                    cast(Output, self.out), self.strategy, plain, grown, self.stream, self.cfg, step, self.device, self.micro
                )
        moved = carry_optimizer(plain, plain_opt, grown, self.cfg)
        self.model, self.step_loss, self.opt = self.engine.shard(grown, moved, self.strategy, self.new_optimizer)

    def train_step(self, step: int) -> float:
        """Forward and backward over this process's micro-batches of ``step``'s batch, its readings
        kept on the device; returns the step's learning rate (the update is ``update``)."""
        t = self.cfg.train
        lr = lr_at(self.cfg, step)
        for group in self.opt.param_groups:
            group["lr"] = lr
        x_all, y_all = batch_windows(self.stream, t.seed, step, t.batch_size, t.seq_len)
        w_all = batch_weights(self.stream, t.seed, step, t.batch_size, t.seq_len)
        # a micro-batch's (weighted) mean loss, scaled by its share of the step's total target
        # weight: the step's gradient is that of the mean over the whole batch however it is split
        # (the share is 1 where every target is scored alike)
        mass = (y_all != IGNORE).float() if w_all is None else w_all
        per_row = host_value(mass.sum()) / t.batch_size  # the batch is drawn on the host: no device read
        self.model.check_token_range(
            int(host_value(x_all.min())), int(host_value(x_all.max()))
        )  # so the forward need not read it
        parts = []
        for m in range(t.grad_accum):
            first = self.rank_info.rank * self.per_rank + m * self.micro
            rows = slice(first, first + self.micro)
            share = host_value(mass[rows].sum()) / (per_row * self.micro) if per_row else 0.0
            weight = None if w_all is None else to_device(w_all[rows], self.device)
            x, y = to_device(x_all[rows], self.device), to_device(y_all[rows], self.device)
            with self.engine.no_sync(self.step_loss, last_micro=m == t.grad_accum - 1), trusted_ids(self.model):
                with self.autocast:
                    loss, info = self.step_loss(x, y, step, rows, weight)
                (loss * share / t.grad_accum).backward()
            parts.append(info)
        # the step's readings stay on the device; the host reads them on logging and checkpoint steps
        info = {
            k: torch.stack([p[k].double() for p in parts]).mean() if isinstance(v, Tensor) else v for k, v in parts[0].items()
        }
        self.readings.add(step, info, self.engine.clip_grad_norm(self.model, t.grad_clip))
        return lr

    def update(self, step: int) -> None:
        t = self.cfg.train
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.tokens_since += t.batch_size * t.seq_len
        self.flops_since += self.strategy.flops_per_token(self.model, step) * t.batch_size * t.seq_len

    def metrics_line(self, done: int, lr: float, reading: Reading) -> dict:
        """The metrics line of step ``done``: throughput since the last line, then the readings."""
        now = time.perf_counter()
        seconds, peak, world = now - self.last_log, self.peak, self.rank_info.world
        record = {
            "step": done,
            "lr": lr,
            "grad_norm": reading.values["grad_norm"],
            "tokens_per_s": self.tokens_since / seconds,  # all processes' tokens
            "tflops_per_s": self.flops_since / seconds / 1e12,  # all processes' FLOPs (flops.py)
            **({"mfu": self.flops_since / seconds / (peak * world)} if peak else {}),
            "peak_rss_mib": peak_rss_mib(),
            **{k: v for k, v in reading.values.items() if k != "grad_norm"},
        }
        self.last_log, self.tokens_since, self.flops_since = now, 0, 0.0
        return record


def _train_loop(
    cfg: RunConfig,
    out: Output | None,
    run_dir: Path,
    rank_info: Dist,
    device,
    model: DecoderLM,
    opt,
    start: int,
    stream: Windows,
    tokenizer: TokenizerBase,
    resume: bool,
    progress,
    stop_after,
    tracking: Tracking,
) -> TrainResult:
    t = cfg.train
    trainer = Trainer(cfg, out, rank_info, device, model, opt, stream)
    metrics_path = run_dir / "metrics.jsonl"
    if out is not None:
        _trim_metrics(metrics_path, start)
        if not resume:
            write_json(run_dir / "config.json", {**cfg.to_dict(), "model": trainer.model.cfg.to_dict()})
        out.wrote(run_dir / "config.json", metrics_path)
    report = progress if callable(progress) and rank_info.main else None
    # the terminal bar when asked; the bar also feeds an app job's progress file when there is one
    bar = Bar(f"{cfg.arch} {run_dir.name}", t.steps, unit="step", show=progress is True) if rank_info.main else None
    started, record = time.perf_counter(), {}
    end = t.steps if stop_after is None else min(t.steps, start + stop_after)
    saved = None  # the unsharded model the last step checkpointed, if it did
    for step in range(start, end):
        if trainer.strategy.grows(trainer.model, step):
            trainer.grow(step, run_dir)
        lr = trainer.train_step(step)
        done = step + 1
        logs, saves = done % t.log_every == 0 or done == t.steps, done % t.checkpoint_every == 0 or done == t.steps
        if logs or saves or done == end:
            reading = trainer.readings.read(rank_info.world)
            _stop_if_diverged(reading, run_dir)  # before this step's update and any checkpoint
        trainer.update(step)
        if logs:
            record = trainer.metrics_line(done, lr, reading)
            if out is not None:
                new_log = not metrics_path.exists()
                with metrics_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                if new_log:  # appends keep the file; its creation is recorded once
                    out.wrote(metrics_path)
                tracking.log(record)
        if bar is not None:
            bar.update(done, f"loss={record['loss']:.3f}, tok_s={record['tokens_per_s']:.0f}" if record else None)
        if report is not None:
            report(done, t.steps, record if record.get("step") == done else None)
        saved = None
        if saves:  # gathered by every process, written by rank 0
            saved, plain_opt = trainer.engine.gather(trainer.model, trainer.opt, trainer.new_optimizer)
            if out is not None:
                save_checkpoint(out, saved, plain_opt, cfg, done, tokenizer)
    if bar is not None:
        bar.close()
    model = saved if saved is not None else trainer.engine.gather(trainer.model, trainer.opt, trainer.new_optimizer)[0]
    if rank_info.world > 1:
        dist.barrier()
    summary = {
        "run": str(run_dir),
        "steps": end,
        "resumed_from": start if resume else None,
        "seconds": time.perf_counter() - started,
    }
    return TrainResult(model, {**summary, "last": record})


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """A host batch tensor on ``device``; to a GPU from pinned memory without waiting (a copy from
    pageable memory makes the host wait for the device)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _stop_if_diverged(reading: Reading, run_dir: Path) -> None:
    """Raise ``TrainingDiverged`` naming the first non-finite step the reading recorded, if any."""
    if reading.diverged_at is None:
        return
    bad_loss, bad_norm = reading.diverged_loss, reading.diverged_grad_norm
    last = last_checkpoint_step(run_dir)
    raise TrainingDiverged(
        f"non-finite {'loss' if not math.isfinite(bad_loss) else 'gradient norm'} at step {reading.diverged_at} "
        f"(loss {bad_loss}, grad norm {bad_norm}); "
        + (f"the last checkpoint (step {last}) in {run_dir} is intact" if last is not None else "no checkpoint was written")
    )
