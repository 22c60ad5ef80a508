"""Linear probes on stored activations (scikit-learn), split by sequence, with a control task.

Every result reports accuracy (R^2 for scalar targets), chance, the accuracy of the same probe on
a control task (Hewitt & Liang 2019: every token type gets a fixed random label drawn from the
label distribution, so a probe can only succeed by memorising token identity) and selectivity =
accuracy - control accuracy.

With few token types a full linear probe memorises the control task (control accuracy ~1), and
selectivity says nothing. Classification results therefore also carry two measures that limit or
price the probe's capacity:

- a **rank sweep** (``rank_sweep``): probes restricted to a rank-r subspace, for the real and the
  control labels, and selectivity at each rank (Hewitt & Liang's "probes of limited capacity");
- the **online code** (``mdl_bits``; Voita & Titov 2020, "Information-Theoretic Probing with
  Minimum Description Length"): the bits needed to transmit the training labels given the
  activations with a probe retrained on every prefix of the data, against the uniform code
  (``uniform_bits``); ``compression = uniform_bits / mdl_bits``, for the real and control labels.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from sklearn.exceptions import ConvergenceWarning

from workbench.storage.errors import BadInput

C_GRID = (0.01, 0.1, 1.0, 10.0)
MAX_ITER = 300
ALPHA_GRID = (0.1, 1.0, 10.0, 100.0)
RANKS = (1, 2, 4, 8, 16)  # the rank sweep's default; ranks >= K - 1 (K classes) constrain nothing and are left out
# online code: block ends as fractions of the training rows (Voita & Titov's schedule)
MDL_FRACTIONS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)
MDL_C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0)  # one is picked per block, and the pick is paid for: log2(5) bits
MDL_FLOOR = 1e-3  # weight of the uniform distribution mixed into every prediction of the online code


@dataclass
class ProbeResult:
    accuracy: float  # classification accuracy, or R^2 for regression
    chance: float  # majority-class accuracy (0 for R^2)
    control_accuracy: float
    control_chance: float  # majority-class accuracy of the control labels (few token types make it differ from chance)
    selectivity: float
    n_train: int
    n_test: int
    reg: float  # the C (classification) or alpha (regression) chosen on the validation split
    converged: bool  # the chosen probe's solver converged within MAX_ITER
    weights: dict = field(default_factory=dict, repr=False)  # coef, intercept, mean, scale, classes
    # classification only (None for regression, or when not asked for): the online code of the
    # training labels (``online_codelength``), in bits, for the real and the control labels
    mdl_bits: float | None = None
    control_mdl_bits: float | None = None
    uniform_bits: float | None = None  # n_train * log2(K), K = the number of classes
    compression: float | None = None  # uniform_bits / mdl_bits
    control_compression: float | None = None
    # classification only: [{"rank", "accuracy", "control_accuracy", "selectivity"}, ...] (``rank_sweep``)
    rank_sweep: list[dict] = field(default_factory=list)


def split_by_sequence(
    groups: np.ndarray, seed: int, test: float = 0.2, val: float = 0.2
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean masks (train, val, test) over rows; all positions of one sequence fall on one side."""
    unique = np.unique(groups)
    if len(unique) < 3:
        raise BadInput(f"need at least 3 sequences to split train/val/test by sequence, got {len(unique)}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(unique)
    n_test = max(1, int(round(test * len(unique))))
    n_val = max(1, int(round(val * len(unique))))
    test_ids, val_ids = order[:n_test], order[n_test : n_test + n_val]
    is_test, is_val = np.isin(groups, test_ids), np.isin(groups, val_ids)
    return ~(is_test | is_val), is_val, is_test


def control_labels(tokens: np.ndarray, labels: np.ndarray, seed: int) -> np.ndarray:
    """Hewitt & Liang's control task: a fixed random label per token type, drawn from the label
    distribution."""
    rng = np.random.default_rng(seed + 1)
    values, counts = np.unique(labels, return_counts=True)
    types = np.unique(tokens)
    assigned = dict(zip(types.tolist(), rng.choice(values, size=len(types), p=counts / counts.sum()).tolist()))
    return np.array([assigned[t] for t in tokens.tolist()], dtype=labels.dtype)


def _fit(X, y, masks, kind: str, seed: int, grid: Sequence[float] | None = None) -> tuple[float, float, Any, Any]:
    """(test score, chosen regularisation, model, scaler): standardise on the training rows, pick
    the regularisation from ``grid`` (default ``C_GRID`` or ``ALPHA_GRID``) on the validation
    rows, score on the test rows."""
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.preprocessing import StandardScaler

    train, val, test = masks
    scaler = StandardScaler().fit(X[train])
    Xs = scaler.transform(X)
    best: tuple[float, float, Any] | None = None  # (validation score, regularisation, fitted model)
    for reg in grid or (C_GRID if kind == "classification" else ALPHA_GRID):
        if kind == "classification":
            model = LogisticRegression(C=reg, max_iter=MAX_ITER, random_state=seed)
        else:
            model = Ridge(alpha=reg)
        with warnings.catch_warnings():
            # weakly regularised fits may stop at MAX_ITER; ProbeResult.converged reports it
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(Xs[train], y[train])
        score = model.score(Xs[val], y[val])
        if best is None or score > best[0]:
            best = (score, reg, model)
    assert best is not None  # the grid is not empty
    _, reg, model = best
    return model.score(Xs[test], y[test]), reg, model, scaler


def train_probe(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    tokens: np.ndarray,
    *,
    kind: str = "classification",
    seed: int = 0,
    mdl: bool = True,
    ranks: Sequence[int] = RANKS,
) -> ProbeResult:
    """Probe ``y`` from ``X`` [rows, features]; ``groups`` are sequence ids, ``tokens`` the token
    at each row (for the control task). For classification, ``mdl`` adds the online codelength of
    the training labels (real and control) and ``ranks`` the rank-limited probes (``()`` for
    none); each costs about as much as the full probe again."""
    if kind not in ("classification", "regression"):
        raise ValueError(f"kind={kind!r}: expected 'classification' or 'regression'")
    if len(X) != len(y) or len(X) != len(groups) or len(X) != len(tokens):
        raise ValueError(f"X, y, groups, tokens must have one row each: {len(X)}, {len(y)}, {len(groups)}, {len(tokens)}")
    bad = ~np.isfinite(X).all(axis=1)
    if bad.any():
        raise BadInput(f"the activations hold NaN or inf in {int(bad.sum())} of {len(X)} rows (first: row {int(np.argmax(bad))})")
    masks = split_by_sequence(groups, seed)
    if kind == "classification" and len(np.unique(y[masks[0]])) < 2:
        raise BadInput("the training split holds a single class: nothing to probe")
    score, reg, model, scaler = _fit(X, y, masks, kind, seed)
    y_control = control_labels(tokens, y, seed)
    control, _, control_model, control_scaler = _fit(X, y_control, masks, kind, seed)
    test = masks[2]
    chance, control_chance = (_majority(y[test]), _majority(y_control[test])) if kind == "classification" else (0.0, 0.0)
    weights = {
        "coef": np.atleast_2d(model.coef_).astype(np.float32),
        "intercept": np.atleast_1d(model.intercept_).astype(np.float32),
        "mean": scaler.mean_.astype(np.float32),
        "scale": scaler.scale_.astype(np.float32),
    }
    if kind == "classification":
        weights["classes"] = model.classes_.astype(np.int64)
    converged = kind == "regression" or bool(np.all(model.n_iter_ < MAX_ITER))
    result = ProbeResult(
        accuracy=float(score),
        chance=float(chance),
        control_accuracy=float(control),
        control_chance=float(control_chance),
        selectivity=float(score - control),
        n_train=int(masks[0].sum()),
        n_test=int(test.sum()),
        reg=float(reg),
        converged=converged,
        weights=weights,
    )
    if kind == "classification" and mdl:
        train = masks[0]
        classes = np.unique(y)  # the alphabet both codes use; the control labels are drawn from it
        real = online_codelength(X[train], y[train], groups[train], classes=classes, seed=seed)
        ctrl = online_codelength(X[train], y_control[train], groups[train], classes=classes, seed=seed)
        result.mdl_bits, result.control_mdl_bits, result.uniform_bits = real["bits"], ctrl["bits"], real["uniform_bits"]
        result.compression = real["uniform_bits"] / real["bits"]
        result.control_compression = ctrl["uniform_bits"] / ctrl["bits"]
    if kind == "classification" and ranks:
        chosen = sweep_ranks(len(model.classes_), X.shape[1], ranks)
        real_at = rank_limited_accuracy(X, y, masks, model, scaler, chosen, seed)
        control_at = rank_limited_accuracy(X, y_control, masks, control_model, control_scaler, chosen, seed)
        result.rank_sweep = [
            {"rank": r, "accuracy": real_at[r], "control_accuracy": control_at[r], "selectivity": real_at[r] - control_at[r]}
            for r in chosen
        ]
    return result


# ---- probes of limited capacity ----------------------------------------------------------------


def sweep_ranks(n_classes: int, n_features: int, ranks: Sequence[int]) -> list[int]:
    """The ranks a sweep reports: those of ``ranks`` below the largest rank a linear probe of
    ``n_classes`` classes on ``n_features`` features can have, then that largest rank. A K-class
    softmax probe is invariant to adding one vector to every class's weights, so its weights have
    rank at most K - 1 (1 for two classes), and a larger r constrains nothing."""
    if any(r < 1 for r in ranks):
        raise ValueError(f"ranks={tuple(ranks)}: a rank is at least 1")
    cap = min(max(n_classes - 1, 1), n_features)
    return sorted({int(r) for r in ranks if r < cap} | {cap})


def rank_limited_accuracy(
    X: np.ndarray, y: np.ndarray, masks, probe: Any, scaler: Any, ranks: Sequence[int], seed: int
) -> dict[int, float]:
    """Test accuracy of a rank-r probe of ``y`` for every r in ``ranks`` (``sweep_ranks``); a rank
    above the rank of the full ``probe``'s logits gets that rank's accuracy.

    A rank-r probe is a logistic regression on an r-dimensional projection Z = Xs D_r of the
    standardised activations Xs, fitted on the training rows (Z standardised) with the C the full
    probe chose on the validation rows, and scored on the test rows. (A C chosen per rank would
    cost a grid of fits per rank; with r weights per class and thousands of rows the rank, not
    C, is what limits the probe.) D_r (``low_rank_directions``) spans the best rank-r approximation, in least squares over the training rows, of the full probe's
    logits (``probe``, fitted on the same training rows with ``scaler``): the r directions of
    activation space that carry most of what the full probe computes. Why this subspace: it comes
    in closed form from the fitted probe (one SVD of an [n, K] matrix: deterministic, and cheap
    next to the probe itself), its logits are linear in Xs, so at the largest rank the refit can
    reproduce the full probe; and it inherits the cross-entropy fit's sharpness. (The subspace of
    a reduced-rank least-squares regression of the one-hot labels, also closed form, was tried
    first: on quadrant labels of two planted directions in 64 Gaussian dimensions it lost 0.04 of
    accuracy at full rank against the logistic probe, because least squares on indicator targets
    estimates the directions less sharply.) It is not the end-to-end optimum of the rank-r
    cross-entropy, so an accuracy here is one rank-r probe's, not the best one's; real and
    control labels go through the same procedure, so their comparison at one rank is like for
    like. (Hewitt & Liang 2019 limit capacity by rank among other knobs, training the factorised
    probe end to end.)"""
    Xs = np.asarray(scaler.transform(X), dtype=np.float64)
    directions = low_rank_directions(np.atleast_2d(probe.coef_), Xs[masks[0]])
    at: dict[int, float] = {}  # by the rank actually used
    for r in sorted({min(int(r), directions.shape[1]) for r in ranks}):
        at[r] = float(_fit(Xs @ directions[:, :r], y, masks, "classification", seed, grid=(probe.C,))[0])
    return {int(r): at[min(int(r), directions.shape[1])] for r in ranks}


def low_rank_directions(coef: np.ndarray, Xs_train: np.ndarray) -> np.ndarray:
    """D [features, m]: directions in standardised activation space, most important first, whose
    first r columns span the best rank-r least-squares approximation of the logits
    Xs_train coef^T (centred over classes and over rows: softmax and intercepts ignore those
    shifts); m = the rank of those logits, at most min(K - 1, features), and at least 1. With the
    SVD  L = U S V^T  of the centred logits, Xs D_r = U_r S_r and D_r = coef_c^T V_r."""
    coef = coef - coef.mean(axis=0) if len(coef) > 1 else coef  # [K, d], centred over classes
    logits = Xs_train @ coef.T
    logits -= logits.mean(axis=0)
    _, s, Vt = np.linalg.svd(logits, full_matrices=False)
    m = max(1, int((s > s[0] * 1e-9).sum()))  # all-zero logits (s[0] = 0): one direction, of zeros
    return coef.T @ Vt[:m].T


# ---- online code (minimum description length) --------------------------------------------------


def online_blocks(groups: np.ndarray, seed: int, fractions: Sequence[float] = MDL_FRACTIONS) -> tuple[np.ndarray, np.ndarray]:
    """(order, ends): the rows in transmission order and the end of each block in that order.

    Sequences are shuffled (``seed``) and kept whole: block i holds the rows order[ends[i-1]:ends[i]],
    and ends[i] is the row count of the fewest leading sequences that reach ``fractions[i]`` of
    all rows. Fractions too small to reach a new sequence merge with the next (a small dataset
    has fewer blocks); the first block holds at least one sequence and the last ends at the last row."""
    if not fractions or any(not 0 < f <= 1 for f in fractions) or list(fractions) != sorted(fractions):
        raise ValueError(f"fractions={tuple(fractions)}: expected increasing fractions in (0, 1]")
    unique, inverse = np.unique(groups, return_inverse=True)
    rng = np.random.default_rng(seed + 2)  # split_by_sequence draws from seed, control_labels from seed + 1
    position = np.empty(len(unique), dtype=np.int64)
    position[rng.permutation(len(unique))] = np.arange(len(unique))  # where each sequence goes
    order = np.argsort(position[inverse], kind="stable")
    cum = np.cumsum(np.bincount(position[inverse], minlength=len(unique)))
    ends = {int(cum[min(np.searchsorted(cum, f * len(groups)), len(cum) - 1)]) for f in fractions}
    ends.add(len(groups))
    return order, np.array(sorted(ends), dtype=np.int64)


def online_codelength(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    *,
    classes: np.ndarray | None = None,
    seed: int = 0,
    fractions: Sequence[float] = MDL_FRACTIONS,
) -> dict:
    """Voita & Titov's online (prequential) code of the labels ``y`` given ``X``, in bits.

    The rows are cut into blocks of whole sequences (``online_blocks``). The first block is sent
    with the uniform code, n_1 log2 K bits (K = ``len(classes)``, the label alphabet both sides
    know; default: the values in ``y``). Every later block is sent with a probe trained on all
    earlier blocks: sum over its rows of -log2 p(y | x). The probe is the full probe's logistic
    regression (standardised on the earlier blocks); its C is chosen per block by the codelength
    of that block, going up ``MDL_C_GRID`` until the codelength rises, and the choice is sent too
    (log2 of the grid size, per block), so the total stays the length of a code the receiver can
    decode (it refits the chain of fits up to the index it is sent). Each
    prediction is mixed with the uniform distribution at weight ``MDL_FLOOR``, so a class absent
    from the earlier blocks, or a confident mistake, costs at most log2(K / MDL_FLOOR) bits (and
    a correct prediction at least -log2(1 - MDL_FLOOR (K - 1) / K): 0.0007 to 0.0014 bits). A block
    whose earlier blocks hold a single class is sent with the uniform code.

    Labels that ``X`` does not predict cost about the uniform code (``compression`` ~1: no code
    beats it by c bits with probability above 2^-c when the labels are uniform and independent of
    X); a skewed label distribution alone already compresses (the probe learns the prior). Returns
    ``bits``, ``uniform_bits`` (n log2 K), ``compression`` (their ratio), ``block_ends`` (rows
    sent after each block) and ``block_bits``."""
    classes = np.unique(y) if classes is None else np.asarray(classes)
    if len(classes) < 2:
        raise BadInput("the online code needs at least 2 classes")
    if not np.isin(y, classes).all():
        raise ValueError("y holds a label outside classes")
    K = len(classes)
    order, ends = online_blocks(groups, seed, fractions)
    Xo, yo = X[order], np.searchsorted(classes, y[order])  # labels as indices 0..K-1
    block_bits = [float(ends[0] * math.log2(K))]
    for start, end in zip(ends[:-1], ends[1:]):
        block_bits.append(_block_bits(Xo[:start], yo[:start], Xo[start:end], yo[start:end], K, seed))
    bits = float(sum(block_bits))
    uniform = float(len(y) * math.log2(K))
    return {
        "bits": bits,
        "uniform_bits": uniform,
        "compression": uniform / bits,
        "block_ends": ends.tolist(),
        "block_bits": block_bits,
    }


def _block_bits(X_seen, y_seen, X_next, y_next, K: int, seed: int) -> float:
    """Bits to send ``y_next`` (indices 0..K-1) with the best probe of ``MDL_C_GRID`` trained on
    the rows already sent (searched upwards, stopping once the bits rise), plus
    log2(len(MDL_C_GRID)) for naming it."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    if len(np.unique(y_seen)) < 2:
        return float(len(y_next) * math.log2(K))
    scaler = StandardScaler().fit(X_seen)
    Xs_seen, Xs_next = np.asarray(scaler.transform(X_seen)), np.asarray(scaler.transform(X_next))
    best = math.inf
    # one model, each C's fit starting from the previous C's solution (the grid ascends): fewer
    # iterations, and still a deterministic chain of fits the receiver can repeat
    model = LogisticRegression(max_iter=MAX_ITER, random_state=seed, warm_start=True)
    for C in MDL_C_GRID:
        model.set_params(C=C)
        with warnings.catch_warnings():
            # any deterministic fit gives a decodable code; convergence only changes its length
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(Xs_seen, y_seen)
        p = np.zeros((len(X_next), K))
        p[:, model.classes_] = model.predict_proba(Xs_next)
        p = (1 - MDL_FLOOR) * p + MDL_FLOOR / K
        bits = float(-np.log2(p[np.arange(len(y_next)), y_next]).sum())
        if bits > best:  # past the best C (the sender may stop searching anywhere: it sends the index)
            break
        best = bits
    return best + math.log2(len(MDL_C_GRID))


def _majority(labels: np.ndarray) -> float:
    _, counts = np.unique(labels, return_counts=True)
    return float(counts.max() / counts.sum())


def save_probe(result: ProbeResult, path: str | Path, metadata: dict | None = None) -> Path:
    """Probe weights as safetensors: coef [n_classes, d] (in standardised units), intercept, and
    the standardisation mean/scale, so ``coef / scale`` is the direction in activation space."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: np.ascontiguousarray(v) for k, v in result.weights.items()},
        str(path),
        metadata={k: str(v) for k, v in (metadata or {}).items()},
    )
    return path
