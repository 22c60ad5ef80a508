"""``workbench bench``: speed as ratios of two measurements taken side by side in one process.

Each entry times A and B interleaved (A B A B ...) after one warm-up of each, at least 5 pairs,
and reports both medians, the median of the per-pair ratios, and their spread (min, max). Shared,
noisy machines shift both sides of a pair alike; an absolute time on CPU means little.
"""

from __future__ import annotations

import gc
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
from workbench.runtime.decoding import generate
from workbench.storage.errors import BadInput
from workbench.training.runconfig import make_run_config
from workbench.training.train import FBTStrategy

TARGETS = {  # key: (comparison, target); None = reported only
    "fbt_soft_decode_overhead": ("<=", 1.10),
    "kv_cache_speedup": (">=", 10.0),
    "fbt_k2_train_step": ("<=", 2.2),
    "fbt_k3_train_step": ("<=", 3.3),
    "hd4_train_step": ("<=", 4.6),
    "hd4_dense_train_step": (None, None),
    "hd4_decode_throughput": (">=", 0.85),
    "hook_overhead": ("<=", 1.03),
    "numerics_guard_decode": ("<=", 1.03),
    "store_verify_load": (None, None),
    "vs_hf_llama_train": ("<=", 1.0),
    "vs_bridge_cache": ("<=", 0.5),
    "cpu_mfu": (">=", 0.5),
    "activation_store_peak_rss": ("<=", 2048.0),
}

SIZES = {  # per preset: decode lengths, train batch, store positions
    "debug": {"new_tokens": 32, "kv_tokens": 64, "batch": 4, "seq": 64, "store_positions": 20_000},
    "tiny": {"new_tokens": 128, "kv_tokens": 256, "batch": 8, "seq": 128, "store_positions": 200_000},
    "small": {"new_tokens": 256, "kv_tokens": 512, "batch": 8, "seq": 256, "store_positions": 1_000_000},
}


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
    if reps < 5:
        raise ValueError(f"reps={reps}: the benchmark wants at least 5 paired repetitions")
    a()
    b()
    ta, tb = [], []
    for _ in range(reps):
        gc.collect()
        ta.append(_time(a, device))
        tb.append(_time(b, device))
    ratios = [ratio(x, y) for x, y in zip(ta, tb)]
    return entry(
        key,
        statistics.median(ratios),
        reps=reps,
        spread=[min(ratios), max(ratios)],
        a={"what": what_a, "median_s": statistics.median(ta)},
        b={"what": what_b, "median_s": statistics.median(tb)},
        note=note,
    )


def entry(key: str, value: float, **fields) -> dict:
    cmp, target = TARGETS[key]
    met = None if target is None else (value <= target if cmp == "<=" else value >= target)
    return {"key": key, "ratio": value, "target": None if target is None else f"{cmp} {target}", "met": met, **fields}


# ---- the pieces being timed ----------------------------------------------------------------


def _decode(model, prompt: torch.Tensor, regime: str, new: int, check_numerics: bool = True) -> Callable:
    return lambda: generate(model, prompt, regime=regime, max_new_tokens=new, check_numerics=check_numerics)


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
                paired(
                    "fbt_soft_decode_overhead",
                    _decode(fbt, prompt, "standard", new),
                    _decode(fbt, prompt, "soft", new),
                    what_a=f"standard decode, batch 1, {new} tokens",
                    what_b=f"soft decode, batch 1, {new} tokens",
                    reps=reps,
                )
            )
        if want("kv_cache_speedup"):
            base = build_model("baseline", preset).eval()
            n = sizes["kv_tokens"] - prompt.shape[1]
            results.append(
                paired(
                    "kv_cache_speedup",
                    _decode(base, prompt, "standard", n),
                    lambda: _full_recompute(base, prompt, n),
                    what_a=f"cached greedy decode to {sizes['kv_tokens']} tokens",
                    what_b=f"full recompute per token to {sizes['kv_tokens']} tokens",
                    reps=reps,
                )
            )
        if want("hd4_decode_throughput"):
            base = build_model("baseline", preset).eval()
            hd = _hd_model(preset, 4, dense=False).eval()
            new = sizes["new_tokens"]
            results.append(
                paired(
                    "hd4_decode_throughput",
                    _decode(hd, prompt, "standard", new),
                    _decode(base, prompt, "standard", new),
                    what_a=f"HD n=4 decode, batch 1, {new} tokens",
                    what_b=f"baseline decode, batch 1, {new} tokens",
                    reps=reps,
                    note="tokens/s of HD over tokens/s of the baseline = t_baseline / t_HD",
                )
            )
        if want("numerics_guard_decode"):
            fbt = build_model("fbt", preset).eval()
            new = sizes["new_tokens"]
            results.append(
                paired(
                    "numerics_guard_decode",
                    _decode(fbt, prompt, "soft", new, check_numerics=False),
                    _decode(fbt, prompt, "soft", new),
                    what_a=f"FBT soft decode, no numerics guard, batch 1, {new} tokens",
                    what_b=f"FBT soft decode, guarded (the default), batch 1, {new} tokens",
                    reps=max(reps, 11),
                )
            )
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
