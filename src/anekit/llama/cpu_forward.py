"""The CPU forward: a model family's layer (``anekit.models``) lowered to float32 numpy, with a KV cache.

``CpuBlocks`` implements ``anekit.models.blocks.Blocks`` over (channels, T) float32 columns, so one code
path serves a single decode step (T = 1, run.c's case) and a whole prompt at once (the prefill), both
reading and writing the same cache. For a Llama model it computes what run.c's ``forward()`` computes,
in the same float32 arithmetic (RoPE angles in float32, scores divided by sqrt(head_dim)); the other
families' differences (biases, q / k norms, (1 + w) norms, post-norms, GeGLU, scaled embeddings, sliding
windows with their own RoPE base) come from their family file. Where the time goes: the matrix-vector
products of each decode step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.llama import cpu_ops
from anekit.llama.params import Params
from anekit.models import Blocks, LayerPlan, Rope, model_for

TOO_LARGE = "the model's weights are too large for a float32 forward"
GELU_C = math.sqrt(2.0 / math.pi)  # the tanh approximation of gelu: 0.5 x (1 + tanh(c (x + 0.044715 x^3)))


def rope_table(rope: Rope, head_dim: int, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (head_dim / 2, n_pos) of RoPE's angles, in float32 arithmetic as run.c computes them.

    Pair j of a head (channels 2j, 2j + 1) turns by pos * freq_j, freq_j = 1 / theta^(2j / head_dim)."""
    freq = rope.frequencies(head_dim, np.float32)  # (hd/2,), Llama 3's scaling applied where there is one
    angle = freq[:, None] * np.arange(n_pos, dtype=np.float32)[None, :]  # (hd/2, n_pos), float32 like run.c
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int) -> np.ndarray:
    """Rotate channel pairs of every head of x (C, T) by the angles whose cos / sin are (head_dim / 2, T)."""
    c, t = x.shape
    pairs = x.reshape(c // head_dim, head_dim // 2, 2, t)  # (heads, hd/2, 2, T)
    a, b = pairs[:, :, 0], pairs[:, :, 1]  # (heads, hd/2, T)
    out = np.empty_like(pairs)
    out[:, :, 0] = a * cos - b * sin
    out[:, :, 1] = a * sin + b * cos
    return out.reshape(c, t)


def attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    pos: int,
    cfg: ModelConfig,
    window: int = 0,
    score_scale: float = 0.0,
) -> np.ndarray:
    """Queries q (q_dim, T) at positions pos .. pos+T-1 over cached keys / values (pos+T, kv_dim) ->
    (q_dim, T).

    Query i sees keys 0 .. pos+i, or with a ``window`` only the last ``window`` of them (key j iff
    pos + i - window < j). Query head h = g * kv_group + m reads kv head g (run.c's h / kv_mul). Scores
    are divided by sqrt(head_dim) as run.c does, or multiplied by another ``score_scale``."""
    hd, t, tk = cfg.head_dim, q.shape[1], keys.shape[0]
    g, m = cfg.n_kv_heads, cfg.kv_group
    qh = q.reshape(g, m, hd, t).transpose(0, 1, 3, 2)  # (kv heads, group, T, hd)
    kh = keys.reshape(tk, g, hd).transpose(1, 2, 0)[:, None]  # (kv heads, 1, hd, Tk)
    vh = values.reshape(tk, g, hd).transpose(1, 0, 2)[:, None]  # (kv heads, 1, Tk, hd)
    if not score_scale or score_scale == 1.0 / math.sqrt(hd):
        scores = (qh @ kh) / np.float32(math.sqrt(hd))  # (kv heads, group, T, Tk)
    else:
        scores = (qh @ kh) * np.float32(score_scale)  # (kv heads, group, T, Tk)
    key_pos, query_pos = np.arange(tk)[None, :], pos + np.arange(t)[:, None]
    visible = key_pos <= query_pos  # (T, Tk)
    if window:
        visible &= key_pos > query_pos - window  # a banded causal mask
    scores = np.where(visible, scores, np.float32(-np.inf))
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)  # (kv heads, group, T, Tk)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = probs @ vh  # (kv heads, group, T, hd)
    return np.ascontiguousarray(out.transpose(0, 1, 3, 2)).reshape(cfg.q_dim, t)  # (q_dim, T)


def head_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, head_dim: int) -> np.ndarray:
    """Each head's channels of x (C, T) RMS-normalised on their own, scaled by w (head_dim,): the q / k
    norm of Qwen 3 and Gemma 3."""
    c, t = x.shape
    heads = x.reshape(c // head_dim, head_dim, t)
    scale = np.float32(1.0) / np.sqrt((heads * heads).mean(axis=1, keepdims=True) + np.float32(eps))
    return (heads * scale * w[None, :, None]).reshape(c, t).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with the sigmoid as 0.5 (1 + tanh(x / 2)) so large |x| cannot overflow exp."""
    return x * (np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * x)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of gelu (transformers' gelu_pytorch_tanh), in float32."""
    inner = np.float32(GELU_C) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


GATES = {"silu": silu, "gelu_tanh": gelu_tanh}


def check_norm_input(x: np.ndarray, what: str | Callable[[], str], pos: int) -> None:
    """``x`` (dim, T), about to be RMS-normalised, is finite and each column's sum of squares fits float32
    (else the norm would silently give zeros). One dot product decides almost always: no column's sum
    exceeds the total, so a finite total clears them all; only a total that overflowed is looked at column
    by column (a per-token check in the decode loop, so it must cost no more than one pass). ``what``
    names the input in the error; a callable is only called to write one."""
    flat = x.reshape(-1)
    if math.isfinite(float(np.dot(flat, flat))):
        return
    columns = np.einsum("ct,ct->t", x, x)  # (T,) float32 sums of squares
    if not np.isfinite(columns).all():
        named = what if isinstance(what, str) else what()
        raise AnekitError(
            f"[sample] {named} at position {pos} is too large for float32 (not finite, or its RMSNorm's mean "
            f"square overflows): {TOO_LARGE}"
        )


class KVCache:
    """Keys and values (layers, positions, kv_dim) float32 and the RoPE tables of every RoPE the model's
    layers use, grown as positions are run: a short generation from a large model never allocates the
    whole context (a Llama-2-7B's is 4 GiB of keys and values)."""

    def __init__(self, cfg: ModelConfig, ropes: Sequence[Rope], max_len: int) -> None:
        self.cfg, self.max_len = cfg, max_len
        self.keys = np.zeros((cfg.n_layers, 0, cfg.kv_dim), np.float32)  # (layers, positions, kv_dim)
        self.values = np.zeros((cfg.n_layers, 0, cfg.kv_dim), np.float32)  # (layers, positions, kv_dim)
        self.ropes = tuple(dict.fromkeys(ropes))
        self.tables = {r: rope_table(r, cfg.head_dim, 0) for r in self.ropes}  # (hd/2, positions) each

    def reserve(self, end: int) -> None:
        """Room for positions 0 .. end-1: the cache at least doubles when it grows, up to max_len."""
        have = self.keys.shape[1]
        if end <= have:
            return
        size = min(self.max_len, max(end, 2 * have, 64))
        more = np.zeros((self.cfg.n_layers, size - have, self.cfg.kv_dim), np.float32)
        self.keys = np.concatenate([self.keys, more], axis=1)  # (layers, size, kv_dim)
        self.values = np.concatenate([self.values, more], axis=1)  # (layers, size, kv_dim)
        self.tables = {r: rope_table(r, self.cfg.head_dim, size) for r in self.ropes}


class CpuBlocks:
    """``Blocks`` over float32 numpy columns (channels, T) for the positions pos .. end-1 of one call.

    ``layer`` is the layer being lowered (None: the embedding and the head); weights are read from
    ``params`` by anekit's names, only read (they may be a read-only map of the model file)."""

    def __init__(self, params: Params, cache: KVCache, pos: int, end: int) -> None:
        self.cfg = params.cfg
        self.params, self.cache, self.pos, self.end = params, cache, pos, end
        self.layer: int | None = None

    def weight(self, key: str) -> np.ndarray:
        if self.layer is None:
            return self.params.classifier if key == "wcls" else getattr(self.params, key)
        w = getattr(self.params.layers[self.layer], key)
        if w is None:
            raise AnekitError(f"[sample] layer {self.layer} has no {key}, which its model family reads")
        return w

    def _scale(self, key: str, offset: float) -> np.ndarray:
        w = self.weight(key)
        return w if not offset else (np.float32(offset) + w).astype(np.float32)  # (offset + w), float32

    def _what(self, key: str) -> str:
        """What the input of the norm ``key`` is, for the overflow message."""
        i = self.layer
        if i is None:
            return f"layer {self.cfg.n_layers - 1}'s output"
        return {
            "rms_att": f"layer {i - 1}'s output" if i else "the embedding",
            "rms_ffn": f"layer {i}'s attention output",
            "post_att_norm": f"layer {i}'s attention block",
            "post_ffn_norm": f"layer {i}'s MLP block",
        }.get(key, f"layer {i}'s {key} input")

    def rms_norm(self, x: np.ndarray, weight: str, *, offset: float, name: str) -> np.ndarray:
        check_norm_input(x, lambda: self._what(weight), self.pos)  # named only when it fails
        return cpu_ops.rmsnorm(x, self._scale(weight, offset), self.cfg.norm_eps)  # (dim, T)

    def head_rms_norm(
        self, x: np.ndarray, weight: str, *, heads: int, offset: float, name: str
    ) -> np.ndarray:
        return head_rmsnorm(x, self._scale(weight, offset), self.cfg.norm_eps, self.cfg.head_dim)

    def linear(self, x: np.ndarray, weight: str, *, name: str) -> np.ndarray:
        return self.weight(weight) @ x  # (out, T)

    def bias(self, x: np.ndarray, weight: str, *, name: str) -> np.ndarray:
        return x + self.weight(weight)[:, None]

    def rope(self, q: np.ndarray, k: np.ndarray, *, rope: Rope, name: str) -> tuple[np.ndarray, np.ndarray]:
        cos, sin = (t[:, self.pos : self.end] for t in self.cache.tables[rope])  # (hd/2, T) each
        hd = self.cfg.head_dim
        return apply_rope(q, cos, sin, hd), apply_rope(k, cos, sin, hd)

    def attention(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, window: int, score_scale: float, name: str
    ) -> np.ndarray:
        return attention(q, k, v, self.pos, self.cfg, window, score_scale)  # (q_dim, T)

    def glu(self, gate: np.ndarray, up: np.ndarray, *, act: str, name: str) -> np.ndarray:
        return GATES[act](gate) * up  # (hidden, T)

    def add(self, x: np.ndarray, y: np.ndarray, *, name: str) -> np.ndarray:
        return x + y

    def scale(self, x: np.ndarray, factor: float, *, name: str) -> np.ndarray:
        return x * np.float32(factor)

    def embedding(self, tokens: np.ndarray, *, name: str) -> np.ndarray:
        return cpu_ops.embed_lookup(self.params.embed, tokens)  # (dim, T)

    def classifier(self, x: np.ndarray, *, name: str) -> np.ndarray:
        return self.params.classifier @ x  # (vocab, T)

    def tap(self, name: str, x: np.ndarray) -> np.ndarray:
        return x

    def cache_value(self, v: np.ndarray, *, name: str) -> np.ndarray:
        assert self.layer is not None
        self.cache.values[self.layer, self.pos : self.end] = v.T  # (T, kv_dim)
        return self.cache.values[self.layer, : self.end]  # (end, kv_dim)

    def cache_key(self, k: np.ndarray, *, name: str) -> np.ndarray:
        assert self.layer is not None
        self.cache.keys[self.layer, self.pos : self.end] = k.T  # (T, kv_dim)
        return self.cache.keys[self.layer, : self.end]  # (end, kv_dim)


class CpuDecoder:
    """The model's family lowered to float32 numpy, with a KV cache of up to cfg.seq_len positions (or
    ``max_len``).

    The weights are only read (they may be a read-only map of the model file), a layer at a time. The
    cache and the RoPE tables grow with the positions run."""

    def __init__(self, params: Params, max_len: int | None = None) -> None:
        cfg = params.cfg
        self.cfg = cfg
        self.params = params
        self.max_len = cfg.seq_len if max_len is None else max_len
        self.model = model_for(cfg)
        self.plans: list[LayerPlan] = [self.model.plan(i) for i in range(cfg.n_layers)]
        self.cache = KVCache(cfg, [p.rope for p in self.plans], self.max_len)

    @property
    def keys(self) -> np.ndarray:
        return self.cache.keys

    @property
    def values(self) -> np.ndarray:
        return self.cache.values

    def forward_all(
        self, tokens: Sequence[int] | np.ndarray, pos: int, all_logits: bool = True
    ) -> np.ndarray:
        """Tokens (T,) at positions pos .. pos+T-1 -> logits (vocab, T), or (vocab, 1) of the last token.

        Keys and values of these positions are written to the cache; earlier positions are read from it,
        so they must have been run before (cache rows past pos+T are never read). A layer whose output is
        not finite (float32 overflowed on finite weights) is one AnekitError naming it, without numpy's
        warnings.
        """
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._forward_all(tokens, pos, all_logits)

    def _forward_all(self, tokens: Sequence[int] | np.ndarray, pos: int, all_logits: bool) -> np.ndarray:
        cfg = self.cfg
        tokens = np.asarray(tokens)
        t = tokens.shape[0] if tokens.ndim == 1 else 0
        end = pos + t
        if t == 0 or pos < 0 or end > self.max_len:
            raise AnekitError(
                f"[sample] cannot run {t} token(s) at position {pos}: positions must lie in "
                f"[0, {self.max_len}) (the model's context, seq_len)"
            )
        self.cache.reserve(end)
        b = CpuBlocks(self.params, self.cache, pos, end)
        blocks: Blocks[np.ndarray] = b  # the type checker holds CpuBlocks to the protocol here
        x = self.model.embed(blocks, tokens)  # (dim, T)
        for plan in self.plans:
            b.layer = plan.index
            x = self.model.layer(blocks, x, plan)  # (dim, T)
        b.layer = None
        check_norm_input(x, f"layer {cfg.n_layers - 1}'s output", pos)
        if not all_logits:
            x = x[:, -1:]  # (dim, 1): only the last position's logits are wanted
        logits = self.model.head(blocks, x)  # (vocab, T or 1)
        if not np.isfinite(logits).all():
            raise AnekitError(f"[sample] the logits at position {pos} overflow float32: {TOO_LARGE}")
        return logits

    def forward(self, tokens: Sequence[int] | np.ndarray, pos: int) -> np.ndarray:
        return self.forward_all(tokens, pos, all_logits=False)[:, 0]  # (vocab,)
