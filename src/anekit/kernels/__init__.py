"""MIL generators of the transformer kernels, each with an unfused float64 reference beside it."""

from anekit.kernels.config import PRESETS, ConfigError, ModelConfig, preset
from anekit.kernels.spec import KernelSpec, Layout, LayoutError, WeightPack

__all__ = [
    "PRESETS",
    "ConfigError",
    "KernelSpec",
    "Layout",
    "LayoutError",
    "ModelConfig",
    "WeightPack",
    "preset",
]
