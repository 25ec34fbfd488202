"""The Qwen family: Qwen 2 / 2.5 and Qwen 3 (``model_type`` qwen2, qwen3), stated as its difference from
Llama (``anekit.models.llama``), following transformers' ``Qwen2Attention`` / ``Qwen3Attention``:

* Qwen 2's q / k / v projections always have biases (its o_proj none), whatever ``attention_bias`` says;
* Qwen 3 RMS-normalises each head of q and k (``q_norm`` / ``k_norm``, weights (head_dim,)) before
  RoPE, and its head_dim defaults to 128 (``Qwen3Config``'s default); ``attention_bias`` true is refused.

Everything else (the config's other fields, the MLP, the checkpoint names) is Llama's.
"""

from __future__ import annotations

from typing import Any

from anekit.models.blocks import Blocks, V
from anekit.models.config import ModelConfig
from anekit.models.family import Family
from anekit.models.llama import LAYER_NAMES as LLAMA_NAMES
from anekit.models.llama import Llama, LlamaArgs

ARCHITECTURES: dict[str, tuple[str, ...]] = {"qwen2": ("Qwen2ForCausalLM",), "qwen3": ("Qwen3ForCausalLM",)}

LAYER_NAMES = {
    **LLAMA_NAMES,
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
}
QWEN3_HEAD_DIM = 128  # Qwen3Config's head_dim when config.json names none


class QwenArgs(LlamaArgs):
    """config.json of a Qwen 2 / 3 model: Llama's fields, with Qwen 3's head_dim default."""

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> QwenArgs:
        model_type = raw["model_type"]
        return cls(**cls.fields(raw, model_type, QWEN3_HEAD_DIM if model_type == "qwen3" else 0))

    @staticmethod
    def architectures() -> dict[str, tuple[str, ...]]:
        return ARCHITECTURES

    @staticmethod
    def check_bias(raw: dict[str, Any], model_type: str) -> None:
        if model_type != "qwen2":  # Qwen 2's biases are fixed by the architecture
            LlamaArgs.check_bias(raw, model_type)

    def config_fields(self) -> dict[str, Any]:
        return {"qkv_bias": self.model_type == "qwen2", "qk_norm": self.model_type == "qwen3"}


class Qwen(Llama[V]):
    """Llama's layer with Qwen 2's projection biases and Qwen 3's q / k norm."""

    def project(self, b: Blocks[V], xn: V) -> tuple[V, V, V]:
        q, k, v = super().project(b, xn)
        if self.cfg.qkv_bias:  # Qwen 2: biases after the projections
            q, k, v = (
                b.bias(q, "bq", name="q_bias"),
                b.bias(k, "bk", name="k_bias"),
                b.bias(v, "bv", name="v_bias"),
            )
        return q, k, v

    def qk_norm(self, b: Blocks[V], q: V, k: V) -> tuple[V, V]:
        cfg = self.cfg
        if not cfg.qk_norm:
            return q, k
        q, k = b.tap("q_pre", q), b.tap("k_pre", k)  # the norm's backward reads its inputs
        q = b.head_rms_norm(q, "q_norm", heads=cfg.n_heads, offset=cfg.norm_offset, name="q_norm")
        k = b.head_rms_norm(k, "k_norm", heads=cfg.n_kv_heads, offset=cfg.norm_offset, name="k_norm")
        return q, k


def owns(cfg: ModelConfig) -> bool:
    """A config with Qwen's biases or q / k norm and none of Gemma 3's fields."""
    return bool(cfg.qkv_bias or cfg.qk_norm) and not (cfg.post_norms or cfg.norm_offset or cfg.layer_types)


FAMILY = Family(
    name="qwen",
    architectures=ARCHITECTURES,
    from_config=QwenArgs.from_config,
    model=Qwen,
    layer_names=LAYER_NAMES,
    owns=owns,
)
