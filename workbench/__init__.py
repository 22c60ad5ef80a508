"""Everything done with the models: building, decoding, activation recording, checkpoints, export.
``WorkbenchError`` (and its subclasses) is what the workbench raises for what a user can fix."""

from workbench.runtime.activations import ActivationRecorder, Record, resolve_hook_names, run_with_pass_cache
from workbench.runtime.checkpoint import load_model, resolve_model, save_model
from workbench.runtime.config import ARCHS, build_model, make_config, parse_override
from workbench.runtime.decoding import REGIMES, Generation, NonFinite, generate
from workbench.runtime.tokenizer import CharTokenizer
from workbench.storage.errors import BadInput, MissingFile, NotADirectory, OutputBusy, OutputExists, WorkbenchError

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
