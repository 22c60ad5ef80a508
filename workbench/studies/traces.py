"""Trace-length studies: how long each model and regime reasons before it answers, and how often
it is right, on the same problems.

One row per (model, regime, problem): ``problem_id``, ``difficulty``, ``trace_tokens`` (generated
tokens before the ``####`` marker; all of them when there is none), ``trace_chars`` (the same text
in characters: the unit to compare runs whose tokenizers differ), ``total_tokens`` (up to and
including <eos>), ``answer``, ``correct`` (the ``####`` rule), ``last_number_correct`` (a lenient diagnostic: the
last number of the text is the answer), ``finished`` (false when the budget ran out before
<eos>), ``silent_tokens`` (generated ids before <eos> that decode to nothing: pad, other specials,
ids past the vocabulary; ``text`` cannot show them), the generated ``text`` and, for FBT, the
per-step carried-state norms. Generation stops with ``NonFinite`` (a ``models.NonFiniteActivation``) naming the step
and the site when an activation overflows.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from numpy.typing import ArrayLike

from models import NonFiniteActivation
from workbench.data.answers import is_correct, last_number, parse_final_answer
from workbench.data.splits import heldout_rng, heldout_task
from workbench.data.tasks import LIMITS, Example, TaskConfig, load_jsonl, make_addition, make_chain
from workbench.runtime.checkpoint import load_model, run_labels
from workbench.runtime.decoding import REGIMES, NonFinite, generate
from workbench.runtime.palette import regime_color
from workbench.runtime.tokenizer import TokenizerBase, tokenizer_of
from workbench.storage.errors import BadInput
from workbench.storage.files import parse_json, read_json, write_json
from workbench.storage.outputs import check_output, output
from workbench.storage.shapes import Each, check_shape
from workbench.training.run import Run, RunTask, run_task

MARKER = "####"
MAX_PROBLEMS = 100_000


TRACE_TASK_FORMS = "chain, addition, gsm8k-jsonl:PATH or prepared:DIR"


def default_difficulties(task: str, settings: TaskConfig | None = None) -> list[int] | None:
    """A synthetic trace task's difficulties in the run's settings (chain's steps 1..max, addition's
    digits min..max); None (any) for a file or corpus."""
    settings = settings or TaskConfig()
    if task == "chain":
        return list(range(1, settings.chain_max_steps + 1))
    if task == "addition":
        return list(range(settings.add_min_digits, settings.add_max_digits + 1))
    return None


def problems(
    task: str,
    n: int,
    difficulties: list[int] | None,
    seed: int = 0,
    settings: TaskConfig | None = None,
    tokenizer: TokenizerBase | None = None,
) -> list[Example]:
    """``n`` problems: ``chain`` (``addition``) problems in the run's ``settings`` spread evenly
    over ``difficulties`` (steps; digits of the longer operand; default ``default_difficulties``),
    or the first ``n`` problems of a GSM8K-format JSONL file (``gsm8k-jsonl:PATH``), or of a
    prepared corpus's held-out GSM8K documents (``prepared:DIR``, decoded with ``tokenizer``),
    whose difficulty (its number of ``<<`` steps) is in ``difficulties`` (default: any). A source
    with fewer such problems is refused, saying how many it has."""
    if not 1 <= n <= MAX_PROBLEMS:
        raise BadInput(f"n_problems={n}: expected 1..{MAX_PROBLEMS:,} (every model and regime generates for each)")
    if task.startswith(("gsm8k-jsonl:", "prepared:")):
        source = task.split(":", 1)[1]
        found = load_jsonl(source) if task.startswith("gsm8k-jsonl:") else heldout_task(task, MAX_PROBLEMS, seed, None, tokenizer)
        examples = [ex for ex in found if ex.answer and (not difficulties or ex.difficulty in difficulties)]
        if len(examples) < n:
            which = f" with difficulty in {difficulties}" if difficulties else ""
            raise BadInput(f"{source} has {len(examples)} problems with a final answer{which}; n_problems={n} asks for more")
        return examples[:n]
    if task not in ("chain", "addition"):
        raise BadInput(f"unknown trace task {task!r}: expected {TRACE_TASK_FORMS}")
    settings = settings or TaskConfig()
    difficulties = default_difficulties(task, settings) if difficulties is None else difficulties
    if not difficulties or min(difficulties) < 1:
        raise BadInput(f"difficulties={difficulties!r}: expected {'step' if task == 'chain' else 'digit'} counts >= 1")
    top = LIMITS["chain_max_steps" if task == "chain" else "add_max_digits"]
    if max(difficulties) > top:
        raise BadInput(f"difficulties={difficulties!r}: expected at most {top} {'steps' if task == 'chain' else 'digits'}")
    rng = heldout_rng("traces" if task == "chain" else f"traces-{task}", seed)
    if task == "chain":
        cfg = dataclasses.replace(settings, chain_max_steps=max(difficulties))
        return [make_chain(rng, cfg, difficulties[i % len(difficulties)]) for i in range(n)]
    return [make_addition(rng, settings, difficulties[i % len(difficulties)]) for i in range(n)]


def _input_kind(task: str) -> str:
    """The run task a trace task's problems are of (``gsm8k-jsonl:PATH`` is a ``jsonl:PATH`` run's)."""
    return "jsonl:" + task.removeprefix("gsm8k-jsonl:") if task.startswith("gsm8k-jsonl:") else task


def trace_length(text: str, tokenizer: TokenizerBase) -> int:
    """Tokens of ``text`` before the answer marker (all of them when there is none)."""
    return len(tokenizer.encode(_before_marker(text)))


def _before_marker(text: str) -> str:
    cut = text.find(MARKER)
    return text if cut < 0 else text[:cut]


# no example answer in it: SmolLM2-135M-Instruct copied an example's number into most answers
CHAT_INSTRUCTION = "Solve it step by step, then write '####' followed by the final answer on the last line."


def chat_problem(example: Example, tokenizer: TokenizerBase) -> str:
    """The prompt of an instruct model: the question (without the ``Q:``/``A:`` frame of the
    completion format) and ``CHAT_INSTRUCTION``, as a user turn of the tokenizer's chat template."""
    question = example.prompt.removeprefix("Q: ").removesuffix("\nA:").strip()
    return tokenizer.chat_prompt(f"{question}\n\n{CHAT_INSTRUCTION}", "the run's tokenizer (chat format)")


def run_traces(
    model,
    examples: list[Example],
    regime: str,
    passes,
    tokenizer: TokenizerBase,
    *,
    max_new_tokens: int,
    batch_size: int = 64,
    engine: str = "eager",
    compact: bool = True,
    chat: bool = False,
    progress: Callable[[int, str], None] | None = None,
) -> list[dict]:
    """Greedy generation under ``regime`` on every problem whose prompt leaves room for the whole
    budget (prompt + ``max_new_tokens`` <= n_ctx): every problem gets the same budget, whatever
    else shares its batch, and the others are skipped (``fitting`` names them). Rows in problem
    order, each with ``lost_characters``: the prompt's characters the tokenizer cannot represent.
    ``engine`` as in ``generate``; ``compact``: problems that finished leave their batch (same
    tokens, less work); ``chat``: prompt an instruct model through its chat template;
    ``progress(problems, what)`` is told of each batch done."""
    texts = [chat_problem(ex, tokenizer) if chat else ex.prompt for ex in examples]
    prompts = [tokenizer.encode(text) for text in texts]
    silent = tokenizer.silent_ids(model.cfg.d_vocab)
    fit = fitting([len(p) for p in prompts], max_new_tokens, model.cfg.n_ctx)
    order = sorted(fit, key=lambda i: len(prompts[i]))  # similar lengths share a batch
    rows: dict[int, dict] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        try:
            out = generate(
                model,
                [prompts[i] for i in idx],
                regime=regime,
                passes=passes,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_id,
                pad_token_id=tokenizer.pad_id,
                engine=engine,
                compact=compact,
            )
        except NonFiniteActivation as err:
            raise NonFinite.wrap(err, f"regime {regime}") from err
        norms = out.states.float().norm(dim=-1)
        quiet = out.silent_counts(silent)
        for j, i in enumerate(idx):
            n = int(out.lengths[j])
            ids = out.new_tokens[j, :n].tolist()
            text = tokenizer.decode(ids)
            answer = parse_final_answer(text)
            rows[i] = {
                "problem_id": i,
                "difficulty": examples[i].difficulty,
                "trace_tokens": trace_length(text, tokenizer),
                "trace_chars": len(_before_marker(text)),
                "total_tokens": n,
                "answer": answer,
                "correct": is_correct(examples[i], text),
                "last_number_correct": last_number(text) == examples[i].answer,  # diagnostic, see last_number
                "finished": bool(out.finished[j]),
                "silent_tokens": quiet[j],
                "lost_characters": sum(tokenizer.lost_characters(texts[i]).values()),
                "text": text,
                "state_norms": [round(x, 4) for x in norms[j, :n].tolist()] if model.carries_state else None,
            }
        if progress is not None:
            progress(len(idx), f"{min(start + batch_size, len(order))}/{len(order)} problems")
    return [rows[i] for i in sorted(rows)]


def fitting(prompt_lengths: list[int], max_new_tokens: int, n_ctx: int) -> list[int]:
    """Indices of the prompts that leave room for ``max_new_tokens`` in the context."""
    return [i for i, n in enumerate(prompt_lengths) if n + max_new_tokens <= n_ctx]


def paired_bootstrap(a: ArrayLike, b: ArrayLike, n_resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Mean of b - a over paired problems with a percentile bootstrap confidence interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired samples must be equal-length 1-d arrays, got {a.shape} and {b.shape}")
    diff = b - a
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(n_resamples, len(diff)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"mean": float(diff.mean()), "ci_low": float(lo), "ci_high": float(hi), "n": int(len(diff)), "level": level}


def summarise(rows: list[dict], reference: tuple[str, str]) -> dict:
    """Per (model, regime, difficulty): trace length mean/median, accuracy, unfinished rate;
    per (model, regime) also ``silent_tokens`` (their count) and ``silent_rate`` (per token
    generated before <eos>); accuracy within shared trace-length quartile bins (matched length);
    paired comparisons of every (model, regime) against ``reference`` on the same problems."""
    keys = sorted({(r["model"], r["regime"]) for r in rows})
    lengths = np.array([r["trace_tokens"] for r in rows])
    edges = np.unique(np.quantile(lengths, [0, 0.25, 0.5, 0.75, 1.0]))
    groups: dict = {}
    for model, regime in keys:
        sel = [r for r in rows if (r["model"], r["regime"]) == (model, regime)]
        per_difficulty = {}
        for d in sorted({r["difficulty"] for r in sel}):
            ds = [r for r in sel if r["difficulty"] == d]
            per_difficulty[str(d)] = {
                "n": len(ds),
                "mean_trace": statistics.fmean(r["trace_tokens"] for r in ds),
                "median_trace": statistics.median(r["trace_tokens"] for r in ds),
                "accuracy": statistics.fmean(r["correct"] for r in ds),
                "unfinished": statistics.fmean(not r["finished"] for r in ds),
            }
        bins = np.clip(np.searchsorted(edges, [r["trace_tokens"] for r in sel], side="right") - 1, 0, max(len(edges) - 2, 0))
        matched = {}
        for b in range(max(len(edges) - 1, 1)):
            inside = [r["correct"] for r, k in zip(sel, bins) if k == b]
            if inside:
                matched[f"[{edges[b]:.0f},{edges[min(b + 1, len(edges) - 1)]:.0f}]"] = {
                    "n": len(inside),
                    "accuracy": statistics.fmean(inside),
                }
        groups[f"{model}/{regime}"] = {
            "n": len(sel),
            "mean_trace": statistics.fmean(r["trace_tokens"] for r in sel),
            "median_trace": statistics.median(r["trace_tokens"] for r in sel),
            "accuracy": statistics.fmean(r["correct"] for r in sel),
            "unfinished": statistics.fmean(not r["finished"] for r in sel),
            "by_difficulty": per_difficulty,
            "accuracy_at_matched_length": matched,
        }
        if all("silent_tokens" in r and "trace_chars" in r for r in sel):  # rows from run_traces
            silent = sum(r["silent_tokens"] for r in sel)
            groups[f"{model}/{regime}"].update(
                silent_tokens=silent,
                silent_rate=silent / max(sum(r["total_tokens"] - r["finished"] for r in sel), 1),
                mean_trace_chars=statistics.fmean(r["trace_chars"] for r in sel),
                answered=statistics.fmean(r["answer"] is not None for r in sel),  # wrote '#### <number>'
                accuracy_last_number=statistics.fmean(r["last_number_correct"] for r in sel),
            )
    ref = {r["problem_id"]: r for r in rows if (r["model"], r["regime"]) == reference}
    paired = {}
    for model, regime in keys:
        if (model, regime) == reference:
            continue
        sel = sorted(
            (r for r in rows if (r["model"], r["regime"]) == (model, regime) and r["problem_id"] in ref),
            key=lambda r: r["problem_id"],
        )
        a = [ref[r["problem_id"]] for r in sel]
        paired[key := f"{model}/{regime} - {reference[0]}/{reference[1]}"] = {
            "trace_tokens": paired_bootstrap([x["trace_tokens"] for x in a], [x["trace_tokens"] for x in sel]),
            "accuracy": paired_bootstrap([float(x["correct"]) for x in a], [float(x["correct"]) for x in sel]),
        }
        if all("trace_chars" in x for x in a + sel):  # the unit that compares runs with different tokenizers
            paired[key]["trace_chars"] = paired_bootstrap([x["trace_chars"] for x in a], [x["trace_chars"] for x in sel])
    return {"reference": "/".join(reference), "groups": groups, "paired": paired}


def trace_study(
    runs: list[str],
    out_dir: str | Path,
    *,
    task: str | None = None,
    regimes: Sequence[str] = ("standard", "soft", "fused"),
    passes: int | str = 2,
    n_problems: int = 200,
    difficulties: Sequence[int] | None = None,
    seed: int = 0,
    max_new_tokens: int = 160,
    batch_size: int = 64,
    overwrite: bool = False,
    engine: str = "eager",
    chat: bool | Sequence[str] = False,
    reference: str | None = None,
    device: str | torch.device = "cpu",
    progress: Callable[[float, str], None] | None = None,
    names: Sequence[str] | None = None,
) -> dict:
    """Every run under every regime on the same problems, into ``out_dir`` (``summary.json``,
    ``traces.csv``, ``traces.png``): a new or empty directory, or a previous trace study there,
    replaced only with ``overwrite``. ``task``: by default the first run's own (held-out problems
    in its settings; ``RunTask.trace_task`` refuses a task answered by one token); a task given
    that is not a run's is studied, and the summary's ``inputs`` says so for each run. ``chat``:
    every run is prompted through its chat template (``True``) or the runs so named (directory
    names; the others in the completion format).
    ``reference`` (``MODEL/REGIME``): what every other (model, regime) is paired against; by
    default the first run's first regime (``standard`` unless the regimes leave it out).
    Problems whose prompt leaves a run no room for ``max_new_tokens`` are skipped for that run and
    listed in the summary (``skipped``); a run that can take none of them is refused before any work.
    ``progress(fraction, what)`` is told of each batch of problems generated. ``names``: what the
    results call each run (default its directory name; the app passes each run's path under its
    runs root, so ``micro/fbt`` and ``quick/fbt`` compare); one per run, all different."""
    out_dir = Path(out_dir)
    names = run_labels(runs, names)
    label = dict(zip(runs, names))
    if isinstance(chat, bool):
        as_chat = set(names) if chat else set()
    else:
        as_chat = set(chat)
        if not as_chat or as_chat - set(names):
            unknown = sorted(as_chat - set(names)) or ["(none)"]
            raise BadInput(f"--chat {','.join(chat)}: {', '.join(unknown)} is not one of the runs' names: {', '.join(names)}")
    check_output(out_dir, "traces", overwrite=overwrite)  # the output first, then the runs
    first = Run.open(runs[0]) if (Path(runs[0]) / "config.json").is_file() else None
    own = first.task if first is not None else RunTask(None, TaskConfig())
    task = own.trace_task() if task is None else task
    settings = own.settings if task in own.kinds else None
    tokenizer = first.tokenizer if first is not None else None
    difficulties = list(difficulties) if difficulties is not None else default_difficulties(task, settings)
    examples = problems(task, n_problems, difficulties, seed, settings, tokenizer)  # n, or an error
    inputs = {label[run]: run_task(run).input_record(_input_kind(task), run=label[run]) for run in runs}
    loaded, skipped = {}, {}  # loaded: each model once, kept for the generation below
    for run in runs:  # before any generation: templates, and room in every run's context
        model, tokenizer = load_model(run, device=device), tokenizer_of(run)  # each run encodes the problems with its own
        texts = [chat_problem(ex, tokenizer) if label[run] in as_chat else ex.prompt for ex in examples]
        lengths = [len(tokenizer.encode(text)) for text in texts]
        n_ctx = model.cfg.n_ctx
        fit = set(fitting(lengths, max_new_tokens, n_ctx))
        if not fit:
            raise BadInput(
                f"no problem fits {run}: its shortest prompt is {min(lengths)} tokens, and with max_new_tokens="
                f"{max_new_tokens} that exceeds its context n_ctx={n_ctx}"
            )
        name = label[run]
        loaded[run] = (model, tokenizer)
        skipped[name] = {
            "n": len(examples) - len(fit),
            "problem_ids": [i for i in range(len(examples)) if i not in fit],
            "rule": f"prompt + max_new_tokens={max_new_tokens} > n_ctx={n_ctx}",
        }
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown or not regimes:
        raise BadInput(f"regimes {','.join(regimes)!r}: expected some of {', '.join(REGIMES)}")
    plan = [(run, regime) for run in runs for regime in (regimes if loaded[run][0].carries_state else ["standard"])]
    pairs = [f"{label[run]}/{regime}" for run, regime in plan]
    reference = reference if reference is not None else pairs[0]
    if reference not in pairs:  # before any generation
        raise BadInput(f"reference {reference!r} is not one of the study's (model/regime) pairs: {', '.join(pairs)}")
    total = sum(len(examples) - skipped[label[run]]["n"] for run, _ in plan)
    generated = 0

    def advance(problems: int, what: str) -> None:
        nonlocal generated
        generated += problems
        if progress is not None:
            progress(generated / total, what)

    with output(out_dir, "traces", overwrite=overwrite) as out:
        rows, timing, lost = [], {}, {}
        for run, regime in plan:
            model, tokenizer = loaded[run]
            name = label[run]
            started = time.perf_counter()
            produced = run_traces(
                model,
                examples,
                regime,
                passes,
                tokenizer,
                max_new_tokens=max_new_tokens,
                batch_size=batch_size,
                engine=engine,
                chat=name in as_chat,
                progress=lambda problems, what, pair=f"{name}/{regime}": advance(problems, f"{pair}: {what}"),
            )
            form = "chat" if name in as_chat else "completion"
            rows += [{"model": name, "regime": regime, "format": form, **row} for row in produced]
            lost[name] = sum(row["lost_characters"] for row in produced)  # the same prompts in every regime
            seconds = time.perf_counter() - started
            done = len(examples) - skipped[name]["n"]
            timing[f"{name}/{regime}"] = {"seconds": round(seconds, 2), "problems_per_s": round(done / seconds, 2)}
        summary = {
            "task": task,
            "inputs": inputs,
            "seed": seed,
            "settings": dataclasses.asdict(settings) if settings is not None else None,
            "passes": passes,
            "n_problems": len(examples),
            "difficulties": "any" if difficulties is None else difficulties,
            "max_new_tokens": max_new_tokens,
            "skipped": skipped,
            "lost_characters": lost,
            "chat": {"instruction": CHAT_INSTRUCTION, "runs": [n for n in names if n in as_chat]} if as_chat else None,
            "timing": timing,
            **summarise(rows, (reference.rpartition("/")[0], reference.rpartition("/")[2])),
        }
        with (out.staging / "traces.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            for r in rows:
                writer.writerow({**r, "state_norms": json.dumps(r["state_norms"])})
        archs = {label[run]: model.arch for run, (model, _) in loaded.items()}
        plotted = plot_traces(rows, summary, out.staging, archs)
        summary["figures"] = [str(out_dir / Path(f).name) for f in plotted]
        write_json(out.staging / "summary.json", summary)
        out.publish()
    return summary


TRACE_INTS = ("problem_id", "difficulty", "trace_tokens", "trace_chars", "total_tokens", "silent_tokens", "lost_characters")
TRACE_BOOLS = ("correct", "last_number_correct", "finished")


def read_traces(path: str | Path) -> list[dict]:
    """The rows of a ``traces.csv`` as ``trace_study`` made them: counts as ints, verdicts as
    bools, the state norms as a list (None for a model without a carried state), no answer as None.
    ``BadInput`` naming the file, the line and the field where a row is not one it writes."""
    try:
        with Path(path).open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (csv.Error, UnicodeDecodeError) as err:
        raise BadInput(f"{path}: not a CSV of traces ({err})") from None
    if not rows:
        raise BadInput(f"{path}: holds no traces (a study writes a header and one row per problem, model and regime)")
    for line, row in enumerate(rows, start=2):
        for k in ("model", "regime", "format", *TRACE_INTS, *TRACE_BOOLS, "state_norms", "answer"):
            if not isinstance(row.get(k), str):
                raise BadInput(f"{path}: line {line} has no field {k!r}")
        try:
            row.update({k: int(row[k]) for k in TRACE_INTS})
            row["state_norms"] = parse_json(row["state_norms"], "state_norms")
        except ValueError as err:
            raise BadInput(f"{path}: line {line}: {err}") from None
        if any(row[k] not in ("True", "False") for k in TRACE_BOOLS):
            raise BadInput(f"{path}: line {line}: fields {', '.join(TRACE_BOOLS)} must be True or False")
        row.update({k: row[k] == "True" for k in TRACE_BOOLS})
        if row["state_norms"] is not None and not (
            isinstance(row["state_norms"], list) and all(isinstance(v, (int, float)) for v in row["state_norms"])
        ):
            raise BadInput(f"{path}: line {line}: field 'state_norms' must be null or a list of numbers")
        row["answer"] = row["answer"] or None  # no answer parsed (the CSV cell is empty)
    return rows


_STAT = {"mean": float, "ci_low": float, "ci_high": float}
# What readers of a saved study use of its summary (``trace_study``): checked by ``read_study``.
SUMMARY = {
    "task": str,
    "n_problems": int,
    "difficulties": ([int], str),
    "reference": str,
    "seed?": int,
    "settings?": (None, dict),
    "inputs?": Each({"run_task": (str, None), "input_task": (str, None), "warning?": str}),
    "chat": (None, {"runs": [str]}),
    "paired": Each({"trace_tokens": _STAT, "trace_chars": _STAT, "accuracy": _STAT}),
}


def read_study(out_dir: str | Path, models: list[str]) -> tuple[dict, list[dict]]:
    """The saved study in ``out_dir`` of the runs named ``models`` (their directory names): its
    summary and its rows (``read_traces``). ``BadInput`` naming the file and the field where the
    files are not what ``trace_study`` writes, or are of other runs or problems."""
    path, table = Path(out_dir) / "summary.json", Path(out_dir) / "traces.csv"
    summary = read_json(path)
    check_shape(summary, SUMMARY, path)
    rows = read_traces(table)
    for line, row in enumerate(rows, start=2):
        if row["model"] not in models or row["regime"] not in REGIMES or not 0 <= row["problem_id"] < summary["n_problems"]:
            raise BadInput(
                f"{table}: line {line}: model {row['model']!r}, regime {row['regime']!r}, problem {row['problem_id']} is not "
                f"one of this study's (models {models}, regimes {list(REGIMES)}, problems 0..{summary['n_problems'] - 1})"
            )
    return summary, rows


def study_problems(summary: dict, tokenizer: TokenizerBase | None = None) -> list[Example]:
    """The problems a saved study (``read_study``'s summary) generated on, in its order
    (``tokenizer``: the first run's, for a prepared corpus's documents)."""
    try:
        settings = TaskConfig(**summary["settings"]) if summary.get("settings") else None
    except TypeError as err:
        raise BadInput(f"the study's settings are not a task's ({err})") from None
    difficulties = None if summary["difficulties"] == "any" else summary["difficulties"]
    return problems(summary["task"], summary["n_problems"], difficulties, summary.get("seed", 0), settings, tokenizer)


def plot_traces(rows: list[dict], summary: dict, out_dir: Path, archs: dict[str, str] | None = None) -> list[str]:
    path = out_dir / "traces.png"
    traces_figure(rows, summary, archs).savefig(path, dpi=110)
    return [str(path)]


LINESTYLES, MARKERS = ("-", "--", ":", "-."), "osD^v"  # one per model: the colour is the regime's


def traces_figure(rows: list[dict], summary: dict, archs: dict[str, str] | None = None):
    """Trace lengths, accuracy against mean trace length, and trace length minus the reference's by
    difficulty: each (model, regime) in its regime's colour (``palette``; ``archs``, model name ->
    architecture, gives a baseline model the baseline's) and its model's line style and marker."""
    from matplotlib.figure import Figure  # no pyplot: the global backend (e.g. a notebook's inline one) stays as it is
    from matplotlib.ticker import MaxNLocator

    archs = archs or {}
    keys = sorted({(r["model"], r["regime"]) for r in rows})
    models = list(dict.fromkeys(model for model, _ in keys))
    style = {
        (model, regime): {
            "color": regime_color(regime, archs.get(model)),
            "ls": LINESTYLES[models.index(model) % len(LINESTYLES)],
            "marker": MARKERS[models.index(model) % len(MARKERS)],
        }
        for model, regime in keys
    }
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    top = max(r["trace_tokens"] for r in rows)
    for key in keys:
        model, regime = key
        sel = [r for r in rows if (r["model"], r["regime"]) == key]
        axes[0].hist(
            [r["trace_tokens"] for r in sel],
            bins=30,
            range=(0, top),
            histtype="step",
            color=style[key]["color"],
            ls=style[key]["ls"],
            label=f"{model}/{regime}",
        )
        by_d = summary["groups"][f"{model}/{regime}"]["by_difficulty"]
        axes[1].plot(
            [v["mean_trace"] for v in by_d.values()],
            [v["accuracy"] for v in by_d.values()],
            label=f"{model}/{regime}",
            clip_on=False,  # a point at accuracy 0 or 1 sits on the axis, whole
            **style[key],
        )
    ref_model, _, ref_regime = summary["reference"].rpartition("/")
    for key in keys:
        if key == (ref_model, ref_regime):  # its difference to itself is zero by construction
            continue
        diffs = []
        for d in sorted({r["difficulty"] for r in rows}):
            a = {
                r["problem_id"]: r["trace_tokens"]
                for r in rows
                if (r["model"], r["regime"], r["difficulty"]) == (ref_model, ref_regime, d)
            }
            b = [
                r["trace_tokens"] - a[r["problem_id"]]
                for r in rows
                if (r["model"], r["regime"], r["difficulty"]) == (*key, d) and r["problem_id"] in a  # paired problems only
            ]
            diffs.append((d, statistics.fmean(b) if b else float("nan")))
        axes[2].plot([d for d, _ in diffs], [v for _, v in diffs], label="/".join(key), **style[key])
    axes[0].set(title="trace length (tokens before ####)", xlabel="trace length (tokens)", ylabel="problems")
    axes[1].set(
        title="accuracy vs mean trace length (one point per difficulty)",
        xlabel="mean trace length (tokens)",
        ylabel="accuracy",
        ylim=(0, 1),
    )
    axes[2].set(
        title=f"trace length minus {summary['reference']}, by difficulty",
        xlabel="difficulty (steps)",
        ylabel="difference in trace length (tokens)",
    )
    axes[2].axhline(0, color="grey", ls="--")
    # counts of tokens, problems and steps: whole numbers on their axes
    for axis in (axes[0].xaxis, axes[0].yaxis, axes[2].xaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
