"""``metrics.jsonl``: one JSON record per logged training step, appended by the training loop."""

from __future__ import annotations

import json
from pathlib import Path

from workbench.storage.errors import BadInput


def read_metrics(path: Path) -> list[dict]:
    """The records of ``metrics.jsonl`` (none if it is missing). A torn last line (a process killed
    while appending it) is dropped; a corrupt line before it is an error naming the line."""
    if not path.is_file():
        return []
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError
        except (ValueError, RecursionError):
            if number == len(lines):
                break
            raise BadInput(f"corrupt line {number} of {path}: {line[:60]!r}") from None
        records.append(record)
    return records


def logged_seconds(path: Path, batch_tokens: int) -> float:
    """The training time of a run from its ``metrics.jsonl``: each record's window (the steps since
    the record before it, or since step 0) at the record's ``tokens_per_s``, with ``batch_tokens``
    tokens a step. A resumed run dropped its records after the checkpoint it resumed from, so this
    is the time of the steps the run kept, over every session that trained it; model building,
    checkpoint loading before the first step and evaluation are not in it. (A resume from a
    checkpoint between two records counts the steps from the earlier record at the resumed
    window's rate: exact where checkpoints fall on logged steps, as in the zoo.)"""
    seconds, previous = 0.0, 0
    for record in read_metrics(path):
        seconds += (record["step"] - previous) * batch_tokens / record["tokens_per_s"]
        previous = record["step"]
    return seconds
