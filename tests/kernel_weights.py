"""Test helpers for kernels: fp16-exact random weights and the stories260K checkpoint's layer weights."""

from __future__ import annotations

import numpy as np

from anekit.kernels import ModelConfig
from tests.conftest import corpus_path


def fp16_exact(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to fp16 values, held in float64: what a baked weight really holds."""
    return np.asarray(a).astype(np.float16).astype(np.float64)


def random_layer(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Layer and head weights scaled to keep activations O(1), rounded to fp16."""
    rng = np.random.default_rng(seed)
    d, kv, h = cfg.dim, cfg.kv_dim, cfg.hidden_dim

    def mat(out_ch: int, in_ch: int) -> np.ndarray:
        return fp16_exact(rng.standard_normal((out_ch, in_ch)) / np.sqrt(in_ch))

    return {
        "wq": mat(d, d),
        "wk": mat(kv, d),
        "wv": mat(kv, d),
        "wo": mat(d, d),
        "w1": mat(h, d),
        "w2": mat(d, h),
        "w3": mat(h, d),
        "rms_att": fp16_exact(1 + 0.1 * rng.standard_normal(d)),
        "rms_ffn": fp16_exact(1 + 0.1 * rng.standard_normal(d)),
        "rms_final": fp16_exact(1 + 0.1 * rng.standard_normal(d)),
        "embed": mat(cfg.vocab_size, d),
    }


def stories260k_layer(layer: int = 0) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """One layer (and the head) of the real stories260K llama2.c checkpoint, in llama2.c's layout."""
    from anekit.kernels import preset

    cfg = preset("stories260K")
    data = corpus_path("llama2c", "stories260K.bin").read_bytes()
    d, h, kv, n, v = cfg.dim, cfg.hidden_dim, cfg.kv_dim, cfg.n_layers, cfg.vocab_size
    floats = np.frombuffer(data, dtype="<f4", offset=28)
    pos = 0

    def take(count: int) -> np.ndarray:
        nonlocal pos
        out = floats[pos : pos + count]
        pos += count
        return out.astype(np.float64)

    embed = take(v * d).reshape(v, d)
    per_layer = {
        "rms_att": (d,),
        "wq": (d, d),
        "wk": (kv, d),
        "wv": (kv, d),
        "wo": (d, d),
        "rms_ffn": (d,),
        "w1": (h, d),
        "w2": (d, h),
        "w3": (h, d),
    }
    w: dict[str, np.ndarray] = {"embed": embed}
    for key, shape in per_layer.items():
        size = int(np.prod(shape))
        w[key] = take(n * size).reshape(n, *shape)[layer]
    w["rms_final"] = take(d)
    return cfg, w
