"""The backbone's configuration: ``ModelConfig``, the shape and numerics every architecture shares,
and ``check_size``, the limit on sizes torch can describe."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from models.fields import ConfigError, check_config

SIZE_LIMIT = 2**63 - 1  # torch describes sizes and indices as int64: a larger one cannot even be asked for


def check_size(name: str, value: int) -> None:
    """Refuse a size or position count past ``SIZE_LIMIT``: torch would fail on it with an overflow
    deep inside a build or a mask, not with a message naming the field. (What fits in memory is the
    workbench's to check, where it knows the machine.)"""
    if value > SIZE_LIMIT:
        raise ConfigError(f"config field {name}={value}: a size torch cannot allocate (expected at most 2**63 - 1)")


@dataclass
class ModelConfig:
    """Shape and numerics of the Llama-style backbone shared by every architecture."""

    d_vocab: int = 128
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention); None: n_heads
    d_mlp: int = 176
    n_ctx: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    tie_embeddings: bool = True  # the readout is the (first) input embedding table; False: its own matrix

    def __post_init__(self) -> None:
        check_config(self)  # types first: the checks below compare numbers
        for name in ("d_vocab", "d_model", "n_layers", "n_heads", "d_mlp", "n_ctx"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config field {name}={getattr(self, name)!r}: expected an integer >= 1")
            check_size(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ConfigError(f"config field d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if not 1 <= self.n_kv_heads <= self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"config field n_kv_heads={self.n_kv_heads!r}: expected a divisor of n_heads={self.n_heads} "
                "(each key/value head serves n_heads / n_kv_heads query heads)"
            )
        if self.d_head % 2:
            raise ConfigError(f"d_head = d_model / n_heads = {self.d_head}: rotary embeddings need it even")
        # JSON and --set both accept Infinity; rotary angles, the norm and the init need finite values
        for name, ok, expected in (
            ("rope_base", 1 < self.rope_base < math.inf, "a finite number > 1"),
            ("norm_eps", 0 < self.norm_eps < 1, "a number in (0, 1)"),
            ("init_std", 0 < self.init_std < math.inf, "a finite number > 0"),
        ):
            if not ok:
                raise ConfigError(f"config field {name}={getattr(self, name)!r}: expected {expected}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
