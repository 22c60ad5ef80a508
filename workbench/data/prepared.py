"""Prepared corpora: text tokenized once into memory-mapped token shards (``workbench prepare``).

A prepared corpus is a directory:

- ``corpus.json``: the metadata, written last (what makes the directory a corpus): the tokenizer's
  fingerprint, each source's path, size and SHA-256, per split the documents, tokens and shards
  (each with its files' CRC32), the held-out rule, and the characters the tokenizer could not
  represent;
- ``{split}-{k:05d}.bin``: the tokens of split ``train`` or ``heldout``, raw ``uint16`` (a
  vocabulary below 65,536 ids) or ``uint32``, read through ``numpy.memmap``;
- ``{split}-{k:05d}.ends``: raw ``uint64``, the end offset of every document in that shard.

Documents. A JSONL line with ``question`` and ``answer`` (GSM8K) becomes ``Q: {question}\\nA:
{answer}``, the text the trace study prompts with; a line with ``text`` is that text. A plain text
file holds documents separated by blank lines. A ``datasets`` dataset saved on disk
(``save_to_disk``) gives one document per row, from the same columns. Every document is its
tokens followed by ``<eos>`` (no ``<bos>``); documents never straddle shards. A document is at
most ``MAX_DOCUMENT_BYTES`` of UTF-8 (a longer one is refused, naming its file and line).

Held-out split: a document is held out when the hash of (seed, its text) falls below
``heldout_fraction``, so the split needs no second pass and identical documents always land on the
same side: no held-out document also appears in training.

Packing (``CorpusSplit.take``): a training sequence is a window of ``seq_len + 1`` consecutive
tokens of the split's token stream, starting anywhere, so it may span the end of one document and
the start of the next; ``<eos>`` marks the boundary and attention crosses it (GPT-2's rule). The
windows of a step are a pure function of (seed, step), as for every task.

Streaming: sources are read line by line and tokenized in batches of at most ``ENCODE_BATCH``
documents and ``ENCODE_CHARS`` characters; a document longer than ``PIECE_CHARS`` is tokenized in
pieces (``piece_bounds``), and shards are appended to, so memory grows neither with the corpus nor
with one document's tokenization (``docs/training.md`` gives the measured peaks).

Integrity (format 2): every shard's two files carry a CRC32 in ``corpus.json``. Opening a split
always checks its metadata (types, names, counts), each file's size, that document ends increase
strictly up to the shard's size with ``<eos>`` at each, and that every token id is below the
tokenizer's limit (one read of the shard); ``verify=True`` (the default, as for the activation
store) also checks the CRC32s in the same read. Format 1 corpora (no checksums) are read with every
check but the checksums.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.data import pieces
from workbench.data.answers import parse_final_answer
from workbench.data.pieces import piece_bounds
from workbench.data.sources import (
    _MISSING,
    _json_kind,
    check_source,
    located_documents,
)
from workbench.data.tasks import Example
from workbench.runtime.tokenizer import TokenizerBase
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import check_output, output

logger = logging.getLogger(__name__)

FORMAT = "workbench-prepared-corpus"
VERSION = 2  # 2: a CRC32 per shard file
READABLE = (1, 2)
META = "corpus.json"
SPLITS = ("train", "heldout")
SHARD_TOKENS = 1 << 26  # tokens per shard before the next document opens a new one (128 MiB at uint16)
ENCODE_BATCH = 512  # documents tokenized together
# Hugging Face tokenizers hold a few hundred bytes per character of what they encode at once
# (offsets, token strings, alignments), so a batch is bounded by characters, not only by documents.
ENCODE_CHARS = 1 << 18
READ_CHUNK = 1 << 22  # bytes per read when a shard is scanned (token ids, CRC32)
PREFIX = "prepared:"


def is_heldout(text: str, seed: int, fraction: float) -> bool:
    """Whether a document with this text is held out (module docstring)."""
    h = hashlib.blake2b(f"{seed}\0".encode(), digest_size=8)
    for at in range(0, len(text), 1 << 20):  # in slices: a long document is not copied whole twice more
        h.update(text[at : at + (1 << 20)].encode())
    return int.from_bytes(h.digest(), "big") < fraction * 2**64


# ---- writing ------------------------------------------------------------------------------


class _ShardWriter:
    """Appends documents to the shards of one split inside the staging directory, with the CRC32 of
    what it writes there."""

    def __init__(self, directory: Path, split: str, dtype, shard_tokens: int):
        self.directory, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.shards: list[dict] = []
        self._files: dict = {}  # "tokens" | "ends" -> the open file of the current shard
        self._crc: dict[str, int] = {}
        self.documents = self.total = 0

    def _open(self) -> None:
        self._close()
        name = f"{self.split}-{len(self.shards):05d}"
        self.shards.append({"tokens": f"{name}.bin", "ends": f"{name}.ends", "n_tokens": 0, "n_documents": 0})
        self._files = {
            "tokens": (self.directory / f"{name}.bin").open("wb"),
            "ends": (self.directory / f"{name}.ends").open("wb"),
        }
        self._crc = dict.fromkeys(self._files, 0)

    def _write(self, what: str, data: bytes) -> None:
        self._files[what].write(data)
        self._crc[what] = zlib.crc32(data, self._crc[what])

    def _close(self) -> None:
        for what, f in self._files.items():
            f.close()
            self.shards[-1][f"{what}_crc32"] = f"{self._crc[what]:08x}"
        self._files = {}

    def add(self, parts: list[np.ndarray]) -> None:
        """One document, its tokens given in parts (the pieces of a long one, then eos)."""
        n = sum(len(p) for p in parts)
        if not self._files or (self.shards[-1]["n_tokens"] and self.shards[-1]["n_tokens"] + n > self.shard_tokens):
            self._open()
        shard = self.shards[-1]
        for part in parts:
            self._write("tokens", np.asarray(part, dtype=self.dtype).tobytes())
        shard["n_tokens"] += n
        shard["n_documents"] += 1
        self._write("ends", np.uint64(shard["n_tokens"]).tobytes())
        self.documents += 1
        self.total += n

    def finish(self) -> dict:
        self._close()
        return {"documents": self.documents, "tokens": self.total, "shards": self.shards}


def token_dtype(tokenizer: TokenizerBase) -> str:
    return "uint16" if tokenizer.id_limit <= 2**16 else "uint32"


class _Tokenizing:
    """Documents in, in order; their tokens out to their split's shards. Short documents are
    tokenized in batches bounded by count and characters, a long one alone, in pieces."""

    def __init__(self, tokenizer: TokenizerBase, writers: dict, seed: int, fraction: float, progress):
        self.tokenizer, self.writers, self.seed, self.fraction, self.progress = tokenizer, writers, seed, fraction, progress
        self.dtype = token_dtype(tokenizer)
        self.eos = np.array([tokenizer.eos_id], dtype=self.dtype)
        self.batch: list[str] = []
        self.chars = self.done = 0

    def add(self, text: str, where: str) -> None:
        if len(text) <= pieces.PIECE_CHARS:
            self.batch.append(text)
            self.chars += len(text)
            if len(self.batch) >= ENCODE_BATCH or self.chars >= ENCODE_CHARS:
                self.flush()
            return
        self.flush()  # the batch before it keeps its place in the shards
        parts, group = [], []
        for begin, end in piece_bounds(text, self.tokenizer, where):
            group.append(text[begin:end])
            if sum(map(len, group)) >= ENCODE_CHARS:
                parts += self._encode(group)
                group = []
        self._write(text, parts + self._encode(group))
        self._done(1)

    def flush(self) -> None:
        if self.batch:
            for text, ids in zip(self.batch, self._encode(self.batch)):
                self._write(text, [ids])
            self._done(len(self.batch))
            self.batch, self.chars = [], 0

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        encoded = self.tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(enc.ids, dtype=self.dtype) for enc in encoded]

    def _write(self, text: str, parts: list[np.ndarray]) -> None:
        split = "heldout" if self.fraction and is_heldout(text, self.seed, self.fraction) else "train"
        self.writers[split].add([*parts, self.eos])

    def _done(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done)


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
    output is staged and published whole (``workbench.storage.outputs.output``), so a failure or a
    kill leaves no partial corpus. ``progress(documents_done)`` is called as documents are written."""
    if not sources:
        raise BadInput("prepare: no source given")
    if not 0 <= heldout_fraction < 1:
        raise BadInput(f"heldout_fraction={heldout_fraction!r}: expected a number in [0, 1)")
    if shard_tokens < 1:
        raise BadInput(f"shard_tokens={shard_tokens!r}: expected an integer >= 1")
    out = Path(out)
    check_output(out, "corpus", overwrite=overwrite)
    started = time.perf_counter()
    checked = [check_source(Path(s), tokenizer) for s in sources]
    dtype = token_dtype(tokenizer)
    representable: dict[str, bool] = {}
    lost: dict[str, int] = {}
    lost_documents = 0
    with output(out, "corpus", overwrite=overwrite) as held:
        writers = {split: _ShardWriter(held.staging, split, dtype, shard_tokens) for split in SPLITS}
        tokenizing = _Tokenizing(tokenizer, writers, seed, heldout_fraction, progress)
        for source in checked:
            for where, text, _ in located_documents(Path(source["path"])):
                tokenizing.add(text, where)
                kinds = set(text)
                for c in kinds - representable.keys():
                    representable[c] = tokenizer.roundtrips(c)
                missing = [c for c in kinds if not representable[c]]
                if missing:
                    lost_documents += 1
                    for c in missing:
                        lost[c] = lost.get(c, 0) + text.count(c)
            tokenizing.flush()
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
        held.publish()
    return meta


# ---- reading ------------------------------------------------------------------------------


@dataclass
class CorpusSplit:
    """One split of a prepared corpus: its token stream (``len`` tokens) and its documents. Made by
    ``PreparedCorpus.split``, which has checked the metadata; this checks the files (module docstring)."""

    directory: Path
    name: str
    dtype: str
    shards: list[dict]
    id_limit: int = 2**32
    eos_id: int | None = None
    verify: bool = True

    def __post_init__(self) -> None:
        self._where = f"prepared corpus {self.directory}"
        self._tokens = [self._map(s["tokens"], self.dtype, s["n_tokens"]) for s in self.shards]
        self._ends = [self._map(s["ends"], "uint64", s["n_documents"]) for s in self.shards]
        for shard, tokens, ends in zip(self.shards, self._tokens, self._ends):
            top, crc = self._scan(shard)  # one read; the most telling error first: ids, ends, then bytes
            if top >= self.id_limit:
                raise BadInput(
                    f"{self._where}: {self.directory / shard['tokens']} holds token id {top}, but its tokenizer's "
                    f"ids stop at {self.id_limit - 1} (altered: prepare the corpus again)"
                )
            self._check_ends(shard, tokens, ends)
            if self.verify and "tokens_crc32" in shard:
                for what, found in (("tokens", crc), ("ends", _file_crc32(self.directory / shard["ends"]))):
                    if f"{found:08x}" != shard[f"{what}_crc32"]:
                        raise BadInput(
                            f"{self._where}: {self.directory / shard[what]} does not match its CRC32 in {META} "
                            "(altered bytes: prepare the corpus again)"
                        )
        sizes = np.array([s["n_tokens"] for s in self.shards], dtype=np.int64)
        self._starts = np.concatenate(([0], np.cumsum(sizes)))  # [n_shards + 1] global offset of each shard

    def _map(self, name: str, dtype: str, count: int) -> np.ndarray:
        path = self.directory / name
        if path.is_symlink() or not path.is_file():
            raise MissingFile(f"{self._where}: missing {path} (or not a plain file)")
        expected = count * np.dtype(dtype).itemsize
        if path.stat().st_size != expected:
            raise BadInput(f"{self._where}: {path} has {path.stat().st_size} bytes, {META} says {expected} (torn or altered)")
        if count == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))

    def _check_ends(self, shard: dict, tokens: np.ndarray, ends: np.ndarray) -> None:
        """Document ends increase strictly from at least 1 to the shard's size, each after an eos:
        reversed or shifted ends would make empty or merged documents (read whole: 8 bytes per document)."""
        path, ends = self.directory / shard["ends"], np.asarray(ends)
        n = shard["n_tokens"]
        bad = np.flatnonzero(ends[1:] <= ends[:-1])
        if bad.size or (ends.size and (ends[0] < 1 or ends[-1] != n)) or (n and not ends.size):
            at = f"end {bad[0] + 1} is {ends[bad[0] + 1]} after {ends[bad[0]]}" if bad.size else f"ends {_span(ends)}"
            raise BadInput(
                f"{self._where}: {path} holds document ends that do not increase strictly from 1 to the shard's "
                f"{n} tokens ({at}; altered: prepare the corpus again)"
            )
        if self.eos_id is not None and ends.size:
            last = np.asarray(tokens[(ends - 1).astype(np.int64)])
            wrong = np.flatnonzero(last != self.eos_id)
            if wrong.size:
                raise BadInput(
                    f"{self._where}: document {wrong[0]} of {self.directory / shard['tokens']} ends with token "
                    f"{last[wrong[0]]}, not eos {self.eos_id} (altered: prepare the corpus again)"
                )

    def _scan(self, shard: dict) -> tuple[int, int]:
        """(largest token id, CRC32 when ``verify``) of a shard's tokens, read once in chunks."""
        crc, top = 0, -1
        with (self.directory / shard["tokens"]).open("rb") as f:
            while block := f.read(READ_CHUNK):
                if self.verify:
                    crc = zlib.crc32(block, crc)
                top = max(top, int(np.frombuffer(block, dtype=self.dtype).max()))
        return top, crc

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


def _span(ends: np.ndarray) -> str:
    return "none" if not ends.size else f"{ends[0]}..{ends[-1]}"


def _file_crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while block := f.read(READ_CHUNK):
            crc = zlib.crc32(block, crc)
    return crc


_CRC = re.compile(r"^[0-9a-f]{8}$")


def _check_meta(path: Path, meta: object) -> None:
    """Every field a reader relies on, with its type: one line naming the field of ``corpus.json``
    (a hand-edited one gives this, never a KeyError or a TypeError later)."""
    if not isinstance(meta, dict):
        raise BadInput(f"{path}: expected a JSON object, got {_json_kind(meta)}")
    if meta.get("format") != FORMAT or type(meta.get("version")) is not int or meta["version"] not in READABLE:
        raise BadInput(
            f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, expected {FORMAT!r} "
            f"version {' or '.join(map(str, READABLE))} (prepare the corpus again with this workbench)"
        )

    def need(ok: bool, name: str, value: object, expected: str) -> None:
        if not ok:
            raise BadInput(f"{path}: {name} is {_json_kind(value)}, expected {expected}")

    def count(value: object, name: str) -> int:
        need(isinstance(value, int) and not isinstance(value, bool) and value >= 0, name, value, "an integer >= 0")
        return value  # type: ignore[return-value]

    tok = meta.get("tokenizer", _MISSING)
    need(isinstance(tok, dict), "tokenizer", tok, "an object")
    fingerprint = tok.get("fingerprint", _MISSING)
    need(isinstance(fingerprint, str) and bool(fingerprint), "tokenizer.fingerprint", fingerprint, "a string")
    dtype = meta.get("dtype", _MISSING)
    need(dtype in ("uint16", "uint32"), "dtype", dtype, "'uint16' or 'uint32'")
    limit = count(tok.get("id_limit", _MISSING), "tokenizer.id_limit")
    need(
        0 < limit <= 2 ** (8 * np.dtype(dtype).itemsize),
        "tokenizer.id_limit",
        limit,
        f"1..{2 ** (8 * np.dtype(dtype).itemsize)} ({dtype})",
    )
    eos = count(tok.get("eos_id", _MISSING), "tokenizer.eos_id")
    need(eos < limit, "tokenizer.eos_id", eos, f"an id below tokenizer.id_limit={limit}")
    splits = meta.get("splits", _MISSING)
    need(isinstance(splits, dict) and set(splits) == set(SPLITS), "splits", splits, f"an object with {list(SPLITS)}")
    for split in SPLITS:
        entry = splits[split]
        need(isinstance(entry, dict), f"splits.{split}", entry, "an object")
        shards = entry.get("shards", _MISSING)
        need(isinstance(shards, list), f"splits.{split}.shards", shards, "a list")
        totals = {"n_tokens": 0, "n_documents": 0}
        for k, shard in enumerate(shards):
            name = f"splits.{split}.shards[{k}]"
            need(isinstance(shard, dict), name, shard, "an object")
            for what, suffix in (("tokens", "bin"), ("ends", "ends")):
                file = f"{split}-{k:05d}.{suffix}"  # fixed names: an entry cannot point at another split's shard
                need(shard.get(what) == file, f"{name}.{what}", shard.get(what, _MISSING), repr(file))
                if meta["version"] >= 2:
                    crc = shard.get(f"{what}_crc32", _MISSING)
                    need(isinstance(crc, str) and bool(_CRC.match(crc)), f"{name}.{what}_crc32", crc, "8 hex digits")
            for key in totals:
                totals[key] += count(shard.get(key, _MISSING), f"{name}.{key}")
        for key, total in (("documents", totals["n_documents"]), ("tokens", totals["n_tokens"])):
            value = count(entry.get(key, _MISSING), f"splits.{split}.{key}")
            need(value == total, f"splits.{split}.{key}", value, f"{total}, the sum over its shards")


class PreparedCorpus:
    """A prepared corpus opened for reading; ``open`` checks its metadata, ``split`` its files."""

    def __init__(self, directory: Path, meta: dict, verify: bool = True):
        self.directory, self.meta, self.verify = directory, meta, verify

    @classmethod
    def open(cls, directory: str | Path, *, verify: bool = True) -> PreparedCorpus:
        """``verify=False`` skips the CRC32s when a split is opened (sizes, counts, ends and token ids
        are always checked)."""
        directory = Path(directory)
        path = directory / META
        if not path.is_file():
            raise MissingFile(f"no prepared corpus at {directory} (missing {META}; make one with workbench prepare)")
        meta = read_json(path)
        _check_meta(path, meta)
        return cls(directory, meta, verify)

    @property
    def fingerprint(self) -> str:
        return self.meta["tokenizer"]["fingerprint"]

    def split(self, name: str) -> CorpusSplit:
        tok = self.meta["tokenizer"]
        if self.verify and self.meta["version"] < 2:
            logger.warning(
                "prepared corpus %s is format version %s: its shards carry no checksums, so only their sizes, "
                "ends and token ids are checked (prepare it again to have them)",
                self.directory,
                self.meta["version"],
            )
        return CorpusSplit(
            self.directory,
            name,
            self.meta["dtype"],
            self.meta["splits"][name]["shards"],
            id_limit=tok["id_limit"],
            eos_id=tok["eos_id"],
            verify=self.verify,
        )

    def check_tokenizer(self, tokenizer: TokenizerBase, whose: str) -> None:
        """Refuse ``whose`` tokenizer unless it is the one the corpus was prepared with."""
        if tokenizer.fingerprint != self.fingerprint:
            source = self.meta["tokenizer"].get("source") or "another tokenizer"
            raise BadInput(
                f"prepared corpus {self.directory} was tokenized with {source} (fingerprint {self.fingerprint[:12]}), "
                f"not {whose} ({tokenizer.kind}, fingerprint {tokenizer.fingerprint[:12]}): "
                "prepare it again with --tokenizer pointing at that run"
            )
        recorded = {k: self.meta["tokenizer"][k] for k in ("id_limit", "eos_id")}
        actual = {"id_limit": tokenizer.id_limit, "eos_id": tokenizer.eos_id}
        if recorded != actual:  # the ids are checked against the recorded limit: it must be the tokenizer's
            raise BadInput(
                f"{self.directory / META}: tokenizer {recorded} but the tokenizer with that fingerprint has {actual} "
                "(altered: prepare the corpus again)"
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
