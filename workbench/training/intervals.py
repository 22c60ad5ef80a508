"""Confidence intervals across independent replicates (training seeds).

A zoo member trained at n seeds gives n independent values of each measured quantity; the
interval is the Student-t interval for their mean, which is exact for normal values and the
usual choice at the small n a CPU zoo affords (n = 3: t = 4.30, so the half-width is 2.48 sample
standard deviations). Paired per-problem intervals within one model stay in ``studies.traces``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy.stats import t as student_t


def seed_interval(values: Sequence[float], level: float = 0.95) -> dict:
    """Mean of ``values`` (one per seed) with its Student-t interval at ``level``: ``{mean, low,
    high, sd, n, level, values}``; with one value the interval is that value (no spread measured)."""
    xs = [float(v) for v in values]
    if not xs or not all(math.isfinite(x) for x in xs):
        raise ValueError(f"seed_interval needs finite values, got {xs}")
    n, mean = len(xs), sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n) if n > 1 else 0.0
    return {"mean": mean, "low": mean - half, "high": mean + half, "sd": sd, "n": n, "level": level, "values": xs}
