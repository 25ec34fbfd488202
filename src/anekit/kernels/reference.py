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
    """Rotate pairs (i, i+1) of x (C, S) by pos * theta^(-(i % head_dim) / head_dim), as run.c does (the
    frequency scaled as Llama 3 does when the config has ``rope_scaling``)."""
    out = x.copy()
    hd = cfg.head_dim
    for i in range(0, x.shape[0], 2):
        freq = 1.0 / cfg.rope_theta ** ((i % hd) / hd)
        if cfg.rope_scaling is not None:
            freq = float(cfg.rope_scaling.apply(np.array([freq]))[0])
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
    """Causal multi-head attention of q (q_dim, S), k / v (kv_dim, S); head h reads kv head h // group.

    Returns the attention output (q_dim, S) and the probabilities (n_heads, S, S).
    """
    hd, seq = cfg.head_dim, cfg.seq_len
    out = np.zeros((cfg.q_dim, seq))
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


def head_rmsnorm(x: np.ndarray, scale: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """Each head_dim-channel head of x (C, S) normalised on its own, times scale (head_dim,): Qwen 3's
    q / k norm."""
    hd = cfg.head_dim
    out = np.empty_like(x)
    for h in range(0, x.shape[0], hd):
        out[h : h + hd] = rmsnorm(x[h : h + hd], scale, cfg.norm_eps)
    return out


def head_rmsnorm_bwd(
    dy: np.ndarray, x: np.ndarray, scale: np.ndarray, cfg: ModelConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of y = head_rmsnorm(x, scale): dx (C, S) and dscale (head_dim,), one head at a time."""
    hd = cfg.head_dim
    dx, dscale = np.empty(x.shape), np.zeros(hd)
    for h in range(0, x.shape[0], hd):
        dx[h : h + hd], ds = rmsnorm_bwd(dy[h : h + hd], x[h : h + hd], scale, cfg.norm_eps)
        dscale += ds
    return dx, dscale


def sdpa_fwd(cfg: ModelConfig, x: np.ndarray, weights: Weights) -> dict[str, np.ndarray]:
    """The SDPA forward taps for x (dim, S) (q_pre / k_pre with a q / k norm)."""
    w = _f64(weights)
    x = np.asarray(x, dtype=np.float64)
    xn = rmsnorm(x, w["rms_att"], cfg.norm_eps)
    q, k, v = w["wq"] @ xn, w["wk"] @ xn, w["wv"] @ xn
    if cfg.qkv_bias:
        q, k, v = q + w["bq"][:, None], k + w["bk"][:, None], v + w["bv"][:, None]
    taps = {}
    if cfg.qk_norm:
        taps = {"q_pre": q, "k_pre": k}
        q, k = head_rmsnorm(q, w["q_norm"], cfg), head_rmsnorm(k, w["k_norm"], cfg)
    if cfg.rope:
        q, k = rope(q, cfg), rope(k, cfg)
    att, _ = attention(q, k, v, cfg)
    return {"o_out": w["wo"] @ att, "q": q, "k": k, "v": v, "attn_out": att, "xnorm": xn, **taps}


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    return x / (1.0 + np.exp(-x))


def ffn_down(h1: np.ndarray, h3: np.ndarray, weights: Weights) -> np.ndarray:
    """ffn_out (dim, S) = W2 (silu(h1) * h3) from the W1 / W3 outputs h1, h3 (hidden, S)."""
    w2 = np.asarray(weights["w2"], dtype=np.float64)
    return w2 @ (silu(h1) * h3)


def ffn(xn: np.ndarray, weights: Weights) -> np.ndarray:
    """ffn_out (dim, S) as a function of the normalised input x2norm (dim, S)."""
    w = _f64(weights)
    return ffn_down(w["w1"] @ xn, w["w3"] @ xn, w)


def ffn_fwd(cfg: ModelConfig, x: np.ndarray, weights: Weights) -> dict[str, np.ndarray]:
    """The FFN forward taps for the residual stream x (dim, S)."""
    w = _f64(weights)
    x = np.asarray(x, dtype=np.float64)
    xn = rmsnorm(x, w["rms_ffn"], cfg.norm_eps)
    h1, h3 = w["w1"] @ xn, w["w3"] @ xn
    gate = silu(h1) * h3
    return {"ffn_out": w["w2"] @ gate, "h1": h1, "h3": h3, "silu_out": gate, "x2norm": xn}


def final_rmsnorm(cfg: ModelConfig, x: np.ndarray, weights: Weights) -> dict[str, np.ndarray]:
    """The final RMSNorm of x (dim, S) with rms_final."""
    w = _f64(weights)
    return {"xnorm": rmsnorm(np.asarray(x, dtype=np.float64), w["rms_final"], cfg.norm_eps)}


def classifier_fwd(cfg: ModelConfig, x: np.ndarray, weights: Weights) -> dict[str, np.ndarray]:
    """Logits (vocab, S) of the tied classifier: embed (vocab, dim) @ x (dim, S)."""
    w = _f64(weights)
    return {"logits": w["embed"] @ np.asarray(x, dtype=np.float64)}


def softmax_vocab(cfg: ModelConfig, logits: np.ndarray) -> dict[str, np.ndarray]:
    """Softmax over the vocabulary (rows) of logits (vocab, S), each position separately."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=0, keepdims=True))
    return {"probs": e / e.sum(axis=0, keepdims=True)}


def ffn_bwd(
    cfg: ModelConfig, dffn: np.ndarray, h1: np.ndarray, h3: np.ndarray, weights: Weights
) -> dict[str, np.ndarray]:
    """Gradients of ffn_out = W2 (silu(h1) * h3), h1 = W1 xn, h3 = W3 xn, given dffn (dim, S).

    Returns dx (dim, S), the gradient w.r.t. xn, and dh1 / dh3 (hidden, S).
    """
    w = _f64(weights)
    dffn, h1, h3 = (np.asarray(a, dtype=np.float64) for a in (dffn, h1, h3))
    dgate = w["w2"].T @ dffn
    sig = 1.0 / (1.0 + np.exp(-h1))
    dh1 = dgate * h3 * (sig + h1 * sig * (1.0 - sig))
    dh3 = dgate * h1 * sig
    return {"dx": w["w1"].T @ dh1 + w["w3"].T @ dh3, "dh1": dh1, "dh3": dh3}


def rmsnorm_bwd(
    dy: np.ndarray, x: np.ndarray, scale: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of y = rmsnorm(x, scale): dx (C, S) and dscale (C,), given dy (C, S).

    With r = (mean(x^2) + eps)^-1/2 per position: dx = r dy scale - x r^3 / C * sum(dy scale x),
    dscale = sum over positions of dy x r.
    """
    dy, x = np.asarray(dy, dtype=np.float64), np.asarray(x, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    channels = x.shape[0]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=0, keepdims=True) + eps)  # (1, S)
    g = dy * scale[:, None]
    dx = g * r - x * r**3 / channels * np.sum(g * x, axis=0, keepdims=True)
    dscale = np.sum(dy * x * r, axis=1)
    return dx, dscale
