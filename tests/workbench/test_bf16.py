"""bf16 inference: the same model in bfloat16 gives fp32's logits and activations
within bf16's round-off, decodes under the numerics guard, and the activation store says which
dtype made it. On the CPU (torch has bf16 matmuls there), against the fp32 model as reference."""

import json

import numpy as np
import pytest
import torch
from helpers import tokens

from workbench import build_model, generate

ARCHS = ["baseline", "fbt", "hd"]


def _pair(arch):
    model = build_model(arch, "debug", seed=3)
    half = build_model(arch, "debug", seed=3, dtype=torch.bfloat16)
    return model, half


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_logits_are_fp32_logits_within_round_off(arch):
    """bf16 keeps 8 bits of mantissa (a relative step of 2^-8 = 0.4%); through two blocks the
    logits stay within 5% of their spread of fp32's, and every position whose fp32 top-1 leads by
    more than that keeps its top-1."""
    model, half = _pair(arch)
    x = tokens(4, 24, seed=1)
    with torch.no_grad():
        ref = model(x)
        got = half(x)
    assert got.dtype == torch.bfloat16
    scale = float(ref.std())
    err = (got.float() - ref).abs()
    assert float(err.max()) < 0.05 * scale, (float(err.max()), scale)
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * float(err.max())
    assert clear.float().mean() > 0.5  # the check below has positions to look at
    assert torch.equal(got.float().argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.parametrize("arch", ARCHS)
def test_run_with_cache_in_bf16_records_bf16_activations_close_to_fp32(arch):
    model, half = _pair(arch)
    x = tokens(2, 16, seed=2)
    name = "blocks.1.hook_resid_post"
    with torch.no_grad():
        _, ref = model.run_with_cache(x, names_filter=name)
        _, got = half.run_with_cache(x, names_filter=name)
    assert got[name].dtype == torch.bfloat16
    scale = float(ref[name].std())
    assert float((got[name].float() - ref[name]).abs().max()) < 0.05 * scale


@pytest.mark.parametrize("arch,regime", [("baseline", "standard"), ("fbt", "soft"), ("fbt", "fused"), ("hd", "standard")])
def test_bf16_decodes_under_the_numerics_guard(arch, regime):
    """No false alarm from the guard (its norms work in fp32), and the states come back in bf16."""
    _, half = _pair(arch)
    out = generate(half, tokens(3, 6, seed=4), regime=regime, passes=2, max_new_tokens=8, engine="static")
    assert out.states.dtype == torch.bfloat16 and out.new_tokens.shape == (3, 8)
    assert torch.isfinite(out.states.float()).all()


def test_the_store_records_the_dtype_that_made_it(tmp_path):
    from workbench.cli import main
    from workbench.probing.store import load_store

    stores = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path / dtype
        main(["cache", "fbt:debug:3", "--hooks", "blocks.0.hook_resid_post", "--task", "modsum", "--n", "6",
              "--out", str(out), "--dtype", dtype])  # fmt: skip
        meta = json.loads((out / "store.json").read_text())
        assert meta["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[dtype]
        ds, stored = load_store(out)
        assert stored["dtype"] == meta["dtype"]
        stores[dtype] = torch.from_numpy(np.stack(ds.with_format("numpy")["act.blocks.0.hook_resid_post"]))
    ref, got = stores["fp32"], stores["bf16"]
    assert got.shape == ref.shape
    assert float((got - ref).abs().max()) < 0.05 * float(ref.std())
