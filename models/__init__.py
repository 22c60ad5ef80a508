"""The architectures: nn.Modules, configs and hook points. Knows nothing of training or analysis."""

from models.baseline import BaselineLM, DecoderLM, trusted_ids, without_hooks
from models.config import ModelConfig
from models.fields import ConfigError, FieldTypeError, check_config, check_fields
from models.full_bandwidth import FBTConfig, FullBandwidthLM
from models.hidden_decoding import HDConfig, HiddenDecodingLM, expand_streams, unstack_streams
from models.kv_cache import KVCache
from models.numerics import NonFiniteActivation, guard_numerics
from models.presets import PRESETS, preset

__all__ = [
    "BaselineLM",
    "ConfigError",
    "DecoderLM",
    "FBTConfig",
    "FieldTypeError",
    "FullBandwidthLM",
    "HDConfig",
    "HiddenDecodingLM",
    "KVCache",
    "ModelConfig",
    "NonFiniteActivation",
    "PRESETS",
    "check_config",
    "check_fields",
    "expand_streams",
    "guard_numerics",
    "preset",
    "trusted_ids",
    "unstack_streams",
    "without_hooks",
]
