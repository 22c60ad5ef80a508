"""Hidden Decoding: each token becomes ``n_streams`` interleaved positions, one per embedding table
(E_1(x_i) ... E_n(x_i)); only the last stream's position of token i is read out, predicting x_{i+1}.

Attention is stream-factorised: most layers are intra-stream (a position attends to the same stream
at earlier or equal tokens), the layers in ``cross_layers`` are causal over the interleaved sequence
(optionally windowed). The readout is tied to the first table E_1, which is the baseline's embedding
when the model is expanded from a baseline. ``kv="shared"`` is the ablation in which later tokens
see only the last stream's keys and values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from models.attention import Attention
from models.baseline import DecoderLM
from models.config import ModelConfig, check_size
from models.fields import ConfigError
from models.kv_cache import KVCache
from models.layers import Block

POSITION_MODES = ("token", "interleaved")
READOUTS = ("last", "sum")
KV_MODES = ("separate", "shared")


@dataclass
class HDConfig(ModelConfig):
    n_streams: int = 2
    # Layers with cross-stream attention; None = the middle layer (n_layers // 2).
    cross_layers: tuple[int, ...] | None = None
    cross_window: int | None = None  # cross-stream attention window in interleaved positions
    positions: str = "token"  # rotary position of stream s of token i: i, or i * n_streams + s
    readout: str = "last"  # "last" stream, or the ablation "sum" over streams
    # "separate": every stream's keys and values stay visible to later tokens; the ablation
    # "shared": only the last stream's do (models.attention.Attention)
    kv: str = "separate"
    # KV-Mirror: from this layer on only the last stream is computed (the only one read out); a
    # cross-stream layer there takes the other streams' keys and values from layer kv_mirror - 1
    kv_mirror: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.n_streams, int) or self.n_streams < 1:
            raise ConfigError(f"config field n_streams={self.n_streams!r}: expected an integer >= 1")
        check_size("n_streams", self.n_streams)
        if self.cross_layers is None:
            self.cross_layers = (self.n_layers // 2,)
        self.cross_layers = tuple(self.cross_layers)
        for layer in self.cross_layers:
            if not isinstance(layer, int) or not 0 <= layer < self.n_layers:
                raise ConfigError(
                    f"config field cross_layers={self.cross_layers!r}: layer {layer!r} is not in [0, {self.n_layers})"
                )
        if self.cross_window is not None and (not isinstance(self.cross_window, int) or self.cross_window < 1):
            raise ConfigError(f"config field cross_window={self.cross_window!r}: expected None or an integer >= 1")
        if self.cross_window is not None:  # the attention mask subtracts it from int64 positions
            check_size("cross_window", self.cross_window)
        if self.positions not in POSITION_MODES:
            raise ConfigError(f"config field positions={self.positions!r}: expected one of {POSITION_MODES}")
        if self.readout not in READOUTS:
            raise ConfigError(f"config field readout={self.readout!r}: expected one of {READOUTS}")
        if self.kv not in KV_MODES:
            raise ConfigError(f"config field kv={self.kv!r}: expected one of {KV_MODES}")
        if self.kv_mirror is not None:
            if not isinstance(self.kv_mirror, int) or not 1 <= self.kv_mirror < self.n_layers:
                raise ConfigError(f"config field kv_mirror={self.kv_mirror!r}: expected None or a layer in [1, {self.n_layers})")
            if self.readout != "last" or self.kv != "separate":
                raise ConfigError(
                    f"config field kv_mirror={self.kv_mirror}: needs readout='last' and kv='separate' (every stream's "
                    f"states and keys are read otherwise), not readout={self.readout!r}, kv={self.kv!r}"
                )


class StreamEmbed(nn.Module):
    def __init__(self, cfg: HDConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.n_streams, cfg.d_vocab, cfg.d_model))  # [n_streams, d_vocab, d_model]

    def forward(self, tokens: Tensor) -> Tensor:
        # [batch, pos] -> [batch, pos, n_streams, d_model]; one lookup in the stacked tables
        # (F.embedding for its deterministic backward: see models.baseline.Embed)
        n, vocab, d = self.W_E.shape
        rows = tokens[..., None] + vocab * torch.arange(n, device=tokens.device)
        return nn.functional.embedding(rows, self.W_E.reshape(n * vocab, d))


def unstack_streams(act: Tensor, n_streams: int) -> Tensor:
    """View an interleaved activation [batch, n_streams * pos, ...] as [batch, pos, n_streams, ...]."""
    if act.shape[1] % n_streams:
        raise ValueError(f"axis 1 has {act.shape[1]} positions, not a multiple of n_streams={n_streams}")
    return act.view(act.shape[0], act.shape[1] // n_streams, n_streams, *act.shape[2:])


def _attention(cfg: HDConfig, layer: int) -> Attention:
    """Layer ``layer``'s attention: cross-stream where ``cfg.cross_layers`` says, and under KV-Mirror
    the source of the mirrored layers' keys and values (layer m - 1) or one of them (m on)."""
    cross = layer in (cfg.cross_layers or ())
    m = cfg.kv_mirror
    mirror = None if m is None or layer < m - 1 else "source" if layer == m - 1 else "mirrored"
    return Attention(cfg, "cross" if cross else "intra", cfg.cross_window if cross else None, cfg.kv == "shared", mirror)


class HiddenDecodingLM(DecoderLM):
    arch = "hd"
    cfg: HDConfig

    def __init__(self, cfg: HDConfig):
        blocks = [Block(cfg, _attention(cfg, i)) for i in range(cfg.n_layers)]
        super().__init__(cfg, blocks)
        self.n_streams = cfg.n_streams
        self.embed = StreamEmbed(cfg)
        self.hook_stream_embed = HookPoint()  # [batch, pos, n_streams, d_model] (pos in tokens)
        # hook_embed: [batch, n_streams * pos, d_model], the interleaved stack input
        self._finish_init()

    def added_parameters(self) -> dict[str, int]:
        return {"embed.W_E": 1}  # the first stream's table is the baseline's embedding

    def stream_positions(self, positions: Tensor) -> Tensor:
        n = self.n_streams
        if self.cfg.positions == "token":
            return positions.repeat_interleave(n, dim=1)
        offsets = torch.arange(n, device=positions.device)
        return (positions[..., None] * n + offsets).flatten(1)

    def readout(self, h: Tensor, all_streams: bool = False) -> Tensor:
        """Logits [batch, pos, d_vocab] (tokens) from the interleaved states; with ``all_streams``,
        [batch, pos, n_streams, d_vocab]."""
        h = unstack_streams(h, self.n_streams)
        if not all_streams:
            h = h[:, :, -1] if self.cfg.readout == "last" else h.sum(dim=2)
        return self.checked_logits(h @ self.readout_weight.T)

    @property
    def input_table(self) -> Tensor:
        """[d_vocab, d_model]: the first stream's table E_1 (the readout's, when tied)."""
        return self.embed.W_E[0]

    def stack_input(self, tokens: Tensor) -> Tensor:
        """Interleaved stream embeddings [batch, n_streams * pos, d_model]."""
        streams = self.hook_stream_embed(self.embed(tokens))
        return self.hook_embed(rearrange(streams, "b t n d -> b (t n) d"))

    def forward(
        self,
        tokens: Tensor,
        *,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
        all_streams: bool = False,
    ) -> Tensor:
        """Logits [batch, pos, d_vocab] read from the last stream (or [batch, pos, n_streams,
        d_vocab] with ``all_streams``)."""
        with self.guard_scope():
            return self.readout(self.final_states(tokens, cache=cache, attention_mask=attention_mask), all_streams)


def expand_streams(model: DecoderLM, n_streams: int, **hd_overrides) -> HiddenDecodingLM:
    """A Hidden Decoding model with ``n_streams`` streams initialised from ``model`` (a baseline or
    a Hidden Decoding model with fewer streams): shared weights are copied and the embedding
    tables replicated cyclically, E_{n+k} <- E_k."""
    old_n = getattr(model, "n_streams", 1)
    if n_streams < old_n:
        raise ValueError(f"cannot expand {old_n} streams to n_streams={n_streams}: expected >= {old_n}")
    base = {f.name: getattr(model.cfg, f.name) for f in dataclasses.fields(ModelConfig)}
    extra = {}
    if isinstance(model.cfg, HDConfig):
        extra = {f: getattr(model.cfg, f) for f in ("cross_layers", "cross_window", "positions", "readout", "kv", "kv_mirror")}
    cfg = HDConfig(**{**base, **extra, **hd_overrides, "n_streams": n_streams})
    new = HiddenDecodingLM(cfg).to(device=model.embed.W_E.device, dtype=model.embed.W_E.dtype)
    state = {k: v for k, v in model.state_dict().items() if k != "embed.W_E"}
    missing, unexpected = new.load_state_dict(state, strict=False)
    if unexpected or missing != ["embed.W_E"]:
        raise ValueError(f"weights do not map onto the expanded model: missing {missing}, unexpected {unexpected}")
    tables = model.embed.W_E.detach()
    tables = tables[None] if tables.dim() == 2 else tables
    with torch.no_grad():
        new.embed.W_E.copy_(tables[torch.arange(n_streams) % old_n])
    return new
