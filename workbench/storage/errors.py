"""The workbench's own error: what a user can fix. ``WorkbenchError`` says something is wrong with
what the user gave or pointed at (an argument, a config field, a path, a run, a corrupt file), with
an output that is busy or not ours, or with a model whose numbers overflowed; its message alone
says what and where, so the CLI prints it as one line (exit status 2) instead of a traceback.
Anything else that escapes the workbench is a bug and keeps its traceback.

Each subclass also derives from the built-in error that the workbench raised before it had its own,
so ``except ValueError`` / ``except FileNotFoundError`` in existing code keeps working. The bottom
of the workbench: it imports nothing."""

from __future__ import annotations


class WorkbenchError(Exception):
    """A user error: the message names the value, path or file and what was expected."""


class BadInput(WorkbenchError, ValueError):
    """A value the workbench cannot use: an argument, a config field, a run, or a file's contents
    (corrupt JSON, a torn checkpoint, a config that does not fit its weights)."""


class MissingFile(WorkbenchError, FileNotFoundError):
    """A file or directory the user pointed at (or that a run needs) is not there."""


class OutputExists(WorkbenchError, FileExistsError):
    """An output path holds something the workbench will not replace (a run, another kind of
    output, files that are not its own, or a previous output without ``--overwrite``)."""


class NotADirectory(WorkbenchError, NotADirectoryError):
    """A path that must be a directory is a file."""


class OutputBusy(WorkbenchError, RuntimeError):
    """Another process (or thread) holds the output directory."""
