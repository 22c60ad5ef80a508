"""The readings table of ``fbt-vs-baseline``, the fair study (``workbench.experiments.fbt_vs_baseline``,
which trains and measures it with its own runner): the readings table is all the comparison
studies' registry needs of it."""

from __future__ import annotations

from workbench.experiments.studies.common import crossed_text


def rows(study: dict) -> list[dict]:
    """Accuracy on the shared test problems per member and regime, seeds x problems crossed."""
    return [
        {"member": member, "regime": regime, "accuracy": crossed_text(c)}
        for member, regimes in study.get("readings", {}).get("accuracy", {}).items()
        for regime, c in regimes.items()
    ]
