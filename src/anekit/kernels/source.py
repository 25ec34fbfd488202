"""Where a kernel's weights come from: baked into its weight file, or packed into its input's columns.

A layer kernel is written once (``forward.sdpa_forward``, ``forward.ffn_forward``) against a
``WeightSource``, which turns "the scale rms_att", "the product Wq @ xn" into MIL:

- ``Baked``: every weight is an fp16 BLOBFILE const of the kernel's weight file and a product is a 1x1
  conv (``KernelBuilder.conv``); the program must be compiled again when the weights change;
- ``Packed``: every weight is a column segment of the kernel's one input (``composable.SpatialLayout``),
  sliced out at run time, and a product is a matmul of the activations' token rows with the segment
  (``composable.dynamic_linear``); the program is compiled once.

The two emit their ops in the same order as the kernel asks for them, so a kernel written once gives
the programs the two hand-written twins gave, byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.composable import (
    DynamicKernelSpec,
    SpatialLayout,
    dynamic_linear,
    dynamic_slice,
    finish_dynamic,
    token_rows,
)
from anekit.kernels.config import ModelConfig
from anekit.kernels.spec import KernelSpec, Layout, LayoutError
from anekit.mil import Var


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
        return self.kb.conv(x, self.kb.matrix(key, key, out, channels), tag)  # (1, out, 1, S)

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

    def finish(self, outputs: Layout, taps: Mapping[str, Var]) -> DynamicKernelSpec:
        return finish_dynamic(self.kb, self.activations, self.columns, outputs, taps, self.offsets)
