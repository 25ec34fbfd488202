"""The state ops: their type rules (a state<tensor> in, its tensor out) and value-level references."""

from __future__ import annotations

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import Builder, StateType, get_op, tensor, verify


def test_types_and_references():
    b = Builder()
    f = b.function("main")
    cache = f.input("cache", StateType(tensor("fp16", [1, 4, 1, 8])))
    x = f.input("x", tensor("fp16", [1, 4, 1, 8]))
    old = f.read_state(input=cache)
    new = f.coreml_update_state(state=cache, value=f.add(x=old, y=x))
    f.output(new)
    prog = verify(b.build())
    assert str(prog.main.ops[0].outputs[0].type) == "tensor<fp16, [1, 4, 1, 8]>"
    v = np.arange(32, dtype=np.float32).reshape(1, 4, 1, 8)
    (read,) = get_op("read_state").run({"input": v})
    (stored,) = get_op("coreml_update_state").run({"state": np.zeros_like(v), "value": v + 1})
    np.testing.assert_array_equal(read, v)
    np.testing.assert_array_equal(stored, v + 1)
    assert read is not v  # a copy: later writes to the state do not change what was read


def test_refusals_name_the_op():
    b = Builder()
    f = b.function("main")
    cache = f.input("cache", StateType(tensor("fp16", [1, 4, 1, 8])))
    x = f.input("x", tensor("fp16", [1, 4, 1, 8]))
    with pytest.raises(MilTypeError, match=r"\[read_state\].*state<tensor"):
        f.read_state(input=x)
    with pytest.raises(MilTypeError, match=r"\[coreml_update_state\].*does not match"):
        f.coreml_update_state(state=cache, value=f.input("y", tensor("fp16", [1, 4, 1, 4])))
