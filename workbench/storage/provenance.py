"""What a result records about the code that produced it, so that it can be regenerated."""

from __future__ import annotations

import subprocess
from pathlib import Path


def source_commit(root: Path | None = None) -> str | None:
    """The git commit of the workbench's source (with ``+dirty`` if tracked files have uncommitted
    changes), or None when the package is not a git checkout's own ``workbench/`` (an installed
    copy inside some other repository does not take that repository's commit). Changes under
    ``docs/results/`` do not make it dirty: the tools write their outputs there (a regeneration's
    second step would otherwise read as made by changed code). ``root``: the checkout (tests)."""
    root = root if root is not None else Path(__file__).resolve().parents[2]
    git = lambda *args: subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/results")
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else None
