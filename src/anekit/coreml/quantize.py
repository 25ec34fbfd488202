"""Weight quantization for the CoreML export: int8 per tensor (law 3), int4 per block (off the engine).

Law 3 of the empirical-laws reference (rule ``quant.int8-per-tensor`` of the rule book): int8 weights
with one scale per tensor keep every ``conv`` on the Neural Engine; int4 per-block weights make every
conv fall off to the CPU in small shards. Both are symmetric (no zero point): ``w ~ scale * q``.

How coremltools writes the int8 per-tensor form (``linear_quantize_weights``, mode
``linear_symmetric``, granularity ``per_tensor``; checked with coremltools 9.0):

* iOS18 opset: ``constexpr_blockwise_shift_scale(data, scale)`` with ``data`` int8 of the weight's
  shape, ``scale`` fp16 of the weight's rank with every dimension 1 (``[1, 1, 1, 1]`` for a conv
  weight), no ``offset``.
* iOS16 opset: ``constexpr_affine_dequantize`` with ``quantized_data`` int8, ``zero_point`` int8
  scalar 0, ``scale`` fp16 scalar and ``axis`` 0, all four stored as op *attributes* in the protobuf
  (anekit's IR holds them as inputs, as its op registry declares them).

The export writes the iOS18 form: its functions use states, which arrive with iOS18 anyway
(``dialect.OPS_SINCE``); ``dequantize_op`` also builds the iOS16 form for programs without states.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from anekit.errors import AnekitError
from anekit.fp16 import round_to_fp16

QUANT_MODES = ("none", "int8", "int4-block")
INT8_MAX = 127  # symmetric: -127 .. 127, so the negated scale range is the same
INT4_MAX = 7  # symmetric int4: -7 .. 7
INT4_BLOCK = 32  # input channels per scale of the int4 form (coremltools' default block size)


class QuantizationWarning(UserWarning):
    """A quantization the rule book says leaves the engine (rule quant.int8-per-tensor)."""


@dataclass(frozen=True)
class Quantized:
    """One quantized weight: integer data, its scales (broadcastable to the data) and the error made."""

    name: str
    data: np.ndarray  # int8 values (int4 values held in int8 for the int4 form), the weight's shape
    scale: np.ndarray  # float32 holding fp16 values: shape [1] * rank, or per block
    dtype: str  # "int8" or "int4"
    max_abs_error: float  # max |w - scale * q|
    rel_rms_error: float  # ||w - scale * q|| / ||w||

    def dequantized(self) -> np.ndarray:
        return (self.data.astype(np.float32) * np.repeat(self.scale, self._block(), axis=1)).astype(
            np.float32
        )

    def _block(self) -> int:
        return self.data.shape[1] // self.scale.shape[1] if self.data.ndim > 1 else 1


def check_mode(mode: str) -> str:
    """``mode`` if it is a known quantization; an AnekitError naming the known ones otherwise."""
    if mode not in QUANT_MODES:
        raise AnekitError(f"[export] unknown --quantize {mode!r} (known: {', '.join(QUANT_MODES)})")
    if mode == "int4-block":
        warnings.warn(
            "int4 per-block weights make every conv fall off the Neural Engine to the CPU in small shards "
            "(law 3; rule quant.int8-per-tensor): use --quantize int8 for the engine",
            QuantizationWarning,
            stacklevel=2,
        )
    return mode


def _errors(w: np.ndarray, deq: np.ndarray) -> tuple[float, float]:
    diff = (w.astype(np.float64) - deq.astype(np.float64)).ravel()
    norm = float(np.linalg.norm(w.astype(np.float64).ravel()))
    rms = float(np.linalg.norm(diff))
    return float(np.abs(diff).max(initial=0.0)), rms / norm if norm > 0 else 0.0


def quantize_int8_per_tensor(name: str, w: np.ndarray) -> Quantized:
    """Symmetric int8 with one fp16 scale for the whole tensor: scale = max|w| / 127 (rounded to fp16,
    the dtype it is stored in), q = round(w / scale) clipped to -127 .. 127."""
    w = np.asarray(w, dtype=np.float32)
    top = float(np.abs(w).max(initial=0.0))
    scale = float(round_to_fp16(np.float32(top / INT8_MAX if top > 0 else 1.0)))
    if not math.isfinite(scale) or scale == 0.0:
        raise AnekitError(f"[export] weight '{name}': max |w| = {top:g} has no fp16 int8 scale")
    q = np.clip(np.rint(w / np.float32(scale)), -INT8_MAX, INT8_MAX).astype(np.int8)
    scales = np.full((1,) * w.ndim, scale, dtype=np.float32)
    deq = q.astype(np.float32) * np.float32(scale)
    return Quantized(name, q, scales, "int8", *_errors(w, deq))


def quantize_int4_per_block(name: str, w: np.ndarray, block: int = INT4_BLOCK) -> Quantized:
    """Symmetric int4 with one fp16 scale per output channel and block of ``block`` input channels."""
    w = np.asarray(w, dtype=np.float32)
    c_out, c_in = w.shape[0], w.shape[1]
    if c_in % block:
        block = math.gcd(c_in, block)
    blocks = w.reshape(c_out, c_in // block, block, *w.shape[2:])  # (out, in/block, block, ...)
    top = np.abs(blocks).max(axis=tuple(range(2, blocks.ndim)))  # (out, in/block)
    scale = round_to_fp16(np.where(top > 0, top / INT4_MAX, 1.0).astype(np.float32))  # (out, in/block)
    scales = scale.reshape(c_out, c_in // block, *([1] * (w.ndim - 2)))  # rank of w
    full = np.repeat(scales, block, axis=1)  # w's shape
    q = np.clip(np.rint(w / full), -INT4_MAX, INT4_MAX).astype(np.int8)
    deq = q.astype(np.float32) * full
    return Quantized(name, q, scales.astype(np.float32), "int4", *_errors(w, deq))


def quantize(mode: str, name: str, w: np.ndarray) -> Quantized:
    if mode == "int8":
        return quantize_int8_per_tensor(name, w)
    if mode == "int4-block":
        return quantize_int4_per_block(name, w)
    raise AnekitError(f"[export] quantization {mode!r} has no quantizer (known: int8, int4-block)")
