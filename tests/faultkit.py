"""What the fault suites share: a tally per fault class of the inputs tried, the faults injected and
the data lost (which must stay zero), printed at the end of every pytest session that touched it
(see ``conftest.pytest_terminal_summary``), and the helpers that run the CLI in-process and compare
directories before and after a fault."""

from __future__ import annotations

import contextlib
import io
import re
from collections import Counter
from pathlib import Path

from workbench.cli import main

TALLY: dict[str, Counter] = {}


def tally(fault_class: str) -> Counter:
    """The counter of one fault class: keys ``inputs_tried``, ``faults_injected``, ``data_lost``."""
    return TALLY.setdefault(fault_class, Counter(inputs_tried=0, faults_injected=0, data_lost=0))


def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def stamps(directory: Path) -> dict:
    """Size and modification time of every file: any write changes them (a cheap snapshot)."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(directory).rglob("*"))}


def assert_nothing_lost(before: dict, after: dict, counts: Counter) -> None:
    if before != after:
        counts["data_lost"] += 1
    assert before == after, sorted(set(before.items()) ^ set(after.items()))


def cli(argv: list[str]) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of ``workbench ARGV`` run in-process; None when it returned."""
    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def assert_usage_error(argv: list[str], *named: str, match: str = "") -> str:
    """``workbench ARGV`` exits 2 with one line ``workbench VERB: error: ...`` naming ``named``."""
    code, _, err = cli(argv)
    assert code == 2 and "Traceback" not in err, err
    message = err.strip()
    assert "\n" not in message and message.startswith(f"workbench {argv[0]}: error:"), err
    for text in named:
        assert text in message, message
    assert not match or re.search(match, message), message
    return message
