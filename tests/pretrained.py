"""Tiny pretrained-model stand-ins built locally, for the tests about real tokenizers and imported
models: a byte-level BPE (and a BPE with an unknown token) trained on a few KB of text, and a tiny
random ``LlamaForCausalLM`` checkpoint (grouped-query attention, tied or untied) saved with it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? #### 72",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Q: Start with 3. Add 4. Then multiply by 2.\nA: 3+4=7, 7*2=14 #### 14",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CONFIG = {
    "bos_token": "<|im_start|>",
    "eos_token": {"content": "<|im_end|>", "lstrip": False},  # tokenizer_config.json writes either form
    "chat_template": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
}


def byte_level_bpe(vocab_size=300) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def bpe_with_unknown() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]", *SPECIALS]))
    return tok


def hf_llama(directory, tie=True, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = byte_level_bpe()
    fields = dict(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e5},
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = LlamaConfig(**{**fields, **overrides})
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random init is small; scale it so the logits have structure to compare
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    model.save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({**CONFIG, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return model


def imported_run(directory: Path, **overrides) -> Path:
    """A ``baseline`` run imported (``workbench import``) from a tiny random Llama at ``directory/hf``."""
    from workbench.runtime.importing import import_hf

    hf_llama(directory / "hf", **overrides)
    return import_hf(directory / "hf", directory / "run")
