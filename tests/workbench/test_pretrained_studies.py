"""The studies on an imported model with a subword tokenizer (a tiny random Llama with a byte-level
BPE, built locally): task labels reach tokens by the alignment rule, and the cache and probe verbs
encode with the run's tokenizer, never the character one."""

import json

import numpy as np
import pytest
from helpers import cli
from pretrained import CONFIG, byte_level_bpe, imported_run

from workbench.probing.store import load_store
from workbench.runtime.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return imported_run(tmp_path_factory.mktemp("imported"))


def test_a_token_takes_the_label_of_the_character_it_ends_at():
    bpe = HFTokenizer(byte_level_bpe(), CONFIG)
    text = "héllo 😀 #### 72"  # é is two bytes and 😀 four: byte-level tokens end inside them
    by_char = list(range(len(text)))  # the label of a character is its index
    ids, labels = bpe.encode_labelled(text, {"index": by_char, "short": by_char[:3]})
    assert ids == bpe.encode(text)
    pieces = [bpe.decode(ids[: j + 1]) for j in range(len(ids))]  # the text decoded up to each token
    expected = []
    for j, piece in enumerate(pieces):
        whole = "\ufffd" not in piece and (j + 1 == len(ids) or pieces[j + 1] != piece)
        expected.append(len(piece) - 1 if whole else -1)  # a partial character decodes to U+FFFD
    assert labels["index"] == expected
    assert expected.count(-1) == 1 + 3  # é's first byte, 😀's first three
    assert labels["short"] == [i if 0 <= i < 3 else -1 for i in expected]
    # the character tokenizer keeps one label per character, unchanged
    char_ids, char_labels = CharTokenizer().encode_labelled("ab#1", {"x": [5, 6, 7, 8]})
    assert (len(char_ids), char_labels) == (4, {"x": [5, 6, 7, 8]})


def test_the_cache_verb_encodes_and_labels_with_the_runs_tokenizer(run, tmp_path):
    code, out, err = cli(
        ["cache", str(run), "--hooks", "blocks.0.hook_resid_pre", "--task", "chain"]
        + ["--n-sequences", "6", "--out", str(tmp_path / "store")]
    )
    assert code is None, err
    ds, meta = load_store(tmp_path / "store")
    bpe = load_tokenizer(run)
    table = ds.select_columns(["seq", "pos", "token", "label.value"]).with_format("numpy")[:]
    from workbench.data.splits import heldout_task

    examples = heldout_task("chain", 6, 0)[:6]
    for i, ex in enumerate(examples):
        ids, labels = bpe.encode_labelled(ex.text, ex.labels)
        rows = table["seq"] == i
        assert table["token"][rows].tolist() == ids  # BPE ids, fewer than the characters
        assert table["label.value"][rows].tolist() == labels["value"]
        assert len(ids) < len(ex.text)
    assert (table["label.value"] >= 0).sum() > 0


def test_the_probe_verb_sweeps_an_imported_model(run, tmp_path, monkeypatch):
    from workbench.probing import study

    seen = []
    real = study.cache_activations
    monkeypatch.setattr(study, "cache_activations", lambda *a, **kw: seen.append(kw["tokenizer"]) or real(*a, **kw))
    out = tmp_path / "probe.json"
    code, _, err = cli(["probe", str(run), "--target", "value", "--n-sequences", "24", "--out", str(out)])
    assert code is None, err
    report = json.loads(out.read_text())
    assert [row["hook"] for row in report["rows"]] == [
        "blocks.0.hook_resid_pre",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_post",
    ]
    assert all(row["prefill"] == "standard" and np.isfinite(row["accuracy"]) for row in report["rows"])
    assert [t.kind for t in seen] == ["hf"]


def test_stream_windows_are_encoded_by_the_tokenizer_given():
    from workbench.data.splits import heldout_examples
    from workbench.studies.streams import task_windows

    bpe = HFTokenizer(byte_level_bpe(), CONFIG)
    x = task_windows("chain", 3, 12, tokenizer=bpe)
    texts = [ex.text for ex in heldout_examples("chain", 8, 0)]
    for row in x:
        pieces = bpe.decode(row, skip_special=False).split("<|im_end|>")  # eos between examples
        assert all(any(p in t for t in texts) for p in pieces if p)
    assert len(bpe.decode(x[0], skip_special=False)) > 12  # subword tokens: more characters than tokens
