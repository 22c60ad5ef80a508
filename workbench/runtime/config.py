"""Architectures, presets and typed overrides: ``build_model('fbt', preset='tiny', d_model=96)``."""

from __future__ import annotations

import math
import typing
from contextlib import contextmanager
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
