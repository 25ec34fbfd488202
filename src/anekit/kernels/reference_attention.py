"""Unfused float64 references of the attention backward kernels (``attention_bwd``).

Plain math on (channels, seq) matrices, one head at a time; query head h reads kv head h // kv_group,
so under grouped-query attention the gradients of a kv head sum over the query heads of its group.
Score tensors travel flattened as the kernels write them: row h*S + i is query i of head h, column j
is key j. Nothing here shares code with the MIL generators.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from anekit.kernels.config import ModelConfig
from anekit.kernels.reference import causal_softmax, rope

Weights = Mapping[str, np.ndarray]


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def sdpa_bwd1(
    cfg: ModelConfig, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, weights: Weights
) -> dict[str, np.ndarray]:
    """dv (kv_dim, S), probs (H*S, S), dp (H*S, S) from q (q_dim, S) and k after RoPE, v and
    do = dL/d o_out."""
    q, k, v, do = _f64(q), _f64(k), _f64(v), _f64(do)
    hd, seq, n = cfg.head_dim, cfg.seq_len, cfg.n_heads
    da = _f64(weights["wo"]).T @ do  # (q_dim, S): dL/d attn_out
    dv = np.zeros((cfg.kv_dim, seq))
    probs = np.zeros((n, seq, seq))
    dp = np.zeros((n, seq, seq))
    for h in range(n):
        g = h // cfg.kv_group
        qh, dah = q[h * hd : (h + 1) * hd], da[h * hd : (h + 1) * hd]  # (hd, S)
        kh, vh = k[g * hd : (g + 1) * hd], v[g * hd : (g + 1) * hd]  # (hd, S)
        p = causal_softmax(qh.T @ kh / np.sqrt(hd))  # (S query, S key)
        probs[h] = p
        # out_h[:, i] = sum_j p[i, j] v[:, j]  =>  dv[:, j] += sum_i p[i, j] da[:, i],  dp[i, j] = da_i . v_j
        dv[g * hd : (g + 1) * hd] += dah @ p
        dp[h] = dah.T @ vh
    return {"dv": dv, "probs": probs.reshape(n * seq, seq), "dp": dp.reshape(n * seq, seq)}


def sdpa_bwd2(
    cfg: ModelConfig, probs: np.ndarray, dp: np.ndarray, q: np.ndarray, k: np.ndarray
) -> dict[str, np.ndarray]:
    """dq (q_dim, S), dk (kv_dim, S): gradients w.r.t. q and k before RoPE (the projections, or the q / k
    norm's outputs; post-RoPE without RoPE).

    probs / dp are (H*S, S) as ``sdpa_bwd1`` returns them; q and k are after RoPE.
    """
    q, k = _f64(q), _f64(k)
    hd, seq, n = cfg.head_dim, cfg.seq_len, cfg.n_heads
    probs = _f64(probs).reshape(n, seq, seq)
    dp = _f64(dp).reshape(n, seq, seq)
    dq = np.zeros((cfg.q_dim, seq))
    dk = np.zeros((cfg.kv_dim, seq))
    for h in range(n):
        g = h // cfg.kv_group
        p, dph = probs[h], dp[h]  # (S query, S key)
        ds = p * (dph - np.sum(p * dph, axis=1, keepdims=True))  # dL/d (scaled, masked scores)
        ds = ds / np.sqrt(hd)  # dL/d (q_i . k_j)
        qh, kh = q[h * hd : (h + 1) * hd], k[g * hd : (g + 1) * hd]  # (hd, S)
        dq[h * hd : (h + 1) * hd] = kh @ ds.T  # dq[:, i] = sum_j ds[i, j] k[:, j]
        dk[g * hd : (g + 1) * hd] += qh @ ds  # dk[:, j] = sum_i ds[i, j] q[:, i]
    if cfg.rope:
        # RoPE is a rotation per position: its transpose (the backward) is the inverse rotation
        dq, dk = rope(dq, cfg, inverse=True), rope(dk, cfg, inverse=True)
    return {"dq": dq, "dk": dk}


def qkv_bwd(
    cfg: ModelConfig, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, weights: Weights
) -> dict[str, np.ndarray]:
    """dx (dim, S) = Wq^T dq + Wk^T dk + Wv^T dv: the gradient w.r.t. xnorm."""
    w = {key: _f64(weights[key]) for key in ("wq", "wk", "wv")}
    return {"dx": w["wq"].T @ _f64(dq) + w["wk"].T @ _f64(dk) + w["wv"].T @ _f64(dv)}


def sdpa_bwd(
    cfg: ModelConfig, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, weights: Weights
) -> dict[str, np.ndarray]:
    """The three backward kernels composed: from the forward taps q, k (after RoPE), v and dL/d o_out to
    dq / dk / dv (w.r.t. the pre-RoPE projections Wq xnorm, Wk xnorm and Wv xnorm) and dx (w.r.t. xnorm),
    with the intermediates probs and dp.
    """
    one = sdpa_bwd1(cfg, q, k, v, do, weights)
    two = sdpa_bwd2(cfg, one["probs"], one["dp"], q, k)
    dx = qkv_bwd(cfg, two["dq"], two["dk"], one["dv"], weights)["dx"]
    return {**two, "dv": one["dv"], "dx": dx, "probs": one["probs"], "dp": one["dp"]}
