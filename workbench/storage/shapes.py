"""The shape a JSON file the workbench wrote must still have for its readers: a file edited by hand,
cut short or written by another version is refused with one line naming the file, the field and
what was expected, before a page or a verb indexes into it.

A shape is a Python value:
- ``int``, ``float`` (any number; never a bool), ``str``, ``bool``, ``None``: a leaf of that type;
  a tuple of leaves: any one of them;
- ``[shape]``: a list whose every item has ``shape``;
- ``{"field": shape, "other?": shape}``: an object with those fields (``?``: may be absent;
  other fields are allowed);
- ``Each(shape)``: an object of any field names, every value of ``shape``;
- ``Check(shape, test, words)``: a value of ``shape`` that ``test`` accepts, described by ``words``
  (``Check(int, lambda v: v >= 0, "an integer >= 0")``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.storage.errors import BadInput

_LEAVES = {int: "a whole number", float: "a number", str: "a string", bool: "true or false", None: "null"}


@dataclass(frozen=True)
class Each:
    shape: object


@dataclass(frozen=True)
class Check:
    shape: object
    test: Callable[[Any], bool]
    words: str


COUNT = Check(int, lambda v: v >= 0, "an integer >= 0")
FRACTION = Check(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")


def describe(shape, plural: bool = False) -> str:
    """``shape`` in words: "a list of whole numbers"; ``plural``: "lists of whole numbers"."""
    if isinstance(shape, tuple):
        return " or ".join(describe(s, plural) for s in shape)
    if isinstance(shape, Check):
        return shape.words
    if isinstance(shape, list):
        return ("lists of " if plural else "a list of ") + describe(shape[0], plural=True)
    if isinstance(shape, (dict, Each)):
        return "objects" if plural else "an object"
    if plural:
        return {None: "nulls", bool: "true or false"}.get(shape) or _LEAVES[shape].removeprefix("a ") + "s"
    return _LEAVES[shape]


def _leaf(value, shape) -> bool:
    if shape is None:
        return value is None
    if shape is bool:
        return isinstance(value, bool)
    if shape is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, shape) and not isinstance(value, bool)


def _problem(value, shape, where: str) -> tuple[str, object, object] | None:
    """(field, shape, value) of the first place where ``value`` does not have ``shape``, or None."""
    if isinstance(shape, tuple):
        return None if any(_problem(value, s, where) is None for s in shape) else (where, shape, value)
    if isinstance(shape, Check):
        return None if _problem(value, shape.shape, where) is None and shape.test(value) else (where, shape, value)
    if isinstance(shape, list):
        if not isinstance(value, list):
            return where, shape, value
        for i, item in enumerate(value):
            if (found := _problem(item, shape[0], f"{where}[{i}]")) is not None:
                return found
        return None
    if isinstance(shape, Each):
        if not isinstance(value, dict):
            return where, shape, value
        for key, item in value.items():
            if (found := _problem(item, shape.shape, f"{where}.{key}" if where else key)) is not None:
                return found
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return where, shape, value
        for field, inner in shape.items():
            name = field.removesuffix("?")
            here = f"{where}.{name}" if where else name
            if name not in value:
                if field.endswith("?"):
                    continue
                return here, inner, "nothing"
            if (found := _problem(value[name], inner, here)) is not None:
                return found
        return None
    return None if _leaf(value, shape) else (where, shape, value)


def check_shape(value, shape, path: str | Path) -> None:
    """Refuse ``value``, read from ``path``, unless it has ``shape`` (see the module docstring)."""
    found = _problem(value, shape, "")
    if found is not None:
        where, expected, got = found
        shown = got if got == "nothing" else repr(got)[:60]
        field = f"field '{where}'" if where else "the file"
        raise BadInput(f"{path}: {field} must be {describe(expected)}, got {shown}")
