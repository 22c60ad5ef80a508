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

ACCURACY = (0.0, 1.0)  # the range an accuracy's interval is clipped to
ACCURACY_DIFFERENCE = (-1.0, 1.0)


def seed_interval(values: Sequence[float], level: float = 0.95, bounds: tuple[float, float] | None = None) -> dict:
    """Mean of ``values`` (one per seed) with its Student-t interval at ``level``: ``{mean, low,
    high, sd, n, level, values}``; with one value the interval is that value (no spread measured).
    ``bounds``: the range the mean cannot leave (``ACCURACY``), to which the interval is clipped
    (the true value lies inside, so clipping never loses coverage)."""
    xs = [float(v) for v in values]
    if not xs or not all(math.isfinite(x) for x in xs):
        raise ValueError(f"seed_interval needs finite values, got {xs}")
    n, mean = len(xs), sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n) if n > 1 else 0.0
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return {"mean": mean, "low": low, "high": high, "sd": sd, "n": n, "level": level, "values": xs}
