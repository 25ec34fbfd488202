"""State ops (read_state, coreml_update_state): type rules, text round trip, buffers held across runs."""

from __future__ import annotations

import numpy as np
import pytest

from anekit.errors import MilTypeError
from anekit.mil import Builder
from anekit.mil import types as T
from anekit.mil.parser import parse_program
from anekit.runtime.sim import SimBackend

STATE = T.StateType(T.tensor("fp16", [1, 4, 1, 32]))


def accumulator() -> object:
    """acc += x each call; returns the new total times 2."""
    b = Builder()
    f = b.function("step")
    acc = f.input("acc", STATE)
    x = f.input("x", T.tensor("fp16", [1, 4, 1, 32]))
    total = f.add(x=f.read_state(input=acc), y=x)
    stored = f.coreml_update_state(state=acc, value=total)
    f.output(f.mul(x=stored, y=2.0, name="out"))
    return b.build()


def test_state_program_round_trips_through_text() -> None:
    prog = accumulator()
    assert parse_program(str(prog)) == prog
    assert "state<tensor<fp16, [1, 4, 1, 32]>> acc" in str(prog)


def test_kernel_holds_the_state_across_runs() -> None:
    kernel = SimBackend().compile(accumulator(), function="step")
    assert kernel.input_names == ["x"] and list(kernel.states) == ["acc"]
    assert not kernel.states["acc"].any()  # a new state is zero
    x = np.arange(128, dtype=np.float32).reshape(1, 4, 1, 32) / 8
    for n in range(1, 4):
        out = kernel(x=x)["out"]
        np.testing.assert_array_equal(kernel.states["acc"], n * x)
        np.testing.assert_array_equal(out, 2 * n * x)


def test_kernels_share_states_by_sharing_the_dict() -> None:
    prog = accumulator()
    a = SimBackend().compile(prog, function="step")
    b = SimBackend().compile(prog, function="step")
    b.states = a.states
    one = np.ones((1, 4, 1, 32), np.float32)
    a(x=one)
    b(x=one)
    np.testing.assert_array_equal(a.states["acc"], 2 * one)


def test_update_state_value_must_match_the_state() -> None:
    b = Builder()
    f = b.function("main")
    acc = f.input("acc", STATE)
    with pytest.raises(MilTypeError, match="does not match"):
        f.coreml_update_state(state=acc, value=np.zeros((1, 4, 1, 32), np.float32))


def test_read_state_needs_a_state() -> None:
    b = Builder()
    f = b.function("main")
    x = f.input("x", T.tensor("fp16", [1, 4, 1, 32]))
    with pytest.raises(MilTypeError, match="must be a state"):
        f.read_state(input=x)
