"""The float32 bit patterns of binary16's limits and rounding steps, shared by ``anekit.fp16``'s numpy paths
and the compiled loops of ``anekit._jit_loops``: one definition, so both paths compute the same bits.

This module imports nothing of anekit's, so both of them can read it without importing each other.
"""

from __future__ import annotations

import numpy as np

_U32 = np.uint32

F32_SIGN = _U32(0x80000000)
F32_ABS = _U32(0x7FFFFFFF)
F32_INF = _U32(0x7F800000)
F32_QUIET = _U32(0x00400000)
# float32 pattern of 65504, the largest finite half.
F32_FP16_MAX = _U32(0x477FE000)
# |x| patterns below this (2**-14) give a subnormal half or zero.
F16_SUBNORMAL_LIMIT = _U32(0x38800000)

# The one-pass rounding to binary16 precision (``fp16._round_fp16_fast``, ``_jit_loops._round``):
# x + C - C with C = 1.5 * 2**(e + 13) for x in binade 2**e, so that x + C falls in a binade whose float32
# ulp is the half's ulp at 2**e.
F32_EXP = _U32(0x7F800000)
MAGIC_OFFSET = _U32((13 << 23) | 0x00400000)  # exponent + 13, mantissa 0.5: times 1.5 * 2**13
# Binades below 2**-14 (subnormal halves, zero) share C = 0.75: ulp 2**-24 in [0.5, 1), the subnormal step.
MAGIC_MIN = _U32(0x38800000 + ((13 << 23) | 0x00400000))
# |x| >= 65520 rounds past 65504 (65520 itself is a tie that goes to the even 65536, i.e. inf).
FP16_ROUND_LIMIT = np.float32(65520.0)

# Encoding binary16 values as half patterns (``fp16.encode_fp16_values``): a half's float32 pattern has
# its low 13 bits clear.
F16_LOW_BITS = _U32(0x1FFF)
# A normal half's pattern is its |x| pattern >> 13 less the exponent rebias 112 << 10.
F16_REBIAS_SHIFTED = np.int32(112 << 10)
F32_HALF_BITS = np.int32(0x3F000000)  # 0.5
