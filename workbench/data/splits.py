"""Held-out data: the problems every study evaluates on, never the ones a run trained on.

Held-out problems come from their own random streams (``tasks.split_rng(..., "heldout")``), seeded
with a string that no training stream uses, so they are independent of the training problems of
every seed. (A stream seeded by a number, such as ``seed + 10000``, is the training stream of
some ``train.seed``, and a run trained at that seed would be evaluated and probed on its own
training set.) Independence is not
disjointness where a task's problem space is tiny: chain's one-step problems number a few hundred,
so any two streams share some of them by chance.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from workbench.data.tasks import Example, TaskConfig, load_task, split_rng, synthetic_examples

if TYPE_CHECKING:
    from workbench.runtime.tokenizer import TokenizerBase

HELDOUT = "heldout"


def heldout_rng(stream: str, seed: int) -> random.Random:
    """The held-out random stream named ``stream`` (a task, or a study such as ``traces``)."""
    return split_rng(stream, seed, HELDOUT)


def heldout_examples(task: str, n: int, seed: int, cfg: TaskConfig | None = None) -> list[Example]:
    """``n`` held-out examples of a synthetic ``task`` (``mix`` included) for ``seed``."""
    return synthetic_examples(task, n, seed, cfg, split=HELDOUT)


def heldout_task(
    spec: str, n: int, seed: int, cfg: TaskConfig | None = None, tokenizer: TokenizerBase | None = None
) -> list[Example]:
    """``load_task`` for evaluation: a synthetic task from its held-out stream; a file-backed
    source (``jsonl:``, ``text:``, ``hf:``) as ``load_task`` reads it (it ignores the seed); a
    prepared corpus (``prepared:DIR``) its first ``n`` held-out documents, decoded with
    ``tokenizer`` (the run's: the corpus was tokenized with it)."""
    from workbench.data import prepared  # it imports the tasks this module imports

    directory = prepared.corpus_dir(spec)
    if directory is not None:
        if tokenizer is None:
            raise ValueError(f"{spec}: a prepared corpus's held-out documents need the tokenizer it was made with")
        return prepared.heldout_examples(prepared.PreparedCorpus.open(directory), tokenizer, n)
    kind, _, rest = spec.partition(":")
    if kind in ("jsonl", "text", "hf") and rest:
        return load_task(spec, n, seed, cfg)
    return heldout_examples(spec, n, seed, cfg)
