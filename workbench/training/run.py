"""A run directory, read once: ``Run.open(path)`` with its ``config``, ``task``, ``tokenizer``,
``model()``, ``metrics``, ``results`` and ``eval``.

Instruments take their default inputs from ``Run.task``: held-out problems of the task the run
trained on, scored at the positions training scored. An input from elsewhere is allowed and said:
``RunTask.input_record`` names it beside the run's task, with a warning where the two differ, for
the page, stderr and the result JSON.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from workbench.data.example import Example
from workbench.data.splits import heldout_task
from workbench.data.tasks import LABELS, SYNTHETIC, TaskConfig, task_of_prompt
from workbench.runtime.checkpoint import CONFIG, load_model
from workbench.runtime.tokenizer import TokenizerBase, tokenizer_of
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import read_json
from workbench.storage.shapes import COUNT, FRACTION, Each, check_shape
from workbench.training.metrics import read_metrics
from workbench.training.runconfig import RunConfig, run_config_from_dict, task_settings

logger = logging.getLogger(__name__)

BY_HAND = "a prompt given by hand"  # the input task of a prompt that is no task's problem
TRACE_TASKS = ("chain", "addition")  # synthetic tasks whose answers follow a written trace
PLOTTED = ("loss", "lr", "tokens_per_s")  # what the Runs page draws of every metrics record


@dataclass(frozen=True)
class RunTask:
    """What a run trained on: ``spec`` as its config gives it (``flipflop``, ``mix``,
    ``jsonl:PATH``, ``prepared:DIR``, ...; None for a model that records no training data, such
    as an import), the synthetic tasks' ``settings``, and the positions training scored
    (``loss_on``: ``completion`` or ``all``) and where its windows started (``windows``)."""

    spec: str | None
    settings: TaskConfig
    loss_on: str = "all"
    windows: str = "any"

    @property
    def name(self) -> str:
        return self.spec if self.spec is not None else "none recorded"

    @property
    def kinds(self) -> tuple[str, ...]:
        """The synthetic tasks its problems are drawn from (a mix's with a positive weight)."""
        if self.spec == "mix":
            return tuple(t for t, w in zip(SYNTHETIC, self.settings.mix_weights) if w > 0)
        return (self.spec,) if self.spec in SYNTHETIC else ()

    @property
    def labels(self) -> tuple[str, ...]:
        """The per-position labels its problems carry (what a probe can target)."""
        return tuple(label for kind in self.kinds for label in LABELS[kind])

    def heldout(self, n: int, seed: int = 0, tokenizer: TokenizerBase | None = None) -> list[Example]:
        """``n`` held-out problems of the task (a file's first ``n``; a prepared corpus's held-out
        documents, decoded with ``tokenizer``, the run's)."""
        if self.spec is None:
            raise BadInput("the run records no task (an imported model): give the input to analyse")
        return heldout_task(self.spec, n, seed, self.settings, tokenizer)[:n]

    def prompt(self, seed: int = 0, tokenizer: TokenizerBase | None = None) -> str:
        """The prompt of the task's first held-out problem (a text's opening where a document has none)."""
        example = self.heldout(1, seed, tokenizer)[0]
        return example.prompt or example.completion[:200]

    def trace_task(self) -> str:
        """The trace study's task for this run's problems, or ``BadInput`` saying why there is none."""
        kinds = self.kinds
        traced = [k for k in kinds if k in TRACE_TASKS]
        if traced:
            return traced[0]
        kind, _, rest = (self.spec or "").partition(":")
        if kind == "jsonl":
            return f"gsm8k-jsonl:{rest}"
        if kind == "prepared":
            return f"prepared:{rest}"
        if kinds:
            raise BadInput(
                f"trace length is not defined on {self.spec}: its answers are one token, with no trace before them; "
                "the addition organism (`workbench zoo --preset org-addition`) is where traces can be compared"
            )
        raise BadInput(
            f"the run's task ({self.name}) has no problems with written answers: give --task chain, addition or gsm8k-jsonl:PATH"
        )

    def covers(self, task: str | None) -> bool:
        """Whether an input of ``task`` (a spec, a synthetic task, or ``BY_HAND``) is what this run
        trained on. Text given by hand is a file's or corpus's kind as far as anyone can tell."""
        if self.spec is None or task is None or task == self.spec or task in self.kinds:
            return True
        return task == BY_HAND and not self.kinds

    def input_record(self, input_task: str | None = None, *, prompt: str | None = None, run: str = "the run") -> dict:
        """``run_task`` and ``input_task`` for a result's JSON, and a ``warning`` where the input is
        not what the run trained on. ``input_task`` None: the run's own (the default); with
        ``prompt``, the task the prompt is written as (``BY_HAND`` for text no task makes)."""
        if prompt is not None:
            input_task = task_of_prompt(prompt) or BY_HAND
        given = self.spec if input_task is None else input_task
        record = {"run_task": self.spec, "input_task": given}
        if not self.covers(given):
            record["warning"] = (
                f"{run} trained on {self.name}, and this input is {given}: what is measured describes the model on "
                "inputs it was not trained on"
            )
            logger.warning(record["warning"])
        return record


@dataclass
class Run:
    """A run directory: ``config.json`` read once, the tokenizer and model loaded on demand."""

    path: Path
    config: RunConfig
    raw: dict  # config.json as written (an import's ``source`` record, sections a model lacks)

    @classmethod
    def open(cls, path: str | Path) -> Run:
        path = Path(path)
        if not (path / CONFIG).is_file():
            raise MissingFile(f"no run at {path} (no {CONFIG})")
        raw = read_json(path / CONFIG)
        if not isinstance(raw, dict):
            raise BadInput(f"{path / CONFIG}: expected a JSON object")
        return cls(path, run_config_from_dict(raw, source=path / CONFIG), raw)

    @property
    def arch(self) -> str:
        return self.config.arch

    @cached_property
    def task(self) -> RunTask:
        data = self.config.data
        return RunTask(data.task if "data" in self.raw else None, task_settings(data), loss_on=data.loss_on, windows=data.windows)

    @cached_property
    def tokenizer(self) -> TokenizerBase:
        return tokenizer_of(self.path)

    def model(self, device=None, dtype=None):
        return load_model(self.path, device=device, dtype=dtype)

    @cached_property
    def metrics(self) -> list[dict]:
        """The records of ``metrics.jsonl``, each with the numbers the pages plot."""
        path = self.path / "metrics.jsonl"
        return check_metrics(read_metrics(path), path)

    @cached_property
    def results(self) -> dict[str, Path]:
        """The files under ``results/`` by name (hidden files, locks and temporaries, are not results)."""
        folder = self.path / "results"
        if not folder.is_dir():
            return {}
        return {p.name: p for p in sorted(folder.iterdir()) if not p.name.startswith(".") and p.is_file()}

    @cached_property
    def eval(self) -> dict | None:
        """``results/eval.json`` (the run's own evaluation), checked; None before ``workbench eval``."""
        path = self.results.get("eval.json")
        return None if path is None else check_eval(read_json(path), path)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_metrics(records: list[dict], path: Path) -> list[dict]:
    """``records`` (read from ``path``) if each has the numbers the Runs page plots (and
    ``loss_pass*``, ``n_streams`` are numbers where present), else a ValueError naming the record."""
    for number, record in enumerate(records, 1):
        for key in [*PLOTTED, *(k for k in record if k.startswith("loss_pass") or k == "n_streams")]:
            if not _number(record.get(key)):
                raise BadInput(
                    f"{path}: record {number} (step {record['step']}) has {key}={json.dumps(record.get(key))[:60]}, "
                    f"expected a number"
                )
    return records


EVAL_SHAPE = {  # what ``evaluate_run`` writes
    "run?": str,
    "arch?": str,
    "fused_passes?": (str, float),
    "seconds?": float,
    "tasks": Each(
        {"n": COUNT, "skipped_too_long?": COUNT, "loss": Each(float), "answer_loss": Each(float), "accuracy": Each(FRACTION)}
    ),
}


def check_eval(data: dict, path: Path) -> dict:
    """``data`` (read from ``path``) if it has ``EVAL_SHAPE``, else ``BadInput`` naming the field."""
    check_shape(data, EVAL_SHAPE, path)
    return data


def run_task(path: str | Path) -> RunTask:
    """The task of the run at ``path``; the tasks' defaults with no task recorded where ``path``
    is not a run directory (a fresh ``ARCH:PRESET`` model)."""
    return Run.open(path).task if (Path(path) / CONFIG).is_file() else RunTask(None, TaskConfig())
