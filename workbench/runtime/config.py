"""Architectures, presets and typed overrides: ``build_model('fbt', preset='tiny', d_model=96)``."""

from __future__ import annotations

import math
import os
import resource
import typing
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from models import (
    BaselineLM,
    ConfigError,
    DecoderLM,
    FBTConfig,
    FullBandwidthLM,
    HDConfig,
    HiddenDecodingLM,
    ModelConfig,
    check_config,
    check_fields,
    preset,
)
from models.fields import field_types, type_name
from workbench.storage.errors import BadInput

ARCHS: dict[str, tuple[type[ModelConfig], type[DecoderLM]]] = {
    "baseline": (ModelConfig, BaselineLM),
    "fbt": (FBTConfig, FullBandwidthLM),
    "hd": (HDConfig, HiddenDecodingLM),
}


@contextmanager
def config_errors():
    """Inside the block, the one validator's ``models.ConfigError`` (a config field or preset the
    model configs reject) becomes the workbench's ``BadInput`` with the same message."""
    try:
        yield
    except ConfigError as err:
        raise BadInput(str(err)) from err


def _arch(arch: str) -> tuple[type[ModelConfig], type[DecoderLM]]:
    if not isinstance(arch, str) or arch not in ARCHS:
        raise BadInput(f"unknown architecture {arch!r}: expected one of {sorted(ARCHS)}")
    return ARCHS[arch]


def make_config(arch: str, preset_name: str = "debug", **overrides) -> ModelConfig:
    """The config of ``arch`` at ``preset_name`` with ``overrides`` applied and validated."""
    cfg_cls, _ = _arch(arch)
    with config_errors():
        check_fields(cfg_cls, overrides, where=f"for arch {arch!r}")
        return cfg_cls(**{**preset(preset_name), **overrides})


def config_from_dict(arch: str, values: object) -> ModelConfig:
    """Rebuild a config saved with ``dataclasses.asdict`` (lists back to tuples); unknown and
    wrongly typed fields are errors naming the field."""
    cfg_cls, _ = _arch(arch)
    if not isinstance(values, dict):
        raise BadInput(f"the model config must be a JSON object, got {type(values).__name__}")
    with config_errors():
        check_fields(cfg_cls, values, where=f"for arch {arch!r}")
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return cfg_cls(**fields)


def check_json_fields(cls, values: dict, where: str = "", prefix: str = "") -> None:
    """``models.check_fields`` (the one validator) on values read from JSON for the dataclass
    ``cls``, raising ``BadInput``; ``prefix`` qualifies field names (``train.``)."""
    with config_errors():
        check_fields(cls, values, prefix=prefix, where=where)


def check_section(cfg) -> None:
    """The one validator on a built workbench config section (the ``train``, ``data``, ``fbt`` and
    ``hd`` dataclasses call it first in ``__post_init__``): a wrongly typed field is a ``BadInput``."""
    with config_errors():
        check_config(cfg)


def model_from_config(arch: str, cfg: ModelConfig, *, seed: int = 0, device=None, dtype=None) -> DecoderLM:
    """A freshly initialised ``arch`` model of ``cfg`` (eval mode), refused with ``BadInput`` naming
    the fields that make it large when its weights cannot fit in memory (checked before anything is
    allocated: it is built on the CPU, then moved)."""
    _, model_cls = _arch(arch)
    check_model_fits(cfg, device=device, dtype=dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(cfg)
    return model.to(device=device, dtype=dtype).eval()


def build_model(
    arch: str,
    preset: str = "debug",
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **overrides,
) -> DecoderLM:
    """A freshly initialised model (in eval mode). ``arch`` is ``baseline``, ``fbt`` or ``hd``;
    ``overrides`` are config fields (``d_model=96``, ``n_streams=4``, ``fusion='add'``)."""
    return model_from_config(arch, make_config(arch, preset, **overrides), seed=seed, device=device, dtype=dtype)


def parse_override(arch: str, text: str, sections: dict[str, type] | None = None) -> tuple[str, object]:
    """The one parser of typed overrides. ``'n_streams=4'`` -> ``('n_streams', 4)``, typed by the
    field of ``arch``'s model config that it names. With ``sections`` (a run config's, e.g.
    ``{"train": TrainConfig, ...}``) the text is ``SECTION.FIELD=VALUE``, ``model`` naming the model
    config, and the name returned is ``'SECTION.FIELD'`` (``workbench train --set``). Errors
    (``BadInput``) name the text, the field and the type it expects; whether the value is in range
    is the config's to say when it is built."""
    cfg_cls, _ = _arch(arch)
    if "=" not in text:
        raise BadInput(f"malformed override {text!r}: expected {'SECTION.FIELD' if sections else 'FIELD'}=VALUE")
    key, raw = (part.strip() for part in text.split("=", 1))
    cls, name = cfg_cls, key
    if sections:
        section, _, name = key.partition(".")
        valid = {"model": cfg_cls, **sections}
        if not name or section not in valid:
            raise BadInput(f"malformed override {text!r}: expected SECTION.FIELD=VALUE with SECTION in {list(valid)}")
        cls = valid[section]
    kinds = field_types(cls)
    if name not in kinds:
        raise BadInput(f"unknown config field {key!r} in override {text!r}: expected one of {sorted(kinds)}")
    try:
        return key, _coerce(kinds[name], raw)
    except ValueError as err:
        raise BadInput(f"malformed override {text!r}: field {key} expects {type_name(kinds[name])}") from err


def _coerce(kind, raw: str):
    """Parse ``raw`` as the annotated type ``kind`` (int, float, bool, str, tuples, optionals)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, type(int | None)):
        if raw.lower() in ("none", "null"):
            if type(None) in args:
                return None
        return _coerce(next(a for a in args if a is not type(None)), raw)
    if typing.get_origin(kind) is tuple:
        items = [item for item in raw.strip("()[] ").split(",") if item.strip()]
        return tuple(_coerce(args[0], item.strip()) for item in items)
    if kind is bool:
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise ValueError(raw)
    if kind is int:
        return int(raw)
    if kind is float:
        value = float(raw)
        if math.isnan(value):
            raise ValueError(raw)
        return value
    return raw


# ---- sizes: what a config needs, known before anything is allocated ---------------------------

# The sizes a model's parameter count grows with, and the values a refusal compares them with to say
# which of them make a config large (the debug preset's; one stream).
SIZE_FIELDS = ("d_vocab", "d_model", "n_layers", "d_mlp", "n_streams")
REFERENCE_SIZES = {"d_vocab": 128, "d_model": 32, "n_layers": 2, "d_mlp": 96, "n_streams": 1}
FLOAT32 = 4  # bytes per parameter of a model as the workbench builds it


def model_sizes(cfg: ModelConfig) -> dict[str, int]:
    """``SIZE_FIELDS`` of ``cfg`` (``n_streams`` is 1 for an architecture without streams)."""
    return {name: getattr(cfg, name, 1) for name in SIZE_FIELDS}


def parameter_count(cfg: ModelConfig, sizes: dict[str, int] | None = None) -> int:
    """Exactly ``sum(p.numel() for p in model.parameters())`` of the model ``cfg`` describes (any
    architecture), computed from its sizes alone: Python integers, so no size overflows and
    nothing is allocated. ``sizes`` replaces some of ``SIZE_FIELDS`` (what-if counts)."""
    s = {**model_sizes(cfg), **(sizes or {})}
    d, n_heads = s["d_model"], cfg.n_heads
    kv = (cfg.n_kv_heads or n_heads) * d // n_heads  # n_kv_heads x d_head
    block = 2 * d * d + 2 * d * kv + 3 * d * s["d_mlp"] + 2 * d  # W_Q, W_O; W_K, W_V; SwiGLU's three; two norms
    fusion = {"glu": 2, "add": 1}.get(getattr(cfg, "fusion", ""), 0) * d * d  # FBT's W_U (and W_G)
    tables = s["n_streams"] * s["d_vocab"] * d  # one embedding table per stream (HD), else one
    readout = 0 if cfg.tie_embeddings else s["d_vocab"] * d
    return tables + readout + s["n_layers"] * block + d + fusion  # + the final norm


def model_bytes(cfg: ModelConfig, bytes_per_parameter: int = FLOAT32) -> int:
    """Bytes of the weights of the model ``cfg`` describes (``parameter_count`` x the dtype's size)."""
    return parameter_count(cfg) * bytes_per_parameter


def _itemsize(dtype) -> int:
    return FLOAT32 if dtype is None else torch.empty((), dtype=dtype).element_size()


def memory_available(device=None) -> tuple[int, str]:
    """Bytes this process can still allocate on ``device`` (default: the CPU), and where the number
    comes from. The CPU's is the least of ``MemAvailable`` + ``SwapFree`` (``/proc/meminfo``; the
    physical pages ``os.sysconf`` reports where there is none), the cgroup's limit less its usage
    and the address-space limit (``ulimit -v``) less what this process has mapped. A CUDA device's
    is its free memory."""
    if device is not None and torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free, f"free memory of {device}"
    limits = []
    info = _proc_fields("/proc/meminfo")
    if "MemAvailable" in info:
        limits.append((info["MemAvailable"] + info.get("SwapFree", 0), "MemAvailable + SwapFree in /proc/meminfo"))
    else:
        try:
            limits.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available physical pages"))
        except (ValueError, OSError):
            pass
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 2**60:  # v1 writes a huge number for none
            limits.append((max(limit - usage, 0), f"the cgroup limit {limit_file} less its usage"))
            break
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        mapped = _proc_fields("/proc/self/status").get("VmSize", 0)
        limits.append((max(soft - mapped, 0), "the address-space limit (ulimit -v) less what this process maps"))
    if not limits:
        return 2**63, "no limit found"
    return min(limits)


def _proc_fields(path: str) -> dict[str, int]:
    """``NAME: N kB`` lines of a /proc file, in bytes."""
    fields = {}
    try:
        for line in Path(path).read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                fields[name] = int(parts[0]) * 1024
    except OSError:
        pass
    return fields


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def human_bytes(n: int) -> str:
    """``47.5 TiB`` (past YiB: ``3.2e+08 YiB``)."""
    value = float(n) if n < 2**1000 else math.inf
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
    unit = 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{int(value)} bytes" if unit == 0 else f"{value:.3g} {units[unit]}"


def check_fits(
    need: Callable[[dict[str, int]], int],
    sizes: dict[str, int],
    what: str,
    *,
    reference: dict[str, int] | None = None,
    labels: dict[str, str] | None = None,
    where: str = "",
    device=None,
) -> None:
    """Refuse with ``BadInput`` when ``need(sizes)`` bytes (``what`` they hold) exceed the memory
    available on ``device``, naming the sizes that make it large: those that at their reference
    value (``reference``, default ``REFERENCE_SIZES``) alone would make it fit, else those that
    would shrink it tenfold, else the one that would shrink it most. ``labels`` spells a size as
    its source names it (``model.n_layers``, ``num_hidden_layers``); ``where`` prefixes the message
    (the file)."""
    total = need(sizes)
    available, source = memory_available(device)
    if total <= available:
        return
    reference = {**REFERENCE_SIZES, **(reference or {})}
    smaller = {
        name: need({**sizes, name: reference[name]}) for name in sizes if name in reference and sizes[name] > reference[name]
    }
    ranked = sorted(smaller, key=lambda name: smaller[name])
    # the sizes that alone bring the need within reach; else those that shrink it tenfold or more
    large = [name for name in ranked if smaller[name] <= available]
    large = large or [name for name in ranked if smaller[name] * 10 <= total] or ranked[:1]
    named = ", ".join(f"{(labels or {}).get(name, name)}={sizes[name]}" for name in large) or "this config"
    on = f" on {device}" if device is not None else ""
    raise BadInput(
        f"{where}{named}: {what} need {human_bytes(total)}, more than the {human_bytes(available)} of memory "
        f"available{on} ({source})"
    )


def check_model_fits(
    cfg: ModelConfig,
    *,
    copies: int = 1,
    labels: dict[str, str] | None = None,
    where: str = "",
    device=None,
    dtype=None,
) -> None:
    """``check_fits`` for ``copies`` of the float32 weights of the model ``cfg`` describes in the
    CPU's memory (where models are built) and, for a CUDA ``device``, one copy in ``dtype`` there:
    what every place that builds a model from a config calls before building it."""
    count = parameter_count(cfg)
    what = f"the model's {count:,} parameters" if count < 10**15 else f"the model's {count:.3g} parameters"
    copies_note = f" ({copies} copies)" if copies > 1 else ""
    sizes = model_sizes(cfg)
    check_fits(lambda s: copies * FLOAT32 * parameter_count(cfg, s), sizes, what + copies_note, labels=labels, where=where)
    if device is not None and torch.device(device).type == "cuda":
        size = _itemsize(dtype)
        check_fits(lambda s: size * parameter_count(cfg, s), sizes, what, labels=labels, where=where, device=device)
