"""Activation store: run a model over a task and stream chosen hooks' activations, with their
per-position labels, to a Hugging Face ``datasets`` (Arrow) dataset on disk.

One row per (sequence, position, pass, stream). Columns: ``seq``, ``pos``, ``pass``, ``stream``,
``token``, ``label.<name>`` for every label the task has (-1 where undefined), and one
``act.<hook>`` float32 vector column per hook. Batches are written as they are computed, so
memory does not grow with the number of sequences.

Prefill regimes:
- ``standard``: one plain pass (every architecture);
- ``recurrent``: FBT K-pass prefill with feedback at every position, one row per pass
  (``passes=K``), or the exact sequential recurrence (``passes='exact'``, stored as pass 0).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from models import DecoderLM, FullBandwidthLM, unstack_streams
from workbench.activations import ActivationRecorder, resolve_hook_names
from workbench.checkpoint import write_json
from workbench.tasks import Example
from workbench.tokenizer import CharTokenizer

PREFILLS = ("standard", "recurrent")
META = "store.json"


def _check(model: DecoderLM, hooks: list[str], prefill: str, passes) -> None:
    if prefill not in PREFILLS:
        raise ValueError(f"unknown prefill {prefill!r}: expected one of {PREFILLS}")
    if prefill == "recurrent" and not isinstance(model, FullBandwidthLM):
        raise ValueError(f"prefill 'recurrent' needs a Full-Bandwidth model; arch {model.arch!r} has only 'standard'")
    if passes != "exact" and (not isinstance(passes, int) or passes < 1):
        raise ValueError(f"passes={passes!r}: expected an integer >= 1 or 'exact'")
    for hook in hooks:
        if hook.startswith("fusion."):
            raise ValueError(
                f"hook {hook!r} fires in passes 2..K only; store blocks.0.hook_resid_pre (the fused input) "
                "or ln_final.hook_normalized (the carried state) instead"
            )


def _per_position(act: torch.Tensor, hook: str, n_streams: int, n_tokens: int) -> torch.Tensor:
    """[batch, tokens, streams, features] from a hook's activation."""
    if hook == "hook_stream_embed":
        pass  # already [batch, tokens, streams, d_model]
    elif act.shape[1] == n_tokens * n_streams:
        act = unstack_streams(act, n_streams)
    else:
        raise ValueError(f"hook {hook!r} has shape {tuple(act.shape)}: not a per-position activation")
    return act.reshape(act.shape[0], n_tokens, n_streams, -1).float()


@torch.no_grad()
def cache_activations(
    model: DecoderLM,
    examples: list[Example],
    hooks: list[str],
    out_dir: str | Path,
    *,
    prefill: str = "standard",
    passes: int | str = 1,
    batch_size: int = 32,
    tokenizer: CharTokenizer | None = None,
) -> Path:
    """Write the store to ``out_dir`` (replaced only once the new one is complete)."""
    hooks = resolve_hook_names(model, hooks)
    if not examples:
        raise ValueError("no examples to cache (n_sequences must be >= 1)")
    if any(h.endswith("hook_pattern") for h in hooks):
        raise ValueError("attention patterns are not per-position vectors; store hook_z or hook_resid_* instead")
    _check(model, hooks, prefill, passes)
    tokenizer = tokenizer or CharTokenizer()
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    label_names = sorted({name for ex in examples for name in ex.labels})
    n = model.n_streams
    shards, n_rows = [], 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        seqs = [tokenizer.encode(ex.text) for ex in chunk]
        width = max(map(len, seqs))
        if width > model.cfg.n_ctx:
            raise ValueError(f"example of {width} tokens is longer than the context n_ctx={model.cfg.n_ctx}")
        tokens = torch.zeros(len(chunk), width, dtype=torch.long)
        real = torch.zeros(len(chunk), width, dtype=torch.bool)
        for i, s in enumerate(seqs):
            tokens[i, : len(s)] = torch.tensor(s)
            real[i, : len(s)] = True
        tokens = tokens.to(model.embed.W_E.device)
        with ActivationRecorder(model, hooks, device="cpu") as rec:
            if prefill == "standard":
                model(tokens) if not isinstance(model, FullBandwidthLM) else model(tokens, fuse_mask=torch.zeros_like(real).to(tokens.device))
            elif passes == "exact":
                cache = model.make_cache(width)
                for t in range(width):  # right padding comes after every real token: harmless
                    model.final_states(tokens[:, t : t + 1], cache=cache)
            else:
                model.final_states(tokens, passes=passes)
        per_pass = []
        for hook in hooks:
            if passes == "exact" and prefill == "recurrent":
                stacked = rec.by_step(hook)[None]  # [1, batch, pos, ...]
            else:
                stacked = rec.by_pass(hook)  # [n_passes, batch, pos, ...]
            per_pass.append(torch.stack([_per_position(a, hook, n, width) for a in stacked]))
        n_passes = per_pass[0].shape[0]
        # rows: every real (sequence, position) x pass x stream
        b_idx, t_idx = real.nonzero(as_tuple=True)
        columns = {
            "seq": np.repeat(start + b_idx.numpy(), n_passes * n),
            "pos": np.repeat(t_idx.numpy(), n_passes * n),
            "pass": np.tile(np.repeat(np.arange(n_passes), n), len(b_idx)),
            "stream": np.tile(np.arange(n), len(b_idx) * n_passes),
            "token": np.repeat(tokens.cpu()[b_idx, t_idx].numpy(), n_passes * n),
        }
        for name in label_names:
            table = np.full((len(chunk), width), -1, dtype=np.int64)
            for i, ex in enumerate(chunk):
                if name in ex.labels:
                    table[i, : len(ex.labels[name])] = ex.labels[name]
            columns[f"label.{name}"] = np.repeat(table[b_idx.numpy(), t_idx.numpy()], n_passes * n)
        for hook, act in zip(hooks, per_pass):
            # act: [n_passes, batch, pos, streams, d] -> rows in (seq, pos, pass, stream) order
            rows = act[:, b_idx, t_idx].permute(1, 0, 2, 3).reshape(-1, act.shape[-1]).numpy()
            columns[f"act.{hook}"] = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1), pa.float32()), rows.shape[1])
        table = pa.table({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in columns.items()})
        path = tmp / f"shard-{len(shards):05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        shards.append(path.name)
        n_rows += table.num_rows
    meta = {"hooks": hooks, "labels": label_names, "prefill": prefill, "passes": passes, "arch": model.arch,
            "n_streams": n, "n_sequences": len(examples), "n_rows": n_rows, "shards": shards}
    write_json(tmp / META, meta)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def load_store(directory: str | Path):
    """The store as a memory-mapped ``datasets.Dataset`` (nothing is read into RAM until used),
    plus its metadata."""
    from datasets import Dataset, concatenate_datasets

    directory = Path(directory)
    meta_path = directory / META
    if not meta_path.is_file():
        raise FileNotFoundError(f"no activation store at {directory} (missing {META})")
    meta = json.loads(meta_path.read_text())
    parts = [Dataset.from_file(str(directory / name), in_memory=False) for name in meta["shards"]]
    return concatenate_datasets(parts), meta
