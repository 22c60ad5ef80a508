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


def gguf(tmp_path, entries: bytes = b"", n_entries: int = 0, tensors: bytes = b"", n_tensors: int = 0):
    """A GGUF v3 file of these raw key/value and tensor-info bytes, in a directory of its own."""
    import struct

    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    path = folder / "model.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_entries) + entries + tensors)
    return path


def gguf_string(text: str) -> bytes:
    import struct

    return struct.pack("<Q", len(text)) + text.encode()


@pytest.mark.parametrize(
    "case, said",
    [
        ("tokens", "declares 3,000,000 elements, more than the 1,048,576"),
        ("tensor", "declares 1,152,921,504,606,846,976 elements"),
        ("string", "runs past the end of the file"),
        ("entries", "declares 4,294,967,296 key/value pairs"),
    ],
)
def test_a_hostile_gguf_header_is_refused_before_any_parser_reads_it(case, said, tmp_path):
    """Three million one-byte tokens fit in 27 MB, and the gguf package builds objects of hundreds of
    bytes for each."""
    import struct

    key = gguf_string("tokenizer.ggml.tokens") + struct.pack("<I", 9)
    path = {
        "tokens": lambda: gguf(tmp_path, key + struct.pack("<IQ", 8, 3_000_000) + gguf_string("a"), 1),
        "tensor": lambda: gguf(tmp_path, tensors=gguf_string("w") + struct.pack("<IQQIQ", 2, 2**30, 2**30, 0, 0), n_tensors=1),
        "string": lambda: gguf(tmp_path, struct.pack("<Q", 2**40) + b"general.name", 1),
        "entries": lambda: gguf(tmp_path, n_entries=2**32),
    }[case]()
    out = tmp_path / "run"
    assert_usage_error(["import", str(path), str(out)], str(path), said)
    assert not out.exists()
