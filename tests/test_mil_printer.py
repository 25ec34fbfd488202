"""The printer writes canonical MIL text: exact hex floats, sorted arguments, coremlc's layout."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import random

import numpy as np
import pytest

from anekit import mil
from anekit.mil.printer import format_float
from anekit.mil.values import scalar_literal, tensor_literal


def _libc_hex(value: float) -> str | None:
    """C's own ``%a`` formatting: the independent oracle for hex floats."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    except OSError:
        return None
    buf = ctypes.create_string_buffer(64)
    libc.snprintf(buf, 64, b"%a", ctypes.c_double(value))
    return buf.value.decode()


def _sample_floats() -> list[float]:
    rng = random.Random(7)
    values = [0.0, -0.0, 1.0, -1.5, 0.5, 65504.0, 2.0**-24, 2.0**-14, 1.3125 * 2**-17, 1e-5, 3.0e38]
    for _ in range(500):  # fp16 and fp32 values (never subnormal as doubles)
        bits = rng.getrandbits(16)
        h = np.array([bits], dtype=np.uint16).view(np.float16)[0]
        if np.isfinite(h):
            values.append(float(h))
        f = np.array([rng.getrandbits(32)], dtype=np.uint32).view(np.float32)[0]
        if np.isfinite(f):
            values.append(float(f))
    return values


@pytest.mark.parametrize("value", _sample_floats()[:40] + _sample_floats()[40::25])
def test_hex_floats_match_c_printf(value):
    expected = _libc_hex(value)
    if expected is None:
        pytest.skip("no C library to compare with")
    assert format_float(value) == expected


def test_hex_floats_are_exact():
    for value in _sample_floats():
        parsed = float.fromhex(format_float(value))
        assert parsed == value and math.copysign(1, parsed) == math.copysign(1, value), value


def test_special_values():
    assert format_float(float("inf")) == "inf"
    assert format_float(float("-inf")) == "-inf"
    assert format_float(float("nan")) == "nan"


def test_literals_print_in_mil_spelling():
    assert mil.format_literal(scalar_literal("fp16", 0.5)) == "fp16(0x1p-1)"
    assert mil.format_literal(tensor_literal("int32", [1, 1])) == "tensor<int32, [2]>([1, 1])"
    assert (
        mil.format_literal(tensor_literal("bool", [[True, False]])) == "tensor<bool, [1, 2]>([true, false])"
    )
    assert mil.format_literal(scalar_literal("string", 'a"b')) == 'string("a\\"b")'
    assert mil.format_literal(scalar_literal("fp16", 0.5), "tensor") == "tensor<fp16, []>(0x1p-1)"


def test_program_layout_matches_coremlc():
    @mil.program(inputs={"x": mil.tensor("fp16", [1, 4, 1, 2])})
    def prog(f, x):
        return f.relu(x=x, name="y")

    text = mil.to_text(prog)
    lines = text.splitlines()
    assert lines[0] == "program(1.3)"
    assert lines[1].startswith("[buildInfo = dict<string, string>({{")
    assert lines[2] == "{"
    assert lines[3] == "    func main<ios18>(tensor<fp16, [1, 4, 1, 2]> x) {"
    assert lines[4] == '            tensor<fp16, [1, 4, 1, 2]> y = relu(x = x)[name = string("y")];'
    assert lines[5] == "        } -> (y);"
    assert lines[6] == "}"
    assert text.endswith("}\n")


def test_inputs_and_attributes_print_sorted():
    text = (
        "program(1.3)\n{\n    func main<ios18>(tensor<fp16, [2]> x, tensor<fp16, [2]> y) {\n"
        '            tensor<fp16, [2]> z = add(y = y, x = x)[zeta = int32(1), name = string("z")];\n'
        "        } -> (z);\n}\n"
    )
    out = mil.to_text(mil.parse(text))
    assert 'add(x = x, y = y)[name = string("z"), zeta = int32(1)]' in out
