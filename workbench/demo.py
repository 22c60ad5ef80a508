"""The end-to-end demo: build the three architectures, check the core invariants live, decode under
every regime, record per-pass activations and export to Hugging Face. Returns a JSON-able report."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from models import FullBandwidthLM
from workbench.dynamics.feedback import feedback_model
from workbench.runtime.activations import run_with_pass_cache
from workbench.runtime.checkpoint import save_model
from workbench.runtime.config import build_model, make_config
from workbench.runtime.decoding import REGIMES, generate
from workbench.runtime.export import export_hf
from workbench.runtime.tokenizer import CharTokenizer
from workbench.storage.files import write_json
from workbench.storage.outputs import Output, output


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def cache_parity(model, tokens: torch.Tensor, split: int) -> float:
    """Largest logit gap between one full forward and prefill + one-token cached steps (standard)."""
    with torch.no_grad():
        full = model.readout(model.prefill(tokens))
        cache = model.make_cache()
        parts = [model.prefill(tokens[:, :split], cache=cache)]
        parts += [model.step(tokens[:, t : t + 1], cache=cache) for t in range(split, tokens.shape[1])]
    return max_abs(full, model.readout(torch.cat(parts, dim=1)))


def jacobi_residuals(model: FullBandwidthLM, tokens: torch.Tensor, max_passes: int) -> list[list[float]]:
    """Per K, per position: ||h^(K)_t - h_t|| for the exact recurrence h (fp64)."""
    model = model.double()
    with torch.no_grad():
        exact = model.prefill(tokens, regime="fused", passes="exact")
        rows = []
        for k in range(1, max_passes + 1):
            h = model.prefill(tokens, regime="fused", passes=k)
            rows.append((h - exact).norm(dim=-1).amax(dim=0).tolist())
    model.float()
    return rows


def run_demo(out_dir: str | Path, preset: str = "tiny", seed: int = 0, *, overwrite: bool = False) -> dict:
    """The demo's report; its files (``demo.json``, the ``fbt`` run, the ``hf_baseline`` export) go
    into ``out_dir``: a new or empty directory, or a previous demo there, replaced only with
    ``overwrite``."""
    make_config("baseline", preset)  # an unknown preset is named before anything is written
    with output(out_dir, "demo", overwrite=overwrite) as out:
        report = _demo(out, preset, seed)
        out.publish()
    return report


def _demo(staged: Output, preset: str, seed: int) -> dict:
    tok = CharTokenizer()
    gen = torch.Generator().manual_seed(seed)
    report: dict = {"preset": preset, "seed": seed, "note": "untrained weights: generated text is noise"}
    tokens = torch.randint(4, tok.vocab_size, (2, 24), generator=gen)

    models = {
        "baseline": build_model("baseline", preset, seed=seed),
        "fbt": build_model("fbt", preset, seed=seed),
        "hd4": build_model("hd", preset, seed=seed, n_streams=4),
    }
    report["parameters"] = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    report["cache_parity_max_abs"] = {name: cache_parity(m, tokens, 8) for name, m in models.items()}

    fbt = feedback_model(models["fbt"])
    residuals = jacobi_residuals(fbt, tokens[:, :12], 6)
    report["jacobi_max_state_error_by_passes"] = {f"K={k + 1}": [f"{r:.1e}" for r in row] for k, row in enumerate(residuals)}

    _, per_pass = run_with_pass_cache(fbt, tokens, ["blocks.0.hook_resid_pre", "fusion.hook_gate"], passes=3)
    # the passes (1-based) each hook fired in, and one pass's shape: the fusion runs in passes 2..K only
    report["per_pass_shapes"] = {
        name: {"passes": [k + 1 for k in by_pass], "shape": list(next(iter(by_pass.values())).shape)}
        for name, by_pass in per_pass.items()
    }

    prompt = tok.encode("Q: Start with 12. Add 7. What is the result?\nA:")
    started = time.perf_counter()
    report["generations"] = {}
    for regime in REGIMES:
        out = generate(fbt, [prompt], regime=regime, max_new_tokens=24, passes=len(prompt))
        report["generations"][f"fbt/{regime}"] = tok.decode(out.new_tokens[0])
    out = generate(models["hd4"], [prompt], max_new_tokens=24)
    report["generations"]["hd4/standard"] = tok.decode(out.new_tokens[0])
    report["generation_seconds"] = round(time.perf_counter() - started, 3)

    save_model(fbt, staged.staging / "fbt", tok)
    export_dir = export_hf(models["baseline"], staged.staging / "hf_baseline", tok)
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(export_dir).eval()
    with torch.no_grad():
        report["hf_export_max_abs"] = max_abs(models["baseline"](tokens), hf(tokens).logits)
    write_json(staged.staging / "demo.json", report)
    return report
