"""Learning curves of candidate model organisms: a ``tiny`` baseline trained on one task alone,
its held-out accuracy (``standard``, greedy) measured every ``--every`` steps, and the steps at
which it first reaches the task's competence target. What chose the organisms' tasks and
budgets (docs/organisms.md, "Model organisms").

    python scripts/organism_pilots.py --tasks perm,addition --steps 600 --out /tmp/pilots \\
        --json docs/results/organism_pilots.json

Each candidate trains in ``--out/<name>`` (chunks of ``--every`` steps, resumed from the
checkpoint each chunk ends at: the same weights as one uninterrupted run) with one torch thread,
``--jobs`` candidates at once.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# name -> (task, settings, competence target); the targets are written before any pilot. The
# first round (``*-seq256``: 16 x 256 tokens a step, lr 1e-3, the cpu zoo's shapes) learned only
# flip-flop; the second uses the fair study's modsum shapes (16 x 64, lr 5e-4), at which a tiny
# baseline learns modsum in 600 steps (docs/results/study_fbt_vs_baseline.json).
MODSUM = ["data.modsum_p=3", "data.modsum_min_len=1", "data.modsum_max_len=6"]
FLIPFLOP = ["data.flipflop_bits=2", "data.flipflop_min_len=8", "data.flipflop_max_len=24", "data.flipflop_weights=0.3,0.5,0.2"]
SEQ256 = ["train.seq_len=256", "train.lr=1e-3"]
SEQ64 = ["train.seq_len=64", "train.lr=5e-4"]


def mix_of_three(weights: str, settings: list[str]) -> tuple[str, list[str], dict]:
    """The flip-flop (two channels, as then), perm over 1-4 and addition in one model."""
    tasks = ["data.perm_points=3", "data.perm_min_len=1", "data.perm_max_len=4", *ADDITION]
    return "mix", [f"data.mix_weights={weights}", *FLIPFLOP, *tasks, "train.seq_len=64", *settings], TARGETS


ADDITION = ["data.add_min_digits=1", "data.add_max_digits=3", "data.add_verbosity_weights=1,4,2"]
TARGETS = {"flipflop": 0.95, "perm": 0.9, "addition": 0.9}
CANDIDATES = {
    "modsum-seq256": ("modsum", MODSUM + SEQ256, 0.9),
    "flipflop-seq256": ("flipflop", FLIPFLOP + SEQ256, 0.95),
    "perm-seq256": ("perm", ["data.perm_points=3", "data.perm_min_len=2", "data.perm_max_len=8"] + SEQ256, 0.9),
    "addition-seq256": (
        "addition",
        ["data.add_min_digits=1", "data.add_max_digits=3", "data.add_verbosity_weights=1,1,1"] + SEQ256,
        0.9,
    ),
    "modsum": ("modsum", MODSUM + SEQ64, 0.9),
    "flipflop": ("flipflop", FLIPFLOP + SEQ64, 0.95),
    # one channel (Liu et al.'s flip-flop): at 2 channels seed 1 stayed at 0.70 for 1,000 steps,
    # answering with the last written bit whatever its channel
    "flipflop1": ("flipflop", ["data.flipflop_bits=1", *FLIPFLOP[1:], *SEQ64], 0.95),
    "perm1-4": ("perm", ["data.perm_points=3", "data.perm_min_len=1", "data.perm_max_len=4"] + SEQ64, 0.9),
    # 1-4 ended at 0.90-0.925 after 1,000 steps, on the target: 1-3 leaves lengths 4-6 to test beyond it
    "perm1-3": ("perm", ["data.perm_points=3", "data.perm_min_len=1", "data.perm_max_len=3"] + SEQ64, 0.9),
    "perm1-6": ("perm", ["data.perm_points=3", "data.perm_min_len=1", "data.perm_max_len=6"] + SEQ64, 0.9),
    "addition-digits": (
        "addition",
        [
            "data.add_min_digits=1",
            "data.add_max_digits=3",
            "data.add_verbosity_weights=0,1",
            "train.seq_len=128",
            "train.lr=5e-4",
        ],
        0.9,
    ),
    "addition-mixed": (
        "addition",
        [
            "data.add_min_digits=1",
            "data.add_max_digits=3",
            "data.add_verbosity_weights=1,1,1",
            "train.seq_len=128",
            "train.lr=5e-4",
        ],
        0.9,
    ),
    # alone at the organisms' shapes (16 x 64 tokens, lr 1e-3): addition with its mixed scratchpads
    "addition-seq64": (
        "addition",
        [
            "data.add_min_digits=1",
            "data.add_max_digits=3",
            "data.add_verbosity_weights=1,4,2",
            "train.seq_len=64",
            "train.lr=1e-3",
        ],
        0.9,
    ),
    # below the organism's learning rate, the baseline missed its target at 2 of 7 seeds (the fair
    # study's seeds 2 and 4 at lr 5e-4): at those seeds, a longer budget and shorter problems
    "addition-seq64-lr5e-4": ("addition", [*ADDITION, "train.seq_len=64", "train.lr=5e-4"], 0.9),
    "addition1-2-seq64-lr5e-4": (
        "addition",
        [
            "data.add_min_digits=1",
            "data.add_max_digits=2",
            "data.add_verbosity_weights=1,4,2",
            "train.seq_len=64",
            "train.lr=5e-4",
        ],
        0.9,
    ),
    "perm1-4-lr1e-3": (
        "perm",
        ["data.perm_points=3", "data.perm_min_len=1", "data.perm_max_len=4", "train.seq_len=64", "train.lr=1e-3"],
        0.9,
    ),
    # the three tasks in one model at 16 x 64 tokens a step: perm, flip-flop and addition drawn
    # alike, addition's scratchpads mostly per digit (none : per digit : per two = 1 : 4 : 2)
    **{f"organisms-lr{lr}": mix_of_three("0,0,1,1,1", [f"train.lr={lr}"]) for lr in ("5e-4", "1e-3")},
    # at 1 : 1 : 1 perm stayed at chance for 1,500 steps (its one-token answers are a small share
    # of the scored tokens beside addition's traces): perm drawn 4 times as often, and the same
    # with each example's targets weighing alike
    **{
        f"organisms-{weigh}": mix_of_three("0,0,1,4,1", ["train.lr=1e-3", f"data.loss_weight={weigh}"])
        for weigh in ("token", "example")
    },
}

COMMON = [
    "train.batch_size=16",
    "train.warmup=30",
    "train.log_every=25",
    "data.n_train=40000",
    "data.loss_on=completion",
    "data.windows=example",
]


def pilot(name: str, steps: int, every: int, out: str, n_eval: int, seed: int = 0) -> dict:
    import torch

    from workbench.data.splits import heldout_task
    from workbench.runtime.tokenizer import load_tokenizer
    from workbench.training.evaluate import evaluate_examples
    from workbench.training.runconfig import make_run_config, task_settings
    from workbench.training.train import train

    torch.set_num_threads(1)
    task, settings, target = CANDIDATES[name]
    overrides = COMMON + settings + [f"train.steps={steps}", f"train.checkpoint_every={every}", f"train.seed={seed}"]
    cfg = make_run_config("baseline", "tiny", task, overrides)
    run = Path(out) / (name if seed == 0 else f"{name}-seed{seed}")
    targets = target if isinstance(target, dict) else {task: target}
    examples = {t: heldout_task(t, n_eval, 0, task_settings(cfg.data)) for t in targets}
    curve, started, reached = [], time.perf_counter(), None
    for step in range(every, steps + 1, every):
        result = train(cfg, run, resume=step > every, progress=False, stop_after=every)
        model = result.model.eval()
        accuracy = {
            t: evaluate_examples(model, ex, load_tokenizer(run), regimes=["standard"])["accuracy"]["standard"]
            for t, ex in examples.items()
        }
        curve.append({"step": step, "accuracy": accuracy, "seconds": round(time.perf_counter() - started, 1)})
        print(name, seed, curve[-1], flush=True)
        if reached is None and all(accuracy[t] >= targets[t] for t in targets):
            reached = step
    return {"task": task, "settings": settings, "seed": seed, "target": target, "curve": curve, "reached_at": reached}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(CANDIDATES), help=f"some of {','.join(CANDIDATES)}")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--n-eval", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1, help="training seeds 0..N-1 of each candidate")
    parser.add_argument("--seed-list", help="these training seeds instead, comma-separated (e.g. 2,4)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--json")
    args = parser.parse_args()
    names = args.tasks.split(",")
    seeds = [int(s) for s in args.seed_list.split(",")] if args.seed_list else list(range(args.seeds))
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {
            n if seed == 0 else f"{n}@seed{seed}": pool.submit(pilot, n, args.steps, args.every, args.out, args.n_eval, seed)
            for seed in seeds
            for n in names
        }
        results = {n: f.result() for n, f in futures.items()}
    for n, r in results.items():
        print(n, "reached", r["target"], "at", r["reached_at"], [(c["step"], c["accuracy"]) for c in r["curve"]])
    if args.json:
        from workbench.storage.provenance import source_commit

        path = Path(args.json)
        previous = json.loads(path.read_text()) if path.is_file() else {"pilots": {}}
        previous["pilots"].update(
            {f"{n}@{args.steps}": {**r, "steps": args.steps, "every": args.every} for n, r in results.items()}
        )
        previous["commit"] = source_commit()
        previous.setdefault("commands", []).append(
            "python scripts/organism_pilots.py "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "json")
        )
        path.write_text(json.dumps(previous, indent=1) + "\n")


if __name__ == "__main__":
    main()
