"""Progress of a long verb: a terminal bar, and (when the verb runs as an app job) a small JSON
file the app reads to draw its own bar (``workbench.jobs``).

A verb makes one ``Bar`` per phase. The terminal bar opens on the first update, so a verb that
fails on its inputs prints an error and no empty bar. The file, named by the environment variable
``WORKBENCH_JOB_PROGRESS``, holds the latest ``{"fraction", "what", "desc", "updated", "n",
"total", "unit", "started", "milestone"}`` (``started``: the phase's first update, for its rate;
``milestone``: a count of finished pieces, such as a zoo's members, at which a page shows what
they wrote): it is rewritten atomically at most every ``INTERVAL`` seconds, at once when a
milestone is passed or the count reaches the total, and on ``close``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from workbench.storage.files import write_json

PROGRESS_ENV = "WORKBENCH_JOB_PROGRESS"
INTERVAL = 0.5  # seconds between two writes of the progress file


class Bar:
    """``update(n, what)`` sets the count done (of ``total``) and says what is being done;
    ``show``: draw a terminal bar (tqdm) too."""

    def __init__(self, desc: str, total: float, *, show: bool = True, unit: str = "it", bar_format: str | None = None):
        self.desc, self.total, self.unit, self.bar_format = desc, total, unit, bar_format
        self.show = show
        self.n = 0.0
        self.what = ""
        self.milestone = 0
        self.started: float | None = None  # the first update's time
        self._tqdm = None
        self._written = 0.0
        path = os.environ.get(PROGRESS_ENV)
        self.path = Path(path) if path else None

    def update(self, n: float, what: str | None = None, *, milestone: int | None = None) -> None:
        self.n = n
        if self.started is None:
            self.started = time.time()
        if what is not None:
            self.what = what
        passed = milestone is not None and milestone != self.milestone
        if milestone is not None:
            self.milestone = milestone
        if self.show:
            if self._tqdm is None:
                from tqdm.auto import tqdm

                self._tqdm = tqdm(
                    total=self.total, desc=self.desc, unit=self.unit, dynamic_ncols=True, bar_format=self.bar_format
                )
            self._tqdm.update(n - self._tqdm.n)
            if what is not None:
                self._tqdm.set_postfix_str(what, refresh=False)
        if self.path is not None and (time.monotonic() - self._written >= INTERVAL or n >= self.total or passed):
            self._write()

    def advance(self, units: float, what: str | None = None) -> None:
        self.update(self.n + units, what)

    def _write(self) -> None:
        assert self.path is not None  # the callers check
        fraction = min(1.0, self.n / self.total) if self.total else None
        write_json(
            self.path,
            {
                "desc": self.desc,
                "fraction": fraction,
                "what": self.what,
                "updated": time.time(),
                "n": self.n,
                "total": self.total,
                "unit": self.unit,
                "started": self.started,
                "milestone": self.milestone,
            },
        )
        self._written = time.monotonic()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None
        if self.path is not None and self.n:
            self._write()

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PhaseBars:
    """A ``Bar`` per phase of a verb whose phases differ in cost (evaluation's losses, then each
    regime's generation): ``bars(phase, done, total)`` closes the previous phase's bar when a new
    phase starts, so each bar's count and rate are true for its own phase."""

    def __init__(self, desc: str, *, show: bool = True, unit: str = "example"):
        self.desc, self.show, self.unit = desc, show, unit
        self.phase: str | None = None
        self.bar: Bar | None = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase != self.phase:
            self.close()
            self.phase, self.bar = phase, Bar(f"{self.desc} {phase}", total, show=self.show, unit=self.unit)
        assert self.bar is not None
        self.bar.update(done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> PhaseBars:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
