"""Answer rules: what counts as the answer of a generation, and when it is correct."""

from __future__ import annotations

import re

from workbench.data.example import Example

# GSM8K's official extraction (openai/grade-school-math, dataset.py): "#### " with exactly one space,
# then an optional minus and ASCII digits, dots and commas; commas are removed, nothing else is.
TRACED = ("chain", "addition", "gsm8k")  # tasks answered after a written trace
_FINAL = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def parse_final_answer(text: str) -> str | None:
    """The answer after the first ``#### `` by GSM8K's official rule, commas removed, or None where
    that rule finds none. So ``####72`` (no space), ``####  72`` (two) and non-ASCII digits give
    None, and ``#### 72.`` gives ``72.``, which is not ``72``: the scores are GSM8K's own."""
    match = _FINAL.search(text)
    return match.group(1).replace(",", "") if match else None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (commas removed), or None: a lenient diagnostic for models that
    answer in prose instead of writing ``#### N``, reported beside the ``####`` rule, never instead."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def is_correct(example: Example, generated: str) -> bool:
    """Chain, addition, GSM8K: the number after ``####``. Other tasks: the generation starts with
    the answer (whether the model then stops is not scored)."""
    if example.task in TRACED:
        return parse_final_answer(generated) == example.answer
    return bool(example.answer) and generated.startswith(example.answer)
