"""Model checkpoints: ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``), written
atomically, loaded without pickle, with errors that name the file and the problem."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from models import DecoderLM
from workbench.config import build_model, config_from_dict, model_from_config
from workbench.tokenizer import CharTokenizer

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def atomic_write(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` then rename, so a crash never leaves a half-written file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n"))


def read_json(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"missing {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"corrupt JSON in {path}: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def save_model(model: DecoderLM, directory: str | Path, tokenizer: CharTokenizer | None = None, extra: dict | None = None) -> Path:
    """Save weights, config (``{"arch", "model", **extra}``) and tokenizer into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write(directory / WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"arch": model.arch}))
    config = {"arch": model.arch, "model": model.cfg.to_dict(), **(extra or {})}
    write_json(directory / CONFIG, config)
    (tokenizer or CharTokenizer()).save(directory, model.cfg.n_ctx)
    return directory


def load_model(directory: str | Path, device=None, dtype=None) -> DecoderLM:
    """The model saved in ``directory`` (eval mode)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no run directory at {directory}")
    config = read_json(directory / CONFIG)
    for key in ("arch", "model"):
        if key not in config:
            raise ValueError(f"{directory / CONFIG} has no {key!r} field")
    try:
        cfg = config_from_dict(config["arch"], config["model"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"bad model config in {directory / CONFIG}: {err}") from err
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"missing {weights}")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"corrupt checkpoint {weights}: {err}") from err
    model = model_from_config(config["arch"], cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{weights} does not match the config in {directory / CONFIG}: {err}") from err
    return model.to(device=device, dtype=dtype).eval()


def load_tokenizer(directory: str | Path) -> CharTokenizer:
    return CharTokenizer.load(directory)


def resolve_model(spec: str, device=None, dtype=None) -> DecoderLM:
    """A run directory, or ``ARCH:PRESET`` (optionally ``ARCH:PRESET:SEED``) for a fresh model."""
    if Path(spec).exists():
        return load_model(spec, device, dtype)
    parts = spec.split(":")
    if len(parts) in (2, 3) and all(parts):
        seed = int(parts[2]) if len(parts) == 3 else 0
        return build_model(parts[0], parts[1], seed=seed, device=device, dtype=dtype)
    raise ValueError(f"{spec!r} is neither a run directory nor ARCH:PRESET[:SEED] (e.g. fbt:debug)")
