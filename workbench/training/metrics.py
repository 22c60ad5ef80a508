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
        except ValueError:
            if number == len(lines):
                break
            raise BadInput(f"corrupt line {number} of {path}: {line[:60]!r}") from None
        records.append(record)
    return records
