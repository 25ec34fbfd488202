"""What a kernel generator returns: the program, its weight file, and named channel layouts.

Every tensor crossing the host boundary is [1, C, 1, S] fp16. Several results leave one kernel as a
channel concatenation ("taps") and several operands enter one the same way; a ``Layout`` says which
channel range is which, so host code slices by name, never by magic numbers::

    spec = sdpa_fwd(cfg, weights)
    out = spec.run(backend, x=x)          # {"o_out": (dim, S), "q": ..., ...}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from anekit.blob import build_blob_bytes
from anekit.errors import AnekitError
from anekit.mil.ir import Program
from anekit.mil.printer import print_program
from anekit.runtime.base import Backend, Kernel

WEIGHT_FOLDER = "@model_path/weights/"
BLOB_OFFSET = 64  # a file's first blob: its metadata record follows the 64-byte header
WEIGHT_FILE = "@model_path/weights/weights.bin"  # the one file of a single-file pack
FP16_MAX = 65504.0


class LayoutError(AnekitError, ValueError):
    """Arrays that do not fit a kernel's channel layout."""


@dataclass(frozen=True)
class Layout:
    """Named channel ranges of one [1, C, 1, spatial] surface, in order."""

    parts: tuple[tuple[str, int], ...]
    spatial: int

    @staticmethod
    def of(parts: Iterable[tuple[str, int]], spatial: int) -> Layout:
        return Layout(tuple((str(n), int(c)) for n, c in parts), int(spatial))

    @cached_property
    def channels(self) -> int:
        return sum(c for _, c in self.parts)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.parts]

    def range(self, name: str) -> tuple[int, int]:
        """``(channel offset, channels)`` of a part."""
        offset = 0
        for n, c in self.parts:
            if n == name:
                return offset, c
            offset += c
        raise LayoutError(f"[layout] no part '{name}' (parts: {', '.join(self.names)})")

    def split(self, array: np.ndarray) -> dict[str, np.ndarray]:
        """Each part of a (C, S) or [1, C, 1, S] array, as (channels, S) views."""
        rows = _rows(array, self.channels, self.spatial, "split")
        out, offset = {}, 0
        for n, c in self.parts:
            out[n] = rows[offset : offset + c]
            offset += c
        return out

    def pack(self, parts: Mapping[str, Any], dtype: Any = np.float32) -> np.ndarray:
        """The [1, C, 1, S] array holding every named part (each (channels, S) or [1, channels, 1, S])."""
        out = np.empty((self.channels, self.spatial), dtype=dtype)
        for _, offset, c, rows in self.part_rows(parts):
            out[offset : offset + c] = rows
        return out.reshape(1, self.channels, 1, self.spatial)

    def part_rows(self, parts: Mapping[str, Any]) -> Iterator[tuple[str, int, int, np.ndarray]]:
        """``(name, channel offset, channels, (channels, S) rows)`` of every part, in order, each checked
        (LayoutError for a missing, unexpected or misshapen part): what ``pack`` writes."""
        if len(parts) != len(self.parts) or any(n not in parts for n, _ in self.parts):
            names = self.names
            missing = [n for n in names if n not in parts]
            extra = [n for n in parts if n not in names]
            raise LayoutError(f"[layout] parts are {names}; missing {missing}, unexpected {extra}")
        offset = 0
        for n, c in self.parts:
            yield n, offset, c, _rows(np.asarray(parts[n]), c, self.spatial, f"part '{n}'")
            offset += c


def _rows(a: np.ndarray, channels: int, spatial: int, what: str) -> np.ndarray:
    if a.shape == (1, channels, 1, spatial):
        return a.reshape(channels, spatial)
    if a.shape == (channels, spatial):
        return a
    raise LayoutError(
        f"[layout] {what}: expected ({channels}, {spatial}) or [1, {channels}, 1, {spatial}], "
        f"got {list(a.shape)}"
    )


@dataclass
class WeightPack:
    """The fp16 weights of one kernel: by default each in its own MILBlob file, referred to at offset 64.

    One blob per file is the form every chip takes: maderix/ANE benchmarks/ANE_BENCHMARK_REPORT.md
    ("Cross-Generation MIL Compatibility") reports per-matrix weight blobs working on M1 to M5, while
    several blobs in one file, referred to at other offsets, fail on M1 (rule weights.one-blob-per-file-m1).
    ``single_file`` packs every weight into that one file instead (the training API's multi-chunk blob,
    which the fused composable pieces mirror). Paths and offsets are known before any data exists, so
    kernels can be generated from shapes only.
    """

    folder: str = WEIGHT_FOLDER
    entries: list[tuple[str, tuple[int, ...], np.ndarray | None]] = field(default_factory=list)
    single_file: str | None = None

    def add(self, name: str, shape: tuple[int, ...], array: np.ndarray | None) -> tuple[str, int]:
        """Add a weight; returns its BLOBFILE path and offset (of its metadata record)."""
        if any(n == name for n, _, _ in self.entries):
            raise LayoutError(f"[weights] '{name}' is added twice")
        if array is not None:
            array = np.asarray(array)
            if math.prod(array.shape) != math.prod(shape):
                raise LayoutError(f"[weights] '{name}' has shape {list(array.shape)}, expected {list(shape)}")
        offset = self._offset(len(self.entries)) if self.single_file else BLOB_OFFSET
        self.entries.append((name, tuple(shape), array))
        return self.path(name), offset

    def path(self, name: str) -> str:
        """The weight's file: ``@model_path/weights/<name>.bin`` (or the single file)."""
        return self.single_file or f"{self.folder}{name}.bin"

    @property
    def complete(self) -> bool:
        return all(a is not None for _, _, a in self.entries)

    def files(self) -> dict[str, bytes]:
        """``{BLOBFILE path: the file's bytes}`` (fp16, round to nearest even)."""
        if not self.entries:
            return {}
        if not self.complete:
            missing = [n for n, _, a in self.entries if a is None]
            raise LayoutError(f"[weights] no values for {missing}: the kernel was generated from shapes only")
        arrays = [(a.reshape(shape), "fp16") for _, shape, a in self.entries]  # type: ignore[union-attr]
        if self.single_file:
            blob, offsets = build_blob_bytes(arrays)
            assert offsets == [self._offset(i) for i in range(len(offsets))]
            return {self.single_file: blob}
        return {
            self.path(name): build_blob_bytes([item])[0] for (name, _, _), item in zip(self.entries, arrays)
        }

    def _offset(self, index: int) -> int:
        """Metadata offset of entry ``index`` in the single file."""
        pos = BLOB_OFFSET
        for _, shape, _ in self.entries[:index]:
            pos += 64 + (2 * math.prod(shape) + 63) // 64 * 64
        return pos


@dataclass
class KernelSpec:
    """A generated kernel: its program, weights, and the layouts of its input ``x`` and output ``out``."""

    name: str
    program: Program
    inputs: Layout
    outputs: Layout
    weights: WeightPack = field(default_factory=WeightPack)
    # Weight files shared by many kernels and built once (the causal mask), by BLOBFILE path.
    shared_files: dict[str, bytes] = field(default_factory=dict)

    def text(self) -> str:
        return print_program(self.program)

    def weight_files(self) -> dict[str, bytes]:
        """Every weight file the program refers to: ``{"@model_path/weights/x.bin": bytes}``."""
        return {**self.weights.files(), **self.shared_files}

    def compile(self, backend: Backend) -> Kernel:
        return backend.compile(self.program, self.weight_files())

    def _kernel(self, kernel_or_backend: Kernel | Backend) -> Kernel:
        if isinstance(kernel_or_backend, Kernel):
            return kernel_or_backend
        return self.compile(kernel_or_backend)

    def run(self, kernel_or_backend: Kernel | Backend, **parts: Any) -> dict[str, np.ndarray]:
        """Pack the named input parts, run, and return the named output parts (float32, (channels, S)).

        The parts are C-contiguous row ranges of the one output array the kernel call returned, which
        belongs to the caller alone (every backend's ``Kernel.__call__`` returns fresh arrays), so they
        are handed out as they are, not copied."""
        kernel = self._kernel(kernel_or_backend)  # compiled before the parts are packed, as always
        return self.run_packed(kernel, self.inputs.pack(parts))

    def run_packed(self, kernel_or_backend: Kernel | Backend, x: np.ndarray) -> dict[str, np.ndarray]:
        """``run`` on an input already packed: the [1, C, 1, S] array ``x`` goes to the kernel as it is."""
        out = self._kernel(kernel_or_backend)(x=x)["out"]
        return self.outputs.split(out)
