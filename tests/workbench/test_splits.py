"""Held-out problems: drawn from a random stream of their own, never a shifted training seed."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TRAIN_SEEDS_TRIED = (0, 1, 7, 10_000, 10_001, 10_007, 12_345, 20_000)


def _large_space(ex) -> bool:
    """Problems drawn from a space of millions, where two independent streams of a few hundred
    share none by chance: chain with 4 steps, modsum with 7+ digits, flip-flop with 8+
    instructions. The rest of each task's space is small (chain's one-step problems number about
    650, modsum's 4-digit strings 10,000), so independent streams do share some of those by
    chance; there the test checks the streams' independence instead (no aligned or shifted copy)."""
    return ex.difficulty >= {"chain": 4, "modsum": 7, "flipflop": 8}[ex.task]


@pytest.mark.parametrize("task", ["chain", "modsum", "flipflop"])
@pytest.mark.parametrize("seed", [0, 7])
def test_heldout_examples_are_not_any_training_seeds_examples(task, seed):
    from workbench.data.splits import heldout_examples
    from workbench.data.tasks import synthetic_examples

    n = 300
    held = heldout_examples(task, n, seed)
    assert len(held) == n and all(ex.task == task for ex in held)
    assert [ex.text for ex in heldout_examples(task, n, seed)] == [ex.text for ex in held]  # reproducible
    held_texts = {ex.text for ex in held if _large_space(ex)}
    assert len(held_texts) > n // 5
    for train_seed in sorted({seed, seed + 10_000, *TRAIN_SEEDS_TRIED}):
        for source in (task, "mix"):  # a run trains on one task or on the mixture
            train = synthetic_examples(source, n, train_seed)
            shared = held_texts & {ex.text for ex in train}
            assert not shared, (task, seed, source, train_seed, sorted(shared)[:3])
            if source == task:  # independence: not the same stream, not a shifted copy of it
                same = sum(a.text == b.text for a, b in zip(held, train))
                assert same <= n // 20, (task, seed, train_seed, same)
                for shift in range(1, 4):
                    assert sum(a.text == b.text for a, b in zip(held[shift:], train)) <= n // 20


def test_training_stream_is_unchanged_by_the_split():
    import random

    from workbench.data.tasks import TaskConfig, make_modsum, synthetic_examples

    rng = random.Random("modsum:3")  # the stream existing runs were trained on
    want = [make_modsum(rng, TaskConfig()).text for _ in range(20)]
    assert [ex.text for ex in synthetic_examples("modsum", 20, 3)] == want
    assert [ex.text for ex in synthetic_examples("modsum", 20, 3, split="train")] == want
    with pytest.raises(ValueError, match="split 'test'"):
        synthetic_examples("modsum", 2, 3, split="test")


def test_no_study_derives_heldout_data_from_seed_arithmetic():
    import workbench.data.splits as splits

    assert not hasattr(splits, "EVAL_SEED_OFFSET")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "workbench").rglob("*.py") if "EVAL_SEED_OFFSET" in p.read_text()]
    assert not offenders, offenders


def test_studies_read_the_heldout_stream():
    from workbench.data.splits import heldout_examples
    from workbench.studies.traces import problems

    chain = problems("chain", 6, [2, 3], seed=5)
    assert [ex.difficulty for ex in chain] == [2, 3, 2, 3, 2, 3]
    from workbench.data.splits import heldout_rng
    from workbench.data.tasks import TaskConfig, make_chain

    rng = heldout_rng("traces", 5)
    assert [ex.text for ex in chain] == [make_chain(rng, TaskConfig(chain_max_steps=3), d).text for d in [2, 3, 2, 3, 2, 3]]
    assert heldout_examples("mix", 4, 0)[0].task in ("chain", "modsum", "flipflop")
