"""``workbench VERB ...``: each verb prints a human summary and writes machine-readable JSON."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

logger = logging.getLogger("workbench")


def _emit(result: dict, out: str | None) -> None:
    if out:
        from workbench.checkpoint import write_json

        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, result)
        print(f"wrote {path}")


def cmd_presets(args) -> dict:
    from workbench.config import ARCHS, build_model
    from models import PRESETS

    rows = {}
    for name, values in PRESETS.items():
        counts = {}
        for arch in ARCHS:
            model = build_model(arch, name, device="meta")
            counts[arch] = sum(p.numel() for p in model.parameters())
        rows[name] = {**values, "parameters": counts}
        print(f"{name:6s} " + " ".join(f"{k}={v}" for k, v in values.items()) + "  params: "
              + ", ".join(f"{a} {c / 1e6:.2f}M" for a, c in counts.items()))
    return {"presets": rows}


def cmd_generate(args) -> dict:
    from workbench.checkpoint import resolve_model
    from workbench.decoding import generate
    from workbench.tokenizer import CharTokenizer

    model = resolve_model(args.model)
    run_dir = Path(args.model)
    tok = CharTokenizer.load(run_dir) if (run_dir / "tokenizer.json").is_file() else CharTokenizer()
    prompts = [tok.encode(p, bos=True) for p in args.prompt]
    result = {"model": args.model, "prompts": args.prompt, "generations": {}}
    for regime in args.regime.split(","):
        out = generate(
            model, prompts, regime=regime, max_new_tokens=args.max_new_tokens, passes=args.passes,
            temperature=args.temperature, top_k=args.top_k, seed=args.seed, eos_token_id=tok.eos_id,
        )
        texts = [tok.decode(ids) for ids in out.completions()]
        result["generations"][regime] = texts
        for prompt, text in zip(args.prompt, texts):
            print(f"[{regime}] {prompt!r} -> {text!r}")
    return result


def cmd_export(args) -> dict:
    from workbench.checkpoint import resolve_model
    from workbench.export import export_hf
    from workbench.tokenizer import CharTokenizer

    model = resolve_model(args.model)
    run_dir = Path(args.model)
    tok = CharTokenizer.load(run_dir) if (run_dir / "tokenizer.json").is_file() else CharTokenizer()
    out = export_hf(model, args.out_dir, tok)
    note = json.loads((out / "workbench_export.json").read_text())
    print(f"exported {model.arch} ({note['meaning']}) to {out}")
    return {"out_dir": str(out), **note}


def cmd_demo(args) -> dict:
    from workbench.demo import run_demo

    report = run_demo(args.out, preset=args.preset, seed=args.seed)
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


def _passes(text: str) -> int | str:
    if text == "exact":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'exact', got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = sub.add_parser("demo", help="end-to-end demo: build, check invariants, decode, export")
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo, json_out=None)

    p = sub.add_parser("generate", help="generate from a run directory or ARCH:PRESET under each regime")
    p.add_argument("model", help="run directory, or ARCH:PRESET[:SEED] for a fresh model")
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable: a batch)")
    p.add_argument("--regime", default="standard", help="comma-separated: standard,soft,fused")
    p.add_argument("--passes", type=_passes, default=1, help="K of the fused regime's K-pass prefill, or 'exact'")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_out", help="write the result as JSON here")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("export", help="export a model's backbone as a Hugging Face LlamaForCausalLM")
    p.add_argument("model", help="run directory, or ARCH:PRESET[:SEED] for a fresh model")
    p.add_argument("out_dir")
    p.add_argument("--json", dest="json_out", help="write the result as JSON here")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("presets", help="list the model presets and parameter counts")
    p.add_argument("--json", dest="json_out", help="write the table as JSON here")
    p.set_defaults(func=cmd_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as err:
        parser.exit(2, f"workbench {args.verb}: error: {err}\n")
    _emit(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
