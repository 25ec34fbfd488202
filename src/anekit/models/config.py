"""The shape of a transformer every lowering is generated from (``ModelConfig``), its presets, and
``check_kernels``, which holds it to what the engine's training kernels can run.

The model families (``anekit.models.llama`` / ``qwen`` / ``gemma3``) read a checkpoint's config into one
of these; the engine kernels, the CPU forward and the CoreML export are lowered from it. It lives with the
families, below the kernels, so that the families never import a lowering; ``anekit.kernels.config``
re-exports it under the name the kernels' users have always imported.

A ``ModelConfig`` checks only what every use of a model needs (positive sizes, heads dividing the width,
an even head_dim for RoPE): reading, inspecting, sampling on the CPU and exporting take any such shape,
a Llama-2-7B's included. The engine's channel and spatial limits concern the fused kernels generated
from the config, so they are applied where those kernels are made (``check_kernels``, called by every
``KernelBuilder``), not to every file that is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from anekit.errors import AnekitError

MAX_CHANNELS = 0x1FFFF  # channel fields of the hardware task descriptor are 17-bit
MAX_SPATIAL = 0x7FFF  # spatial (width / height) fields are 15-bit


class ConfigError(AnekitError, ValueError):
    """A model configuration the engine cannot run; the message names the rule it breaks."""


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's RoPE frequency scaling ("rope_type": "llama3"), as transformers'
    ``_compute_llama3_parameters``: with wavelength 2 pi / f, frequencies whose wavelength exceeds
    ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, those shorter than
    ``original_max_position_embeddings / high_freq_factor`` are kept, and the band between is a smooth
    interpolation of the two."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if not (self.factor >= 1 and 0 < self.low_freq_factor < self.high_freq_factor):
            raise ConfigError(
                f"[config] llama3 rope scaling needs factor >= 1 and 0 < low_freq_factor < "
                f"high_freq_factor, got {self.factor}, {self.low_freq_factor}, {self.high_freq_factor}"
            )
        if not (
            isinstance(self.original_max_position_embeddings, int)
            and self.original_max_position_embeddings > 0
        ):
            raise ConfigError(
                "[config] llama3 rope scaling needs a positive original_max_position_embeddings, got "
                f"{self.original_max_position_embeddings!r}"
            )

    def apply(self, inv_freq: np.ndarray) -> np.ndarray:
        """The scaled frequencies, in ``inv_freq``'s dtype."""
        f = inv_freq.astype(np.float64)
        old = float(self.original_max_position_embeddings)
        wavelen = 2 * math.pi / f
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        out = np.where(wavelen > old / self.low_freq_factor, f / self.factor, f)
        medium = (wavelen >= old / self.high_freq_factor) & (wavelen <= old / self.low_freq_factor)
        out = np.where(medium, (1 - smooth) * f / self.factor + smooth * f, out)
        return out.astype(inv_freq.dtype)


MLP_ACTS = ("silu", "gelu_tanh")
LAYER_TYPES = ("full", "sliding")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a llama2.c-style transformer (Llama, Mistral, Qwen 2 / 3 included); every kernel is
    generated from one of these.

    RoPE always turns adjacent channel pairs (2j, 2j + 1) of a head, as llama2.c's run.c and the kernels
    do; checkpoints in Hugging Face's rotate-half layout have their q / k rows permuted on import
    (anekit.hf). The fields after ``rope_theta`` describe Hugging Face models: ``attn_head_dim`` (Qwen 3
    names its head size, and heads x head_dim need not equal dim), q / k / v biases (Qwen 2), a
    per-head RMSNorm of q and k before RoPE (Qwen 3), Llama 3's rope scaling."""

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
    attn_head_dim: int = 0  # 0: dim // n_heads (llama2.c); else each head's size, named by the model
    qkv_bias: bool = False  # q / k / v projections have biases (Qwen 2)
    qk_norm: bool = False  # a per-head RMSNorm of q and k before RoPE, weights (head_dim,) (Qwen 3)
    rope_scaling: RopeScaling | None = None  # Llama 3's frequency scaling; None: plain RoPE
    # Gemma 3 (anekit.models.gemma3). Defaults are Llama's, so a config without them is unchanged.
    norm_offset: float = 0.0  # every RMSNorm scales by (norm_offset + w): 1.0 in Gemma (x * (1 + w))
    post_norms: bool = (
        False  # each block's output RMS-normalised (post_att_norm / post_ffn_norm) before its residual add
    )
    mlp_act: str = (
        "silu"  # the gate's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, tanh-approximated gelu)
    )
    embed_scale: float = (
        1.0  # embeddings multiplied by this (Gemma: sqrt(dim)); the classifier reads them unscaled
    )
    attn_scale: float = (
        0.0  # attention scores scaled by this; 0: 1 / sqrt(head_dim) (Gemma: query_pre_attn_scalar^-0.5)
    )
    sliding_window: int = (
        0  # 0: every layer attends to every earlier position; else the window of sliding layers
    )
    layer_types: tuple[str, ...] = ()  # per layer "full" or "sliding"; empty: every layer "full"
    rope_local_theta: float = 0.0  # the RoPE base of sliding layers; 0: rope_theta
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for key in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"[config {self.name}] {key} must be a positive integer, got {value!r}")
        if not isinstance(self.attn_head_dim, int) or self.attn_head_dim < 0:
            raise ConfigError(
                f"[config {self.name}] attn_head_dim must be 0 (dim / n_heads) or positive, got "
                f"{self.attn_head_dim!r}"
            )
        if not (
            isinstance(self.rope_theta, (int, float))
            and math.isfinite(self.rope_theta)
            and self.rope_theta > 1
        ):
            raise ConfigError(
                f"[config {self.name}] rope_theta must be a finite number > 1, got {self.rope_theta!r}"
            )
        if self.attn_head_dim == 0 and self.dim % self.n_heads:
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
        if self.mlp_act not in MLP_ACTS:
            raise ConfigError(f"[config {self.name}] mlp_act must be one of {MLP_ACTS}, got {self.mlp_act!r}")
        if self.layer_types and (
            len(self.layer_types) != self.n_layers or any(t not in LAYER_TYPES for t in self.layer_types)
        ):
            raise ConfigError(
                f"[config {self.name}] layer_types must name {self.n_layers} layers, each one of "
                f"{LAYER_TYPES}, got {self.layer_types!r}"
            )
        if "sliding" in self.layer_types and not (
            isinstance(self.sliding_window, int) and self.sliding_window > 0
        ):
            raise ConfigError(
                f"[config {self.name}] sliding layers need a sliding_window > 0, got {self.sliding_window!r}"
            )

    def check_kernels(self, vocab: bool = True) -> ModelConfig:
        """This config, or ConfigError naming the rule: the surfaces of the fused training kernels
        generated from it must fit the engine's 17-bit channel and 15-bit spatial fields. ``vocab`` False
        leaves out the vocabulary, which only the head's kernels (classifier, softmax) put in channels:
        the training step runs its head on the CPU, so a 151936-token Qwen trains.

        The kernels implement llama2.c's attention and the Hugging Face variants this config describes:
        q / k / v biases (Qwen 2), the per-head q / k RMSNorm before RoPE (Qwen 3), heads x head_dim !=
        dim (queries and the attention output have q_dim channels) and Llama 3's rope scaling (in the
        baked RoPE tables)."""
        q, kv, d, scores = self.q_dim, self.kv_dim, self.dim, self.n_heads * self.seq_len
        post = d if self.post_norms else 0  # the o_pre / ffn_pre taps of the post-norms
        taps = 2 * d + 2 * q + 2 * kv + (q + kv if self.qk_norm else 0) + post
        channels = {
            "dim": d,
            "hidden_dim": self.hidden_dim,
            **({"vocab_size": self.vocab_size} if vocab else {}),
            "attention score channels n_heads * seq_len": scores,
            "SDPA forward taps 2 * dim + 2 * q_dim + 2 * kv_dim (+ q_dim + kv_dim with a q / k norm, + dim "
            "with post-norms)": taps,
            "FFN forward taps 2 * dim + 3 * hidden_dim (+ dim with post-norms)": 2 * d
            + 3 * self.hidden_dim
            + post,
            "SDPA backward 1 output kv_dim * 2 + 2 * n_heads * seq_len": 2 * kv + 2 * scores,
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
    def layer_kinds(self) -> tuple[str, ...]:
        """The layer types the model has, each once, in order of first use: ("full",) for Llama."""
        return tuple(dict.fromkeys(self.layer_type(i) for i in range(self.n_layers)))

    def kind_window(self, kind: str) -> int:
        """How many positions (itself included) a query of a ``kind`` layer sees; 0: all earlier ones."""
        return self.sliding_window if kind == "sliding" else 0

    def kind_rope(self, kind: str) -> tuple[float, RopeScaling | None]:
        """The RoPE base and frequency scaling of a ``kind`` layer: a sliding layer turns by plain RoPE at
        ``rope_local_theta`` (when set, else ``rope_theta``), as transformers' Gemma 3 builds its local
        rotary embedding with the default rope type (``anekit.models.blocks.layer_plan``); a full layer
        by the model's base and scaling."""
        if kind == "sliding":
            return self.rope_local_theta or self.rope_theta, None
        return self.rope_theta, self.rope_scaling

    def layer_type(self, layer: int) -> str:
        """ "full" or "sliding": how far back layer ``layer`` attends."""
        return self.layer_types[layer] if self.layer_types else "full"

    def layer_window(self, layer: int) -> int:
        """How many positions (itself included) a query of layer ``layer`` sees; 0: all earlier ones."""
        return self.kind_window(self.layer_type(layer))

    def layer_rope_theta(self, layer: int) -> float:
        """The RoPE base of layer ``layer``: ``rope_local_theta`` for a sliding layer when set."""
        return self.kind_rope(self.layer_type(layer))[0]

    @property
    def scores_scale(self) -> float:
        """What attention scores q . k are multiplied by: ``attn_scale``, or 1 / sqrt(head_dim)."""
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.dim // self.n_heads

    @property
    def q_dim(self) -> int:
        """Channels of the queries (and of the attention's output): n_heads x head_dim."""
        return self.n_heads * self.head_dim

    def llama2c_problems(self) -> list[str]:
        """What llama2.c's model file and run.c cannot represent of this model (empty: nothing). run.c
        fixes rope_theta at 10000 and the RMSNorm epsilon at 1e-5, and has no place for biases, a q / k
        norm, rope scaling or a head size of the model's own."""
        problems = [
            what
            for what, present in (
                (f"rope_theta {self.rope_theta:g} (run.c uses 10000)", self.rope_theta != 10000.0),
                ("Llama 3 rope scaling", self.rope_scaling is not None),
                (f"RMSNorm epsilon {self.norm_eps:g} (run.c uses 1e-05)", self.norm_eps != 1e-5),
                ("q / k / v biases", self.qkv_bias),
                ("a q / k norm", self.qk_norm),
                (f"heads x head_dim = {self.q_dim} != dim {self.dim}", self.q_dim != self.dim),
            )
            if present
        ]
        return problems

    def rope_frequencies(self, dtype: type = np.float64) -> np.ndarray:
        """freq_j = 1 / theta^(2j / head_dim) for the head_dim / 2 pairs (computed in ``dtype``, as run.c
        computes them in float32), Llama 3's scaling applied when the model has it."""
        hd = self.head_dim
        pair: np.ndarray = np.arange(0, hd, 2, dtype=dtype)
        freq = dtype(1.0) / np.power(dtype(self.rope_theta), pair / dtype(hd))
        return freq if self.rope_scaling is None else self.rope_scaling.apply(freq)

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
