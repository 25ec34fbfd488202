"""Small composable kernels: projections with runtime, baked, fused and dynamically packed weights.

These are the building blocks of the training API's ``ane_mil_gen.h`` generators, not tied to a model
configuration: each takes channel counts and a sequence length.

- ``matmul_inputs``: y = W @ x with both W and x as runtime inputs (two input tensors);
- ``conv_baked``: y = W @ x as a 1x1 conv with W baked into the weight file;
- ``fused_qkv`` / ``fused_ffn_up``: several convs of one input, their weights in ONE multi-chunk file;
- ``dynamic_matmul``: "dynamic weight packing": ONE input [1, IC, 1, W] holding the activations in
  spatial columns 0..SEQ and the weight matrix transposed (IC x OC) in the next segment (every segment
  starts at a multiple of ``COLUMN_ALIGN`` = 64 columns, the gaps and the tail are zeros); the program
  slices, transposes the activations (never the weight) and multiplies, so one compiled kernel takes
  new weights on every run.

``Segment`` and ``SpatialLayout`` describe such column segments (``spec.Layout`` only describes channel
ranges) and ``DynamicKernelSpec`` is a KernelSpec whose input packs activations and weights together.
The float64 references (``matmul_reference``, ``fused_qkv_reference``, ``fused_ffn_up_reference``) are
the plain math, sharing nothing with the generators.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.config import MAX_CHANNELS, MAX_SPATIAL, ConfigError, ModelConfig
from anekit.kernels.spec import WEIGHT_FILE, KernelSpec, Layout, LayoutError, WeightPack
from anekit.mil import Builder, Var, tensor
from anekit.mil.ir import Program
from anekit.runtime.base import Backend, Kernel, Surface

# -- column segments ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A block of spatial columns of a [1, C, 1, W] surface, using its first ``rows`` channels.

    ``sources`` says which weights fill the block, stacked along rows, as ``(key, rows, transposed)``:
    the (rows, columns) block is weight ``key`` as given (llama2.c's (out, in) layout) or its transpose.
    A 1-d weight (an RMSNorm scale, a bias) fills every column of its rows (the same vector repeated);
    one shorter than its rows (a per-head (head_dim,) scale) is first tiled down them. No sources: the
    block holds activations.
    Channels from ``rows`` to C are zero padding.
    """

    name: str
    rows: int
    columns: int
    sources: tuple[tuple[str, int, bool], ...] = ()

    @property
    def is_weight(self) -> bool:
        return bool(self.sources)


# Width unit of every dynamic kernel's input: each segment starts at a multiple of it and the surface
# width is rounded up to one. 64 columns = 128 bytes per fp16 row. ncdrone/rustane README "ANE Gotchas":
# an IOSurface spatial width that is not a multiple of 16 corrupts data silently. maderix/ANE
# training/training_dynamic/mil_dynamic.h, with the sizes of models/stories110m.h and qwen3_06b.h, slices
# its inputs only at spatial offsets and widths that are multiples of 256, so aligned segment starts
# are the layout with hardware precedent; 64 rather than 256 keeps small models' padding small. Our
# choice, not measured on hardware.
COLUMN_ALIGN = 64


@dataclass(frozen=True)
class SpatialLayout:
    """Named column segments of one [1, channels, 1, W] surface, in order, each starting at a multiple of
    ``align`` columns; W is the end of the last segment rounded up to ``align``.

    The columns between segments and after the last one are zero padding (``padding()`` lists them,
    ``padded_columns`` counts them); ``pack`` writes zeros there and ``split`` returns only segments.
    """

    channels: int
    segments: tuple[Segment, ...]
    align: int = 1

    @staticmethod
    def of(channels: int, segments: Iterable[Segment], align: int = 1) -> SpatialLayout:
        segs = tuple(segments)
        names = [s.name for s in segs]
        if len(set(names)) != len(names):
            raise LayoutError(f"[layout] segment names repeat: {names}")
        if not isinstance(align, int) or align <= 0:
            raise LayoutError(f"[layout] align must be a positive integer, got {align!r}")
        for s in segs:
            if not 0 < s.rows <= channels or s.columns <= 0:
                raise LayoutError(
                    f"[layout] segment '{s.name}' is {s.rows} x {s.columns}; rows must be in 1..{channels}"
                )
            if s.sources and sum(r for _, r, _ in s.sources) != s.rows:
                raise LayoutError(f"[layout] segment '{s.name}': its sources do not fill its {s.rows} rows")
        return SpatialLayout(int(channels), segs, align)

    def _up(self, n: int) -> int:
        return -(-n // self.align) * self.align

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        """The first column of every segment (each a multiple of ``align``)."""
        out, pos = [], 0
        for s in self.segments:
            out.append(pos)
            pos = self._up(pos + s.columns)
        return tuple(out)

    @cached_property
    def columns(self) -> int:
        """Total width, padding included: the surface's spatial size."""
        if not self.segments:
            return 0
        return self._up(self.offsets[-1] + self.segments[-1].columns)

    @property
    def padded_columns(self) -> int:
        """How many of the ``columns`` are zero padding (between segments and at the end)."""
        return self.columns - sum(s.columns for s in self.segments)

    def padding(self) -> list[tuple[int, int]]:
        """``(column offset, columns)`` of every run of padding columns, in order."""
        runs, offsets = [], self.offsets
        for i, s in enumerate(self.segments):
            end = offsets[i] + s.columns
            nxt = offsets[i + 1] if i + 1 < len(offsets) else self.columns
            if nxt > end:
                runs.append((end, nxt - end))
        return runs

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.segments]

    def segment(self, name: str) -> Segment:
        for s in self.segments:
            if s.name == name:
                return s
        raise LayoutError(f"[layout] no segment '{name}' (segments: {', '.join(self.names)})")

    def range(self, name: str) -> tuple[int, int]:
        """``(column offset, columns)`` of a segment."""
        for s, offset in zip(self.segments, self.offsets):
            if s.name == name:
                return offset, s.columns
        raise LayoutError(f"[layout] no segment '{name}' (segments: {', '.join(self.names)})")

    def describe(self) -> list[str]:
        """One line per segment and per padding run: ``columns a..b  name  rows x columns``."""
        segs = zip(self.segments, self.offsets)
        items = [(o, s.columns, s.name, f"{s.rows} x {s.columns}") for s, o in segs]
        items += [(o, n, "(padding)", f"zeros x {n}") for o, n in self.padding()]
        return [f"columns {o}..{o + n}  {name}  {size}" for o, n, name, size in sorted(items)]

    def pack(self, blocks: Mapping[str, Any], dtype: Any = np.float32) -> np.ndarray:
        """The [1, C, 1, W] array holding every segment's (rows, columns) block; padding rows and padding
        columns are 0."""
        missing = [n for n in self.names if n not in blocks]
        extra = [n for n in blocks if n not in self.names]
        if missing or extra:
            raise LayoutError(f"[layout] segments are {self.names}; missing {missing}, unexpected {extra}")
        out = np.zeros((self.channels, self.columns), dtype=dtype)
        for s, offset in zip(self.segments, self.offsets):
            a = np.asarray(blocks[s.name])
            if a.shape != (s.rows, s.columns):
                raise LayoutError(
                    f"[layout] segment '{s.name}': expected a ({s.rows}, {s.columns}) block, "
                    f"got {list(a.shape)}"
                )
            out[: s.rows, offset : offset + s.columns] = a
        return out.reshape(1, self.channels, 1, self.columns)

    def split(self, array: np.ndarray) -> dict[str, np.ndarray]:
        """Each segment of a (C, W) or [1, C, 1, W] array, as (rows, columns) views (padding left out)."""
        a = np.asarray(array)
        if a.shape not in ((self.channels, self.columns), (1, self.channels, 1, self.columns)):
            raise LayoutError(
                f"[layout] split: expected ({self.channels}, {self.columns}) or "
                f"[1, {self.channels}, 1, {self.columns}], got {list(a.shape)}"
            )
        rows = a.reshape(self.channels, self.columns)
        segs = zip(self.segments, self.offsets)
        return {s.name: rows[: s.rows, o : o + s.columns] for s, o in segs}

    def weight_blocks(self, weights: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The block of every weight segment, built from named weights by the segments' sources."""
        parts: dict[str, list[np.ndarray]] = {}
        for s, _, _, block in self.weight_sources(weights):
            parts.setdefault(s.name, []).append(block)
        return {n: np.concatenate(p, axis=0) if len(p) > 1 else p[0] for n, p in parts.items()}

    def weight_sources(
        self, weights: Mapping[str, Any], keys: Iterable[str] | None = None
    ) -> Iterator[tuple[Segment, int, int, np.ndarray]]:
        """``(segment, its column offset, first row, block)`` of every source of every weight segment, in
        order: the (rows, columns) piece of the segment's block that the source fills (checked: LayoutError
        for a weight that is missing or of the wrong shape). ``keys``: only the sources of those weights."""
        only = None if keys is None else set(keys)
        for s, offset in zip(self.segments, self.offsets):
            row = 0
            for key, rows, transposed in s.sources:
                if only is not None and key not in only:
                    row += rows
                    continue
                if key not in weights:
                    raise LayoutError(f"[layout] weight '{key}' was not given (given: {', '.join(weights)})")
                a = np.asarray(weights[key])
                if a.ndim == 1 and a.shape[0] and rows % a.shape[0] == 0:  # a vector along the columns
                    col = a if a.shape[0] == rows else np.tile(a, rows // a.shape[0])  # (rows,)
                    yield s, offset, row, np.broadcast_to(col.reshape(rows, 1), (rows, s.columns))
                    row += rows
                    continue
                want = (s.columns, rows) if transposed else (rows, s.columns)
                if a.shape != want:
                    raise LayoutError(
                        f"[layout] weight '{key}' has shape {list(a.shape)}, expected {list(want)}"
                    )
                yield s, offset, row, a.T if transposed else a
                row += rows

    @property
    def activation_segments(self) -> list[Segment]:
        """The segments without sources: where the activations go."""
        return [s for s in self.segments if not s.is_weight]

    @property
    def activation(self) -> Segment:
        """The one segment without sources (LayoutError when there are several or none)."""
        acts = self.activation_segments
        if len(acts) != 1:
            raise LayoutError(f"[layout] expected one activation segment, found {[s.name for s in acts]}")
        return acts[0]


@dataclass
class DynamicKernelSpec(KernelSpec):
    """A kernel whose weights travel in its input, next to the activation columns: compiled once.

    ``inputs`` describes the whole input surface [1, C, 1, W] (one part ``x``), so ``run(k, x=packed)``
    works as for any KernelSpec; ``activations`` names the channel parts of the activations and
    ``columns`` the column segments. The activations fill either ONE activation segment, all parts
    stacked along channels, or one activation segment per part, named after it (parts side by side
    along columns, so that a surface whose channels are the widest part has no empty rows).
    ``pack(weights, **parts)`` builds the input from llama2.c-layout weights and the named activations,
    and ``run(k, weights, **parts)`` packs and runs. ``offsets`` maps a weight to a constant added to it
    when it is packed (an RMSNorm scale x * (offset + w), Gemma's 1 + w): the kernel reads the scale.
    """

    activations: Layout | None = None
    columns: SpatialLayout | None = None
    offsets: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.activations is None or self.columns is None:
            raise LayoutError(f"[{self.name}] a dynamic kernel needs its activation and column layouts")
        acts = self.columns.activation_segments
        if len(acts) == 1:
            want = [(acts[0].name, self.activations.channels, self.activations.spatial)]
        else:
            want = [(n, c, self.activations.spatial) for n, c in self.activations.parts]
        got = [(s.name, s.rows, s.columns) for s in acts]
        if [w[1:] for w in want] != [g[1:] for g in got] or (len(acts) > 1 and want != got):
            raise LayoutError(
                f"[{self.name}] activation segments {got} do not hold the activation parts "
                f"{list(self.activations.parts)} (spatial {self.activations.spatial})"
            )

    def weight_columns(self, weights: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The weight segments' blocks (what changes after an optimizer step)."""
        assert self.columns is not None
        return self.columns.weight_blocks(self.offset(weights))

    def offset(self, weights: Mapping[str, Any]) -> Mapping[str, Any]:
        """``weights`` with each of ``offsets`` added to its weight (``weights`` itself without offsets)."""
        if not self.offsets:
            return weights
        out = dict(weights)
        for key, off in self.offsets.items():
            if key in out:
                out[key] = np.asarray(out[key], np.float32) + np.float32(off)
        return out

    def pack(self, weights: Mapping[str, Any], **parts: Any) -> np.ndarray:
        """The [1, C, 1, W] input: the activation parts in their segment(s), the weights in theirs.

        Written straight into the zeroed float32 input: the same array as packing the activations
        (``activations.pack``), the weight blocks (``weight_columns``) and then the segments
        (``columns.pack``), without the intermediate arrays."""
        assert self.columns is not None
        out = np.zeros((self.columns.channels, self.columns.columns), dtype=np.float32)
        return self._fill(out, weights, parts)

    def _fill(self, out: np.ndarray, weights: Mapping[str, Any], parts: Mapping[str, Any]) -> np.ndarray:
        """``pack``'s work into ``out`` (C, W), zeros outside the segments: every call writes the same
        regions, so a buffer filled before holds exactly what a fresh one would."""
        assert self.activations is not None and self.columns is not None
        columns, spatial = self.columns, self.activations.spatial
        acts = columns.activation_segments
        if len(acts) == 1:  # the parts stacked along channels in the one activation segment
            start = columns.offsets[columns.segments.index(acts[0])]
            act = out[:, start : start + spatial]
            for _, row, c, rows in self.activations.part_rows(parts):
                act[row : row + c] = rows
        else:  # each part in the segment named after it
            starts = {s.name: o for s, o in zip(columns.segments, columns.offsets)}
            for name, _, c, rows in self.activations.part_rows(parts):
                out[:c, starts[name] : starts[name] + spatial] = rows
        for s, start, row, block in columns.weight_sources(self.offset(weights)):
            out[row : row + block.shape[0], start : start + s.columns] = block
        return out.reshape(1, columns.channels, 1, columns.columns)

    def weight_keys(self) -> set[str]:
        """The weights this kernel's input holds (its weight segments' sources)."""
        assert self.columns is not None
        return {key for s in self.columns.segments for key, _, _ in s.sources}

    def stage(
        self, surfaces: list[Surface], weights: Mapping[str, Any], keys: Iterable[str] | None = None
    ) -> int:
        """Write the weight segments (``keys``: only those weights' sources) into an input set of the
        kernel (``Kernel.input_set``), where they stay for ``run_staged``; the padding stays zero. Returns
        how many elements were written."""
        assert self.columns is not None
        (surface,) = surfaces
        written = 0
        for _, start, row, block in self.columns.weight_sources(self.offset(weights), keys):
            surface.write_block(block, row, start)
            written += block.size
        return written

    def run_staged(self, kernel: Kernel, surfaces: list[Surface], **parts: Any) -> dict[str, np.ndarray]:
        """Run on an input set whose weights ``stage`` wrote: only the activation parts are written (the
        same input, value for value, as ``run`` packs), then the output split into its taps."""
        assert self.activations is not None and self.columns is not None
        (surface,) = surfaces
        columns = self.columns
        acts = columns.activation_segments
        if len(acts) == 1:  # the parts stacked along channels in the one activation segment
            start = columns.offsets[columns.segments.index(acts[0])]
            for _, row, _, rows in self.activations.part_rows(parts):
                surface.write_block(rows, row, start)
        else:  # each part in the segment named after it
            starts = {s.name: o for s, o in zip(columns.segments, columns.offsets)}
            for name, _, _, rows in self.activations.part_rows(parts):
                surface.write_block(rows, 0, starts[name])
        return self.outputs.split(kernel.evaluate(surfaces)["out"])

    def run(
        self, kernel_or_backend: Kernel | Backend, weights: Mapping[str, Any] | None = None, **parts: Any
    ) -> dict[str, np.ndarray]:
        """With ``weights``: pack them and the named activation parts, then run; without: ``x=packed``."""
        if weights is None:
            return super().run(kernel_or_backend, **parts)
        # The input is packed into a buffer this spec keeps (the kernel copies it onto its surface before
        # the call returns): no fresh zeroed megabytes per call. A spec serves one thread at a time.
        assert self.columns is not None
        if getattr(self, "_input", None) is None:
            self._input = np.zeros((self.columns.channels, self.columns.columns), dtype=np.float32)
        return self.run_packed(kernel_or_backend, self._fill(self._input, weights, parts))


def check_spatial(name: str, columns: int, what: str) -> None:
    """ConfigError when a surface's width breaks the engine's 15-bit spatial limit."""
    if columns > MAX_SPATIAL:
        raise ConfigError(
            f"[{name}] {what} = {columns} columns exceeds the engine's 15-bit spatial limit {MAX_SPATIAL}"
        )


def check_channels(name: str, **counts: int) -> None:
    """ConfigError when a channel count is not positive or breaks the engine's 17-bit channel limit."""
    for what, n in counts.items():
        if not isinstance(n, int) or n <= 0:
            raise ConfigError(f"[{name}] {what} must be a positive integer, got {n!r}")
        if n > MAX_CHANNELS:
            raise ConfigError(
                f"[{name}] {what} = {n} exceeds the engine's 17-bit channel limit {MAX_CHANNELS}"
            )


def dynamic_builder(
    name: str,
    cfg: ModelConfig,
    columns: SpatialLayout,
    kind: str = "full",
    *,
    norm: str = "engine",
    rope: str = "conv",
) -> KernelBuilder:
    """A KernelBuilder whose input ``x`` is the whole packed surface [1, C, 1, W]; checks the width first.
    ``kind``, ``norm``, ``rope``: the kernel's layer type and route choices (``KernelBuilder``)."""
    act = sum(s.columns for s in columns.activation_segments)
    weights = columns.columns - act - columns.padded_columns
    check_spatial(
        name,
        columns.columns,
        f"activation columns {act} + packed weight columns {weights} + padding {columns.padded_columns}",
    )
    inputs = Layout.of([("x", columns.channels)], columns.columns)
    return KernelBuilder(name, cfg, inputs, None, kind, norm=norm, rope=rope)


def finish_dynamic(
    kb: KernelBuilder,
    activations: Layout,
    columns: SpatialLayout,
    outputs: Layout,
    parts: Mapping[str, Var],
    offsets: Mapping[str, float] | None = None,
) -> DynamicKernelSpec:
    """``KernelBuilder.finish`` for a dynamic kernel: the spec also carries its column layout.

    Several outputs are concatenated along channels by ``KernelBuilder.finish``. A single output is
    returned as is, never through an ``identity`` (which the compiler refuses as a kernel's only
    producer of an output): a value named ``out`` already, or one whose op ``KernelBuilder.finish``
    renames ``out``.
    """
    if len(outputs.parts) == 1 and parts[outputs.names[0]].name == "out":
        (part, channels), v = outputs.parts[0], parts[outputs.names[0]]
        if v.type.shape != (1, channels, 1, outputs.spatial):  # type: ignore[attr-defined]
            raise LayoutError(
                f"[{kb.name}] the single output '{part}' must be [1, {channels}, 1, {outputs.spatial}]; "
                f"got {v.name}: {v.type}"
            )
        kb.f.output(v)
        spec = KernelSpec(kb.name, kb.builder.build(), kb.inputs, outputs, kb.pack, kb.shared_files)
    else:
        spec = kb.finish(outputs, parts)
    return DynamicKernelSpec(
        spec.name,
        spec.program,
        spec.inputs,
        spec.outputs,
        spec.weights,
        spec.shared_files,
        activations=activations,
        columns=columns,
        offsets=dict(offsets or {}),
    )


def dynamic_slice(
    kb: KernelBuilder,
    columns: SpatialLayout,
    name: str,
    channels: tuple[int, int] | None = None,
    tag: str | None = None,
) -> Var:
    """Segment ``name`` of the builder's input, [1, rows, 1, width]; ``channels`` = (offset, count)
    takes only those channels of it (a channel part of the activations). The op is named ``in_<tag>``."""
    offset, width = columns.range(name)
    first, count = (0, columns.segment(name).rows) if channels is None else channels
    return kb.f.slice_by_size(
        x=kb.x, begin=[0, first, 0, offset], size=[1, count, 1, width], name=f"in_{tag or name}"
    )  # (1, count, 1, width)


# A dynamic product y = M @ a runs as maderix/ANE training/training_dynamic/mil_dynamic.h gen_dyn_matmul
# does on hardware: the ACTIVATIONS are transposed to token rows [1, 1, S, K] and multiplied by the
# weight block M^T [1, 1, K, N] with transpose_x = transpose_y = false, and the [1, 1, S, N] result is
# transposed back. A weight is never the transposed operand of a matmul.

_SWAP_LAST = [0, 1, 3, 2]


def token_rows(kb: KernelBuilder, a: Var, tag: str) -> Var:
    """Activations [1, K, 1, S] as a matmul's left operand [1, 1, S, K]: one row per token."""
    k, seq = a.type.shape[1], a.type.shape[3]  # type: ignore[attr-defined]
    a4 = kb.f.reshape(x=a, shape=[1, 1, k, seq], name=f"{tag}_a")  # (1, 1, K, S)
    return kb.f.transpose(x=a4, perm=_SWAP_LAST, name=f"{tag}_at")  # (1, 1, S, K)


def rows_product(kb: KernelBuilder, at: Var, w: Var, tag: str, transposed: bool = True) -> Var:
    """Token rows at [1, 1, S, K] times M^T: (M @ a)^T as [1, 1, S, N].

    ``transposed``: the weight block w holds M^T, [1, K, 1, N] (K rows, one column per output channel),
    and is used as it is. Otherwise w holds M itself, [1, N, 1, K], and a transpose op turns it into
    M^T first, as maderix's ffnFused kernel does with W2 (mil_dynamic.h). Either way the matmul has
    transpose_x = transpose_y = false.
    """
    rows, cols = w.type.shape[1], w.type.shape[3]  # type: ignore[attr-defined]
    w4 = kb.f.reshape(x=w, shape=[1, 1, rows, cols], name=f"{tag}_w")  # (1, 1, K, N) or (1, 1, N, K)
    if not transposed:
        w4 = kb.f.transpose(x=w4, perm=_SWAP_LAST, name=f"{tag}_wt")  # (1, 1, K, N)
    return kb.f.matmul(x=at, y=w4, transpose_x=False, transpose_y=False, name=f"{tag}_mm")  # (1, 1, S, N)


def rows_to_channels(kb: KernelBuilder, y: Var, tag: str, name: str | None = None) -> Var:
    """[1, 1, S, N] token rows back to channels [1, N, 1, S]; the reshape is named ``name`` or ``tag``."""
    seq, n = y.type.shape[2], y.type.shape[3]  # type: ignore[attr-defined]
    yt = kb.f.transpose(x=y, perm=_SWAP_LAST, name=f"{tag}_t")  # (1, 1, N, S)
    return kb.f.reshape(x=yt, shape=[1, n, 1, seq], name=name or tag)  # (1, N, 1, S)


def dynamic_linear(
    kb: KernelBuilder,
    a: Var | None,
    w: Var,
    tag: str,
    transposed: bool = True,
    *,
    at: Var | None = None,
    name: str | None = None,
) -> Var:
    """y = M @ a for activations a [1, K, 1, S] and a weight block w from the input's columns.

    ``transposed``: w holds M^T, [1, K, 1, N] (the usual packing); otherwise M, [1, N, 1, K]
    (``rows_product``). ``at``: the token rows of a from ``token_rows``, when several products share
    them (pass a = None). Result [1, N, 1, S], its last op named ``name`` (default ``tag``).
    """
    if at is None:
        assert a is not None, "dynamic_linear needs a or at"
        at = token_rows(kb, a, tag)  # (1, 1, S, K)
    y = rows_product(kb, at, w, tag, transposed)  # (1, 1, S, N)
    return rows_to_channels(kb, y, tag, name)  # (1, N, 1, S)


# -- runtime-input matmul ----------------------------------------------------------------------------


@dataclass
class ProgramKernel:
    """A program with several runtime inputs, which a single-input KernelSpec cannot describe.

    ``run(kernel_or_backend, **arrays)`` reshapes each array (given as a matrix) to its input tensor,
    runs, and returns each output as a (channels, spatial) float32 matrix.
    """

    name: str
    program: Program
    weight_files: dict[str, bytes] = field(default_factory=dict)

    def compile(self, backend: Backend) -> Kernel:
        return backend.compile(self.program, self.weight_files)

    def run(self, kernel_or_backend: Kernel | Backend, **arrays: Any) -> dict[str, np.ndarray]:
        kernel = (
            kernel_or_backend if isinstance(kernel_or_backend, Kernel) else self.compile(kernel_or_backend)
        )
        feed = {}
        for surface, name in zip(kernel.inputs, kernel.input_names):
            if name not in arrays:
                raise LayoutError(f"[{self.name}] inputs are {kernel.input_names}; '{name}' is missing")
            a = np.asarray(arrays[name])
            if a.size != int(np.prod(surface.shape)):
                raise LayoutError(
                    f"[{self.name}] input '{name}' has shape {list(a.shape)}, expected {list(surface.shape)}"
                )
            feed[name] = a.reshape(surface.shape)
        out = kernel(**feed)
        return {n: v.reshape(v.shape[1], -1) for n, v in out.items()}


def matmul_inputs(in_ch: int, out_ch: int, seq: int, fp32_io: bool = True) -> ProgramKernel:
    """y = W @ x with both W and x runtime inputs: x [1, in_ch, seq], w [1, out_ch, in_ch] -> out.

    Two input tensors of different shapes, so the result is a ``ProgramKernel`` rather than a KernelSpec.
    ``fp32_io`` (default) mirrors the training API's ``mil_gen_matmul``: fp32 inputs and output, cast to
    fp16 on entry and back on exit, so the host writes fp32 directly. Numerically this is the same as
    fp16 I/O (``fp32_io=False``): the entry cast is the same round-to-nearest-even the host does when it
    writes an fp16 surface, and the exit cast is exact. The float64 reference does not round.
    """
    check_channels("matmul_inputs", in_ch=in_ch, out_ch=out_ch)
    check_spatial("matmul_inputs", seq, "seq")
    io = "fp32" if fp32_io else "fp16"
    b = Builder()
    f = b.function("main", opset="ios18")
    x = f.input("x", tensor(io, [1, in_ch, seq]))  # (1, IC, S)
    w = f.input("w", tensor(io, [1, out_ch, in_ch]))  # (1, OC, IC)
    if fp32_io:
        x = f.cast(x=x, dtype="fp16", name="x16")
        w = f.cast(x=w, dtype="fp16", name="w16")
    y = f.matmul(x=w, y=x, transpose_x=False, transpose_y=False, name="mm" if fp32_io else "out")  # (1,OC,S)
    if fp32_io:
        y = f.cast(x=y, dtype="fp32", name="out")
    f.output(y)
    return ProgramKernel("matmul_inputs", b.build())


def matmul_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 y (out, S) = w (out, in) @ x (in, S)."""
    return np.asarray(w, dtype=np.float64) @ np.asarray(x, dtype=np.float64)


# -- baked and fused projections ---------------------------------------------------------------------


def _placeholder(name: str, seq: int) -> ModelConfig:
    """The KernelBuilder's config for a kernel not tied to a model: it only carries seq_len (validated)."""
    return ModelConfig(1, 1, 1, 1, 1, 1, seq, rope=False, name=name)


def _values(**arrays: np.ndarray | None) -> dict[str, np.ndarray] | None:
    """The given weights, or None when none is given (shape-only generation); some but not all: error."""
    given = {k: v for k, v in arrays.items() if v is not None}
    if not given:
        return None
    if len(given) != len(arrays):
        missing = [k for k, v in arrays.items() if v is None]
        raise LayoutError(f"[weights] give all of {list(arrays)} or none; missing {missing}")
    return given


def conv_baked(in_ch: int, out_ch: int, seq: int, w: np.ndarray | None = None) -> KernelSpec:
    """y = W @ x as one 1x1 conv with W (out_ch, in_ch) baked in the weight file.

    Input x: [1, in_ch, 1, seq]. Output: y [1, out_ch, 1, seq].
    """
    check_channels("conv_baked", in_ch=in_ch, out_ch=out_ch)
    kb = KernelBuilder(
        "conv_baked", _placeholder("conv_baked", seq), Layout.of([("x", in_ch)], seq), _values(w=w)
    )
    y = kb.conv(kb.part("x"), kb.matrix("w", "w", out_ch, in_ch), "y")  # (1, out_ch, 1, S)
    return kb.finish(Layout.of([("y", out_ch)], seq), {"y": y})


def fused_qkv(
    dim: int,
    seq: int,
    wq: np.ndarray | None = None,
    wk: np.ndarray | None = None,
    wv: np.ndarray | None = None,
    *,
    kv_dim: int | None = None,
) -> KernelSpec:
    """Q, K and V projections of one input: three 1x1 convs whose weights are the three chunks of ONE
    weight file (metadata at 64, 64 + cs_q, 64 + cs_q + cs_k, as ``blob.multi_chunk_blob`` writes them).

    wq (dim, dim), wk / wv (kv_dim, dim) (kv_dim defaults to dim, the training API's case).
    Input x: [1, dim, 1, seq]. Output taps: q (dim), k (kv_dim), v (kv_dim).
    """
    kv = dim if kv_dim is None else kv_dim
    check_channels("fused_qkv", dim=dim, kv_dim=kv, taps=dim + 2 * kv)
    values = _values(wq=wq, wk=wk, wv=wv)
    kb = KernelBuilder("fused_qkv", _placeholder("fused_qkv", seq), Layout.of([("x", dim)], seq), values)
    kb.pack = WeightPack(single_file=WEIGHT_FILE)  # the training API's multi-chunk file
    x = kb.part("x")  # (1, dim, 1, S)
    q = kb.conv(x, kb.matrix("wq", "wq", dim, dim), "q")  # (1, dim, 1, S)
    k = kb.conv(x, kb.matrix("wk", "wk", kv, dim), "k")  # (1, kv_dim, 1, S)
    v = kb.conv(x, kb.matrix("wv", "wv", kv, dim), "v")  # (1, kv_dim, 1, S)
    return kb.finish(Layout.of([("q", dim), ("k", kv), ("v", kv)], seq), {"q": q, "k": k, "v": v})


def fused_qkv_reference(
    x: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray
) -> dict[str, np.ndarray]:
    """float64 q, k, v of x (dim, S)."""
    return {"q": matmul_reference(x, wq), "k": matmul_reference(x, wk), "v": matmul_reference(x, wv)}


def fused_ffn_up(
    dim: int, hidden: int, seq: int, w1: np.ndarray | None = None, w3: np.ndarray | None = None
) -> KernelSpec:
    """The FFN up-projections: h1 = W1 x and h3 = W3 x, W1 and W3 (hidden, dim) the two chunks of ONE
    weight file. Input x: [1, dim, 1, seq]. Output taps: h1 (hidden), h3 (hidden).
    """
    check_channels("fused_ffn_up", dim=dim, hidden=hidden, taps=2 * hidden)
    values = _values(w1=w1, w3=w3)
    kb = KernelBuilder(
        "fused_ffn_up", _placeholder("fused_ffn_up", seq), Layout.of([("x", dim)], seq), values
    )
    kb.pack = WeightPack(single_file=WEIGHT_FILE)  # the training API's multi-chunk file
    x = kb.part("x")  # (1, dim, 1, S)
    h1 = kb.conv(x, kb.matrix("w1", "w1", hidden, dim), "h1")  # (1, hidden, 1, S)
    h3 = kb.conv(x, kb.matrix("w3", "w3", hidden, dim), "h3")  # (1, hidden, 1, S)
    return kb.finish(Layout.of([("h1", hidden), ("h3", hidden)], seq), {"h1": h1, "h3": h3})


def fused_ffn_up_reference(x: np.ndarray, w1: np.ndarray, w3: np.ndarray) -> dict[str, np.ndarray]:
    """float64 h1, h3 of x (dim, S)."""
    return {"h1": matmul_reference(x, w1), "h3": matmul_reference(x, w3)}


# -- dynamic weight packing --------------------------------------------------------------------------


def dynamic_matmul_layout(in_ch: int, out_ch: int, seq: int) -> SpatialLayout:
    """Columns of the dynamic matmul's input: act = x (in_ch, seq), then w_t = W^T (in_ch, out_ch), each
    starting at a multiple of ``COLUMN_ALIGN`` columns, zero padding up to the next multiple after each."""
    return SpatialLayout.of(
        in_ch,
        [Segment("act", in_ch, seq), Segment("w_t", in_ch, out_ch, (("w", in_ch, True),))],
        align=COLUMN_ALIGN,
    )


def dynamic_matmul(in_ch: int, out_ch: int, seq: int) -> DynamicKernelSpec:
    """y = W @ x with W (out_ch, in_ch) packed in the input after the activations; compiled once.

    Input [1, in_ch, 1, W], W = the two segments each rounded up to ``COLUMN_ALIGN`` columns: columns
    0..seq hold x (in_ch, seq), the segment ``w_t`` holds W^T (in_ch, out_ch), the rest is zeros. The
    program slices both and computes y^T = x^T @ W^T with x^T the transposed activations and W^T the
    weight block as packed (maderix's gen_dyn_matmul; no transposed matmul operand), then transposes
    back. Output: y [1, out_ch, 1, seq]. Build the input with ``spec.pack({"w": W}, x=x)`` or
    ``pack_matmul_input(x, W)``.
    """
    check_channels("dynamic_matmul", in_ch=in_ch, out_ch=out_ch)
    columns = dynamic_matmul_layout(in_ch, out_ch, seq)
    kb = dynamic_builder("dynamic_matmul", _placeholder("dynamic_matmul", seq), columns)
    x = dynamic_slice(kb, columns, "act")  # (1, IC, 1, S)
    wt = dynamic_slice(kb, columns, "w_t")  # (1, IC, 1, OC)
    y = dynamic_linear(kb, x, wt, "y", name="out")  # (1, OC, 1, S)
    activations = Layout.of([("x", in_ch)], seq)
    return finish_dynamic(kb, activations, columns, Layout.of([("y", out_ch)], seq), {"y": y})


def pack_matmul_input(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The dynamic matmul's input [1, IC, 1, W] for activations x (IC, S) and W (OC, IC) (W: S and OC
    each rounded up to ``COLUMN_ALIGN``)."""
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 2 or w.ndim != 2:
        raise LayoutError(
            f"[dynamic_matmul] x and w must be matrices, got {list(x.shape)} and {list(w.shape)}"
        )
    layout = dynamic_matmul_layout(x.shape[0], w.shape[0], x.shape[1])
    return layout.pack({"act": x, **layout.weight_blocks({"w": w})})
