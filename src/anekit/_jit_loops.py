"""The compiled loops behind ``anekit.jit`` (imported only through it, and only when numba is installed).

Each loop walks a 1-d C-contiguous array once, element by element, in float32 / uint32 arithmetic that
numpy's vectorised paths in ``anekit.fp16`` perform in several passes; they compute the same bits (the
tests compare them over random and special bit patterns). Separate in-place variants exist because a
loop reading and writing two arguments that may overlap is not vectorised by the compiler.

Compiled on first call and cached on disk by numba (``cache=True``); ``nogil`` lets a BLAS call in
another thread run meanwhile.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# The bit layout constants are fp16's own, so both paths read one definition.
from anekit.fp16 import _F16_LOW_BITS as _LOW13
from anekit.fp16 import _F16_REBIAS_SHIFTED as _REBIAS
from anekit.fp16 import _F16_SUBNORMAL_LIMIT as _MIN_NORMAL
from anekit.fp16 import _F32_ABS as _ABS
from anekit.fp16 import _F32_EXP as _EXP
from anekit.fp16 import _F32_FP16_MAX as _FP16_MAX
from anekit.fp16 import _F32_HALF_BITS as _HALF_BITS
from anekit.fp16 import _F32_INF as _INF
from anekit.fp16 import _F32_QUIET as _QUIET
from anekit.fp16 import _F32_SIGN as _SIGN
from anekit.fp16 import _FP16_ROUND_LIMIT, _MAGIC_MIN, _MAGIC_OFFSET

_LOW13_CLEAR = np.uint32(0xFFFFE000)
# |x| of 65520 and more rounds to inf (NaN patterns lie above too): fp16's limit as a float32 pattern.
_ROUND_LIMIT = np.float32(_FP16_ROUND_LIMIT).view(np.uint32)


@njit(cache=True)
def _round(v: np.float32) -> np.float32:
    """v rounded to binary16 precision (ties to even, overflow to inf, quiet NaN)."""
    b = np.float32(v).view(np.uint32)
    a = np.uint32(b & _ABS)
    s = np.uint32(b & _SIGN)
    c = np.uint32(max(np.uint32(np.uint32(b & _EXP) + _MAGIC_OFFSET), _MAGIC_MIN))
    cf = np.uint32(c).view(np.float32)
    r = np.float32(np.float32(v + cf) - cf)
    rounded = np.uint32(np.float32(r).view(np.uint32) | s)
    quiet = _QUIET if a > _INF else np.uint32(0)
    special = np.uint32(np.uint32(np.uint32(max(a, _INF) & _LOW13_CLEAR) | quiet) | s)
    return np.uint32(special if a >= _ROUND_LIMIT else rounded).view(np.float32)


@njit(nogil=True, cache=True)
def round_fp16_inplace(x: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(x.size):
        x[i] = _round(x[i])


@njit(nogil=True, cache=True)
def round_fp16_into(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = _round(x[i])


@njit(nogil=True, cache=True)
def encode_fp16_values(x: np.ndarray, out: np.ndarray) -> bool:  # pragma: no cover - compiled
    """Half patterns of float32 values; False if one is not finite, past 65504 or has bits a half lacks."""
    bad = np.uint32(0)
    for i in range(x.size):
        v = x[i]
        b = np.float32(v).view(np.uint32)
        a = np.uint32(b & _ABS)
        normal = np.int32(np.int32(a >> np.uint32(13)) - _REBIAS)
        # Under 2**-14: |x| + 0.5 rounds to the subnormal step 2**-24, its pattern less 0.5's is the half.
        af = np.uint32(a).view(np.float32)
        t = np.float32(af + np.float32(0.5))
        sub = np.int32(np.float32(t).view(np.int32) - _HALF_BITS)
        h = normal if a >= _MIN_NORMAL else sub
        # As fp16.encode_fp16_values: patterns with low bits set are refused, others under 2**-14 rounded
        # to the subnormal step (ties to even, as a cast would).
        bad |= np.uint32(a > _FP16_MAX) | np.uint32(a & _LOW13)
        out[i] = np.uint16(np.uint32(h) | np.uint32(np.uint32(b >> np.uint32(16)) & np.uint32(0x8000)))
    return bad == 0


# error_model="numpy": a float division by zero gives inf / NaN as numpy's does instead of raising, so the
# loop has no exit and LLVM vectorises it (sqrt and division stay IEEE-exact per lane: the same bits).
@njit(nogil=True, cache=True, error_model="numpy")
def adamw_update(
    w: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    b1: np.float32,
    b2: np.float32,
    decay: np.float32,
    step: np.float32,
    bias2: np.float32,
    eps: np.float32,
    gscale: np.float32,
) -> None:  # pragma: no cover - compiled
    """``llama.cpu_ops.adamw_update``'s float32 operations, in its order, one element at a time.

    A ``gscale`` other than 1 first scales the gradient in place (``g *= gscale``, the clip).
    """
    one_b1 = np.float32(np.float32(1.0) - b1)
    one_b2 = np.float32(np.float32(1.0) - b2)
    scaled = gscale != np.float32(1.0)
    for i in range(w.size):
        gi = g[i]
        if scaled:
            gi = np.float32(gi * gscale)
            g[i] = gi
        mi = np.float32(np.float32(m[i] * b1) + np.float32(one_b1 * gi))
        vi = np.float32(np.float32(v[i] * b2) + np.float32(one_b2 * np.float32(gi * gi)))
        m[i] = mi
        v[i] = vi
        wi = np.float32(w[i] * decay)
        denom = np.float32(np.float32(np.sqrt(vi) / bias2) + eps)
        w[i] = np.float32(wi - np.float32(step * np.float32(mi / denom)))
