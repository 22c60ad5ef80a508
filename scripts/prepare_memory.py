"""Peak memory of ``workbench prepare`` at 1x, 10x and 100x a corpus (the file concatenated with
itself), each in its own process: streaming means the peak does not grow with the corpus.

    python scripts/prepare_memory.py ../shared/data/gsm8k/train.jsonl runs/smollm2 --work /tmp/prep

Writes ``docs/results/prepare_memory.json``. The 100x corpus of GSM8K train is 417 MB of JSONL
(142M tokens); the work directory needs about twice that.
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
    parser.add_argument("--scales", default="1,10,100")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "prepare_memory.json"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True)
    rows = []
    for scale in (int(s) for s in args.scales.split(",")):
        source = work / f"x{scale}.jsonl"
        with source.open("wb") as out:
            for _ in range(scale):
                with open(args.source, "rb") as f:
                    shutil.copyfileobj(f, out)
        meta_path = work / f"x{scale}.json"
        cmd = [sys.executable, "-m", "workbench.cli", "prepare", str(source), "--tokenizer", args.tokenizer]
        cmd += ["--out", str(work / f"corpus-x{scale}"), "--no-progress", "--json", str(meta_path)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        meta = json.loads(meta_path.read_text())
        split = meta["splits"]
        rows.append(
            {
                "scale": scale,
                "source_bytes": source.stat().st_size,
                "documents": split["train"]["documents"] + split["heldout"]["documents"],
                "tokens": split["train"]["tokens"] + split["heldout"]["tokens"],
                "seconds": meta["seconds"],
                "peak_rss_mib": meta["peak_rss_mib"],
            }
        )
        print(rows[-1], flush=True)
        shutil.rmtree(work / f"corpus-x{scale}")
        source.unlink()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    result = {
        "command": "python scripts/prepare_memory.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "machine": {"cpu": platform.machine(), "cores": os.cpu_count()},
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
