"""Timing side by side: interleaved repetitions, ratios, targets, and what dynamo did meanwhile."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch

TARGETS = {  # key: (comparison, target); None = reported only
    "fbt_soft_decode_overhead": ("<=", 1.05),
    "kv_cache_speedup": (">=", 20.0),
    "compiled_decode_speedup": (">=", 2.0),
    "vs_hf_generate": (">=", 1.0),
    "fused_projections": (None, None),
    "traces_problems_per_s": (">=", 2.0),
    "fbt_k2_train_step": ("<=", 2.2),
    "fbt_k3_train_step": ("<=", 3.3),
    "hd4_train_step": ("<=", 4.6),
    "hd4_dense_train_step": (None, None),
    "hd4_kv_mirror_train_step": (None, None),
    "hd4_decode_throughput": (">=", 0.85),
    "hd4_decode_throughput_b32_ctx2k": (None, None),
    "ragged_batch32_decode": (None, None),
    "ragged_batch64_decode": (None, None),
    "hook_overhead": ("<=", 1.03),
    "numerics_guard_decode": ("<=", 1.03),
    "store_verify_load": (None, None),
    "vs_hf_llama_train": ("<=", 1.0),
    "vs_bridge_cache": ("<=", 0.5),
    "cpu_mfu": (">=", 0.5),
    "activation_store_peak_rss": ("<=", 2048.0),
    "smollm2_forward_vs_hf": ("<=", 1.0),
    "smollm2_decode_vs_hf": ("<=", 1.0),
    "smollm2_cache_vs_bridge": ("<=", 0.5),
    "smollm2_cache_peak_rss": ("<=", 1.1),  # peak at ~100k stored tokens over the peak at ~10k: flat
}

ENGINE = "compiled"  # the engine the decode keys with targets run on both sides


def _time(fn: Callable[[], object], device: str | torch.device = "cpu") -> float:
    """Seconds ``fn`` takes on ``device``. CUDA kernels run asynchronously, so on a CUDA device the
    queue is drained before the clock starts and again before it stops; elsewhere nothing waits."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def _dynamo_events() -> tuple[int, int]:
    """(frames dynamo has tried to compile, times a frame hit the recompile limit and ran eagerly)
    so far in this process (``torch.compiler.reset`` zeroes both)."""
    from torch._dynamo.utils import counters

    limit = sum(n for what, n in counters["unimplemented"].items() if "recompile limit" in what.lower())
    return counters["frames"]["total"], limit


def fresh_compiles() -> None:
    """Forget every compiled graph (the next compiled call compiles again): a key that compiles
    measures as it would alone in a process, and stays under dynamo's recompile limit."""
    torch.compiler.reset()


def measure(sides: dict[str, Callable], reps: int, device: str | torch.device = "cpu") -> tuple[dict[str, list[float]], dict]:
    """Seconds of every side per repetition, the sides interleaved in their order (A B C A B C ...)
    after one warm-up of each (which compiles what the sides compile), and what dynamo did:
    ``compiles_in_reps`` (frames compiled during the timed repetitions: 0 when the warm-up ran the
    same shapes) and ``compile_fallbacks`` (frames that hit the recompile limit and ran eagerly)."""
    if reps < 5:
        raise ValueError(f"reps={reps}: the benchmark wants at least 5 paired repetitions")
    _, limit_before = _dynamo_events()
    for fn in sides.values():
        fn()
    frames_before, _ = _dynamo_events()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(reps):
        gc.collect()
        for name, fn in sides.items():
            times[name].append(_time(fn, device))
    frames_after, limit_after = _dynamo_events()
    return times, {"compiles_in_reps": frames_after - frames_before, "compile_fallbacks": limit_after - limit_before}


def ratio_of(
    times: dict[str, list[float]],
    a: str,
    b: str,
    *,
    what_a: str,
    what_b: str,
    ratio: Callable[[float, float], float] = lambda ta, tb: tb / ta,
    **fields,
) -> dict:
    """The median of ``ratio(t_a, t_b)`` over the repetitions of sides ``a`` and ``b`` of
    ``measure``, its spread (min, max) and each side's median; ``fields`` go to both sides
    (``engine=...``: a pair of values is one per side)."""
    ratios = [ratio(x, y) for x, y in zip(times[a], times[b])]
    sides = []
    for i, (name, what) in enumerate(((a, what_a), (b, what_b))):
        extra = {k: (v[i] if isinstance(v, tuple) else v) for k, v in fields.items()}
        sides.append({"what": what, "median_s": statistics.median(times[name]), **extra})
    return {"ratio": statistics.median(ratios), "spread": [min(ratios), max(ratios)], "a": sides[0], "b": sides[1]}


def paired(
    key: str,
    a: Callable,
    b: Callable,
    *,
    what_a: str,
    what_b: str,
    reps: int = 5,
    ratio: Callable[[float, float], float] = lambda ta, tb: tb / ta,
    note: str = "",
    device: str | torch.device = "cpu",
) -> dict:
    """Time ``a`` and ``b`` interleaved ``reps`` times (after a warm-up of each) on ``device``;
    the entry's ratio is the median of ``ratio(t_a, t_b)`` over the pairs."""
    times, dynamo = measure({"a": a, "b": b}, reps, device)
    r = ratio_of(times, "a", "b", what_a=what_a, what_b=what_b, ratio=ratio)
    return entry(key, r.pop("ratio"), reps=reps, **r, note=note, **dynamo)


def engine_paired(
    key: str,
    a: Callable[[str], Callable],
    b: Callable[[str], Callable],
    *,
    what_a: str,
    what_b: str,
    reps: int,
    b_uses_engine: bool = True,
    ratio: Callable[[float, float], float] = lambda ta, tb: tb / ta,
    note: str = "",
) -> dict:
    """``paired`` with both sides on ``ENGINE`` (``a(engine)``, ``b(engine)`` make the sides), and
    in the same interleave both on the eager engine, whose figure goes under ``eager``. With
    ``b_uses_engine`` False side B is timed once and shared (it decodes with no engine)."""
    fresh_compiles()
    sides = {"a": a(ENGINE), "b": b(ENGINE), "a_eager": a("eager")}
    if b_uses_engine:
        sides["b_eager"] = b("eager")
    times, dynamo = measure(sides, reps)
    b_engine = (ENGINE, "eager") if b_uses_engine else (None, None)
    r = ratio_of(times, "a", "b", what_a=what_a, what_b=what_b, ratio=ratio, engine=(ENGINE, b_engine[0]))
    eager = ratio_of(
        times,
        "a_eager",
        "b_eager" if b_uses_engine else "b",
        what_a=what_a,
        what_b=what_b,
        ratio=ratio,
        engine=("eager", b_engine[1]),
    )
    return entry(key, r.pop("ratio"), reps=reps, engine=ENGINE, **r, eager={"engine": "eager", **eager}, note=note, **dynamo)


def entry(key: str, value: float, **fields) -> dict:
    cmp, target = TARGETS[key]
    met = None if target is None else (value <= target if cmp == "<=" else value >= target)
    return {"key": key, "ratio": value, "target": None if target is None else f"{cmp} {target}", "met": met, **fields}


def skipped(key: str, why: str) -> dict:
    """The entry of a key that was not measured here: no ratio, not judged, and ``why``."""
    cmp, target = TARGETS[key]
    return {"key": key, "ratio": None, "target": None if target is None else f"{cmp} {target}", "met": None, "skipped": why}
