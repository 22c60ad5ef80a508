"""Peak memory of ``workbench prepare`` at 1x, 10x and 100x a corpus (the file concatenated with
itself), and on one long document (``--long``: a single JSONL line of that many million characters,
the corpus's texts joined and repeated), each in its own process: streaming means the peak does not
grow with the corpus, and tokenizing in pieces that it does not grow with one document's
tokenization (only with its text, read whole).

    python scripts/prepare_memory.py ../shared/data/gsm8k/train.jsonl runs/smollm2 --work /tmp/prep
    python scripts/prepare_memory.py ../shared/data/gsm8k/train.jsonl runs/smollm2 --work /tmp/prep-long \
        --scales "" --long 20,60

Writes ``docs/results/prepare_memory.json``. The 100x corpus of GSM8K train is 417 MB of JSONL
(142M tokens); the work directory needs about twice that. A long document must stay under
``MAX_DOCUMENT_BYTES`` (64 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("tokenizer", help="a run directory whose tokenizer to use")
    parser.add_argument("--work", required=True, help="a new directory for the copies and corpora")
    parser.add_argument("--scales", default="1,10,100", help="copies of the source, comma-separated ('' for none)")
    parser.add_argument("--long", default="", help="one document of this many million characters, comma-separated")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "prepare_memory.json"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True)
    rows, long_rows = [], []
    for scale in (int(s) for s in args.scales.split(",") if s):
        source = work / f"x{scale}.jsonl"
        with source.open("wb") as out:
            for _ in range(scale):
                with open(args.source, "rb") as f:
                    shutil.copyfileobj(f, out)
        meta = prepare(source, args.tokenizer, work, f"x{scale}")
        rows.append({"scale": scale, **measured(source, meta)})
        print(rows[-1], flush=True)
        source.unlink()
    for millions in (int(s) for s in args.long.split(",") if s):
        source = work / f"long{millions}.jsonl"
        source.write_text(json.dumps({"text": long_document(Path(args.source), millions * 10**6)}) + "\n")
        meta = prepare(source, args.tokenizer, work, f"long{millions}")
        long_rows.append({"characters": millions * 10**6, **measured(source, meta)})
        print(long_rows[-1], flush=True)
        source.unlink()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    result = {
        "command": "python scripts/prepare_memory.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "machine": {"cpu": platform.machine(), "cores": os.cpu_count()},
        "rows": rows,
        "long_documents": long_rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


def prepare(source: Path, tokenizer: str, work: Path, name: str) -> dict:
    """``workbench prepare`` of ``source`` in its own process (its peak is its own); its JSON."""
    meta_path = work / f"{name}.json"
    cmd = [sys.executable, "-m", "workbench.cli", "prepare", str(source), "--tokenizer", tokenizer]
    cmd += ["--out", str(work / f"corpus-{name}"), "--no-progress", "--json", str(meta_path)]
    subprocess.run(cmd, check=True, cwd=ROOT)
    shutil.rmtree(work / f"corpus-{name}")
    return json.loads(meta_path.read_text())


def measured(source: Path, meta: dict) -> dict:
    split = meta["splits"]
    return {
        "source_bytes": source.stat().st_size,
        "documents": split["train"]["documents"] + split["heldout"]["documents"],
        "tokens": split["train"]["tokens"] + split["heldout"]["tokens"],
        "seconds": meta["seconds"],
        "peak_rss_mib": meta["peak_rss_mib"],
    }


def long_document(source: Path, characters: int) -> str:
    """The source's documents joined by spaces and repeated to ``characters``: ordinary text with
    words, digits and newlines, as one document."""
    from workbench.data.sources import documents

    text = " ".join(t for t, _ in documents(source))
    return (text + " ") * (characters // (len(text) + 1)) + text[: characters % (len(text) + 1)]


if __name__ == "__main__":
    main()
