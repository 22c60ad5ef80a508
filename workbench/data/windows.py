"""Examples -> a token stream -> deterministic training batches.

The batch of step s is a pure function of (seed, s): random windows of the stream. Resuming at any
step, or splitting a step's batch over several processes, sees exactly the same sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from workbench.data.tasks import Example
from workbench.runtime.tokenizer import TokenizerBase


@dataclass
class TokenStream:
    ids: np.ndarray  # [n_tokens] int64: examples' tokens, each followed by <eos>
    source: np.ndarray  # [n_tokens] int32: index of the example each token belongs to

    @classmethod
    def from_examples(cls, examples: list[Example], tokenizer: TokenizerBase) -> TokenStream:
        ids, source = [], []
        for i, ex in enumerate(examples):
            row = tokenizer.encode(ex.text) + [tokenizer.eos_id]
            ids.extend(row)
            source.extend([i] * len(row))
        return cls(np.asarray(ids, dtype=np.int64), np.asarray(source, dtype=np.int32))

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, starts: np.ndarray, width: int) -> np.ndarray:
        """Windows [len(starts), width] of the stream (as ``CorpusSplit.take``)."""
        return self.ids[np.asarray(starts)[:, None] + np.arange(width)]


def step_generator(seed: int, step: int, purpose: int = 0) -> torch.Generator:
    """A generator that depends only on (seed, step, purpose): the same on every process."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 7 + purpose)


class Windows(Protocol):
    """A token stream batches are cut from: ``TokenStream`` or a prepared corpus's ``CorpusSplit``."""

    def __len__(self) -> int: ...

    def take(self, starts: np.ndarray, width: int) -> np.ndarray: ...


def batch_windows(stream: Windows, seed: int, step: int, batch_size: int, seq_len: int) -> tuple[Tensor, Tensor]:
    """The global batch of ``step``: inputs and next-token targets, both [batch, seq_len]."""
    if len(stream) <= seq_len + 1:
        raise ValueError(f"the token stream has {len(stream)} tokens; seq_len={seq_len} needs more")
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=step_generator(seed, step))
    windows = torch.from_numpy(stream.take(starts.numpy(), seq_len + 1))
    return windows[:, :-1], windows[:, 1:]
