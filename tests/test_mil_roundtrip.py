"""Round trips: parse(print(p)) == p for random well-typed programs; print(parse(t)) == t for canonical t."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anekit import mil
from anekit.mil import types as T
from anekit.mil.values import Literal, dict_literal, scalar_literal, string_literal, tensor_literal

FLOAT_DTYPES = ["fp16", "fp32"]
CONST_DTYPES = [
    "fp16",
    "fp32",
    "bf16",
    "int4",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint6",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "string",
]
UNARY = ["relu", "sigmoid", "exp", "abs", "tanh", "sqrt", "sin"]
BINARY = ["add", "mul", "sub", "maximum", "minimum", "real_div"]
REDUCE = ["reduce_sum", "reduce_max", "reduce_mean"]
SPECIAL = [0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 65504.0, 2.0**-24, 6.1e-5, 1e-5, 3.3e38]
shapes = st.lists(st.integers(1, 4), min_size=0, max_size=4).map(tuple)


def _random_values(draw, dtype: str, shape: tuple[int, ...]) -> Literal:
    n = int(np.prod(shape)) if shape else 1
    d = T.dtype(dtype)
    if d.kind == "float":
        vals = draw(
            st.lists(
                st.one_of(st.sampled_from(SPECIAL), st.floats(-1e4, 1e4, width=32)), min_size=n, max_size=n
            )
        )
    elif d.kind == "bool":
        vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    elif d.kind == "string":
        vals = draw(st.lists(st.text(max_size=6), min_size=n, max_size=n))
    else:
        lo, hi = d.int_range()
        vals = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    with np.errstate(over="ignore"):
        return tensor_literal(
            dtype, np.array(vals, dtype=object if dtype == "string" else None).reshape(shape)
        )


def _attrs(draw) -> dict[str, Literal]:
    out: dict[str, Literal] = {}
    if draw(st.booleans()):
        out["milId"] = scalar_literal("uint64", draw(st.integers(0, 2**64 - 1)))
    if draw(st.booleans()):
        out["Backend"] = string_literal(draw(st.text(max_size=8)))
    if draw(st.booleans()):
        out["Estimates"] = dict_literal(
            T.scalar("string"), T.scalar("fp64"), {"ane": draw(st.floats(0, 1)), "cpu": draw(st.floats(0, 1))}
        )
    return out


@st.composite
def programs(draw) -> mil.Program:
    version = draw(st.sampled_from(["1.0", "1.3"]))
    b = mil.Builder(version=version, build={"coremltools-version": draw(st.text(max_size=5))})
    for fi in range(draw(st.integers(1, 2))):
        f = b.function(f"fn{fi}" if fi else "main", opset=draw(st.sampled_from(["ios16", "ios17", "ios18"])))
        pool = [
            f.input(f"in{i}", T.tensor(draw(st.sampled_from(FLOAT_DTYPES)), draw(shapes)))
            for i in range(draw(st.integers(1, 3)))
        ]
        for _ in range(draw(st.integers(1, 10))):
            x = draw(st.sampled_from(pool))
            xt = x.type
            kind = draw(
                st.sampled_from(["unary", "binary", "scalar", "reduce", "softmax", "transpose", "const"])
            )
            attrs = _attrs(draw)
            if kind == "unary":
                v = f.op(draw(st.sampled_from(UNARY)), x=x, attributes=attrs)
            elif kind == "binary":
                same = [p for p in pool if p.type == xt]
                v = f.op(draw(st.sampled_from(BINARY)), x=x, y=draw(st.sampled_from(same)), attributes=attrs)
            elif kind == "scalar":
                y = f.const(_random_values(draw, xt.dtype.name, ()))
                v = f.op(draw(st.sampled_from(BINARY)), x=x, y=y, attributes=attrs)
            elif kind == "reduce" and xt.rank:
                axes = draw(st.lists(st.integers(-xt.rank, xt.rank - 1), min_size=1, max_size=1))
                v = f.op(draw(st.sampled_from(REDUCE)), x=x, axes=axes, keep_dims=draw(st.booleans()))
            elif kind == "softmax" and xt.rank:
                v = f.softmax(x=x, axis=draw(st.integers(-xt.rank, xt.rank - 1)))
            elif kind == "transpose" and xt.rank:
                v = f.transpose(x=x, perm=draw(st.permutations(range(xt.rank))))
            else:
                dtype = draw(st.sampled_from(CONST_DTYPES))
                v = f.const(_random_values(draw, dtype, draw(shapes)))
                if dtype not in FLOAT_DTYPES:
                    continue  # keep as an unused const; only float tensors feed the ops above
            pool.append(v)
        outs = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique_by=lambda v: v.name))
        f.output(*outs)
    return b.build()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_parse_of_print_gives_back_the_program(prog):
    text = mil.to_text(prog)
    parsed = mil.verify(mil.parse(text))
    assert parsed == prog
    assert mil.to_text(parsed) == text


def test_equality_is_structural_and_sees_differences():
    @mil.program(inputs={"x": T.tensor("fp16", [2])})
    def a(f, x):
        return f.mul(x=x, y=0.5, name="y")

    @mil.program(inputs={"x": T.tensor("fp16", [2])})
    def b(f, x):
        return f.mul(x=x, y=0.25, name="y")

    assert a == mil.parse(mil.to_text(a))
    assert a != b
