"""MIL building blocks of the transformer kernels, on [1, C, 1, S] fp16 tensors.

A ``KernelBuilder`` holds one kernel under construction: its function (input ``x`` laid out by a
``Layout``), its weight pack (fp16 BLOBFILE consts in one file), and helpers for the pieces every
kernel shares: RMSNorm, 1x1 conv projections, head views, RoPE, grouped-query attention, and the final
channel concatenation of the outputs ("taps").

Every construct emitted here has precedent in kernels that ran on the engine (maderix/ANE
training/stories_mil.h and training/training_dynamic/mil_dynamic.h): the output is the last compute op
named ``out`` (never a trailing ``identity``), reshapes always change the shape, concat joins channels
only, and a conv never reads more than ``MAX_CONV_INPUT_CHANNELS`` channels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from anekit.blob import build_blob_bytes
from anekit.engine.extents import SPATIAL
from anekit.kernels.config import ModelConfig
from anekit.kernels.route import NORM, ROPE, BadKernelRoute
from anekit.kernels.spec import KernelSpec, Layout, LayoutError, WeightPack
from anekit.mil import Builder, Var, tensor
from anekit.mil.values import string_literal

MASK_VALUE = -65504.0  # the most negative fp16: masked scores vanish in softmax
MASK_FILE = "@model_path/weights/mask.bin"  # the cached causal mask blob, shared by every kernel
OUTPUT = "out"  # the name of every kernel's single output (``KernelSpec.run`` reads it)
# The widest conv input seen working on the engine: maderix/ANE training/stories_mil.h runs W2 / W1^T
# convs with 2048 input channels; training/ane_classifier.h reports a 32000-channel conv rejected.
MAX_CONV_INPUT_CHANNELS = 2048


@lru_cache(maxsize=16)
def causal_mask_blob(seq: int, window: int = 0) -> bytes:
    """The causal mask [1, 1, seq, seq] as a cached fp16 MILBlob: 0 on/below the diagonal, -65504 above
    (``window`` > 0: the banded mask of a sliding layer, ``causal_mask``)."""
    return build_blob_bytes([(causal_mask(seq, window), "fp16")])[0]


def mask_file(window: int = 0) -> str:
    """The weight file of the mask: ``MASK_FILE`` for the causal one, a file per window for banded ones."""
    return MASK_FILE if not window else f"@model_path/weights/mask_window{window}.bin"


def causal_mask(seq: int, window: int = 0) -> np.ndarray:
    """[1, 1, seq, seq] float32: 0 where key position j <= query position i, -65504 elsewhere; with a
    ``window`` > 0 (a sliding layer) also -65504 where j <= i - window, so each query sees the last
    ``window`` positions, itself included (transformers' sliding-window mask)."""
    mask = np.triu(np.full((seq, seq), MASK_VALUE, dtype=np.float32), k=1)
    if window:
        mask += np.tril(np.full((seq, seq), MASK_VALUE, dtype=np.float32), k=-window)
    return mask.reshape(1, 1, seq, seq)


def rope_tables(cfg: ModelConfig, channels: int, kind: str = "full") -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [1, channels / 2, 1, seq] for rotating channel pairs (2i, 2i + 1), as llama2.c does.

    Pair i sits at position (2i) % head_dim within its head; its frequency is theta^(-(2i % hd) / hd),
    theta and the frequency scaling those of a ``kind`` layer (``ModelConfig.kind_rope``).
    """
    hd = cfg.head_dim
    theta, scaling = cfg.kind_rope(kind)
    pair = np.arange(channels // 2)
    freq = theta ** (-((2 * pair) % hd) / hd)  # (channels / 2,)
    if scaling is not None:  # Llama 3's frequency bands
        freq = scaling.apply(freq)
    angle = freq[:, None] * np.arange(cfg.seq_len)[None, :]  # (channels / 2, seq)
    shape = (1, channels // 2, 1, cfg.seq_len)
    return np.cos(angle).reshape(shape), np.sin(angle).reshape(shape)


def rope_full_tables(cfg: ModelConfig, channels: int, kind: str = "full") -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [1, channels, 1, seq]: ``rope_tables`` with each pair's row written for both members."""
    cos, sin = rope_tables(cfg, channels, kind)  # (1, C/2, 1, S) each
    return np.repeat(cos, 2, axis=1), np.repeat(sin, 2, axis=1)  # (1, C, 1, S) each


def rope_head_tables(cfg: ModelConfig, kind: str = "full") -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [1, 1, S, head_dim] for rotating the pairs (2i, 2i + 1) of every head in the heads view
    [1, n, S, hd] (broadcast over the heads): row s, column j holds the angle of position s for the pair
    of j, the tables maderix/ANE training/training_dynamic/mil_dynamic.h bakes as rope_cos / rope_sin."""
    cos, sin = rope_full_tables(cfg, cfg.head_dim, kind)  # (1, hd, 1, S) each: channel j, position s
    return cos.transpose(0, 2, 3, 1), sin.transpose(0, 2, 3, 1)  # (1, 1, S, hd) each


def pair_view(n_heads: int, seq: int, head_dim: int) -> list[int]:
    """The shape viewing heads [1, n, S, hd] as channel pairs on the last axis: [1, n, S*hd/2, 2], as
    maderix's and rustane's kernels reshape them; [1, n*S, hd/2, 2] (the same elements in the same order)
    when S*hd/2 is wider than the engine's widest spatial extent on the M1 to M3 (16384,
    ``anekit.engine.extents`` 'extent.spatial')."""
    pairs = seq * head_dim // 2
    if pairs <= SPATIAL.limit("any"):
        return [1, n_heads, pairs, 2]
    return [1, n_heads * seq, head_dim // 2, 2]


def rotate_half_matrix(head_dim: int) -> np.ndarray:
    """The (hd, hd) matrix P with x P = (-b0, a0, -b1, a1, ...) for a row x = (a0, b0, a1, b1, ...): the
    pair swap of one head's row as a matmul from the right, P[2i + 1, 2i] = -1 and P[2i, 2i + 1] = 1, the
    constant ncdrone/rustane's sdpaFwd multiplies the heads by since pull request #9 ('rotate_half(x) =
    x @ P'); the transpose of ``pair_swap_matrix``, which swaps a column from the left."""
    return np.ascontiguousarray(pair_swap_matrix(head_dim).T)


def pair_swap_matrix(channels: int) -> np.ndarray:
    """The (channels, channels) matrix P with P x = (-b0, a0, -b1, a1, ...) for x = (a0, b0, a1, b1, ...).

    Rotating pair (a, b) by angle t is (a cos t - b sin t, a sin t + b cos t) = x cos t + (P x) sin t.
    """
    p = np.zeros((channels, channels), dtype=np.float32)
    even = np.arange(0, channels, 2)
    p[even, even + 1] = -1.0  # out[2i] = -x[2i + 1]
    p[even + 1, even] = 1.0  # out[2i + 1] = x[2i]
    return p


class KernelBuilder:
    """One kernel being generated: MIL function ``main(x) -> out`` plus its fp16 weight file.

    ``kind`` is the layer type the kernel serves ("full" or "sliding", ``ModelConfig.layer_types``): it
    chooses the attention mask (causal, or banded to the sliding window) and the RoPE tables. ``norm`` and
    ``rope`` are the training route's choices (``anekit.kernels.route``): ``norm`` "host" makes the
    channel RMSNorms the family asks for no-ops (the input is normalised already, ``MilBlocks.rms_norm``),
    ``rope`` chooses how ``rope`` writes the rotation (a swap conv, slices and a concat, or a matmul by a
    constant permutation); the defaults are the legacy kernels'."""

    def __init__(
        self,
        name: str,
        cfg: ModelConfig,
        inputs: Layout,
        weights: Mapping[str, np.ndarray] | None,
        kind: str = "full",
        *,
        norm: str = "engine",
        rope: str = "conv",
    ) -> None:
        if norm not in NORM:
            raise BadKernelRoute(f"[{name}] norm '{norm}' (choose one of: {', '.join(NORM)})")
        if rope not in ROPE:
            raise BadKernelRoute(f"[{name}] rope '{rope}' (choose one of: {', '.join(ROPE)})")
        self.name = name
        self.kind = kind
        self.norm_at = norm  # where the channel RMSNorms run: "engine" (here) or "host"
        self.rope_form = rope  # how RoPE is written: "conv", "slice", "matmul" ("host": the kernel has none)
        # the engine's channel / spatial limits for kernels of this model (the vocabulary: the head's own)
        self.cfg = cfg.check_kernels(vocab=False)
        self.inputs = inputs
        self.values = weights
        self.pack = WeightPack()
        self.builder = Builder()
        self.f = self.builder.function("main", opset="ios18")
        self.x = self.f.input("x", tensor("fp16", [1, inputs.channels, 1, inputs.spatial]))
        self._parts: dict[str, Var] = {}
        self._mask: Var | None = None
        self._rope: dict[int, tuple[Var, Var, Var]] = {}  # channels -> (pair swap, cos, sin)
        self._rope_heads: tuple[Var, Var] | None = None  # (cos, sin) [1, 1, S, hd] of the heads-view RoPE
        self._rope_perm: Var | None = None  # P [1, 1, hd, hd] of the matmul RoPE
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
        path, offset = self.pack.add(name, shape, array)
        return self.f.weight(tensor("fp16", list(shape)), path, offset, name=name)

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

    def vector(self, name: str, key: str, channels: int, offset: float = 0.0) -> Var:
        """A per-channel [1, channels, 1, 1] weight (e.g. an RMSNorm scale), ``offset`` added to it."""
        a = self.value(key)
        if a is not None and a.shape != (channels,):
            raise LayoutError(
                f"[{self.name}] weight '{key}' has shape {list(a.shape)}, expected [{channels}]"
            )
        if a is not None and offset:
            a = a + np.float32(offset)
        return self.weight(name, (1, channels, 1, 1), a)

    def norm_scale(self, name: str, key: str, channels: int) -> Var:
        """An RMSNorm's scale [1, channels, 1, 1]: weight ``key`` plus ``cfg.norm_offset`` (Gemma's
        x * (1 + w) bakes 1 + w; the scale's gradient is w's)."""
        return self.vector(name, key, channels, self.cfg.norm_offset)

    def mask(self) -> Var:
        """The attention mask [1, 1, S, S] (0 allowed, -65504 masked) from a cached mask blob file: causal,
        or banded for a sliding layer (``causal_mask``)."""
        if self._mask is None:
            seq, window = self.cfg.seq_len, self.cfg.kind_window(self.kind)
            path = mask_file(window)
            self.shared_files[path] = causal_mask_blob(seq, window)
            self._mask = self.f.weight(tensor("fp16", [1, 1, seq, seq]), path, 64, name="mask")
        return self._mask

    # -- blocks ------------------------------------------------------------------------------------

    def conv(self, x: Var, weight: Var, name: str) -> Var:
        """A 1x1 conv: the engine's matmul, [1, in, 1, S] -> [1, out, 1, S] (in <= 2048 channels)."""
        channels = weight.type.shape[1]  # type: ignore[attr-defined]
        if channels > MAX_CONV_INPUT_CHANNELS:
            raise LayoutError(
                f"[{self.name}] conv '{name}' reads {channels} input channels; the widest conv with "
                f"hardware precedent reads {MAX_CONV_INPUT_CHANNELS}: split it"
            )
        return self.f.conv1x1(x, weight, name)

    def reshape(self, x: Var, shape: list[int], name: str) -> Var:
        """``reshape`` to ``shape``; ``x`` itself when it already has that shape (no same-shape reshapes:
        they have no hardware precedent)."""
        if list(x.type.shape) == list(shape):  # type: ignore[attr-defined]
            return x
        return self.f.reshape(x=x, shape=shape, name=name)

    def rms_inverse(self, x: Var, tag: str, axis: int = 1) -> Var:
        """(mean over channels of x^2 + eps)^-1/2: [1, C, 1, S] -> [1, 1, 1, S], finite and accurate over
        the whole fp16 range of x. ``axis`` 2 reduces over the third axis instead ([1, H, hd, S] ->
        [1, H, 1, S]: each head's own RMS, ``head_rmsnorm``).

        The squares are taken of y = x / m, m = max over channels of |x| (per position, at least 2^-14):
        |y| <= 1 with one |y| = 1, so the sum of squares lies in [1, C] — no square overflows (x * x does
        from |x| = 256), none of the ones that matter is an fp16 subnormal (a square under 2^-14 comes
        from |y| < 2^-7 and adds at most C 2^-14 to a sum of at least 1), and the sum stays far under the
        MAC port's 2^15 whatever unit reduces it. Then (mean(x^2) + eps)^-1/2 = (mean(y^2) +
        (sqrt(eps) / m)^2)^-1/2 / m, at most eps^-1/2 (316 for 1e-5). A fixed pre-scale cannot do this:
        at RMS 0.005 the squares of x / sqrt(C) are subnormals a flushing MAC drops, at RMS 100 x * x
        overflows (anekit.engine.numerics: 'mac.subnormal-flush', 'mac.output-ceiling').

        Evidence: coremltools rescales rms_norm by max|x| for fp16 on the engine (apple/coremltools
        issues #2821 / pull request #2822, verified on an M3 Max; it clamps m >= 1, which leaves small
        activations unscaled — here m is floored at 2^-14 instead); abs, reduce_max, maximum and real_div
        are native on M1 through M5 (sbryngelson/ane-guide appendices/a-op-device-matrix.md); the
        reduce_sum + pow(-0.5) tail is maderix/ANE training/stories_mil.h's, which ran on hardware.
        """
        f = self.f
        channels = x.type.shape[axis]  # type: ignore[attr-defined]
        peak = f.reduce_max(x=f.abs(x=x, name=f"{tag}_abs"), axes=[axis], keep_dims=True, name=f"{tag}_peak")
        m = f.maximum(x=peak, y=2.0**-14, name=f"{tag}_m")  # (1, 1, 1, S)
        y = f.real_div(x=x, y=m, name=f"{tag}_y")  # (1, C, 1, S), |y| <= 1
        sq = f.mul(x=y, y=y, name=f"{tag}_sq")  # (1, C, 1, S)
        ss = f.reduce_sum(x=sq, axes=[axis], keep_dims=True, name=f"{tag}_ss")  # (1, 1, 1, S), in [1, C]
        ms = f.mul(x=ss, y=1.0 / channels, name=f"{tag}_ms")  # (1, 1, 1, S): mean of y^2
        em = f.real_div(x=math.sqrt(self.cfg.norm_eps), y=m, name=f"{tag}_em")  # (1, 1, 1, S)
        e = f.add(x=ms, y=f.mul(x=em, y=em, name=f"{tag}_em2"), name=f"{tag}_eps")  # (1, 1, 1, S)
        r = f.pow(x=e, y=-0.5, name=f"{tag}_r")  # (1, 1, 1, S): m / rms
        return f.real_div(x=r, y=m, name=f"{tag}_rrms")  # (1, 1, 1, S): 1 / rms

    def rmsnorm(self, x: Var, scale: Var, tag: str) -> Var:
        """x * rsqrt(mean(x^2) + eps) * scale, over channels."""
        r = self.rms_inverse(x, tag)
        return self.f.mul(x=self.f.mul(x=x, y=r, name=f"{tag}_xr"), y=scale, name=f"{tag}_out")

    def head_rmsnorm(self, x: Var, n_heads: int, scale: Var, tag: str) -> Var:
        """Each head's channels of x [1, n*hd, 1, S] RMS-normalised on their own, times ``scale`` (the
        (hd,) weight tiled over the heads: [1, n*hd, 1, 1] baked or [1, n*hd, 1, S] from a dynamic
        input): Qwen 3's q / k norm. The heads view [1, n, hd, S] puts each head's hd channels on one
        axis, which ``rms_inverse`` reduces with the same overflow-safe numerics as the channel RMSNorm.
        """
        hd, seq = self.cfg.head_dim, self.cfg.seq_len
        x4 = self.reshape(x, [1, n_heads, hd, seq], f"{tag}_4d")  # (1, n, hd, S)
        r = self.rms_inverse(x4, tag, axis=2)  # (1, n, 1, S): 1 / rms of each head
        y4 = self.f.mul(x=x4, y=r, name=f"{tag}_xr")  # (1, n, hd, S)
        y = self.reshape(y4, [1, n_heads * hd, 1, seq], f"{tag}_flat")  # (1, n*hd, 1, S)
        return self.f.mul(x=y, y=scale, name=f"{tag}_out")  # (1, n*hd, 1, S)

    def head_vector(self, name: str, key: str, n_heads: int) -> Var:
        """A per-head weight ``key`` (head_dim,) tiled over ``n_heads`` heads: [1, n*hd, 1, 1]."""
        hd = self.cfg.head_dim
        a = self.value(key)
        if a is not None:
            if a.shape != (hd,):
                raise LayoutError(f"[{self.name}] weight '{key}' has shape {list(a.shape)}, expected [{hd}]")
            a = np.tile(a, n_heads)  # (n*hd,)
            if self.cfg.norm_offset:  # a q / k norm's scale: offset + w, as ``norm_scale``
                a = a + np.float32(self.cfg.norm_offset)
        return self.weight(name, (1, n_heads * hd, 1, 1), a)

    def gate(self, h1: Var, h3: Var) -> Var:
        """The gated unit act(h1) * h3 of the FFN, act ``cfg.mlp_act``; all (1, hidden, 1, S).

        "silu": SwiGLU, silu composed as h1 * sigmoid(h1) (maderix/ANE training/stories_mil.h). "gelu_tanh":
        GeGLU with the tanh-approximated gelu, one ``gelu`` op with its mode written: the engine runs gelu
        natively on M1 through M5 (sbryngelson/ane-guide's op matrix, a lookup table) and gelu(mode =
        "TANH_APPROXIMATION") ran against a reference on an M4 Max (rule 'op.gelu-mode'; only a gelu
        without its mode was refused)."""
        f = self.f
        if self.cfg.mlp_act == "gelu_tanh":
            act = f.gelu(x=h1, mode="TANH_APPROXIMATION", name="h1_gelu")  # (1, hidden, 1, S)
        else:
            sig = f.sigmoid(x=h1, name="h1_sigmoid")  # (1, hidden, 1, S)
            act = f.mul(x=h1, y=sig, name="h1_silu")  # (1, hidden, 1, S)
        return f.mul(x=act, y=h3, name="gate")  # (1, hidden, 1, S)

    def gate_grads(self, dgate: Var, h1: Var, h3: Var) -> tuple[Var, Var]:
        """Gradients of ``gate`` w.r.t. h1 and h3, given dgate: ``swiglu_grads`` or ``geglu_grads``."""
        if self.cfg.mlp_act == "gelu_tanh":
            return self.geglu_grads(dgate, h1, h3)
        return self.swiglu_grads(dgate, h1, h3)

    def geglu_grads(self, dgate: Var, h1: Var, h3: Var) -> tuple[Var, Var]:
        """Gradients of gate = gelu_tanh(h1) * h3 w.r.t. h1 and h3, given dgate; all (1, hidden, 1, S).

        With u = c x (1 + a x^2), c = sqrt(2 / pi), a = 0.044715 and t = tanh(u): gelu = x (1 + t) / 2 and
        d gelu / dx = (1 + t) / 2 + x (1 - t^2) c (1 + 3 a x^2) / 2. No MIL op gives the derivative, so it
        is composed of tanh, clip, mul and add (each native on M1 through M5, sbryngelson/ane-guide's op
        matrix). x is clipped to [-8, 8] first: beyond, t is +-1 in fp16 and the slope exactly 1 or 0,
        and x^2 stays <= 64 (x^3 overflows fp16 from |x| = 40). gelu itself (for dh3) is x (1 + t) / 2 of
        the unclipped x, which equals it everywhere.
        """
        f = self.f
        c, a = math.sqrt(2.0 / math.pi), 0.044715
        xc = f.clip(x=h1, alpha=-8.0, beta=8.0, name="h1_clip")  # (1, hidden, 1, S), |xc| <= 8
        x2 = f.mul(x=xc, y=xc, name="h1_sq")  # (1, hidden, 1, S), <= 64
        poly = f.add(x=f.mul(x=x2, y=a, name="h1_sq_a"), y=1.0, name="h1_poly")  # 1 + a x^2
        u = f.mul(x=f.mul(x=xc, y=poly, name="h1_inner"), y=c, name="h1_u")  # c x (1 + a x^2)
        t = f.tanh(x=u, name="h1_tanh")  # (1, hidden, 1, S)
        half = f.mul(x=f.add(x=t, y=1.0, name="h1_1pt"), y=0.5, name="h1_half")  # (1 + t) / 2
        gelu = f.mul(x=h1, y=half, name="h1_gelu")  # (1, hidden, 1, S)
        sech2 = f.sub(x=1.0, y=f.mul(x=t, y=t, name="h1_t2"), name="h1_sech2")  # 1 - t^2
        du = f.add(x=f.mul(x=x2, y=3 * a * c, name="h1_du_sq"), y=c, name="h1_du")  # c (1 + 3 a x^2)
        tail = f.mul(x=f.mul(x=xc, y=sech2, name="h1_x_sech2"), y=du, name="h1_tail_full")
        slope = f.add(x=half, y=f.mul(x=tail, y=0.5, name="h1_tail"), name="gelu_slope")  # d gelu / dx
        dh1 = f.mul(x=f.mul(x=dgate, y=h3, name="dgate_h3"), y=slope, name="dh1")
        dh3 = f.mul(x=dgate, y=gelu, name="dh3")
        return dh1, dh3

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
        x4 = self.reshape(x, [1, n_heads, hd, seq], f"{tag}_4d")  # (1, n, hd, S)
        return self.f.transpose(x=x4, perm=[0, 1, 3, 2], name=f"{tag}_h")  # (1, n, S, hd)

    def merge_heads(self, x: Var, n_heads: int, tag: str) -> Var:
        """[1, n, S, hd] -> [1, n*hd, 1, S]."""
        hd, seq = self.cfg.head_dim, self.cfg.seq_len
        t = self.f.transpose(x=x, perm=[0, 1, 3, 2], name=f"{tag}_t")  # (1, n, hd, S)
        return self.reshape(t, [1, n_heads * hd, 1, seq], f"{tag}_m")  # (1, n*hd, 1, S)

    def rope(self, x: Var, channels: int, tag: str, inverse: bool = False) -> Var:
        """Rotate channel pairs (2i, 2i+1) by the position angle; ``inverse`` rotates back (the transpose).

        ``rope_form`` "slice" or "matmul" (the training routes): on the heads view, ``rope_heads``, and
        back to [1, C, 1, S]. "conv" (the legacy kernels), as follows.

        [1, C, 1, S] -> x * cos + (P x) * sin (inverse: x * cos - (P x) * sin), where P is the constant
        pair swap (a, b) -> (-b, a) applied as a 1x1 conv and cos / sin are full [1, C, 1, S] tables
        (each pair's angle on both of its channels), llama2.c's rotation of pairs (2i, 2i+1).

        Why a conv for the swap: it keeps the [1, C, 1, S] layout, so the rotation needs no reshape to
        a trailing pair axis, no slices and no concat; the 1x1 conv is the op every hardware-run kernel
        is made of (maderix/ANE training/stories_mil.h), and with a 0 / +-1 weight and fp32
        accumulation it is exact. maderix/ANE training/training_dynamic/mil_dynamic.h instead swaps on
        a [1, H, S*hd/2, 2] view of the [1, H, S, hd] heads (slice, mul by -1, concat on the last
        axis), which would tie RoPE to the head view. The cost is a (C, C) fp16 weight (1.2 MB at
        C = 768) and C*C*S multiply-adds, as much as one projection; the swap weight and the tables are
        shared by every rotation of C channels in a kernel.
        """
        if channels != x.type.shape[1]:  # type: ignore[attr-defined]
            raise LayoutError(f"[{self.name}] rope '{tag}': {x.type} does not have {channels} channels")
        if self.rotates_heads:
            n = channels // self.cfg.head_dim
            rotated = self.rope_heads(self.heads(x, n, tag), tag, inverse)  # (1, n, S, hd)
            return self.merge_heads(rotated, n, tag)  # (1, C, 1, S)
        self._check_rope_form(tag)
        swap, c, s = self._rope_consts(channels)
        xc = self.f.mul(x=x, y=c, name=f"{tag}_xc")  # (1, C, 1, S)
        px = self.conv(x, swap, f"{tag}_swap")  # (1, C, 1, S): (-b, a) per pair
        ps = self.f.mul(x=px, y=s, name=f"{tag}_ps")  # (1, C, 1, S)
        if inverse:
            return self.f.sub(x=xc, y=ps, name=tag)  # (1, C, 1, S)
        return self.f.add(x=xc, y=ps, name=tag)  # (1, C, 1, S)

    @property
    def rotates_heads(self) -> bool:
        """Whether RoPE is written on the heads view [1, n, S, hd] ("slice", "matmul"), where the attention
        reads it, rather than on [1, C, 1, S] ("conv")."""
        return self.rope_form in ("slice", "matmul")

    def rope_heads(self, xh: Var, tag: str, inverse: bool = False) -> Var:
        """RoPE of the heads view [1, n, S, hd] written as hardware-run code writes it: x cos + rot(x) sin
        (``inverse``: x cos - rot(x) sin, the transpose), rot(x) taking each pair (a, b) to (-b, a).

        ``rope_form`` "matmul": rot(x) = x @ P, a matmul of the heads by the constant hd x hd permutation
        P [1, 1, hd, hd] (``rotate_half_matrix``, broadcast over the heads), as ncdrone/rustane
        crates/engine/src/kernels/sdpa_fwd.rs writes it since pull request #9, where the M3 Ultra under
        macOS 26.3.1 refused the slice form and this one compiled and trained (the engine layer's
        construct 'rope.permutation-matmul'). No reshape, slice or concat: the heads view stays as the
        attention reads it. Exact: each output is one input times +-1, the other products are zeros.

        ``rope_form`` "slice": rot is a reshape of the heads to pairs on the last axis (``pair_view``), two
        one-wide slices of that axis (a and b), a mul of b by -1 and a concat of (-b, a) on the last axis
        (interleave false), reshaped back: maderix/ANE training/training_dynamic/mil_dynamic.h
        gen_sdpa_fwd_dynamic (from c3c5094 on: q_p / q_e / q_o / nq / qrp / q_rot, concat axis 3; M4) and
        ncdrone/rustane crates/engine/src/kernels/sdpa_fwd.rs before pull request #9 (M4 Max, M5 Max),
        which ran on hardware (the M3 Ultra under macOS 26.3.1 refused it, rustane pull request #9: the
        engine layer's construct 'rope.slice-concat'). Exact: the slices, the negation and the concat move
        fp16 values without rounding them.

        Both forms rotate back (``inverse``) with the same construct in sdpa_bwd2. cos and sin are
        [1, 1, S, hd] tables broadcast over the heads (``rope_head_tables``), shared by every rotation of
        the kernel, as P is.
        """
        if not self.rotates_heads:
            raise LayoutError(
                f"[{self.name}] rope '{tag}': rope_heads writes the slice or matmul form, not "
                f"{self.rope_form}"
            )
        f = self.f
        rot = (
            self._rotate_half_matmul(xh, tag)
            if self.rope_form == "matmul"
            else self._rotate_half_slices(xh, tag)
        )
        c, s = self._rope_head_consts()
        xc = f.mul(x=xh, y=c, name=f"{tag}_xc")  # (1, n, S, hd)
        rs = f.mul(x=rot, y=s, name=f"{tag}_rs")  # (1, n, S, hd)
        if inverse:
            return f.sub(x=xc, y=rs, name=f"{tag}_h_rot")  # (1, n, S, hd)
        return f.add(x=xc, y=rs, name=f"{tag}_h_rot")  # (1, n, S, hd)

    def _rotate_half_matmul(self, xh: Var, tag: str) -> Var:
        """[1, n, S, hd] @ P [1, 1, hd, hd] -> [1, n, S, hd]: (-b, a) per pair (``rope_heads``)."""
        if self._rope_perm is None:
            hd = self.cfg.head_dim
            perm = rotate_half_matrix(hd).reshape(1, 1, hd, hd)
            self._rope_perm = self.weight("rope_perm", (1, 1, hd, hd), perm)
        return self.f.matmul(x=xh, y=self._rope_perm, transpose_x=False, transpose_y=False, name=f"{tag}_rot")

    def _rotate_half_slices(self, xh: Var, tag: str) -> Var:
        """[1, n, S, hd] -> [1, n, S, hd]: (-b, a) per pair by reshape, slices, negate and concat
        (``rope_heads``)."""
        shape = list(xh.type.shape)  # type: ignore[attr-defined]
        n, seq, hd = shape[1], shape[2], shape[3]
        f = self.f
        pairs = self.reshape(xh, pair_view(n, seq, hd), f"{tag}_pairs")  # (1, n, S*hd/2, 2)
        half = [*pairs.type.shape[:3], 1]  # type: ignore[attr-defined]
        a = f.slice_by_size(x=pairs, begin=[0, 0, 0, 0], size=half, name=f"{tag}_a")  # (1, n, S*hd/2, 1)
        b = f.slice_by_size(x=pairs, begin=[0, 0, 0, 1], size=half, name=f"{tag}_b")  # (1, n, S*hd/2, 1)
        nb = f.mul(x=b, y=-1.0, name=f"{tag}_nb")  # (1, n, S*hd/2, 1)
        swapped = f.concat(values=(nb, a), axis=3, interleave=False, name=f"{tag}_swap")  # (1, n, S*hd/2, 2)
        return self.reshape(swapped, shape, f"{tag}_rot")  # (1, n, S, hd): (-b, a) per pair

    def _rope_head_consts(self) -> tuple[Var, Var]:
        """The heads-view RoPE's cos / sin tables [1, 1, S, hd], made once per kernel."""
        if self._rope_heads is None:
            cos, sin = rope_head_tables(self.cfg, self.kind)  # (1, 1, S, hd) each
            shape = (1, 1, self.cfg.seq_len, self.cfg.head_dim)
            self._rope_heads = (
                self.weight("rope_cos_heads", shape, cos),
                self.weight("rope_sin_heads", shape, sin),
            )
        return self._rope_heads

    def _check_rope_form(self, tag: str) -> None:
        if self.rope_form == "host":
            raise LayoutError(f"[{self.name}] rope '{tag}': this route rotates on the host, not in a kernel")

    def _rope_consts(self, channels: int) -> tuple[Var, Var, Var]:
        """The pair swap [C, C, 1, 1] and the cos / sin tables [1, C, 1, S] for ``channels``, made once."""
        if channels not in self._rope:
            seq = self.cfg.seq_len
            cos, sin = rope_full_tables(self.cfg, channels, self.kind)  # (1, C, 1, S) each
            swap = pair_swap_matrix(channels).reshape(channels, channels, 1, 1)
            self._rope[channels] = (
                self.weight(f"rope_swap_{channels}", (channels, channels, 1, 1), swap),
                self.weight(f"rope_cos_{channels}", (1, channels, 1, seq), cos),
                self.weight(f"rope_sin_{channels}", (1, channels, 1, seq), sin),
            )
        return self._rope[channels]

    def group_queries(self, q: Var, tag: str) -> Var:
        """[1, H, S, X] -> [1, KVH, G*S, X]: the query heads sharing a kv head, stacked along rows
        (``q`` itself without grouping: G = 1)."""
        cfg = self.cfg
        last = q.type.shape[3]  # type: ignore[attr-defined]
        return self.reshape(q, [1, cfg.n_kv_heads, cfg.kv_group * cfg.seq_len, last], tag)

    def ungroup(self, x: Var, tag: str) -> Var:
        """[1, KVH, G*S, X] -> [1, H, S, X] (``x`` itself without grouping)."""
        cfg = self.cfg
        last = x.type.shape[3]  # type: ignore[attr-defined]
        return self.reshape(x, [1, cfg.n_heads, cfg.seq_len, last], tag)

    def attention_probs(self, qh: Var, kh: Var, tag: str) -> Var:
        """softmax(Q K^T * scale + mask) over keys: scale ``cfg.scores_scale`` (1 / sqrt(hd) unless the model
        names its own), the mask causal or banded (``mask``).

        [1, H, S, hd] and [1, KVH, S, hd] -> [1, H, S, S].
        """
        cfg = self.cfg
        qg = self.group_queries(qh, f"{tag}_qg")  # (1, KVH, G*S, hd)
        scores = self.f.matmul(
            x=qg, y=kh, transpose_x=False, transpose_y=True, name=f"{tag}_qk"
        )  # (1,KVH,G*S,S)
        scores = self.ungroup(scores, f"{tag}_scores")  # (1, H, S, S)
        scaled = self.f.mul(x=scores, y=cfg.scores_scale, name=f"{tag}_scaled")
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
        return self.reshape(x, [1, cfg.n_heads * cfg.seq_len, 1, cfg.seq_len], tag)

    def score_heads(self, x: Var, tag: str) -> Var:
        """[1, H*S, 1, S] -> [1, H, S, S]."""
        cfg = self.cfg
        return self.reshape(x, [1, cfg.n_heads, cfg.seq_len, cfg.seq_len], tag)

    # -- output ------------------------------------------------------------------------------------

    def finish(self, outputs: Layout, parts: Mapping[str, Var]) -> KernelSpec:
        """The named results, in layout order, as the function's output ``out``.

        Several results are concatenated along channels by a ``concat`` named ``out``. A single result
        is itself the output: its op is named ``out`` (renamed unless it was computed so), as
        maderix/ANE training/stories_mil.h names its
        last compute op (a trailing ``identity`` has no precedent: the compiler refuses identity alone).
        A single result that is no computed value (the input itself, a const) gets a ``mul`` by 1.
        """
        values = tuple(parts[n] for n in outputs.names)
        for (n, c), v in zip(outputs.parts, values):
            if v.type.shape != (1, c, 1, outputs.spatial):  # type: ignore[attr-defined]
                raise LayoutError(
                    f"[{self.name}] output part '{n}' is {v.type}, layout says [1, {c}, 1, {outputs.spatial}]"
                )
        if len(values) > 1:
            out = self.f.concat(values=values, axis=1, interleave=False, name=OUTPUT)
        elif values[0].op is None or values[0].op.op_type == "const":
            out = self.f.mul(x=values[0], y=1.0, name=OUTPUT)
        elif values[0].name == OUTPUT:  # computed under that name already
            out = values[0]
        else:
            out = self._rename(values[0], OUTPUT)
        self.f.output(out)
        return KernelSpec(self.name, self.builder.build(), self.inputs, outputs, self.pack, self.shared_files)

    def _rename(self, var: Var, name: str) -> Var:
        """Give the op computing ``var`` (and ``var``) the name ``name``, which must still be free."""
        fn = self.f.fn
        taken = {v.name for v in fn.inputs} | {v.name for op in fn.block.ops for v in op.outputs}
        if name in taken:
            raise LayoutError(f"[{self.name}] cannot name the output '{name}': the name is taken")
        assert var.op is not None
        var.name = name
        var.op.attributes["name"] = string_literal(name)
        return var
