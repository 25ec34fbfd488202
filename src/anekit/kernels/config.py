"""Model configuration of a llama2.c-style transformer; ``check_kernels`` holds it to what the engine's
training kernels can run.

A ``ModelConfig`` checks only what every use of a model needs (positive sizes, heads dividing the width,
an even head_dim for RoPE): reading, inspecting, sampling on the CPU and exporting take any such shape,
a Llama-2-7B's included. The engine's channel and spatial limits concern the fused kernels generated
from the config, so they are applied where those kernels are made (``check_kernels``, called by every
``KernelBuilder``), not to every file that is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from anekit.errors import AnekitError

MAX_CHANNELS = 0x1FFFF  # channel fields of the hardware task descriptor are 17-bit
MAX_SPATIAL = 0x7FFF  # spatial (width / height) fields are 15-bit


class ConfigError(AnekitError, ValueError):
    """A model configuration the engine cannot run; the message names the rule it breaks."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a llama2.c transformer; every kernel is generated from one of these."""

    dim: int  # model width: channels of every [1, dim, 1, seq] activation
    hidden_dim: int  # FFN width (W1 / W3 output channels)
    n_layers: int
    n_heads: int
    n_kv_heads: int  # < n_heads: grouped-query attention (each kv head serves n_heads / n_kv_heads)
    vocab_size: int
    seq_len: int  # tokens per kernel call: the spatial size
    rope: bool = True  # rotary position embedding on Q and K (llama2.c always uses it)
    norm_eps: float = 1e-5  # RMSNorm epsilon, as llama2.c's run.c
    rope_theta: float = 10000.0
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for key in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"[config {self.name}] {key} must be a positive integer, got {value!r}")
        if self.dim % self.n_heads:
            raise ConfigError(
                f"[config {self.name}] dim {self.dim} is not divisible by n_heads {self.n_heads}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"[config {self.name}] n_heads {self.n_heads} is not divisible by "
                f"n_kv_heads {self.n_kv_heads}"
            )
        if self.rope and self.head_dim % 2:
            raise ConfigError(
                f"[config {self.name}] RoPE rotates pairs of channels: head_dim {self.head_dim} must be even"
            )
        if not self.norm_eps > 0:
            raise ConfigError(f"[config {self.name}] norm_eps must be > 0, got {self.norm_eps}")

    def check_kernels(self) -> ModelConfig:
        """This config, or ConfigError naming the rule: the surfaces of the fused training kernels
        generated from it must fit the engine's 17-bit channel and 15-bit spatial fields."""
        channels = {
            "dim": self.dim,
            "hidden_dim": self.hidden_dim,
            "vocab_size": self.vocab_size,
            "attention score channels n_heads * seq_len": self.n_heads * self.seq_len,
            "SDPA forward taps 4 * dim + 2 * kv_dim": 4 * self.dim + 2 * self.kv_dim,
            "FFN forward taps 2 * dim + 3 * hidden_dim": 2 * self.dim + 3 * self.hidden_dim,
            "SDPA backward 1 output kv_dim * 2 + 2 * n_heads * seq_len": 2 * self.kv_dim
            + 2 * self.n_heads * self.seq_len,
        }
        for what, n in channels.items():
            if n > MAX_CHANNELS:
                raise ConfigError(
                    f"[config {self.name}] {what} = {n} exceeds the engine's 17-bit channel limit "
                    f"{MAX_CHANNELS}"
                )
        if self.seq_len > MAX_SPATIAL:
            raise ConfigError(
                f"[config {self.name}] seq_len {self.seq_len} exceeds the engine's 15-bit spatial limit "
                f"{MAX_SPATIAL}"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def kv_group(self) -> int:
        """How many query heads share one kv head."""
        return self.n_heads // self.n_kv_heads

    def with_(self, **changes: object) -> ModelConfig:
        """A copy with some fields changed (checked again as the constructor checks)."""
        return replace(self, **changes)  # type: ignore[arg-type]


PRESETS: dict[str, ModelConfig] = {
    # The ANE training reference's model (stories_config.h).
    "stories110M": ModelConfig(768, 2048, 12, 12, 12, 32000, 256, name="stories110M"),
    # llama2.c's TinyStories checkpoints.
    "stories15M": ModelConfig(288, 768, 6, 6, 6, 32000, 256, name="stories15M"),
    "stories260K": ModelConfig(64, 172, 5, 8, 4, 512, 512, name="stories260K"),
    # anekit train's default: small enough to train in about a minute on two CPU cores in the simulator
    # (dim 64, 4 layers, 4 heads sharing 2 kv heads, the default tokenizer's 512 tokens, 64-token windows).
    "default": ModelConfig(64, 176, 4, 4, 2, 512, 64, name="default"),
}


def preset(name: str) -> ModelConfig:
    """A named configuration; ConfigError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"[config] unknown preset '{name}' (known: {', '.join(PRESETS)})") from None
