"""Attention: scaled_dot_product_attention (iOS18)."""

from __future__ import annotations

import numpy as np

from anekit.mil import types as T
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op


def _known(*dims: T.Dim) -> bool:
    return all(isinstance(d, int) for d in dims)


def _same_dims(p: T.Dim, q: T.Dim) -> bool:
    return not _known(p, q) or p == q


@register_op
class scaled_dot_product_attention(OpDef):
    """scaled_dot_product_attention(query, key, value, attn_mask?): softmax(Q K^T / sqrt(E) + mask) V.

    query: T, [*B, L, E]; key: T, [*B, S, E]; value: T, [*B, S, EV]; T in {fp16, fp32}; one rank
    >= 3 for all three and the same batch dims *B (no broadcasting between them). attn_mask: M in
    {bool, fp16, fp32}, optional, shape [..., S] broadcastable to [*B, L, S] (it must not enlarge that
    shape): a bool mask keeps the scores where it is True and drops the others (-inf before the
    softmax); a float mask is added to the scores. The scale is 1/sqrt(E). A row whose scores are all
    dropped yields NaN, as the formula does. Output: T, [*B, L, EV].
    """

    inputs = {
        "query": Input(T.FLOATS),
        "key": Input(T.FLOATS),
        "value": Input(T.FLOATS),
        "attn_mask": Input(frozenset({"bool", "fp16", "fp32"}), optional=True),
    }
    same_dtype = ("query", "key", "value")

    def infer(self, a: InferArgs) -> T.Type:
        q, k, v = a.tensor("query"), a.tensor("key"), a.tensor("value")
        if not q.rank == k.rank == v.rank:
            raise a.error(f"query, key and value must share one rank, got {q.rank}, {k.rank}, {v.rank}")
        if q.rank < 3:
            raise a.error(f"query, key and value must have rank >= 3 ([*B, seq, embedding]), got {q.rank}")
        for name, t in (("key", k), ("value", v)):
            if not all(_same_dims(p, r) for p, r in zip(q.shape[:-2], t.shape[:-2])):
                raise a.error(
                    f"query and {name} must have the same batch dims, got {list(q.shape[:-2])} "
                    f"and {list(t.shape[:-2])}"
                )
        if not _same_dims(q.shape[-1], k.shape[-1]):
            raise a.error(f"query and key must share the embedding size, got {q.shape[-1]} and {k.shape[-1]}")
        s = k.shape[-2]
        if not _same_dims(s, v.shape[-2]):
            raise a.error(f"key and value must share the sequence length, got {s} and {v.shape[-2]}")
        if a.has("attn_mask"):
            m = a.tensor("attn_mask")
            target = (*q.shape[:-1], s)
            if m.rank < 1 or m.rank > len(target):
                raise a.error(f"attn_mask must have rank 1..{len(target)} (broadcastable to {list(target)})")
            b = T.broadcast_shapes(target, m.shape)
            ok = b is not None and all(
                _same_dims(p, r) or r == 1 for p, r in zip(target[len(target) - m.rank :], m.shape)
            )
            if not ok:
                raise a.error(
                    f"attn_mask shape {list(m.shape)} does not broadcast to [*B, L, S] = {list(target)}"
                )
        return T.TensorType(q.dtype, (*q.shape[:-1], v.shape[-1]))

    def reference(self, a: RefArgs) -> np.ndarray:
        q, k, v = np.asarray(a["query"]), np.asarray(a["key"]), np.asarray(a["value"])
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]).astype(q.dtype)
        mask = a.get("attn_mask")
        if mask is not None:
            mask = np.asarray(mask)
            if mask.dtype == np.bool_:
                scores = np.where(mask, scores, np.asarray(-np.inf, dtype=scores.dtype))
            else:
                scores = scores + mask.astype(scores.dtype)
        with np.errstate(invalid="ignore"):
            m = np.max(scores, axis=-1, keepdims=True)
            e = np.exp(scores - m)
            w = e / np.sum(e, axis=-1, keepdims=True)
        return np.matmul(w, v)
