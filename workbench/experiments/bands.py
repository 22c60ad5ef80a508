"""Graded test sets: an organism's task drawn at increasing difficulty (``BANDS``), the band an
accuracy claim is read on (``declare_band``: where the baseline's pilot accuracy leaves room for a
gain and a loss), and a run's per-problem answers on a set (``score_member``), which a study's
crossed intervals are computed from."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from workbench.data.splits import heldout_examples
from workbench.data.tasks import synthetic_examples
from workbench.runtime.checkpoint import load_model
from workbench.runtime.tokenizer import load_tokenizer
from workbench.storage.files import read_json, write_json
from workbench.storage.outputs import output
from workbench.training.evaluate import evaluate_examples
from workbench.training.runconfig import load_run_config, task_settings

# Graded test sets, in order of difficulty, from the trained level on: every member's accuracy on
# each is its accuracy-against-difficulty curve, and an accuracy claim is read on the band where
# the baseline's pilot accuracy has room (``declare_band``: between 0.6 and 0.9).
# The pilots (scripts/band_pilot.py, docs/results/band_pilots.json): perm trained on 1-3 answers
# products of 4-6 near chance (1/6), so its bands are every length 1-8 and the room, if any, is at
# the edge of training; the flip-flop's baseline stays at 0.98-1.0 at any ignore density of the
# trained 8-24 instructions, but holding a bit over longer sequences is harder: at ignore density
# 0.9 (writes and reads 3 : 2, as trained) it answers about 0.9, 0.8 and 0.7 at 32-48, 64-96 and
# 128-192 instructions; addition by digit count 1-5, where no band has room as trained: it falls
# from about 0.97 to 0.01 one digit past training, with 64- or 96-token windows, on 1-3 or 1-4,
# and stays at 0.94-0.99 within it by carry-chain length (``add_carry_chain``).
BANDS = {
    "flipflop": {
        f"length{lo}-{hi}": {"flipflop_min_len": lo, "flipflop_max_len": hi, "flipflop_weights": (0.06, 0.9, 0.04)}
        for lo, hi in ((8, 24), (32, 48), (64, 96), (96, 128), (128, 192))
    },
    "perm": {f"length{k}": {"perm_min_len": k, "perm_max_len": k} for k in range(1, 9)},
    "addition": {f"digits{k}": {"add_min_digits": k, "add_max_digits": k} for k in range(1, 6)},
}
HEADROOM = (0.6, 0.9)  # the baseline's pilot accuracy a band must have for a claim to be read on it
TEST_FILE = "comparison_test.json"  # per member, in results/: its per-problem scores


def declare_band(pilot: Mapping[str, float], headroom: tuple[float, float] = HEADROOM) -> dict:
    """The difficulty band accuracy claims are read on, declared from the baseline's pilot accuracy
    per band (``pilot``, in order of difficulty) before the study runs: the band whose accuracy is
    within ``headroom`` and nearest its middle (the first of ties), where neither a gain nor a loss
    runs into a ceiling or a floor. ``{band, pilot, headroom, why}``: ``band`` None, and ``why``,
    when no band has room."""
    low, high = headroom
    inside = [name for name, a in pilot.items() if low <= a <= high]
    band = min(inside, key=lambda name: abs(pilot[name] - (low + high) / 2)) if inside else None
    shown = ", ".join(f"{name} {a:.3f}" for name, a in pilot.items())
    why = (
        None
        if band
        else f"no difficulty band leaves the baseline between {low:g} and {high:g} in the pilot ({shown or 'no bands'})"
    )
    return {"band": band, "pilot": dict(pilot), "headroom": list(headroom), "why": why}


def band_accuracy(run: Path, bands: dict[str, dict], n: int) -> dict[str, float]:
    """A run's accuracy in ``standard`` on each difficulty band (name -> task settings): ``n``
    validation problems drawn with the band's settings over the run's own."""
    cfg = load_run_config(run / "config.json")
    model, tokenizer = load_model(run), load_tokenizer(run)
    accuracy = {}
    for name, settings in bands.items():
        drawn = dataclasses.replace(task_settings(cfg.data), **settings)
        examples = synthetic_examples(cfg.data.task, n, 0, drawn, split="validation")
        accuracy[name] = evaluate_examples(model, examples, tokenizer, regimes=["standard"])["accuracy"]["standard"]
    return accuracy


def as_recorded(settings: dict) -> dict:
    """Task settings as JSON gives them back (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}


def score_member(run: Path, regimes: list[str], n: int, test_set: tuple[str, dict] | None = None) -> dict:
    """Per regime of ``regimes`` the 1/0 correctness and the completion loss of each of ``n`` test
    problems (seed 0's held-out stream, the same for every member and seed), written to
    ``results/TEST_FILE``. ``test_set``: ``(name, settings)`` of another test set (beyond training,
    or a band), its problems drawn with the run's task settings changed by ``settings``, written to
    ``results/comparison_test_NAME.json``. A file there with these problems and regimes is read
    back (a rerun); anything else is scored again."""
    name, settings = test_set if test_set is not None else (None, {})
    path = run / "results" / (TEST_FILE if name is None else f"comparison_test_{name}.json")
    recorded = as_recorded(settings)
    if path.is_file():
        saved = read_json(path)
        whole = [saved.get(what) for what in ("correct", "completion_nll")]
        if (
            saved.get("n") == n
            and saved.get("settings", {}) == recorded
            and all(isinstance(w, dict) and set(w) == set(regimes) and all(len(v) == n for v in w.values()) for w in whole)
        ):
            return saved
    cfg = load_run_config(run / "config.json")
    examples = heldout_examples(cfg.data.task, n, 0, dataclasses.replace(task_settings(cfg.data), **settings))
    row = evaluate_examples(load_model(run), examples, load_tokenizer(run), regimes=regimes, per_problem=True)
    result = {"n": n, "problems_seed": 0, "correct": row["correct"], "completion_nll": row["completion_nll"]}
    if name is not None:
        result["settings"] = recorded
    with output(run / "results", "results") as held:
        write_json(path, result)
        held.wrote(path)
    return result
