"""``workbench sae RUN --hook NAME``: a sparse autoencoder on one hook of a run's model, over the
run's own held-out problems (``probing/sae.py`` has the recipe).

The activations are stored first (``probing/store.py``, in the output's ``store/``) under the
prefill regime asked for (``standard``, or FBT's ``recurrent`` K-pass prefill: the last pass's
rows; ``exact``: the exact recurrence); HD's rows are every stream's unless ``stream`` picks one.
Sequences are split 90 : 10 (seeded): the SAE trains on the first part's rows and is reported on
the held-out part's: mean squared error, the fraction of variance explained, L0, dead latents.
``latents.json`` lists each latent's density and its top-activating contexts (the tokens up to
and including the position, over every stored row).

The output directory (default ``RUN/results/sae/HOOK-PREFILL-K``) is held while written and
published whole with ``sae.json`` last; a previous SAE there is replaced only with ``overwrite``.
It loads in SAELens (``cfg.json``, ``sae_weights.safetensors``). With ``saelens_activations``
the rows it trained on are also written in SAELens's cached-activations layout
(``activations/``: ``export_saelens``), so SAELens can train on them in its own environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from workbench.probing.sae import SAEConfig, evaluate_sae, save_sae, train_sae
from workbench.probing.store import cache_activations, hook_names, load_store
from workbench.probing.study import MAX_SEQUENCES
from workbench.runtime.checkpoint import load_model
from workbench.runtime.tokenizer import tokenizer_of
from workbench.storage.errors import BadInput
from workbench.storage.files import write_json
from workbench.storage.outputs import output
from workbench.storage.provenance import source_commit
from workbench.training.run import Run

REPORT, LATENTS, ACTIVATIONS = "sae.json", "latents.json", "activations"
N_SEQUENCES = 512
TOP_CONTEXTS, CONTEXT_TOKENS = 8, 12  # per latent: contexts listed, tokens shown up to the position


def default_out(run_dir: str | Path, hook: str, prefill: str, passes: int | str, stream: int | None) -> Path:
    name = f"{hook}-{prefill}" + (f"-{passes}" if prefill == "recurrent" else "") + (f"-s{stream}" if stream is not None else "")
    return Path(run_dir) / "results" / "sae" / name


def default_k(d_in: int) -> int:
    """Active latents a row unless given: d_in / 8, within 4..32."""
    return min(32, max(4, d_in // 8))


def default_lr(d_sae: int) -> float:
    """Gao et al.'s learning-rate rule, 2e-4 / sqrt(d_sae / 2**14)."""
    return 2e-4 / (d_sae / 2**14) ** 0.5


def sae_study(
    run_dir: str | Path,
    hook: str,
    *,
    prefill: str = "standard",
    passes: int | str = 1,
    stream: int | None = None,
    n_sequences: int = N_SEQUENCES,
    seed: int = 0,
    expansion: int = 4,
    k: int | None = None,
    architecture: str = "topk",
    steps: int = 2000,
    batch_size: int = 1024,
    lr: float | None = None,
    out: str | Path | None = None,
    overwrite: bool = False,
    device: str | torch.device = "cpu",
    saelens_activations: bool = False,
    context_size: int = 32,
    progress: Callable[[float, str], None] | None = None,
) -> dict:
    """Train and save the SAE (``architecture``: ``topk`` or ``batchtopk``, ``workbench.probing.sae``);
    returns the report written to ``sae.json``. ``saelens_activations``: also export the training
    rows for SAELens, ``context_size`` rows a sequence."""
    started = time.perf_counter()
    report = progress or (lambda fraction, what: None)
    run_dir = Path(run_dir)
    if not 10 <= n_sequences <= MAX_SEQUENCES:  # every stored row is held in memory while the SAE trains
        raise BadInput(f"n_sequences={n_sequences}: expected 10..{MAX_SEQUENCES:,} (a tenth of them are held out)")
    if expansion < 1:
        raise BadInput(f"expansion={expansion}: expected latents = expansion x d_in with expansion >= 1")
    model, tokenizer = load_model(run_dir, device=device), tokenizer_of(run_dir)
    found = hook_names(model, [hook])
    if len(found) != 1:
        raise BadInput(f"--hook {hook!r} names {len(found)} hooks ({', '.join(found[:4])} ...): expected one")
    hook = found[0]
    if stream is not None and not 0 <= stream < model.n_streams:
        raise BadInput(f"stream={stream}: the model has streams 0..{model.n_streams - 1}")
    d_in = int(model.cfg.d_model)
    cfg = SAEConfig(
        d_in=d_in,
        d_sae=expansion * d_in,
        k=k or default_k(d_in),
        architecture=architecture,
        lr=lr or default_lr(expansion * d_in),
        batch_size=batch_size,
        steps=steps,
        seed=seed,
    )
    cfg.check_training_fits(device)
    out = Path(out) if out is not None else default_out(run_dir, hook, prefill, passes, stream)
    own = Run.open(run_dir).task
    task = own.spec
    drawn = own.heldout(n_sequences, seed, tokenizer)  # the run's own held-out problems (or documents)
    # a prepared corpus's document can be longer than the context: left out and counted, as eval does
    examples = [ex for ex in drawn if len(tokenizer.encode(ex.text)) <= model.cfg.n_ctx]
    if not examples:
        raise BadInput(f"none of the {len(drawn)} held-out sequences of {task} fits the context n_ctx={model.cfg.n_ctx}")
    with output(out, "sae", overwrite=overwrite) as c:
        report(0.0, "caching activations")
        store = cache_activations(
            model, examples, [hook], c.staging / "store", prefill=prefill, passes=passes, tokenizer=tokenizer
        )
        ds, meta = load_store(store, verify=False)  # written just now by this process
        table = ds.select_columns(["seq", "pos", "pass", "stream", "token"]).with_format("numpy")[:]
        keep = table["pass"] == table["pass"].max()
        if stream is not None:
            keep &= table["stream"] == stream
        rows = np.flatnonzero(keep)
        x = torch.from_numpy(ds.select_columns([f"act.{hook}"]).select(rows).with_format("numpy")[:][f"act.{hook}"])
        seqs = table["seq"][rows]
        order = np.random.default_rng(seed).permutation(np.unique(seqs))
        held = np.isin(seqs, order[: max(1, len(order) // 10)])
        report(0.1, f"training on {int((~held).sum()):,} rows")
        cfg.metadata = {
            "hook_name": hook,
            "model_name": str(run_dir),
            "context_size": int(model.cfg.n_ctx),
            "prepend_bos": False,
            "dataset_path": task,
            "workbench": {"run": str(run_dir), "arch": model.arch, "prefill": prefill, "passes": passes, "stream": stream},
        }
        train, test = x[torch.from_numpy(~held)], x[torch.from_numpy(held)]
        sae, training = train_sae(train.to(device), cfg)
        sae = sae.cpu()
        result = evaluate_sae(sae, test)
        report(0.9, "top contexts")
        latents = _latents(sae, x, table, rows, tokenizer, result.density)
        save_sae(sae, c.staging, cfg)
        write_json(c.staging / LATENTS, latents)
        exported = None
        if saelens_activations:
            exported = export_saelens(
                train, table["token"][rows[~held]], hook, c.staging / ACTIVATIONS, context_size=context_size
            )
        summary = {
            "run": str(run_dir),
            "arch": model.arch,
            "hook": hook,
            "prefill": prefill,
            "passes": passes,
            "stream": stream,
            "task": task,
            "input": own.input_record(),
            "n_sequences": len(examples),
            "skipped_too_long": len(drawn) - len(examples),
            "seed": seed,
            "rows": {"train": int((~held).sum()), "test": int(held.sum())},
            "settings": {k: v for k, v in asdict(cfg).items() if k != "metadata"},
            "test": result.summary(),
            "training": training,
            "saelens_activations": exported,
            "seconds": round(time.perf_counter() - started, 1),
            "commit": source_commit(),
        }
        write_json(c.staging / REPORT, summary)
        c.publish()
    report(1.0, "done")
    return summary


@torch.no_grad()
def _latents(sae, x, table, rows, tokenizer, density: list[float]) -> dict:
    """Per latent: its density on the held-out rows and the rows (over all) where it is largest,
    each with the tokens of its sequence up to and including the position."""
    z = sae.encode(x)
    seqs, positions = table["seq"], table["pos"]
    by_seq: dict[int, dict[int, int]] = {}
    for s, p, t in zip(seqs[rows], positions[rows], table["token"][rows]):  # each position once (one pass)
        by_seq.setdefault(int(s), {})[int(p)] = int(t)
    top = z.topk(min(TOP_CONTEXTS, len(z)), dim=0)  # [TOP, d_sae]
    out = []
    for latent in range(z.shape[1]):
        contexts = []
        for value, index in zip(top.values[:, latent].tolist(), top.indices[:, latent].tolist()):
            if value <= 0:
                break
            row = int(rows[index])
            seq, pos = int(seqs[row]), int(positions[row])
            tokens = [by_seq[seq][p] for p in range(max(0, pos - CONTEXT_TOKENS + 1), pos + 1)]
            contexts.append(
                {
                    "seq": seq,
                    "pos": pos,
                    "activation": value,
                    "before": tokenizer.decode(tokens[:-1], skip_special=False),
                    "token": tokenizer.decode(tokens[-1:], skip_special=False),
                }
            )
        out.append({"latent": latent, "density": density[latent], "top": contexts})
    return {"latents": out}


def export_saelens(x: torch.Tensor, tokens: np.ndarray, hook: str, out: Path, *, context_size: int) -> dict:
    """Rows ``x`` [rows, d_in] with their ``tokens`` in SAELens's cached-activations layout: a
    ``datasets`` dataset saved to ``out`` with one row per ``context_size`` consecutive rows, the
    column ``HOOK`` (Array2D [context_size, d_in], float32) and ``token_ids`` (int32 x
    context_size); the rows past the last whole sequence are left out. Train on it in SAELens with
    ``cached_activations_path=OUT``, ``context_size`` and ``hook_name=HOOK``."""
    from datasets import Array2D, Dataset, Features, Sequence, Value

    n = len(x) // context_size
    if n < 1:
        raise BadInput(f"{len(x)} rows: fewer than context_size={context_size}, nothing to export for SAELens")
    d_in = x.shape[1]
    features = Features(
        {hook: Array2D(shape=(context_size, d_in), dtype="float32"), "token_ids": Sequence(Value("int32"), length=context_size)}
    )
    acts = x[: n * context_size].reshape(n, context_size, d_in).numpy()
    ids = np.asarray(tokens[: n * context_size], dtype=np.int32).reshape(n, context_size)
    from datasets.utils import logging as datasets_logging

    shown = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()  # the verb has its own bar
    try:
        Dataset.from_dict({hook: list(acts), "token_ids": list(ids)}, features=features).save_to_disk(str(out))
    finally:
        if shown:
            datasets_logging.enable_progress_bar()
    return {"path": ACTIVATIONS, "hook_name": hook, "context_size": context_size, "sequences": n, "d_in": int(d_in)}
