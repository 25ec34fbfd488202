"""The Llama family: llama2.c's models, Llama 2 / 3, Mistral, SmolLM2 (``model_type`` llama, mistral).

The layer, as run.c's ``forward()`` and transformers' ``LlamaDecoderLayer`` compute it:

    h   = x + Wo attention(rope(Wq n), rope(Wk n), Wv n)        n = rmsnorm(x) * rms_att
    out = h + W2 (silu(W1 m) * W3 m)                            m = rmsnorm(h) * rms_ffn

with grouped-query attention (query head h reads kv head h // (n_heads / n_kv_heads)), scores scaled by
1 / sqrt(head_dim), RoPE on adjacent channel pairs (checkpoints in rotate-half order are permuted on
import). The config fields follow transformers' ``LlamaConfig`` / ``MistralConfig``:

* head_dim is ``head_dim`` when given, else hidden_size / num_attention_heads;
* num_key_value_heads defaults to num_attention_heads (no GQA);
* rope_theta at the top level (transformers 4) or under ``rope_parameters`` (5), default 10000; only
  Llama 3's rope scaling is implemented;
* ``attention_bias`` true (biases on q, k, v and o) and ``mlp_bias`` are refused, as is any hidden_act
  but silu;
* Mistral's ``sliding_window`` (used unless ``use_sliding_window`` is false) must not be shorter than the
  working context: within it a sliding window is full causal attention;
* ``tie_word_embeddings`` defaults to false: a tied checkpoint has no ``lm_head.weight``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic

from anekit.models import args as A
from anekit.models.blocks import Blocks, LayerPlan, V, layer_plan
from anekit.models.config import ConfigError, ModelConfig, RopeScaling
from anekit.models.family import Family

ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "llama": ("LlamaForCausalLM",),
    "mistral": ("MistralForCausalLM",),
}

# anekit's layer field -> the Hugging Face name after "model.layers.{i}."
LAYER_NAMES = {
    "rms_att": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "rms_ffn": "post_attention_layernorm.weight",
    "w1": "mlp.gate_proj.weight",
    "w3": "mlp.up_proj.weight",
    "w2": "mlp.down_proj.weight",
}


@dataclass(frozen=True)
class LlamaArgs:
    """config.json of a Llama-family model, in transformers' field names."""

    model_type: str
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int  # 0: hidden_size / num_attention_heads
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    tie_word_embeddings: bool
    torch_dtype: str
    sliding_window: int | None = None  # Mistral's, when used

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> LlamaArgs:
        """The args of a config.json's contents, refusing (one line naming the field) what anekit cannot
        run; ``model_type`` must be one of ``ARCHITECTURES``."""
        model_type = raw["model_type"]
        return cls(**cls.fields(raw, model_type))

    @classmethod
    def fields(cls, raw: dict[str, Any], model_type: str, head_dim_default: int = 0) -> dict[str, Any]:
        """The checked fields of ``raw``, shared by the families that state only their difference."""
        arch = A.architecture(raw, model_type, cls.architectures()[model_type])
        A.refuse_quantized(raw)
        act = A.field(raw, "hidden_act", str, "silu")
        if act != "silu":
            raise A.fail(f"hidden_act {act!r} is not supported (expected 'silu')")
        if A.field(raw, "mlp_bias", bool, False):
            raise A.fail("mlp_bias true is not supported (no MLP biases)")
        dim = A.field(raw, "hidden_size", int)
        heads = A.field(raw, "num_attention_heads", int)
        kv_heads = A.field(raw, "num_key_value_heads", int, heads)
        head_dim = A.field(raw, "head_dim", int, head_dim_default)
        if head_dim == 0 and heads > 0 and dim % heads:
            raise A.fail(
                f"hidden_size {dim} is not divisible by num_attention_heads {heads} and there is no head_dim"
            )
        max_pos = A.positive(raw, "max_position_embeddings", 2048)
        use_window = A.field(raw, "use_sliding_window", bool, model_type == "mistral")
        window = A.field(raw, "sliding_window", int, 0) if use_window else None
        theta, scaling = A.rope(raw)
        eps = A.norm_eps(raw)
        cls.check_bias(raw, model_type)
        return dict(
            model_type=model_type,
            architecture=arch,
            hidden_size=dim,
            intermediate_size=A.field(raw, "intermediate_size", int),
            num_hidden_layers=A.field(raw, "num_hidden_layers", int),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            vocab_size=A.field(raw, "vocab_size", int),
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            rms_norm_eps=eps,
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=A.field(raw, "tie_word_embeddings", bool, False),
            torch_dtype=A.dtype(raw),
            sliding_window=window,
        )

    @staticmethod
    def architectures() -> dict[str, tuple[str, ...]]:
        return ARCHITECTURES

    @staticmethod
    def check_bias(raw: dict[str, Any], model_type: str) -> None:
        if A.field(raw, "attention_bias", bool, False):
            raise A.fail(
                f"attention_bias true ({model_type} then has biases on q, k, v and o) is not supported; "
                "anekit implements Qwen 2's q / k / v biases"
            )

    def config_fields(self) -> dict[str, Any]:
        """ModelConfig's fields the family sets beyond the shape (Qwen and Gemma add theirs)."""
        return {}

    def to_model_config(self, *, seq_len: int, name: str = "hf") -> ModelConfig:
        """The ModelConfig anekit runs, ``seq_len`` the working context."""
        window = self.sliding_window
        if isinstance(window, int) and 0 < window < seq_len:
            raise A.fail(
                f"sliding_window {window} is shorter than the working context {seq_len}; anekit's attention "
                "is full causal attention for this family (use a context of at most the window)"
            )
        dim, heads, hd = self.hidden_size, self.num_attention_heads, self.head_dim
        try:
            return ModelConfig(
                dim=dim,
                hidden_dim=self.intermediate_size,
                n_layers=self.num_hidden_layers,
                n_heads=heads,
                n_kv_heads=self.num_key_value_heads,
                vocab_size=self.vocab_size,
                seq_len=seq_len,
                norm_eps=self.rms_norm_eps,
                rope_theta=self.rope_theta,
                attn_head_dim=0 if hd == dim // max(heads, 1) and dim % max(heads, 1) == 0 else hd,
                rope_scaling=self.rope_scaling,
                name=name,
                **self.config_fields(),
            )
        except ConfigError as e:
            raise A.config_error(e) from e


class Llama(Generic[V]):
    """The layer, written once over ``Blocks``; Qwen and Gemma 3 subclass it and state their difference.

    ``attention`` and ``mlp`` are the two blocks of a layer without their residual adds (an engine kernel
    each); ``layer`` adds them; ``embed`` and ``head`` are the model's ends. Taps carry the names of
    ``kernels.forward``'s layouts."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg

    def plan(self, i: int) -> LayerPlan:
        return layer_plan(self.cfg, i)

    def embed(self, b: Blocks[V], tokens: V) -> V:
        return b.embedding(tokens, name="embed")  # (dim, T)

    def project(self, b: Blocks[V], xn: V) -> tuple[V, V, V]:
        """q, k, v of the normalised input: (q_dim, T), (kv_dim, T) x 2."""
        return b.linear(xn, "wq", name="q"), b.linear(xn, "wk", name="k"), b.linear(xn, "wv", name="v")

    def qk_norm(self, b: Blocks[V], q: V, k: V) -> tuple[V, V]:
        """What happens to q and k between the projection and RoPE: nothing in Llama."""
        return q, k

    def attention(self, b: Blocks[V], x: V, plan: LayerPlan) -> V:
        """The attention block of layer ``plan.index``: (dim, T) -> (dim, T), before the residual add."""
        cfg = self.cfg
        xn = b.tap("xnorm", b.rms_norm(x, "rms_att", offset=cfg.norm_offset, name="att_norm"))  # (dim, T)
        q, k, v = self.project(b, xn)  # (q_dim, T), (kv_dim, T), (kv_dim, T)
        values = b.cache_value(b.tap("v", v), name="v_cache")
        q, k = self.qk_norm(b, q, k)
        if cfg.rope:
            q, k = b.rope(q, k, rope=plan.rope, name="rope")  # (q_dim, T), (kv_dim, T)
        keys = b.cache_key(b.tap("k", k), name="k_cache")
        att = b.attention(
            b.tap("q", q), keys, values, window=plan.window, score_scale=plan.score_scale, name="att"
        )  # (q_dim, T)
        return b.tap("o_out", b.linear(b.tap("attn_out", att), "wo", name="o"))  # (dim, T)

    def mlp(self, b: Blocks[V], x: V, plan: LayerPlan) -> V:
        """The gated MLP block: (dim, T) -> (dim, T), before the residual add."""
        cfg = self.cfg
        xn = b.tap("x2norm", b.rms_norm(x, "rms_ffn", offset=cfg.norm_offset, name="ffn_norm"))  # (dim, T)
        h1 = b.tap("h1", b.linear(xn, "w1", name="h1"))  # (hidden, T)
        h3 = b.tap("h3", b.linear(xn, "w3", name="h3"))  # (hidden, T)
        gate = b.tap("silu_out", b.glu(h1, h3, act=cfg.mlp_act, name="gate"))  # (hidden, T)
        return b.tap("ffn_out", b.linear(gate, "w2", name="down"))  # (dim, T)

    def layer(self, b: Blocks[V], x: V, plan: LayerPlan) -> V:
        """One transformer layer: both blocks with their residual adds."""
        x = b.add(x, self.attention(b, x, plan), name="res1")  # (dim, T)
        return b.add(x, self.mlp(b, x, plan), name="res2")  # (dim, T)

    def head(self, b: Blocks[V], x: V) -> V:
        """The final RMSNorm and the classifier: (dim, T) -> (vocab, T)."""
        xn = b.rms_norm(x, "rms_final", offset=self.cfg.norm_offset, name="final_norm")  # (dim, T)
        return b.classifier(xn, name="logits")  # (vocab, T)


def owns(cfg: ModelConfig) -> bool:
    """A config of plain Llama shape (llama2.c's, Llama 2 / 3, Mistral): none of the others' fields."""
    return not (cfg.qkv_bias or cfg.qk_norm or cfg.post_norms or cfg.norm_offset or cfg.layer_types)


FAMILY = Family(
    name="llama",
    architectures=ARCHITECTURES,
    from_config=LlamaArgs.from_config,
    model=Llama,
    layer_names=LAYER_NAMES,
    owns=owns,
)
