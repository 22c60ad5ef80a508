"""The one validator of config fields, for every config dataclass: the models' (``ModelConfig`` and
its subclasses check themselves when built) and the workbench's (training sections, task
parameters, configs read from JSON). It lives here because the model configs need it and the
models package imports nothing of the workbench.

A value fits a field when it has the field's annotated type: ints pass as floats, lists as tuples
(JSON has no tuples), ``None`` only where the annotation allows it, bools only as bools, NaN never.
Ranges are each config's own ``__post_init__``; every error names the field, the value and what
was expected."""

from __future__ import annotations

import dataclasses
import math
import typing

_UNION_TYPE = type(int | None)  # types.UnionType, without importing types


class ConfigError(ValueError):
    """A config field with a value it cannot take, or a field the config does not have."""


class FieldTypeError(ConfigError, TypeError):
    """A config field whose value has the wrong type (a ``TypeError`` too, so that code
    catching ``TypeError`` for a wrongly typed value still catches it)."""


_HINTS: dict[type, dict[str, object]] = {}


def field_types(cls: type) -> dict[str, object]:
    """The annotated type of every field of the dataclass ``cls`` (annotations resolved)."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def fits(kind, value) -> bool:
    """Whether ``value`` has the annotated type ``kind`` (see the module docstring)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, _UNION_TYPE):
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


def type_name(kind) -> str:
    """``int``, ``tuple[int, ...] | None``: an annotation as a message shows it."""
    if typing.get_args(kind):  # tuple[int, ...], int | None: the whole annotation, not "tuple"
        return str(kind).replace("typing.", "")
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


def check_fields(cls: type, values: dict, *, prefix: str = "", where: str = "") -> None:
    """Raise ``ConfigError`` for a key of ``values`` that is not a field of the dataclass ``cls``,
    and ``FieldTypeError`` for a value that does not fit its field. ``prefix`` qualifies field
    names in messages (``train.``), ``where`` says whose fields they are (``for arch 'fbt'``)."""
    kinds = field_types(cls)
    for name, value in values.items():
        if name not in kinds:
            where_ = f" {where}" if where else ""
            raise ConfigError(f"unknown config field {prefix + str(name)!r}{where_}: expected one of {sorted(kinds)}")
        if not fits(kinds[name], value):
            raise FieldTypeError(f"config field {prefix}{name}={value!r}: expected {type_name(kinds[name])}")


def check_config(cfg, *, prefix: str = "") -> None:
    """``check_fields`` on a built config: what its ``__post_init__`` calls first."""
    check_fields(type(cfg), {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, prefix=prefix)
