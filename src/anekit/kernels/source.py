"""Where a kernel's weights come from: baked into its weight file, or packed into its input's columns.

A layer kernel is written once (``forward.sdpa_forward``, ``forward.ffn_forward``) against a
``WeightSource``, which turns "the scale rms_att", "the product Wq @ xn" into MIL:

- ``Baked``: every weight is an fp16 BLOBFILE const of the kernel's weight file and a product is a 1x1
  conv (``KernelBuilder.conv``); the program must be compiled again when the weights change;
- ``Packed``: every weight is a column segment of the kernel's one input (``composable.SpatialLayout``),
  sliced out at run time, and a product is a matmul of the activations' token rows with the segment
  (``composable.dynamic_linear``); the program is compiled once.

The backward kernels (``backward.ffn_backward``, ``attention_bwd.qkv_backward``) ask for the transposed
products the other way: ``linear_t``, the sum of W^T @ x over terms (one conv per term and adds, baked;
packed, one matmul of the stacked input where a segment stacks the matrices as the input stacks the
terms, else a matmul per term summed in the token-row layout).

The two emit their ops in the same order as the kernel asks for them, so a kernel written once gives
the programs the two hand-written twins gave, byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from anekit.kernels.blocks import MAX_CONV_INPUT_CHANNELS, KernelBuilder
from anekit.kernels.composable import (
    DynamicKernelSpec,
    SpatialLayout,
    dynamic_linear,
    dynamic_slice,
    finish_dynamic,
    rows_product,
    rows_to_channels,
    token_rows,
)
from anekit.kernels.config import ModelConfig
from anekit.kernels.spec import KernelSpec, Layout, LayoutError
from anekit.mil import Var

# One term of ``WeightSource.linear_t``: (the activations x or the name of an input part, the matrix W,
# the label naming the product W^T @ x).
Term = tuple[Var | str, str, str]

# label -> the name the packed FFN backward has always given the token-row product of a term (the names
# every recorded program hash holds); other labels are named ``<tag>_<label>`` there as when baked.
PACKED_NAMES = {"w1": "1", "w3": "3"}


class WeightSource(Protocol):
    """What a layer kernel asks of its weights; ``kb`` is the kernel being built."""

    kb: KernelBuilder

    def act(self, name: str) -> Var:
        """The activation part ``name`` of the input, [1, C, 1, S]."""
        ...

    def scale(self, key: str, channels: int) -> Var:
        """The RMSNorm scale ``key`` over ``channels`` channels (``cfg.norm_offset`` + w)."""
        ...

    def head_scale(self, key: str, n_heads: int) -> Var:
        """The per-head norm scale ``key`` (head_dim,) tiled over ``n_heads`` heads."""
        ...

    def bias(self, key: str, channels: int) -> Var:
        """The bias ``key`` (channels,), to add to a projection."""
        ...

    def shared_rows(self, x: Var) -> Var | None:
        """What several products of ``x`` share (packed: its token rows, made once), or None."""
        ...

    def linear(self, x: Var, key: str, tag: str, rows: Var | None = None) -> Var:
        """W @ x for the matrix ``key`` (llama2.c's (out, in)): [1, in, 1, S] -> [1, out, 1, S], its ops
        named after ``tag``; ``rows`` what ``shared_rows(x)`` gave when x feeds several products."""
        ...

    def linear_t(self, terms: Sequence[Term], tag: str, *, name: str | None = None) -> Var:
        """The sum over ``terms`` (x, key, label) of W^T @ x for the matrix ``key`` (llama2.c's (out, in)):
        [1, out, 1, S] each -> [1, in, 1, S], the input gradient through the products W @ x. ``x`` is a
        value or the name of an activation part; one term's product is named ``tag``, several terms'
        products ``<tag>_<label>`` and their sum ``tag``; ``name``, when given, names the op giving
        the result instead (``out``: the kernel's single output)."""
        ...

    def finish(self, outputs: Layout, taps: Mapping[str, Var]) -> KernelSpec:
        """The kernel: ``taps`` in ``outputs``' order as its output."""
        ...


def matrix_shape(cfg: ModelConfig, key: str) -> tuple[int, int]:
    """(out, in) of a layer's matrix ``key`` as llama2.c stores it."""
    d, q, kv, h = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim
    shapes = {
        "wq": (q, d),
        "wk": (kv, d),
        "wv": (kv, d),
        "wo": (d, q),
        "w1": (h, d),
        "w3": (h, d),
        "w2": (d, h),
    }
    if key not in shapes:
        raise LayoutError(f"[weights] no layer matrix '{key}' (known: {', '.join(shapes)})")
    return shapes[key]


def baked_product(kb: KernelBuilder, x: Var, name: str, key: str, out: int, channels: int, tag: str) -> Var:
    """W @ x as a 1x1 conv, W the matrix ``key`` (out, channels) baked as the const ``name``.

    A W reading more than ``MAX_CONV_INPUT_CHANNELS`` channels (a wide model's W2: Qwen3-0.6B's 3072,
    Gemma 3 1B's 6912) is split along its input channels into equal pieces of at most that many (each a
    multiple of 64 where it can be): one conv per piece over a channel slice of x, the pieces' products
    summed by adds (the partial sums ``<tag>_sum{j}``, the whole ``tag``). Every conv then reads as many
    channels as hardware-run kernels' convs read (``blocks.MAX_CONV_INPUT_CHANNELS``); a W within the
    limit is one conv, as it always was."""
    if channels <= MAX_CONV_INPUT_CHANNELS:
        return kb.conv(x, kb.matrix(name, key, out, channels), tag)  # (1, out, 1, S)
    a = kb.value(key)
    if a is not None and a.shape != (out, channels):
        raise LayoutError(f"[{kb.name}] weight '{key}' has shape {list(a.shape)}, expected {[out, channels]}")
    count = -(-channels // MAX_CONV_INPUT_CHANNELS)
    piece = -(-channels // count)
    piece = min(MAX_CONV_INPUT_CHANNELS, -(-piece // 64) * 64)
    seq = x.type.shape[3]  # type: ignore[attr-defined]
    starts = list(range(0, channels, piece))
    total: Var | None = None
    for j, lo in enumerate(starts):
        hi = min(channels, lo + piece)
        xs = kb.f.slice_by_size(x=x, begin=[0, lo, 0, 0], size=[1, hi - lo, 1, seq], name=f"{tag}_in{j}")
        w = None if a is None else np.ascontiguousarray(a[:, lo:hi])
        y = kb.conv(xs, kb.weight(f"{name}_p{j}", (out, hi - lo, 1, 1), w), f"{tag}_p{j}")  # (1, out, 1, S)
        last = j == len(starts) - 1
        total = y if total is None else kb.f.add(x=total, y=y, name=tag if last else f"{tag}_sum{j}")
    assert total is not None
    return total


class Baked:
    """Weights as BLOBFILE consts named after their keys, products as 1x1 convs."""

    def __init__(self, kb: KernelBuilder) -> None:
        self.kb = kb

    def act(self, name: str) -> Var:
        return self.kb.part(name)

    def scale(self, key: str, channels: int) -> Var:
        return self.kb.norm_scale(key, key, channels)  # (1, C, 1, 1)

    def head_scale(self, key: str, n_heads: int) -> Var:
        return self.kb.head_vector(key, key, n_heads)  # (1, n*hd, 1, 1)

    def bias(self, key: str, channels: int) -> Var:
        return self.kb.vector(key, key, channels)  # (1, C, 1, 1)

    def shared_rows(self, x: Var) -> Var | None:
        return None

    def linear(self, x: Var, key: str, tag: str, rows: Var | None = None) -> Var:
        out, channels = matrix_shape(self.kb.cfg, key)
        return baked_product(self.kb, x, key, key, out, channels, tag)  # (1, out, 1, S)

    def linear_t(self, terms: Sequence[Term], tag: str, *, name: str | None = None) -> Var:
        kb, products = self.kb, []
        for x, key, label in terms:  # every product first, then the adds
            a = self.act(x) if isinstance(x, str) else x  # (1, out, 1, S)
            out, channels = matrix_shape(kb.cfg, key)
            wt = kb.matrix(f"{key}t", key, channels, out, transpose=True)  # (in, out, 1, 1): W^T
            one = len(terms) == 1
            products.append(kb.conv(a, wt, (name or tag) if one else f"{tag}_{label}"))  # (1, in, 1, S)
        if not products:
            raise LayoutError(f"[{kb.name}] linear_t '{tag}' has no terms")
        total, labels = products[0], terms[0][2]
        for i, ((_, _, label), y) in enumerate(zip(terms[1:], products[1:]), 2):
            labels += label  # the partial sums named after the labels summed so far, the whole sum ``tag``
            total = kb.f.add(x=total, y=y, name=(name or tag) if i == len(terms) else f"{tag}_{labels}")
        return total

    def finish(self, outputs: Layout, taps: Mapping[str, Var]) -> KernelSpec:
        return self.kb.finish(outputs, taps)


class Packed:
    """Weights as column segments of the input (``columns``), products as matmuls of token rows.

        A weight ``key`` is found as the segment it fills: a scale or a bias as a full [1, C, 1, S] segment
        (the vector repeated per position, multiplied or added elementwise), a matrix W as its transpose
        (K rows x N columns, the usual packing) or as W itself (``transposed`` False: W2, whose transpose
        would need more rows than the surface has). Products of one input may share its token rows (tag
    ``xn``, ``shared_rows``).
    """

    def __init__(
        self,
        kb: KernelBuilder,
        columns: SpatialLayout,
        activations: Layout,
        offsets: Mapping[str, float] | None = None,
    ) -> None:
        self.kb, self.columns, self.activations = kb, columns, activations
        self.offsets = dict(offsets or {})
        self._acts: dict[str, Var] | None = None
        self._rows: dict[int, Var] = {}  # id of an input -> its token rows

    def act(self, name: str) -> Var:
        if self._acts is None:
            kb, columns, acts = self.kb, self.columns, self.columns.activation_segments
            if len(acts) > 1:  # one segment per part
                self._acts = {s.name: dynamic_slice(kb, columns, s.name) for s in acts}
            else:  # the parts stacked along channels in the one activation segment
                act, layout = acts[0].name, self.activations
                self._acts = {
                    n: dynamic_slice(kb, columns, act, layout.range(n), tag=n) for n in layout.names
                }
        return self._acts[name]

    def _segment(self, key: str) -> tuple[str, bool]:
        """(name, holds the transpose) of the segment that weight ``key`` fills alone."""
        for s in self.columns.segments:
            if len(s.sources) == 1 and s.sources[0][0] == key:
                return s.name, s.sources[0][2]
        raise LayoutError(f"[{self.kb.name}] no column segment holds weight '{key}' alone")

    def _vector(self, key: str) -> Var:
        return dynamic_slice(self.kb, self.columns, self._segment(key)[0])  # (1, C, 1, S)

    def scale(self, key: str, channels: int) -> Var:
        return self._vector(key)

    def head_scale(self, key: str, n_heads: int) -> Var:
        return self._vector(key)

    def bias(self, key: str, channels: int) -> Var:
        return self._vector(key)

    def shared_rows(self, x: Var) -> Var | None:
        if id(x) not in self._rows:
            self._rows[id(x)] = token_rows(self.kb, x, "xn")  # (1, 1, S, K)
        return self._rows[id(x)]

    def linear(self, x: Var, key: str, tag: str, rows: Var | None = None) -> Var:
        name, transposed = self._segment(key)
        w = dynamic_slice(self.kb, self.columns, name)  # (1, K, 1, N) or (1, N, 1, K)
        if rows is not None:
            return dynamic_linear(self.kb, None, w, tag, transposed, at=rows)  # (1, N, 1, S)
        return dynamic_linear(self.kb, x, w, tag, transposed)  # (1, N, 1, S)

    def linear_t(self, terms: Sequence[Term], tag: str, *, name: str | None = None) -> Var:
        """W^T @ x is M @ x for M = W^T, whose M^T is W as llama2.c stores it: a segment holding W
        (``transposed`` False) is used as it is, one holding W^T gets a transpose op (``rows_product``)."""
        kb, columns = self.kb, self.columns
        if not terms:
            raise LayoutError(f"[{kb.name}] linear_t '{tag}' has no terms")
        stacked = self._stacked(terms)
        if stacked is not None:  # the input stacks the terms as a segment stacks their matrices: one product
            stack = dynamic_slice(kb, columns, columns.activation.name)  # (1, K, 1, S): the whole stack
            w = dynamic_slice(kb, columns, stacked)  # (1, K, 1, N)
            return dynamic_linear(kb, stack, w, tag, name=name)  # (1, N, 1, S)
        if len(terms) == 1:
            a = self._input(terms[0][0])  # (1, K, 1, S)
            segment, transposed = self._segment(terms[0][1])
            w = dynamic_slice(kb, columns, segment)  # (1, K, 1, N) or (1, N, 1, K)
            return dynamic_linear(kb, a, w, tag, not transposed, name=name)  # (1, N, 1, S)
        products = []
        for x, key, label in terms:  # products in token rows, summed there, transposed back once
            a = self._input(x)  # (1, K, 1, S)
            at = token_rows(kb, a, a.name)  # (1, 1, S, K)
            segment, transposed = self._segment(key)
            w = dynamic_slice(kb, columns, segment)  # (1, K, 1, N) or (1, N, 1, K)
            product = f"{tag}{PACKED_NAMES[label]}" if label in PACKED_NAMES else f"{tag}_{label}"
            products.append(rows_product(kb, at, w, product, not transposed))  # (1, 1, S, N)
        total = products[0]
        for i, y in enumerate(products[1:], 2):  # the partial sums numbered, the whole sum ``<tag>_sum``
            total = kb.f.add(x=total, y=y, name=f"{tag}_sum" if i == len(products) else f"{tag}_sum{i}")
        return rows_to_channels(kb, total, tag, name)  # (1, N, 1, S)

    def _input(self, x: Var | str) -> Var:
        """A term's activations: ``x`` itself, or the input part it names."""
        return self.act(x) if isinstance(x, str) else x

    def _stacked(self, terms: Sequence[Term]) -> str | None:
        """The segment stacking exactly the terms' matrices (each as stored) when the terms are the
        activation parts, in order, stacked in the one activation segment; else None."""
        if len(self.columns.activation_segments) != 1 or len(terms) < 2:
            return None
        parts = list(self.activations.names)
        if [t[0] for t in terms] != parts:
            return None
        want = [(key, self.activations.range(part)[1], False) for part, (_, key, _) in zip(parts, terms)]
        for s in self.columns.segments:
            if [tuple(src) for src in s.sources] == want:
                return s.name
        return None

    def finish(self, outputs: Layout, taps: Mapping[str, Var]) -> DynamicKernelSpec:
        return finish_dynamic(self.kb, self.activations, self.columns, outputs, taps, self.offsets)
