"""Unfused float64 numpy references of every kernel: the test oracle and the CPU fallback.

Written plainly from the math (llama2.c's run.c), one head at a time, on (channels, seq) matrices;
nothing here shares code with the MIL generators.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from anekit.kernels.config import ModelConfig

Weights = Mapping[str, np.ndarray]


def _f64(w: Weights) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}


def rmsnorm(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    """x (C, S) normalised over channels, times scale (C,)."""
    return x / np.sqrt(np.mean(x * x, axis=0, keepdims=True) + eps) * scale[:, None]


def rope(x: np.ndarray, cfg: ModelConfig, inverse: bool = False) -> np.ndarray:
    """Rotate pairs (i, i+1) of x (C, S) by pos * theta^(-(i % head_dim) / head_dim), as run.c does."""
    out = x.copy()
    hd = cfg.head_dim
    for i in range(0, x.shape[0], 2):
        freq = 1.0 / cfg.rope_theta ** ((i % hd) / hd)
        angle = freq * np.arange(x.shape[1])
        c, s = np.cos(angle), np.sin(angle)
        if inverse:
            s = -s
        a, b = x[i], x[i + 1]
        out[i], out[i + 1] = a * c - b * s, a * s + b * c
    return out


def causal_softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over keys of (S, S) scores, keys after the query masked out."""
    s = scores.copy()
    s[np.triu_indices(s.shape[0], k=1)] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=1, keepdims=True)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Causal multi-head attention of q (dim, S), k / v (kv_dim, S); head h reads kv head h // group.

    Returns the attention output (dim, S) and the probabilities (n_heads, S, S).
    """
    hd, seq = cfg.head_dim, cfg.seq_len
    out = np.zeros((cfg.dim, seq))
    probs = np.zeros((cfg.n_heads, seq, seq))
    for h in range(cfg.n_heads):
        g = h // cfg.kv_group
        qh = q[h * hd : (h + 1) * hd]  # (hd, S)
        kh = k[g * hd : (g + 1) * hd]
        vh = v[g * hd : (g + 1) * hd]
        p = causal_softmax(qh.T @ kh / np.sqrt(hd))  # (S query, S key)
        probs[h] = p
        out[h * hd : (h + 1) * hd] = vh @ p.T
    return out, probs


def sdpa_fwd(cfg: ModelConfig, x: np.ndarray, weights: Weights) -> dict[str, np.ndarray]:
    """The SDPA forward taps for x (dim, S)."""
    w = _f64(weights)
    x = np.asarray(x, dtype=np.float64)
    xn = rmsnorm(x, w["rms_att"], cfg.norm_eps)
    q, k, v = w["wq"] @ xn, w["wk"] @ xn, w["wv"] @ xn
    if cfg.rope:
        q, k = rope(q, cfg), rope(k, cfg)
    att, _ = attention(q, k, v, cfg)
    return {"o_out": w["wo"] @ att, "q": q, "k": k, "v": v, "attn_out": att, "xnorm": xn}
