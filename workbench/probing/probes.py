"""Linear probes on stored activations (scikit-learn), split by sequence, with a control task.

Every result reports accuracy (R^2 for scalar targets), chance, the accuracy of the same probe on
a control task (Hewitt & Liang 2019: every token type gets a fixed random label drawn from the
label distribution, so a probe can only succeed by memorising token identity) and selectivity =
accuracy - control accuracy.
"""

from __future__ import annotations

import warnings
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


def _fit(X, y, masks, kind: str, seed: int) -> tuple[float, float, Any, Any]:
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.preprocessing import StandardScaler

    train, val, test = masks
    scaler = StandardScaler().fit(X[train])
    Xs = scaler.transform(X)
    best: tuple[float, float, Any] | None = None  # (validation score, regularisation, fitted model)
    for reg in C_GRID if kind == "classification" else ALPHA_GRID:
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
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, tokens: np.ndarray, *, kind: str = "classification", seed: int = 0
) -> ProbeResult:
    """Probe ``y`` from ``X`` [rows, features]; ``groups`` are sequence ids, ``tokens`` the token
    at each row (for the control task)."""
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
    control, _, _, _ = _fit(X, y_control, masks, kind, seed)
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
    return ProbeResult(
        float(score),
        float(chance),
        float(control),
        float(control_chance),
        float(score - control),
        int(masks[0].sum()),
        int(test.sum()),
        float(reg),
        converged,
        weights,
    )


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
