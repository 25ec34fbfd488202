"""Float64 numpy oracle of a Hugging Face Llama / Qwen2 / Qwen3 causal LM: load a checkpoint, run it.

Written from transformers' modeling_llama.py, modeling_qwen2.py and modeling_qwen3.py (and
modeling_rope_utils.py), independent of ``anekit``: tests compare the importer (anekit.hf) against this.
It reads the safetensors files with its own parser (BF16 included) and computes everything in float64.

Layout: activations are ROWS, one per token: x is (T, hidden). Weights keep torch's nn.Linear layout
(out, in), so a projection is ``y = x @ W.T (+ b)``.

The conventions, each as transformers applies it:

- RMSNorm (LlamaRMSNorm / Qwen2RMSNorm / Qwen3RMSNorm): ``weight * x / sqrt(mean(x^2) + eps)`` over the
  last axis, eps = config["rms_norm_eps"] (default 1e-6). (transformers computes it in float32; here float64.)
- head_dim = config["head_dim"] when present and non-null, else hidden_size // num_attention_heads; except
  that Qwen3Config defaults head_dim to 128, so a qwen3 config without the key means 128.
  q_proj is (heads * head_dim, hidden), k/v_proj (kv_heads * head_dim, hidden), o_proj (hidden, heads * head_dim).
- Biases: Qwen2 has q/k/v biases and none on o_proj; Llama and Qwen3 put a bias on q/k/v AND o_proj when
  config["attention_bias"]; Llama's gate/up/down carry biases when config["mlp_bias"]. Here a bias is
  added when its tensor exists, and ``check_names`` insists that exactly the expected tensors exist.
- Qwen3: q and k are reshaped to (T, heads, head_dim) and RMS-normed over head_dim with q_norm / k_norm
  (weights (head_dim,), same eps) BEFORE RoPE.
- RoPE, rotate-half (not llama2.c's interleaved pairs): inv_freq = 1 / theta ** (arange(0, hd, 2) / hd),
  angle = pos * inv_freq (hd/2,), cos/sin = cat([angle, angle]) (hd,), x' = x * cos + rotate_half(x) * sin
  with rotate_half(x) = cat(-x[hd/2:], x[:hd/2]); i.e. channel pair (i, i + hd/2) turns by pos * inv_freq[i].
  Positions are 0 .. T-1. theta from config["rope_theta"] (or, transformers 5, config["rope_parameters"]
  ["rope_theta"]); default 10000.
- RoPE scaling, from config["rope_scaling"] (key "rope_type", or the older "type") or config
  ["rope_parameters"] (transformers 5): "default" / absent: none; "linear": inv_freq / factor;
  "llama3" (_compute_llama3_parameters): wavelen = 2 pi / inv_freq, low_freq_wavelen = old_ctx /
  low_freq_factor, high_freq_wavelen = old_ctx / high_freq_factor; inv_freq / factor where wavelen >
  low_freq_wavelen; unchanged where wavelen < high_freq_wavelen; in between (both edges included)
  (1 - s) * inv_freq / factor + s * inv_freq with s = (old_ctx / wavelen - low_freq_factor) /
  (high_freq_factor - low_freq_factor). Both have attention_factor 1 (cos and sin unscaled). Other
  types (dynamic, yarn, longrope) are refused.
- Attention: grouped-query, head h reads kv head h // (heads / kv_heads) (repeat_kv), scores
  q k^T * head_dim ** -0.5, causal mask, softmax in float64, then o_proj. No sliding window (a config
  with use_sliding_window true is refused).
- MLP: down(silu(gate(x)) * up(x)), silu(a) = a * sigmoid(a) (hidden_act "silu" only).
- Decoder layer: x = x + attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x)).
- Logits: final norm (model.norm) then lm_head.weight, or model.embed_tokens.weight when
  config["tie_word_embeddings"] (default False for Llama / Qwen2 / Qwen3 configs).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

# ---------------------------------------------------------------------------------------------------
# Loading: a small safetensors reader of its own (header: u64 LE length, JSON, then the data buffer)

SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def read_safetensors(data: bytes | memoryview, where: str = "<bytes>") -> dict[str, np.ndarray]:
    """Parse a safetensors file's bytes into name -> float64 array (BF16 widened exactly)."""
    data = memoryview(data)
    if len(data) < 8:
        raise ValueError(
            f"[safetensors {where}] file is {len(data)} bytes, shorter than the 8-byte header length"
        )
    (n,) = struct.unpack_from("<Q", data, 0)
    if 8 + n > len(data):
        raise ValueError(
            f"[safetensors {where}] header length {n} runs past the end of the {len(data)}-byte file"
        )
    header = json.loads(bytes(data[8 : 8 + n]))
    buffer = data[8 + n :]
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"[safetensors {where}] tensor {name!r}: dtype {dtype} not supported")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        itemsize = np.dtype(SAFETENSORS_DTYPES[dtype]).itemsize
        if end - begin != math.prod(shape) * itemsize or end > len(buffer):
            raise ValueError(
                f"[safetensors {where}] tensor {name!r}: data_offsets {begin}..{end} do not hold "
                f"shape {list(shape)} of {dtype} inside a {len(buffer)}-byte buffer"
            )
        raw = np.frombuffer(buffer[begin:end], dtype=SAFETENSORS_DTYPES[dtype])
        if dtype == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = raw.astype(np.float64).reshape(shape)
    return out


def load(directory: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config, name -> float64 tensor) of a checkpoint directory: config.json plus model.safetensors
    or the shards listed by model.safetensors.index.json."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    if (directory / INDEX_FILE).exists():
        weight_map = json.loads((directory / INDEX_FILE).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = None, [SINGLE_FILE]
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        part = read_safetensors((directory / file).read_bytes(), where=file)
        if weight_map is not None:
            listed = {n for n, f in weight_map.items() if f == file}
            if listed != set(part):
                raise ValueError(
                    f"[safetensors {file}] holds {sorted(set(part) ^ listed)} unlike the index says"
                )
        tensors.update(part)
    check_names(config, tensors)
    return config, tensors


def expected_names(config: dict[str, Any]) -> set[str]:
    """The tensor names transformers' model for ``config`` loads (bias / norm / lm_head rules above)."""
    model_type = config["model_type"]
    attention_bias = bool(config.get("attention_bias", False))
    qkv_bias = model_type == "qwen2" or attention_bias
    o_bias = model_type != "qwen2" and attention_bias
    mlp_bias = bool(config.get("mlp_bias", False))
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {f"{p}self_attn.{w}_proj.weight" for w in "qkvo"}
        names |= {f"{p}mlp.{w}_proj.weight" for w in ("gate", "up", "down")}
        if qkv_bias:
            names |= {f"{p}self_attn.{w}_proj.bias" for w in "qkv"}
        if o_bias:
            names.add(f"{p}self_attn.o_proj.bias")
        if mlp_bias:
            names |= {f"{p}mlp.{w}_proj.bias" for w in ("gate", "up", "down")}
        if model_type == "qwen3":
            names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
    if not config.get("tie_word_embeddings", False):
        names.add("lm_head.weight")
    return names


def check_names(config: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """Refuse a checkpoint whose tensors differ from what the config implies (a tied checkpoint may also
    carry lm_head.weight; old checkpoints carry rotary_emb.inv_freq buffers, both ignored)."""
    if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(f"[hf_reference] model_type {config.get('model_type')!r} not supported")
    want = expected_names(config)
    have = {n for n in tensors if not n.endswith("rotary_emb.inv_freq")}
    if config.get("tie_word_embeddings", False):
        have.discard("lm_head.weight")
    if want != have:
        raise ValueError(
            f"[hf_reference] missing tensors {sorted(want - have)}, unexpected {sorted(have - want)}"
        )


# ---------------------------------------------------------------------------------------------------
# Building blocks


QWEN3_DEFAULT_HEAD_DIM = 128  # Qwen3Config(head_dim=128): a qwen3 config.json without the key still means 128
DEFAULT_RMS_NORM_EPS = 1e-6  # LlamaConfig / Qwen2Config / Qwen3Config default


def head_dim(config: dict[str, Any]) -> int:
    """config["head_dim"] when named and non-null; else 128 for qwen3 (Qwen3Config's default), else
    hidden_size // num_attention_heads (LlamaConfig, and Qwen2Attention's getattr fallback)."""
    if config.get("head_dim"):
        return int(config["head_dim"])
    if config["model_type"] == "qwen3" and "head_dim" not in config:
        return QWEN3_DEFAULT_HEAD_DIM
    return config["hidden_size"] // config["num_attention_heads"]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """weight * x / sqrt(mean(x^2) + eps) over the last axis."""
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(a: np.ndarray) -> np.ndarray:
    """a * sigmoid(a), computed without overflow."""
    return a * np.exp(-np.logaddexp(0.0, -a))


def rope_settings(config: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(theta, scaling dict with "rope_type") from rope_scaling (transformers 4) or rope_parameters (5)."""
    params = config.get("rope_parameters")
    scaling = dict(params) if params else dict(config.get("rope_scaling") or {})
    theta = float(scaling.get("rope_theta", config.get("rope_theta", 10000.0)))
    scaling["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    return theta, scaling


def default_inv_freq(theta: float, hd: int) -> np.ndarray:
    """1 / theta ** (arange(0, hd, 2) / hd): (hd/2,)."""
    return 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)


def llama3_inv_freq(
    inv_freq: np.ndarray,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    old_context_len: float,
) -> np.ndarray:
    """transformers' _compute_llama3_parameters applied to any inv_freq array."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled)


def rope_inv_freq(config: dict[str, Any]) -> np.ndarray:
    """The (head_dim/2,) inverse frequencies of ``config``, scaling applied."""
    theta, scaling = rope_settings(config)
    inv_freq = default_inv_freq(theta, head_dim(config))
    kind = scaling["rope_type"]
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return llama3_inv_freq(
            inv_freq,
            scaling["factor"],
            scaling["low_freq_factor"],
            scaling["high_freq_factor"],
            scaling["original_max_position_embeddings"],
        )
    raise NotImplementedError(f"[hf_reference] rope_type {kind!r} not supported")


def rotate_half(x: np.ndarray) -> np.ndarray:
    """cat(-x2, x1) of the two halves of the last axis."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """x (..., T, hd) rotated: x * cos + rotate_half(x) * sin, angles positions (T,) x inv_freq (hd/2,)."""
    angles = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)  # (T, hd/2)
    emb = np.concatenate([angles, angles], axis=-1)  # (T, hd)
    return x * np.cos(emb) + rotate_half(x) * np.sin(emb)


def linear(x: np.ndarray, tensors: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """x @ W.T (+ b when ``prefix``.bias exists): (T, in) -> (T, out)."""
    y = x @ tensors[prefix + ".weight"].T
    bias = tensors.get(prefix + ".bias")
    return y if bias is None else y + bias


def qkv(
    config: dict[str, Any], tensors: dict[str, np.ndarray], layer: int, xn: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (heads, T, hd), k and v (kv_heads, T, hd) of the normed input xn (T, hidden), before RoPE
    (Qwen3's q/k norm applied)."""
    p = f"model.layers.{layer}.self_attn."
    T, hd = xn.shape[0], head_dim(config)
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    q = linear(xn, tensors, p + "q_proj").reshape(T, heads, hd)  # (T, H, hd)
    k = linear(xn, tensors, p + "k_proj").reshape(T, kv, hd)  # (T, KV, hd)
    v = linear(xn, tensors, p + "v_proj").reshape(T, kv, hd)  # (T, KV, hd)
    if p + "q_norm.weight" in tensors:
        q = rms_norm(q, tensors[p + "q_norm.weight"], config.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS))
        k = rms_norm(k, tensors[p + "k_norm.weight"], config.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS))
    return q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal GQA: q (H, T, hd), k / v (KV, T, hd) -> (T, H * hd); head h reads kv head h // (H / KV)."""
    heads, T, hd = q.shape
    group = heads // k.shape[0]
    k = np.repeat(k, group, axis=0)  # (H, T, hd)
    v = np.repeat(v, group, axis=0)  # (H, T, hd)
    scores = q @ k.transpose(0, 2, 1) * hd**-0.5  # (H, T, T)
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)  # (H, T, T)
    return (probs @ v).transpose(1, 0, 2).reshape(T, heads * hd)  # (T, H * hd)


def _check_config(config: dict[str, Any]) -> None:
    if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(f"[hf_reference] model_type {config.get('model_type')!r} not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"[hf_reference] hidden_act {config['hidden_act']!r} not supported")
    if config.get("use_sliding_window", False):
        raise NotImplementedError("[hf_reference] use_sliding_window true not supported")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise ValueError("[hf_reference] num_attention_heads is not a multiple of num_key_value_heads")


# ---------------------------------------------------------------------------------------------------
# The model


def forward(config: dict[str, Any], tensors: dict[str, np.ndarray], ids: Any) -> np.ndarray:
    """Logits (T, vocab) float64 of the token ids (T,) at positions 0 .. T-1."""
    _check_config(config)
    ids = np.asarray(ids, dtype=np.int64)
    eps = config.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS)
    embed = tensors["model.embed_tokens.weight"]  # (V, hidden)
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= embed.shape[0]:
        raise ValueError(f"[hf_reference] ids must be a non-empty 1-D array in 0..{embed.shape[0] - 1}")
    positions = np.arange(ids.size)
    inv_freq = rope_inv_freq(config)  # (hd/2,)
    x = embed[ids]  # (T, hidden)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        xn = rms_norm(x, tensors[p + "input_layernorm.weight"], eps)  # (T, hidden)
        q, k, v = qkv(config, tensors, i, xn)  # (H, T, hd), (KV, T, hd), (KV, T, hd)
        q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
        x = x + linear(attention(q, k, v), tensors, p + "self_attn.o_proj")  # (T, hidden)
        xn = rms_norm(x, tensors[p + "post_attention_layernorm.weight"], eps)  # (T, hidden)
        gate = linear(xn, tensors, p + "mlp.gate_proj")  # (T, inter)
        up = linear(xn, tensors, p + "mlp.up_proj")  # (T, inter)
        x = x + linear(silu(gate) * up, tensors, p + "mlp.down_proj")  # (T, hidden)
    x = rms_norm(x, tensors["model.norm.weight"], eps)  # (T, hidden)
    head = embed if config.get("tie_word_embeddings", False) else tensors["lm_head.weight"]  # (V, hidden)
    return x @ head.T  # (T, V)


def greedy(config: dict[str, Any], tensors: dict[str, np.ndarray], prompt_ids: Any, n_new: int) -> list[int]:
    """``n_new`` greedily chosen ids after ``prompt_ids`` (argmax, first index on ties), recomputing the
    whole forward at each step."""
    ids = [int(i) for i in prompt_ids]
    new: list[int] = []
    for _ in range(n_new):
        token = int(np.argmax(forward(config, tensors, ids)[-1]))
        ids.append(token)
        new.append(token)
    return new
