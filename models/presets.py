"""Named model sizes. ``debug`` drives the tests (seconds), ``tiny`` and ``small`` the CPU
studies, ``gpu`` (~100M parameters) the same code on an accelerator. d_vocab 128 holds the
workbench's character-level tokenizer."""

from __future__ import annotations

from models.fields import ConfigError

PRESETS: dict[str, dict] = {
    "debug": dict(d_model=32, n_layers=2, n_heads=4, d_mlp=96, n_ctx=128),
    "tiny": dict(d_model=128, n_layers=4, n_heads=4, d_mlp=352, n_ctx=512),
    "small": dict(d_model=256, n_layers=6, n_heads=8, d_mlp=704, n_ctx=1024),
    "gpu": dict(d_model=768, n_layers=12, n_heads=12, d_mlp=2048, n_ctx=2048),
}


def preset(name: str) -> dict:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: expected one of {sorted(PRESETS)}")
    return dict(PRESETS[name])
