"""Prepared corpora (``workbench prepare``): what the shards hold, the held-out rule, named errors
before any work, training and eval from them, and continued pretraining of an imported model."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FAST, assert_nothing_lost, assert_usage_error, cli, snapshot, tally
from pretrained import CONFIG, byte_level_bpe, imported_run
from tokenizers import Tokenizer, models, pre_tokenizers

from workbench.data import pieces, prepared, sources
from workbench.data.pieces import piece_bounds
from workbench.data.prepared import PreparedCorpus, heldout_examples, is_heldout, prepare_corpus
from workbench.data.sources import documents
from workbench.data.tasks import gsm8k_example
from workbench.data.windows import TokenStream, batch_windows
from workbench.runtime.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer
from workbench.storage.errors import BadInput, MissingFile, OutputExists
from workbench.training.evaluate import check_not_trained_on, evaluate_run
from workbench.training.runconfig import make_run_config
from workbench.training.strategies import fit_fusion
from workbench.training.train import init_from, initial_losses, train

SAMPLE = Path(__file__).parents[1] / "data" / "gsm8k_sample.jsonl"
COUNTS = tally("hostile corpora")  # malformed sources tried; prepared corpora damaged by hand


def sample_texts() -> list[str]:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    return [gsm8k_example(r["question"], r["answer"]).text for r in rows]


def bpe() -> HFTokenizer:
    return HFTokenizer(byte_level_bpe(), CONFIG)


def all_documents(corpus: PreparedCorpus, split: str) -> list[list[int]]:
    return [d.tolist() for d in corpus.split(split).documents()]


@pytest.mark.parametrize("make", [CharTokenizer, bpe], ids=["char", "bpe"])
def test_the_shards_hold_every_document_once_in_order_with_its_eos(tmp_path, make):
    tok = make()
    meta = prepare_corpus([SAMPLE], tok, tmp_path / "c", heldout_fraction=0.3, seed=4, shard_tokens=700)
    corpus = PreparedCorpus.open(tmp_path / "c")
    texts = sample_texts()
    expected = {"train": [], "heldout": []}
    for text in texts:  # the rule, computed here from the text alone
        expected["heldout" if is_heldout(text, 4, 0.3) else "train"].append(tok.encode(text) + [tok.eos_id])
    for split in ("train", "heldout"):
        assert all_documents(corpus, split) == expected[split]
        assert meta["splits"][split]["documents"] == len(expected[split])
        assert len(corpus.split(split)) == sum(map(len, expected[split]))
    assert 0 < len(expected["heldout"]) < len(texts)
    assert len(meta["splits"]["train"]["shards"]) > 2  # small shards: windows below cross them
    assert meta["dtype"] == "uint16" and meta["tokenizer"]["fingerprint"] == tok.fingerprint
    assert meta["sources"][0]["documents"] == {"gsm8k": len(texts)}


def test_windows_across_shards_equal_windows_of_one_stream(tmp_path):
    tok = bpe()
    prepare_corpus([SAMPLE], tok, tmp_path / "c", heldout_fraction=0.2, shard_tokens=300)
    split = PreparedCorpus.open(tmp_path / "c").split("train")
    whole = TokenStream(np.concatenate(list(split.documents())), np.zeros(len(split), dtype=np.int32))
    for step in range(5):
        a, b = batch_windows(split, 3, step, 8, 64), batch_windows(whole, 3, step, 8, 64)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    ends = np.cumsum([s["n_tokens"] for s in split.shards])
    straddling = np.array([ends[0] - 10])
    assert split.take(straddling, 20).tolist() == [whole.ids[ends[0] - 10 : ends[0] + 10].tolist()]


def test_identical_documents_land_on_the_same_side(tmp_path):
    source = tmp_path / "dup.jsonl"
    lines = SAMPLE.read_text().splitlines()
    source.write_text("\n".join(lines + lines) + "\n")
    prepare_corpus([source], CharTokenizer(), tmp_path / "c", heldout_fraction=0.3)
    corpus = PreparedCorpus.open(tmp_path / "c")
    train = {tuple(d) for d in all_documents(corpus, "train")}
    held = {tuple(d) for d in all_documents(corpus, "heldout")}
    assert held and not (train & held)


def test_a_vocabulary_past_65536_ids_is_stored_as_uint32(tmp_path):
    vocab = {f"w{i}": i for i in range(70_000)} | {"<eos>": 70_000}
    words = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = HFTokenizer(words, {"eos_token": "<eos>"})
    (tmp_path / "t.txt").write_text("w69999 w5\n\nw1\n")
    meta = prepare_corpus([tmp_path / "t.txt"], tok, tmp_path / "c", heldout_fraction=0)
    assert meta["dtype"] == "uint32"
    assert all_documents(PreparedCorpus.open(tmp_path / "c"), "train") == [[69999, 5, 70000], [1, 70000]]


def test_text_files_and_saved_datasets_are_read_as_documents(tmp_path):
    import datasets

    (tmp_path / "a.txt").write_text("first paragraph\nstill first\n\n\nsecond\n")
    assert [t for t, _ in documents(tmp_path / "a.txt")] == ["first paragraph\nstill first", "second"]
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:5]]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"text": "hello"}])}).save_to_disk(str(tmp_path / "dd"))
    assert [t for t, _ in documents(tmp_path / "ds")] == sample_texts()[:5]
    assert [t for t, _ in documents(tmp_path / "dd")] == ["hello"]
    meta = prepare_corpus([tmp_path / "a.txt", tmp_path / "ds"], CharTokenizer(), tmp_path / "c", heldout_fraction=0)
    assert [s["kind"] for s in meta["sources"]] == ["text", "datasets"]
    assert meta["splits"]["train"]["documents"] == 7


@pytest.mark.parametrize(
    "content,match",
    [
        ("", "no documents (an empty file)"),
        ("\n\n  \n", "no documents (only blank lines)"),
        ('{"question": "q", "answer": "#### 1"}\n{oops\n', "bad.jsonl:2: not JSON"),
        ('{"question": "q"}\n', "bad.jsonl:1: expected an object with 'question' and 'answer'"),
        ("[1, 2]\n", "bad.jsonl:1: expected an object"),
        (b'{"text": "a"}\n\xff\xfe\n', "bad.jsonl:2: not UTF-8"),
        # str(None) made these the text "Q: None" / "None"
        ('{"question": null, "answer": "#### 1"}\n', "bad.jsonl:1: 'question' is null, expected a string"),
        ('{"text": "a"}\n{"question": "q", "answer": 7}\n', "bad.jsonl:2: 'answer' is an integer (7), expected a string"),
        ('{"text": null}\n', "bad.jsonl:1: 'text' is null, expected a string"),
    ],
)
def test_bad_sources_are_named_before_any_work(tmp_path, content, match):
    COUNTS["inputs_tried"] += 1
    (tmp_path / "bad.jsonl").write_bytes(content if isinstance(content, bytes) else content.encode())
    sources = [SAMPLE, tmp_path / "bad.jsonl"]  # the good file first: nothing of it is written either
    with pytest.raises(BadInput, match=re.escape(match)):
        prepare_corpus(sources, CharTokenizer(), tmp_path / "c")
    assert not (tmp_path / "c").exists()
    with pytest.raises(MissingFile, match="no corpus source at"):
        prepare_corpus([tmp_path / "missing.jsonl"], CharTokenizer(), tmp_path / "c")


def test_an_output_is_never_replaced_unless_it_is_a_corpus_and_overwrite_is_given(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(OutputExists, match="not a prepared corpus"):
        prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    first = prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "c", shard_tokens=500)
    with pytest.raises(OutputExists, match="--overwrite"):
        prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "c")
    prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "c", overwrite=True)  # one shard per split now
    left = sorted(p.name for p in (tmp_path / "c").iterdir() if not p.name.startswith("."))
    assert len(first["splits"]["train"]["shards"]) > 1
    assert left == ["corpus.json", "heldout-00000.bin", "heldout-00000.ends", "train-00000.bin", "train-00000.ends"]


def test_the_fingerprint_tells_tokenizers_apart_and_survives_a_save(tmp_path):
    tok = bpe()
    tok.save(tmp_path)
    assert load_tokenizer(tmp_path).fingerprint == tok.fingerprint
    assert CharTokenizer().fingerprint != tok.fingerprint != HFTokenizer(byte_level_bpe(vocab_size=290), CONFIG).fingerprint


def test_training_on_a_corpus_of_another_tokenizer_is_refused_before_the_run_exists(tmp_path):
    prepare_corpus([SAMPLE], bpe(), tmp_path / "c")
    cfg = make_run_config("baseline", "debug", f"prepared:{tmp_path / 'c'}", FAST + ["train.steps=2"])
    with pytest.raises(BadInput, match="was tokenized with .* fingerprint"):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_on_a_prepared_corpus_resumes_exactly_and_evaluates_on_held_out_documents(tmp_path):
    prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "c", heldout_fraction=0.2)
    task = f"prepared:{tmp_path / 'c'}"
    cfg = make_run_config("fbt", "debug", task, FAST + ["train.steps=6", "train.checkpoint_every=3", "model.n_ctx=1024"])
    whole = train(cfg, tmp_path / "a", progress=False).model
    train(cfg, tmp_path / "b", progress=False, stop_after=3)
    resumed = train(cfg, tmp_path / "b", resume=True, progress=False).model
    for (name, p), q in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    result = evaluate_run(tmp_path / "a", n_examples=3, write=False)
    row = result["tasks"][task]
    corpus = PreparedCorpus.open(tmp_path / "c")
    held = heldout_examples(corpus, CharTokenizer(), 3)
    assert row["n"] == 3 and [ex.text for ex in held] == [t for t in sample_texts() if is_heldout(t, 0, 0.2)][:3]
    assert set(row["loss"]) == {"standard", "recurrent"} and set(row["accuracy"]) == {"standard", "soft", "fused"}


def test_eval_refuses_the_files_a_run_trained_on_in_any_form(tmp_path):
    prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "c", seed=0)
    prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "other", seed=1)
    (tmp_path / "test.jsonl").write_text(SAMPLE.read_text().splitlines()[0] + "\n")
    prepare_corpus([tmp_path / "test.jsonl"], CharTokenizer(), tmp_path / "test", heldout_fraction=0)
    ours = f"prepared:{tmp_path / 'c'}"
    check_not_trained_on(tmp_path, ours, ours)  # its own held-out split
    check_not_trained_on(tmp_path, ours, "chain")
    for task in (f"jsonl:{SAMPLE}", f"prepared:{tmp_path / 'other'}"):
        with pytest.raises(BadInput, match="would score its own training examples"):
            check_not_trained_on(tmp_path, ours, task)
    with pytest.raises(BadInput, match="would score its own training examples"):
        check_not_trained_on(tmp_path, f"jsonl:{SAMPLE}", ours)
    # another file's corpus holds no training document, even if its text also occurs in the sample
    check_not_trained_on(tmp_path, ours, f"prepared:{tmp_path / 'test'}")


def test_prepare_verb_writes_a_corpus_and_names_bad_input_in_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    CharTokenizer().save(tmp_path / "run")
    code, out, err = cli(
        ["prepare", str(SAMPLE), "--tokenizer", str(tmp_path / "run"), "--out", str(tmp_path / "c"), "--no-progress"]
    )
    assert code is None and "prepared" in out and "held out" in out, err
    assert PreparedCorpus.open(tmp_path / "c").meta["tokenizer"]["source"] == str((tmp_path / "run").resolve())
    (tmp_path / "bad.jsonl").write_text("not json\n")
    assert_usage_error(
        ["prepare", str(tmp_path / "bad.jsonl"), "--tokenizer", str(tmp_path / "run"), "--out", str(tmp_path / "d")],
        "bad.jsonl:1: not JSON",
    )
    assert not (tmp_path / "d").exists()


# ---- hostile sources ----------------------------------------------------------------------


def test_a_fifo_or_a_device_is_named_by_what_it_is_and_never_read(tmp_path):
    COUNTS["inputs_tried"] += 2
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)

    def write_nothing():  # a reader that opened the FIFO would block until this opens it, then read EOF
        with open(fifo, "wb"):
            pass

    writer = threading.Thread(target=write_nothing, daemon=True)
    writer.start()
    try:
        with pytest.raises(BadInput, match=re.escape(f"corpus source {fifo} is a FIFO (named pipe): expected a regular file")):
            prepare_corpus([SAMPLE, fifo], CharTokenizer(), tmp_path / "c")
    finally:
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer go
        writer.join(5)
        os.close(reader)
    assert not (tmp_path / "c").exists()
    (tmp_path / "run").mkdir()
    CharTokenizer().save(tmp_path / "run")
    assert_usage_error(
        ["prepare", "/dev/zero", "--tokenizer", str(tmp_path / "run"), "--out", str(tmp_path / "d")],
        "/dev/zero is a character device",
        "a directory saved by datasets' save_to_disk",
    )


def long_text() -> str:
    return " ".join(sample_texts())  # one document of ~25,000 characters, words and newlines


@pytest.mark.parametrize("make", [CharTokenizer, bpe], ids=["char", "bpe"])
def test_a_long_document_is_tokenized_in_pieces_to_exactly_its_whole_tokens(tmp_path, monkeypatch, make):
    monkeypatch.setattr(pieces, "PIECE_CHARS", 300)
    monkeypatch.setattr(prepared, "ENCODE_CHARS", 1000)
    tok, text = make(), long_text()
    whole = tok.encode(text)
    bounds = list(piece_bounds(text, tok))
    assert bounds[0][0] == 0 and bounds[-1][1] == len(text) and len(bounds) >= len(text) // 300
    assert all(a < b <= a + 300 and b == c for (a, b), (c, _) in zip(bounds, bounds[1:]))
    assert sum((tok.encode(text[a:b]) for a, b in bounds), []) == whole
    if tok.kind == "char":  # one token per character: cut anywhere
        assert [b for _, b in bounds[:-1]] == list(range(300, 300 * len(bounds[:-1]) + 1, 300))
    else:  # cut before whitespace that follows a word; cut blindly, the tokens differ
        assert all(text[b].isspace() and not text[b - 1].isspace() for _, b in bounds[:-1])
        assert sum((tok.encode(text[a : a + 300]) for a in range(0, len(text), 300)), []) != whole
    source = tmp_path / "long.jsonl"
    source.write_text("\n".join(json.dumps({"text": t}) for t in ("before", text, "after")) + "\n")
    prepare_corpus([source], tok, tmp_path / "c", heldout_fraction=0, shard_tokens=len(whole) // 2)
    corpus = PreparedCorpus.open(tmp_path / "c")
    assert all_documents(corpus, "train") == [tok.encode(t) + [tok.eos_id] for t in ("before", text, "after")]


def test_a_long_document_that_cannot_be_cut_exactly_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(pieces, "PIECE_CHARS", 300)
    COUNTS["inputs_tried"] += 1
    (tmp_path / "t.txt").write_text("short\n\n" + "x" * 1000 + "\n")
    with pytest.raises(BadInput, match=re.escape(f"{tmp_path / 't.txt'}:3: a document of 1,000 characters")) as err:
        prepare_corpus([tmp_path / "t.txt"], bpe(), tmp_path / "c")
    assert "no whitespace after a word to cut at" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "c").exists()
    prepare_corpus([tmp_path / "t.txt"], CharTokenizer(), tmp_path / "c", heldout_fraction=0)  # any cut is exact
    tok = CharTokenizer()
    assert all_documents(PreparedCorpus.open(tmp_path / "c"), "train")[1] == tok.encode("x" * 1000) + [tok.eos_id]


def test_a_document_past_the_size_limit_is_refused_naming_its_file_and_line(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(sources, "MAX_DOCUMENT_BYTES", 1000)
    ok, big = "y" * 1000, "y" * 1001
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": big}) + "\n")
    (tmp_path / "b.txt").write_text(f"fine\n\n{ok[:600]}\n{ok[:600]}\n\n{ok}\n")
    datasets.Dataset.from_list([{"text": "fine"}, {"text": "é" * 501}]).save_to_disk(str(tmp_path / "ds"))
    cases = [
        ("a.jsonl", ":2: a line longer than 1,000 bytes, the most one document may hold"),
        ("b.txt", ":3: a document (lines 3-4 without a blank line between) longer than 1,000 bytes"),
        ("ds", " row 1: a document longer than 1,000 bytes"),  # 501 characters, 1,002 bytes of UTF-8
    ]
    for name, message in cases:
        COUNTS["inputs_tried"] += 1
        with pytest.raises(BadInput, match=re.escape(str(tmp_path / name) + message)):
            prepare_corpus([tmp_path / name], CharTokenizer(), tmp_path / "c")
    assert not (tmp_path / "c").exists()
    (tmp_path / "b.txt").write_text(f"fine\n\n{ok}\n")  # at the limit
    meta = prepare_corpus([tmp_path / "b.txt"], CharTokenizer(), tmp_path / "c", heldout_fraction=0)
    assert meta["splits"]["train"]["documents"] == 2 and meta["splits"]["train"]["tokens"] == 5 + 1001


MEMORY_PROBE = """
import json, sys
from workbench.data.prepared import prepare_corpus
from workbench.runtime.process import peak_rss_mib
from workbench.runtime.tokenizer import CharTokenizer

tok = CharTokenizer()
tok.tokenizer.encode_batch(["warm up " * 1000] * 8)
before = peak_rss_mib()
prepare_corpus([sys.argv[1]], tok, sys.argv[2], heldout_fraction=0)
print(json.dumps({"before": before, "after": peak_rss_mib()}))
"""


@pytest.mark.slow
def test_one_long_document_does_not_cost_hundreds_of_bytes_per_character(tmp_path):
    """Tokenized whole, a 1 MB document raised the peak by ~400 MiB (~400 bytes per character: the
    tokenizer's offsets, token strings and alignments for each token); in pieces, by a few copies of
    the text, its tokens and one bounded batch of tokenizer memory, ~64 MiB here
    (``scripts/prepare_memory.py --long`` measures it at scale)."""
    text = (long_text() + " ") * (1_000_000 // len(long_text()))
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": text}) + "\n")
    args = [str(tmp_path / "long.jsonl"), str(tmp_path / "c")]
    done = subprocess.run([sys.executable, "-c", MEMORY_PROBE, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    peak = json.loads(done.stdout.strip().splitlines()[-1])
    assert peak["after"] - peak["before"] < 160, peak
    assert len(PreparedCorpus.open(tmp_path / "c").split("train")) == len(text) + 1


# ---- hostile corpora: a prepared corpus edited by hand ------------------------------------


def edit_meta(directory: Path, edit) -> None:
    meta = json.loads((directory / "corpus.json").read_text())
    edit(meta)
    (directory / "corpus.json").write_text(json.dumps(meta))


def first_shard(split="train"):
    return lambda meta: meta["splits"][split]["shards"][0]


@pytest.fixture
def corpus_dir(tmp_path):
    prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "c", heldout_fraction=0.3, shard_tokens=5000)
    return tmp_path / "c"


def open_both(directory: Path, verify: bool = True) -> None:
    corpus = PreparedCorpus.open(directory, verify=verify)
    corpus.check_tokenizer(CharTokenizer(), "the test's")
    corpus.split("train"), corpus.split("heldout")


META_EDITS = {
    "n_tokens missing": (
        lambda m: first_shard()(m).pop("n_tokens"),
        "splits.train.shards[0].n_tokens is missing, expected an integer >= 0",
    ),
    "n_tokens a string": (
        lambda m: first_shard()(m).update(n_tokens=str(first_shard()(m)["n_tokens"])),
        "splits.train.shards[0].n_tokens is a string ('",
    ),
    "n_documents negative": (
        lambda m: first_shard("heldout")(m).update(n_documents=-1),
        "n_documents is an integer (-1), expected an integer >= 0",
    ),
    "a shard named as another split's": (
        lambda m: first_shard("heldout")(m).update(tokens="train-00000.bin"),
        "splits.heldout.shards[0].tokens is a string ('train-00000.bin'), expected 'heldout-00000.bin'",
    ),
    "split total off by one": (
        lambda m: m["splits"]["train"].update(tokens=m["splits"]["train"]["tokens"] + 1),
        ", the sum over its shards",
    ),
    "checksum missing": (
        lambda m: first_shard()(m).pop("ends_crc32"),
        "splits.train.shards[0].ends_crc32 is missing, expected 8 hex digits",
    ),
    "id_limit null": (lambda m: m["tokenizer"].update(id_limit=None), "tokenizer.id_limit is null, expected an integer >= 0"),
    "id_limit raised": (
        lambda m: m["tokenizer"].update(id_limit=60000),
        "tokenizer {'id_limit': 60000, 'eos_id': 2} but the tokenizer",
    ),
    "version 3": (lambda m: m.update(version=3), "version 3, expected 'workbench-prepared-corpus' version 1 or 2"),
    "splits a list": (lambda m: m.update(splits=[]), "splits is a list ([]), expected an object with ['train', 'heldout']"),
}


@pytest.mark.parametrize("case", list(META_EDITS))
def test_a_hand_edited_corpus_json_is_a_one_line_error_naming_the_field(corpus_dir, case):
    edit, message = META_EDITS[case]
    edit_meta(corpus_dir, edit)
    COUNTS["faults_injected"] += 1
    before = snapshot(corpus_dir)
    with pytest.raises(BadInput, match=re.escape(message)) as err:
        open_both(corpus_dir)
    assert "\n" not in str(err.value)
    assert_nothing_lost(before, snapshot(corpus_dir), COUNTS)


def rewrite(path: Path, dtype: str, change) -> None:
    values = np.fromfile(path, dtype=dtype)
    change(values)
    values.tofile(path)


def swap_two_tokens(values):
    values[[3, 4]] = values[[4, 3]]  # ids stay in range, sizes and ends stay right: only the CRC32 tells


SHARD_EDITS = {
    "token id past the vocabulary": (
        "train-00000.bin",
        "uint16",
        lambda v: v.__setitem__(7, 60000),
        "holds token id 60000, but its tokenizer's ids stop at 99",
    ),
    "ends reversed": (
        "heldout-00000.ends",
        "uint64",
        lambda v: v.__setitem__(slice(None), v[::-1].copy()),
        "holds document ends that do not increase strictly",
    ),
    "ends shifted by one": ("train-00000.ends", "uint64", lambda v: v.__setitem__(slice(0, -1), v[:-1] - 1), "ends with token"),
    "bytes swapped": ("train-00000.bin", "uint16", swap_two_tokens, "train-00000.bin does not match its CRC32 in corpus.json"),
    "torn": ("train-00000.bin", "uint16", None, "train-00000.bin has "),
}


@pytest.mark.parametrize("case", list(SHARD_EDITS))
def test_a_hand_edited_shard_is_a_one_line_error_naming_the_file(corpus_dir, case):
    name, dtype, change, message = SHARD_EDITS[case]
    if change is None:
        (corpus_dir / name).write_bytes((corpus_dir / name).read_bytes()[:-2])
    else:
        rewrite(corpus_dir / name, dtype, change)
    COUNTS["faults_injected"] += 1
    before = snapshot(corpus_dir)
    with pytest.raises(BadInput, match=re.escape(message)) as err:
        open_both(corpus_dir)
    assert "\n" not in str(err.value)
    assert_nothing_lost(before, snapshot(corpus_dir), COUNTS)
    if case == "bytes swapped":
        open_both(corpus_dir, verify=False)  # contents are verified on request; sizes and ids always


def test_training_on_a_corpus_with_ids_past_the_vocabulary_is_a_one_line_error_before_the_run(corpus_dir, tmp_path):
    rewrite(corpus_dir / "train-00000.bin", "uint16", lambda v: v.__setitem__(slice(None, None, 7), 60000))
    COUNTS["faults_injected"] += 1
    before = snapshot(corpus_dir)
    task = f"prepared:{corpus_dir}"
    sets = [f"--set={s}" for s in FAST + ["train.steps=2"]]
    argv = ["train", "--arch", "baseline", "--preset", "debug", "--task", task, "--out", str(tmp_path / "run"), *sets]
    assert_usage_error([*argv, "--no-progress"], "train-00000.bin holds token id 60000")  # was: ValueError traceback
    assert not (tmp_path / "run").exists()
    assert_nothing_lost(before, snapshot(corpus_dir), COUNTS)


def test_eval_on_a_corpus_with_hand_edited_ends_is_a_one_line_error(tmp_path):
    prepare_corpus([SAMPLE], CharTokenizer(), tmp_path / "good", heldout_fraction=0.3)
    cfg = make_run_config("baseline", "debug", f"prepared:{tmp_path / 'good'}", FAST + ["train.steps=1"])
    train(cfg, tmp_path / "run", progress=False)
    rewrite(tmp_path / "good" / "heldout-00000.ends", "uint64", lambda v: v.__setitem__(slice(None), v[::-1].copy()))
    COUNTS["faults_injected"] += 1

    def files():  # but the (empty) lock files: eval takes one on the run's results/
        return {k: v for k, v in snapshot(tmp_path).items() if Path(k).name != ".workbench.lock"}

    before = files()
    # was: eval published "loss 0.0" for empty documents, then KeyError: 'accuracy'
    assert_usage_error(["eval", str(tmp_path / "run"), "--n", "3"], "heldout-00000.ends holds document ends")
    assert_nothing_lost(before, files(), COUNTS)  # no results/eval.json with a loss of 0.0


def test_a_format_1_corpus_is_read_with_every_check_but_the_checksums(corpus_dir, caplog):
    def to_version_1(meta):
        meta["version"] = 1
        for split in meta["splits"].values():
            for shard in split["shards"]:
                del shard["tokens_crc32"], shard["ends_crc32"]

    before = {s: all_documents(PreparedCorpus.open(corpus_dir), s) for s in ("train", "heldout")}
    edit_meta(corpus_dir, to_version_1)
    rewrite(corpus_dir / "train-00000.bin", "uint16", swap_two_tokens)
    corpus = PreparedCorpus.open(corpus_dir)
    with caplog.at_level(logging.WARNING, logger="workbench.data.prepared"):
        assert all_documents(corpus, "heldout") == before["heldout"]
        assert all_documents(corpus, "train") != before["train"]  # no checksum to tell the swap
    assert caplog.text.count("format version 1: its shards carry no checksums") == 2  # once per split opened
    rewrite(corpus_dir / "train-00000.bin", "uint16", lambda v: v.__setitem__(7, 60000))
    COUNTS["faults_injected"] += 1
    with pytest.raises(BadInput, match="holds token id 60000"):
        corpus.split("train")


# ---- continued pretraining of an imported model -------------------------------------------


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpt")
    run = imported_run(root)
    prepare_corpus([SAMPLE], load_tokenizer(run), root / "corpus", heldout_fraction=0.2)
    return run, root / "corpus"


def cpt_config(arch, imported, *extra, preset=None):
    run, corpus = imported
    sets = ["train.batch_size=4", "train.seq_len=48", "train.steps=4", "train.checkpoint_every=2", "train.lr=1e-4", *extra]
    return make_run_config(arch, preset, f"prepared:{corpus}", sets, init_from=str(run))


def test_cpt_takes_the_source_runs_sizes_and_tokenizer(imported, tmp_path):
    run, _ = imported
    source = json.loads((run / "config.json").read_text())["model"]
    for arch in ("fbt", "hd"):
        cfg = cpt_config(arch, imported)
        assert {k: cfg.model.to_dict()[k] for k in source} == source
    with pytest.raises(BadInput, match="smaller than the run's hf tokenizer"):
        train(cpt_config("fbt", imported, preset="debug"), tmp_path / "x", progress=False)
    with pytest.raises(BadInput, match="model.d_model=64 there but 32 here"):
        train(cpt_config("fbt", imported, "model.d_vocab=300", preset="debug"), tmp_path / "x", progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("arch,extra", [("fbt", ["fbt.feedback_start=0"]), ("hd", ["hd.streams=2"])])
def test_cpt_from_an_imported_model_trains_resumes_exactly_and_keeps_its_tokenizer(imported, tmp_path, arch, extra):
    run, _ = imported
    cfg = cpt_config(arch, imported, *extra)
    whole = train(cfg, tmp_path / "a", progress=False).model
    train(cfg, tmp_path / "b", progress=False, stop_after=2)
    resumed = train(cfg, tmp_path / "b", resume=True, progress=False).model
    for (name, p), q in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    assert load_tokenizer(tmp_path / "a").fingerprint == load_tokenizer(run).fingerprint
    before = json.loads((tmp_path / "a" / "init.json").read_text())
    assert before["init_from"] == str(run) and np.isfinite(before["loss_plain"])
    assert ("loss_fused" in before) == (arch == "fbt")


def test_the_regression_fusion_init_is_the_least_squares_map_and_its_losses_are_recomputable(imported):
    run, corpus = imported
    cfg = cpt_config("fbt", imported)
    model = init_from(run, cfg, "cpu")
    stream = PreparedCorpus.open(corpus).split("train")
    fit = fit_fusion(model, stream, cfg)
    # independently: the same windows, torch's least-squares solver, R^2 from the residual
    from workbench.data.windows import step_generator

    T, d = cfg.train.seq_len, cfg.model.d_model
    rows = -(-4 * d // (T - 1))
    starts = torch.randint(0, len(stream) - T - 1, (rows,), generator=step_generator(cfg.train.seed, 0, purpose=5)).numpy()
    tokens = torch.from_numpy(stream.take(starts, T))
    with torch.no_grad():
        h = model.run_passes(tokens, 1)[0][:, :-1].reshape(-1, d).double()
        e = model.input_table[tokens[:, 1:]].reshape(-1, d).double()
    W = torch.linalg.lstsq(h, e).solution.T
    assert torch.allclose(model.fusion.W_U.weight.double() / 2, W, atol=1e-3 * W.abs().max().item())
    assert not model.fusion.W_G.weight.any()
    r2 = 1 - (e - h @ W.T).pow(2).sum() / (e - e.mean(0)).pow(2).sum()
    assert fit["positions"] == rows * (T - 1) and abs(fit["r2"] - r2.item()) < 1e-4
    losses = initial_losses(model, stream, cfg)
    x, y = batch_windows(stream, cfg.train.seed, 0, 4, T)
    with torch.no_grad():
        fused = model.run_passes(x, 2)[1]
        expected = torch.nn.functional.cross_entropy(model.readout(fused)[:, 1:].flatten(0, 1), y[:, 1:].flatten())
    assert losses["loss_fused"] == pytest.approx(expected.item(), rel=1e-5)


def test_held_out_text_documents_are_scored_by_loss_only(tmp_path):
    from workbench.runtime.config import build_model
    from workbench.training.evaluate import evaluate_examples

    (tmp_path / "t.txt").write_text("\n\n".join(f"paragraph {i}: the quick brown fox" for i in range(40)) + "\n")
    prepare_corpus([tmp_path / "t.txt"], CharTokenizer(), tmp_path / "c", heldout_fraction=0.3)
    held = heldout_examples(PreparedCorpus.open(tmp_path / "c"), CharTokenizer(), 5)
    assert held and all(ex.task == "text" and not ex.prompt and ex.completion.startswith("paragraph") for ex in held)
    row = evaluate_examples(build_model("fbt", "debug"), held, CharTokenizer())
    assert set(row) == {"n", "loss"} and set(row["loss"]) == {"standard", "recurrent"}
    with pytest.raises(BadInput, match="held-out documents: prepare it with --heldout > 0"):
        prepare_corpus([tmp_path / "t.txt"], CharTokenizer(), tmp_path / "d", heldout_fraction=0)
        heldout_examples(PreparedCorpus.open(tmp_path / "d"), CharTokenizer(), 5)
