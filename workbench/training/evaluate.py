"""Validation loss and exact-match accuracy per task, for FBT per decoding regime.

Per task (held-out examples: the held-out stream of the run's seed, independent of every training
stream; for a prepared corpus, ``prepared:DIR``, its held-out documents):
- ``loss``: mean next-token loss over whole examples; ``standard`` (plain) for every model, and
  ``recurrent`` for FBT (feedback at every position: the exact sequential recurrence).
- ``answer_loss[regime]``: mean loss of the completion tokens after the prompt, decoded under the
  regime (teacher forcing through the same prefill and steps as ``generate``).
- ``accuracy[regime]``: greedy generation from the prompt; chain/GSM8K compare the number after
  ``####``, the other tasks the answer the generation starts with. ``accuracy_by_difficulty[regime]``
  splits it by the examples' difficulty (chain steps, modsum digits, flip-flop instructions),
  ``n_by_difficulty`` counts them.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from models import DecoderLM, NonFiniteActivation
from workbench.data.answers import is_correct
from workbench.data.prepared import corpus_dir, source_hashes
from workbench.data.sources import file_sha256
from workbench.data.splits import heldout_task
from workbench.data.tasks import MAX_EXAMPLES, SYNTHETIC, Example, TaskConfig
from workbench.runtime.checkpoint import load_model
from workbench.runtime.decoding import NonFinite, check_passes, generate, guarded, score_completions
from workbench.runtime.tokenizer import TokenizerBase, load_tokenizer
from workbench.storage.errors import BadInput
from workbench.storage.files import write_json
from workbench.storage.outputs import output
from workbench.training.runconfig import load_run_config, task_settings

FUSED_PASSES = 2  # K of the fused regime's prefill in a run's own evaluation (results/eval.json)


def eval_tasks(task: str, data: TaskConfig | None = None) -> list[str]:
    """The tasks a run on ``task`` is evaluated on: a ``mix``'s tasks of positive weight."""
    if task != "mix":
        return [task]
    weights = (data or TaskConfig()).mix_weights
    return [name for name, weight in zip(SYNTHETIC, weights) if weight > 0]


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def plain_loss(model: DecoderLM, sequences: list[list[int]], batch_size: int) -> float:
    """Mean next-token loss of whole sequences, one full forward per batch (right padding is
    invisible to earlier positions). A non-finite activation raises ``NonFinite``
    (step = batch): an overflow would otherwise score constant logits as a loss of ln(d_vocab)."""
    total, count = 0.0, 0
    with guarded(model):
        for chunk in _batches(sequences, batch_size):
            width = max(len(s) for s in chunk)
            tokens = torch.zeros(len(chunk), width, dtype=torch.long)
            target = torch.full((len(chunk), width), -100, dtype=torch.long)
            for i, s in enumerate(chunk):
                tokens[i, : len(s)] = torch.tensor(s)
                target[i, : len(s) - 1] = torch.tensor(s[1:])
            logits = model(tokens.to(model.embed.W_E.device)).float()
            total += float(
                F.cross_entropy(logits.flatten(0, 1), target.flatten().to(logits.device), ignore_index=-100, reduction="sum")
            )
            count += int((target >= 0).sum())
    return total / max(count, 1)


@torch.no_grad()
def evaluate_examples(
    model: DecoderLM,
    examples: list[Example],
    tokenizer: TokenizerBase,
    *,
    fused_passes: int | str = FUSED_PASSES,
    batch_size: int = 64,
    regimes: Sequence[str] | None = None,
    per_problem: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """One task's row: ``loss``, ``answer_loss`` and ``accuracy`` per regime (module docstring), and
    ``silent_tokens[regime]``: generated ids before <eos> that decode to nothing (pad, other
    specials, ids past the vocabulary), which the scored text cannot show. ``regimes``: a subset of
    the model's (default: all). ``per_problem``: also ``correct[regime]`` (1/0 per example) and
    ``completion_nll[regime]`` (each example's mean completion loss), in the examples' order: what
    a comparison's seed-by-problem statistics need (``workbench.training.stats``). ``progress(phase,
    done, total)``: told of each batch of examples a phase (``loss[standard]``, ``accuracy[fused]``,
    ...) has done."""
    regimes = list(model.regimes if regimes is None else regimes)
    unknown = [r for r in regimes if r not in model.regimes]
    if unknown:
        raise BadInput(f"regimes {unknown}: expected some of {list(model.regimes)}")
    if "fused" in regimes:
        check_passes(model, fused_passes)  # before the losses run, not when the fused regime's turn comes
    eos = tokenizer.eos_id
    silent = tokenizer.silent_ids(model.cfg.d_vocab)
    prompts = [tokenizer.encode(ex.prompt) for ex in examples]
    completions = [tokenizer.encode(ex.completion) + [eos] for ex in examples]
    wholes = [p + c for p, c in zip(prompts, completions)]

    def named(what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NonFiniteActivation as err:  # say which of eval's computations met it
            raise NonFinite.wrap(err, what) from err

    def told(phase: str, done: int) -> None:
        if progress is not None:
            progress(phase, done, len(examples))

    def mean_nll(what: str, regime: str, pairs, each: list | None = None) -> float:
        total, count, done = 0.0, 0, 0
        for chunk in _batches(pairs, batch_size):
            nll = named(
                what,
                score_completions,
                model,
                [p for p, _ in chunk],
                [c for _, c in chunk],
                regime=regime,
                passes=fused_passes if regime == "fused" else 1,
                pad_token_id=tokenizer.pad_id,
            )
            total += float(nll.nansum())
            count += int((~nll.isnan()).sum())
            if each is not None:
                each += nll.nanmean(dim=1).tolist()
            done += len(chunk)
            told(what, done)
        return total / max(count, 1)

    row: dict = {"n": len(examples), "loss": {"standard": named("loss[standard]", plain_loss, model, wholes, batch_size)}}
    told("loss[standard]", len(examples))
    if model.carries_state:
        # prompt = the first token, so "soft" feeds back from position 1 on: the exact recurrence
        row["loss"]["recurrent"] = mean_nll("loss[recurrent]", "soft", [(w[:1], w[1:]) for w in wholes])
    if not any(prompts):  # plain text (a prepared corpus's text documents): no answer to score
        return row
    nlls: dict[str, list[float]] = {r: [] for r in regimes}
    row["answer_loss"] = {r: mean_nll(f"answer_loss[{r}]", r, list(zip(prompts, completions)), nlls[r]) for r in regimes}
    row["accuracy"], row["silent_tokens"], row["accuracy_by_difficulty"] = {}, {}, {}
    if per_problem:
        row["completion_nll"], row["correct"] = nlls, {}
    difficulties = sorted({ex.difficulty for ex in examples})
    row["n_by_difficulty"] = {str(d): sum(ex.difficulty == d for ex in examples) for d in difficulties}
    longest = max(len(c) for c in completions) + 8
    for regime in regimes:
        correct = quiet = 0
        hits = dict.fromkeys(difficulties, 0)
        each: list[int] = []
        for chunk in _batches(list(zip(examples, prompts)), batch_size):
            out = named(
                f"accuracy[{regime}]",
                generate,
                model,
                [p for _, p in chunk],
                regime=regime,
                passes=fused_passes if regime == "fused" else 1,
                max_new_tokens=min(longest, model.cfg.n_ctx - max(len(p) for _, p in chunk)),
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_id,
            )
            for (ex, _), ids in zip(chunk, out.completions()):
                hit = is_correct(ex, tokenizer.decode(ids))
                each.append(int(hit))
                correct += hit
                hits[ex.difficulty] += hit
            quiet += sum(out.silent_counts(silent))
            told(f"accuracy[{regime}]", len(each))
        row["accuracy"][regime] = correct / len(examples)
        row["accuracy_by_difficulty"][regime] = {str(d): hits[d] / row["n_by_difficulty"][str(d)] for d in difficulties}
        row["silent_tokens"][regime] = quiet
        if per_problem:
            row["correct"][regime] = each
    return row


def evaluate_run(
    run_dir: str | Path,
    *,
    n_examples: int | None = None,
    fused_passes: int | str = FUSED_PASSES,
    task: str | None = None,
    write: bool = True,
    device: str | torch.device = "cpu",
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Evaluate the run at ``run_dir`` on its task, holding ``results/`` while it evaluates; writes
    ``results/eval.json`` for the run's own configuration (its task, ``train.eval_examples``
    examples, K = 2 for ``fused``) and ``results/eval_<what differs>.json`` for any other (so an
    ``--passes exact`` eval never replaces the default one). The result's ``path`` says where it
    went. ``progress(phase, done, total)``: each task's phases as ``evaluate_examples`` tells them,
    the task's name first."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir / "config.json")  # errors name the file
    model = load_model(run_dir, device=device)
    tokenizer = load_tokenizer(run_dir)
    n = n_examples if n_examples is not None else cfg.train.eval_examples
    if not 1 <= n <= MAX_EXAMPLES:
        raise BadInput(f"n={n}: expected 1..{MAX_EXAMPLES:,} examples per task")
    check_passes(model, fused_passes)
    for name in eval_tasks(task or cfg.data.task, cfg.data):
        check_not_trained_on(run_dir, cfg.data.task, name)
    path = run_dir / "results" / eval_file_name(cfg, n, fused_passes, task)
    with output(path.parent, "results") if write else nullcontext() as held:
        result = _evaluate_run(run_dir, cfg, model, tokenizer, n, fused_passes, task, progress)
        if held is not None:
            write_json(path, result)
            held.wrote(path)
    return {**result, "path": str(path) if write else None}


def eval_file_name(cfg, n: int, fused_passes: int | str, task: str | None) -> str:
    """``eval.json`` for the run's own evaluation configuration, else ``eval_<what differs>.json``."""
    differs = []
    if fused_passes != FUSED_PASSES:
        differs.append(f"passes-{fused_passes}")
    if n != cfg.train.eval_examples:
        differs.append(f"n-{n}")
    if task is not None and task != cfg.data.task:
        slug = re.sub(r"[^A-Za-z0-9.]+", "-", task).strip("-")[:80]
        if slug != task:  # a lossy name: two tasks would share it (d/x.jsonl, d_x.jsonl) but for the digest
            slug += "-" + hashlib.sha256(task.encode()).hexdigest()[:10]
        differs.append("task-" + slug)
    return "eval.json" if not differs else f"eval_{'_'.join(differs)}.json"


def check_not_trained_on(run_dir: Path, trained: str, task: str) -> None:
    """Refuse to evaluate a run on what it trained on: the same file or dataset, a file that went
    into its prepared corpus, or another prepared corpus made from one of its training files (whose
    held-out split was drawn by another rule). Its own corpus is fine: eval reads the held-out split."""
    leak = _file_source(task) is not None and _file_source(task) == _file_source(trained)
    ours, theirs = corpus_dir(trained), corpus_dir(task)
    if not leak and (ours is not None or theirs is not None):
        same_corpus = ours is not None and theirs is not None and ours.resolve() == theirs.resolve()
        leak = not same_corpus and bool(_hashes(trained) & _hashes(task))
    if leak:
        raise BadInput(
            f"{run_dir} was trained on {trained}: evaluating on {task} would score its own training "
            "examples; pass --task with a held-out file (e.g. GSM8K's test split), its prepared corpus "
            "(prepared:DIR, whose held-out split eval reads) or a synthetic task"
        )


def _hashes(spec: str) -> set[str]:
    """SHA-256 of the files behind a task spec: a prepared corpus's sources, or a jsonl/text file."""
    source = _file_source(spec)
    if source is not None and source[0] in ("jsonl", "text") and Path(source[1]).is_file():
        return {file_sha256(Path(source[1]))}
    return source_hashes(spec)


def _file_source(spec: str) -> tuple[str, str] | None:
    """The file or dataset a task spec reads (``jsonl:``, ``text:``, ``hf:``), None for a synthetic
    task (whose held-out stream never holds training problems)."""
    kind, _, rest = spec.partition(":")
    if kind in ("jsonl", "text") and rest:
        return kind, str(Path(rest).resolve())
    return (kind, rest) if kind == "hf" and rest else None


def _evaluate_run(
    run_dir: Path,
    cfg,
    model: DecoderLM,
    tokenizer: TokenizerBase,
    n: int,
    fused_passes: int | str,
    task: str | None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    data = task_settings(cfg.data)
    started = time.perf_counter()
    result = {"run": str(run_dir), "arch": cfg.arch, "fused_passes": fused_passes, "n_examples": n, "tasks": {}}
    for name in eval_tasks(task or cfg.data.task, data):
        examples = heldout_task(name, n, cfg.train.seed, data, tokenizer)[:n]
        fits = [ex for ex in examples if len(tokenizer.encode(ex.text)) + 1 + 8 <= model.cfg.n_ctx]
        if not fits:
            raise BadInput(f"no {name!r} example fits the context n_ctx={model.cfg.n_ctx}")
        told = None if progress is None else (lambda phase, done, total, name=name: progress(f"{name} {phase}", done, total))
        result["tasks"][name] = evaluate_examples(model, fits, tokenizer, fused_passes=fused_passes, progress=told)
        result["tasks"][name]["skipped_too_long"] = len(examples) - len(fits)
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result
