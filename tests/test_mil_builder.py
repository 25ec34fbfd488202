"""The builder types every call eagerly, names things automatically, and turns Python values into consts."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil
from anekit.errors import MilTypeError, MilVerifyError, UnknownOpError
from anekit.mil import tensor


def test_builds_a_verifiable_program_with_automatic_names():
    b = mil.Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 8, 1, 4]))
    y = f.relu(x=f.mul(x=x, y=0.5))
    f.output(y)
    prog = mil.verify(b.build())
    names = [op.outputs[0].name for op in prog.main.ops]
    assert names == ["const_0", "mul_0", "relu_0"]
    assert prog.main.ops[0].outputs[0].type == mil.scalar("fp16")  # the float const follows x's dtype


def test_a_shape_error_is_raised_at_the_call_naming_op_and_inputs():
    b = mil.Builder()
    f = b.function()
    x = f.input("x", tensor("fp16", [1, 64, 1, 16]))
    z = f.input("z", tensor("fp16", [1, 32, 1, 16]))
    with pytest.raises(MilTypeError) as info:
        f.add(x=x, y=z)
    msg = str(info.value)
    assert (
        msg.startswith("[add]")
        and "tensor<fp16, [1, 64, 1, 16]>" in msg
        and "tensor<fp16, [1, 32, 1, 16]>" in msg
    )


def test_an_unknown_op_is_a_clear_error():
    f = mil.Builder().function()
    with pytest.raises(UnknownOpError, match="unknown op 'frobnicate'"):
        f.frobnicate(x=1)


def test_names_must_be_unique_and_valid():
    f = mil.Builder().function()
    x = f.input("x", tensor("fp32", [2]))
    f.relu(x=x, name="y")
    with pytest.raises(MilVerifyError, match="already used"):
        f.relu(x=x, name="y")
    with pytest.raises(MilVerifyError, match="not a valid MIL name"):
        f.relu(x=x, name="1bad")


def test_named_ops_name_their_consts_after_themselves():
    f = mil.Builder().function()
    x = f.input("x", tensor("fp32", [2, 3]))
    f.output(f.reduce_sum(x=x, axes=[1], keep_dims=True, name="s"))
    assert [op.outputs[0].name for op in f.fn.ops] == ["s_axes", "s_keep_dims", "s"]


def test_program_decorator_and_multiple_outputs():
    @mil.program(inputs={"x": tensor("fp32", [4, 6])})
    def prog(f, x):
        a, b = f.split(x=x, num_splits=2, axis=1)
        return a, f.exp(x=b)

    mil.verify(prog)
    assert [v.type for v in prog.main.outputs] == [tensor("fp32", [4, 3])] * 2


def test_consts_and_weights():
    f = mil.Builder().function()
    c = f.const(np.arange(6, dtype=np.float32).reshape(2, 3), name="c")
    w = f.weight(tensor("fp16", [4, 4, 1, 1]), "@model_path/weights/w.bin", 64, name="w")
    assert c.const is not None and c.type == tensor("fp32", [2, 3])
    assert w.type == tensor("fp16", [4, 4, 1, 1]) and w.const.is_blob


def test_a_function_without_outputs_cannot_be_built():
    b = mil.Builder()
    b.function()
    with pytest.raises(MilVerifyError, match="no outputs"):
        b.build()
