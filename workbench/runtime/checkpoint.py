"""Model checkpoints: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``), written
atomically, loaded without pickle, with errors that name the file and the problem. A weights file
carries a CRC32 of its tensors and metadata, so torn or flipped bytes are caught when it loads."""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from models import DecoderLM
from workbench.runtime.config import ARCHS, build_model, check_model_fits, config_from_dict, model_from_config
from workbench.runtime.tokenizer import CharTokenizer, TokenizerBase
from workbench.storage.errors import BadInput, MissingFile, OutputExists
from workbench.storage.files import atomic_write, read_json, write_json
from workbench.storage.outputs import output

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
CHECKSUM = "crc32"  # metadata key of a weights file's checksum


def tensor_checksum(tensors: dict[str, Tensor], metadata: dict[str, str]) -> str:
    """CRC32 over every tensor's name, dtype, shape and bytes and over the metadata: it detects torn
    or flipped bytes (not tampering)."""
    crc = zlib.crc32(json.dumps(sorted(metadata.items())).encode())
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        crc = zlib.crc32(f"{name}:{t.dtype}:{tuple(t.shape)}".encode(), crc)
        crc = zlib.crc32(t.reshape(-1).view(torch.uint8).numpy().data, crc)  # a view, no copy
    return f"{crc:08x}"


def save_weights(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """An atomic safetensors write whose metadata carries the checksum ``load_weights`` verifies."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    metadata = dict(metadata or {})
    metadata[CHECKSUM] = tensor_checksum(tensors, metadata)

    def write(tmp: str) -> None:
        try:
            save_file(tensors, tmp, metadata=metadata)
        except SafetensorError as err:  # e.g. a full disk: an OSError, so atomic_write names the path
            code = re.search(r"os error (\d+)", str(err))
            raise OSError(int(code[1]), os.strerror(int(code[1]))) if code else OSError(f"safetensors: {err}") from err

    atomic_write(path, write)


def load_weights(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors and metadata of a safetensors file, never unpickling anything. Raises ``BadInput``
    (a ValueError) naming the file when it is not safetensors, its checksum (if it has one) does not match, or a
    floating-point tensor holds NaN or inf."""
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"missing {path}")
    try:
        with safe_open(str(path), "pt") as f:
            metadata = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise BadInput(f"corrupt checkpoint {path}: {err}") from err
    expected = metadata.pop(CHECKSUM, None)
    if expected is not None and tensor_checksum(tensors, metadata) != expected:
        raise BadInput(
            f"corrupt checkpoint {path}: the tensors do not match the file's {CHECKSUM} checksum (torn or altered bytes)"
        )
    for name, t in tensors.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise BadInput(f"corrupt checkpoint {path}: tensor {name!r} holds NaN or inf")
    return tensors, metadata


def check_model_target(directory: Path, overwrite: bool = False) -> None:
    """Refuse a ``directory`` that already holds a model (unless ``overwrite``): what ``save_model``
    checks, for verbs that check it before long work."""
    existing = [name for name in (WEIGHTS, CONFIG, "tokenizer.json") if (directory / name).exists()]
    if existing and not overwrite:
        raise OutputExists(f"{directory} already holds a model ({', '.join(existing)}): pass overwrite=True to replace it")


def save_model(
    model: DecoderLM,
    directory: str | Path,
    tokenizer: TokenizerBase | None = None,
    extra: dict | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Save weights, config (``{"arch", "model", **extra}``) and tokenizer into ``directory``,
    holding it while they are written; a model already there is replaced only with ``overwrite``."""
    directory = Path(directory)
    check_model_target(directory, overwrite)
    with output(directory, "model"):
        save_weights(directory / WEIGHTS, model.state_dict(), {"arch": model.arch})
        config = {"arch": model.arch, "model": model.cfg.to_dict(), **(extra or {})}
        write_json(directory / CONFIG, config)
        (tokenizer or CharTokenizer()).save(directory, model.cfg.n_ctx)
    return directory


def load_model(directory: str | Path, device=None, dtype=None) -> DecoderLM:
    """The model saved in ``directory`` (eval mode)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise MissingFile(f"no run directory at {directory}")
    config = read_json(directory / CONFIG)
    for key in ("arch", "model"):
        if key not in config:
            raise BadInput(f"{directory / CONFIG} has no {key!r} field")
    return model_from_weights(config["arch"], config["model"], directory / WEIGHTS, directory / CONFIG, device, dtype)


def model_from_weights(arch: str, values: object, weights: Path, config_path: Path, device=None, dtype=None) -> DecoderLM:
    """The ``arch`` model configured by ``values`` (the model section read from ``config_path``)
    holding the tensors of ``weights`` (eval mode). The file's tensor names and shapes are checked
    against the config's before the model is allocated, so a wrong config fails fast."""
    try:
        cfg = config_from_dict(arch, values)
    except BadInput as err:
        raise BadInput(f"bad model config in {config_path}: {err}") from err
    # the file's tensors and the model both live in memory until the model is returned; a size no
    # machine holds (n_layers 10^9) is named here, before even the meta-device build below, which
    # would take as long as the number of modules it makes
    check_model_fits(cfg, copies=2, where=f"bad model config in {config_path}: ", device=device, dtype=dtype)
    tensors, _ = load_weights(weights)
    for name, t in tensors.items():  # load_state_dict would silently cast integers and bools to floats
        if not t.is_floating_point():
            raise BadInput(
                f"{weights}: tensor {name!r} has dtype {str(t.dtype).removeprefix('torch.')}; model weights "
                "must be floating point"
            )
    try:
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in ARCHS[arch][1](cfg).state_dict().items()}
    except (RuntimeError, OverflowError, TypeError) as err:  # sizes past what torch can even describe
        raise BadInput(
            f"bad model config in {config_path}: a size torch cannot allocate ({str(err).splitlines()[0][:160]})"
        ) from err
    problems = [f"{k} missing" for k in expected if k not in tensors]
    problems += [f"unexpected {k}" for k in tensors if k not in expected]
    problems += [
        f"{k} is {list(tensors[k].shape)}, the config needs {list(shape)}"
        for k, shape in expected.items()
        if k in tensors and tuple(tensors[k].shape) != shape
    ]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise BadInput(f"{weights} does not match the config in {config_path}: {'; '.join(problems[:3])}{more}")
    model = model_from_config(arch, cfg)
    model.load_state_dict(tensors, strict=True)
    return model.to(device=device, dtype=dtype).eval()


def resolve_model(spec: str, device=None, dtype=None) -> DecoderLM:
    """A run directory, or ``ARCH:PRESET`` (optionally ``ARCH:PRESET:SEED``) for a fresh model."""
    if Path(spec).exists():
        return load_model(spec, device, dtype)
    parts = spec.split(":")
    if len(parts) in (2, 3) and all(parts):
        try:
            seed = int(parts[2]) if len(parts) == 3 else 0
        except ValueError:
            raise BadInput(f"{spec!r}: seed {parts[2]!r} is not an integer") from None
        if not -(2**63) <= seed < 2**64:  # the range torch.manual_seed takes
            raise BadInput(f"{spec!r}: seed {seed} is out of range [-2**63, 2**64)")
        return build_model(parts[0], parts[1], seed=seed, device=device, dtype=dtype)
    raise BadInput(f"{spec!r} is neither a run directory nor ARCH:PRESET[:SEED] (e.g. fbt:debug)")


def run_labels(runs: Sequence, names: Sequence[str] | None) -> list[str]:
    """What a side-by-side study calls its ``runs``: ``names`` (one each) or their directory names;
    ``BadInput`` before any work where two would share one (the results are keyed by it)."""
    chosen = [Path(run).name for run in runs] if names is None else [str(n) for n in names]
    if len(chosen) != len(runs) or not all(chosen):
        raise BadInput(f"names {list(chosen)}: expected one non-empty name per run ({len(runs)})")
    if len(set(chosen)) < len(chosen):
        twice = sorted({n for n in chosen if chosen.count(n) > 1})
        raise BadInput(f"two runs share the name {', '.join(twice)}: the results are keyed by it; pass --names, one per run")
    return chosen
