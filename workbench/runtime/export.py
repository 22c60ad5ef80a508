"""Export a model's backbone as a Hugging Face ``LlamaForCausalLM`` directory with its tokenizer.

The baseline exports exactly. A Full-Bandwidth model exports its backbone: the exported model is
the FBT in the ``standard`` regime (the fusion weights are dropped). A Hidden Decoding model exports
its first embedding table and its blocks: exact only for ``n_streams == 1`` without a
``cross_window`` shorter than the context (Llama attends over the whole causal context, so the
window is dropped). What was dropped, and whether the export is exact, is written to
``workbench_export.json`` beside the weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from models import DecoderLM
from workbench.runtime.tokenizer import CharTokenizer, TokenizerBase
from workbench.storage.files import write_json
from workbench.storage.outputs import output


def hf_llama_config(model: DecoderLM, tokenizer: TokenizerBase):
    from transformers import LlamaConfig

    cfg = model.cfg
    return LlamaConfig(
        vocab_size=cfg.d_vocab,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_mlp,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.d_head,
        max_position_embeddings=cfg.n_ctx,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base},
        tie_word_embeddings=cfg.tie_embeddings,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
    )


def hf_state_dict(model: DecoderLM) -> dict[str, torch.Tensor]:
    """Our weights under Hugging Face Llama names (``lm_head`` is the embedding when tied)."""
    out = {
        "model.embed_tokens.weight": model.input_table,
        "model.norm.weight": model.ln_final.w,
        "lm_head.weight": model.readout_weight,
    }
    names = {
        "self_attn.q_proj": "attn.W_Q",
        "self_attn.k_proj": "attn.W_K",
        "self_attn.v_proj": "attn.W_V",
        "self_attn.o_proj": "attn.W_O",
        "mlp.gate_proj": "mlp.W_gate",
        "mlp.up_proj": "mlp.W_in",
        "mlp.down_proj": "mlp.W_out",
    }
    for i, block in enumerate(model.blocks):
        for hf, ours in names.items():
            out[f"model.layers.{i}.{hf}.weight"] = block.get_submodule(ours).weight
        out[f"model.layers.{i}.input_layernorm.weight"] = block.get_parameter("ln1.w")
        out[f"model.layers.{i}.post_attention_layernorm.weight"] = block.get_parameter("ln2.w")
    return {k: v.detach().float().cpu() for k, v in out.items()}


def export_hf(model: DecoderLM, out_dir: str | Path, tokenizer: TokenizerBase | None = None, *, overwrite: bool = False) -> Path:
    """Write ``config.json``, ``model.safetensors`` and the tokenizer files to ``out_dir``: a new or
    empty directory, or a previous export there, replaced only with ``overwrite``."""
    from transformers import LlamaForCausalLM

    tokenizer = tokenizer or CharTokenizer()
    if tokenizer.vocab_size > model.cfg.d_vocab:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model's d_vocab is {model.cfg.d_vocab}")
    out_dir = Path(out_dir)
    with output(out_dir, "export", overwrite=overwrite) as out:
        hf = LlamaForCausalLM(hf_llama_config(model, tokenizer))
        missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
        if unexpected or any(not k.startswith("lm_head") for k in missing):
            raise RuntimeError(f"export mapping is out of date: missing {missing}, unexpected {unexpected}")
        hf.save_pretrained(out.staging)
        tokenizer.save(out.staging, model.cfg.n_ctx)
        dropped = {
            "baseline": [],
            "fbt": [name for name, _ in model.named_parameters() if name.startswith("fusion.")],
            "hd": [f"embed.W_E[1:{model.n_streams}]"] if model.n_streams > 1 else [],
        }[model.arch]
        window = _restricting_window(model)
        if window is not None:
            dropped.append(window)
        exact = model.arch == "baseline" or (model.arch == "hd" and not dropped)
        note = {
            "source_arch": model.arch,
            "exact": exact,
            "meaning": {
                "baseline": "the model itself",
                "fbt": "the backbone: the FBT in the 'standard' regime (no feedback)",
                "hd": "the first embedding table and the blocks, read as a single-stream model",
            }[model.arch],
            "dropped": dropped,
            "files": sorted(p.name for p in out.staging.iterdir()),  # what the export holds
        }
        write_json(out.staging / "workbench_export.json", note)
        out.publish()
    return out_dir


def _restricting_window(model: DecoderLM) -> str | None:
    """What an HD ``cross_window`` changes that the export cannot keep, or None. A window of at
    least ``n_ctx * n_streams`` (interleaved) positions never masks a key inside the context, so it changes nothing."""
    window = getattr(model.cfg, "cross_window", None)
    if model.arch != "hd" or window is None or window >= model.cfg.n_ctx * model.n_streams:
        return None
    return (
        f"cross_window={window} of layers {list(getattr(model.cfg, 'cross_layers', ()))}: the export attends over the whole "
        "causal context there"
    )
