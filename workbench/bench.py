"""``workbench bench``: speed as ratios of two measurements taken side by side in one process.

Each entry times A and B interleaved (A B A B ...) after one warm-up of each, at least 5 pairs,
and reports both medians, the median of the per-pair ratios, and their spread (min, max). Shared,
noisy machines shift both sides of a pair alike; an absolute time on CPU means little.

Decode entries say which engine (``workbench.runtime.decoding.ENGINES``) each side ran. The decode
keys with targets run ``ENGINE`` (compiled) on both sides and carry the eager engine's figure,
timed in the same interleave, under ``eager``. Every key that compiles starts from an empty
compile cache (``torch.compiler.reset``), so a key measures alike alone (``--only``) or in the
suite; its warm-up compiles, and ``compiles_in_reps`` counts compiles that landed in the timed
repetitions anyway (0 unless shapes changed) and ``compile_fallbacks`` the steps that fell back
to eager code at dynamo's recompile limit.
"""

from __future__ import annotations

import gc
import inspect
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from models import PRESETS, without_hooks
from workbench.runtime.config import build_model
from workbench.runtime.decoding import ENGINES, generate
from workbench.runtime.tokenizer import CharTokenizer
from workbench.storage.errors import BadInput
from workbench.training.runconfig import make_run_config
from workbench.training.train import FBTStrategy

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
}

# SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M) with 9 key/value heads where it has 3: our
# attention has no grouped-query variant yet
SMOLLM2 = dict(d_model=576, n_layers=30, n_heads=9, d_mlp=1536, d_vocab=49152, n_ctx=8192, rope_base=1e5)
# a stand-in of the same kinds at the debug preset (the tests' size), not a SmolLM2 measurement
SMOLLM2_STANDIN = dict(d_model=64, n_layers=2, n_heads=4, d_mlp=176, d_vocab=512, n_ctx=256, rope_base=1e5)

SIZES = {  # per preset: decode lengths, train batch, store positions, and the new keys' sizes
    "debug": {
        "long_context": 64,  # hd4_decode_throughput_b32_ctx2k: cached tokens per row (2k but at debug)
        "long_new": 4,  # ... and decode steps after them
        "new_tokens": 32,
        "kv_tokens": 64,
        "batch": 4,
        "seq": 64,
        "store_positions": 20_000,
        "hf_shape": SMOLLM2_STANDIN,  # vs_hf_generate's model
        "fused_layers": 2,  # fused_projections: layers at the SmolLM2 width (the small width has its 6)
        "fused_steps": 5,  # fused_projections: decode steps per timed call
        "trace_problems": 64,
        "trace_tokens": 32,  # traces_problems_per_s: max_new_tokens (capped by n_ctx - prompt)
    },
    "tiny": {
        "long_context": 2048,  # hd4_decode_throughput_b32_ctx2k: cached tokens per row (2k but at debug)
        "long_new": 16,  # ... and decode steps after them
        "new_tokens": 128,
        "kv_tokens": 256,
        "batch": 8,
        "seq": 128,
        "store_positions": 200_000,
        "hf_shape": SMOLLM2,
        "fused_layers": 4,
        "fused_steps": 20,
        "trace_problems": 128,
        "trace_tokens": 64,
    },
    "small": {
        "long_context": 2048,  # hd4_decode_throughput_b32_ctx2k: cached tokens per row (2k but at debug)
        "long_new": 8,  # ... and decode steps after them
        "new_tokens": 256,
        "kv_tokens": 512,
        "batch": 8,
        "seq": 256,
        "store_positions": 1_000_000,
        "hf_shape": SMOLLM2,
        "fused_layers": 4,
        "fused_steps": 20,
        "trace_problems": 128,
        "trace_tokens": 96,
    },
}

ENGINE = "compiled"  # the engine the decode keys with targets run on both sides
HF_ENGINE = "compiled"  # vs_hf_generate's side: the engine that measurably beats static there (see its note)
DEFAULT_ENGINE = inspect.signature(generate).parameters["engine"].default


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


# ---- the pieces being timed ----------------------------------------------------------------


def _decode(
    model, prompt: torch.Tensor, regime: str, new: int, check_numerics: bool = True, engine: str = DEFAULT_ENGINE
) -> Callable:
    return lambda: generate(model, prompt, regime=regime, max_new_tokens=new, check_numerics=check_numerics, engine=engine)


@torch.no_grad()
def _full_recompute(model, prompt: torch.Tensor, new: int) -> None:
    """Greedy decoding without a cache: every step runs the whole prefix again."""
    ids = prompt
    for _ in range(new):
        nxt = model(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)


def _train_step(model, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], sizes: dict, seed: int = 0) -> Callable:
    """One optimiser step on a fixed random batch: ``loss(x, y)``, backward, AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, 100, (sizes["batch"], sizes["seq"]), generator=g)
    y = torch.randint(4, 100, (sizes["batch"], sizes["seq"]), generator=g)

    def step():
        loss(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


class _FixedPasses(FBTStrategy):
    """The training loop's FBT loss at one fixed pass count (the schedule would mix counts)."""

    def __init__(self, cfg, passes: int):
        super().__init__(cfg)
        self.fixed = passes

    def passes(self, step: int) -> int:
        return self.fixed


def _fbt_train_step(preset: str, sizes: dict, passes: int) -> Callable:
    """The training loop's FBT loss with ``passes`` passes."""
    cfg = make_run_config("fbt", preset, "chain", [f"train.batch_size={sizes['batch']}", f"train.seq_len={sizes['seq']}"])
    model = build_model("fbt", preset)
    strategy = _FixedPasses(cfg, passes)
    return _train_step(model, lambda x, y: strategy.loss(model, x, y, 0, slice(0, sizes["batch"]))[0], sizes)


def _plain_train_step(model, sizes: dict, hf: bool = False) -> Callable:
    """Next-token loss on the batch itself (``hf``: a ``transformers`` model, logits in ``.logits``)."""

    def loss(x, y):
        logits = model(x).logits if hf else model(x)
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())

    return _train_step(model, loss, sizes)


def _synthetic_context(model, batch: int, context: int, new: int):
    """A static cache whose rows hold ``context`` tokens of random keys and values, and a function
    that rewinds it to them. Decode speed depends on how much the cache holds, not on what, and a
    real 2k-token prefill of HD n=4 at batch 32 would take minutes on a CPU."""
    cache = model.make_cache(context + new, static=True)
    g = torch.Generator().manual_seed(0)
    H, dh, n = model.cfg.n_heads, model.cfg.d_head, model.n_streams
    for block, layer in zip(model.blocks, cache.layers):
        cross = block.attn.mode == "cross" and n > 1  # cross-stream: n positions per token; intra: a row per stream
        rows, layer.per_token = (batch, n) if cross else (batch * n, 1)
        layer.k = torch.randn(rows, H, cache.capacity * layer.per_token, dh, generator=g)
        layer.v = torch.randn(rows, H, cache.capacity * layer.per_token, dh, generator=g)
    cache.advance(None, context, batch, torch.device("cpu"))

    def rewind():
        cache.length = context
        for layer in cache.layers:
            layer.length = context * layer.per_token
        cache.advance(None, 0, batch, torch.device("cpu"))  # index, positions and validity at ``context``
        assert cache.valid is not None
        cache.valid[:, context:] = False

    return cache, rewind


def _decode_steps(model, batch: int, context: int, new: int) -> Callable:
    """``new`` greedy static steps of ``batch`` rows after a synthetic ``context``-token cache."""
    cache, rewind = _synthetic_context(model, batch, context, new)
    first = torch.randint(4, 100, (batch, 1), generator=torch.Generator().manual_seed(1))

    def run():
        rewind()
        token = first
        for _ in range(new):
            h = model.step(token, cache=cache)
            token = model.readout(h[:, -model.n_streams :])[:, -1].argmax(-1)[:, None]

    return run


def _hd4_long_context(preset: str, sizes: dict, reps: int) -> dict:
    batch, context, new = 32, sizes["long_context"], sizes["long_new"]
    base = build_model("baseline", preset, n_ctx=context + new).eval()
    hd = build_model("hd", preset, n_streams=4, n_ctx=context + new).eval()
    return paired(
        "hd4_decode_throughput_b32_ctx2k",
        _decode_steps(hd, batch, context, new),
        _decode_steps(base, batch, context, new),
        what_a=f"HD n=4 decode, batch {batch}, {new} steps after {context} cached tokens",
        what_b=f"baseline decode, batch {batch}, {new} steps after {context} cached tokens",
        reps=reps,
        note="tokens/s of HD over the baseline = t_baseline / t_HD (static engine, one cross-stream block); "
        "the cache holds random keys and values",
    )


def _ragged_batch(preset: str, batch: int, reps: int) -> dict:
    """Trace-study-shaped decoding: ``batch`` ragged prompts (8..64 tokens, left-padded), FBT soft,
    64 new tokens: the static engine over the eager (growing-cache) one."""
    fbt = build_model("fbt", preset).eval()
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(4, 100, (int(n),), generator=g).tolist() for n in torch.randint(8, 65, (batch,), generator=g)]
    new = 64
    e = paired(
        f"ragged_batch{batch}_decode",
        lambda: generate(fbt, prompts, regime="soft", max_new_tokens=new, engine="eager"),
        lambda: generate(fbt, prompts, regime="soft", max_new_tokens=new, engine="static"),
        what_a=f"eager engine, FBT soft, batch {batch} ragged prompts (8-64 tokens), {new} tokens",
        what_b="static engine, same prompts",
        reps=reps,
        ratio=lambda ta, tb: ta / tb,
        note="tokens/s of the static engine over the eager one = t_eager / t_static",
    )
    e["tokens_per_s"] = {side: batch * new / e[k]["median_s"] for side, k in (("eager", "a"), ("static", "b"))}
    return e


def _hd_model(preset: str, n: int, dense: bool, seed: int = 0):
    n_layers = PRESETS[preset]["n_layers"]
    return build_model("hd", preset, seed=seed, n_streams=n, cross_layers=tuple(range(n_layers)) if dense else None)


def train_flops_per_token(model, seq: int) -> float:
    """Training FLOPs per token by the PaLM convention (Chowdhery et al. 2022, appendix B; the
    same 6N as Kaplan et al. and Chinchilla): 6 N for the parameter matmuls (forward 2N, backward
    4N) plus 12 L H Q T for attention (QK^T and attention-times-V, 2 * 2 * T * H * Q FLOPs per
    token per layer forward, tripled for the backward), with H Q = d_model and T = ``seq``; the
    causal mask's saving is not subtracted. N counts every parameter once: the tied embedding is
    the readout matmul, the RMSNorm gains a rounding error."""
    n = sum(p.numel() for p in model.parameters())
    return 6 * n + 12 * model.cfg.n_layers * model.cfg.d_model * seq


def matmul_flops(size: int = 1024) -> tuple[Callable, float]:
    a, b = torch.randn(size, size), torch.randn(size, size)
    return (lambda: a @ b), 2.0 * size**3


# ---- the suite -----------------------------------------------------------------------------


def run_bench(
    preset: str = "small",
    *,
    reps: int = 5,
    only: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    store_positions: int | None = None,
) -> dict:
    if preset not in SIZES:
        raise BadInput(f"unknown bench preset {preset!r}: expected one of {sorted(SIZES)}")
    if not 5 <= reps <= 1000:
        raise BadInput(f"reps={reps}: the benchmark wants 5..1000 paired repetitions")
    if store_positions is not None and not 1000 <= store_positions <= 10_000_000:
        raise BadInput(f"store_positions={store_positions}: expected 1,000..10,000,000")
    unknown = set(only or []) - set(TARGETS)
    if unknown:
        raise BadInput(f"unknown bench keys {sorted(unknown)}: expected some of {sorted(TARGETS)}")
    sizes = SIZES[preset]
    say = progress or (lambda key: None)
    torch.manual_seed(0)
    prompt = torch.randint(4, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    results = []

    def want(key):
        if only and key not in only:
            return False
        say(key)
        return True

    with torch.no_grad():
        if want("fbt_soft_decode_overhead"):
            fbt = build_model("fbt", preset).eval()
            new = sizes["new_tokens"]
            results.append(
                engine_paired(
                    "fbt_soft_decode_overhead",
                    lambda engine: _decode(fbt, prompt, "standard", new, engine=engine),
                    lambda engine: _decode(fbt, prompt, "soft", new, engine=engine),
                    what_a=f"standard decode, batch 1, {new} tokens",
                    what_b=f"soft decode, batch 1, {new} tokens",
                    reps=reps,
                )
            )
        if want("kv_cache_speedup"):
            base = build_model("baseline", preset).eval()
            n = sizes["kv_tokens"] - prompt.shape[1]
            results.append(
                engine_paired(
                    "kv_cache_speedup",
                    lambda engine: _decode(base, prompt, "standard", n, engine=engine),
                    lambda engine: lambda: _full_recompute(base, prompt, n),
                    what_a=f"cached greedy decode to {sizes['kv_tokens']} tokens",
                    what_b=f"full recompute per token to {sizes['kv_tokens']} tokens (no cache, no engine)",
                    reps=reps,
                    b_uses_engine=False,
                )
            )
        if want("hd4_decode_throughput"):
            base = build_model("baseline", preset).eval()
            hd = _hd_model(preset, 4, dense=False).eval()
            new = sizes["new_tokens"]
            results.append(
                engine_paired(
                    "hd4_decode_throughput",
                    lambda engine: _decode(hd, prompt, "standard", new, engine=engine),
                    lambda engine: _decode(base, prompt, "standard", new, engine=engine),
                    what_a=f"HD n=4 decode, batch 1, {new} tokens",
                    what_b=f"baseline decode, batch 1, {new} tokens",
                    reps=reps,
                    note="tokens/s of HD over tokens/s of the baseline = t_baseline / t_HD",
                )
            )
        if want("compiled_decode_speedup"):
            results.append(_compiled_speedup(preset, prompt, sizes["new_tokens"], reps))
        if want("numerics_guard_decode"):
            fbt = build_model("fbt", preset).eval()
            new = sizes["new_tokens"]
            e = paired(
                "numerics_guard_decode",
                _decode(fbt, prompt, "soft", new, check_numerics=False),
                _decode(fbt, prompt, "soft", new),
                what_a=f"FBT soft decode, no numerics guard, batch 1, {new} tokens",
                what_b=f"FBT soft decode, guarded (the default), batch 1, {new} tokens",
                reps=max(reps, 11),
            )
            e["engine"] = e["a"]["engine"] = e["b"]["engine"] = DEFAULT_ENGINE  # generate's default
            results.append(e)
        if want("hook_overhead"):
            base = build_model("baseline", preset).eval()
            bare = without_hooks(base)
            x = torch.randint(4, 100, (sizes["batch"], sizes["seq"]), generator=torch.Generator().manual_seed(1))
            results.append(
                paired(
                    "hook_overhead",
                    lambda: bare(x),
                    lambda: base(x),
                    what_a="forward, hook points removed",
                    what_b="forward, hook points present, none attached",
                    reps=max(reps, 11),
                )
            )
        if want("vs_bridge_cache"):
            results.append(_vs_bridge(preset, sizes, reps))
        if want("hd4_decode_throughput_b32_ctx2k"):
            results.append(_hd4_long_context(preset, sizes, reps))
        for batch in (32, 64):
            if want(f"ragged_batch{batch}_decode"):
                results.append(_ragged_batch(preset, batch, reps))
        if want("vs_hf_generate"):
            results.append(vs_hf_generate(reps, shape=sizes["hf_shape"]))
        if want("fused_projections"):
            results.append(_fused_projections(sizes, reps))
        if want("traces_problems_per_s"):
            results.append(_traces_throughput(preset, sizes, reps))

    for K, key in [(2, "fbt_k2_train_step"), (3, "fbt_k3_train_step")]:
        if want(key):
            one, k = _fbt_train_step(preset, sizes, 1), _fbt_train_step(preset, sizes, K)
            results.append(paired(key, one, k, what_a="FBT 1-pass train step", what_b=f"FBT {K}-pass train step", reps=reps))
    for dense, key in [(False, "hd4_train_step"), (True, "hd4_dense_train_step")]:
        if want(key):
            base = _plain_train_step(build_model("baseline", preset), sizes)
            hd = _plain_train_step(_hd_model(preset, 4, dense=dense), sizes)
            results.append(
                paired(
                    key,
                    base,
                    hd,
                    what_a="baseline train step",
                    what_b=f"HD n=4 train step ({'cross-stream attention in every block' if dense else 'one cross-stream block'})",
                    reps=reps,
                )
            )
    if want("vs_hf_llama_train"):
        results.append(_vs_hf(preset, sizes, reps))
    if want("cpu_mfu"):
        model = build_model("baseline", preset)
        step = _plain_train_step(model, sizes)
        mm, mm_flops = matmul_flops()
        flops = train_flops_per_token(model, sizes["seq"]) * sizes["batch"] * sizes["seq"]

        def mfu(t_mm, t_step):
            return (flops / t_step) / (mm_flops / t_mm)

        e = paired(
            "cpu_mfu",
            mm,
            step,
            what_a="1024x1024 fp32 matmul",
            what_b="baseline train step",
            reps=reps,
            ratio=mfu,
            note=f"{flops / 1e9:.2f} GFLOP per step (PaLM: 6N + 12 n_layers d_model seq per token)",
        )
        e["achieved_gflops"] = flops / e["b"]["median_s"] / 1e9
        e["matmul_gflops"] = mm_flops / e["a"]["median_s"] / 1e9
        results.append(e)
    if want("store_verify_load"):
        results.append(_store_verify(preset, (store_positions or sizes["store_positions"]) // 10, reps))
    if want("activation_store_peak_rss"):
        results.append(_store_rss(preset, store_positions or sizes["store_positions"]))
    return {"preset": preset, "reps": reps, "machine": machine(), "entries": results}


def _compiled_speedup(preset: str, prompt: torch.Tensor, new: int, reps: int) -> dict:
    """Tokens/s of the compiled engine over the eager one (= t_eager / t_compiled) on the preset's
    baseline, batch 1; the static engine (``generate``'s default) timed in the same interleave."""
    base = build_model("baseline", preset).eval()
    fresh_compiles()
    times, dynamo = measure({engine: _decode(base, prompt, "standard", new, engine=engine) for engine in ENGINES}, reps)
    what = f"baseline greedy decode, batch 1, {prompt.shape[1]}-token prompt, {new} tokens"

    def faster(ta, tb):
        return ta / tb

    r = ratio_of(times, "eager", "compiled", what_a=what, what_b=what, ratio=faster, engine=("eager", "compiled"))
    static = ratio_of(times, "eager", "static", what_a=what, what_b=what, ratio=faster, engine=("eager", "static"))
    return entry(
        "compiled_decode_speedup",
        r.pop("ratio"),
        reps=reps,
        engine="compiled",
        **r,
        static={"engine": "static", **static},
        note="tokens/s compiled over tokens/s eager = t_eager / t_compiled; 'static' is t_eager / t_static",
        **dynamo,
    )


def vs_hf_generate(
    reps: int,
    *,
    shape: dict = SMOLLM2,
    prompt_len: int = 16,
    new: int = 32,
    engine: str = HF_ENGINE,
    also: tuple[str, ...] = ("static",),
) -> dict:
    """Our cached greedy decode (``engine``) against ``transformers``' ``LlamaForCausalLM.generate``
    (greedy, its own dynamic cache, eos disabled so both make exactly ``new`` tokens) on the same
    weights (``export_hf``), batch 1; ratio = t_hf / t_ours (our tokens/s over theirs). The engines
    in ``also`` are timed in the same interleave and reported beside it. ``same_tokens``: one call
    of each made the same tokens."""
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from workbench.runtime.export import export_hf

    ours = build_model("baseline", "debug", **shape).eval()
    ids = torch.randint(4, 100, (1, prompt_len), generator=torch.Generator().manual_seed(3))
    progress = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            hf = LlamaForCausalLM.from_pretrained(export_hf(ours, tmp), attn_implementation="sdpa").eval()
    finally:
        if progress:
            hf_logging.enable_progress_bar()
    hf.generation_config.eos_token_id = None  # the random model may emit the tokenizer's <eos>
    hf.generation_config.pad_token_id = CharTokenizer().pad_id
    mask = torch.ones_like(ids)

    def theirs():
        return hf.generate(  # pyright: ignore[reportAttributeAccessIssue]  (GenerationMixin, untyped)
            ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True
        )

    fresh_compiles()
    sides = {"hf": theirs, **{e: _decode(ours, ids, "standard", new, engine=e) for e in (engine, *also)}}
    with torch.no_grad():
        hf_tokens = theirs()[0, prompt_len:]
    our_tokens = sides[engine]().new_tokens[0]
    same = hf_tokens.shape == our_tokens.shape and bool(torch.equal(hf_tokens, our_tokens))
    times, dynamo = measure(sides, reps)
    what_hf = f"transformers LlamaForCausalLM.generate, greedy, use_cache, batch 1, {prompt_len}-token prompt, {new} tokens"
    what_ours = f"our generate, greedy, batch 1, {prompt_len}-token prompt, {new} tokens"

    def faster(ta, tb):
        return ta / tb

    r = ratio_of(times, "hf", engine, what_a=what_hf, what_b=what_ours, ratio=faster, engine=("transformers", engine))
    others = {
        e: {"engine": e, **ratio_of(times, "hf", e, what_a=what_hf, what_b=what_ours, ratio=faster, engine=("transformers", e))}
        for e in also
    }
    n_params = sum(p.numel() for p in ours.parameters())
    return entry(
        "vs_hf_generate",
        r.pop("ratio"),
        reps=reps,
        engine=engine,
        **r,
        **others,
        same_tokens=same,
        tokens=new,
        shape=dict(shape),
        params_m=round(n_params / 1e6, 1),
        note=(
            f"tokens/s ours ({engine} engine) over transformers' = t_hf / t_ours; random init, "
            + ("SmolLM2-135M's shape" if shape == SMOLLM2 else "a small stand-in shape (not SmolLM2's)")
            + " with n_heads key/value heads: SmolLM2 has 3 (grouped-query attention, which our attention does not"
            f" have yet), so this model holds more key/value weights ({n_params / 1e6:.0f}M parameters where SmolLM2"
            f" has 135M); the bench's engine here is {HF_ENGINE}, the one that measurably beat transformers at"
            " SmolLM2's shape (tiny-preset run, one CPU thread, 32 tokens: compiled 1.90 s, static 2.21 s,"
            " transformers 2.19 s; eager is level with static); the other engines' figures are beside it; a"
            " compile (~1 min at 30 layers) is in the warm-up"
        ),
        **dynamo,
    )


def _linear(first: torch.Tensor, *more: torch.Tensor) -> torch.nn.Linear:
    """A bias-free Linear whose weight is the weights stacked along the output dimension (a copy)."""
    w = torch.cat((first, *more)) if more else first
    out = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    out.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    return out


class ProjectionLayer(torch.nn.Module):
    """The matmuls of one Llama block at one decode step, alone: Q, K, V (one Linear [d_model ->
    3 d_model] when ``fused``), O, gate and up (one Linear [d_model -> 2 d_mlp] when ``fused``)
    and down, with an elementwise stand-in (``q * k + v``) for attention and the SwiGLU product
    between them. Built from separate weights ``w``, so a fused and a separate layer of the same
    weights compute the same outputs."""

    def __init__(self, w: dict[str, torch.Tensor], fused: bool):
        super().__init__()
        self.fused = fused
        if fused:
            self.qkv = _linear(w["q"], w["k"], w["v"])
            self.gate_up = _linear(w["gate"], w["up"])
        else:
            self.q, self.k, self.v = _linear(w["q"]), _linear(w["k"]), _linear(w["v"])
            self.gate, self.up = _linear(w["gate"]), _linear(w["up"])
        self.o, self.down = _linear(w["o"]), _linear(w["down"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        x = x + self.o(q * k + v)
        if self.fused:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate(x), self.up(x)
        return x + self.down(torch.nn.functional.silu(gate) * up)


class ProjectionStack(torch.nn.Sequential):
    """``ProjectionLayer``s of one weight dict each: one decode step's matmuls of a block stack."""

    def __init__(self, layers: list[dict[str, torch.Tensor]], fused: bool):
        super().__init__(*(ProjectionLayer(w, fused) for w in layers))


def projection_stacks(d_model: int, d_mlp: int, n_layers: int, seed: int = 0) -> tuple[ProjectionStack, ProjectionStack]:
    """(separate, fused) ``ProjectionStack``s of the same random weights, distinct per layer (so a
    step streams every layer's weights from memory, as a real model's does)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"q": (d_model, d_model), "k": (d_model, d_model), "v": (d_model, d_model), "o": (d_model, d_model)}
    shapes |= {"gate": (d_mlp, d_model), "up": (d_mlp, d_model), "down": (d_model, d_mlp)}
    layers = [{name: torch.randn(*shape, generator=g) * 0.02 for name, shape in shapes.items()} for _ in range(n_layers)]
    return ProjectionStack(layers, fused=False), ProjectionStack(layers, fused=True)


def _fused_projections(sizes: dict, reps: int) -> dict:
    """Fused over separate projections (time ratio: below 1 = fusing helps) for one decode step at
    batch 1, eager and compiled, at the small preset's width and SmolLM2's; headline: small width,
    compiled. Reported only: whether fusing is worth a checkpoint-format change."""
    small = PRESETS["small"]
    widths = {
        "small": (small["d_model"], small["d_mlp"], small["n_layers"]),
        "smollm2": (SMOLLM2["d_model"], SMOLLM2["d_mlp"], sizes["fused_layers"]),
    }
    steps = sizes["fused_steps"]
    by_width: dict[str, dict] = {}
    dynamo = {"compiles_in_reps": 0, "compile_fallbacks": 0}
    fresh_compiles()
    for name, (d_model, d_mlp, n_layers) in widths.items():
        separate, fused = projection_stacks(d_model, d_mlp, n_layers)
        x = torch.randn(1, 1, d_model, generator=torch.Generator().manual_seed(4))  # one token's residual
        runs = {"eager": (separate, fused), "compiled": (torch.compile(separate), torch.compile(fused))}

        def steps_of(stack, x=x):
            def run():
                for _ in range(steps):
                    stack(x)

            return run

        sides = {
            f"{mode}/{kind}": steps_of(stack) for mode, pair in runs.items() for kind, stack in zip(("separate", "fused"), pair)
        }
        times, d = measure(sides, reps)
        dynamo = {k: dynamo[k] + d[k] for k in dynamo}
        what = f"d_model {d_model}, d_mlp {d_mlp}, {n_layers} layers, batch 1, {steps} steps per call"
        for mode in runs:
            r = ratio_of(
                times,
                f"{mode}/separate",
                f"{mode}/fused",
                what_a=f"separate Q, K, V, gate, up ({mode}): {what}",
                what_b=f"fused QKV and gate-up ({mode}): {what}",
                mode=mode,
            )
            r["a"]["per_step_us"] = r["a"]["median_s"] / steps * 1e6
            r["b"]["per_step_us"] = r["b"]["median_s"] / steps * 1e6
            by_width[f"{name}/{mode}"] = r
    head = dict(by_width["small/compiled"])
    return entry(
        "fused_projections",
        head.pop("ratio"),
        reps=reps,
        **head,
        by_width=by_width,
        note="time fused / time separate for the projections of one decode step (below 1: fusing helps); "
        "headline: the small width, compiled; reported only (no model change)",
        **dynamo,
    )


def eos_at_varying_steps(
    model, examples: list, tokenizer: CharTokenizer, *, regime: str, max_new_tokens: int, batch_size: int = 64
):
    """Make a random ``model`` stop at varying steps, as a trained one does: decode every problem
    greedily (``regime``, eager engine, no eos, batched as ``run_traces`` batches), then, among the
    ids that no prompt holds (pad and eos excluded), take the one whose first greedy occurrence
    step over the problems has the largest standard deviation (a row that never emits it counts as
    its row's budget; ties go to the smallest id), and swap its embedding row with <eos>'s. The
    embedding is the tied readout, so the model then decodes exactly as before with the two ids
    exchanged: it emits <eos> where it emitted that id. In place; returns the id."""
    prompts = [tokenizer.encode(ex.prompt) for ex in examples]
    in_prompts = {t for p in prompts for t in p}
    candidates = [t for t in range(model.cfg.d_vocab) if t not in in_prompts and t not in (tokenizer.pad_id, tokenizer.eos_id)]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    first = torch.empty(len(prompts), len(candidates), dtype=torch.long)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        budget = min(max_new_tokens, model.cfg.n_ctx - max(len(prompts[i]) for i in idx))
        out = generate(
            model, [prompts[i] for i in idx], regime=regime, max_new_tokens=budget, pad_token_id=tokenizer.pad_id, engine="eager"
        ).new_tokens
        hit = out[:, :, None] == torch.tensor(candidates)[None, None]  # [rows, steps, candidates]
        # tokens generated up to and including the first occurrence; the budget when there is none
        first[idx] = torch.where(hit.any(1), hit.long().argmax(1) + 1, torch.tensor(budget))
    spread = first.double().std(0, unbiased=False)
    chosen = candidates[int(torch.argmax(spread))]  # the first maximum: the smallest id
    with torch.no_grad():
        W = model.embed.W_E
        W[[tokenizer.eos_id, chosen]] = W[[chosen, tokenizer.eos_id]].clone()
    return chosen


def _traces_throughput(preset: str, sizes: dict, reps: int) -> dict:
    """Problems/s of the trace study (``run_traces``, FBT ``soft``, batch 64) new over old: old = the
    eager engine with finished rows kept in the batch, new = ``run_traces``' default engine with
    finished rows dropped (``compact``). The preset's FBT model stops at varying steps by
    ``eos_at_varying_steps``."""
    from workbench.studies.traces import problems, run_traces

    params = inspect.signature(run_traces).parameters
    if "engine" not in params or "compact" not in params:
        raise RuntimeError("traces_problems_per_s needs run_traces(..., engine=..., compact=...), which this tree lacks")
    default_engine = params["engine"].default
    tokenizer = CharTokenizer()
    examples = problems("chain", sizes["trace_problems"], [1, 2, 3, 4], 0)
    budget, batch = sizes["trace_tokens"], 64
    model = build_model("fbt", preset).eval()
    eos_id = eos_at_varying_steps(model, examples, tokenizer, regime="soft", max_new_tokens=budget, batch_size=batch)

    def study(**how):
        return lambda: run_traces(model, examples, "soft", 1, tokenizer, max_new_tokens=budget, batch_size=batch, **how)

    old, new = study(engine="eager", compact=False), study(compact=True)
    fresh_compiles()
    rows_old, rows_new = old(), new()
    same = [(r["total_tokens"], r["text"]) for r in rows_old] == [(r["total_tokens"], r["text"]) for r in rows_new]
    finished = sum(r["finished"] for r in rows_old)
    n = len(examples)
    e = paired(
        "traces_problems_per_s",
        old,
        new,
        what_a=f"run_traces, FBT soft, {n} chain problems, batch {batch}, engine eager, compact=False",
        what_b=f"run_traces, FBT soft, {n} chain problems, batch {batch}, engine {default_engine} (default), compact=True",
        reps=reps,
        ratio=lambda ta, tb: ta / tb,
        note="problems/s new over old = t_old / t_new",
    )
    e["a"].update(engine="eager", compact=False, problems_per_s=n / e["a"]["median_s"])
    e["b"].update(engine=default_engine, compact=True, problems_per_s=n / e["b"]["median_s"])
    e.update(
        engine=default_engine,
        problems=n,
        max_new_tokens=budget,
        eos_stand_in=eos_id,
        finished=finished,
        mean_generated_tokens=sum(r["total_tokens"] for r in rows_old) / n,
        same_rows=same,
    )
    return e


def _vs_hf(preset: str, sizes: dict, reps: int) -> dict:
    from transformers import LlamaForCausalLM

    from workbench.runtime.export import export_hf

    ours = build_model("baseline", preset)
    with tempfile.TemporaryDirectory() as tmp:
        hf = LlamaForCausalLM.from_pretrained(export_hf(ours, tmp), attn_implementation="sdpa")
    return paired(
        "vs_hf_llama_train",
        _plain_train_step(hf, sizes, hf=True),
        _plain_train_step(ours, sizes),
        what_a="transformers LlamaForCausalLM forward+backward+AdamW",
        what_b="our baseline forward+backward+AdamW",
        reps=reps,
    )


def _vs_bridge(preset: str, sizes: dict, reps: int) -> dict:
    from transformer_lens.model_bridge import TransformerBridge

    from workbench.runtime.export import export_hf

    ours = build_model("baseline", preset).eval()
    x = torch.randint(4, 100, (sizes["batch"], sizes["seq"]), generator=torch.Generator().manual_seed(2))
    with tempfile.TemporaryDirectory() as tmp:
        bridge = TransformerBridge.boot_transformers(str(export_hf(ours, tmp)), device="cpu")
    return paired(
        "vs_bridge_cache",
        lambda: bridge.run_with_cache(x),
        lambda: ours.run_with_cache(x),
        what_a="TransformerBridge.run_with_cache (all hooks)",
        what_b="our run_with_cache (all hooks)",
        reps=reps,
    )


def _store_rss(preset: str, positions: int) -> dict:
    """Peak resident memory of a separate ``workbench cache`` process storing ``positions``
    positions of a ``preset`` baseline (modsum sequences)."""
    with tempfile.TemporaryDirectory() as tmp:
        # modsum examples are ~14 tokens long; ask for enough sequences, the store reports the exact count
        n_seq = max(1, positions // 14)
        cmd = [
            sys.executable,
            "-m",
            "workbench.cli",
            "cache",
            f"baseline:{preset}",
            "--hooks",
            "blocks.0.hook_resid_pre",
            "--task",
            "modsum",
            "--n-sequences",
            str(n_seq),
            "--out",
            str(Path(tmp) / "store"),
            "--json",
            str(Path(tmp) / "meta.json"),
        ]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        meta = json.loads((Path(tmp) / "meta.json").read_text())
    return entry(
        "activation_store_peak_rss",
        meta["peak_rss_mib"],
        unit="MiB",
        positions=meta["n_rows"],
        seconds=meta.get("seconds"),
        note="peak RSS of the whole caching process (model, datasets/Arrow writer and Python included)",
    )


def _store_verify(preset: str, positions: int, reps: int) -> dict:
    """``load_store`` with every check (CRC32s, finiteness) over the default cheap checks only, on
    a store of about ``positions`` positions of one ``d_model`` hook written here."""
    from workbench.data.tasks import synthetic_examples
    from workbench.probing.store import cache_activations, load_store

    with tempfile.TemporaryDirectory() as tmp:
        store = cache_activations(
            build_model("fbt", preset),
            synthetic_examples("modsum", max(1, positions // 14), 0),
            ["blocks.0.hook_resid_pre"],
            Path(tmp) / "store",
        )
        size = sum(p.stat().st_size for p in store.iterdir())
        e = paired(
            "store_verify_load",
            lambda: load_store(store, verify=False),
            lambda: load_store(store, verify=True),
            what_a="load_store(verify=False): names, sizes, row counts, columns",
            what_b="load_store(verify=True): also CRC32s and finiteness",
            reps=reps,
        )
    e["store_mib"] = round(size / 2**20, 1)
    return e


def machine() -> dict:
    import os

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "self_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
