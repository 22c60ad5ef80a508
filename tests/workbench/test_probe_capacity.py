"""Probes of limited capacity (rank sweep) and the online code (MDL), on data with known answers."""

import json
import math

import numpy as np
import pytest
from helpers import gaussian_rows
from threadpoolctl import threadpool_limits

from workbench.probing.probes import MDL_C_GRID, online_blocks, online_codelength, sweep_ranks, train_probe


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """scikit-learn's solvers and numpy's BLAS on one thread: the machine is 2 shared cores."""
    with threadpool_limits(1):
        yield


def gaussian(**sizes):
    return gaussian_rows(**{"n_seq": 150, "d": 64, **sizes})


def by_rank(result):
    return {row["rank"]: row for row in result.rank_sweep}


# ---- rank sweep --------------------------------------------------------------------------------


def test_a_planted_rank_two_label_needs_rank_two():
    """Four classes = the quadrant of (x0, x1), x ~ N(0, I_64): the label lives in a rank-2
    subspace. A rank-1 probe sees one projection t = u.x. Reflecting (x0, x1) across the line
    spanned by u's part in that plane leaves t (and the distribution) unchanged, and moves the point
    to another quadrant with probability 1 - 2a/pi >= 1/2 (a = the line's angle to the nearest axis,
    <= pi/4), so any function of t is right at most 1 - 1/2 * 1/2 = 0.75 of the time (the Bayes rate,
    at a = pi/4, is 0.59, computed numerically). A rank-2 probe can represent the quadrants
    exactly (logits +-x0 +-x1), so it reaches the full probe. 600 test rows: sd of an accuracy
    ~0.02."""
    X, groups, tokens, _ = gaussian()
    y = 2 * (X[:, 0] > 0) + (X[:, 1] > 0)
    result = train_probe(X, y, groups, tokens, mdl=False, ranks=(1, 2, 4))
    rows = by_rank(result)
    assert list(rows) == [1, 2, 3]  # 4 classes: rank 3 is the most a linear probe can use, so 4 is left out
    assert result.accuracy > 0.9
    assert rows[2]["accuracy"] > result.accuracy - 0.03
    assert rows[1]["accuracy"] < 0.7
    assert rows[3]["accuracy"] > result.accuracy - 0.03  # the largest rank reproduces the full probe


def test_a_planted_rank_one_label_is_found_at_rank_one():
    """Four classes = the quartile of one projection x.w: a rank-1 probe (logits a_k t + b_k on
    t = x.w give the four intervals) reaches the full probe's accuracy, where rank 0 (no feature)
    is the majority class, ~0.25. The rank sweep is also selective here: the control labels
    (random per token, independent of x) stay near chance at every rank."""
    X, groups, tokens, rng = gaussian()
    t = X @ rng.normal(size=X.shape[1])
    y = np.digitize(t, np.quantile(t, [0.25, 0.5, 0.75]))
    result = train_probe(X, y, groups, tokens, mdl=False, ranks=(1, 2))
    rows = by_rank(result)
    assert result.chance < 0.3 and result.accuracy > 0.9
    assert rows[1]["accuracy"] > result.accuracy - 0.03
    assert all(row["control_accuracy"] < 0.4 and row["selectivity"] > 0.5 for row in rows.values())


def test_sweep_ranks_stops_at_the_largest_rank_a_probe_can_have():
    assert sweep_ranks(8, 128, (1, 2, 4, 8, 16)) == [1, 2, 4, 7]  # 8 classes: rank <= 7
    assert sweep_ranks(2, 128, (1, 2, 4)) == [1]  # binary: one weight vector
    assert sweep_ranks(40, 16, (1, 2, 4, 8, 16, 32)) == [1, 2, 4, 8, 16]  # 16 features
    with pytest.raises(ValueError, match="at least 1"):
        sweep_ranks(8, 128, (0, 1))


# ---- online code -------------------------------------------------------------------------------


def test_online_code_of_random_labels_is_the_uniform_code():
    """Labels uniform on 4 classes and independent of X: 3,000 rows, uniform code 6,000 bits.
    Above: the online code is a code the receiver can decode (each block's probe is retrained from
    rows already sent, the choice of C is paid for, every probability is > 0), so by Kraft's
    inequality it beats n log2 K by c bits with probability at most 2^-c; 0.5% of 6,000 bits is
    30 bits (p < 1e-9). Below: C = 0.001 predicts about the label frequencies seen so far, so the
    code pays little more than learning the prior, log2(5) bits per block for the choice of C
    (8 blocks after the first here: 19 bits) and the floor (~0.0011 bits a row); 3% is 180 bits."""
    for seed in range(2):
        X, groups, _, rng = gaussian(seed=seed)
        y = rng.integers(0, 4, len(X))
        code = online_codelength(X, y, groups, seed=seed)
        assert code["uniform_bits"] == pytest.approx(len(X) * 2.0)
        assert 0.97 < code["compression"] <= 1.005, code["compression"]


def test_online_code_of_a_token_function_under_a_token_only_code_is_far_below_uniform():
    """X = one-hot(token), 30 token types, y = f(token) for a random f into 4 classes: once a type
    has been seen a few times its label is known, so the code pays about the first block (20 rows x
    2 bits) and a few bits per type for learning f (30 types), far below the 6,000-bit uniform code.
    Random labels on the same X cost about the uniform code (the test above)."""
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(150), 20)
    tokens = rng.integers(0, 30, len(groups))
    X = np.eye(30)[tokens]
    f = rng.integers(0, 4, 30)
    token_code = online_codelength(X, f[tokens], groups, seed=0)
    random_code = online_codelength(X, rng.integers(0, 4, len(groups)), groups, seed=0)
    assert token_code["compression"] > 10, token_code["compression"]
    assert token_code["bits"] < 0.1 * random_code["bits"]
    assert random_code["compression"] < 1.005


def test_online_blocks_are_whole_sequences_at_the_stated_fractions():
    """10 sequences of 10 rows: fractions 0.1, 0.25, 0.5, 1 end after 1, 3 (25 rows need a third
    sequence), 5 and 10 sequences. The default schedule on 100 rows: every fraction up to 6.25%
    falls in the first sequence, 12.5% needs two."""
    groups = np.repeat(np.arange(10) * 7 + 3, 10)  # ids need not be 0..n-1
    order, ends = online_blocks(groups, seed=0, fractions=(0.1, 0.25, 0.5, 1.0))
    assert ends.tolist() == [10, 30, 50, 100]
    assert sorted(order.tolist()) == list(range(100))
    starts = [0, *ends[:-1]]
    blocks = [set(groups[order[a:b]].tolist()) for a, b in zip(starts, ends)]
    assert [len(b) for b in blocks] == [1, 2, 2, 5]
    assert set().union(*blocks) == set(groups.tolist())  # whole sequences, each in one block
    assert online_blocks(groups, seed=0)[1].tolist() == [10, 20, 30, 50, 100]
    # unequal lengths (40, 30, 20, 10 rows): 25% ends with the first sequence sent that reaches 25 rows
    groups = np.repeat(np.arange(4), [40, 30, 20, 10])
    for seed in range(6):
        order, ends = online_blocks(groups, seed=seed, fractions=(0.25, 1.0))
        sent = list(dict.fromkeys(groups[order].tolist()))  # sequences in the order they are sent
        cumulative = np.cumsum([(groups == s).sum() for s in sent])
        assert ends.tolist() == [int(cumulative[np.argmax(cumulative >= 25)]), 100]
        assert ends[0] in {30, 40, 50, 60}  # whole sequences: 10 + 20 or 30, 40 or 10 + 30, 10 + 40 or 20 + 30, 20 + 40
    with pytest.raises(ValueError, match="increasing"):
        online_blocks(groups, 0, fractions=(0.5, 0.2))


def test_the_first_block_is_charged_the_uniform_code_exactly():
    """K = 3 classes, first block 10 rows: 10 log2 3 bits. When every label of the first block is
    the same class there is no probe to train, so the second block is sent uniformly too, and
    with two blocks the whole code is exactly n log2 K. Otherwise a block costs at least the
    log2(5) bits that name its C."""
    groups = np.repeat(np.arange(10), 10)
    order, _ = online_blocks(groups, seed=0, fractions=(0.1, 1.0))
    X = np.random.default_rng(0).normal(size=(100, 4))
    y = np.ones(100, dtype=np.int64)
    y[order[10:]] = np.arange(90) % 3  # the first block (rows order[:10]) is all class 1
    code = online_codelength(X, y, groups, seed=0, fractions=(0.1, 1.0))
    assert code["block_ends"] == [10, 100]
    assert code["block_bits"] == [10 * math.log2(3), 90 * math.log2(3)]
    assert code["bits"] == pytest.approx(100 * math.log2(3)) and code["compression"] == pytest.approx(1.0)
    y[order[:10]] = np.arange(10) % 3  # now the first block holds every class: a probe sends the rest
    code = online_codelength(X, y, groups, seed=0, fractions=(0.1, 0.5, 1.0))
    assert code["block_bits"][0] == 10 * math.log2(3)
    assert all(bits >= math.log2(len(MDL_C_GRID)) for bits in code["block_bits"][1:])
    assert code["bits"] == pytest.approx(sum(code["block_bits"]))


# ---- wiring ------------------------------------------------------------------------------------


def test_train_probe_reports_the_capacity_measures_for_classes_only():
    X, groups, tokens, rng = gaussian(n_seq=60, d=16)
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0)  # 3 classes
    result = train_probe(X, y, groups, tokens)
    assert result.uniform_bits == pytest.approx(result.n_train * math.log2(3))
    assert result.mdl_bits is not None and result.control_mdl_bits is not None
    assert result.compression == pytest.approx(result.uniform_bits / result.mdl_bits)
    assert result.control_compression == pytest.approx(result.uniform_bits / result.control_mdl_bits)
    # x predicts y; the control labels (per token, tokens independent of x) only have their prior,
    # P = (1/4, 1/2, 1/4): entropy 1.5 bits against log2(3) = 1.58, a compression near 1.06
    assert result.compression > 1.5 and result.control_compression < 1.2
    assert [row["rank"] for row in result.rank_sweep] == [1, 2]
    plain = train_probe(X, y, groups, tokens, mdl=False, ranks=())
    assert plain.mdl_bits is None and plain.compression is None and plain.rank_sweep == []
    assert (plain.accuracy, plain.control_accuracy, plain.reg) == (result.accuracy, result.control_accuracy, result.reg)
    regression = train_probe(X, X[:, 0] + 0.1 * rng.normal(size=len(X)), groups, tokens, kind="regression")
    assert regression.mdl_bits is None and regression.uniform_bits is None and regression.rank_sweep == []


def test_probe_study_rows_carry_the_capacity_measures(tmp_path):
    from workbench import build_model, save_model
    from workbench.probing.study import probe_study

    run = save_model(build_model("baseline", "debug"), tmp_path / "run")
    report = probe_study(run, "memory", hooks=["blocks.0.hook_resid_pre"], n_sequences=12)
    saved = json.loads((run / "results" / "probe_memory.json").read_text())
    for row in (report["rows"][0], saved["rows"][0]):
        assert row["uniform_bits"] > 0 and row["mdl_bits"] > 0 and row["control_mdl_bits"] > 0
        assert row["compression"] == pytest.approx(row["uniform_bits"] / row["mdl_bits"])
        assert row["rank_sweep"] and set(row["rank_sweep"][0]) == {"rank", "accuracy", "control_accuracy", "selectivity"}
