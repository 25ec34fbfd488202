"""The training step's CPU-side ops in float32 numpy: RMSNorm, cross-entropy, embedding, AdamW, clipping.

Activations are channel-first ``(channels, seq)`` matrices, the layout of the engine's kernels (a
``[1, C, 1, S]`` tensor with its unit axes dropped), so a kernel output feeds these ops without a
transpose. Every op is vectorised over the sequence; in-place ops say so. Bad shapes or token ids raise
:class:`anekit.errors.AnekitError` naming the op and the argument.

Weight decay (AdamW): llama2.c's ``train.py`` builds two optimizer groups, decaying every parameter with
``dim >= 2`` (the matrices and the embedding) and leaving the 1-D ones (RMSNorm scales; there are no
biases) undecayed. :func:`adamw_update` follows that rule unless told otherwise (``apply_decay``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from anekit import jit
from anekit.errors import AnekitError


def _check(op: str, cond: bool, message: str) -> None:
    if not cond:
        raise AnekitError(f"[{op}] {message}")


def _check_tokens(op: str, name: str, tokens: np.ndarray, vocab: int) -> np.ndarray:
    tokens = np.asarray(tokens)
    _check(op, tokens.ndim == 1, f"{name} must be 1-D (seq,), got shape {tokens.shape}")
    _check(op, tokens.dtype.kind in "iu", f"{name} must hold integers, got dtype {tokens.dtype}")
    if tokens.size:
        lo, hi = int(tokens.min()), int(tokens.max())
        _check(op, lo >= 0 and hi < vocab, f"{name} must lie in [0, {vocab}), got values in [{lo}, {hi}]")
    return tokens


# -- RMSNorm --------------------------------------------------------------------------------------------


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """y = x / sqrt(mean over channels of x^2 + eps) * w, for x (C, S) and w (C,)."""
    ok = x.ndim == 2 and w.shape == (x.shape[0],)
    _check("rmsnorm", ok, f"x must be (C, S) and w (C,), got {x.shape} and {w.shape}")
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=0, keepdims=True, dtype=np.float32) + np.float32(eps))  # (1, S)
    return (x * inv * w[:, None]).astype(np.float32, copy=False)  # (C, S)


def rmsnorm_bwd(dy: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Gradients (dx (C, S), dw (C,)) of :func:`rmsnorm` given dy (C, S).

    With r = 1 / sqrt(mean(x^2) + eps) per column and g = w * dy:
    dx = r * g - x * r^3 * mean over channels of (g * x);  dw = sum over seq of dy * x * r.
    dw is returned, not accumulated: the caller adds it to its gradient buffer.
    """
    _check(
        "rmsnorm_bwd",
        x.ndim == 2 and dy.shape == x.shape and w.shape == (x.shape[0],),
        f"dy and x (C, S), w (C,), got {dy.shape}, {x.shape}, {w.shape}",
    )
    r = 1.0 / np.sqrt(np.mean(x * x, axis=0, keepdims=True, dtype=np.float32) + np.float32(eps))  # (1, S)
    g = dy * w[:, None]  # (C, S)
    dot = np.mean(g * x, axis=0, keepdims=True, dtype=np.float32)  # (1, S)
    dx = r * g - x * (r * r * r * dot)  # (C, S)
    dw = np.asarray(np.sum(dy * x * r, axis=1, dtype=np.float32))  # (C,)
    return dx.astype(np.float32, copy=False), dw


def head_rmsnorm_bwd(
    dy: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float, head_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients (dx (C, S), dw (head_dim,)) of Qwen 3's per-head q / k norm given dy (C, S): each head's
    ``head_dim`` channels of x (C, S) RMS-normalised on their own and scaled by w (head_dim,)
    (``anekit.llama.sample.head_rmsnorm``).

    :func:`rmsnorm_bwd` per head: with r = 1 / sqrt(mean over the head's channels of x^2 + eps) and
    g = w * dy, dx = r * g - x * r^3 * mean over the head's channels of (g * x); dw sums dy * x * r over
    the heads and the positions. dw is returned, not accumulated.
    """
    c = x.shape[0] if x.ndim == 2 else 0
    _check(
        "head_rmsnorm_bwd",
        x.ndim == 2 and dy.shape == x.shape and w.shape == (head_dim,) and c % head_dim == 0,
        f"dy and x (C, S) with C a multiple of head_dim {head_dim}, w ({head_dim},), got {dy.shape}, "
        f"{x.shape}, {w.shape}",
    )
    t = x.shape[1]
    xh = x.reshape(c // head_dim, head_dim, t)  # (heads, hd, S)
    dyh = dy.reshape(c // head_dim, head_dim, t)  # (heads, hd, S)
    r = 1.0 / np.sqrt(
        np.mean(xh * xh, axis=1, keepdims=True, dtype=np.float32) + np.float32(eps)
    )  # (heads, 1, S)
    g = dyh * w[None, :, None]  # (heads, hd, S)
    dot = np.mean(g * xh, axis=1, keepdims=True, dtype=np.float32)  # (heads, 1, S)
    dx = r * g - xh * (r * r * r * dot)  # (heads, hd, S)
    dw = np.asarray(np.sum(dyh * xh * r, axis=(0, 2), dtype=np.float32))  # (hd,)
    return dx.reshape(c, t).astype(np.float32, copy=False), dw


# -- loss -----------------------------------------------------------------------------------------------


def cross_entropy(
    logits: np.ndarray, targets: np.ndarray, out: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of logits (vocab, S) against targets (S,), and dlogits (vocab, S).

    dlogits = (softmax(logits) - onehot(targets)) / S, the gradient of the mean. The softmax subtracts
    each column's max first, so large logits do not overflow. ``out`` (float32, the logits' shape; may be
    ``logits`` itself, which is then overwritten) receives dlogits instead of a fresh array.
    """
    _check("cross_entropy", logits.ndim == 2, f"logits must be (vocab, seq), got shape {logits.shape}")
    logits = np.asarray(logits, dtype=np.float32)
    vocab, seq = logits.shape
    targets = _check_tokens("cross_entropy", "targets", targets, vocab)
    _check("cross_entropy", targets.shape == (seq,), f"targets must be ({seq},), got {targets.shape}")
    cols = np.arange(seq)
    if out is not None:
        _check(
            "cross_entropy",
            out.shape == logits.shape and out.dtype == np.float32 and out.flags.c_contiguous,
            f"out must be a C-contiguous float32 array of shape {logits.shape}",
        )
    z = np.subtract(logits, logits.max(axis=0, keepdims=True), out=out)  # (vocab, S), column max 0
    z_target = z[targets, cols].astype(np.float64)  # (S,)
    e = np.exp(z, out=z)  # (vocab, S), in place: one (vocab, S) array serves z, e and dlogits
    total = e.sum(axis=0, dtype=np.float32)  # (S,)
    # loss per column: log(sum exp z) - z[target]; summed in float64 for an accurate mean.
    loss = float(np.mean(np.log(total.astype(np.float64)) - z_target))
    dlogits = np.multiply(e, np.float32(1.0 / seq) / total, out=e)  # (vocab, S): softmax / S
    dlogits[targets, cols] -= np.float32(1.0 / seq)
    return loss, dlogits


def weighted_cross_entropy(
    logits: np.ndarray, targets: np.ndarray, weights: np.ndarray
) -> tuple[float, np.ndarray]:
    """Weighted mean cross-entropy of logits (vocab, S) against targets (S,): sum(w_i ce_i) / sum(w), and
    dlogits (vocab, S) float32 = w_i (softmax_i - onehot_i) / sum(w) per column. All-zero weights: loss 0,
    dlogits 0. Each column's max is subtracted first; the loss is summed in float64."""
    logits = np.asarray(logits, dtype=np.float32)
    if logits.ndim != 2:
        raise AnekitError(f"[weighted_cross_entropy] logits must be (vocab, seq), got {logits.shape}")
    vocab, seq = logits.shape
    targets = np.asarray(targets)
    weights = np.asarray(weights, dtype=np.float32)
    if targets.shape != (seq,) or weights.shape != (seq,):
        raise AnekitError(
            f"[weighted_cross_entropy] targets and weights must be ({seq},), "
            f"got {targets.shape} and {weights.shape}"
        )
    if targets.dtype.kind not in "iu" or (seq and (targets.min() < 0 or targets.max() >= vocab)):
        raise AnekitError(f"[weighted_cross_entropy] targets must be integer ids in 0 .. {vocab - 1}")
    if not (np.all(np.isfinite(weights)) and np.all(weights >= 0)):
        raise AnekitError("[weighted_cross_entropy] weights must be finite and >= 0")
    total_weight = float(weights.sum(dtype=np.float64))
    if total_weight == 0.0:
        return 0.0, np.zeros_like(logits)
    cols = np.arange(seq)
    z = logits - logits.max(axis=0, keepdims=True)  # (vocab, S), column max 0
    e = np.exp(z)  # (vocab, S)
    total = e.sum(axis=0, dtype=np.float32)  # (S,)
    ce = np.log(total.astype(np.float64)) - z[targets, cols].astype(np.float64)  # (S,)
    loss = float(np.dot(weights.astype(np.float64), ce) / total_weight)
    scale = (weights / np.float32(total_weight)).astype(np.float32)  # (S,)
    dlogits = e * (scale / total)[None, :]  # (vocab, S): w softmax / sum(w)
    dlogits[targets, cols] -= scale
    return loss, dlogits.astype(np.float32, copy=False)


# -- embedding ------------------------------------------------------------------------------------------


def embed_lookup(embed: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Rows of embed (vocab, dim) for tokens (S,), as a channel-first (dim, S) matrix."""
    _check("embed_lookup", embed.ndim == 2, f"embed must be (vocab, dim), got shape {embed.shape}")
    tokens = _check_tokens("embed_lookup", "tokens", tokens, embed.shape[0])
    return np.ascontiguousarray(embed[tokens].T)  # (dim, S)


def embed_backward(dembed: np.ndarray, dx: np.ndarray, tokens: np.ndarray) -> None:
    """Scatter-add dx (dim, S) into the rows of dembed (vocab, dim) named by tokens (S,), in place.

    A token that occurs several times receives the sum of its columns (``np.add.at`` is unbuffered).
    """
    _check("embed_backward", dembed.ndim == 2, f"dembed must be (vocab, dim), got shape {dembed.shape}")
    tokens = _check_tokens("embed_backward", "tokens", tokens, dembed.shape[0])
    _check(
        "embed_backward",
        dx.shape == (dembed.shape[1], tokens.shape[0]),
        f"dx must be (dim, seq) = ({dembed.shape[1]}, {tokens.shape[0]}), got {dx.shape}",
    )
    np.add.at(dembed, tokens, dx.T)


# -- optimizer ------------------------------------------------------------------------------------------


def takes_weight_decay(w: np.ndarray) -> bool:
    """llama2.c's rule: matrices (and the embedding) are decayed, 1-D tensors (norm scales) are not."""
    return w.ndim >= 2


def adamw_update(
    w: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    t: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    *,
    apply_decay: bool | None = None,
    grad_scale: float = 1.0,
) -> None:
    """One AdamW step on w, updating w and the moments m, v in place (PyTorch's AdamW, as train.py uses).

    t is the 1-based step count used for bias correction. The decay is decoupled: w *= 1 - lr *
    weight_decay before the Adam update. ``apply_decay`` None decays only when
    :func:`takes_weight_decay` says so (ndim >= 2); True / False force it. A ``grad_scale`` other than 1
    first scales g in place (``g *= float32(grad_scale)``, the scale of :func:`clip_grad_norm`), in the
    same pass over memory when the compiled loop serves.
    """
    _check("adamw", isinstance(t, (int, np.integer)) and t >= 1, f"step t must be an integer >= 1, got {t!r}")
    for name, a in (("g", g), ("m", m), ("v", v)):
        _check("adamw", a.shape == w.shape, f"{name} shape {a.shape} differs from the weight's {w.shape}")
    for name, a in (("w", w), ("m", m), ("v", v)):
        _check("adamw", a.dtype == np.float32, f"{name} must be float32 (updated in place), got {a.dtype}")
    decay = takes_weight_decay(w) if apply_decay is None else apply_decay
    b1, b2 = np.float32(beta1), np.float32(beta2)
    step = lr / (1.0 - beta1**t)  # bias correction of m folded into the step size
    bias2 = np.float32(math.sqrt(1.0 - beta2**t))  # sqrt(v_hat) = sqrt(v) / bias2
    factor = np.float32(1.0 - lr * weight_decay) if decay and weight_decay else np.float32(1.0)
    gscale = np.float32(grad_scale)
    if jit.adamw_update(w, g, m, v, b1, b2, factor, np.float32(step), bias2, np.float32(eps), gscale):
        return  # the same float32 operations below, in one compiled pass (w * 1.0 is exact)
    if gscale != 1:
        g *= gscale
    m *= b1
    m += (1 - b1) * g  # first moment
    v *= b2
    v += (1 - b2) * (g * g)  # second moment
    if decay and weight_decay:
        w *= factor
    denom = np.sqrt(v) / bias2 + np.float32(eps)  # sqrt(v_hat) + eps
    w -= np.float32(step) * (m / denom)


def grad_norm(grads: Sequence[np.ndarray]) -> float:
    """The global L2 norm of grads: float32 dot products, summed in float64."""
    total = 0.0
    for i, g in enumerate(grads):
        _check("clip_grad_norm", isinstance(g, np.ndarray), f"grads[{i}] is not an array: {type(g).__name__}")
        flat = g.reshape(-1)
        total += float(np.dot(flat, flat))
    return math.sqrt(total)


def clip_scale(norm: float, max_norm: float) -> np.float32:
    """The factor :func:`clip_grad_norm` scales gradients of global norm ``norm`` by; 1 when it does not."""
    if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
        return np.float32(max_norm / (norm + 1e-6))
    return np.float32(1.0)


def clip_grad_norm(grads: Sequence[np.ndarray], max_norm: float) -> float:
    """Scale grads in place so their global L2 norm is at most max_norm; returns the norm before clipping.

    The scale is max_norm / (norm + 1e-6), applied only when the norm exceeds max_norm (PyTorch's
    clip_grad_norm_). A non-finite norm (overflowed fp16 gradients) is returned and nothing is scaled,
    so the caller can skip the step. max_norm <= 0 turns clipping off (the norm is still returned).
    """
    norm = grad_norm(grads)
    scale = clip_scale(norm, max_norm)
    if scale != 1:  # a float32 scale of exactly 1 would leave every gradient as it is
        for g in grads:
            g *= scale
    return norm


# -- attention on the host (the matmul-free route, ``anekit.llama.step_host``) -----------------------------
#
# Heads of q (n_heads * hd, S) are grouped as (kv heads, group, ...): query head h = g * group + m reads kv
# head g, as run.c's h / kv_mul. Every product is one batched float32 sgemm over the kv heads, on operands
# laid out so that BLAS takes them as they are: numpy's matmul runs a transposed view of a score matrix
# through its own loops (7x slower at stories15M's shapes), so only the small (C, S) operands are copied
# into the order a product needs, never an (S, S) one. A kv head's group is stacked along rows (G*S):
# the sums over the group of P^T da and dS^T Q are one product each.


def rope_rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Channel pairs (2i, 2i + 1) of x (C, S) turned by the angles whose cos / sin are (C / 2, S), as
    llama2.c rotates them: (a, b) -> (a cos - b sin, a sin + b cos); ``inverse`` turns back (the
    transposed rotation, a gradient's way)."""
    c, s = x.shape
    ok = c % 2 == 0 and cos.shape == (c // 2, s) == sin.shape
    _check("rope", ok, f"x (C, S) with C even, cos / sin (C/2, S); got {x.shape}, {cos.shape}, {sin.shape}")
    pairs = x.reshape(c // 2, 2, s)  # (C/2, 2, S)
    a, b = pairs[:, 0], pairs[:, 1]  # (C/2, S) each
    sin = -sin if inverse else sin
    out = np.empty_like(pairs)
    out[:, 0] = a * cos - b * sin
    out[:, 1] = a * sin + b * cos
    return out.reshape(c, s)


def _rows(x: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """x (heads * hd, S) as (heads, S, hd): each head's positions as rows (a copy, C-ordered)."""
    return np.ascontiguousarray(x.reshape(heads, head_dim, x.shape[1]).transpose(0, 2, 1))


def _stacked(x: np.ndarray, kv_heads: int, head_dim: int) -> np.ndarray:
    """x (H * hd, S) as (KVH, hd, G*S): a kv head's group side by side along columns (a copy)."""
    s = x.shape[1]
    return np.ascontiguousarray(x.reshape(kv_heads, -1, head_dim, s).transpose(0, 2, 1, 3)).reshape(
        kv_heads, head_dim, -1
    )


def attention_probs(
    q: np.ndarray, k: np.ndarray, kv_heads: int, head_dim: int, scale: float, mask: np.ndarray
) -> np.ndarray:
    """softmax over keys of (q . k) * scale + mask: q (H * hd, S), k (KVH * hd, S), mask (S, S) additive
    (0, or -inf where a key is hidden) -> probs (KVH, G, S, S), float32."""
    s = q.shape[1]
    qh = _rows(q, q.shape[0] // head_dim, head_dim).reshape(kv_heads, -1, s, head_dim)  # (KVH, G, S, hd)
    kh = np.ascontiguousarray(k).reshape(kv_heads, 1, head_dim, s)  # (KVH, 1, hd, S)
    scores = np.matmul(qh, kh)  # (KVH, G, S, S)
    scores *= np.float32(scale)
    scores += mask
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores, out=scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def attend(probs: np.ndarray, v: np.ndarray, head_dim: int) -> np.ndarray:
    """probs (KVH, G, S, S) @ values v (KVH * hd, S) per head -> (H * hd, S)."""
    kvh, g, s, _ = probs.shape
    vh = _rows(v, kvh, head_dim).reshape(kvh, 1, s, head_dim)  # (KVH, 1, S, hd)
    out = np.matmul(probs, vh)  # (KVH, G, S, hd)
    return np.ascontiguousarray(out.transpose(0, 1, 3, 2)).reshape(kvh * g * head_dim, s)


def attend_bwd(
    probs: np.ndarray, v: np.ndarray, da: np.ndarray, head_dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of :func:`attend` given da (H * hd, S): dv (KVH * hd, S) = P^T da summed over each kv
    head's group, and dp (KVH, G, S, S) = da V^T."""
    kvh, g, s, _ = probs.shape
    dah = _rows(da, kvh * g, head_dim).reshape(kvh, g, s, head_dim)  # (KVH, G, S, hd)
    dp = np.matmul(dah, np.ascontiguousarray(v).reshape(kvh, 1, head_dim, s))  # (KVH, G, S, S)
    # dv^T = da^T P over the group's stacked rows: (KVH, hd, G*S) @ (KVH, G*S, S), already (kv_dim, S)
    dv = np.matmul(_stacked(da, kvh, head_dim), probs.reshape(kvh, g * s, s))  # (KVH, hd, S)
    return dv.reshape(kvh * head_dim, s), dp


def attention_probs_bwd(
    probs: np.ndarray, dp: np.ndarray, q: np.ndarray, k: np.ndarray, head_dim: int, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients (dq (H * hd, S), dk (KVH * hd, S)) of :func:`attention_probs` given dp (KVH, G, S, S):
    the softmax backward dS = P * (dP - rowsum(P * dP)) * scale, then dq = dS K, dk = dS^T Q summed over
    each kv head's group. The mask is constant: a masked score has P = 0, so no gradient."""
    kvh, g, s, _ = probs.shape
    ds = dp - np.sum(probs * dp, axis=-1, keepdims=True)  # (KVH, G, S, S)
    ds *= probs
    ds *= np.float32(scale)
    dq = np.matmul(ds, _rows(k, kvh, head_dim).reshape(kvh, 1, s, head_dim))  # (KVH, G, S, hd)
    dq_cols = np.ascontiguousarray(dq.transpose(0, 1, 3, 2)).reshape(kvh * g * head_dim, s)
    # dk^T = Q^T dS over the group's stacked rows: (KVH, hd, G*S) @ (KVH, G*S, S), already (kv_dim, S)
    dk = np.matmul(_stacked(q, kvh, head_dim), ds.reshape(kvh, g * s, s))  # (KVH, hd, S)
    return dq_cols, dk.reshape(kvh * head_dim, s)
