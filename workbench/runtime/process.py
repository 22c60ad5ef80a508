"""Facts about this process that results record."""

from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_mib() -> float:
    """Peak resident memory of this process image, in MiB. Linux's VmHWM, not ``ru_maxrss``: a
    process started by a large parent inherits the parent's ``ru_maxrss`` at fork (e.g. under the bench)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux
