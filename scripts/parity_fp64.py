#!/usr/bin/env python3
"""How far an imported run is from `transformers`, next to how far each fp32 model is from an fp64
evaluation of the same weights (docs/pretrained.md):

    python scripts/parity_fp64.py runs/smollm2 ../shared/data/gsm8k/train.jsonl --tokens 512

Prints, for the first N tokens of the text file: max |logit difference| ours32 - transformers32,
each against ours in fp64, and transformers in fp64 against ours in fp64 (transformers computes its
RMSNorm and rotary tables in fp32 whatever the dtype, so it is no fp64 reference), and whether the
fp32 argmaxes agree at every position."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("text", type=Path)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    from transformers import LlamaForCausalLM

    from workbench import load_model
    from workbench.runtime.export import export_hf
    from workbench.runtime.tokenizer import load_tokenizer

    model, tokenizer = load_model(args.run), load_tokenizer(args.run)
    ids = torch.tensor([tokenizer.encode(args.text.read_text()[: 20 * args.tokens])[: args.tokens]])
    with tempfile.TemporaryDirectory() as tmp:
        hf = LlamaForCausalLM.from_pretrained(export_hf(model, tmp, tokenizer), attn_implementation="sdpa").eval()
        hf64 = LlamaForCausalLM.from_pretrained(tmp, attn_implementation="eager", dtype=torch.float64).eval()
    with torch.no_grad():
        ours, theirs, theirs64 = model(ids), hf(ids).logits, hf64(ids).logits
        exact = model.double()(ids)

    def gap(a, b):
        return f"{(a.double() - b.double()).abs().max().item():.3g}"

    print(f"{ids.shape[1]} tokens; logits up to {theirs.abs().max().item():.3g} in magnitude")
    print(f"ours32 - transformers32: {gap(ours, theirs)}")
    print(f"ours32 - ours64: {gap(ours, exact)}")
    print(f"transformers32 - ours64: {gap(theirs, exact)}")
    print(f"transformers64 - ours64: {gap(theirs64, exact)}")
    print(f"fp32 argmax equal at every position: {bool(torch.equal(ours.argmax(-1), theirs.argmax(-1)))}")


if __name__ == "__main__":
    main()
