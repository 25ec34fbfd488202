"""Binary records declared once as data: a table of fields (name, struct code, offset), little-endian,
used to parse, to build and to size (CONVENTIONS.md 4). Record sizes and field offsets are asserted
when a table is declared, so a wrong table fails at import, not on a user's file."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Field:
    """One field of a binary record: its name, ``struct`` code (little-endian) and byte offset."""

    name: str
    code: str
    offset: int


class Record:
    """A fixed-size little-endian record declared as a table of fields; parses, builds and sizes it."""

    def __init__(self, name: str, fields: Sequence[Field], size: int) -> None:
        self.name = name
        self.fields = tuple(fields)
        self.struct = struct.Struct("<" + "".join(f.code for f in self.fields))
        self.size = size
        assert self.struct.size == size, f"{name}: fields add up to {self.struct.size} bytes, not {size}"
        for i, f in enumerate(self.fields):
            at = struct.calcsize("<" + "".join(g.code for g in self.fields[:i]))
            assert at == f.offset, f"{name}.{f.name}: declared at {f.offset}, packs at {at}"
        self._offsets = {f.name: f.offset for f in self.fields}

    def offset_of(self, name: str) -> int:
        """Byte offset of a field inside the record."""
        return self._offsets[name]

    def parse(self, buf: Any, offset: int = 0) -> dict[str, Any]:
        """Unpack the record at ``offset`` of ``buf``; the caller has checked that it is in bounds."""
        return dict(zip((f.name for f in self.fields), self.struct.unpack_from(buf, offset)))

    def build(self, **values: Any) -> bytes:
        """Pack the record; fields not given are zero (reserved byte fields: all zero bytes)."""
        unknown = set(values) - set(self._offsets)
        assert not unknown, f"{self.name}: unknown fields {sorted(unknown)}"
        return self.struct.pack(
            *(values.get(f.name, b"" if f.code.endswith("s") else 0) for f in self.fields)
        )


def writable_bytes(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """``data`` as a flat, writable uint8 array (a copy only when the source is read-only)."""
    buf = (
        np.asarray(data).reshape(-1).view(np.uint8)
        if isinstance(data, np.ndarray)
        else np.frombuffer(data, np.uint8)
    )
    return buf if buf.flags.writeable else buf.copy()
