"""Batched generation with a key/value cache for every architecture. What a regime means at the
prompt and at one step is the model's (``model.prefill``, ``model.step``, ``model.regimes``):

- ``standard``: plain embeddings everywhere (any architecture).
- ``soft``: plain prefill of the prompt, then every generated step is fused with the previous
  step's carried state (FBT).
- ``fused``: K-pass prefill of the prompt (``passes=K``; ``passes='exact'`` runs the exact
  sequential recurrence token by token), then ``soft`` generation (FBT).

Prompts of different lengths are left-padded; padding is masked out of attention and rotary
positions count real tokens only, so a row decodes exactly as it would alone.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from models import DecoderLM, KVCache, NonFiniteActivation, guard_numerics, trusted_ids
from models.numerics import NumericsGuard
from workbench.names import ENGINES, REGIMES
from workbench.runtime.config import check_fits
from workbench.storage.errors import BadInput, WorkbenchError

# Decode steps between the host's reads of the device (the numerics guard, whether every row has
# emitted eos, whether to compact): a step between them does not wait for the device.
SYNC_EVERY = 16
CAPACITY_STEP = 64  # the compiled engine's cache sizes: prompts of nearby lengths share one compiled step


class NonFinite(WorkbenchError, NonFiniteActivation):
    """``models.NonFiniteActivation`` as the workbench raises it: the model's numbers overflowed (or
    went NaN) on this input with these weights, which is no bug of the code; the message names the
    site, the step and the FBT pass (and, where the workbench knows it, what was running)."""

    @classmethod
    def wrap(cls, err: NonFiniteActivation, context: str = "") -> NonFinite:
        """``err`` as a ``NonFinite``, its message prefixed by ``context`` (``regime soft``)."""
        return cls(f"{context}: {err}" if context else str(err), err.what, err.step, err.pass_index)


@contextmanager
def guarded(model: DecoderLM, enabled: bool = True, check_every: int | None = 1) -> Iterator[NumericsGuard | None]:
    """``models.guard_numerics`` whose ``NonFiniteActivation`` comes out as ``NonFinite``; yields
    its ``NumericsGuard`` (None when not enabled)."""
    try:
        with guard_numerics(model, enabled, check_every) as guard:
            yield guard
    except NonFiniteActivation as err:
        if isinstance(err, NonFinite):
            raise
        raise NonFinite.wrap(err) from err


def model_check(check, *args) -> None:
    """Run a model's own argument check (``check_regime``, ``check_tokens``): its ValueError names a
    value the caller passed in, so it is the caller's ``BadInput``."""
    try:
        check(*args)
    except ValueError as err:
        raise BadInput(str(err)) from err


@dataclass
class Generation:
    tokens: Tensor  # [batch, prompt_pos + new] left-padded prompts then generated tokens
    attention_mask: Tensor  # [batch, prompt_pos + new] bool, False at padding
    new_tokens: Tensor  # [batch, new]
    prompt_lengths: list[int]
    states: Tensor  # [batch, new, d_model] final-normed state that produced each new token
    finished: Tensor  # [batch] bool: the row emitted eos_token_id
    lengths: Tensor  # [batch] generated tokens up to and including the first eos
    regime: str
    passes: int | str

    def completions(self) -> list[list[int]]:
        """Generated ids per row, up to and including the first eos (when one was set)."""
        return [row.tolist()[: int(n)] for row, n in zip(self.new_tokens, self.lengths)]

    def silent_counts(self, silent: Collection[int]) -> list[int]:
        """Per row, the generated ids before the first eos that are in ``silent`` (a tokenizer's
        ``silent_ids``: ids that decode to nothing, so the text alone would hide them)."""
        return [
            sum(t in silent for t in ids[: len(ids) - int(done)]) for ids, done in zip(self.completions(), self.finished.tolist())
        ]


def pad_prompts(prompts, pad_token_id: int = 0, device=None) -> tuple[Tensor, Tensor | None]:
    """Left-pad a list of id lists (or accept a [batch, pos] tensor). The mask is None when no row
    is padded, which keeps the unpadded fast path."""
    if isinstance(prompts, Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
        if prompts.dim() != 2:
            raise BadInput(f"prompt_ids tensor must be [batch, pos], got shape {tuple(prompts.shape)}")
        return prompts.to(device=device, dtype=torch.long), None
    rows = [list(p) for p in prompts]
    if rows and not isinstance(rows[0], list) and all(isinstance(t, int) for t in rows):
        rows = [rows]
    if not rows or any(len(r) == 0 for r in rows):
        raise BadInput("prompt_ids must hold at least one non-empty prompt")
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        tokens[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = True
    return tokens.to(device), (None if bool(mask.all()) else mask.to(device))


def sample(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """Next ids [batch] from logits [batch, d_vocab]: greedy at temperature 0."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    # in float64 (where a temperature down to 5e-324 is not zero), shifted by the row's max first
    # (softmax does not change): a tiny temperature then sends every other logit to -inf, which is
    # greedy, instead of overflowing every logit to inf (NaN probabilities)
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]


@contextmanager
def _engine_cache(model: DecoderLM, batch: int, capacity: int, engine: str) -> Iterator[KVCache]:
    """A key/value cache for ``capacity`` tokens that ``model.step`` runs on as ``engine`` (checked
    by ``_check_args``) says. The compiled engine's is kept on the model between calls, one per
    batch and capacity rounded up to ``CAPACITY_STEP``: the compiled step then sees the same shapes
    and a captured CUDA graph the same addresses, so both are reused, not compiled or recorded
    again; a call that runs while another holds that cache makes its own."""
    if engine != "compiled":
        yield model.make_cache(capacity, static=engine == "static")
        return
    capacity = min(-(-capacity // CAPACITY_STEP) * CAPACITY_STEP, model.cfg.n_ctx)
    cache = model.decode_caches.pop((batch, capacity), None)
    if cache is None:
        cache = model.make_cache(capacity, compiled=True)
    else:
        cache.reset()
    try:
        yield cache
    finally:
        model.decode_caches[(batch, capacity)] = cache


def _check_args(model, regime, passes, max_new_tokens, temperature, top_k, engine):
    if regime not in REGIMES:
        raise BadInput(f"unknown regime {regime!r}: expected one of {REGIMES}")
    if engine not in ENGINES:
        raise BadInput(f"unknown engine {engine!r}: expected one of {ENGINES}")
    model_check(model.check_regime, regime)
    check_passes(model, passes)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise BadInput(f"max_new_tokens={max_new_tokens!r}: expected an integer >= 1")
    if not math.isfinite(temperature) or temperature < 0:
        raise BadInput(f"temperature={temperature!r}: expected a finite number >= 0")
    if top_k is not None and top_k < 1:
        raise BadInput(f"top_k={top_k!r}: expected None or an integer >= 1")


def check_passes(model: DecoderLM, passes, name: str = "passes") -> None:
    """K of a K-pass computation: an integer in [1, n_ctx] (K = the sequence length is already the
    exact recurrence, so a larger K only costs time), or 'exact'."""
    if passes == "exact":
        return
    if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
        raise BadInput(f"{name}={passes!r}: expected an integer >= 1 or 'exact'")
    if passes > model.cfg.n_ctx:
        raise BadInput(
            f"{name}={passes} is more than the context n_ctx={model.cfg.n_ctx}: K = the prompt length is "
            "already the exact recurrence (use 'exact')"
        )


@torch.no_grad()
def score_completions(
    model: DecoderLM,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    regime: str = "standard",
    passes: int | str = 1,
    pad_token_id: int = 0,
    check_numerics: bool = True,
    engine: str = "eager",
) -> Tensor:
    """Teacher-forced negative log-likelihood [batch, completion_pos] of each completion after its
    prompt, decoded exactly as ``generate`` would (NaN past a row's completion). Non-finite
    activations raise ``NonFinite`` (see ``generate``)."""
    _check_args(model, regime, passes, 1, 0.0, None, engine)
    device = model.embed.W_E.device
    tokens, mask = pad_prompts(prompts, pad_token_id, device)
    B, P = tokens.shape
    C = max(len(c) for c in completions)
    if P + C > model.cfg.n_ctx:
        raise BadInput(f"prompt of {P} + completion of {C} tokens is longer than the context n_ctx={model.cfg.n_ctx}")
    target = torch.full((B, C), -1, dtype=torch.long, device=device)
    for i, c in enumerate(completions):
        target[i, : len(c)] = torch.tensor(list(c), dtype=torch.long)
    model_check(model.check_tokens, target.clamp(min=0))
    with guarded(model, check_numerics, check_every=None) as guard, _engine_cache(model, B, P + C, engine) as cache:
        n = model.n_streams
        h = model.prefill(tokens, regime=regime, passes=passes, cache=cache, attention_mask=mask)
        nll = torch.full((B, C), float("nan"), device=device)
        with trusted_ids(model):  # every completion id was checked above
            for j in range(C):
                logp = model.readout(h[:, -n:])[:, -1].float().log_softmax(-1)
                picked = -logp.gather(1, target[:, j : j + 1].clamp(min=0))[:, 0]
                nll[:, j] = torch.where(target[:, j] >= 0, picked, nll[:, j])  # not a mask index: no host read
                if guard is not None and (j + 1) % SYNC_EVERY == 0:
                    guard.check()
                if j < C - 1:
                    h = model.step(target[:, j : j + 1].clamp(min=0), regime=regime, cache=cache)
    return nll


@torch.no_grad()
def check_generate(
    model: DecoderLM,
    prompt_ids: Tensor | Sequence[Sequence[int]],
    regime: str = "standard",
    max_new_tokens: int = 32,
    passes: int | str = 1,
    temperature: float = 0.0,
    top_k: int | None = None,
    pad_token_id: int = 0,
    engine: str = "eager",
    compact: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Every refusal ``generate`` makes of its arguments, before any work: the padded prompts and
    their mask on the model's device. A caller decoding several regimes checks them all first."""
    _check_args(model, regime, passes, max_new_tokens, temperature, top_k, engine)
    if compact and temperature > 0:  # fewer rows would draw different random numbers
        raise BadInput(f"compact=True needs greedy decoding (temperature=0), got temperature={temperature!r}")
    tokens, mask = pad_prompts(prompt_ids, pad_token_id, model.embed.W_E.device)
    P = tokens.shape[1]
    model_check(model.check_tokens, tokens)
    if P + max_new_tokens > model.cfg.n_ctx:
        raise BadInput(
            f"prompt of {P} tokens + max_new_tokens={max_new_tokens} is longer than the context n_ctx={model.cfg.n_ctx}"
        )
    param = model.embed.W_E
    check_fits(
        lambda s: decode_bytes(model, s["batch"], s["tokens"], param.element_size()),
        {"batch": tokens.shape[0], "tokens": P + max_new_tokens},
        "the key/value cache and the generated states",
        reference={"batch": 1, "tokens": 256},
        labels={"batch": "prompts", "tokens": "prompt + max_new_tokens"},
        device=param.device if param.device.type == "cuda" else None,
    )
    return tokens, mask


def decode_bytes(model: DecoderLM, batch: int, tokens: int, itemsize: int) -> int:
    """What decoding ``tokens`` positions of ``batch`` rows allocates: keys and values of every
    layer for every cached position (an HD token caches each of its streams) and a carried state
    per generated position."""
    cfg = model.cfg
    cache = 2 * cfg.n_layers * batch * tokens * model.n_streams * (cfg.n_kv_heads or cfg.n_heads) * cfg.d_head
    return itemsize * (cache + batch * tokens * cfg.d_model)


@torch.no_grad()  # decoding builds no autograd graph (with one, CUDA graphs cannot replay: pending backwards)
def generate(
    model: DecoderLM,
    prompt_ids: Tensor | Sequence[Sequence[int]],
    *,
    regime: str = "standard",
    max_new_tokens: int = 32,
    passes: int | str = 1,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = 0,
    eos_token_id: int | None = None,
    pad_token_id: int = 0,
    check_numerics: bool = True,
    engine: str = "eager",
    compact: bool = False,
    sync_every: int = SYNC_EVERY,
) -> Generation:
    """Generate ``max_new_tokens`` for every prompt with a key/value cache.

    ``passes`` is the K of the ``fused`` regime's K-pass prefill (``'exact'``: the sequential
    recurrence). Hooks attached to ``model`` fire at every step; the workbench's
    ``ActivationRecorder`` tells the steps (and passes) apart. With ``check_numerics`` (the
    default) a non-finite norm input or logit raises ``NonFinite`` (a ``models.NonFiniteActivation``
    and a ``WorkbenchError``) naming the
    site and the step (forward calls: 0 is the prefill, except that ``passes='exact'`` prefills
    one prompt position per call); an overflow would otherwise decode as a run of pad ids.
    ``engine`` (see ``ENGINES``) decides how each step runs; every engine gives the same tokens.
    ``compact`` (greedy decoding with an ``eos_token_id``): rows that finished leave the batch, so
    the others run on a smaller one; tokens are the same, states after a row's eos are NaN.
    ``sync_every``: the host reads the device (the numerics guard, eos, compaction) only every that
    many steps, so the steps between run without waiting for it; tokens, states and errors are the
    same as reading it at every step (1), but the batch may run up to ``sync_every - 1`` steps past
    the last row's eos, which hooks see.
    """
    tokens, mask = check_generate(
        model, prompt_ids, regime, max_new_tokens, passes, temperature, top_k, pad_token_id, engine, compact
    )
    if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
        raise BadInput(f"sync_every={sync_every!r}: expected an integer >= 1")
    if eos_token_id is not None and not 0 <= pad_token_id < model.cfg.d_vocab:  # fed to the rows that finished
        raise BadInput(f"pad_token_id={pad_token_id} is outside the vocabulary [0, {model.cfg.d_vocab})")
    device = tokens.device
    B, P = tokens.shape
    prompt_lengths = mask.sum(1).tolist() if mask is not None else [P] * B
    generator = None
    if temperature > 0 and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    with guarded(model, check_numerics, check_every=None) as guard, _engine_cache(model, B, P + max_new_tokens, engine) as cache:
        h = model.prefill(tokens, regime=regime, passes=passes, cache=cache, attention_mask=mask)
        n = model.n_streams
        new = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        states = torch.full((B, max_new_tokens, h.shape[-1]), float("nan") if compact else 0.0, dtype=h.dtype, device=device)
        finished = torch.zeros(B, dtype=torch.bool, device=device)
        lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
        rows = torch.arange(B, device=device)  # the original rows still in the batch (all unless compact)
        ids: Tensor | None = None
        with trusted_ids(model):  # the prompt was checked; every later id is the readout's own (or the pad)
            for i in range(max_new_tokens):
                logits = model.readout(h[:, -n:])[:, -1]  # the last token's n stream positions
                states[rows, i] = h[:, -1]  # its last stream
                nxt = sample(logits, temperature, top_k, generator)
                if eos_token_id is not None:
                    done = finished[rows]
                    nxt = torch.where(done, torch.full_like(nxt, pad_token_id), nxt)
                    just = (nxt == eos_token_id) & ~done
                    lengths[rows] = torch.where(just, torch.full_like(nxt, i + 1), lengths[rows])
                    finished[rows] = done | just
                new[rows, i] = nxt
                read = (i + 1) % sync_every == 0  # the host reads the device at this step
                if read and guard is not None:
                    guard.check()
                if i == max_new_tokens - 1 or (eos_token_id is not None and read and bool(finished.all())):
                    # the last row's eos (an unfinished row's length is max_new_tokens)
                    width = int(lengths.max()) if eos_token_id is not None else i + 1
                    new, states = new[:, :width], states[:, :width]
                    break
                if compact and read:
                    keep = ~finished[rows]
                    if int((~keep).sum()) >= max(1, len(rows) // 8):  # a copy of the cache per event: batch them
                        kept = keep.nonzero()[:, 0]
                        cache.keep_rows(kept, len(rows))
                        rows, nxt = rows[kept], nxt[kept]
                if ids is None or ids.shape[0] != len(rows):
                    ids = torch.empty((len(rows), 1), dtype=torch.long, device=device)
                ids.copy_(nxt[:, None])  # one buffer for every step's ids: a CUDA graph reads them in place
                h = model.step(ids, regime=regime, cache=cache)
    if compact:  # a row that finished between two reads stepped on until the next: it has no state there
        after = torch.arange(states.shape[1], device=device) >= lengths[:, None]
        states = states.masked_fill(after[..., None], float("nan"))

    full_mask = torch.ones(B, P + new.shape[1], dtype=torch.bool, device=device)
    if mask is not None:
        full_mask[:, :P] = mask
    return Generation(
        tokens=torch.cat((tokens, new), dim=1),
        attention_mask=full_mask,
        new_tokens=new,
        prompt_lengths=prompt_lengths,
        states=states,
        finished=finished,
        lengths=lengths.clamp(max=new.shape[1]),
        regime=regime,
        passes=passes,
    )
