"""Float64 numpy oracle of a Hugging Face Gemma 3 text model (``Gemma3ForCausalLM``, model_type gemma3_text).

Written from transformers' modeling_gemma3.py and configuration_gemma3.py, independent of ``anekit``:
tests compare anekit's family file (anekit.models.gemma3) and its lowerings against this. Checkpoints are
read with ``tests.hf_reference.load`` (its own safetensors parser); everything is computed in float64.

Layout: activations are ROWS, one per token: x is (T, hidden); weights keep torch's (out, in) layout.

The conventions, each as transformers applies it:

- Gemma3RMSNorm: ``x / sqrt(mean(x^2) + eps) * (1 + weight)`` (transformers in float32; here float64),
  eps = rms_norm_eps (default 1e-6). Four per layer plus q / k norms (over head_dim) and model.norm.
- Gemma3TextScaledWordEmbedding: embed_tokens(ids) * sqrt(hidden_size).
- Decoder layer: r = x; h = input_layernorm(x); h = self_attn(h); h = post_attention_layernorm(h);
  x = r + h; r = x; h = pre_feedforward_layernorm(x); h = mlp(h); h = post_feedforward_layernorm(h);
  x = r + h.
- Attention: q / k / v projections without bias, q and k (T, heads, head_dim) normed by q_norm / k_norm
  BEFORE RoPE; rotate-half RoPE with inv_freq = 1 / base ** (arange(0, hd, 2) / hd), base rope_theta for
  "full_attention" layers and rope_local_base_freq for "sliding_attention" ones; grouped-query heads
  (repeat_kv); scores q k^T * query_pre_attn_scalar ** -0.5; mask: key j visible to query i iff j <= i,
  and on sliding layers also i - j < sliding_window; softmax; o_proj.
- layer_types from the config, else layer i is full iff (i + 1) % sliding_window_pattern == 0 (default 6).
- MLP: down(gelu_tanh(gate(x)) * up(x)), gelu_tanh(a) = 0.5 a (1 + tanh(sqrt(2 / pi) (a + 0.044715 a^3))).
- Logits: model.norm, then the embedding matrix (tie_word_embeddings, default true) or lm_head.weight.
  No soft-capping (a config with final_logit_softcapping or attn_logit_softcapping set is refused here).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from tests.hf_reference import read_safetensors


def load(directory: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json, name -> float64 tensor) of a single-file checkpoint, read with the reference's own
    safetensors parser."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    return config, read_safetensors((directory / "model.safetensors").read_bytes(), str(directory))


def layer_types(config: dict[str, Any]) -> list[str]:
    """Per layer "full_attention" or "sliding_attention"."""
    if config.get("layer_types") is not None:
        return list(config["layer_types"])
    pattern = config.get("sliding_window_pattern", 6)
    n = config["num_hidden_layers"]
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]


def norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * (1 + weight) over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + weight)


def gelu_tanh(a: np.ndarray) -> np.ndarray:
    return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)))


def rope(x: np.ndarray, base: float) -> np.ndarray:
    """x (heads, T, hd) rotated at positions 0 .. T-1: x cos + rotate_half(x) sin."""
    hd, t = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
    angles = np.outer(np.arange(t, dtype=np.float64), inv_freq)  # (T, hd/2)
    emb = np.concatenate([angles, angles], axis=-1)  # (T, hd)
    half = hd // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int | None) -> np.ndarray:
    """q (H, T, hd), k / v (KV, T, hd) -> (T, H * hd); ``window`` None: causal, else sliding."""
    heads, t, hd = q.shape
    k = np.repeat(k, heads // k.shape[0], axis=0)  # (H, T, hd)
    v = np.repeat(v, heads // v.shape[0], axis=0)
    scores = q @ k.transpose(0, 2, 1) * scale  # (H, T, T)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = j <= i
    if window is not None:
        visible &= (i - j) < window
    scores = np.where(visible, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return (probs @ v).transpose(1, 0, 2).reshape(t, heads * hd)


def forward(config: dict[str, Any], tensors: dict[str, np.ndarray], ids: Any) -> np.ndarray:
    """Logits (T, vocab) float64 of the token ids (T,) at positions 0 .. T-1."""
    if config.get("model_type") != "gemma3_text":
        raise NotImplementedError(f"[gemma3_reference] model_type {config.get('model_type')!r}")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(key) is not None:
            raise NotImplementedError(f"[gemma3_reference] {key} not supported")
    w = {name: np.asarray(a, np.float64) for name, a in tensors.items()}
    ids = np.asarray(ids, dtype=np.int64)
    eps = config.get("rms_norm_eps", 1e-6)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads, hd = config.get("num_key_value_heads", heads), config.get("head_dim", 256)
    scale = config.get("query_pre_attn_scalar", 256) ** -0.5
    embed = w["model.embed_tokens.weight"]  # (V, hidden)
    x = embed[ids] * math.sqrt(hidden)  # (T, hidden)
    t = ids.size
    for i, kind in enumerate(layer_types(config)):
        p = f"model.layers.{i}."
        sliding = kind == "sliding_attention"
        base = config.get("rope_local_base_freq", 10000.0) if sliding else config.get("rope_theta", 1e6)
        h = norm(x, w[p + "input_layernorm.weight"], eps)  # (T, hidden)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, heads, hd).transpose(1, 0, 2)  # (H, T, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv_heads, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv_heads, hd).transpose(1, 0, 2)
        q = rope(norm(q, w[p + "self_attn.q_norm.weight"], eps), base)
        k = rope(norm(k, w[p + "self_attn.k_norm.weight"], eps), base)
        att = attention(q, k, v, scale, config.get("sliding_window", 4096) if sliding else None)  # (T, H*hd)
        h = att @ w[p + "self_attn.o_proj.weight"].T  # (T, hidden)
        x = x + norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T  # (T, inter)
        h = (gelu_tanh(gate) * up) @ w[p + "mlp.down_proj.weight"].T  # (T, hidden)
        x = x + norm(h, w[p + "post_feedforward_layernorm.weight"], eps)
    x = norm(x, w["model.norm.weight"], eps)
    head = embed if config.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return x @ head.T  # (T, V)


def greedy(config: dict[str, Any], tensors: dict[str, np.ndarray], prompt_ids: Any, n_new: int) -> list[int]:
    """``n_new`` greedily chosen ids after ``prompt_ids`` (argmax), recomputing the whole forward each step."""
    ids = [int(i) for i in prompt_ids]
    new: list[int] = []
    for _ in range(n_new):
        token = int(np.argmax(forward(config, tensors, ids)[-1]))
        ids.append(token)
        new.append(token)
    return new
