"""Float64 numpy oracle of a whole llama2.c training step: the loss and every weight gradient.

The test oracle for ``anekit.llama``'s step. It is written from the math of llama2.c's run.c (one
forward over a whole sequence with a causal mask instead of run.c's token-at-a-time KV cache) with a
hand-written backward pass, and shares nothing with ``anekit`` except the ``Params`` container and
``ModelConfig``. Tests compare the step under test against this, and this against finite differences
(tests/test_llama_reference.py).

Layout: activations are ROWS, one per token — x is (T, dim), the transpose of the (dim, seq) columns
the kernels use. Weights stay in llama2.c's (out, in) layout, so a linear layer is ``y = x @ W.T``
(T, out), its input gradient ``dy @ W`` and its weight gradient ``dy.T @ x`` (out, in).

The model, per token position t = 0 .. T-1 (RoPE position = t):

    x = embed[tokens]
    per layer:
        xn = rmsnorm(x) * rms_att
        q, k, v = xn Wq^T, xn Wk^T, xn Wv^T          (k, v have n_kv_heads heads)
        q, k = rope(q), rope(k)                       (skipped when cfg.rope is False)
        att = causal softmax(q_h k_g^T / sqrt(head_dim)) v_g,   g = h // (n_heads / n_kv_heads)
        x = x + att Wo^T
        xn = rmsnorm(x) * rms_ffn
        x = x + (silu(xn W1^T) * (xn W3^T)) W2^T
    logits = (rmsnorm(x) * rms_final) classifier^T    (classifier = wcls, or embed when tied)
    loss = mean over t of cross_entropy(logits[t], targets[t])

rmsnorm(x) = x / sqrt(mean(x^2) + cfg.norm_eps) over channels. RoPE rotates channel pairs (i, i + 1)
of each head by the angle t * theta^(-i / head_dim) (i even, theta = cfg.rope_theta), exactly as
run.c's ``i % head_size``.

Gradients come back as float64 arrays in a ``Params`` container (wcls None when tied, in which case
``embed`` holds both the lookup's scatter-add and the classifier's contribution).
"""

from __future__ import annotations

import numpy as np

from anekit.kernels.config import ModelConfig
from anekit.llama.params import LayerParams, Params

# ---------------------------------------------------------------------------------------------------
# Building blocks, each a forward and its backward


def rmsnorm_fwd(x: np.ndarray, scale: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """y = x * r * scale with r = 1 / sqrt(mean(x^2) + eps) per row; returns y (T, C) and r (T, 1)."""
    r = 1.0 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps)  # (T, 1)
    return x * r * scale, r  # (T, C)


def rmsnorm_bwd(
    dy: np.ndarray, x: np.ndarray, scale: np.ndarray, r: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients (dx (T, C), dscale (C,)) of rmsnorm_fwd given dy (T, C).

    dr/dx = -r^3 x / C, so dx = r (dy scale) - x r^3 / C * sum_c(dy scale x).
    """
    g = dy * scale  # (T, C)
    dscale = np.sum(dy * x * r, axis=0)  # (C,)
    dx = g * r - x * (r**3) * np.sum(g * x, axis=1, keepdims=True) / x.shape[1]  # (T, C)
    return dx, dscale


def rope_tables(cfg: ModelConfig, T: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (T, head_dim / 2) of the angle t * theta^(-2j / head_dim) for pair j of a head."""
    hd = cfg.head_dim
    freq = cfg.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
    angle = np.arange(T, dtype=np.float64)[:, None] * freq[None, :]  # (T, hd/2)
    return np.cos(angle), np.sin(angle)


def rope_apply(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, transpose: bool = False) -> np.ndarray:
    """Rotate pairs (2j, 2j + 1) of every head of x (T, heads * head_dim) by the table angle.

    ``transpose`` applies the inverse rotation, which is the rotation's backward (it is orthogonal).
    """
    T = x.shape[0]
    pairs = x.reshape(T, -1, cos.shape[1], 2)  # (T, heads, hd/2, 2)
    a, b = pairs[..., 0], pairs[..., 1]  # (T, heads, hd/2)
    c, s = cos[:, None, :], (-sin if transpose else sin)[:, None, :]  # (T, 1, hd/2)
    out = np.empty_like(pairs)
    out[..., 0] = a * c - b * s
    out[..., 1] = a * s + b * c
    return out.reshape(x.shape)  # (T, heads * hd)


def attention_fwd(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: ModelConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Causal grouped-query attention: q (T, dim), k / v (T, kv_dim) -> out (T, dim), probs (H, T, T).

    probs[h, t, s] is how much query t of head h reads key s (zero for s > t).
    """
    T, hd = q.shape[0], cfg.head_dim
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T query, T key): keys after the query
    out = np.zeros_like(q)  # (T, dim)
    probs = np.zeros((cfg.n_heads, T, T))
    for h in range(cfg.n_heads):
        g = h // cfg.kv_group
        qh, kh, vh = q[:, h * hd : (h + 1) * hd], k[:, g * hd : (g + 1) * hd], v[:, g * hd : (g + 1) * hd]
        scores = qh @ kh.T / np.sqrt(hd)  # (T, T)
        scores[future] = -np.inf
        e = np.exp(scores - scores.max(axis=1, keepdims=True))  # (T, T)
        p = e / e.sum(axis=1, keepdims=True)  # (T, T)
        probs[h] = p
        out[:, h * hd : (h + 1) * hd] = p @ vh  # (T, hd)
    return out, probs


def attention_bwd(
    dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, probs: np.ndarray, cfg: ModelConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq (T, dim), dk (T, kv_dim), dv (T, kv_dim)) of attention_fwd given dout (T, dim).

    Per head: dP = dout_h v_g^T; dS = P * (dP - rowsum(P * dP)) (softmax backward; masked entries have
    P = 0 so they get no gradient); dq_h = dS k_g / sqrt(hd); dk_g += dS^T q_h / sqrt(hd);
    dv_g += P^T dout_h. A kv head's gradient sums over the query heads that read it.
    """
    hd = cfg.head_dim
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(cfg.n_heads):
        g = h // cfg.kv_group
        hs, gs = slice(h * hd, (h + 1) * hd), slice(g * hd, (g + 1) * hd)
        p, do = probs[h], dout[:, hs]  # (T, T), (T, hd)
        dp = do @ v[:, gs].T  # (T, T)
        ds = p * (dp - np.sum(p * dp, axis=1, keepdims=True)) / np.sqrt(hd)  # (T, T)
        dq[:, hs] = ds @ k[:, gs]  # (T, hd)
        dk[:, gs] += ds.T @ q[:, hs]  # (T, hd)
        dv[:, gs] += p.T @ do  # (T, hd)
    return dq, dk, dv


def silu(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """silu(a) = a * sigmoid(a) and its derivative sigmoid(a) * (1 + a * (1 - sigmoid(a)))."""
    sig = 1.0 / (1.0 + np.exp(-a))
    return a * sig, sig * (1.0 + a * (1.0 - sig))


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over rows of logits (T, V) and its gradient dlogits (T, V)."""
    T = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)  # (T, V)
    logsum = np.log(np.sum(np.exp(shifted), axis=1))  # (T,)
    rows = np.arange(T)
    loss = float(np.mean(logsum - shifted[rows, targets]))
    dlogits = np.exp(shifted - logsum[:, None])  # (T, V) softmax
    dlogits[rows, targets] -= 1.0
    return loss, dlogits / T


# ---------------------------------------------------------------------------------------------------
# The model


def _f64(params: Params) -> tuple[np.ndarray, list[dict[str, np.ndarray]], np.ndarray, np.ndarray | None]:
    embed = np.asarray(params.embed, dtype=np.float64)
    layers = [{k: np.asarray(v, dtype=np.float64) for k, v in lp.as_dict().items()} for lp in params.layers]
    wcls = None if params.wcls is None else np.asarray(params.wcls, dtype=np.float64)
    return embed, layers, np.asarray(params.rms_final, dtype=np.float64), wcls


def _check_tokens(cfg: ModelConfig, name: str, ids: np.ndarray, T: int | None = None) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0 or (T is not None and ids.shape[0] != T):
        raise ValueError(f"[llama_reference] {name} must be a non-empty (T,) array, got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() >= cfg.vocab_size:
        raise ValueError(f"[llama_reference] {name} must be integer ids in [0, {cfg.vocab_size})")
    return ids.astype(np.int64)


def _forward(params: Params, tokens: np.ndarray) -> tuple[np.ndarray, dict]:
    """Logits (T, vocab) and everything the backward pass needs."""
    cfg = params.cfg
    tokens = _check_tokens(cfg, "tokens", tokens)
    T, eps = tokens.shape[0], cfg.norm_eps
    embed, layers, rms_final, wcls = _f64(params)
    cos, sin = rope_tables(cfg, T)  # (T, hd/2)
    x = embed[tokens]  # (T, dim)
    saved = []
    for w in layers:
        s: dict[str, np.ndarray] = {"x_att": x}
        xn, s["r_att"] = rmsnorm_fwd(x, w["rms_att"], eps)  # (T, dim)
        q = xn @ w["wq"].T  # (T, dim)
        k = xn @ w["wk"].T  # (T, kv_dim)
        v = xn @ w["wv"].T  # (T, kv_dim)
        if cfg.rope:
            q, k = rope_apply(q, cos, sin), rope_apply(k, cos, sin)
        att, s["probs"] = attention_fwd(q, k, v, cfg)  # (T, dim), (H, T, T)
        x = x + att @ w["wo"].T  # (T, dim)
        s.update(xn_att=xn, q=q, k=k, v=v, att=att, x_ffn=x)
        xn, s["r_ffn"] = rmsnorm_fwd(x, w["rms_ffn"], eps)  # (T, dim)
        a = xn @ w["w1"].T  # (T, hidden)
        b = xn @ w["w3"].T  # (T, hidden)
        act, dact = silu(a)  # (T, hidden)
        hmid = act * b  # (T, hidden)
        x = x + hmid @ w["w2"].T  # (T, dim)
        s.update(xn_ffn=xn, b=b, act=act, dact=dact, hmid=hmid)
        saved.append(s)
    xf, r_final = rmsnorm_fwd(x, rms_final, eps)  # (T, dim)
    classifier = embed if wcls is None else wcls  # (vocab, dim)
    logits = xf @ classifier.T  # (T, vocab)
    cache = dict(tokens=tokens, layers=saved, x_final=x, r_final=r_final, xf=xf, cos=cos, sin=sin,
                 weights=(embed, layers, rms_final, wcls))  # fmt: skip
    return logits, cache


def forward(params: Params, tokens: np.ndarray) -> np.ndarray:
    """Float64 logits (T, vocab) for a (T,) token sequence; position t attends to positions 0 .. t.

    T is not limited to cfg.seq_len (RoPE angles are computed, not tabulated)."""
    return _forward(params, tokens)[0]


def loss(params: Params, tokens: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy of predicting targets[t] after tokens[0 .. t]."""
    logits = forward(params, tokens)
    return cross_entropy(logits, _check_tokens(params.cfg, "targets", targets, logits.shape[0]))[0]


def loss_and_grads(params: Params, tokens: np.ndarray, targets: np.ndarray) -> tuple[float, Params]:
    """The loss of loss() and its float64 gradient with respect to every tensor of params."""
    cfg = params.cfg
    logits, c = _forward(params, tokens)
    targets = _check_tokens(cfg, "targets", targets, logits.shape[0])
    embed, layers, rms_final, wcls = c["weights"]
    cos, sin = c["cos"], c["sin"]  # (T, hd/2)
    value, dlogits = cross_entropy(logits, targets)  # (T, vocab)

    # Head: logits = xf classifier^T, xf = rmsnorm(x_final) * rms_final.
    classifier = embed if wcls is None else wcls
    dclassifier = dlogits.T @ c["xf"]  # (vocab, dim)
    dx, drms_final = rmsnorm_bwd(dlogits @ classifier, c["x_final"], rms_final, c["r_final"])  # (T, dim)

    grads: list[dict[str, np.ndarray]] = [{} for _ in layers]
    for li in reversed(range(len(layers))):
        w, s, g = layers[li], c["layers"][li], grads[li]
        # FFN: x_out = x_ffn + hmid W2^T, hmid = silu(a) * b.
        g["w2"] = dx.T @ s["hmid"]  # (dim, hidden)
        dh = dx @ w["w2"]  # (T, hidden)
        db = dh * s["act"]  # (T, hidden)
        da = dh * s["b"] * s["dact"]  # (T, hidden)
        g["w1"] = da.T @ s["xn_ffn"]  # (hidden, dim)
        g["w3"] = db.T @ s["xn_ffn"]  # (hidden, dim)
        dxn = da @ w["w1"] + db @ w["w3"]  # (T, dim)
        dxr, g["rms_ffn"] = rmsnorm_bwd(dxn, s["x_ffn"], w["rms_ffn"], s["r_ffn"])
        dx = dx + dxr  # (T, dim): residual plus the norm's branch
        # Attention: x_ffn = x_att + att Wo^T.
        g["wo"] = dx.T @ s["att"]  # (dim, dim)
        dq, dk, dv = attention_bwd(dx @ w["wo"], s["q"], s["k"], s["v"], s["probs"], cfg)
        if cfg.rope:
            dq = rope_apply(dq, cos, sin, transpose=True)  # (T, dim)
            dk = rope_apply(dk, cos, sin, transpose=True)  # (T, kv_dim)
        xn = s["xn_att"]  # (T, dim)
        g["wq"], g["wk"], g["wv"] = dq.T @ xn, dk.T @ xn, dv.T @ xn
        dxn = dq @ w["wq"] + dk @ w["wk"] + dv @ w["wv"]  # (T, dim)
        dxr, g["rms_att"] = rmsnorm_bwd(dxn, s["x_att"], w["rms_att"], s["r_att"])
        dx = dx + dxr  # (T, dim)

    dembed = np.zeros_like(embed)  # (vocab, dim)
    np.add.at(dembed, c["tokens"], dx)  # a token used twice gets both rows' gradients
    if wcls is None:
        dembed += dclassifier
    out = Params(
        cfg,
        dembed,
        [LayerParams(**g) for g in grads],
        drms_final,
        None if wcls is None else dclassifier,
    )
    return value, out
