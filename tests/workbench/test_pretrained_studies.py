"""The studies on an imported model with a subword tokenizer (a tiny random Llama with a byte-level
BPE, built locally): task labels reach tokens by the alignment rule, and the cache and probe verbs
encode with the run's tokenizer, never the character one."""

import csv
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
        + ["--n", "6", "--out", str(tmp_path / "store")]
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


@pytest.mark.slow
def test_the_probe_verb_sweeps_an_imported_model(run, tmp_path, monkeypatch):
    from workbench.probing import study

    seen = []
    real = study.cache_activations
    monkeypatch.setattr(study, "cache_activations", lambda *a, **kw: seen.append(kw["tokenizer"]) or real(*a, **kw))
    out = tmp_path / "probe.json"
    code, _, err = cli(["probe", str(run), "--target", "value", "--n", "24", "--out", str(out)])
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
    x, _ = task_windows("chain", 3, 12, tokenizer=bpe)
    texts = [ex.text for ex in heldout_examples("chain", 8, 0)]
    for row in x:
        pieces = bpe.decode(row, skip_special=False).split("<|im_end|>")  # eos between examples
        assert all(any(p in t for t in texts) for p in pieces if p)
    assert len(bpe.decode(x[0], skip_special=False)) > 12  # subword tokens: more characters than tokens


def test_generate_chat_formats_the_prompt_as_transformers_does(run, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(run)  # the run's own tokenizer files, read by transformers
    messages = [{"role": "user", "content": "What is 12 plus 30?"}]
    expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert expected.endswith("<|im_start|>assistant\n")
    assert load_tokenizer(run).chat_prompt("What is 12 plus 30?") == expected
    chat, plain = tmp_path / "chat.json", tmp_path / "plain.json"
    code, _, err = cli(["generate", str(run), "--chat", "--prompt", "What is 12 plus 30?", "--json", str(chat)])
    assert code is None, err
    code, _, err = cli(["generate", str(run), "--prompt", expected, "--json", str(plain)])
    assert code is None, err
    chat_out, plain_out = json.loads(chat.read_text()), json.loads(plain.read_text())
    assert chat_out["chat"] and chat_out["generations"] == plain_out["generations"]
    assert chat_out["prompts"] == ["What is 12 plus 30?"]


def test_chat_needs_a_tokenizer_with_a_template(tmp_path):
    from helpers import assert_usage_error

    from workbench import build_model, save_model

    char_run = save_model(build_model("baseline", "debug"), tmp_path / "char")
    assert_usage_error(["generate", str(char_run), "--chat", "--prompt", "hi"], "has no chat template", str(char_run))


def test_traces_chat_prompts_through_the_template_and_counts_characters(run, tmp_path, monkeypatch):
    from workbench.studies import traces

    prompts = []
    real = traces.generate
    monkeypatch.setattr(traces, "generate", lambda model, batch, **kw: prompts.extend(batch) or real(model, batch, **kw))
    code, _, err = cli(
        ["traces", str(run), "--task", "chain", "--chat", "--n", "4", "--max-new-tokens", "8", "--out", str(tmp_path / "t")]
    )
    assert code is None, err
    bpe = load_tokenizer(run)
    examples = traces.problems("chain", 4, [1, 2, 3, 4])
    assert sorted(prompts) == sorted(bpe.encode(traces.chat_problem(ex, bpe)) for ex in examples)
    question = examples[0].prompt.removeprefix("Q: ").removesuffix("\nA:")
    assert bpe.decode(bpe.encode(traces.chat_problem(examples[0], bpe)), skip_special=False).startswith(
        f"<|im_start|>user\n{question}\n\n{traces.CHAT_INSTRUCTION}<|im_end|>"
    )
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert summary["chat"] == {"instruction": traces.CHAT_INSTRUCTION, "runs": ["run"]}
    with (tmp_path / "t" / "traces.csv").open() as f:
        rows = list(csv.DictReader(f))
    chars = [len(row["text"].split("####")[0]) for row in rows]
    assert [int(row["trace_chars"]) for row in rows] == chars
    group = summary["groups"]["run/standard"]
    assert group["mean_trace_chars"] == pytest.approx(np.mean(chars))
    assert group["answered"] == np.mean([row["answer"] != "" for row in rows])
    assert group["accuracy_last_number"] == np.mean([row["last_number_correct"] == "True" for row in rows])


def test_traces_chat_refuses_a_run_without_a_template_before_generating(tmp_path):
    from helpers import assert_usage_error

    from workbench import build_model, save_model

    char_run = save_model(build_model("baseline", "debug"), tmp_path / "char")
    assert_usage_error(
        ["traces", str(char_run), "--task", "chain", "--chat", "--out", str(tmp_path / "t")], "has no chat template"
    )
    assert not (tmp_path / "t").exists()


def test_traces_chat_names_the_runs_it_formats_and_the_others_keep_the_completion_format(run, tmp_path, monkeypatch):
    """--chat NAMES: an instruct model beside a character-level one, each prompted as it can be."""
    from helpers import assert_usage_error

    from workbench import build_model, save_model
    from workbench.runtime.checkpoint import load_model
    from workbench.studies import traces

    char_run = save_model(build_model("baseline", "debug"), tmp_path / "char")
    prompts = {}
    real = traces.generate
    monkeypatch.setattr(
        traces,
        "generate",
        lambda model, batch, **kw: prompts.setdefault(model.cfg.d_vocab, []).extend(batch) or real(model, batch, **kw),
    )
    argv = [
        "traces",
        str(run),
        str(char_run),
        "--task",
        "chain",
        "--n",
        "3",
        "--max-new-tokens",
        "6",
        "--out",
        str(tmp_path / "t"),
    ]
    code, _, err = cli([*argv, "--chat", "run"])
    assert code is None, err
    bpe, char = load_tokenizer(run), load_tokenizer(char_run)
    examples = traces.problems("chain", 3, [1, 2, 3, 4])
    vocab = {name: load_model(path).cfg.d_vocab for name, path in (("bpe", run), ("char", char_run))}
    assert vocab["bpe"] != vocab["char"]
    assert sorted(prompts[vocab["bpe"]]) == sorted(bpe.encode(traces.chat_problem(ex, bpe)) for ex in examples)
    assert sorted(prompts[vocab["char"]]) == sorted(char.encode(ex.prompt) for ex in examples)
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["chat"]["runs"] == ["run"]
    formats = {(r["model"], r["format"]) for r in traces.read_traces(tmp_path / "t" / "traces.csv")}
    assert formats == {("run", "chat"), ("char", "completion")}
    assert_usage_error([*argv, "--chat", "nobody", "--overwrite"], "--chat nobody", "nobody is not one of the runs' names")
