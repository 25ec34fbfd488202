"""Gemma 3's text model (``Gemma3ForCausalLM``, ``model_type`` gemma3_text, e.g. Gemma 3 270M), stated as
its difference from Llama (``anekit.models.llama``), following transformers' ``modeling_gemma3.py``:

    x   = embed[tokens] * sqrt(hidden_size)
    h   = x + post_att_norm(attention(input_norm(x)))           every norm: rmsnorm(x) * (1 + w), float32
    out = h + post_ffn_norm(W2 (gelu_tanh(W1 m) * W3 m))       m = pre_ffn_norm(h)

* four norms per layer: ``input_layernorm`` (rms_att), ``post_attention_layernorm`` (post_att_norm: the
  attention output's norm, NOT the pre-FFN norm it is in Llama), ``pre_feedforward_layernorm``
  (rms_ffn), ``post_feedforward_layernorm`` (post_ffn_norm); the q / k per-head norms are (1 + w) too;
* GeGLU with the tanh gelu (``hidden_activation`` gelu_pytorch_tanh);
* scores scaled by ``query_pre_attn_scalar``^-0.5 instead of head_dim^-0.5;
* ``layer_types`` (or, in older configs, every ``sliding_window_pattern``-th layer full, the others
  sliding) says which layers attend to the last ``sliding_window`` positions only; those turn by RoPE
  base ``rope_local_base_freq``, the full ones by ``rope_theta`` (with ``rope_scaling``, where Llama 3's);
* the classifier is the (unscaled) embedding (``tie_word_embeddings`` defaults to true);
* ``final_logit_softcapping`` / ``attn_logit_softcapping`` (Gemma 2's) and bidirectional attention are
  refused when set; head_dim defaults to 256.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from anekit.models import args as A
from anekit.models.blocks import Blocks, LayerPlan, V
from anekit.models.config import ConfigError, ModelConfig, RopeScaling
from anekit.models.family import Family, plain_name
from anekit.models.llama import LAYER_NAMES as LLAMA_NAMES
from anekit.models.llama import Llama

ARCHITECTURES: dict[str, tuple[str, ...]] = {"gemma3_text": ("Gemma3ForCausalLM",)}

LAYER_NAMES = {
    **LLAMA_NAMES,
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "post_att_norm": "post_attention_layernorm.weight",
    "rms_ffn": "pre_feedforward_layernorm.weight",
    "post_ffn_norm": "post_feedforward_layernorm.weight",
}
HF_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh"}  # hidden_activation -> the gate Blocks.glu computes
DEFAULT_HEAD_DIM = 256  # Gemma3TextConfig's defaults, used when config.json names none
DEFAULT_PATTERN = 6
DEFAULT_WINDOW = 4096
DEFAULT_LOCAL_THETA = 10000.0


@dataclass(frozen=True)
class Gemma3Args:
    """config.json of a Gemma 3 text model, in transformers' ``Gemma3TextConfig`` field names."""

    model_type: str
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    rope_local_base_freq: float
    query_pre_attn_scalar: float
    sliding_window: int
    layer_types: tuple[str, ...]  # per layer "full_attention" or "sliding_attention"
    hidden_activation: str
    tie_word_embeddings: bool
    torch_dtype: str

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> Gemma3Args:
        """The args of a config.json's contents, refusing (one line naming the field) what anekit cannot
        run."""
        model_type = raw["model_type"]
        arch = A.architecture(raw, model_type, ARCHITECTURES[model_type])
        A.refuse_quantized(raw)
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if raw.get(key) is not None:
                raise A.fail(
                    f"{key} {raw[key]!r} is not supported (anekit's Gemma 3 has no logit soft-capping)"
                )
        if A.field(raw, "use_bidirectional_attention", bool, False):
            raise A.fail("use_bidirectional_attention true is not supported (anekit's attention is causal)")
        act = A.field(raw, "hidden_activation", str, A.field(raw, "hidden_act", str, "gelu_pytorch_tanh"))
        if act not in ACTIVATIONS:
            raise A.fail(f"hidden_activation {act!r} is not supported (expected 'gelu_pytorch_tanh')")
        if A.field(raw, "attention_bias", bool, False):
            raise A.fail("attention_bias true is not supported (Gemma 3's projections have no biases)")
        if A.field(raw, "mlp_bias", bool, False):
            raise A.fail("mlp_bias true is not supported (no MLP biases)")
        layers = A.field(raw, "num_hidden_layers", int)
        head_dim = A.positive(raw, "head_dim", DEFAULT_HEAD_DIM)
        scalar = A.field(raw, "query_pre_attn_scalar", float, float(head_dim))
        if not scalar > 0:
            raise A.fail(f"query_pre_attn_scalar must be positive, got {scalar!r}")
        theta, local_theta, scaling = _rope(raw)
        return cls(
            model_type=model_type,
            architecture=arch,
            hidden_size=A.field(raw, "hidden_size", int),
            intermediate_size=A.field(raw, "intermediate_size", int),
            num_hidden_layers=layers,
            num_attention_heads=(heads := A.field(raw, "num_attention_heads", int)),
            num_key_value_heads=A.field(raw, "num_key_value_heads", int, heads),
            head_dim=head_dim,
            vocab_size=A.field(raw, "vocab_size", int),
            max_position_embeddings=A.positive(raw, "max_position_embeddings", 131072),
            rms_norm_eps=A.norm_eps(raw),
            rope_theta=theta,
            rope_scaling=scaling,
            rope_local_base_freq=local_theta,
            query_pre_attn_scalar=float(scalar),
            sliding_window=A.positive(raw, "sliding_window", DEFAULT_WINDOW),
            layer_types=_layer_types(raw, layers),
            hidden_activation=act,
            tie_word_embeddings=A.field(raw, "tie_word_embeddings", bool, True),
            torch_dtype=A.dtype(raw),
        )

    def to_model_config(self, *, seq_len: int, name: str = "hf") -> ModelConfig:
        """The ModelConfig anekit runs, ``seq_len`` the working context."""
        try:
            return ModelConfig(
                dim=self.hidden_size,
                hidden_dim=self.intermediate_size,
                n_layers=self.num_hidden_layers,
                n_heads=self.num_attention_heads,
                n_kv_heads=self.num_key_value_heads,
                vocab_size=self.vocab_size,
                seq_len=seq_len,
                norm_eps=self.rms_norm_eps,
                rope_theta=self.rope_theta,
                attn_head_dim=self.head_dim,
                qk_norm=True,
                rope_scaling=self.rope_scaling,
                norm_offset=1.0,
                post_norms=True,
                mlp_act=ACTIVATIONS[self.hidden_activation],
                embed_scale=math.sqrt(self.hidden_size),
                attn_scale=self.query_pre_attn_scalar**-0.5,
                sliding_window=self.sliding_window,
                layer_types=tuple(HF_LAYER_TYPES[t] for t in self.layer_types),
                rope_local_theta=self.rope_local_base_freq,
                name=name,
            )
        except ConfigError as e:
            raise A.config_error(e) from e


def _rope(raw: dict[str, Any]) -> tuple[float, float, RopeScaling | None]:
    """(rope_theta, rope_local_base_freq, the full layers' scaling): transformers 4's top-level fields, or
    transformers 5's rope_parameters, either one object or one per layer type."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise A.fail(f"rope_parameters must hold an object per layer type, got {params!r}")
        theta = A.theta(full.get("rope_theta", 1_000_000.0), "rope_parameters.full_attention.rope_theta")
        local_theta = A.theta(
            local.get("rope_theta", DEFAULT_LOCAL_THETA), "rope_parameters.sliding_attention.rope_theta"
        )
        if A.rope_scaling(local, "rope_parameters.sliding_attention") is not None:
            raise A.fail("rope_parameters.sliding_attention: sliding layers' RoPE is not scaled in Gemma 3")
        return theta, local_theta, A.rope_scaling(full, "rope_parameters.full_attention")
    theta, scaling = A.rope({"rope_theta": 1_000_000.0, **raw})
    local_theta = A.theta(raw.get("rope_local_base_freq", DEFAULT_LOCAL_THETA), "rope_local_base_freq")
    return theta, local_theta, scaling


def _layer_types(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    """``layer_types`` as given, or every ``sliding_window_pattern``-th layer full (Gemma3TextConfig)."""
    given = raw.get("layer_types")
    if given is None:
        pattern = A.positive(raw, "sliding_window_pattern", DEFAULT_PATTERN)
        return tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers))
    if not isinstance(given, list) or any(t not in HF_LAYER_TYPES for t in given) or len(given) != layers:
        raise A.fail(
            f"layer_types must name num_hidden_layers ({layers}) layers, each one of "
            f"{', '.join(HF_LAYER_TYPES)}; got {given!r}"
        )
    return tuple(given)


class Gemma3(Llama[V]):
    """Llama's layer with Gemma 3's scaled embedding, q / k norm and post-norms (the (1 + w) norms,
    the GeGLU, the score scale and the sliding layers come from the config: ``LayerPlan``)."""

    def embed(self, b: Blocks[V], tokens: V) -> V:
        x = super().embed(b, tokens)  # (dim, T)
        return b.scale(x, self.cfg.embed_scale, name="embed_scaled")  # (dim, T)

    def qk_norm(self, b: Blocks[V], q: V, k: V) -> tuple[V, V]:
        cfg = self.cfg
        q, k = b.tap("q_pre", q), b.tap("k_pre", k)  # the norm's backward reads its inputs
        q = b.head_rms_norm(q, "q_norm", heads=cfg.n_heads, offset=cfg.norm_offset, name="q_norm")
        k = b.head_rms_norm(k, "k_norm", heads=cfg.n_kv_heads, offset=cfg.norm_offset, name="k_norm")
        return q, k

    def attention(self, b: Blocks[V], x: V, plan: LayerPlan) -> V:
        o = super().attention(b, x, plan)  # (dim, T)
        return b.rms_norm(o, "post_att_norm", offset=self.cfg.norm_offset, name="post_att_norm")  # (dim, T)

    def mlp(self, b: Blocks[V], x: V, plan: LayerPlan) -> V:
        y = super().mlp(b, x, plan)  # (dim, T)
        return b.rms_norm(y, "post_ffn_norm", offset=self.cfg.norm_offset, name="post_ffn_norm")  # (dim, T)


LANGUAGE_MODEL = (
    "language_model."  # the prefix of the text model's tensors saved from Gemma 3's multimodal class
)


def rename(name: str) -> str | None:
    """A Gemma 3 tensor's name as ``checkpoint_names`` gives it: a text model saved from the multimodal
    class (``language_model.model.*``) read as the text model it is."""
    return plain_name(name.removeprefix(LANGUAGE_MODEL))


def owns(cfg: ModelConfig) -> bool:
    """A config with Gemma 3's post-norms."""
    return cfg.post_norms


FAMILY = Family(
    name="gemma3",
    architectures=ARCHITECTURES,
    from_config=Gemma3Args.from_config,
    model=Gemma3,
    layer_names=LAYER_NAMES,
    owns=owns,
    rename=rename,
)
