"""Prepared corpora (``workbench prepare``): what the shards hold, the held-out rule, named errors
before any work, training and eval from them, and continued pretraining of an imported model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FAST, assert_usage_error, cli
from pretrained import CONFIG, byte_level_bpe, imported_run
from tokenizers import Tokenizer, models, pre_tokenizers

from workbench.data.prepared import PreparedCorpus, documents, heldout_examples, is_heldout, prepare_corpus
from workbench.data.tasks import gsm8k_example
from workbench.data.windows import TokenStream, batch_windows
from workbench.runtime.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer
from workbench.storage.errors import BadInput, MissingFile, OutputExists
from workbench.training.evaluate import check_not_trained_on, evaluate_run
from workbench.training.runconfig import make_run_config
from workbench.training.train import fit_fusion, init_from, initial_losses, train

SAMPLE = Path(__file__).parents[1] / "data" / "gsm8k_sample.jsonl"


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
    ],
)
def test_bad_sources_are_named_before_any_work(tmp_path, content, match):
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
