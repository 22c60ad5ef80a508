"""Architectures, presets and typed overrides: ``build_model('fbt', preset='tiny', d_model=96)``."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing

import torch

from models import (
    BaselineLM,
    DecoderLM,
    FBTConfig,
    FullBandwidthLM,
    HDConfig,
    HiddenDecodingLM,
    ModelConfig,
    preset,
)

ARCHS: dict[str, tuple[type[ModelConfig], type[DecoderLM]]] = {
    "baseline": (ModelConfig, BaselineLM),
    "fbt": (FBTConfig, FullBandwidthLM),
    "hd": (HDConfig, HiddenDecodingLM),
}


def _arch(arch: str) -> tuple[type[ModelConfig], type[DecoderLM]]:
    if not isinstance(arch, str) or arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}: expected one of {sorted(ARCHS)}")
    return ARCHS[arch]


def make_config(arch: str, preset_name: str = "debug", **overrides) -> ModelConfig:
    """The config of ``arch`` at ``preset_name`` with ``overrides`` applied and validated."""
    cfg_cls, _ = _arch(arch)
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown config field {unknown[0]!r} for arch {arch!r}: expected one of {sorted(fields)}")
    return cfg_cls(**{**preset(preset_name), **overrides})


def config_from_dict(arch: str, values: dict) -> ModelConfig:
    """Rebuild a config saved with ``dataclasses.asdict`` (lists back to tuples); unknown and
    wrongly typed fields are errors naming the field."""
    cfg_cls, _ = _arch(arch)
    if not isinstance(values, dict):
        raise ValueError(f"the model config must be a JSON object, got {type(values).__name__}")
    check_json_fields(cfg_cls, values, f"for arch {arch!r}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cfg_cls(**values)


def check_json_fields(cls, values: dict, where: str = "", prefix: str = "") -> None:
    """Raise ValueError for a key of ``values`` that is not a field of the dataclass ``cls`` or whose
    JSON value does not have the field's type; ``prefix`` qualifies field names (``train.``)."""
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        if name not in hints:
            where = f" {where}" if where else ""
            raise ValueError(f"unknown config field {prefix + str(name)!r}{where}: expected one of {sorted(hints)}")
        if not fits(hints[name], value):
            raise ValueError(f"config field {prefix}{name}={value!r}: expected {_type_name(hints[name])}")


def fits(kind, value) -> bool:
    """Whether a JSON value has the annotated type: ints pass as floats, lists as tuples, NaN never."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return any(fits(a, value) for a in args)
    if typing.get_origin(kind) is tuple:
        return isinstance(value, (list, tuple)) and all(fits(args[0], v) for v in value)
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if kind is str:
        return isinstance(value, str)
    return True


def model_from_config(arch: str, cfg: ModelConfig, *, seed: int = 0, device=None, dtype=None) -> DecoderLM:
    _, model_cls = _arch(arch)
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


def parse_override(arch: str, text: str) -> tuple[str, object]:
    """``'n_streams=4'`` -> ``('n_streams', 4)``, typed by the config field it names."""
    cfg_cls, _ = _arch(arch)
    if "=" not in text:
        raise ValueError(f"malformed override {text!r}: expected FIELD=VALUE")
    name, raw = (part.strip() for part in text.split("=", 1))
    hints = typing.get_type_hints(cfg_cls)
    if name not in hints:
        raise ValueError(f"unknown config field {name!r} in override {text!r}: expected one of {sorted(hints)}")
    try:
        return name, coerce(hints[name], raw)
    except (ValueError, json.JSONDecodeError) as err:
        raise ValueError(f"malformed override {text!r}: field {name} expects {_type_name(hints[name])}") from err


def coerce(kind, raw: str):
    """Parse ``raw`` as the annotated type ``kind`` (int, float, bool, str, tuples, optionals)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if raw.lower() in ("none", "null"):
            if type(None) in args:
                return None
        return coerce(next(a for a in args if a is not type(None)), raw)
    if typing.get_origin(kind) is tuple:
        items = [item for item in raw.strip("()[] ").split(",") if item.strip()]
        return tuple(coerce(args[0], item.strip()) for item in items)
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


def _type_name(kind) -> str:
    if typing.get_args(kind):  # tuple[int, ...], int | None: the whole annotation, not "tuple"
        return str(kind).replace("typing.", "")
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
