"""Where a corpus's documents come from (``workbench prepare``): JSONL (a GSM8K line becomes ``Q:
{question}\nA: {answer}``, a line with ``text`` that text), plain text (documents separated by blank
lines) or a ``datasets`` dataset saved with ``save_to_disk`` (one document per row). A document is
at most ``MAX_DOCUMENT_BYTES`` of UTF-8; a longer one, a FIFO or device, or a malformed row is
refused with one line naming its file and line."""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Iterator
from pathlib import Path

from workbench.data import pieces
from workbench.data.pieces import piece_bounds
from workbench.data.tasks import gsm8k_example
from workbench.runtime.tokenizer import TokenizerBase
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import parse_json

MAX_DOCUMENT_BYTES = 1 << 26  # 64 MiB: what one document may hold; reading it needs a few times that
_MISSING = object()


# ---- reading sources ----------------------------------------------------------------------


def source_kind(path: Path) -> str:
    """``datasets`` (a directory saved by ``save_to_disk``), ``jsonl`` or ``text``. A FIFO, device
    or socket is refused by its kind without being opened: reading one would block or never end."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise MissingFile(f"no corpus source at {path}") from None
    except OSError as err:
        raise BadInput(f"corpus source {path} cannot be inspected ({err.strerror})") from err
    if stat.S_ISDIR(mode):
        if not ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
            raise BadInput(f"{path} is a directory but not a dataset saved by datasets' save_to_disk (no dataset_info.json)")
        return "datasets"
    if not stat.S_ISREG(mode):
        raise BadInput(
            f"corpus source {path} is {_file_type(mode)}: expected a regular file (JSONL or text) "
            "or a directory saved by datasets' save_to_disk"
        )
    return "jsonl" if path.suffix in (".jsonl", ".json") else "text"


def _file_type(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _json_kind(value: object) -> str:
    """How a JSON value that should have been a string reads in an error."""
    if value is _MISSING:
        return "missing"
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return f"{names.get(type(value), type(value).__name__)} ({repr(value)[:40]})"


def _row_text(row: object, where: str) -> tuple[str, str]:
    """(document text, format) of one JSONL line or dataset row."""
    if isinstance(row, dict) and "question" in row and "answer" in row:
        for key in ("question", "answer"):
            if not isinstance(row[key], str):  # str() would turn null into the text "None"
                raise BadInput(f"{where}: {key!r} is {_json_kind(row[key])}, expected a string (GSM8K's {key} text)")
        return gsm8k_example(row["question"], row["answer"]).text, "gsm8k"
    if isinstance(row, dict) and "text" in row:
        if not isinstance(row["text"], str):
            raise BadInput(f"{where}: 'text' is {_json_kind(row['text'])}, expected a string")
        return row["text"], "text"
    found = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise BadInput(f"{where}: expected an object with 'question' and 'answer' (GSM8K) or 'text', got {found}")


def _too_long(where: str, what: str) -> BadInput:
    return BadInput(
        f"{where}: {what} longer than {_size(MAX_DOCUMENT_BYTES)}, the most one document may hold "
        "(split it: one JSONL line or one blank-line-separated paragraph per document)"
    )


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _lines(path: Path) -> Iterator[tuple[int, str, int]]:
    """(line number, line, its bytes) of a UTF-8 file, read one line at a time; a line past
    ``MAX_DOCUMENT_BYTES`` is refused without reading the rest of it."""
    with path.open("rb") as f:
        i = 0
        while raw := f.readline(MAX_DOCUMENT_BYTES + 2):
            i += 1
            if len(raw) - raw.endswith(b"\n") > MAX_DOCUMENT_BYTES:
                raise _too_long(f"{path}:{i}", "a line")
            n_bytes = len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise BadInput(f"{path}:{i}: not UTF-8 text ({err})") from err
            del raw  # a long line is held once, not twice, while its document is used
            yield i, line, n_bytes


def _jsonl_documents(path: Path) -> Iterator[tuple[str, str, str]]:
    for i, line, _ in _lines(path):
        if not line.strip():
            continue
        row = parse_json(line, f"{path}:{i}", "; every line must be one JSON object")
        yield (f"{path}:{i}", *_row_text(row, f"{path}:{i}"))


def _text_documents(path: Path) -> Iterator[tuple[str, str, str]]:
    lines: list[str] = []
    first = size = 0
    for i, line, n_bytes in _lines(path):
        if line.strip():
            if not lines:
                first, size = i, 0
            lines.append(line)
            size += n_bytes
            if size - line.endswith("\n") > MAX_DOCUMENT_BYTES:  # its last newline is not the document's
                raise _too_long(f"{path}:{first}", f"a document (lines {first}-{i} without a blank line between)")
        elif lines:
            document, lines = "".join(lines).rstrip("\n"), []  # the lines go before the document is used
            yield f"{path}:{first}", document, "text"
    if lines:
        yield f"{path}:{first}", "".join(lines).rstrip("\n"), "text"


def _dataset_rows(path: Path):
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises several kinds for a broken directory
        raise BadInput(f"{path}: could not load the saved dataset ({err})") from err
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise BadInput(f"{path} holds splits {sorted(data)}: expected a 'train' split (or save one split)")
        data = data["train"]
    return data


def _dataset_documents(path: Path) -> Iterator[tuple[str, str, str]]:
    data = _dataset_rows(path)
    columns = set(data.column_names)
    if not ({"question", "answer"} <= columns or "text" in columns):
        raise BadInput(
            f"{path}: a dataset with 'question' and 'answer' (GSM8K) or 'text' columns expected, got {sorted(columns)}"
        )
    for i, row in enumerate(data):
        text, fmt = _row_text(row, f"{path} row {i}")
        if len(text) > MAX_DOCUMENT_BYTES // 4 and len(text.encode()) > MAX_DOCUMENT_BYTES:
            raise _too_long(f"{path} row {i}", "a document")
        yield f"{path} row {i}", text, fmt


def located_documents(path: Path) -> Iterator[tuple[str, str, str]]:
    """(where, text, format) of every document of one source, in order: ``where`` is the file and
    line (or dataset row) it starts at, for errors."""
    kind = source_kind(path)
    return {"jsonl": _jsonl_documents, "text": _text_documents, "datasets": _dataset_documents}[kind](path)


def documents(path: Path) -> Iterator[tuple[str, str]]:
    """(text, format) of every document of one source, in order; errors name the file and line."""
    return ((text, fmt) for _, text, fmt in located_documents(path))


def check_source(path: Path, tokenizer: TokenizerBase | None = None) -> dict:
    """Read a source once without tokenizing it: its hash, size and document count, and every error
    (not UTF-8, not JSON, wrong fields, too long, no documents) before any work; with ``tokenizer``,
    also where each long document will be cut (``piece_bounds``: a few hundred characters tokenized
    per cut), so that one that cannot be cut exactly is refused here too."""
    kind = source_kind(path)
    digest = hashlib.sha256()
    if kind == "datasets":
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
            _hash_file(file, digest)
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        _hash_file(path, digest)
        size = path.stat().st_size
    formats: dict[str, int] = {}
    for where, text, fmt in located_documents(path):
        formats[fmt] = formats.get(fmt, 0) + 1
        if tokenizer is not None and len(text) > pieces.PIECE_CHARS:
            for _ in piece_bounds(text, tokenizer, where):
                pass
    if not formats:
        raise BadInput(f"{path}: no documents ({'an empty file' if size == 0 else 'only blank lines'})")
    return {"path": str(path.resolve()), "kind": kind, "bytes": size, "sha256": digest.hexdigest(), "documents": formats}


def _hash_file(path: Path, digest) -> None:
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    _hash_file(path, digest)
    return digest.hexdigest()


# ---- the held-out rule --------------------------------------------------------------------
