"""A loss-curve PNG without a plotting library: a numpy raster written as an 8-bit greyscale PNG."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np

from anekit.fileio import write_bytes_atomic

# 3x5 bitmap digits for the axis labels (rows top to bottom, 3 bits each).
_DIGITS = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2),
}  # fmt: skip


def _text(img: np.ndarray, x: int, y: int, s: str, scale: int = 2) -> None:
    for ch in s:
        rows = _DIGITS.get(ch)
        if rows is not None:
            for r, bits in enumerate(rows):
                for c in range(3):
                    if bits >> (2 - c) & 1:
                        img[y + r * scale : y + (r + 1) * scale, x + c * scale : x + (c + 1) * scale] = 0
        x += 4 * scale


def _line(img: np.ndarray, x0: float, y0: float, x1: float, y1: float) -> None:
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.linspace(x0, x1, n).round().astype(int)
    ys = np.linspace(y0, y1, n).round().astype(int)
    for dy in (0, 1):
        img[np.clip(ys + dy, 0, img.shape[0] - 1), np.clip(xs, 0, img.shape[1] - 1)] = 0


def loss_curve_png(
    losses: list[float], path: str | os.PathLike[str], width: int = 640, height: int = 360
) -> None:
    """Draw the loss of every step (x: step, y: loss) with its range labelled; written atomically."""
    img = np.full((height, width), 255, dtype=np.uint8)
    left, right, top, bottom = 60, width - 20, 20, height - 40
    img[top:bottom, left] = 0
    img[bottom, left:right] = 0
    values = np.asarray([v for v in losses if np.isfinite(v)], dtype=np.float64)
    if values.size:
        lo, hi = float(values.min()), float(values.max())
        span = hi - lo or 1.0
        xs = left + (right - left) * np.arange(len(values)) / max(1, len(values) - 1)
        ys = bottom - (bottom - top) * (values - lo) / span
        for i in range(len(values) - 1):
            _line(img, xs[i], ys[i], xs[i + 1], ys[i + 1])
        _text(img, 4, top, f"{hi:.2f}")
        _text(img, 4, bottom - 10, f"{lo:.2f}")
        _text(img, right - 40, bottom + 10, str(len(values)))
        _text(img, left, bottom + 10, "1")
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    write_bytes_atomic(path, png)
