"""The reference model sets: ``baseline``, ``fbt``, ``hd2`` and ``hd4`` (continued from
``baseline``), on one task (or the ``mix``) with the same data order, so FBT and the baseline see
equal data. FBT without 3-pass batches is the ``three-pass`` study's (``workbench.experiments.studies.three_pass``).

``micro`` finishes in well under 2 minutes on 2 CPU cores (tests, CI); the model organisms
(``org-flipflop``, ``org-perm``, ``org-addition``; ``train_organisms`` trains all three) are the
reference zoo, each learned by its baseline in minutes; ``quick`` is ``org-flipflop``, the
fastest; ``cpu`` is the earlier reference zoo on the chain/modsum/flip-flop mix (docs/organisms.md:
measured, with what its members learn).

With ``seeds`` = n every member is trained at training seeds 0..n-1 (``train.seed``: the
initialisation and the batch order; the task data stay the same), seed k > 0 in ``NAME-seedK``;
``zoo.json`` then also gives each member's evaluation across seeds as a mean with a 95% interval.
Training runs with a fixed number of torch threads per member (``threads``, recorded): on one
machine a member is then bitwise the same every time it is trained, alone or next to others
(``jobs`` members train at once, each in its own process); a different thread count changes the
order of floating-point sums, so it gives a different, equally valid, model. Two one-thread members
at once train more tokens per second than one two-thread member on 2 cores, hence ``jobs`` 2 and
``threads`` 1 in every preset but ``micro`` (docs/training.md has the measurement).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

import torch

from workbench.runtime.progress import PROGRESS_ENV, Bar
from workbench.storage.errors import BadInput, OutputExists
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import listed, output
from workbench.storage.provenance import source_commit
from workbench.training.evaluate import evaluate_run
from workbench.training.intervals import ACCURACY, seed_interval
from workbench.training.metrics import logged_seconds
from workbench.training.runconfig import RunConfig, config_differences, load_run_config, make_run_config, run_config_from_dict
from workbench.training.train import EXPANSIONS_FILE, check_new_run_dir, train

ZOO = "zoo"  # the kind of output a zoo (or study) directory is: its summary file is the zoo's own

MAX_SEEDS = 10

# Competence: held-out accuracy (``standard`` regime) each member must reach on each task before
# a study's reading rests on it. The ``micro`` zoo trains for seconds and is a plumbing check: it
# has no targets and its results say nothing about the effects studied. ``cpu`` states what the
# studies need: correct chain traces to compare lengths, a running sum the model computes for the
# probes to find, and a memory it keeps.
# ``quick`` and the organisms: the targets written in scripts/organism_pilots.py before any pilot
# of those tasks ran, reached by a baseline pilot of each alone.
TARGETS = {
    "micro": None,
    "cpu": {"chain": 0.5, "modsum": 0.8, "flipflop": 0.95},
    "org-flipflop": {"flipflop": 0.95},
    "org-perm": {"perm": 0.9},
    "org-addition": {"addition": 0.9},
}
TARGETS["quick"] = TARGETS["org-flipflop"]  # the same zoo

# The tasks the ``micro`` and earlier ``cpu`` zoos train on (the ``mix`` of chain, modsum and
# flip-flop), chosen so the effects the studies look for could appear (docs/organisms.md, "The
# earlier zoo's tasks", has the pilots behind each
# choice): chain answers that write one or two steps per line, so a model can reach ``####`` in
# fewer tokens; a running sum mod 3 over 1-6 digits; flip-flop. Only completions are scored and
# windows start at examples (without both a tiny model does not learn modsum at all), and the mix
# draws chain : modsum : flip-flop as 1 : 6 : 3, so the short answers are not drowned by chain's
# long ones.
TASK = [
    "data.chain_merge_weights=1,1",
    "data.modsum_p=3",
    "data.modsum_min_len=1",
    "data.modsum_max_len=6",
    "data.loss_on=completion",
    "data.windows=example",
    "data.mix_weights=1,6,3",
]

# The model organisms (docs/organisms.md, "Model organisms", has the pilots), each a
# zoo of its own (in one model the three interfere: at 1 : 1 : 1 perm stayed at chance for 1,500
# steps beside addition's traces, and weighing examples alike starved addition instead):
# - ``org-flipflop``: a one-bit flip-flop (Liu et al.'s) at ignore density 0.5 (write : ignore :
#   read = 0.3 : 0.5 : 0.2, 8-24 instructions); a tiny baseline reached 1.0 by step 250 at each of
#   4 pilot seeds, the fastest organism, so it is also the ``quick`` zoo (two channels: one pilot
#   seed stayed at 0.70, the last written bit whatever its channel, for 1,000 steps). Memory
#   carried in the state.
# - ``org-perm``: a running product over S3 of 1-3 permutations (0.97-0.995 at step 600 of 800 at
#   2 pilot seeds; of 1-4, 0.90-0.925 after 1,000 steps at 3, on the target), so lengths 4-6 test
#   composition beyond training. State tracking, serial composition.
# - ``org-addition``: 1-3 digit addition, digits reversed, scratchpads mostly per digit (none : per
#   digit : per two digits = 1 : 4 : 2; 0.94-0.995 after 1,000 steps at lr 1e-3 at 2 pilot seeds, a
#   third at 0.835 at step 750, so the zoo trains 1,200): the task on which a shorter trace can be
#   chosen and the regimes can differ after the first generated token.
# All at 16 x 64 tokens a step with completions scored and windows at examples: short windows and
# a lower learning rate made them learnable in minutes (at 16 x 256 tokens and lr 1e-3 only the
# flip-flop was learned in 600 steps).
FLIPFLOP = [
    "data.flipflop_bits=1",
    "data.flipflop_min_len=8",
    "data.flipflop_max_len=24",
    "data.flipflop_weights=0.3,0.5,0.2",
]
PERM = ["data.perm_points=3", "data.perm_min_len=1", "data.perm_max_len=3"]
ADDITION = ["data.add_min_digits=1", "data.add_max_digits=3", "data.add_verbosity_weights=1,4,2"]
SHORT = [  # the organisms' shapes: 16 x 64 tokens a step, completions scored, windows at examples
    "train.batch_size=16",
    "train.seq_len=64",
    "train.warmup=30",
    "train.log_every=25",
    "train.eval_examples=200",
    "data.n_train=40000",
    "data.loss_on=completion",
    "data.windows=example",
]
# per organism: steps, HD's steps, learning rate (the pilots')
ORGANISM_BUDGETS = {"flipflop": (500, 100, "5e-4"), "perm": (800, 100, "5e-4"), "addition": (1200, 100, "1e-3")}
ORGANISMS = {task: f"org-{task}" for task in ORGANISM_BUDGETS}  # ``workbench zoo --preset organisms``


def organism(task: str, settings: list[str]) -> dict:
    steps, hd_steps, lr = ORGANISM_BUDGETS[task]
    return {
        "jobs": 2,
        "threads": 1,
        "preset": "tiny",
        "task": task,
        "steps": steps,
        "hd_steps": hd_steps,
        "common": [*SHORT, f"train.lr={lr}", f"train.checkpoint_every={steps}", *settings],
    }


# ``jobs`` members train at once with ``threads`` torch threads each: the defaults fill the
# reference machine's 2 cores (the micro zoo's models are too small to gain from processes)
SCALES = {
    "micro": {
        "jobs": 1,
        "threads": 2,
        "preset": "debug",
        "steps": 60,
        "hd_steps": 20,
        "common": [
            "model.n_ctx=256",
            "train.batch_size=8",
            "train.seq_len=64",
            "train.lr=3e-3",
            "train.warmup=5",
            "train.log_every=10",
            "train.checkpoint_every=1000",
            "train.eval_examples=12",
            "data.n_train=600",
            *TASK,
        ],
    },
    "quick": organism("flipflop", FLIPFLOP),  # the first run: the same as org-flipflop
    "org-flipflop": organism("flipflop", FLIPFLOP),
    "org-perm": organism("perm", PERM),
    "org-addition": organism("addition", ADDITION),
    "cpu": {
        "jobs": 2,
        "threads": 1,
        "preset": "tiny",
        "steps": 900,
        "hd_steps": 200,
        "common": [
            "train.batch_size=16",  # x 256 positions: the 4,096 tokens a step of earlier zoos
            "train.seq_len=256",  # holds a whole chain example (up to ~180 characters)
            "train.lr=2e-3",
            "train.warmup=50",
            "train.log_every=25",
            "train.checkpoint_every=300",
            "train.eval_examples=96",
            "data.n_train=40000",
            *TASK,
        ],
    },
}


def seed_name(name: str, seed: int) -> str:
    """The directory of member ``name`` at training seed ``seed`` (seed 0 keeps the plain name)."""
    return name if seed == 0 else f"{name}-seed{seed}"


def members(scale: str, out: Path, seed: int = 0) -> list[tuple[str, str, list[str], str | None]]:
    if scale not in SCALES:
        raise BadInput(f"unknown zoo preset {scale!r}: expected one of {sorted(SCALES)}")
    s = SCALES[scale]
    steps, hd_steps = [f"train.steps={s['steps']}"], [f"train.steps={s['hd_steps']}"]
    seeded = [f"train.seed={seed}"] if seed else []
    base = str(out / seed_name("baseline", seed))
    return [
        (seed_name(name, seed), arch, seeded + overrides, init)
        for name, arch, overrides, init in [
            ("baseline", "baseline", steps, None),
            ("fbt", "fbt", steps, None),
            ("hd2", "hd", hd_steps + ["hd.streams=2", "hd.expand_at=0"], base),
            ("hd4", "hd", hd_steps + ["hd.streams=2,4", f"hd.expand_at=0,{s['hd_steps'] // 2}"], base),
        ]
    ]


def member_names(scale: str = "micro") -> list[str]:
    return [name for name, *_ in members(scale, Path("."))]


def train_zoo(
    scale: str = "micro",
    out: str | Path = "runs",
    *,
    progress: bool | Callable = True,
    only: list[str] | None = None,
    seeds: int = 1,
    threads: int | None = None,
    jobs: int | None = None,
) -> dict:
    """Train (or resume) and evaluate the zoo at training seeds 0..``seeds``-1, ``jobs`` members at
    once with ``threads`` torch threads each (default: the scale's); returns and writes
    ``zoo.json`` under ``out``. ``only`` names members (plain names: every seed of them is
    trained). ``progress``: True for progress bars, or ``progress(name, step, total, record)``
    (after every step with one job; once per finished member, at its last step, with several).
    The zoo directory is held while it trains; a member directory that holds anything but that
    member's own run (same config) is left alone and stops the zoo before any training."""
    unknown = sorted(set(only or []) - set(member_names(scale)))
    if unknown:
        raise BadInput(f"unknown zoo member(s) {unknown}: expected some of {member_names(scale)}")
    if not 1 <= seeds <= MAX_SEEDS:
        raise BadInput(f"seeds={seeds}: expected 1..{MAX_SEEDS} training seeds")
    threads, jobs = execution(scale, threads, jobs)
    out = Path(out)
    plan = []
    for seed in range(seeds):
        for (name, arch, overrides, init), plain in zip(members(scale, out, seed), member_names(scale)):
            if not only or plain in only:
                plan.append((name, plain, seed, member_config(scale, arch, overrides, init)))
    summary = new_summary(scale, seeds, threads, jobs)
    return train_plan(plan, out, out / "zoo.json", summary, scale=scale, threads=threads, jobs=jobs, progress=progress)


ORGANISMS_FILE = "organisms.json"


def train_organisms(
    out: str | Path = "runs/organisms",
    *,
    seeds: int = 1,
    threads: int | None = None,
    jobs: int | None = None,
    progress: bool | Callable = True,
) -> dict:
    """Every organism's zoo (``ORGANISMS``), one after another, into ``out/TASK`` (each with its
    ``zoo.json``), and ``out/organisms.json``: per organism its preset, targets, qualified seeds
    per member and time, with the commit, the seeds and the whole command's wall-clock (the
    number the reference zoo's budget is read from)."""
    out = Path(out)
    path = out / ORGANISMS_FILE
    if path.exists() and ORGANISMS_FILE not in (listed(out, ZOO) or ()):
        raise OutputExists(f"{path} was not written by workbench zoo --preset organisms: move it away or choose another --out")
    started = time.perf_counter()
    summary: dict = {"seeds": seeds, "commit": source_commit(), "torch": torch.__version__, "organisms": {}}
    for task, scale in ORGANISMS.items():
        zoo = train_zoo(scale, out / task, progress=progress, seeds=seeds, threads=threads, jobs=jobs)
        summary["organisms"][task] = {
            "preset": scale,
            "zoo": f"{task}/zoo.json",
            "targets": TARGETS[scale],
            "qualified_seeds": {m: f"{r['qualified_seeds']}/{len(r['runs'])}" for m, r in zoo.get("across_seeds", {}).items()},
            "session_wall_seconds": zoo["session_wall_seconds"],
        }
        summary["session_wall_seconds"] = round(time.perf_counter() - started, 1)
        with output(out, ZOO) as held:
            write_json(path, summary)
            held.wrote(path)
    return summary


def new_summary(scale: str, seeds: int, threads: int, jobs: int, **fields) -> dict:
    """The head of a zoo's (or, with ``study=``, a study's) summary, before any member is recorded."""
    return {**fields, "scale": scale, "seeds": seeds, "threads": threads, "jobs": jobs, "torch": torch.__version__, "models": {}}


def execution(scale: str, threads: int | None, jobs: int | None) -> tuple[int, int]:
    """``(threads, jobs)``: the given ones, checked, or the ``scale``'s defaults."""
    if scale not in SCALES:
        raise BadInput(f"unknown zoo preset {scale!r}: expected one of {sorted(SCALES)}")
    threads = SCALES[scale]["threads"] if threads is None else threads
    jobs = SCALES[scale]["jobs"] if jobs is None else jobs
    for name, value in (("threads", threads), ("jobs", jobs)):
        if not isinstance(value, int) or value < 1:
            raise BadInput(f"{name}={value}: expected an integer >= 1")
    return threads, jobs


def member_config(scale: str, arch: str, overrides: list[str], init: str | None):
    """The run config of a member of a ``scale`` zoo (or study): the scale's preset, task (``mix``
    unless it names one) and common settings, then the member's own overrides."""
    s = SCALES[scale]
    return make_run_config(arch, s["preset"], s.get("task", "mix"), s["common"] + overrides, init_from=init)


def train_member(
    cfg: RunConfig | dict, run: str | Path, threads: int, progress: bool | Callable = False, job_progress: bool = True
) -> dict:
    """Train (or resume) ``cfg`` into ``run`` with ``threads`` torch threads and evaluate it:
    ``seconds`` of training, ``resumed_from`` and the ``evaluation``. A worker process of a
    parallel zoo calls it with the config as its dict and without ``job_progress`` (its steps do
    not go to an app job's progress file)."""
    if not job_progress:
        os.environ.pop(PROGRESS_ENV, None)  # this process's own environment: a worker's
    cfg = run_config_from_dict(cfg) if isinstance(cfg, dict) else cfg
    run = Path(run)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        started = time.perf_counter()
        result = train(cfg, run, resume=(run / "train_state" / "state.json").is_file(), progress=progress)
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "resumed_from": result.summary["resumed_from"], "evaluation": evaluate_run(run)}
    finally:
        torch.set_num_threads(before)


def train_plan(
    plan: list,
    out: Path,
    summary_path: Path,
    summary: dict,
    *,
    scale: str,
    threads: int,
    jobs: int = 1,
    progress: bool | Callable,
    targets: dict | None = None,
) -> dict:
    """Train (or resume) and evaluate every ``(name, member, seed, config)`` of ``plan`` into
    ``out/name``, ``jobs`` at a time (each in its own process when ``jobs`` > 1; a member
    continued from another starts once that one is done) with ``threads`` torch threads each,
    holding ``out``; after each, write ``summary`` (its ``models``, ``across_seeds`` and
    ``session_wall_seconds`` filled in) to ``summary_path``, keeping the entries of members a
    previous partial run there recorded. Competence is judged against the zoo scale's ``TARGETS``,
    or against ``targets`` for a study's scale of its own."""
    targets = TARGETS[scale] if scale in TARGETS else targets
    for name, _, _, cfg in plan:  # before anything is written
        check_member(out / name, cfg)
    previous = previous_summary(summary_path)
    with output(out, ZOO) as held:
        previous = previous_summary(summary_path)  # again, now that it is held
        if (
            previous is not None and previous.get("scale") == scale
        ):  # a partial re-run (``only``) keeps the other members' entries
            summary["models"].update(previous["models"])
            # the seeds its members were trained at: a run stopped early at more seeds trained fewer
            trained = (int(row.get("seed", 0)) + 1 for row in previous["models"].values())
            summary["seeds"] = max([summary["seeds"], *trained])
        summary["commit"] = source_commit()
        started = time.perf_counter()

        def record(name: str, plain: str, seed: int, cfg: RunConfig, done: dict) -> None:
            run = out / name
            evaluation = done["evaluation"]
            summary["models"][name] = {
                "member": plain,
                "seed": seed,
                # the run's own training time over every session that trained it (a resumed or
                # copied member keeps its earlier sessions'); this process's time in ``train``
                "train_seconds": round(logged_seconds(run / "metrics.jsonl", cfg.train.batch_size * cfg.train.seq_len), 1),
                "session_seconds": round(done["seconds"], 1),
                "eval_seconds": evaluation["seconds"],
                "resumed_from": done["resumed_from"],
                "tokens": cfg.train.steps * cfg.train.batch_size * cfg.train.seq_len,
                "tasks": evaluation["tasks"],
                "competence": competence(evaluation["tasks"], targets),
                # HD: the training loss just before and after each expansion in training
                "expansions": read_json(run / EXPANSIONS_FILE)["expansions"] if (run / EXPANSIONS_FILE).is_file() else [],
            }
            summary["across_seeds"] = across_seeds(summary["models"])
            # this process's wall-clock so far (a zoo's budget is measured by it; a resumed or
            # partial zoo records its own session only)
            summary["session_wall_seconds"] = round(time.perf_counter() - started, 1)
            write_json(summary_path, summary)  # after every member: a stopped zoo keeps what it finished
            held.wrote(summary_path)

        if jobs == 1:
            for name, plain, seed, cfg in plan:
                check_member(out / name, cfg)
                report = (
                    (lambda step, total, rec, name=name: progress(name, step, total, rec)) if callable(progress) else progress
                )
                record(name, plain, seed, cfg, train_member(cfg, out / name, threads, report))
        else:
            train_in_parallel(plan, out, threads, jobs, progress, record)
    return summary


def previous_summary(path: Path) -> dict | None:
    """The summary a previous run of this zoo (or study) wrote at ``path``, or None if there is none;
    refused when the directory's manifest does not list it (a user's file of that name is not
    replaced) or when it does not have the shape a zoo writes (``seeds`` a count, ``models`` an
    object of members)."""
    if not (path.exists() or path.is_symlink()):
        return None
    if path.name not in (listed(path.parent, ZOO) or ()):
        raise OutputExists(
            f"{path} was not written by a workbench zoo or study (its directory's manifest does not list it): "
            "move it away or choose another --out"
        )
    summary = read_json(path)
    seeds, models = summary.get("seeds", 1), summary.get("models")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise BadInput(f"{path}: seeds={seeds!r}, expected an integer >= 1")
    if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
        bad = models if not isinstance(models, dict) else {k: v for k, v in models.items() if not isinstance(v, dict)}
        raise BadInput(f"{path}: models={json.dumps(bad)[:80]}, expected an object of members, each an object")
    return {**summary, "seeds": seeds}


def train_in_parallel(plan: list, out: Path, threads: int, jobs: int, progress: bool | Callable, record: Callable) -> None:
    """``plan``'s members in ``jobs`` worker processes (spawned: a fresh interpreter, no state
    shared with this one), a member continued from another (``init_from``) once that one is done,
    members others continue from first and then the longest; ``record`` each as it finishes. A
    worker's error stops the zoo after the members in flight are done."""
    paths = {str(out / name): name for name, *_ in plan}
    needs = {name: paths.get(str(cfg.init_from)) for name, _, _, cfg in plan}
    sources = set(needs.values())
    # members others continue from first, then the longest first (a long member started last
    # would train alone at the end); stable: plan order otherwise
    waiting = sorted(plan, key=lambda p: (p[0] not in sources, -p[3].train.steps))
    done: set[str] = set()
    last = ""
    # the bar counts training steps over every member (from the running members' metrics logs,
    # read every POLL seconds), so a zoo of four long members does not sit at 0/4 for minutes
    bar = Bar(f"zoo ({jobs} at a time)", sum(p[3].train.steps for p in plan), unit="step", show=progress is True)
    steps_done = 0
    running: dict[Future, tuple] = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        while waiting or running:
            for item in [p for p in waiting if needs[p[0]] is None or needs[p[0]] in done][: jobs - len(running)]:
                waiting.remove(item)
                name, _, _, cfg = item
                check_member(out / name, cfg)
                # a worker keeps out of an app job's progress file: the zoo's bar says what runs
                running[pool.submit(train_member, cfg.to_dict(), str(out / name), threads, False, False)] = item
            finished, _ = wait(running, timeout=POLL, return_when=FIRST_COMPLETED)
            for future in finished:
                name, plain, seed, cfg = running.pop(future)
                result = future.result()  # a worker's error surfaces here
                record(name, plain, seed, cfg, result)
                done.add(name)
                steps_done += cfg.train.steps
                last = f"{name} took {result['seconds']:.0f} s"
                if callable(progress):
                    progress(name, cfg.train.steps, cfg.train.steps, None)
            training = sum(min(logged_step(out / item[0]), item[3].train.steps) for item in running.values())
            what = zoo_status([item[0] for item in running.values()], len(done), len(plan), last)
            bar.update(steps_done + training, what, milestone=len(done))
    bar.update(steps_done, zoo_status([], len(done), len(plan), last), milestone=len(done))
    bar.close()


def zoo_status(training: list[str], done: int, members: int, last: str) -> str:
    """What a zoo's progress says: the members training now, how many are done, the last one's time."""
    parts = [f"training {', '.join(training)}" if training else "", f"{done} of {members} done" if done else "", last]
    return "; ".join(filter(None, parts))


POLL = 2.0  # seconds between looks at the running members' metrics logs (the zoo's progress)


def logged_step(run: Path) -> int:
    """The last step a run's ``metrics.jsonl`` has logged (0 before the first, or when the line
    being written is not whole yet): what a zoo's progress counts."""
    try:
        with (run / "metrics.jsonl").open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # a line cut by the 4 KiB window, or being written
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            return record["step"]
    return 0


def competence(tasks: dict, targets: dict | None) -> dict:
    """Whether a member reached ``targets`` (task -> held-out accuracy in the ``standard`` regime):
    per task the target, the accuracy and ``reached``, and ``qualified`` = every task reached.
    Without targets (the ``micro`` zoo) the member is a plumbing check and never qualifies."""
    if targets is None:
        return {"plumbing_check": True, "qualified": False, "tasks": {}}
    rows = {}
    for task, target in targets.items():
        accuracy = tasks.get(task, {}).get("accuracy", {}).get("standard")
        rows[task] = {"target": target, "accuracy": accuracy, "reached": accuracy is not None and accuracy >= target}
    return {"plumbing_check": False, "qualified": all(r["reached"] for r in rows.values()), "tasks": rows}


def across_seeds(models: dict) -> dict:
    """Per member trained at two or more seeds: its seeds' run names and, for every evaluated
    quantity (task -> loss / answer_loss / accuracy -> regime), the mean with a 95% interval."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for name, row in models.items():
        groups.setdefault(row.get("member", name), []).append((int(row.get("seed", 0)), name))
    result = {}
    for member, runs in sorted(groups.items()):
        if len(runs) < 2:
            continue
        names = [name for _, name in sorted(runs)]
        tasks = {}
        for task in models[names[0]]["tasks"]:
            measures = {}
            for measure in ("loss", "answer_loss", "accuracy"):
                regimes = models[names[0]]["tasks"][task].get(measure, {})
                measures[measure] = {
                    regime: seed_interval(
                        [models[n]["tasks"][task][measure][regime] for n in names],
                        bounds=ACCURACY if measure == "accuracy" else None,
                    )
                    for regime in regimes
                    if all(regime in models[n]["tasks"].get(task, {}).get(measure, {}) for n in names)
                }
            tasks[task] = measures
        qualified = sum(bool(models[n].get("competence", {}).get("qualified")) for n in names)
        result[member] = {
            "runs": names,
            "seeds": [seed for seed, _ in sorted(runs)],
            "qualified_seeds": qualified,
            "tasks": tasks,
        }
    return result


def check_member(run: Path, cfg) -> None:
    """A zoo member's directory is new, or holds that member's run (resumed), or what a run killed
    before its first checkpoint left; a run of another config is never resumed as the member."""
    if (run / "train_state" / "state.json").is_file():
        differ = config_differences(load_run_config(run / "config.json").to_dict(), cfg.to_dict())
        if differ:
            raise OutputExists(
                f"{run} holds a run that is not this zoo's {run.name} (it differs in {', '.join(differ[:4])}): "
                "move it away or train the zoo into another --out"
            )
    else:
        check_new_run_dir(run)


def ensure_zoo(scale: str = "micro", out: str | Path = "runs/micro", *, progress: bool | Callable = False) -> Path:
    """The zoo's directory, trained first if any member is missing or unfinished (what notebooks
    call so that they run on a fresh clone)."""
    out = Path(out)
    missing = [n for n in member_names(scale) if not (out / n / "results" / "eval.json").is_file()]
    if missing:
        train_zoo(scale, out, progress=progress, only=missing)
    return out


def seed_rows(summary: dict) -> list[dict]:
    """``zoo.json`` (or a study's ``study.json``) as table rows, one per member, task and regime:
    the accuracy's mean with its 95% interval across seeds (one seed: no interval, ``low`` and
    ``high`` None), the answer loss's mean, the seeds, and how many seeds reached the task's
    competence target in this row's regime (a member qualifies on its ``standard`` row)."""
    groups: dict[str, list[str]] = {}
    for name, row in summary.get("models", {}).items():
        groups.setdefault(row.get("member", name), []).append(name)
    rows = []
    for member, names in sorted(groups.items()):
        names = sorted(names, key=lambda n: int(summary["models"][n].get("seed", 0)))
        runs = [summary["models"][n] for n in names]
        plumbing = any(r.get("competence", {}).get("plumbing_check") for r in runs)
        for task, first in runs[0]["tasks"].items():
            target = runs[0].get("competence", {}).get("tasks", {}).get(task, {}).get("target")
            for regime in first.get("accuracy", {}):
                values = [r["tasks"][task]["accuracy"][regime] for r in runs]
                accuracy = seed_interval(values, bounds=ACCURACY)
                loss = seed_interval([r["tasks"][task]["answer_loss"][regime] for r in runs])
                spread = len(runs) > 1
                at_target = "no target" if target is None else f"{sum(v >= target for v in values)}/{len(runs)}"
                rows.append(
                    {
                        "member": member,
                        "task": task,
                        "regime": regime,
                        "accuracy": accuracy["mean"],
                        "low": accuracy["low"] if spread else None,
                        "high": accuracy["high"] if spread else None,
                        "answer loss": loss["mean"],
                        "seeds": len(runs),
                        "qualified seeds": "plumbing check" if plumbing else at_target,
                    }
                )
    return rows
