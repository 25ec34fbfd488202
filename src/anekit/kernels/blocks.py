"""MIL building blocks of the transformer kernels, on [1, C, 1, S] fp16 tensors.

A ``KernelBuilder`` holds one kernel under construction: its function (input ``x`` laid out by a
``Layout``), its weight pack (fp16 BLOBFILE consts in one file), and helpers for the pieces every
kernel shares: RMSNorm, 1x1 conv projections, head views, RoPE, grouped-query attention, and the final
channel concatenation of the outputs ("taps").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from anekit.blob import build_blob_bytes
from anekit.kernels.config import ModelConfig
from anekit.kernels.spec import KernelSpec, Layout, LayoutError, WeightPack
from anekit.mil import Builder, Var, tensor

MASK_VALUE = -65504.0  # the most negative fp16: masked scores vanish in softmax
MASK_FILE = "@model_path/weights/mask.bin"  # the cached causal mask blob, shared by every kernel


@lru_cache(maxsize=16)
def causal_mask_blob(seq: int) -> bytes:
    """The causal mask [1, 1, seq, seq] as a cached fp16 MILBlob: 0 on/below the diagonal, -65504 above."""
    return build_blob_bytes([(causal_mask(seq), "fp16")])[0]


def causal_mask(seq: int) -> np.ndarray:
    """[1, 1, seq, seq] float32: 0 where key position <= query position, -65504 elsewhere."""
    return np.triu(np.full((seq, seq), MASK_VALUE, dtype=np.float32), k=1).reshape(1, 1, seq, seq)


def rope_tables(cfg: ModelConfig, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [1, channels / 2, 1, seq] for rotating channel pairs (2i, 2i + 1), as llama2.c does.

    Pair i sits at position (2i) % head_dim within its head; its frequency is theta^(-(2i % hd) / hd).
    """
    hd = cfg.head_dim
    pair = np.arange(channels // 2)
    freq = cfg.rope_theta ** (-((2 * pair) % hd) / hd)  # (channels / 2,)
    angle = freq[:, None] * np.arange(cfg.seq_len)[None, :]  # (channels / 2, seq)
    shape = (1, channels // 2, 1, cfg.seq_len)
    return np.cos(angle).reshape(shape), np.sin(angle).reshape(shape)


class KernelBuilder:
    """One kernel being generated: MIL function ``main(x) -> out`` plus its fp16 weight file."""

    def __init__(
        self, name: str, cfg: ModelConfig, inputs: Layout, weights: Mapping[str, np.ndarray] | None
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.inputs = inputs
        self.values = weights
        self.pack = WeightPack()
        self.builder = Builder()
        self.f = self.builder.function("main", opset="ios18")
        self.x = self.f.input("x", tensor("fp16", [1, inputs.channels, 1, inputs.spatial]))
        self._parts: dict[str, Var] = {}
        self._mask: Var | None = None
        self.shared_files: dict[str, bytes] = {}

    # -- inputs and weights ------------------------------------------------------------------------

    def part(self, name: str) -> Var:
        """One named channel range of the input (the whole input when it has a single part)."""
        if name not in self._parts:
            offset, channels = self.inputs.range(name)
            if len(self.inputs.parts) == 1:
                self._parts[name] = self.x
            else:
                self._parts[name] = self.f.slice_by_size(
                    x=self.x,
                    begin=[0, offset, 0, 0],
                    size=[1, channels, 1, self.inputs.spatial],
                    name=f"in_{name}",
                )
        return self._parts[name]

    def value(self, key: str) -> np.ndarray | None:
        """The float array of weight ``key`` (None when generating from shapes only)."""
        if self.values is None:
            return None
        if key not in self.values:
            raise LayoutError(f"[{self.name}] weight '{key}' was not given (given: {', '.join(self.values)})")
        return np.asarray(self.values[key], dtype=np.float32)

    def weight(self, name: str, shape: tuple[int, ...], array: np.ndarray | None) -> Var:
        """An fp16 BLOBFILE const of this kernel's weight file."""
        offset = self.pack.add(name, shape, array)
        return self.f.weight(tensor("fp16", list(shape)), self.pack.path, offset, name=name)

    def matrix(self, name: str, key: str, rows: int, cols: int, transpose: bool = False) -> Var:
        """A [rows, cols, 1, 1] conv weight from the (out, in) matrix ``key`` (or its transpose)."""
        a = self.value(key)
        if a is not None:
            want = (cols, rows) if transpose else (rows, cols)
            if a.shape != want:
                raise LayoutError(
                    f"[{self.name}] weight '{key}' has shape {list(a.shape)}, expected {list(want)}"
                )
            a = a.T if transpose else a
        return self.weight(name, (rows, cols, 1, 1), None if a is None else np.ascontiguousarray(a))

    def vector(self, name: str, key: str, channels: int) -> Var:
        """A per-channel [1, channels, 1, 1] weight (e.g. an RMSNorm scale)."""
        a = self.value(key)
        if a is not None and a.shape != (channels,):
            raise LayoutError(
                f"[{self.name}] weight '{key}' has shape {list(a.shape)}, expected [{channels}]"
            )
        return self.weight(name, (1, channels, 1, 1), a)

    def mask(self) -> Var:
        """The causal mask [1, 1, S, S] (0 allowed, -65504 masked), from the cached mask blob file."""
        if self._mask is None:
            seq = self.cfg.seq_len
            self.shared_files[MASK_FILE] = causal_mask_blob(seq)
            self._mask = self.f.weight(tensor("fp16", [1, 1, seq, seq]), MASK_FILE, 64, name="mask")
        return self._mask

    # -- blocks ------------------------------------------------------------------------------------

    def conv(self, x: Var, weight: Var, name: str) -> Var:
        """A 1x1 conv: the engine's matmul, [1, in, 1, S] -> [1, out, 1, S]."""
        return self.f.conv(
            x=x,
            weight=weight,
            strides=[1, 1],
            pad_type="valid",
            pad=[0, 0, 0, 0],
            dilations=[1, 1],
            groups=1,
            name=name,
        )

    def rms_inverse(self, x: Var, tag: str) -> Var:
        """(mean over channels of x^2 + eps)^-1/2: [1, C, 1, S] -> [1, 1, 1, S]."""
        channels = x.type.shape[1]  # type: ignore[union-attr]
        sq = self.f.mul(x=x, y=x, name=f"{tag}_sq")
        ss = self.f.reduce_sum(x=sq, axes=[1], keep_dims=True, name=f"{tag}_ss")
        ms = self.f.mul(x=ss, y=1.0 / channels, name=f"{tag}_ms")
        return self.f.pow(
            x=self.f.add(x=ms, y=self.cfg.norm_eps, name=f"{tag}_eps"), y=-0.5, name=f"{tag}_rrms"
        )

    def rmsnorm(self, x: Var, scale: Var, tag: str) -> Var:
        """x * rsqrt(mean(x^2) + eps) * scale, over channels."""
        r = self.rms_inverse(x, tag)
        return self.f.mul(x=self.f.mul(x=x, y=r, name=f"{tag}_xr"), y=scale, name=f"{tag}_out")

    def swiglu_grads(self, dgate: Var, h1: Var, h3: Var) -> tuple[Var, Var]:
        """Gradients of gate = silu(h1) * h3 w.r.t. h1 and h3, given dgate; all (1, hidden, 1, S).

        d silu / d h1 = sig * (1 + h1 * (1 - sig)), written with factors of size O(1) for fp16.
        """
        f = self.f
        sig = f.sigmoid(x=h1, name="h1_sigmoid")
        silu = f.mul(x=h1, y=sig, name="h1_silu")
        one_minus = f.sub(x=1.0, y=sig, name="sig_complement")
        bracket = f.add(x=f.mul(x=h1, y=one_minus, name="h1_sig_complement"), y=1.0, name="bracket")
        slope = f.mul(x=sig, y=bracket, name="silu_slope")  # d silu / d h1
        dh1 = f.mul(x=f.mul(x=dgate, y=h3, name="dgate_h3"), y=slope, name="dh1")
        dh3 = f.mul(x=dgate, y=silu, name="dh3")
        return dh1, dh3

    def heads(self, x: Var, n_heads: int, tag: str) -> Var:
        """[1, n*hd, 1, S] -> [1, n, S, hd]."""
        hd, seq = self.cfg.head_dim, self.cfg.seq_len
        x4 = self.f.reshape(x=x, shape=[1, n_heads, hd, seq], name=f"{tag}_4d")  # (1, n, hd, S)
        return self.f.transpose(x=x4, perm=[0, 1, 3, 2], name=f"{tag}_h")  # (1, n, S, hd)

    def merge_heads(self, x: Var, n_heads: int, tag: str) -> Var:
        """[1, n, S, hd] -> [1, n*hd, 1, S]."""
        hd, seq = self.cfg.head_dim, self.cfg.seq_len
        t = self.f.transpose(x=x, perm=[0, 1, 3, 2], name=f"{tag}_t")  # (1, n, hd, S)
        return self.f.reshape(x=t, shape=[1, n_heads * hd, 1, seq], name=f"{tag}_m")

    def rope(self, x: Var, channels: int, tag: str, inverse: bool = False) -> Var:
        """Rotate channel pairs (2i, 2i+1) by the position angle; ``inverse`` rotates back (the transpose).

        [1, C, 1, S] -> reshape [1, C/2, 2, S] -> a, b = the two halves of each pair ->
        (a cos - b sin, a sin + b cos) (inverse: (a cos + b sin, -a sin + b cos)) -> concat -> reshape.
        """
        seq, half = self.cfg.seq_len, channels // 2
        cos, sin = rope_tables(self.cfg, channels)
        c = self.weight(f"{tag}_cos", (1, half, 1, seq), cos)
        s = self.weight(f"{tag}_sin", (1, half, 1, seq), sin)
        pairs = self.f.reshape(x=x, shape=[1, half, 2, seq], name=f"{tag}_pairs")
        a = self.f.slice_by_size(x=pairs, begin=[0, 0, 0, 0], size=[1, half, 1, seq], name=f"{tag}_a")
        b = self.f.slice_by_size(x=pairs, begin=[0, 0, 1, 0], size=[1, half, 1, seq], name=f"{tag}_b")
        ac, bs = self.f.mul(x=a, y=c, name=f"{tag}_ac"), self.f.mul(x=b, y=s, name=f"{tag}_bs")
        as_, bc = self.f.mul(x=a, y=s, name=f"{tag}_as"), self.f.mul(x=b, y=c, name=f"{tag}_bc")
        if inverse:
            ra, rb = self.f.add(x=ac, y=bs, name=f"{tag}_ra"), self.f.sub(x=bc, y=as_, name=f"{tag}_rb")
        else:
            ra, rb = self.f.sub(x=ac, y=bs, name=f"{tag}_ra"), self.f.add(x=as_, y=bc, name=f"{tag}_rb")
        joined = self.f.concat(
            values=(ra, rb), axis=2, interleave=False, name=f"{tag}_join"
        )  # (1, C/2, 2, S)
        return self.f.reshape(x=joined, shape=[1, channels, 1, seq], name=f"{tag}_out")

    def group_queries(self, q: Var, tag: str) -> Var:
        """[1, H, S, X] -> [1, KVH, G*S, X]: the query heads sharing a kv head, stacked along rows."""
        cfg = self.cfg
        last = q.type.shape[3]
        return self.f.reshape(x=q, shape=[1, cfg.n_kv_heads, cfg.kv_group * cfg.seq_len, last], name=tag)

    def ungroup(self, x: Var, tag: str) -> Var:
        """[1, KVH, G*S, X] -> [1, H, S, X]."""
        cfg = self.cfg
        last = x.type.shape[3]
        return self.f.reshape(x=x, shape=[1, cfg.n_heads, cfg.seq_len, last], name=tag)

    def attention_probs(self, qh: Var, kh: Var, tag: str) -> Var:
        """softmax(Q K^T / sqrt(hd) + causal mask) over keys.

        [1, H, S, hd] and [1, KVH, S, hd] -> [1, H, S, S].
        """
        cfg = self.cfg
        qg = self.group_queries(qh, f"{tag}_qg")  # (1, KVH, G*S, hd)
        scores = self.f.matmul(
            x=qg, y=kh, transpose_x=False, transpose_y=True, name=f"{tag}_qk"
        )  # (1,KVH,G*S,S)
        scores = self.ungroup(scores, f"{tag}_scores")  # (1, H, S, S)
        scaled = self.f.mul(x=scores, y=1.0 / math.sqrt(cfg.head_dim), name=f"{tag}_scaled")
        masked = self.f.add(x=scaled, y=self.mask(), name=f"{tag}_masked")
        return self.f.softmax(x=masked, axis=-1, name=f"{tag}_probs")

    def attend(self, probs: Var, vh: Var, tag: str) -> Var:
        """probs @ V per head (GQA: each kv head serves its group): -> [1, H, S, hd]."""
        pg = self.group_queries(probs, f"{tag}_pg")  # (1, KVH, G*S, S)
        out = self.f.matmul(
            x=pg, y=vh, transpose_x=False, transpose_y=False, name=f"{tag}_pv"
        )  # (1,KVH,G*S,hd)
        return self.ungroup(out, f"{tag}_o")  # (1, H, S, hd)

    def flat_scores(self, x: Var, tag: str) -> Var:
        """[1, H, S, S] -> [1, H*S, 1, S]: attention scores as channels, to travel in a surface."""
        cfg = self.cfg
        return self.f.reshape(x=x, shape=[1, cfg.n_heads * cfg.seq_len, 1, cfg.seq_len], name=tag)

    def score_heads(self, x: Var, tag: str) -> Var:
        """[1, H*S, 1, S] -> [1, H, S, S]."""
        cfg = self.cfg
        return self.f.reshape(x=x, shape=[1, cfg.n_heads, cfg.seq_len, cfg.seq_len], name=tag)

    # -- output ------------------------------------------------------------------------------------

    def finish(self, outputs: Layout, parts: Mapping[str, Var]) -> KernelSpec:
        """Concatenate the named results along channels (in layout order) as the output ``out``."""
        values = tuple(parts[n] for n in outputs.names)
        for (n, c), v in zip(outputs.parts, values):
            if v.type.shape != (1, c, 1, outputs.spatial):  # type: ignore[union-attr]
                raise LayoutError(
                    f"[{self.name}] output part '{n}' is {v.type}, layout says [1, {c}, 1, {outputs.spatial}]"
                )
        if len(values) == 1:
            out = self.f.identity(x=values[0], name="out")
        else:
            out = self.f.concat(values=values, axis=1, interleave=False, name="out")
        self.f.output(out)
        return KernelSpec(self.name, self.builder.build(), self.inputs, outputs, self.pack, self.shared_files)
