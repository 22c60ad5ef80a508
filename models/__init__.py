"""The architectures: nn.Modules, configs and hook points. Knows nothing of training or analysis."""

from models.baseline import BaselineLM, DecoderLM, without_hooks
from models.full_bandwidth import FBTConfig, FullBandwidthLM
from models.hidden_decoding import HDConfig, HiddenDecodingLM, expand_streams, unstack_streams
from models.layers import KVCache, ModelConfig
from models.presets import PRESETS, preset

__all__ = [
    "BaselineLM",
    "DecoderLM",
    "FBTConfig",
    "FullBandwidthLM",
    "HDConfig",
    "HiddenDecodingLM",
    "KVCache",
    "ModelConfig",
    "PRESETS",
    "expand_streams",
    "preset",
    "unstack_streams",
    "without_hooks",
]
