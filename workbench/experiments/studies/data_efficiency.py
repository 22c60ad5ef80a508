"""``data-efficiency`` (the FBT paper: FBT matches a baseline trained on 1.5-2x the tokens):
``baseline`` and ``fbt`` at three token budgets (a quarter, a half and all of the zoo's steps, each
a run with its own schedule). The validation loss is the completion loss on held-out problems
(``answer_loss``, what training scores), averaged over the tasks; for each FBT budget and regime,
the tokens the baseline needs to reach FBT's loss, interpolated on the baseline's curve in log
tokens (``tokens_to_reach``), divided by FBT's tokens: the token ratio."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from workbench.experiments.studies.common import FBT_REGIMES, Member, add_paired, completion_loss, interval_text
from workbench.training.intervals import seed_interval
from workbench.training.zoo import SCALES

BUDGETS = (0.25, 0.5, 1.0)  # fractions of the scale's training steps


def members(scale: str) -> list[Member]:
    steps = SCALES[scale]["steps"]
    return [
        (f"{arch}-steps{round(f * steps)}", arch, [f"train.steps={round(f * steps)}"], None)
        for f in BUDGETS
        for arch in ("baseline", "fbt")
    ]


def measure(models: dict, out: Path, scale: str, threads: int, jobs: int) -> dict:
    return data_efficiency(models)


def tokens_to_reach(curve: Sequence[tuple[float, float]], loss: float) -> tuple[float, str]:
    """The training tokens at which a loss curve ``[(tokens, loss), ...]`` (increasing tokens) first
    reaches ``loss``, by linear interpolation in log tokens between the two budgets it falls between:
    ``(tokens, "=")``. Below the curve's last loss: ``(last tokens, ">")`` (it needs more than its
    largest budget); at or above its first: ``(first tokens, "<")``."""
    if loss >= curve[0][1]:
        return curve[0][0], "<"
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= loss < l0:
            w = (l0 - loss) / (l0 - l1)
            return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0))), "="
    return curve[-1][0], ">"


def data_efficiency(models: dict) -> dict:
    """Per FBT budget and regime: FBT's loss, the baseline's loss at the same tokens, and the token
    ratio (baseline tokens to reach FBT's loss / FBT's tokens) per seed, with the across-seed
    interval of the ratios that the baseline's budgets bracket (``censored`` counts the others)."""
    by_seed: dict[int, dict[str, dict]] = {}
    for row in models.values():
        by_seed.setdefault(int(row["seed"]), {})[row["member"]] = row
    budgets = sorted({int(row["tokens"]) for row in models.values() if row["member"].startswith("fbt")})
    readings = {}
    for tokens in budgets:
        for regime in FBT_REGIMES:
            ratios, censored, fbt_losses, base_losses = [], [], [], []
            for members in by_seed.values():
                base = sorted(
                    (int(r["tokens"]), completion_loss(r, "standard")) for m, r in members.items() if m.startswith("baseline")
                )
                fbt = [r for m, r in members.items() if m.startswith("fbt") and int(r["tokens"]) == tokens]
                if not fbt or not base:
                    continue
                loss = completion_loss(fbt[0], regime)
                reach, how = tokens_to_reach(base, loss)
                fbt_losses.append(loss)
                base_losses += [b for t, b in base if t == tokens]
                if how == "=":
                    ratios.append(reach / tokens)
                else:  # outside the baseline's budgets: a bound, e.g. ">2" (needs more than twice)
                    censored.append(f"{how}{reach / tokens:.3g}")
            if not fbt_losses:
                continue
            readings[f"{tokens}/{regime}"] = {
                "tokens": tokens,
                "regime": regime,
                "fbt_loss": seed_interval(fbt_losses),
                "baseline_loss": seed_interval(base_losses) if base_losses else None,
                "token_ratio": seed_interval(ratios) if ratios else None,
                "censored": censored,
            }
    return readings


def family(readings: dict) -> dict[str, dict]:
    """FBT's completion loss minus the baseline's at the same tokens, per budget and regime."""
    cells = {}
    for r in readings.values():
        if r.get("baseline_loss"):
            add_paired(
                cells,
                f"fbt - baseline at {r['tokens']} tokens, {r['regime']}: completion loss",
                r["baseline_loss"]["values"],
                r["fbt_loss"]["values"],
            )
    return cells


def rows(study: dict) -> list[dict]:
    return [
        {
            "FBT tokens": r["tokens"],
            "FBT regime": r["regime"],
            "FBT loss": interval_text(r["fbt_loss"]),
            "baseline loss (same tokens)": interval_text(r["baseline_loss"]),
            "token ratio": interval_text(r["token_ratio"]),
            "bounds": ", ".join(r["censored"]) or "-",
        }
        for r in study.get("readings", {}).values()
    ]
