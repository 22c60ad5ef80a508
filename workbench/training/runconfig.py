"""The typed configuration of a training run: sections ``model``, ``train``, ``data``, ``fbt``,
``hd``, overridable from the CLI as ``--set section.field=value`` and saved as ``config.json``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from models import ModelConfig
from models.config import SIZE_LIMIT
from workbench.data.tasks import MAX_EXAMPLES, TASK_KINDS, TaskConfig
from workbench.runtime.config import (
    ARCHS,
    check_fits,
    check_json_fields,
    check_section,
    config_from_dict,
    make_config,
    model_sizes,
    parameter_count,
    parse_override,
)
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import read_json
from workbench.training.parallel import PARALLEL
from workbench.training.tracking import parse_log_to

SEED_MAX = 2**32 - 1  # what every consumer of a seed takes (the CLI's --seed too)
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass
class TrainConfig:
    steps: int = 200
    batch_size: int = 16  # sequences per optimizer step, over all processes and accumulation steps
    seq_len: int = 128
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    log_to: str = "none"  # also log metrics to: none | tensorboard | wandb | tensorboard,wandb (tracking.py)
    checkpoint_every: int = 100
    eval_examples: int = 64  # per task, for results/eval.json
    compile: bool = False
    bf16: bool = True  # autocast to bfloat16 on CUDA (on CPU only with cpu_bf16)
    cpu_bf16: bool = False  # autocast to bfloat16 on CPU too (slower than fp32 on CPUs without bf16 units)
    checkpoint_blocks: bool = False  # activation checkpointing: recompute each block in backward
    device: str = "auto"
    parallel: str = "ddp"  # under torchrun: ddp (DistributedDataParallel) or fsdp (FSDP2 fully_shard)
    peak_tflops: float = 0.0  # the MFU's denominator per process; 0: the GPU's dense bf16 peak, none on CPU

    def __post_init__(self) -> None:
        check_section(self)
        parse_log_to(self.log_to)
        if self.parallel not in PARALLEL:
            raise BadInput(f"train field parallel={self.parallel!r}: expected one of {PARALLEL}")
        if not (self.peak_tflops >= 0 and math.isfinite(self.peak_tflops)):
            raise BadInput(f"train field peak_tflops={self.peak_tflops!r}: expected a finite number >= 0")
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "log_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise BadInput(f"train field {name}={getattr(self, name)!r}: expected an integer >= 1")
        for name in ("warmup", "eval_examples", "seed"):
            if getattr(self, name) < 0:
                raise BadInput(f"train field {name}={getattr(self, name)!r}: expected >= 0")
        if self.seed > SEED_MAX:  # the step generators take seed * 7,000,021 + ... as a 64-bit seed
            raise BadInput(f"train field seed={self.seed}: expected 0..{SEED_MAX}")
        if self.eval_examples > MAX_EXAMPLES:
            raise BadInput(f"train field eval_examples={self.eval_examples}: expected 0..{MAX_EXAMPLES:,} examples per task")
        if not (0 < self.lr <= 1):
            # AdamW moves every weight by up to lr a step (weights start near init_std = 0.02); past
            # float32's range its step size is not even a number
            raise BadInput(f"train field lr={self.lr!r}: expected a number in (0, 1]")
        if not DEVICE.fullmatch(self.device):
            raise BadInput(f"train field device={self.device!r}: expected auto, cpu, cuda or cuda:N")
        if not 0 <= self.min_lr_ratio <= 1:
            raise BadInput(f"train field min_lr_ratio={self.min_lr_ratio!r}: expected a number in [0, 1]")
        for name in ("beta1", "beta2"):  # AdamW divides by 1 - beta ** step: 1 is no average at all
            if not 0 <= getattr(self, name) < 1:
                raise BadInput(f"train field {name}={getattr(self, name)!r}: expected a number in [0, 1)")
        if self.weight_decay < 0 or self.grad_clip <= 0:
            raise BadInput(f"train fields weight_decay={self.weight_decay}, grad_clip={self.grad_clip}: expected >= 0 and > 0")
        if self.lr * self.weight_decay > 1:  # AdamW scales every weight by 1 - lr * weight_decay each step
            raise BadInput(
                f"train fields lr={self.lr}, weight_decay={self.weight_decay}: expected lr x weight_decay <= 1 "
                "(each step multiplies every weight by 1 - lr x weight_decay)"
            )
        if self.batch_size % self.grad_accum:
            raise BadInput(f"train field batch_size={self.batch_size} is not divisible by grad_accum={self.grad_accum}")


LOSS_ON = ("all", "completion")
WINDOWS = ("any", "example")
LOSS_WEIGHTS = ("token", "example")


@dataclass
class DataConfig(TaskConfig):
    task: str = (
        "mix"  # chain | modsum | flipflop | perm | addition | mix | jsonl:PATH | text:PATH | hf:NAME[:CONFIG] | prepared:DIR
    )
    n_train: int = 20000  # examples generated for training (synthetic tasks)
    n_val: int = 256  # unused (eval takes its size from --n); kept so earlier run configs load
    # which targets training scores: "all" tokens, or only each example's "completion" (its answer
    # and <eos>; a prompt's tokens are read, not predicted); docs/training.md
    loss_on: str = "all"
    # where training windows start: at "any" token of the stream, or only where an "example" starts
    # (position 0 then holds a prompt's first token, as in evaluation and generation)
    windows: str = "any"
    # how scored targets weigh: each "token" alike, or each "example" alike (its scored targets share
    # a weight of 1, so a 2-token answer counts as much as a 50-token worked solution)
    loss_weight: str = "token"

    def __post_init__(self) -> None:
        super().__post_init__()
        kind = self.task.partition(":")[0]
        if self.task not in TASK_KINDS and not (kind in ("jsonl", "text", "hf", "prepared") and self.task.partition(":")[2]):
            raise BadInput(
                f"data field task={self.task!r}: expected one of {TASK_KINDS} or jsonl:PATH, text:PATH, hf:NAME, prepared:DIR"
            )
        if self.loss_on not in LOSS_ON:
            raise BadInput(f"data field loss_on={self.loss_on!r}: expected one of {LOSS_ON}")
        if self.windows not in WINDOWS:
            raise BadInput(f"data field windows={self.windows!r}: expected one of {WINDOWS}")
        if self.loss_weight not in LOSS_WEIGHTS:
            raise BadInput(f"data field loss_weight={self.loss_weight!r}: expected one of {LOSS_WEIGHTS}")
        for name, plain in (("loss_on", "all"), ("windows", "any"), ("loss_weight", "token")):
            if getattr(self, name) != plain and kind == "prepared":
                raise BadInput(
                    f"data field {name}={getattr(self, name)!r} with task={self.task!r}: a prepared corpus keeps "
                    f"no prompt boundaries; expected {name}={plain!r}"
                )


FUSION_INITS = ("random", "regression")
SWITCHES = ("warm", "cold")


@dataclass
class FBTTrainConfig:
    feedback_start: float = 0.3  # fraction of steps trained single-pass before feedback starts
    three_pass_fraction: float = 0.03  # of the feedback batches, the fraction run with ``deepest`` passes
    deepest: int = 3  # the passes of those deeper batches (3 or 4); a pass past the third weighs as the third
    pass_weights: tuple[float, ...] = (1.0, 1.0, 1.0)  # NTP loss weight of pass 1, 2, 3
    prefix_max: float = 0.5  # each sequence stays plain before a random prefix of up to this fraction
    state_noise: float = 0.01  # std of Gaussian jitter on fed-back states
    detach: bool = False  # stop gradients into earlier passes (ablation)
    # --init-from a baseline: "random" (the fusion's own init) or "regression" (W_U = 2 x the least-
    # squares map from the carried state h_{t-1} to the next token's embedding e_t, W_G = 0, so the
    # fused input starts as the state's best linear guess of the plain input; docs/training.md)
    fusion_init: str = "regression"
    # at feedback_start: "warm" fits the fusion from the backbone trained so far (the regression
    # init above, GLU only), "cold" leaves it at its random initialisation
    switch: str = "warm"
    # the feedback passes' loss weights rise linearly from 0 to pass_weights over this fraction of
    # train.steps after feedback_start (0: at full weight at once)
    ramp: float = 0.1

    def __post_init__(self) -> None:
        check_section(self)
        self.pass_weights = tuple(self.pass_weights)
        if self.switch not in SWITCHES:
            raise BadInput(f"fbt field switch={self.switch!r}: expected one of {SWITCHES}")
        for name in ("feedback_start", "three_pass_fraction", "prefix_max", "ramp"):
            if not 0 <= getattr(self, name) <= 1:
                raise BadInput(f"fbt field {name}={getattr(self, name)!r}: expected a number in [0, 1]")
        if len(self.pass_weights) != 3 or any(w < 0 for w in self.pass_weights):
            raise BadInput(f"fbt field pass_weights={self.pass_weights!r}: expected 3 non-negative weights")
        if self.deepest not in (3, 4):
            raise BadInput(f"fbt field deepest={self.deepest!r}: expected 3 or 4 passes")
        if self.state_noise < 0:
            raise BadInput(f"fbt field state_noise={self.state_noise!r}: expected >= 0")
        if self.fusion_init not in FUSION_INITS:
            raise BadInput(f"fbt field fusion_init={self.fusion_init!r}: expected one of {FUSION_INITS}")


@dataclass
class HDTrainConfig:
    streams: tuple[int, ...] = (2,)  # n_streams of each stage, increasing
    expand_at: tuple[int, ...] = (0,)  # the step at which each stage starts; the first is 0
    supervise: str = "last"  # "last" stream, or the ablation "all" streams

    def __post_init__(self) -> None:
        check_section(self)
        self.streams, self.expand_at = tuple(self.streams), tuple(self.expand_at)
        if not self.streams or len(self.streams) != len(self.expand_at):
            raise BadInput(f"hd fields streams={self.streams} and expand_at={self.expand_at}: expected equal, non-zero lengths")
        if self.expand_at[0] != 0:
            raise BadInput(f"hd field expand_at={self.expand_at}: the first stage starts at step 0")
        pairs = zip(self.streams, self.streams[1:])
        if self.streams[0] < 1 or any(b <= a for a, b in pairs):
            raise BadInput(f"hd field streams={self.streams}: expansion schedule must be increasing and >= 1")
        if self.streams[-1] > SIZE_LIMIT:
            raise BadInput(f"hd field streams={self.streams}: {self.streams[-1]} is a size torch cannot allocate")
        if any(b <= a for a, b in zip(self.expand_at, self.expand_at[1:])):
            raise BadInput(f"hd field expand_at={self.expand_at}: expansion steps must be increasing")
        if self.supervise not in ("last", "all"):
            raise BadInput(f"hd field supervise={self.supervise!r}: expected 'last' or 'all'")


SECTIONS = {"train": TrainConfig, "data": DataConfig, "fbt": FBTTrainConfig, "hd": HDTrainConfig}


@dataclass
class RunConfig:
    arch: str
    preset: str
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    fbt: FBTTrainConfig = field(default_factory=FBTTrainConfig)
    hd: HDTrainConfig = field(default_factory=HDTrainConfig)
    init_from: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def stage(self, step: int) -> int:
        """HD: n_streams in force at ``step``."""
        return [n for n, at in zip(self.hd.streams, self.hd.expand_at) if at <= step][-1]


def make_run_config(
    arch: str, preset: str | None, task: str | None = None, overrides: Sequence[str] = (), init_from: str | None = None
) -> RunConfig:
    """Build and validate a run config; every error names the offending field. ``preset`` names
    the model's sizes; ``None`` takes them from the run at ``init_from`` (continued pretraining of
    an imported model: its backbone fields, ``--set model.*`` on top), or ``debug`` without one."""
    if arch not in ARCHS:
        raise BadInput(f"unknown architecture {arch!r}: expected one of {sorted(ARCHS)}")
    values: dict[str, dict] = {"model": {}, **{s: {} for s in SECTIONS}}
    if preset is None and init_from is not None:
        values["model"], preset = backbone_of(init_from), "init"
    preset = preset or "debug"
    if task is not None:
        values["data"]["task"] = task
    for text in overrides:
        key, value = parse_override(arch, text, SECTIONS)
        section, _, name = key.partition(".")
        values[section][name] = value
    if arch == "hd" and "n_streams" not in values["model"]:
        hd = HDTrainConfig(**values["hd"])
        values["model"]["n_streams"] = hd.streams[0]
    model = make_config(arch, "debug" if preset == "init" else preset, **values["model"])
    sections = {s: cls(**values[s]) for s, cls in SECTIONS.items()}
    cfg = RunConfig(arch, preset, model, init_from=init_from, **sections)
    n_streams = getattr(model, "n_streams", 1)  # an HD config's field
    if arch == "hd" and n_streams != cfg.hd.streams[0]:
        raise BadInput(f"model.n_streams={n_streams} != hd.streams[0]={cfg.hd.streams[0]}: the first stage sets n_streams")
    mirror = getattr(model, "kv_mirror", None)  # an HD config's field
    if mirror is not None and cfg.hd.supervise == "all":
        raise BadInput(f"model.kv_mirror={mirror} with hd.supervise=all: KV-Mirror computes the last stream only")
    if cfg.hd.expand_at[-1] >= cfg.train.steps and arch == "hd" and len(cfg.hd.expand_at) > 1:
        raise BadInput(f"hd field expand_at={cfg.hd.expand_at}: every stage must start before train.steps={cfg.train.steps}")
    if cfg.train.seq_len > model.n_ctx:
        raise BadInput(f"train field seq_len={cfg.train.seq_len} is longer than the context model.n_ctx={model.n_ctx}")
    check_run_fits(cfg)
    return cfg


# What a training step keeps, in bytes, as measured against peak RSS on the CPU in float32
# (scripts/memory_calibration.py, docs/results/memory_calibration.json): the process's working
# memory beyond its imports; per position and layer, per unit of d_model, of d_mlp and per
# attention key of each head; and per logit. On a CUDA device under bf16 autocast the activations
# and logits take half that (against the peak GPU memory of docs/results/gpu_suite.json's
# continued-pretraining runs).
RUNTIME_BYTES = 90 * 2**20
PER_D_MODEL, PER_D_MLP, PER_KEY, PER_LOGIT = 80, 18, 0.375, 17


def training_bytes(cfg: RunConfig, sizes: dict[str, int], device=None) -> int:
    """The memory a training step of ``cfg`` takes with ``sizes`` (the model's ``SIZE_FIELDS`` at
    its largest stage, ``batch_size`` and ``seq_len``) on ``device`` (a CUDA device's name, or None
    for the CPU): the weights, gradients and AdamW's moments, the batch, what each pass keeps for
    backward (every FBT pass; every HD stream) and the logits."""
    t, s, processes = cfg.train, sizes, _processes()
    state = 16 * parameter_count(cfg.model, s)  # float32 weights, gradients and AdamW's two moments
    if t.parallel == "fsdp":  # each process holds its shard of them
        state //= processes
    batch = 2 * 8 * s["batch_size"] * s["seq_len"]  # the step's input and target ids (int64), made whole
    micro = max(s["batch_size"] // (t.grad_accum * processes), 1)
    passes = (cfg.fbt.deepest if cfg.fbt.three_pass_fraction > 0 else 2) if cfg.arch == "fbt" else 1
    positions = passes * micro * s["seq_len"] * s["n_streams"]
    keys = s["seq_len"] * s["n_streams"]  # each query's keys, at most
    layer = PER_D_MODEL * s["d_model"] + PER_D_MLP * s["d_mlp"] + PER_KEY * cfg.model.n_heads * keys
    if t.checkpoint_blocks:  # each block's float32 input is kept; one block's activations at a time
        activations = positions * (4 * s["d_model"] * s["n_layers"] + layer)
    else:
        activations = positions * layer * s["n_layers"]
    supervised = s["n_streams"] if cfg.hd.supervise == "all" else 1
    logits = PER_LOGIT * passes * micro * s["seq_len"] * supervised * s["d_vocab"]
    half = 0.5 if device is not None and t.bf16 else 1.0
    return int(RUNTIME_BYTES + state + batch + half * (activations + logits))


def run_sizes(cfg: RunConfig) -> dict[str, int]:
    """The sizes ``training_bytes`` reads: the model's at its largest stage (an HD run's last
    ``hd.streams``), the batch and the sequence length."""
    sizes = {**model_sizes(cfg.model), "batch_size": cfg.train.batch_size, "seq_len": cfg.train.seq_len}
    if cfg.arch == "hd":
        sizes["n_streams"] = cfg.hd.streams[-1]
    return sizes


def check_run_fits(cfg: RunConfig) -> None:
    """Refuse (``BadInput``, before any file is written) a run whose training step cannot fit in the
    memory of the device it trains on, naming the settings that make it large: the model at its
    largest stage (an HD run's last ``hd.streams``), the batch and the sequence length."""
    sizes = run_sizes(cfg)
    labels = {name: f"model.{name}" for name in sizes} | {"batch_size": "train.batch_size", "seq_len": "train.seq_len"}
    if cfg.arch == "hd":
        labels["n_streams"] = "hd.streams"
    device = _training_device(cfg.train.device)
    check_fits(
        lambda s: training_bytes(cfg, s, device),
        sizes,
        "a training step's weights, gradients, optimizer state, batch and activations",
        reference={"batch_size": 16, "seq_len": 128},
        labels=labels,
        device=device,
    )


def _processes() -> int:
    """Processes the batch is split over: ``torchrun``'s ``WORLD_SIZE``, else 1."""
    world = os.environ.get("WORLD_SIZE", "1")
    return int(world) if world.isdigit() and int(world) > 0 else 1


def _training_device(name: str):
    """The CUDA device ``train.device`` trains on (as ``setup_distributed`` picks it), or None for
    the CPU; None too for a CUDA device this machine lacks (``check_device_here`` names that)."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if not name.startswith("cuda") or not torch.cuda.is_available():
        return None
    index = int(name.partition(":")[2] or 0)
    return name if index < torch.cuda.device_count() else None


def check_device_here(cfg: RunConfig) -> None:
    """Refuse a ``train.device`` this machine does not have (a run config may be written for
    another machine; training it here needs the device here)."""
    name = cfg.train.device
    if name in ("auto", "cpu"):
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(name.partition(":")[2] or 0) >= count:
        raise BadInput(f"train field device={name!r}: this machine has {count} CUDA device(s)")


# how a run executes or where it logs, not what it computes (to rounding): a resume may change these with --set
EXECUTION_FIELDS = (
    "train.parallel",
    "train.device",
    "train.compile",
    "train.checkpoint_blocks",
    "train.peak_tflops",
    "train.log_to",
)


GROWN = ("n_streams",)  # model fields training changes (HD's progressive expansion)


def config_differences(saved: dict, wanted: dict) -> list[str]:
    """The fields in which a saved run config differs from a wanted one, apart from ``init_from``
    (where it continued from) and the model fields that training grows (``GROWN``)."""
    saved, wanted = json.loads(json.dumps(saved)), json.loads(json.dumps(wanted))  # tuples as JSON lists
    differ = sorted(
        f"{section}.{key}"
        for section in wanted
        if isinstance(wanted[section], dict)
        for key in wanted[section]
        if not (section == "model" and key in GROWN) and saved.get(section, {}).get(key) != wanted[section][key]
    )
    return differ + [key for key in ("arch", "preset") if saved.get(key) != wanted[key]]


def with_execution_overrides(cfg: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """``cfg`` (a saved run's) with ``--set`` overrides of ``EXECUTION_FIELDS`` only; any other
    field is refused by name, since a resume continues what the run computes."""
    train = dataclasses.asdict(cfg.train)
    for text in overrides:
        key, value = parse_override(cfg.arch, text, SECTIONS)
        if key not in EXECUTION_FIELDS:
            raise BadInput(
                f"--resume: --set {key} would change what the run computes; only {', '.join(EXECUTION_FIELDS)} may change"
            )
        train[key.partition(".")[2]] = value
    return dataclasses.replace(cfg, train=TrainConfig(**train))


def backbone_of(run: str | Path) -> dict:
    """The shared backbone fields (``models.ModelConfig``'s) of the model in the run at ``run``."""
    path = Path(run) / "config.json"
    if not path.is_file():
        raise MissingFile(f"--init-from {run}: no run there (missing {path})")
    model = read_json(path).get("model")
    if not isinstance(model, dict):
        raise BadInput(f"{path}: expected a 'model' object")
    shared = {f.name for f in dataclasses.fields(ModelConfig)}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in model.items() if k in shared}


def run_config_from_dict(data: dict, source: str | Path | None = None) -> RunConfig:
    """The run config saved as ``data`` (read from ``source``, named in every error). A config
    without training sections (from ``save_model``) gets the defaults; one with only some of them
    is incomplete."""
    where = f"run config {source}" if source is not None else "run config"
    for key in ("arch", "model"):
        if key not in data:
            raise BadInput(f"{where} has no {key!r} field")
    present = [s for s in SECTIONS if s in data]
    if present and len(present) < len(SECTIONS):
        missing = [s for s in SECTIONS if s not in data]
        raise BadInput(f"{where} has sections {present} but not {missing}: a training run writes them all")
    if not isinstance(data.get("preset", ""), str) or not isinstance(data.get("init_from", ""), (str, type(None))):
        raise BadInput(f"{where}: preset must be a string and init_from a string or null")
    try:
        model = config_from_dict(data["arch"], data["model"])
        sections = {}
        for s, cls in SECTIONS.items():
            values = data.get(s, {})
            if not isinstance(values, dict):
                raise BadInput(f"section {s!r} must be a JSON object, got {type(values).__name__}")
            check_json_fields(cls, values, prefix=f"{s}.")
            sections[s] = cls(**values)
        return RunConfig(data["arch"], data.get("preset", "custom"), model, init_from=data.get("init_from"), **sections)
    except BadInput as err:
        raise BadInput(f"bad {where}: {err}") from err


def load_run_config(path: str | Path) -> RunConfig:
    """The run config in ``path`` (a run directory's ``config.json``)."""
    return run_config_from_dict(read_json(path), source=path)


def task_config(run: str | Path) -> TaskConfig | None:
    """The synthetic tasks' settings the run in directory ``run`` trained on (its ``config.json``'s
    ``data``), so held-out problems drawn for it are the problems it learned (modsum's modulus and
    lengths, flip-flop's lengths, chain's steps); None where ``run`` has no run config."""
    path = Path(run) / "config.json"
    return task_settings(load_run_config(path).data) if path.is_file() else None


def task_settings(data: DataConfig) -> TaskConfig:
    """The synthetic tasks' part of a run's data settings."""
    return TaskConfig(**{k: getattr(data, k) for k in TaskConfig.__dataclass_fields__})
