"""Facts about this process that results record."""

from __future__ import annotations

import resource
from pathlib import Path

# the environment in which PyTorch, MKL and oneDNN take their AVX2 paths and MKL gives the same
# results on any CPU with AVX2 (set before torch loads): what reproduces a number across machines
PINNED_NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


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


def analysis_device(name: str):
    """The ``torch.device`` an analysis verb runs its model on (``--device``): ``cpu``, ``cuda`` or
    ``cuda:N``, refused in one line when this machine has no such device."""
    import torch

    from workbench.storage.errors import BadInput

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise BadInput(f"--device {name!r}: expected cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise BadInput(f"--device {name!r}: expected cpu, cuda or cuda:N")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise BadInput(f"--device {name!r}: this machine has {count} CUDA device(s)")
    return device
