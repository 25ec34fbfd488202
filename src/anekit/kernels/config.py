"""The model configuration the kernels are generated from: ``anekit.models.config``, under the name its
users have always imported (``from anekit.kernels.config import ModelConfig``)."""

from anekit.models.config import (
    LAYER_TYPES,
    MAX_CHANNELS,
    MAX_SPATIAL,
    MLP_ACTS,
    PRESETS,
    ConfigError,
    ModelConfig,
    RopeScaling,
    preset,
)

__all__ = [
    "LAYER_TYPES",
    "MAX_CHANNELS",
    "MAX_SPATIAL",
    "MLP_ACTS",
    "PRESETS",
    "ConfigError",
    "ModelConfig",
    "RopeScaling",
    "preset",
]
