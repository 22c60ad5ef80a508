"""Guarantee: content from elsewhere (a corpus, a task file) gets a one-line error within bounded
memory before any work. JSON is the parser's worst case: nesting deeper than it recurses and an
integer past ``int``'s digit limit are its own RecursionError and ValueError otherwise."""

import pytest
from helpers import assert_usage_error

HOSTILE = {
    "nested too deeply": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "a 100,000-digit integer": ('{"question": "q", "answer": ' + "9" * 100_000 + "}", "a number too long"),
}


@pytest.fixture(params=list(HOSTILE))
def hostile(request, tmp_path):
    line, said = HOSTILE[request.param]
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"question": "1 + 1?", "answer": "#### 2"}\n' + line + "\n")
    return path, said


def test_prepare_refuses_a_hostile_json_line_naming_it(hostile, micro_runs, tmp_path):
    path, said = hostile
    tokenizer = str(next(p for p in micro_runs.iterdir() if p.is_dir()))
    out = tmp_path / "prepared"
    assert_usage_error(["prepare", str(path), "--tokenizer", tokenizer, "--out", str(out)], f"{path}:2", said)
    assert not out.exists()


@pytest.mark.parametrize("verb", ["train", "eval", "traces"])
def test_a_task_file_with_a_hostile_line_is_one_line_before_any_work(verb, hostile, micro_runs, tmp_path):
    path, said = hostile
    run = str(next(p for p in micro_runs.iterdir() if p.is_dir()))
    argv = {
        "train": ["train", "--arch", "baseline", "--preset", "debug", "--task", f"jsonl:{path}", "--out", str(tmp_path / "r")],
        "eval": ["eval", run, "--task", f"jsonl:{path}", "--no-progress"],
        "traces": ["traces", run, "--task", f"gsm8k-jsonl:{path}", "--out", str(tmp_path / "t"), "--no-progress"],
    }[verb]
    assert_usage_error(argv, f"{path}:2", said)
    assert not (tmp_path / "r").exists() and not (tmp_path / "t").exists()
