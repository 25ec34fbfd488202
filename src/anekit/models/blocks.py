"""The building blocks a model family writes its layer in, as a Protocol over an abstract value type.

A family (``anekit.models.llama``, ``qwen``, ``gemma3``) writes its embedding, attention block, MLP block
and head once, as calls on a ``Blocks``; a lowering implements ``Blocks`` for one target: numpy columns
for the CPU forward (``anekit.models.cpu``), MIL values for the engine kernels and the CoreML export.
The family never sees the value type ``V``: a numpy array (channels, T), a MIL ``Var``, anything.

Weights are named by anekit's field names (``models.config`` / ``llama.params``): per layer rms_att,
wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, rms_ffn, w1, w2, w3, post_att_norm, post_ffn_norm; for the
whole model embed, rms_final, wcls. A layer's names are relative to the layer being lowered: the lowering
calls the family's block with that layer's ``LayerPlan`` and knows which layer it asked for.

Every block takes a ``name``: the role of its result in the layer ("att_norm", "q", "q_rope", "o",
"res1", ...). A lowering that names what it emits (MIL ops) derives its names from it; the others
ignore it. Three hooks carry what only some lowerings need: ``tap`` (a value the engine's backward
reads back, by the tap names of ``kernels.forward``), ``cache_value`` / ``cache_key`` (the point where
v / k are final: a KV cache is written there; what they return is what attention reads).

Shapes below are the CPU lowering's (channels, T); the others lay the same channels out their own way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from anekit.models.config import ModelConfig, RopeScaling

V = TypeVar("V")

MLP_ACTS = ("silu", "gelu_tanh")  # the gates ``Blocks.glu`` knows


@dataclass(frozen=True)
class Rope:
    """A RoPE variant: its base and, for full-attention layers of Llama 3 style models, its scaling.

    Pair j of a head (channels 2j, 2j + 1, the interleaved layout every lowering uses) turns by
    pos * freq_j, freq_j = 1 / theta^(2j / head_dim)."""

    theta: float
    scaling: RopeScaling | None = None

    def frequencies(self, head_dim: int, dtype: type = np.float64) -> np.ndarray:
        """freq_j for the head_dim / 2 pairs, computed in ``dtype`` (run.c computes them in float32),
        the scaling applied when there is one. The same arithmetic as ``ModelConfig.rope_frequencies``."""
        pair: np.ndarray = np.arange(0, head_dim, 2, dtype=dtype)
        freq: np.ndarray = dtype(1.0) / np.power(dtype(self.theta), pair / dtype(head_dim))
        return freq if self.scaling is None else self.scaling.apply(freq)


@dataclass(frozen=True)
class LayerPlan:
    """What differs from one layer to the next: its index, how far back it attends, its RoPE, and the
    scale of its attention scores."""

    index: int
    kind: str  # "full" or "sliding"
    window: int  # positions a query sees, itself included; 0: every earlier one (causal)
    rope: Rope
    score_scale: float  # attention scores are (q . k) * score_scale


def layer_plan(cfg: ModelConfig, i: int) -> LayerPlan:
    """The ``LayerPlan`` of layer ``i`` of ``cfg``: sliding layers take ``rope_local_theta`` (when set)
    and no rope scaling (Gemma 3's local RoPE is plain), full layers ``rope_theta`` and its scaling."""
    kind = cfg.layer_type(i)
    scaling = cfg.rope_scaling if kind == "full" else None
    scale = cfg.attn_scale if cfg.attn_scale else 1.0 / math.sqrt(cfg.head_dim)
    return LayerPlan(i, kind, cfg.layer_window(i), Rope(cfg.layer_rope_theta(i), scaling), scale)


class Blocks(Protocol[V]):
    """The blocks a family's layer is written in. ``cfg`` gives the lowering the shape (heads, head_dim,
    epsilon); the family passes what varies (weights, offsets, windows, scales) explicitly."""

    cfg: ModelConfig

    # -- norms ------------------------------------------------------------------------------------------

    def rms_norm(self, x: V, weight: str, *, offset: float, name: str) -> V:
        """x / sqrt(mean over channels of x^2 + cfg.norm_eps) * (offset + w): (dim, T) -> (dim, T).
        ``offset`` 0 is Llama's norm, 1 Gemma's x * (1 + w)."""
        ...

    def head_rms_norm(self, x: V, weight: str, *, heads: int, offset: float, name: str) -> V:
        """Each of the ``heads`` heads of x (heads * head_dim, T) RMS-normalised on its own and scaled by
        (offset + w), w (head_dim,): the q / k norm of Qwen 3 and Gemma 3."""
        ...

    # -- projections ------------------------------------------------------------------------------------

    def linear(self, x: V, weight: str, *, name: str) -> V:
        """W @ x, W (out, in) as llama2.c stores it: (in, T) -> (out, T)."""
        ...

    def bias(self, x: V, weight: str, *, name: str) -> V:
        """x + b, b (C,) added to every position: a projection's bias (Qwen 2's q / k / v)."""
        ...

    # -- attention --------------------------------------------------------------------------------------

    def rope(self, q: V, k: V, *, rope: Rope, name: str) -> tuple[V, V]:
        """Queries (q_dim, T) and keys (kv_dim, T) rotated at this call's positions: each head's pair
        (2j, 2j + 1) by pos * freq_j of ``rope``. One block for both, as both turn by the same angles."""
        ...

    def attention(self, q: V, k: V, v: V, *, window: int, score_scale: float, name: str) -> V:
        """Grouped-query attention: query head h reads kv head h // (n_heads / n_kv_heads); scores
        (q . k) * score_scale, masked causally (``window`` 0) or to a band (key j visible to the query at
        position i iff i - window < j <= i), softmax over keys, the weighted sum of values.
        q (q_dim, T), k / v what ``cache_key`` / ``cache_value`` returned -> (q_dim, T)."""
        ...

    # -- MLP and the rest -------------------------------------------------------------------------------

    def glu(self, gate: V, up: V, *, act: str, name: str) -> V:
        """act(gate) * up, act one of ``MLP_ACTS``: "silu" (SwiGLU) or "gelu_tanh" (GeGLU with the tanh
        approximation of gelu, transformers' gelu_pytorch_tanh)."""
        ...

    def add(self, x: V, y: V, *, name: str) -> V:
        """x + y: a residual add."""
        ...

    def scale(self, x: V, factor: float, *, name: str) -> V:
        """x * factor (Gemma's embeddings times sqrt(hidden_size))."""
        ...

    def embedding(self, tokens: V, *, name: str) -> V:
        """Rows of the embedding table (embed) for tokens: (T,) -> (dim, T)."""
        ...

    def classifier(self, x: V, *, name: str) -> V:
        """Logits: wcls @ x, or embed @ x when the classifier is tied to the (unscaled) embedding."""
        ...

    # -- hooks --------------------------------------------------------------------------------------------

    def tap(self, name: str, x: V) -> V:
        """``x`` itself; a lowering may keep it under ``name`` (an engine kernel's output tap)."""
        ...

    def cache_value(self, v: V, *, name: str) -> V:
        """The point where the values v (kv_dim, T) are final; returns what attention reads for them
        (the cached values of every position so far, for a lowering with a KV cache)."""
        ...

    def cache_key(self, k: V, *, name: str) -> V:
        """The point where the keys k (kv_dim, T) are final (after their norm and RoPE); returns what
        attention reads for them."""
        ...
