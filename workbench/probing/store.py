"""Activation store: run a model over a task and stream chosen hooks' activations, with their
per-position labels, to a Hugging Face ``datasets`` (Arrow) dataset on disk.

One row per (sequence, position, pass, stream). Columns: ``seq``, ``pos``, ``pass``, ``stream``,
``token``, ``label.<name>`` for every label the task has (-1 where undefined), and one
``act.<hook>`` float32 vector column per hook. Batches are written as they are computed, so
memory does not grow with the number of sequences. Tasks label characters; a token takes the label
of the character it ends at (``TokenizerBase.encode_labelled``), so the rows of a character-level
run and of a run with a subword tokenizer are labelled by the same rule.

Prefill regimes:
- ``standard``: one plain pass (every architecture);
- ``recurrent``: FBT K-pass prefill with feedback at every position, one row per pass
  (``passes=K``), or the exact sequential recurrence (``passes='exact'``, stored as pass 0).

Integrity: ``store.json`` lists every shard with its row count, byte size and CRC32. A store is
written into a staging directory inside its (exclusively held) directory and published with
``store.json`` last; ``load_store`` always checks shard names (confined to the store), sizes, row
counts and columns, and with ``verify=True`` (the default) the checksums and that every activation
is finite. Every error names the store (and the shard or hook).
"""

from __future__ import annotations

import re
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor

from models import DecoderLM, NonFiniteActivation, unstack_streams
from workbench.data.tasks import Example
from workbench.names import PREFILLS
from workbench.runtime.activations import ActivationRecorder, resolve_hook_names
from workbench.runtime.decoding import NonFinite, check_passes, guarded
from workbench.runtime.tokenizer import CharTokenizer, TokenizerBase
from workbench.storage.errors import BadInput, MissingFile
from workbench.storage.files import fsync, read_json, write_json
from workbench.storage.outputs import output

META = "store.json"
FORMAT = 2  # 1: shards listed by name only
SHARD = re.compile(r"^shard-\d{5}\.arrow$")


def hook_names(model: DecoderLM, hooks: list[str]) -> list[str]:
    """``resolve_hook_names``, whose ValueError (a name or pattern that matches no hook point of the
    model, with the closest valid ones) is the caller's ``BadInput``."""
    try:
        return resolve_hook_names(model, hooks)
    except ValueError as err:
        raise BadInput(str(err)) from err


def _check(model: DecoderLM, hooks: list[str], prefill: str, passes) -> None:
    if prefill not in PREFILLS:
        raise BadInput(f"unknown prefill {prefill!r}: expected one of {PREFILLS}")
    if prefill == "recurrent" and "fused" not in model.regimes:
        raise BadInput(f"prefill 'recurrent' needs a Full-Bandwidth model; arch {model.arch!r} has only 'standard'")
    check_passes(model, passes)
    for hook in hooks:
        if hook.startswith("fusion."):
            raise BadInput(
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
        raise BadInput(f"hook {hook!r} has shape {tuple(act.shape)}: not a per-position activation")
    return act.reshape(act.shape[0], n_tokens, n_streams, -1).float()


def _batches(examples: list[Example], tokenizer: TokenizerBase, batch_size: int, n_ctx: int, label_names: list[str]):
    """(first index, examples, tokens [batch, width], real [batch, width], labels {name: [batch,
    width]}) per batch, right-padded; per-character labels become per-token ones by the tokenizer's
    alignment rule (``encode_labelled``), -1 where undefined."""
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        encoded = [tokenizer.encode_labelled(ex.text, ex.labels) for ex in chunk]
        width = max(len(seq) for seq, _ in encoded)
        if width > n_ctx:
            raise BadInput(f"an example of {width} tokens is longer than the context n_ctx={n_ctx}")
        tokens = torch.zeros(len(chunk), width, dtype=torch.long)
        real = torch.zeros(len(chunk), width, dtype=torch.bool)
        labels = {name: np.full((len(chunk), width), -1, dtype=np.int64) for name in label_names}
        for i, (seq, per_token) in enumerate(encoded):
            tokens[i, : len(seq)] = torch.tensor(seq)
            real[i, : len(seq)] = True
            for name, table in labels.items():
                if name in per_token:
                    table[i, : len(per_token[name])] = per_token[name]
        yield start, chunk, tokens, real, labels


def _record(model: DecoderLM, hooks: list[str], tokens: Tensor, prefill: str, passes, what: str) -> list[Tensor]:
    """Per hook: [n_passes, batch, tokens, streams, features] of one batch (``what``: its sequences,
    named when the numerics guard stops it)."""
    width = tokens.shape[1]
    with ActivationRecorder(model, hooks, device="cpu") as rec, guarded(model):
        try:
            # states only (the readout's logits are never stored); right padding comes after every
            # real token, so it changes no real position, in K passes or in the exact recurrence
            model.prefill(tokens, regime="standard" if prefill == "standard" else "fused", passes=passes)
        except NonFiniteActivation as err:
            raise NonFinite(f"{what}: {err}; nothing was stored", err.what, err.step, err.pass_index) from err
    out = []
    for hook in hooks:
        stacked = rec.by_step(hook)[None] if (prefill == "recurrent" and passes == "exact") else rec.by_pass(hook)
        out.append(torch.stack([_per_position(a, hook, model.n_streams, width) for a in stacked]))
    return out


def store_estimate(
    model: DecoderLM,
    examples: list[Example],
    hooks: list[str],
    *,
    prefill: str = "standard",
    passes: int | str = 1,
    tokenizer: TokenizerBase | None = None,
) -> dict:
    """Rows and bytes the store will take, from the token counts and one example's activations
    (what ``cache_activations`` checks against the free disk space before writing)."""
    hooks = hook_names(model, hooks)
    _check(model, hooks, prefill, passes)
    tokenizer = tokenizer or CharTokenizer()
    if not examples:
        raise BadInput("no examples to cache (n_sequences must be >= 1)")
    lengths = [len(tokenizer.encode(ex.text)) for ex in examples]
    if max(lengths) > model.cfg.n_ctx:
        i = lengths.index(max(lengths))
        raise BadInput(f"example {i} of {lengths[i]} tokens is longer than the context n_ctx={model.cfg.n_ctx}")
    positions = sum(lengths)
    _, _, tokens, _, _ = next(_batches(examples[:1], tokenizer, 1, model.cfg.n_ctx, []))
    acts = _record(model, hooks, tokens.to(model.embed.W_E.device), prefill, passes, "sequence 0")
    n_passes = acts[0].shape[0]
    labels = {name for ex in examples for name in ex.labels}
    per_row = 4 * sum(a.shape[-1] for a in acts) + 8 * (5 + len(labels))  # float32 activations, int64 columns
    rows = positions * n_passes * model.n_streams
    return {"rows": rows, "bytes": rows * per_row, "positions": positions, "n_passes": n_passes}


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
    tokenizer: TokenizerBase | None = None,
    overwrite: bool = False,
    on_estimate: Callable[[dict], None] | None = None,
) -> Path:
    """Write the store to ``out_dir``: a new or empty directory, or a previous store there, which is
    replaced (once the new one is complete) only with ``overwrite``. ``on_estimate`` receives
    ``store_estimate``'s answer before anything is written."""
    hooks = hook_names(model, hooks)
    if not examples:
        raise BadInput("no examples to cache (n_sequences must be >= 1)")
    if any(h.endswith("hook_pattern") for h in hooks):
        raise BadInput("attention patterns are not per-position vectors; store hook_z or hook_resid_* instead")
    _check(model, hooks, prefill, passes)
    tokenizer = tokenizer or CharTokenizer()
    out_dir = Path(out_dir)
    estimate = store_estimate(model, examples, hooks, prefill=prefill, passes=passes, tokenizer=tokenizer)
    if on_estimate is not None:
        on_estimate(estimate)
    free = shutil.disk_usage(_existing_ancestor(out_dir)).free
    if estimate["bytes"] > 0.9 * free:
        raise BadInput(
            f"the store would take about {estimate['bytes'] / 2**30:.1f} GiB ({estimate['rows']:,} rows) but "
            f"{free / 2**30:.1f} GiB are free under {_existing_ancestor(out_dir)}: store fewer hooks or sequences"
        )
    label_names = sorted({name for ex in examples for name in ex.labels})
    n = model.n_streams
    with output(out_dir, "store", overwrite=overwrite) as out:
        shards, n_rows = [], 0
        for start, chunk, tokens, real, labels in _batches(examples, tokenizer, batch_size, model.cfg.n_ctx, label_names):
            per_pass = _record(
                model, hooks, tokens.to(model.embed.W_E.device), prefill, passes, f"sequences {start}..{start + len(chunk) - 1}"
            )
            n_passes = per_pass[0].shape[0]
            b_idx, t_idx = real.nonzero(as_tuple=True)  # rows: every real (sequence, position) x pass x stream
            columns = {
                "seq": np.repeat(start + b_idx.numpy(), n_passes * n),
                "pos": np.repeat(t_idx.numpy(), n_passes * n),
                "pass": np.tile(np.repeat(np.arange(n_passes), n), len(b_idx)),
                "stream": np.tile(np.arange(n), len(b_idx) * n_passes),
                "token": np.repeat(tokens[b_idx, t_idx].numpy(), n_passes * n),
            }
            for name in label_names:
                columns[f"label.{name}"] = np.repeat(labels[name][b_idx.numpy(), t_idx.numpy()], n_passes * n)
            for hook, act in zip(hooks, per_pass):
                # act: [n_passes, batch, pos, streams, d] -> rows in (seq, pos, pass, stream) order
                # stored as float32 whatever the model's dtype (numpy has no bfloat16; store.json says which)
                rows = act[:, b_idx, t_idx].permute(1, 0, 2, 3).reshape(-1, act.shape[-1]).float().numpy()
                if not np.isfinite(rows).all():
                    raise BadInput(
                        f"hook {hook} holds NaN or inf in sequences {start}..{start + len(chunk) - 1}: "
                        f"nothing was stored in {out_dir}"
                    )
                columns[f"act.{hook}"] = pa.FixedSizeListArray.from_arrays(
                    pa.array(rows.reshape(-1), pa.float32()), rows.shape[1]
                )
            table = pa.table({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in columns.items()})
            shards.append(_write_shard(out.staging / f"shard-{len(shards):05d}.arrow", table))
            n_rows += table.num_rows
        meta = {
            "format": FORMAT,
            "hooks": hooks,
            "labels": label_names,
            "prefill": prefill,
            "passes": passes,
            "arch": model.arch,
            "dtype": str(model.embed.W_E.dtype).removeprefix("torch."),  # the model's; activations stored as float32
            "n_streams": n,
            "n_sequences": len(examples),
            "n_rows": n_rows,
            "shards": shards,
        }
        write_json(out.staging / META, meta)
        out.publish()
    return out_dir


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _write_shard(path: Path, table: pa.Table) -> dict:
    """One Arrow IPC stream file, written and fsynced; its entry in ``store.json``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue()
    path.write_bytes(data)
    fsync(path)
    return {"name": path.name, "rows": table.num_rows, "bytes": data.size, "crc32": f"{zlib.crc32(data):08x}"}


def load_store(directory: str | Path, *, verify: bool = True):
    """The store as a memory-mapped ``datasets.Dataset`` (nothing is read into RAM until used),
    plus its metadata. Shard names, sizes, row counts and columns are always checked against
    ``store.json``; ``verify`` also checks every shard's CRC32 and that every activation is finite
    (a full read: about as long as reading the store once)."""
    from datasets import Dataset, concatenate_datasets

    directory = Path(directory)
    meta_path = directory / META
    if not meta_path.is_file():
        raise MissingFile(f"no activation store at {directory} (missing {META})")
    meta = read_json(meta_path)
    where = f"corrupt activation store {directory}"
    for key, kind in (("hooks", list), ("labels", list), ("shards", list), ("n_rows", int), ("n_streams", int)):
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise BadInput(f"{where}: {META} field {key!r} is {meta.get(key)!r}, expected {kind.__name__}")
    entries = [e if isinstance(e, dict) else {"name": e} for e in meta["shards"]]  # format 1 listed bare names
    if meta.get("format", 1) != 1:  # from format 2 on every shard has its size, rows and checksum: none may go missing
        for entry in entries:
            missing = [key for key in ("bytes", "rows", "crc32") if key not in entry]
            if missing:
                raise BadInput(
                    f"{where}: shard {entry.get('name')!r} in {META} has no {', '.join(missing)} "
                    f"(format {meta.get('format')} records them for every shard)"
                )
    parts, total = [], 0
    for entry in entries:
        name = entry.get("name")
        if not isinstance(name, str) or not SHARD.match(name):
            raise BadInput(f"{where}: shard name {name!r} in {META} is not shard-NNNNN.arrow (shards live in the store itself)")
        path = directory / name
        if not path.is_file() or path.is_symlink():
            raise BadInput(f"{where}: shard {name} listed in {META} is missing (or not a plain file)")
        if "bytes" in entry and path.stat().st_size != entry["bytes"]:
            raise BadInput(
                f"{where}: shard {name} has {path.stat().st_size} bytes, {META} says {entry['bytes']} (torn or altered)"
            )
        if verify and "crc32" in entry and _file_crc32(path) != entry["crc32"]:
            raise BadInput(f"{where}: shard {name} does not match its CRC32 in {META} (altered bytes)")
        try:
            part = Dataset.from_file(str(path), in_memory=False)
        except Exception as err:  # pyarrow raises several types for a damaged file
            raise BadInput(f"{where}: shard {name} is not a readable Arrow file: {' '.join(str(err).split())[:200]}") from err
        if "rows" in entry and len(part) != entry["rows"]:
            raise BadInput(f"{where}: shard {name} holds {len(part)} rows, {META} says {entry['rows']}")
        expected = {
            "seq",
            "pos",
            "pass",
            "stream",
            "token",
            *(f"label.{x}" for x in meta["labels"]),
            *(f"act.{h}" for h in meta["hooks"]),
        }
        if set(part.column_names) != expected:
            raise BadInput(f"{where}: shard {name} has columns {sorted(part.column_names)}, {META} needs {sorted(expected)}")
        if verify:
            for hook in meta["hooks"]:
                values = part.data.column(f"act.{hook}").combine_chunks().flatten().to_numpy(zero_copy_only=False)
                if not np.isfinite(values).all():
                    raise BadInput(f"{where}: hook {hook} holds NaN or inf in shard {name}")
        total += len(part)
        parts.append(part)
    if total != meta["n_rows"]:
        raise BadInput(f"{where}: the shards hold {total} rows, {META} says n_rows={meta['n_rows']}")
    if not parts:
        raise BadInput(f"{where}: {META} lists no shards")
    return concatenate_datasets(parts), meta


def _file_crc32(path: Path, chunk: int = 1 << 22) -> str:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"
