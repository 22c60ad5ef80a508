"""Answer rules: what counts as the answer of a generation, and when it is correct."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.data.tasks import Example

_FINAL = re.compile(r"####\s*(.*)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def parse_final_answer(text: str) -> str | None:
    """The number after the first ``####`` (commas removed), or None when there is none or it
    is not numeric. Text after the number on the same line is ignored."""
    match = _FINAL.search(text)
    if not match:
        return None
    number = _NUMBER.match(match.group(1).strip())
    return number.group(0).replace(",", "") if number else None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (commas removed), or None: a lenient diagnostic for models that
    answer in prose instead of writing ``#### N``, reported beside the ``####`` rule, never instead."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def is_correct(example: Example, generated: str) -> bool:
    """Chain/GSM8K: the number after ``####``. Other tasks: the generation starts with the answer
    (whether the model then stops is not scored)."""
    if example.task in ("chain", "gsm8k"):
        return parse_final_answer(generated) == example.answer
    return bool(example.answer) and generated.startswith(example.answer)
