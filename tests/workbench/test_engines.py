"""The decoding engines agree: a growing cache (``eager``, the reference), fixed-shape steps on a
static cache (``static``) and those steps through ``torch.compile`` (``compiled``) give equal greedy
tokens and states within round-off, for every architecture and regime, with ragged (left-padded)
batches; the static cache holds exactly what the growing one holds."""

import copy
import json

import pytest
import torch
from helpers import tokens

from workbench import ActivationRecorder, build_model, generate
from workbench.runtime.decoding import NonFinite, score_completions

# (arch, regime, passes, overrides): every regime, HD with a windowed cross-stream layer (the
# window is shorter than the sequence, so its mask matters) and interleaved rotary positions
CASES = [
    ("baseline", "standard", 1, {}),
    ("fbt", "standard", 1, {}),
    ("fbt", "soft", 1, {}),
    ("fbt", "fused", 2, {}),
    ("fbt", "fused", "exact", {}),
    ("hd", "standard", 1, {"n_streams": 3, "cross_window": 5}),
    ("hd", "standard", 1, {"n_streams": 2, "positions": "interleaved", "cross_layers": (0, 1)}),
    # grouped-query attention (and an untied readout): the caches hold n_kv_heads heads
    ("baseline", "standard", 1, {"n_kv_heads": 2, "tie_embeddings": False}),
    ("fbt", "soft", 1, {"n_kv_heads": 1}),
    ("hd", "standard", 1, {"n_streams": 2, "n_kv_heads": 2, "cross_window": 5}),
    # KV-Mirror: a source layer, then an intra-stream and a windowed cross-stream layer of the last stream only
    ("hd", "standard", 1, {"n_streams": 3, "n_layers": 4, "cross_layers": (0, 3), "cross_window": 5, "kv_mirror": 2}),
]
IDS = [f"{a}-{r}-{p}-{'-'.join(map(str, o))}" for a, r, p, o in CASES]
NEW = 10


def _prompts():
    rows = tokens(3, 9, seed=7).tolist()
    return [rows[0][:9], rows[1][:3], rows[2][:6]]  # ragged: rows 1 and 2 are left-padded


def _assert_same(a, b):
    """Equal tokens; states within round-off over the first ``NEW`` steps, and within ten times
    that over a longer generation, where soft decoding feeds each step's round-off back."""
    assert a.new_tokens.tolist() == b.new_tokens.tolist()
    torch.testing.assert_close(a.states[:, :NEW], b.states[:, :NEW], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.states, b.states, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch,regime,passes,overrides", CASES, ids=IDS)
def test_static_engine_equals_eager(arch, regime, passes, overrides):
    model = build_model(arch, "debug", **overrides)
    for prompts in (_prompts(), tokens(2, 5)):  # padded and unpadded batches
        ref = generate(model, prompts, regime=regime, passes=passes, max_new_tokens=NEW, engine="eager")
        _assert_same(generate(model, prompts, regime=regime, passes=passes, max_new_tokens=NEW, engine="static"), ref)


@pytest.mark.parametrize("arch,regime,passes,overrides", CASES[:1] + CASES[2:3] + CASES[5:6], ids=IDS[:1] + IDS[2:3] + IDS[5:6])
def test_static_cache_holds_what_the_growing_cache_holds(arch, regime, passes, overrides):
    model = build_model(arch, "debug", **overrides).eval()
    toks = tokens(3, 7, seed=1)
    mask = torch.ones_like(toks, dtype=torch.bool)
    mask[1, :2] = False
    caches = {}
    with torch.no_grad():
        for static in (False, True):
            cache = model.make_cache(16, static=static)
            model.prefill(toks, regime=regime, cache=cache, attention_mask=mask)
            for t in tokens(3, 5, seed=2).T:
                model.step(t[:, None], regime=regime, cache=cache)
            caches[static] = cache
    dyn, st = caches[False], caches[True]
    assert dyn.length == st.length == 12
    for a, b in zip(dyn.layers, st.layers):
        assert a.length == b.length
        torch.testing.assert_close(b.k[:, :, : b.length], a.k[:, :, : a.length], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(b.v[:, :, : b.length], a.v[:, :, : a.length], atol=1e-6, rtol=1e-6)
        assert not b.k[:, :, b.length :].any()  # nothing written past the cached tokens
    assert torch.equal(st.key_valid, dyn.key_valid) and torch.equal(st.n_valid, dyn.n_valid)
    assert not st.valid[:, 12:].any()
    if regime != "standard":
        torch.testing.assert_close(st.state, dyn.state, atol=1e-6, rtol=1e-6)


def test_static_steps_after_a_slide_equal_the_growing_cache():
    """A rollout's sliding window on a static cache: the same keys, positions and states."""
    model = build_model("fbt", "debug").eval()
    states = {}
    with torch.no_grad():
        for static in (False, True):
            cache = model.make_cache(12, static=static)
            h = model.prefill(tokens(2, 10), regime="soft", cache=cache)
            out = []
            for t in tokens(2, 8, seed=3).T:
                if cache.length == cache.capacity:
                    cache.slide(6)
                h = model.step(t[:, None], regime="soft", cache=cache)
                out.append(h)
            states[static] = torch.cat(out, dim=1)
    torch.testing.assert_close(states[True], states[False], atol=1e-5, rtol=1e-5)


def test_the_static_step_projects_with_the_weights_as_they_are_now():
    """The fixed-shape step's stacked q/k/v and gate/up weights follow the layers' own: weights
    edited in place or replaced after a generation decode the next one as eager does."""
    model = build_model("hd", "debug", n_streams=2, n_kv_heads=2)
    before = generate(model, _prompts(), max_new_tokens=NEW, engine="static")
    with torch.no_grad():
        model.blocks[0].attn.W_K.weight.mul_(-2.0)
        model.blocks[1].mlp.W_in.weight.mul_(3.0)
    model.blocks[1].attn.W_Q.weight = torch.nn.Parameter(torch.randn_like(model.blocks[1].attn.W_Q.weight))
    after = generate(model, _prompts(), max_new_tokens=NEW, engine="static")
    _assert_same(after, generate(model, _prompts(), max_new_tokens=NEW, engine="eager"))
    assert not torch.allclose(after.states, before.states)


def test_hooks_see_the_same_activations_under_every_engine():
    """The recorder under the static engine (and under the compiled one, whose steps run eagerly
    while hooks are attached, so nothing compiles here) records what the eager engine records,
    attention patterns over the cached keys only included."""
    model = build_model("hd", "debug", n_streams=2)
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern", "blocks.0.hook_resid_post", "hook_embed"]
    recorded = {}
    for engine in ("eager", "static", "compiled"):
        with ActivationRecorder(model, names) as rec:
            generate(model, _prompts(), max_new_tokens=4, engine=engine)
        recorded[engine] = rec
    assert model.compiled_mode is None  # nothing compiled: every step ran eagerly
    for engine in ("static", "compiled"):
        for name in names:
            ref, got = recorded["eager"].calls(name), recorded[engine].calls(name)
            assert [(r.step, r.pass_index, r.value.shape) for r in got] == [(r.step, r.pass_index, r.value.shape) for r in ref]
            for r, g in zip(ref, got):
                torch.testing.assert_close(g.value, r.value, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch,regime,passes,overrides", [CASES[0], CASES[2], CASES[5]], ids=[IDS[0], IDS[2], IDS[5]])
@pytest.mark.parametrize("engine", ["eager", "static"])
def test_compacted_batches_give_the_same_tokens(arch, regime, passes, overrides, engine):
    """Rows that emitted eos leave the batch; the others decode exactly as in the full batch."""
    model = build_model(arch, "debug", **overrides)
    prompts = _prompts() + [tokens(1, 5, seed=9).tolist()[0]]
    free = generate(model, prompts, regime=regime, max_new_tokens=NEW, engine=engine)
    eos = int(free.new_tokens[0, 2])  # row 0 stops at step 3; the rest stop wherever they emit it, if at all
    full = generate(model, prompts, regime=regime, max_new_tokens=NEW, engine=engine, eos_token_id=eos)
    comp = generate(model, prompts, regime=regime, max_new_tokens=NEW, engine=engine, eos_token_id=eos, compact=True)
    lengths = full.lengths.tolist()
    assert min(lengths) <= 3 and max(lengths) > min(lengths)  # rows really left the batch early
    assert comp.new_tokens.tolist() == full.new_tokens.tolist() and comp.lengths.tolist() == lengths
    assert torch.equal(comp.finished, full.finished)
    for row, n in enumerate(lengths):
        torch.testing.assert_close(comp.states[row, :n], full.states[row, :n], atol=1e-5, rtol=1e-5)
        assert comp.states[row, n:].isnan().all()  # no state: the row had finished


def test_compacting_refuses_sampling():
    from workbench.storage.errors import BadInput

    with pytest.raises(BadInput, match="compact=True needs greedy decoding"):
        generate(build_model("baseline", "debug"), [[1, 2]], max_new_tokens=2, temperature=1.0, compact=True)


def test_scored_completions_agree_across_engines():
    model = build_model("fbt", "debug")
    prompts, completions = _prompts(), [[5, 6, 7], [8], [9, 10]]
    ref = score_completions(model, prompts, completions, regime="soft", engine="eager")
    got = score_completions(model, prompts, completions, regime="soft", engine="static")
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_unknown_engine_is_named():
    from workbench.storage.errors import BadInput

    with pytest.raises(BadInput, match="unknown engine 'jit'"):
        generate(build_model("baseline", "debug"), [[1, 2]], max_new_tokens=2, engine="jit")


# ---- compiled: torch.compile (inductor on CPU; a few seconds to compile per graph) -------------


@pytest.mark.slow
def test_a_copy_of_a_compiled_model_decodes_with_its_own_weights():
    model = build_model("baseline", "debug")
    prompts = tokens(2, 5)
    generate(model, prompts, max_new_tokens=NEW, engine="compiled")
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.embed.W_E.mul_(-1.5)
    ref = generate(clone, prompts, max_new_tokens=NEW, engine="eager")
    _assert_same(generate(clone, prompts, max_new_tokens=NEW, engine="compiled"), ref)
    assert not torch.allclose(ref.states, generate(model, prompts, max_new_tokens=NEW).states)


@pytest.mark.slow
@pytest.mark.parametrize("arch,regime,passes,overrides", CASES, ids=IDS)
def test_compiled_engine_equals_eager_with_one_graph(arch, regime, passes, overrides):
    """The compiled engine decodes what the eager one does, and one whole graph (compiled with
    ``fullgraph``, so a break would raise) serves all 256 steps of a generation and a second
    generation of the same shape, for every architecture and regime."""
    from torch._dynamo.utils import counters

    model = build_model(arch, "debug", n_ctx=512, **overrides)
    torch._dynamo.reset()  # forget graphs compiled by earlier tests (they serve any model of the same shapes)
    counters.clear()
    run = dict(regime=regime, passes=passes, max_new_tokens=256)
    for i, prompts in enumerate((_prompts(), tokens(3, 9))):  # padded, then unpadded: the same shapes
        ref = generate(model, prompts, **run, engine="eager")
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            _assert_same(generate(model, prompts, **run, engine="compiled"), ref)
        assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    assert model.compiled_mode is not None


@pytest.mark.slow
def test_compiled_engine_names_the_non_finite_site_like_eager():
    """Compiled code cannot write the guard's records; it returns each norm's status (finite, NaN
    or overflowed), read with the guard's other records, and the guard names the same site, kind
    and step as the eager engine, with no host read per step."""
    from workbench.runtime.syncs import count_syncs

    for scale, what in ((1e30, "blocks.0.ln1 input overflowed"), (float("nan"), "blocks.0.ln1 input is NaN")):
        model = build_model("fbt", "debug")
        with torch.no_grad():  # soft decoding: the prompt runs plain (finite), the first fed-back step goes bad
            model.fusion.W_U.weight *= scale
        errors = {}
        for engine in ("eager", "compiled"):
            with pytest.raises(NonFinite) as err:
                generate(model, tokens(2, 4), regime="soft", max_new_tokens=3, engine=engine)
            errors[engine] = (err.value.what, err.value.step)
        assert errors["compiled"] == errors["eager"] == (what, 1)
    model = build_model("fbt", "debug")
    totals = [
        count_syncs(generate, model, tokens(2, 4), regime="soft", max_new_tokens=n, engine="compiled")[1].total
        for n in (3, 3, 11)
    ]
    assert totals[1] == totals[2], totals  # the first call compiles; then 8 more steps, no more reads


def test_cli_engines_write_the_same_generations(tmp_path):
    from workbench.cli import main

    outs = {}
    for engine in ("eager", "static"):
        out = tmp_path / f"{engine}.json"
        main(["generate", "fbt:debug", "--prompt", "3+4=", "--prompt", "12", "--regimes", "standard,soft",
              "--max-new-tokens", "6", "--engine", engine, "--json", str(out)])  # fmt: skip
        outs[engine] = json.loads(out.read_text())["generations"]
    assert outs["static"] == outs["eager"]


@pytest.mark.slow
def test_compiled_generations_reuse_one_cache_and_one_graph():
    """Generations of one batch whose prompt and budget round up to the same capacity decode on the
    same cache buffers (what a captured CUDA graph needs) with no recompile, and equal eager's,
    also after a generation that failed with NaN in its cache."""
    from torch._dynamo.utils import counters

    model = build_model("fbt", "debug")
    torch._dynamo.reset()
    counters.clear()
    first = tokens(2, 5)
    _assert_same(generate(model, first, regime="soft", max_new_tokens=20, engine="compiled"),
                 generate(model, first, regime="soft", max_new_tokens=20, engine="eager"))  # fmt: skip
    cache = model.decode_caches[(2, 64)]
    addresses = [t.data_ptr() for layer in cache.layers for t in (layer.k, layer.v)] + [cache.state.data_ptr()]
    weight = model.fusion.W_U.weight.detach().clone()
    with torch.no_grad():  # the fed-back steps go NaN, and their keys fill the cache up to the read at step 16
        model.fusion.W_U.weight.fill_(float("nan"))
    with pytest.raises(NonFinite):
        generate(model, tokens(2, 9, seed=3), regime="soft", max_new_tokens=30, engine="compiled")
    assert not all(bool(layer.k.isfinite().all()) for layer in cache.layers)
    stacked = model.blocks[0].attn.stacked.weight
    with torch.no_grad():
        model.fusion.W_U.weight.copy_(weight)
        model.blocks[0].attn.W_V.weight.mul_(-1.0)  # the stacked copy follows, in place
    second = tokens(2, 5, seed=4)  # 5 + 30 tokens: the same capacity, 64; its steps attend over the NaN slots
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = generate(model, second, regime="soft", max_new_tokens=30, engine="compiled")
    _assert_same(got, generate(model, second, regime="soft", max_new_tokens=30, engine="eager"))
    assert model.decode_caches[(2, 64)] is cache and len(model.decode_caches) == 1
    assert [t.data_ptr() for layer in cache.layers for t in (layer.k, layer.v)] + [cache.state.data_ptr()] == addresses
    assert model.blocks[0].attn.stacked.weight is stacked
    assert counters["stats"]["unique_graphs"] == 1
