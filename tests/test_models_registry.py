"""anekit.models: families found by model_type, their config.json readers in Hugging Face's field names,
their checkpoint names, and which family a ModelConfig from any file format is of."""

from __future__ import annotations

import math

import pytest

from anekit import models
from anekit.hf.config import HFConfigError, parse_config
from anekit.kernels.config import PRESETS

GEMMA_270M = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 640,
    "intermediate_size": 2048,
    "num_hidden_layers": 18,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 262144,
    "max_position_embeddings": 32768,
    "query_pre_attn_scalar": 256,
    "sliding_window": 512,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rms_norm_eps": 1e-06,
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "torch_dtype": "bfloat16",
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
}


def test_registry_by_model_type() -> None:
    assert {t: models.family(t).name for t in models.REGISTRY} == {
        "llama": "llama",
        "mistral": "llama",
        "qwen2": "qwen",
        "qwen3": "qwen",
        "gemma3_text": "gemma3",
    }
    with pytest.raises(HFConfigError, match="model_type 'gpt2'"):
        models.family("gpt2")


def test_gemma3_270m_config() -> None:
    hc = parse_config(GEMMA_270M, seq_len=1024)
    cfg = hc.cfg
    assert hc.tied and hc.family.name == "gemma3" and hc.dtype == "bfloat16"
    assert (cfg.dim, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.q_dim) == (640, 256, 4, 1, 1024)
    assert cfg.norm_offset == 1.0 and cfg.post_norms and cfg.qk_norm and not cfg.qkv_bias
    assert cfg.mlp_act == "gelu_tanh"
    assert cfg.embed_scale == math.sqrt(640) and cfg.attn_scale == 1 / 16
    assert cfg.layer_types[:6] == ("sliding",) * 5 + ("full",)
    assert cfg.sliding_window == 512 and cfg.rope_local_theta == 10000.0 and cfg.rope_theta == 1e6
    model = models.model_for(cfg)
    sliding, full = model.plan(0), model.plan(5)
    assert (sliding.window, sliding.rope.theta, full.window, full.rope.theta) == (512, 1e4, 0, 1e6)
    assert sliding.score_scale == full.score_scale == 1 / 16


def test_gemma3_layer_types_from_pattern() -> None:
    raw = {k: v for k, v in GEMMA_270M.items() if k != "layer_types"} | {
        "num_hidden_layers": 7,
        "sliding_window_pattern": 3,
    }
    cfg = parse_config(raw, seq_len=64).cfg
    assert cfg.layer_types == ("sliding", "sliding", "full", "sliding", "sliding", "full", "sliding")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping 30.0 is not supported"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0 is not supported"),
        ({"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types must name num_hidden_layers"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope scaling 'linear'"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        (
            {"architectures": ["Gemma3ForConditionalGeneration"]},
            "architecture Gemma3ForConditionalGeneration",
        ),
    ],
)
def test_gemma3_refusals_name_the_field(change: dict, message: str) -> None:
    with pytest.raises(HFConfigError, match=message):
        parse_config(GEMMA_270M | change, seq_len=64)


def test_gemma3_transformers5_rope_parameters() -> None:
    raw = {k: v for k, v in GEMMA_270M.items() if k not in ("rope_theta", "rope_local_base_freq")}
    raw["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
    }
    cfg = parse_config(raw, seq_len=64).cfg
    assert (cfg.rope_theta, cfg.rope_local_theta) == (500000.0, 20000.0)


def test_family_of_configs_from_any_format() -> None:
    assert models.family_of(PRESETS["stories15M"]).name == "llama"
    assert models.family_of(PRESETS["default"].with_(qk_norm=True, attn_head_dim=32)).name == "qwen"
    assert models.family_of(PRESETS["default"].with_(qkv_bias=True)).name == "qwen"
    assert models.family_of(parse_config(GEMMA_270M, seq_len=64).cfg).name == "gemma3"


def test_gemma3_checkpoint_names() -> None:
    cfg = parse_config(
        GEMMA_270M | {"num_hidden_layers": 1, "layer_types": ["full_attention"]}, seq_len=8
    ).cfg
    names = {key: name for name, key, _ in models.GEMMA3.checkpoint_names(cfg, tied=True)}
    assert names["rms_ffn"] == "model.layers.0.pre_feedforward_layernorm.weight"
    assert names["post_att_norm"] == "model.layers.0.post_attention_layernorm.weight"
    assert names["post_ffn_norm"] == "model.layers.0.post_feedforward_layernorm.weight"
    assert names["q_norm"] == "model.layers.0.self_attn.q_norm.weight"
    assert "wcls" not in names and len(names) == 1 + 13 + 1
    llama = {key: name for name, key, _ in models.LLAMA.checkpoint_names(PRESETS["stories260K"], tied=False)}
    assert llama["rms_ffn"] == "model.layers.4.post_attention_layernorm.weight"
    assert llama["wcls"] == "lm_head.weight"
