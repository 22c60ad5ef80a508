"""One tokenizer interface: the character tokenizer and any Hugging Face fast tokenizer (here a
byte-level BPE and a BPE with an unknown token, trained locally on a few KB of text), saved with a
run and loaded back as the kind it is; what a tokenizer cannot represent is counted, never silent."""

import json

import pytest
import torch
from pretrained import CONFIG, bpe_with_unknown, byte_level_bpe

from workbench import build_model, generate, save_model
from workbench.runtime.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer
from workbench.storage.errors import BadInput


@pytest.fixture(scope="module")
def bpe():
    return HFTokenizer(byte_level_bpe(), CONFIG)


def test_a_byte_level_bpe_represents_any_unicode_text(bpe):
    text = "naïve café — 12 + 30 = 42 ✓ 数学\n"
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text and bpe.roundtrips(text) and bpe.lost_characters(text) == {}
    assert bpe.encode_checked(text) == ids
    assert len(ids) < len(text.encode())  # merges were learned: fewer ids than bytes
    assert (bpe.bos_id, bpe.eos_id, bpe.pad_id, bpe.unk_id) == (1, 2, 2, None)  # no pad token: pad with eos
    assert bpe.encode("ab", bos=True)[0] == 1 and bpe.chat_template == CONFIG["chat_template"]


def test_characters_a_tokenizer_cannot_represent_are_counted_and_refused_by_name():
    char = CharTokenizer()
    text = "café ✓ café"
    assert char.lost_characters(text) == {"é": 2, "✓": 1} and not char.roundtrips(text)
    with pytest.raises(BadInput, match=r"prompt has 3 characters the char tokenizer cannot represent: 'é' x2, '✓' x1"):
        char.encode_checked(text, where="prompt")
    unk = HFTokenizer(bpe_with_unknown(), {"eos_token": "<|im_end|>", "unk_token": "[UNK]"})
    # unknown characters become [UNK]; spaces are split off by its pre-tokenizer and encode to nothing
    assert unk.lost_characters("clips ✓ ✓") == {" ": 2, "✓": 2} and unk.unk_id == 0
    assert char.lost_characters("3+4=7\n") == {} == unk.lost_characters("clips")


def test_a_run_keeps_its_tokenizer_kind_ids_and_specials(tmp_path, bpe):
    model = build_model("baseline", "debug", d_vocab=bpe.id_limit)
    run = save_model(model, tmp_path / "run", tokenizer=bpe)
    config = json.loads((run / "tokenizer_config.json").read_text())
    assert config["workbench_tokenizer"] == "hf" and config["eos_token"] == "<|im_end|>"
    loaded = load_tokenizer(run)
    assert isinstance(loaded, HFTokenizer) and loaded.chat_template == bpe.chat_template
    assert (loaded.bos_id, loaded.eos_id, loaded.pad_id) == (bpe.bos_id, bpe.eos_id, bpe.pad_id)
    text = "Natalia sold 48 clips ✓"
    assert loaded.encode(text) == bpe.encode(text)
    with pytest.raises(BadInput, match="holds a hf tokenizer, not the character one"):
        CharTokenizer.load(run)


def test_runs_written_before_tokenizer_kinds_hold_the_character_tokenizer(tmp_path):
    run = save_model(build_model("fbt", "debug"), tmp_path / "run")
    config = json.loads((run / "tokenizer_config.json").read_text())
    del config["workbench_tokenizer"]
    (run / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = load_tokenizer(run)
    assert isinstance(loaded, CharTokenizer) and loaded.encode("3+4") == CharTokenizer().encode("3+4")


def test_bad_tokenizers_get_named_errors(tmp_path, bpe):
    run = save_model(build_model("baseline", "debug"), tmp_path / "run", tokenizer=bpe)  # 300 ids, d_vocab 128
    with pytest.raises(BadInput, match=r"does not match the model .*ids up to 299, the model's d_vocab is 128"):
        load_tokenizer(run)
    with pytest.raises(BadInput, match=r"names special tokens its vocabulary lacks: eos_token '</s>'"):
        HFTokenizer(byte_level_bpe(), {"eos_token": "</s>"})
    with pytest.raises(BadInput, match="names no eos_token"):
        HFTokenizer(byte_level_bpe(), {"bos_token": "<|im_start|>"})
    config = json.loads((run / "tokenizer_config.json").read_text())
    (run / "tokenizer_config.json").write_text(json.dumps({**config, "workbench_tokenizer": "sentencepiece"}))
    with pytest.raises(BadInput, match="workbench_tokenizer='sentencepiece': expected 'char' or 'hf'"):
        load_tokenizer(run)


def test_generate_through_the_cli_decodes_with_the_runs_tokenizer(tmp_path, bpe):
    from workbench.cli import main

    model = build_model("baseline", "debug", d_vocab=bpe.id_limit, seed=1)
    run = save_model(model, tmp_path / "run", tokenizer=bpe)
    out = tmp_path / "gen.json"
    main(["generate", str(run), "--prompt", "Natalia sold clips", "--max-new-tokens", "6", "--json", str(out)])
    text = json.loads(out.read_text())["generations"]["standard"][0]
    ids = generate(model, [bpe.encode("Natalia sold clips")], max_new_tokens=6, eos_token_id=bpe.eos_id, pad_token_id=bpe.pad_id)
    assert text == bpe.decode(ids.completions()[0]) and isinstance(text, str)
    assert torch.is_tensor(ids.new_tokens)


def test_the_trace_study_encodes_and_decodes_with_each_runs_tokenizer(tmp_path, bpe, monkeypatch):
    import csv

    import workbench.studies.traces as traces
    from workbench import load_model
    from workbench.studies.traces import problems, run_traces, trace_study

    used = []

    def spy(model, examples, regime, passes, tokenizer, **kwargs):
        used.append(tokenizer)
        return run_traces(model, examples, regime, passes, tokenizer, **kwargs)

    monkeypatch.setattr(traces, "run_traces", spy)
    run = save_model(build_model("fbt", "debug", d_vocab=bpe.id_limit, seed=2), tmp_path / "bpe-run", tokenizer=bpe)
    trace_study([str(run)], tmp_path / "traces", task="chain", regimes=["standard"], n_problems=4, max_new_tokens=6)
    # the run's own tokenizer, not the character one (whose ids for the same prompt differ)
    assert [type(t) for t in used] == [HFTokenizer]
    prompt = problems("chain", 1, [1], 0)[0].prompt
    assert used[0].encode(prompt) == bpe.encode(prompt) != CharTokenizer().encode(prompt)
    with (tmp_path / "traces" / "traces.csv").open() as f:
        texts = [row["text"] for row in csv.DictReader(f)]
    examples = problems("chain", 4, [1, 2, 3, 4], 0)
    by_hand = [r["text"] for r in run_traces(load_model(run), examples, "standard", 2, bpe, max_new_tokens=6)]
    assert texts == by_hand and any(texts)
