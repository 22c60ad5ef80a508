"""Prepared corpora: text tokenized once into memory-mapped token shards (``workbench prepare``).

A prepared corpus is a directory:

- ``corpus.json``: the metadata, written last (what makes the directory a corpus): the tokenizer's
  fingerprint, each source's path, size and SHA-256, per split the documents, tokens and shards,
  the held-out rule, and the characters the tokenizer could not represent;
- ``{split}-{k:05d}.bin``: the tokens of split ``train`` or ``heldout``, raw ``uint16`` (a
  vocabulary below 65,536 ids) or ``uint32``, read through ``numpy.memmap``;
- ``{split}-{k:05d}.ends``: raw ``uint64``, the end offset of every document in that shard.

Documents. A JSONL line with ``question`` and ``answer`` (GSM8K) becomes ``Q: {question}\\nA:
{answer}``, the text the trace study prompts with; a line with ``text`` is that text. A plain text
file holds documents separated by blank lines. A ``datasets`` dataset saved on disk
(``save_to_disk``) gives one document per row, from the same columns. Every document is its
tokens followed by ``<eos>`` (no ``<bos>``); documents never straddle shards.

Held-out split: a document is held out when the hash of (seed, its text) falls below
``heldout_fraction``, so the split needs no second pass and identical documents always land on the
same side: no held-out document also appears in training.

Packing (``CorpusSplit.take``): a training sequence is a window of ``seq_len + 1`` consecutive
tokens of the split's token stream, starting anywhere, so it may span the end of one document and
the start of the next; ``<eos>`` marks the boundary and attention crosses it (GPT-2's rule). The
windows of a step are a pure function of (seed, step), as for every task.

Streaming: sources are read line by line and tokenized in batches of documents, and shards are
appended to, so memory does not grow with the corpus (``docs/training.md`` gives the measured peaks).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.data.answers import parse_final_answer
from workbench.data.tasks import Example, gsm8k_example
from workbench.runtime.tokenizer import TokenizerBase
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import check_claim, claim

FORMAT = "workbench-prepared-corpus"
VERSION = 1
META = "corpus.json"
SPLITS = ("train", "heldout")
SHARD_TOKENS = 1 << 26  # tokens per shard before the next document opens a new one (128 MiB at uint16)
ENCODE_BATCH = 512  # documents tokenized together
PREFIX = "prepared:"


# ---- reading sources ----------------------------------------------------------------------


def source_kind(path: Path) -> str:
    """``datasets`` (a directory saved by ``save_to_disk``), ``jsonl`` or ``text``."""
    if path.is_dir():
        if not ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
            raise BadInput(f"{path} is a directory but not a dataset saved by datasets' save_to_disk (no dataset_info.json)")
        return "datasets"
    if not path.is_file():
        raise MissingFile(f"no corpus source at {path}")
    return "jsonl" if path.suffix in (".jsonl", ".json") else "text"


def _row_text(row: object, where: str) -> tuple[str, str]:
    """(document text, format) of one JSONL line or dataset row."""
    if isinstance(row, dict) and "question" in row and "answer" in row:
        return gsm8k_example(str(row["question"]), str(row["answer"])).text, "gsm8k"
    if isinstance(row, dict) and isinstance(row.get("text"), str):
        return row["text"], "text"
    found = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise BadInput(f"{where}: expected an object with 'question' and 'answer' (GSM8K) or 'text', got {found}")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 file, read one line at a time."""
    with path.open("rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                yield i, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise BadInput(f"{path}:{i}: not UTF-8 text ({err})") from err


def _jsonl_documents(path: Path) -> Iterator[tuple[str, str]]:
    for i, line in _lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise BadInput(f"{path}:{i}: not JSON ({err.msg} at column {err.colno}); every line must be one JSON object") from err
        yield _row_text(row, f"{path}:{i}")


def _text_documents(path: Path) -> Iterator[tuple[str, str]]:
    lines: list[str] = []
    for _, line in _lines(path):
        if line.strip():
            lines.append(line)
        elif lines:
            yield "".join(lines).rstrip("\n"), "text"
            lines = []
    if lines:
        yield "".join(lines).rstrip("\n"), "text"


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


def _dataset_documents(path: Path) -> Iterator[tuple[str, str]]:
    data = _dataset_rows(path)
    columns = set(data.column_names)
    if not ({"question", "answer"} <= columns or "text" in columns):
        raise BadInput(
            f"{path}: a dataset with 'question' and 'answer' (GSM8K) or 'text' columns expected, got {sorted(columns)}"
        )
    for i, row in enumerate(data):
        yield _row_text(row, f"{path} row {i}")


def documents(path: Path) -> Iterator[tuple[str, str]]:
    """(text, format) of every document of one source, in order; errors name the file and line."""
    kind = source_kind(path)
    return {"jsonl": _jsonl_documents, "text": _text_documents, "datasets": _dataset_documents}[kind](path)


def check_source(path: Path) -> dict:
    """Read a source once without tokenizing: its hash, size and document count, and every error
    (not UTF-8, not JSON, wrong fields, no documents) before any work."""
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
    for _, fmt in documents(path):
        formats[fmt] = formats.get(fmt, 0) + 1
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


def is_heldout(text: str, seed: int, fraction: float) -> bool:
    """Whether a document with this text is held out (module docstring)."""
    h = hashlib.blake2b(f"{seed}\0{text}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") < fraction * 2**64


# ---- writing ------------------------------------------------------------------------------


class _ShardWriter:
    """Appends documents to the shards of one split inside the staging directory, recording each
    file it creates with ``made`` (``Staging.made``)."""

    def __init__(self, directory: Path, split: str, dtype, shard_tokens: int, made):
        self.directory, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.made = made
        self.shards: list[dict] = []
        self._tokens = self._ends = None
        self.documents = self.total = 0

    def _open(self) -> None:
        self._close()
        name = f"{self.split}-{len(self.shards):05d}"
        self.shards.append({"tokens": f"{name}.bin", "ends": f"{name}.ends", "n_tokens": 0, "n_documents": 0})
        self._tokens = (self.directory / f"{name}.bin").open("wb")
        self._ends = (self.directory / f"{name}.ends").open("wb")
        self.made(self.directory / f"{name}.bin", self.directory / f"{name}.ends")

    def _close(self) -> None:
        for f in (self._tokens, self._ends):
            if f is not None:
                f.close()
        self._tokens = self._ends = None

    def add(self, ids: list[int]) -> None:
        if self._tokens is None or (self.shards[-1]["n_tokens"] and self.shards[-1]["n_tokens"] + len(ids) > self.shard_tokens):
            self._open()
        shard = self.shards[-1]
        assert self._tokens is not None and self._ends is not None
        self._tokens.write(np.asarray(ids, dtype=self.dtype).tobytes())
        shard["n_tokens"] += len(ids)
        shard["n_documents"] += 1
        self._ends.write(np.uint64(shard["n_tokens"]).tobytes())
        self.documents += 1
        self.total += len(ids)

    def finish(self) -> dict:
        self._close()
        return {"documents": self.documents, "tokens": self.total, "shards": self.shards}


def token_dtype(tokenizer: TokenizerBase) -> str:
    return "uint16" if tokenizer.id_limit <= 2**16 else "uint32"


def prepare_corpus(
    sources: list[str | Path],
    tokenizer: TokenizerBase,
    out: str | Path,
    *,
    tokenizer_source: str = "",
    heldout_fraction: float = 0.05,
    seed: int = 0,
    shard_tokens: int = SHARD_TOKENS,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Tokenize ``sources`` into a prepared corpus at ``out`` (module docstring) and return its
    metadata. Every source is read and checked before anything is tokenized or created; the
    output is staged and published whole (``workbench.storage.outputs.claim``), so a failure or a
    kill leaves no partial corpus. ``progress(documents_done)`` is called as documents are written."""
    if not sources:
        raise BadInput("prepare: no source given")
    if not 0 <= heldout_fraction < 1:
        raise BadInput(f"heldout_fraction={heldout_fraction!r}: expected a number in [0, 1)")
    if shard_tokens < 1:
        raise BadInput(f"shard_tokens={shard_tokens!r}: expected an integer >= 1")
    out = Path(out)
    check_claim(out, "corpus", overwrite=overwrite)
    started = time.perf_counter()
    checked = [check_source(Path(s)) for s in sources]
    dtype = token_dtype(tokenizer)
    representable: dict[str, bool] = {}
    lost: dict[str, int] = {}
    lost_documents = 0
    done = 0
    with claim(out, "corpus", overwrite=overwrite) as held:
        writers = {split: _ShardWriter(held.staging, split, dtype, shard_tokens, held.made) for split in SPLITS}
        for source in checked:
            batch: list[str] = []
            for text, _ in documents(Path(source["path"])):
                batch.append(text)
                if len(batch) == ENCODE_BATCH:
                    done += _write_batch(batch, tokenizer, writers, seed, heldout_fraction)
                    batch = []
                    if progress is not None:
                        progress(done)
                missing = {c for c in set(text) if not representable.setdefault(c, tokenizer.roundtrips(c))}
                if missing:
                    lost_documents += 1
                    for c in missing:
                        lost[c] = lost.get(c, 0) + text.count(c)
            done += _write_batch(batch, tokenizer, writers, seed, heldout_fraction)
            if progress is not None:
                progress(done)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": {
                "fingerprint": tokenizer.fingerprint,
                "kind": tokenizer.kind,
                "source": tokenizer_source,
                "id_limit": tokenizer.id_limit,
                "eos_id": tokenizer.eos_id,
            },
            "dtype": dtype,
            "documents_end_with": "eos",
            "heldout": {"fraction": heldout_fraction, "seed": seed, "rule": "blake2b(seed, text) < fraction"},
            "sources": checked,
            "splits": {split: writer.finish() for split, writer in writers.items()},
            "lost_characters": {
                "total": sum(lost.values()),
                "documents": lost_documents,
                "characters": dict(sorted(lost.items())),
            },
            "seconds": round(time.perf_counter() - started, 2),
        }
        write_json(held.staging / META, meta)
        held.made(held.staging / META)
        held.publish()
    return meta


def _is_corpus_file(name: str) -> bool:
    return name.startswith(tuple(f"{s}-" for s in SPLITS)) and name.endswith((".bin", ".ends"))


def _write_batch(texts: list[str], tokenizer: TokenizerBase, writers: dict, seed: int, fraction: float) -> int:
    if not texts:
        return 0
    encoded = tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False)
    for text, enc in zip(texts, encoded):
        split = "heldout" if fraction and is_heldout(text, seed, fraction) else "train"
        writers[split].add([*enc.ids, tokenizer.eos_id])
    return len(texts)


# ---- reading ------------------------------------------------------------------------------


@dataclass
class CorpusSplit:
    """One split of a prepared corpus: its token stream (``len`` tokens) and its documents."""

    directory: Path
    name: str
    dtype: str
    shards: list[dict]

    def __post_init__(self) -> None:
        self._tokens = [self._map(s["tokens"], self.dtype, s["n_tokens"]) for s in self.shards]
        self._ends = [self._map(s["ends"], "uint64", s["n_documents"]) for s in self.shards]
        sizes = np.array([s["n_tokens"] for s in self.shards], dtype=np.int64)
        self._starts = np.concatenate(([0], np.cumsum(sizes)))  # [n_shards + 1] global offset of each shard

    def _map(self, name: str, dtype: str, count: int) -> np.ndarray:
        path = self.directory / name
        if not path.is_file():
            raise MissingFile(f"prepared corpus {self.directory}: missing {path}")
        expected = count * np.dtype(dtype).itemsize
        if path.stat().st_size != expected:
            raise BadInput(f"prepared corpus {self.directory}: {path} has {path.stat().st_size} bytes, {META} says {expected}")
        if count == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def n_documents(self) -> int:
        return sum(s["n_documents"] for s in self.shards)

    def take(self, starts: np.ndarray, width: int) -> np.ndarray:
        """Windows [len(starts), width] int64 of the split's token stream (they may cross shards)."""
        idx = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(width)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"windows reach token {idx.max()} of a stream of {len(self)}")
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        out = np.empty(idx.shape, dtype=np.int64)
        for s in np.unique(shard):
            at = shard == s
            out[at] = self._tokens[s][idx[at] - self._starts[s]]
        return out

    def documents(self, limit: int | None = None) -> Iterator[np.ndarray]:
        """The split's documents in order (each with its closing eos), at most ``limit``."""
        count = 0
        for tokens, ends in zip(self._tokens, self._ends):
            begin = 0
            for end in ends:
                if limit is not None and count >= limit:
                    return
                yield np.asarray(tokens[begin:end], dtype=np.int64)
                begin, count = int(end), count + 1


class PreparedCorpus:
    """A prepared corpus opened for reading; ``open`` checks its metadata and files."""

    def __init__(self, directory: Path, meta: dict):
        self.directory, self.meta = directory, meta

    @classmethod
    def open(cls, directory: str | Path) -> PreparedCorpus:
        directory = Path(directory)
        path = directory / META
        if not path.is_file():
            raise MissingFile(f"no prepared corpus at {directory} (missing {META}; make one with workbench prepare)")
        meta = read_json(path)
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise BadInput(
                f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, expected {FORMAT!r} {VERSION}"
            )
        try:
            fingerprint = meta["tokenizer"]["fingerprint"]
            dtype, splits = meta["dtype"], meta["splits"]
            if dtype not in ("uint16", "uint32") or not isinstance(fingerprint, str) or set(splits) != set(SPLITS):
                raise TypeError
        except (KeyError, TypeError) as err:
            raise BadInput(f"{path}: expected tokenizer.fingerprint, dtype uint16|uint32 and splits {SPLITS}") from err
        return cls(directory, meta)

    @property
    def fingerprint(self) -> str:
        return self.meta["tokenizer"]["fingerprint"]

    def split(self, name: str) -> CorpusSplit:
        shards = self.meta["splits"][name]["shards"]
        for shard in shards:
            names = (shard.get("tokens"), shard.get("ends"))
            if not all(isinstance(n, str) and n == Path(n).name for n in names):
                raise BadInput(f"{self.directory / META}: shard files {names} must be names in {self.directory}")
        return CorpusSplit(self.directory, name, self.meta["dtype"], shards)

    def check_tokenizer(self, tokenizer: TokenizerBase, whose: str) -> None:
        """Refuse ``whose`` tokenizer unless it is the one the corpus was prepared with."""
        if tokenizer.fingerprint != self.fingerprint:
            source = self.meta["tokenizer"].get("source") or "another tokenizer"
            raise BadInput(
                f"prepared corpus {self.directory} was tokenized with {source} (fingerprint {self.fingerprint[:12]}), "
                f"not {whose} ({tokenizer.kind}, fingerprint {tokenizer.fingerprint[:12]}): "
                "prepare it again with --tokenizer pointing at that run"
            )


def heldout_examples(corpus: PreparedCorpus, tokenizer: TokenizerBase, n: int) -> list[Example]:
    """The first ``n`` held-out documents as examples: a GSM8K document (``Q: ...\nA: ...``) is
    split into its prompt and answer, any other is a text with no prompt (scored by loss only)."""
    corpus.check_tokenizer(tokenizer, "the run's tokenizer")
    split = corpus.split("heldout")
    if split.n_documents == 0:
        raise BadInput(f"prepared corpus {corpus.directory} holds no held-out documents: prepare it with --heldout > 0")
    out = []
    for ids in split.documents(limit=n):
        text = tokenizer.decode(ids[:-1].tolist(), skip_special=False)  # without the closing eos
        question, sep, answer = text.partition("\nA:")
        if text.startswith("Q: ") and sep:
            out.append(Example("gsm8k", question + sep, answer, parse_final_answer(answer) or "", max(answer.count("<<"), 1)))
        else:
            out.append(Example("text", "", text, "", 1))
    return out


def source_hashes(task: str) -> set[str]:
    """The SHA-256 of every source file a ``prepared:DIR`` corpus was made from (empty for other specs)."""
    directory = corpus_dir(task)
    if directory is None or not (directory / META).is_file():
        return set()
    return {s["sha256"] for s in PreparedCorpus.open(directory).meta["sources"]}


def corpus_dir(task: str) -> Path | None:
    """The directory of a ``prepared:DIR`` task spec, else None."""
    return Path(task[len(PREFIX) :]) if task.startswith(PREFIX) and len(task) > len(PREFIX) else None
