"""Everything done with the models: building, decoding, activation recording, checkpoints, export.
``WorkbenchError`` (and its subclasses) is what the workbench raises for what a user can fix.

The names below load their modules on first use (PEP 562), so that ``workbench --help`` and
other commands that need neither torch nor TransformerLens start at once."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from workbench.storage.errors import BadInput, MissingFile, NotADirectory, OutputBusy, OutputExists, WorkbenchError

_LAZY = {
    "ActivationRecorder": "workbench.runtime.activations",
    "Record": "workbench.runtime.activations",
    "resolve_hook_names": "workbench.runtime.activations",
    "run_with_pass_cache": "workbench.runtime.activations",
    "load_model": "workbench.runtime.checkpoint",
    "resolve_model": "workbench.runtime.checkpoint",
    "save_model": "workbench.runtime.checkpoint",
    "ARCHS": "workbench.runtime.config",
    "build_model": "workbench.runtime.config",
    "make_config": "workbench.runtime.config",
    "parse_override": "workbench.runtime.config",
    "REGIMES": "workbench.runtime.decoding",
    "Generation": "workbench.runtime.decoding",
    "NonFinite": "workbench.runtime.decoding",
    "generate": "workbench.runtime.decoding",
    "CharTokenizer": "workbench.runtime.tokenizer",
}

if TYPE_CHECKING:  # what the type checker and editors see: the same names, imported eagerly
    from workbench.runtime.activations import ActivationRecorder, Record, resolve_hook_names, run_with_pass_cache
    from workbench.runtime.checkpoint import load_model, resolve_model, save_model
    from workbench.runtime.config import ARCHS, build_model, make_config, parse_override
    from workbench.runtime.decoding import REGIMES, Generation, NonFinite, generate
    from workbench.runtime.tokenizer import CharTokenizer


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once loaded, a plain module attribute
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ARCHS",
    "ActivationRecorder",
    "BadInput",
    "CharTokenizer",
    "Generation",
    "MissingFile",
    "NonFinite",
    "NotADirectory",
    "OutputBusy",
    "OutputExists",
    "REGIMES",
    "Record",
    "WorkbenchError",
    "build_model",
    "generate",
    "load_model",
    "make_config",
    "parse_override",
    "resolve_hook_names",
    "resolve_model",
    "run_with_pass_cache",
    "save_model",
]
