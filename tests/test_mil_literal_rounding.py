"""Float literals are rounded to their declared dtype once, from the exact value written, to nearest even.

The reference rounds with exact rational arithmetic (``fractions.Fraction``), independent of numpy's
casts and of anekit's fp16 module: reading a literal through float32 first (double rounding) or not
rounding bf16 at all fails here.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from anekit import mil

SIGNIFICANT_BITS = {"fp16": 11, "bf16": 8, "fp32": 24}


def _round_exact(x: float, bits: int) -> float:
    """x rounded to ``bits`` significant bits, ties to even (normal range)."""
    if x == 0:
        return 0.0
    m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= |m| < 1
    scaled = Fraction(m) * 2**bits
    return float(round(scaled) * Fraction(2) ** (e - bits))  # round() on a Fraction: ties to even


def _values(bits: int) -> list[float]:
    ulp = 2.0 ** (1 - bits)  # spacing of the dtype's significands at 1.0
    tiny = 2.0**-40  # far below float32's resolution at 1.0: lost by a float32 detour
    return [
        1 + ulp / 2,  # a tie: to even (1.0)
        1 + 3 * ulp / 2,  # a tie: to even (1 + 2 ulp)
        1 + ulp / 2 + tiny,  # just above a tie: up
        1 + 3 * ulp / 2 - tiny,  # just below a tie: down
        -(1 + ulp / 2 + tiny),
        3.0e-3 * (1 + ulp / 2 + tiny),
        1234.5678,
    ]


@pytest.mark.parametrize("dtype", sorted(SIGNIFICANT_BITS))
def test_parse_rounds_hex_literals_once_to_nearest_even(dtype):
    bits = SIGNIFICANT_BITS[dtype]
    values = _values(bits)
    items = ", ".join(v.hex().replace("0x", "0x") for v in values)
    text = (
        "program(1.3)\n{\n    func main<ios18>(tensor<fp32, [1]> x) {\n"
        f'            tensor<{dtype}, [{len(values)}]> c = const()[name = string("c"), '
        f"val = tensor<{dtype}, [{len(values)}]>([{items}])];\n"
        "    } -> (c);\n}\n"
    )
    got = np.asarray(mil.parse(text).main.ops[0].attributes["val"].value, dtype=np.float64)
    want = [_round_exact(v, bits) for v in values]
    assert got.tolist() == want


def test_float64_to_bf16_rounds_once_over_the_whole_range():
    """``fp16.round_f64_to_bf16`` against exact rational rounding: random normals of every binade, values
    on bf16's subnormal grid and its ties, overflow past the largest finite bf16, NaN."""
    from anekit.fp16 import BF16_MAX, round_f64_to_bf16

    rng = np.random.default_rng(1)
    normal = rng.uniform(1, 2, 2000) * 2.0 ** rng.integers(-126, 127, 2000) * rng.choice([-1, 1], 2000)
    got = round_f64_to_bf16(normal)
    want = [_round_exact(float(v), 8) for v in normal]
    assert got.astype(np.float64).tolist() == want
    grid = 2.0**-133
    sub = np.array([grid * 0.5, grid * 1.5, grid * 2.5, grid * 2.5000001, grid * 127.5, -grid * 3.49])
    want_sub = [float(round(Fraction(v) / Fraction(grid)) * Fraction(grid)) for v in sub.tolist()]
    assert round_f64_to_bf16(sub).astype(np.float64).tolist() == want_sub
    edge = round_f64_to_bf16(
        np.array([BF16_MAX, BF16_MAX * (1 + 2.0**-9), BF16_MAX * (1 + 2.0**-7), -1e39, np.nan, np.inf])
    )
    assert edge[0] == BF16_MAX and edge[1] == BF16_MAX  # below the tie with 2**128: down
    assert np.isposinf(edge[2]) and np.isneginf(edge[3])  # past it: overflow
    assert np.isnan(edge[4]) and np.isposinf(edge[5])
