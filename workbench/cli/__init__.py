"""``workbench VERB ...``: each verb prints a human summary and writes machine-readable JSON.

A user error (``WorkbenchError``: a bad value, path or file, a busy output, a model that overflowed)
or an error of the environment (``OSError``: a full disk, a permission denied) is one line on
stderr and exit status 2; anything else is a bug and keeps its traceback (exit status 1).
``WORKBENCH_DEBUG=1`` shows the traceback of user errors too."""

from __future__ import annotations

import argparse
import logging

from workbench.cli import analysis, models, probing, tools, training
from workbench.cli.analysis import default_out
from workbench.cli.common import ANALYSIS_VERBS, VerbParser, run_verb
from workbench.cli.tools import app_script
from workbench.cli.training import study_out

GROUPS = (models, training, probing, analysis, tools)  # each adds its verbs, in the order --help lists them

__all__ = ["ANALYSIS_VERBS", "GROUPS", "app_script", "build_parser", "default_out", "main", "study_out"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=VerbParser)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    run_verb(parser, args)
    return 0
