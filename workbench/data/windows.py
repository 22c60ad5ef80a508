"""Examples -> a token stream -> deterministic training batches.

The batch of step s is a pure function of (seed, s): random windows of the stream. Resuming at any
step, or splitting a step's batch over several processes, sees exactly the same sequences.

A stream built with ``completion_only`` scores only the tokens of each example's completion (and
its <eos>), and the answers a prompt holds (``Example.prompt_answers``: a flip-flop's earlier
queries; for a tokenizer with one token per character): other targets inside a prompt are
``IGNORE`` (-100, ``cross_entropy``'s ignore index). A
stream built with ``example_starts`` cuts windows only where an example starts, so position 0 of
every training sequence is the first token of a prompt, as in evaluation and generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from workbench.data.tasks import Example
from workbench.runtime.tokenizer import TokenizerBase

IGNORE = -100  # a target that is not scored


@dataclass
class TokenStream:
    ids: np.ndarray  # [n_tokens] int64: examples' tokens, each followed by <eos>
    source: np.ndarray  # [n_tokens] int32: index of the example each token belongs to
    scored: np.ndarray | None = None  # [n_tokens] bool: the token is a scored target (None: all are)
    window_starts: np.ndarray | None = None  # [n_starts] int64: where windows may start (None: anywhere)
    weight: np.ndarray | None = None  # [n_tokens] float32: a target's weight in the loss (None: all equal)

    @classmethod
    def from_examples(
        cls,
        examples: list[Example],
        tokenizer: TokenizerBase,
        completion_only: bool = False,
        example_starts: bool = False,
        example_weight: bool = False,
    ) -> TokenStream:
        """The examples' tokens, each example followed by <eos>. ``completion_only``: score only
        completions (and prompt answers); ``example_starts``: windows start at examples;
        ``example_weight``: each example's scored targets share a weight of 1, so an example with
        a 2-token answer counts as much as one with 50."""
        ids, source, scored, starts, weight = [], [], [], [], []
        for i, ex in enumerate(examples):
            starts.append(len(ids))
            row = tokenizer.encode(ex.text) + [tokenizer.eos_id]
            ids.extend(row)
            source.extend([i] * len(row))
            mask = [True] * len(row)
            if completion_only:
                n = prompt_tokens(tokenizer, ex.prompt, row)
                mask = [False] * n + [True] * (len(row) - n)
                if len(row) == len(ex.text) + 1:  # one token per character: answers inside the prompt too
                    for j in ex.prompt_answers:
                        mask[j] = True
                scored.extend(mask)
            if example_weight:
                share = 1.0 / sum(mask)
                weight.extend(share if m else 0.0 for m in mask)
        return cls(
            np.asarray(ids, dtype=np.int64),
            np.asarray(source, dtype=np.int32),
            np.asarray(scored, dtype=bool) if completion_only else None,
            np.asarray(starts, dtype=np.int64) if example_starts else None,
            np.asarray(weight, dtype=np.float32) if example_weight else None,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, starts: np.ndarray, width: int) -> np.ndarray:
        """Windows [len(starts), width] of the stream (as ``CorpusSplit.take``)."""
        return self.ids[np.asarray(starts)[:, None] + np.arange(width)]


def prompt_tokens(tokenizer: TokenizerBase, prompt: str, row: list[int]) -> int:
    """How many leading tokens of ``row`` (the example's tokens) belong to ``prompt``: the length of
    the prompt's own encoding, or, where a subword tokenizer merged across the boundary, of the
    longest prefix the two encodings share (the merged token is then scored)."""
    alone = tokenizer.encode(prompt) if prompt else []
    n = 0
    while n < min(len(alone), len(row)) and alone[n] == row[n]:
        n += 1
    return n


def step_generator(seed: int, step: int, purpose: int = 0) -> torch.Generator:
    """A generator that depends only on (seed, step, purpose): the same on every process."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 7 + purpose)


class Windows(Protocol):
    """A token stream batches are cut from: ``TokenStream`` or a prepared corpus's ``CorpusSplit``."""

    def __len__(self) -> int: ...

    def take(self, starts: np.ndarray, width: int) -> np.ndarray: ...


def window_starts(stream: Windows, seed: int, step: int, batch_size: int, seq_len: int) -> np.ndarray:
    """[batch] where the windows of ``step``'s batch start: anywhere, or at the stream's
    ``window_starts``; a pure function of (seed, step)."""
    if len(stream) <= seq_len + 1:
        raise ValueError(f"the token stream has {len(stream)} tokens; seq_len={seq_len} needs more")
    allowed = getattr(stream, "window_starts", None)
    if allowed is None:
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=step_generator(seed, step))
    else:
        allowed = allowed[allowed < len(stream) - seq_len - 1]
        if len(allowed) == 0:
            raise ValueError(f"no example starts {seq_len + 1} tokens before the end of the {len(stream)}-token stream")
        pick = torch.randint(0, len(allowed), (batch_size,), generator=step_generator(seed, step))
        starts = torch.from_numpy(allowed[pick.numpy()])
    return starts.numpy()


def batch_windows(stream: Windows, seed: int, step: int, batch_size: int, seq_len: int) -> tuple[Tensor, Tensor]:
    """The global batch of ``step``: inputs and next-token targets, both [batch, seq_len]; a
    target the stream does not score (``TokenStream.scored``) is ``IGNORE``."""
    starts = window_starts(stream, seed, step, batch_size, seq_len)
    windows = torch.from_numpy(stream.take(starts, seq_len + 1))
    x, y = windows[:, :-1], windows[:, 1:]
    scored = getattr(stream, "scored", None)
    if scored is not None:
        keep = torch.from_numpy(scored[starts[:, None] + np.arange(1, seq_len + 1)])
        y = y.masked_fill(~keep, IGNORE)
    return x, y


def batch_weights(stream: Windows, seed: int, step: int, batch_size: int, seq_len: int) -> Tensor | None:
    """[batch, seq_len] float32: the weights of ``batch_windows``'s targets (0 where ``IGNORE``),
    or None where the stream weighs every scored target alike."""
    weight = getattr(stream, "weight", None)
    if weight is None:
        return None
    starts = window_starts(stream, seed, step, batch_size, seq_len)
    return torch.from_numpy(weight[starts[:, None] + np.arange(1, seq_len + 1)])
