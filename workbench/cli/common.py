"""What every verb shares: argument types and options, the checks made before any work, the --json
output, and the handling that turns a user's error into one line on stderr."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from workbench.names import DTYPES, ENGINES, REGIMES
from workbench.storage.errors import BadInput, MissingFile, OutputExists, WorkbenchError

WRITTEN_BY = "written_by"  # the key that marks a --json file as a verb's, so a later --json may replace it


def check_json_target(out: str | None) -> None:
    """A --json file is new, or one an earlier verb wrote there (checked before any work)."""
    from workbench.storage.files import read_json

    if out and Path(out).exists():
        try:
            previous = read_json(Path(out))
        except (OSError, WorkbenchError):
            previous = {}
        if not str(previous.get(WRITTEN_BY, "")).startswith("workbench "):
            raise OutputExists(f"{out} exists and is not a workbench --json output: choose another path")


def emit(result: dict, out: str | None, verb: str) -> None:
    if out:
        from workbench.storage.files import write_json

        check_json_target(out)
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {WRITTEN_BY: f"workbench {verb}", **result})
        print(f"wrote {path}")


def tokenizer_for(spec: str):
    """The tokenizer saved with a run directory, or the default one for an ARCH:PRESET model."""
    from workbench.runtime.tokenizer import tokenizer_of

    return tokenizer_of(spec)


# the verbs that take runs, the argument that names them, and whether ARCH:PRESET[:SEED] is a fresh model there
RUN_ARGUMENTS = {
    "generate": ("model", True),
    "export": ("model", True),
    "cache": ("run", True),
    "eval": ("run", False),
    "probe": ("run", False),
    "sae": ("run", False),
    "dynamics": ("runs", False),
    "traces": ("runs", False),
}


def _arch_of(value: str, fresh: bool) -> str | None:
    """The architecture of the run ``value`` names, read from its ``config.json`` without importing
    torch (None for ``ARCH:PRESET[:SEED]``, checked when the model is built, and for a config the
    loader will refuse, naming the file and field): a path that is no run is refused here, in
    milliseconds, before any model loads."""
    path = Path(value)
    if not path.exists():
        if fresh and len(value.split(":")) in (2, 3) and "/" not in value:
            return None
        other = " or ARCH:PRESET[:SEED] (e.g. fbt:debug)" if fresh else ""
        raise MissingFile(f"{value}: no such run directory (expected a run directory{other})")
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        raise MissingFile(f"{value}: not a run directory (missing {config})")
    try:
        saved = json.loads(config.read_text())
    except (ValueError, RecursionError):  # the loader names what is wrong with it, file and field
        return None
    arch = saved.get("arch") if isinstance(saved, dict) else None
    return arch if isinstance(arch, str) else None


def check_runs_first(args) -> None:
    """Refuse, before anything heavy is imported or loaded, a regime that does not exist, a run
    argument that names no run and what the run's architecture cannot do: a regime other than standard for a run without a carried
    state (``generate``), a run that is not FBT for ``dynamics``."""
    regimes = getattr(args, "regimes", None)
    if isinstance(regimes, str) and (not all(regimes.split(",")) or set(regimes.split(",")) - set(REGIMES)):
        raise BadInput(
            f"--regimes {regimes}: invalid regimes {regimes!r}: expected comma-separated names of {', '.join(REGIMES)}"
        )
    if args.verb not in RUN_ARGUMENTS:
        return
    attribute, fresh = RUN_ARGUMENTS[args.verb]
    values = getattr(args, attribute)
    for value in values if isinstance(values, list) else [values]:
        arch = _arch_of(value, fresh)
        if arch is None or arch == "fbt":
            continue
        if args.verb == "generate" and (fed_back := [r for r in args.regimes.split(",") if r != "standard"]):
            raise BadInput(
                f"--regimes {args.regimes}: {value} is a {arch} run, which decodes in the standard regime only ({', '.join(fed_back)} feed back FBT's state)"
            )
        if args.verb == "dynamics":
            raise BadInput(f"{value}: a {arch} run; dynamics analyses FBT runs (the feedback map)")


# a bar counting thousandths of a verb's work: its percentage, elapsed and remaining time, and what it
# does (tqdm writes the postfix as ", TEXT")
FRACTION_BAR = "{l_bar}{bar}| [{elapsed}<{remaining}]{postfix}"


def engine_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="eager",
        help="how decode steps run: eager (growing cache; the default), static (fixed shapes) or compiled "
        "(torch.compile of the static step: tens of seconds to compile per model and shape, then faster)",
    )


ANALYSIS_VERBS = ("generate", "eval", "cache", "probe", "sae", "dynamics", "traces")


def torch_dtype(args):
    """``--dtype`` as a torch dtype (None: the weights' own)."""
    import torch

    name = DTYPES[args.dtype]
    return getattr(torch, name) if name else None


def dtype_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="fp32",
        help="the weights' dtype for inference: fp32 (as trained) or bf16 (half the memory and, on a GPU, "
        "faster matmuls; norms and the numerics guard work in fp32)",
    )


def compute_arguments(p: argparse.ArgumentParser) -> None:
    """Where an analysis verb's model runs, and with how many torch threads (on a shared machine,
    fewer threads than cores keep it from contending with other work)."""
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the model runs")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")


SEED_MAX = 2**32 - 1  # what every consumer of a seed takes (torch, numpy, scikit-learn's random_state)


def parse_seed(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed {text!r}: expected an integer 0..{SEED_MAX}") from None
    if not 0 <= seed <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"invalid seed {seed}: expected 0..{SEED_MAX}")
    return seed


def parse_count(text: str) -> int:
    """An argument that counts something (steps, rows): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def parse_passes(text: str) -> int | str:
    """K of a K-pass prefill: a positive integer or 'exact'."""
    if text == "exact":
        return text
    try:
        return parse_count(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'exact', got {text!r}") from None


class _Renamed(argparse.Action):
    """An option's old spelling, kept for one release: stores into the new option's destination
    and says on stderr which spelling to use."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"workbench: {option_string} is deprecated and will be removed: use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def renamed(p: argparse.ArgumentParser, old: str, new: str, dest: str, kind: Callable[[str], object] = str) -> None:
    """Accept ``old`` for the option ``new`` (hidden from --help, warned about when used)."""
    p.add_argument(old, dest=dest, type=kind, action=_Renamed, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


class VerbParser(argparse.ArgumentParser):
    """A verb's parser: every option's help ends with its default, unless the help already names
    it or there is none to name (a flag, or a default the verb works out itself)."""

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        text, default = action.help or "", action.default
        if action.option_strings and "default" not in text and default is not None and default is not False:
            if default != argparse.SUPPRESS:  # -h
                shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else default
                action.help = f"{text} (default: {shown})".strip()
        return action


# torch takes a thread count as a C int and starts that many threads; a zoo starts a process per
# job. Past these, a count is a typo, not a plan (the zoo's members number a few dozen).
THREADS_MAX = 1024
JOBS_MAX = 1024


def check_count(value: int | None, flag: str, most: int) -> None:
    """Refuse a count of threads or processes below 1 or above ``most`` (None: the default)."""
    if value is not None and not 1 <= value <= most:
        raise BadInput(f"{flag} {value}: expected 1 or more and at most {most:,}")


def check_text(text: str, flag: str) -> None:
    """Refuse a text argument that is not UTF-8: Python hands argv bytes it cannot decode over as
    lone surrogates (``surrogateescape``), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        part = text[err.start : err.end]
        try:
            bad = repr(part.encode("utf-8", "surrogateescape"))  # the bytes argv held
        except UnicodeEncodeError:  # a lone surrogate that no byte became (from Python, not argv)
            bad = repr(part)
        raise BadInput(f"{flag} {text!r}: not UTF-8 text ({bad} at character {err.start})") from None


def _set_compute(args) -> None:
    """Check ``--device`` before any work, and take ``--threads``."""
    from workbench.runtime.process import analysis_device

    args.device = analysis_device(args.device)
    if args.threads is not None:
        check_count(args.threads, "--threads", THREADS_MAX)
        import torch

        torch.set_num_threads(args.threads)


def run_verb(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks every verb gets before its work, the work, and its --json output; a user's error
    exits with one line on stderr and status 2."""
    try:
        check_json_target(args.json_out)
        check_runs_first(args)
        if args.verb in ANALYSIS_VERBS:
            _set_compute(args)
        result = args.func(args)
        emit(result, args.json_out, args.verb)
        if args.verb == "train":  # under torchrun: no interpreter finalization (see leave_distributed)
            from workbench.training.parallel import leave_distributed

            leave_distributed(0)
    except (WorkbenchError, OSError) as err:
        # Only these are the user's to fix. A WorkbenchError names the value, path or file and what
        # was expected. An OSError is the environment refusing (a full disk, a permission denied, a
        # directory where a file must go, an --out path through a file): its message names the path
        # and the reason, and a traceback would point at code that did nothing wrong. Anything else
        # (a KeyError, a TypeError, a RuntimeError from torch) is a bug and propagates with its
        # traceback (exit status 1).
        if debugging():
            raise
        parser.exit(2, f"workbench {args.verb}: error: {' '.join(str(err).split())}\n")  # one line


def debugging() -> bool:
    """``WORKBENCH_DEBUG`` set (to anything but 0): user errors keep their traceback too."""
    return os.environ.get("WORKBENCH_DEBUG", "").strip() not in ("", "0")
