"""A model file's tensors mapped one at a time: each access maps a read-only window of the file holding
just that tensor, and the window is unmapped when the last array viewing it is dropped.

A map of the whole file costs address space equal to the file's size; a process whose address space is
limited (RLIMIT_AS, ``ulimit -v``) below that (a 26 GB Llama-2-7B under 4 GB) cannot map it at all. Read
through windows, it needs only the tensors in use at once: the forward of ``anekit sample`` reads one
projection at a time, an export writes one tensor at a time. Every access maps afresh (a system call and
the page faults of reading it again from the page cache), so a model that fits is mapped whole instead
(``anekit.llama.llama2c.open_llama2c`` chooses).
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from anekit import addrspace
from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.llama.params import LAYER_FIELDS, LayerParams, Params

__all__ = ["FileWindows", "MappedLayer", "MappedParams", "Run"]

# key -> (byte offset of its first array, bytes from one layer's array to the next, the array's shape)
Run = tuple[int, int, tuple[int, ...]]


class FileWindows:
    """Read-only float32 arrays of an open file, each backed by its own map of just its bytes."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        self.path = os.fspath(path)
        self.what = what  # starts the error messages: "[llama2c] model file"
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 - open as long as arrays are made from it
        except OSError as e:
            raise AnekitError(f"{what} {self.path} cannot be mapped: {e.strerror or e}") from e

    def array(self, offset: int, shape: tuple[int, ...], label: str) -> np.ndarray:
        """The little-endian float32 array of ``shape`` at byte ``offset``, read-only."""
        count = int(np.prod(shape))
        if count == 0:
            empty = np.zeros(shape, "<f4")
            empty.flags.writeable = False
            return empty
        start = offset - offset % mmap.ALLOCATIONGRANULARITY  # a map starts on the granularity
        length = offset - start + 4 * count
        try:
            window = mmap.mmap(self._file.fileno(), length, offset=start, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            where = self.what.partition("]")[0].lstrip("[")
            if getattr(e, "errno", None) == errno.ENOMEM:
                addrspace.check(length, where, f"mapping {label} of {self.path}")
            raise AnekitError(f"{self.what} {self.path}: cannot map {label}: {e}") from e
        return np.frombuffer(window, "<f4", count=count, offset=offset - start).reshape(shape)

    def close(self) -> None:
        """Close the file (arrays already made keep their maps)."""
        self._file.close()


class _Tensor:
    """A tensor attribute of a mapped container: mapped on every read, never assigned."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj._tensor(self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"{self.name} is a read-only view of the model file")


class MappedLayer(LayerParams):
    """One layer whose nine llama2.c arrays are mapped from the file when read (no extras)."""

    rms_att = _Tensor()
    wq = _Tensor()
    wk = _Tensor()
    wv = _Tensor()
    wo = _Tensor()
    rms_ffn = _Tensor()
    w1 = _Tensor()
    w2 = _Tensor()
    w3 = _Tensor()

    def __init__(self, windows: FileWindows, runs: dict[str, Run], layer: int) -> None:
        self._windows, self._runs, self._layer = windows, runs, layer

    def _tensor(self, key: str) -> np.ndarray:
        first, stride, shape = self._runs[key]
        return self._windows.array(first + stride * self._layer, shape, f"layers.{self._layer}.{key}")


class _Layers(Sequence[LayerParams]):
    """The layers of a mapped model, each made when it is asked for (nothing is kept)."""

    def __init__(self, windows: FileWindows, runs: dict[str, Run], n: int) -> None:
        self._windows, self._runs, self._n = windows, runs, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> LayerParams: ...
    @overload
    def __getitem__(self, i: slice) -> list[LayerParams]: ...
    def __getitem__(self, i: int | slice) -> LayerParams | list[LayerParams]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        j = i + self._n if i < 0 else i
        if not 0 <= j < self._n:
            raise IndexError(f"layer {i} of {self._n}")
        return MappedLayer(self._windows, self._runs, j)

    def __iter__(self) -> Iterator[LayerParams]:
        return (MappedLayer(self._windows, self._runs, j) for j in range(self._n))


class MappedParams(Params):
    """A model's weights read through ``FileWindows``: each tensor is mapped when it is read.

    ``runs`` holds every key's place in the file: the model's arrays (embed, rms_final, wcls when the
    classifier is not shared) and the nine per-layer keys."""

    embed = _Tensor()
    rms_final = _Tensor()
    wcls = _Tensor()

    def __init__(self, cfg: ModelConfig, windows: FileWindows, runs: dict[str, Run]) -> None:
        self.cfg = cfg
        self._windows, self._runs = windows, runs
        self.layers = _Layers(windows, runs, cfg.n_layers)  # type: ignore[assignment]

    def _tensor(self, key: str) -> np.ndarray | None:
        if key == "wcls" and key not in self._runs:
            return None  # tied to the embedding
        first, _, shape = self._runs[key]
        return self._windows.array(first, shape, key)

    @property
    def tied(self) -> bool:
        """Whether the classifier is the embedding (known from the file's layout: nothing is mapped)."""
        return "wcls" not in self._runs

    def count(self) -> int:
        """The number of weights, from the shapes alone (nothing is mapped)."""
        per_layer = sum(int(np.prod(self._runs[k][2])) for k in LAYER_FIELDS)
        model = sum(int(np.prod(self._runs[k][2])) for k in ("embed", "rms_final", "wcls") if k in self._runs)
        return self.cfg.n_layers * per_layer + model

    def largest_tensor_bytes(self) -> int:
        """The bytes of the largest single array: the address space one tensor's window takes."""
        return max(4 * int(np.prod(shape)) for _, _, shape in self._runs.values())
