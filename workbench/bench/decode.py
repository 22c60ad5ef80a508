"""The decode keys' pieces: engines, transformers' generate, fused projections, the trace study, long contexts."""

from __future__ import annotations

import inspect
import tempfile
from collections.abc import Callable

import torch

from models import PRESETS
from workbench.bench.timing import entry, fresh_compiles, measure, paired, ratio_of
from workbench.runtime.config import build_model
from workbench.runtime.decoding import ENGINES, generate
from workbench.runtime.tokenizer import CharTokenizer

# SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M) with 9 key/value heads where it has 3: our
# attention has no grouped-query variant yet
SMOLLM2 = dict(d_model=576, n_layers=30, n_heads=9, d_mlp=1536, d_vocab=49152, n_ctx=8192, rope_base=1e5)
# a stand-in of the same kinds at the debug preset (the tests' size), not a SmolLM2 measurement
SMOLLM2_STANDIN = dict(d_model=64, n_layers=2, n_heads=4, d_mlp=176, d_vocab=512, n_ctx=256, rope_base=1e5)

HF_ENGINE = "compiled"  # vs_hf_generate's side: the engine that measurably beats static there (see its note)
DEFAULT_ENGINE = inspect.signature(generate).parameters["engine"].default


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


def _synthetic_context(model, batch: int, context: int, new: int):
    """A static cache whose rows hold ``context`` tokens of random keys and values (on the model's
    device and in its dtype), and a function that rewinds it to them. Decode speed depends on how
    much the cache holds, not on what, and a real 2k-token prefill of HD n=4 at batch 32 would take
    minutes on a CPU."""
    cache = model.make_cache(context + new, static=True)
    g = torch.Generator().manual_seed(0)
    weight = model.embed.W_E
    H, dh, n = model.cfg.n_kv_heads, model.cfg.d_head, model.n_streams
    for block, layer in zip(model.blocks, cache.layers):
        cross = block.attn.mode == "cross" and n > 1  # cross-stream: n positions per token; intra: a row per stream
        rows, layer.per_token = (batch, n) if cross else (batch * n, 1)
        shape = (rows, H, cache.capacity * layer.per_token, dh)
        layer.k = torch.randn(shape, generator=g).to(weight.device, weight.dtype)
        layer.v = torch.randn(shape, generator=g).to(weight.device, weight.dtype)
    cache.advance(None, context, batch, weight.device)

    def rewind():
        cache.length = context
        for layer in cache.layers:
            layer.length = context * layer.per_token
        cache.advance(None, 0, batch, weight.device)  # index, positions and validity at ``context``
        assert cache.valid is not None
        cache.valid[:, context:] = False

    return cache, rewind


def _decode_steps(model, batch: int, context: int, new: int) -> Callable:
    """``new`` greedy static steps of ``batch`` rows after a synthetic ``context``-token cache."""
    cache, rewind = _synthetic_context(model, batch, context, new)
    first = torch.randint(4, 100, (batch, 1), generator=torch.Generator().manual_seed(1)).to(model.embed.W_E.device)

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


def _compiled_speedup(preset: str, prompt: torch.Tensor, new: int, reps: int) -> dict:
    """Tokens/s of the compiled engine over the eager one (= t_eager / t_compiled) on the preset's
    baseline, batch 1; the static engine (uncompiled) timed in the same interleave."""
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
