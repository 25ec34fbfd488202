"""``with_wire``: a transport whose float32 arrays travel as fp16 or bfloat16 (half the bytes).

``with_wire(t, "fp32")`` is ``t`` itself. Under ``"fp16"`` / ``"bf16"`` every float32 array sent, received
or broadcast goes as 16-bit values rounded to nearest, ties to even (``anekit.fp16``) and is widened back
exactly on arrival; arrays of other dtypes go as they are. A broadcast rounds the root's own arrays too,
so every rank still holds the same values after it. This is not bit-exact against an fp32 run: each
rounding loses the low mantissa bits (fp16 also overflows past 65504 and flushes below 2^-24 to zero,
bf16 keeps float32's range with 8 bits of mantissa).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn

import numpy as np

from anekit.fp16 import bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits
from anekit.training.distributed.transport import DistributedError, Transport

WIRES = ("fp32", "fp16", "bf16")
_CODECS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]] = {
    "fp16": (f32_to_f16_bits, f16_bits_to_f32),
    "bf16": (f32_to_bf16_bits, bf16_bits_to_f32),
}


def with_wire(transport: Transport, wire: str) -> Transport:
    """``transport`` with its float32 arrays on the wire as ``wire`` (module docstring)."""
    if wire == "fp32":
        return transport
    if wire not in _CODECS:
        raise DistributedError(
            f"[distributed] --wire: unknown wire dtype {wire!r} (expected one of fp32, fp16, bf16)"
        )
    return WireTransport(transport, wire)


class WireTransport:
    """A transport that rounds float32 arrays to 16 bits on the wire; everything else is the inner one's."""

    def __init__(self, inner: Transport, wire: str) -> None:
        self.inner = inner
        self.wire = wire
        self.name, self.rank, self.size = inner.name, inner.rank, inner.size
        self.local_size, self.timeout = inner.local_size, inner.timeout
        self._encode, self._decode = _CODECS[wire]

    def _narrow(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [self._encode(a) if a.dtype == np.float32 else a for a in arrays]

    def _slots(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.empty(a.shape, np.uint16) if a.dtype == np.float32 else a for a in arrays]

    def _widen(self, arrays: Sequence[np.ndarray], slots: list[np.ndarray]) -> None:
        for a, s in zip(arrays, slots):
            if a.dtype == np.float32:
                a[...] = self._decode(s)

    def send(self, arrays: Sequence[np.ndarray], dst: int, what: str) -> None:
        self.inner.send(self._narrow(arrays), dst, what)

    def recv(self, arrays: Sequence[np.ndarray], src: int, what: str) -> None:
        slots = self._slots(arrays)
        self.inner.recv(slots, src, what)
        self._widen(arrays, slots)

    def broadcast(self, arrays: Sequence[np.ndarray], root: int, what: str) -> None:
        slots = self._narrow(arrays) if self.rank == root else self._slots(arrays)
        self.inner.broadcast(slots, root, what)
        self._widen(arrays, slots)  # the root's own arrays take the rounded values as well

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        return self.inner.all_gather_bytes(data, what)

    def all_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        return self.inner.all_sum(array, what)

    def barrier(self, what: str) -> None:
        self.inner.barrier(what)

    def abort(self, line: str, code: int = 1) -> NoReturn:
        self.inner.abort(line, code)

    def close(self) -> None:
        self.inner.close()
