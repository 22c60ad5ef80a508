"""Experiment tracking: the training loop's ``metrics.jsonl`` lines, also written where researchers
watch runs (``train.log_to``): TensorBoard event files in the run directory (``tensorboard/``)
and a Weights & Biases run, offline by default (``wandb/``: no network needed or assumed;
``wandb sync`` uploads it later; ``WANDB_MODE=online`` logs live).

Every number of a metrics line is a scalar of the same name and step (``train/loss``,
``train/tokens_per_s``, ``train/mfu``, ``train/peak_rss_mib``, per-pass losses ...), and the run
config goes with it (TensorBoard: a text summary; W&B: the run's config). A resumed run continues
the same curves: TensorBoard purges the steps after the checkpoint it resumed from, as
``metrics.jsonl`` is trimmed; W&B resumes the run of the same id (kept in ``tracking.json``).
Only the main process writes. The packages are the ``tracking`` extra."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, cast

from workbench.storage.errors import BadInput
from workbench.storage.files import read_json, write_json

TRACKERS = ("tensorboard", "wandb")
TENSORBOARD_DIR, WANDB_DIR, TRACKING_FILE = "tensorboard", "wandb", "tracking.json"
FILES = (TENSORBOARD_DIR, WANDB_DIR, TRACKING_FILE)  # what tracking adds to a run directory
WANDB_MODES = ("offline", "online", "disabled")
PROJECT = "latent-workbench"  # the W&B project unless WANDB_PROJECT names one


def parse_log_to(value: str) -> tuple[str, ...]:
    """``train.log_to``: ``none``, or trackers joined by commas (``tensorboard``, ``wandb``,
    ``tensorboard,wandb``), in ``TRACKERS``' order."""
    names = [] if value.strip() == "none" else [n.strip() for n in value.split(",")]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or len(set(names)) != len(names):
        raise BadInput(f"train field log_to={value!r}: expected 'none' or one or more of {', '.join(TRACKERS)} joined by commas")
    return tuple(n for n in TRACKERS if n in names)


def scalars(record: dict) -> dict[str, float]:
    """The numbers of a metrics line other than its step, by name."""
    return {k: float(v) for k, v in record.items() if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}


@contextmanager
def tracked(run_dir: Path, log_to: str, config: dict, start: int, resume: bool, made: Callable[..., None]) -> Iterator[Tracking]:
    """The run's trackers while it trains (closed however training ends: a diverged run's curves
    are kept up to its last logged step); ``made(*paths)`` records what they wrote in the run
    directory as the run's, after they open, after each line and at the end."""
    tracking = Tracking(run_dir, log_to, config, start, resume, made)
    try:
        yield tracking
    finally:
        tracking.close()


class Tracking:
    """The trackers of one run, opened with its config at ``start`` (the step it starts or resumes
    from); ``log`` takes each metrics line, ``close`` ends them."""

    def __init__(self, run_dir: Path, log_to: str, config: dict, start: int, resume: bool, made: Callable[..., None]):
        self.run_dir, self.made, self.writers = run_dir, made, []
        kinds = parse_log_to(log_to)
        if "tensorboard" in kinds:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # torch's writer needs the tensorboard package
                raise BadInput(_missing("tensorboard")) from None
            # purge_step drops the events of steps after the checkpoint a resumed run starts from
            writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=start + 1 if resume else None)
            if not resume:
                writer.add_text("config", "```json\n" + json.dumps(config, indent=1) + "\n```", 0)
            self.writers.append(_TensorBoard(writer))
        if "wandb" in kinds:
            try:
                import wandb
            except ImportError:
                raise BadInput(_missing("wandb")) from None
            path = run_dir / TRACKING_FILE
            ids = read_json(path) if path.is_file() else {}
            if "wandb_id" not in ids:
                ids["wandb_id"] = secrets.token_hex(4)
                write_json(path, ids)
            mode = os.environ.get("WANDB_MODE", "offline")
            if mode not in WANDB_MODES:
                raise BadInput(f"WANDB_MODE={mode!r} in the environment: expected one of {', '.join(WANDB_MODES)}")
            (run_dir / WANDB_DIR).mkdir(exist_ok=True)  # wandb writes under DIR/wandb
            run = wandb.init(
                dir=str(run_dir),
                mode=cast(Literal["online", "offline", "disabled"], mode),
                project=os.environ.get("WANDB_PROJECT", PROJECT),
                name=run_dir.name,
                id=ids["wandb_id"],
                resume="allow",
                config=config,
                settings=wandb.Settings(console="off", x_disable_stats=True),
            )
            self.writers.append(_WandB(run))
        self._record()

    def log(self, record: dict) -> None:
        values = scalars(record)
        for writer in self.writers:
            writer.log(record["step"], values)
        self._record()

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        self._record()
        self.writers = []

    def _record(self) -> None:
        if self.writers:
            self.made(*(self.run_dir / name for name in FILES if (self.run_dir / name).exists()))


class _TensorBoard:
    def __init__(self, writer):
        self.writer = writer

    def log(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(f"train/{name}", value, step)
        self.writer.flush()  # a line is on disk when metrics.jsonl has it

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run):
        self.run = run

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({f"train/{name}": value for name, value in values.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


def _missing(package: str) -> str:
    return f"train field log_to names {package}, which is not installed: pip install 'latent-workbench[tracking]'"
