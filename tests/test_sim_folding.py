"""Constant folding gives the same numbers as running the same ops on inputs: every folded value is
stored in its declared dtype (fp16 rounded, overflow to inf), exactly as a run stores it.

This compares the simulator's two paths with each other (the folding at compile time, the steps at run
time); what it proves is that folding adds no numerics of its own — the ops themselves are checked
against float64 elsewhere (tests/test_sim_ops.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.mil import tensor

SHAPE = [1, 64, 1, 32]
RNG = np.random.default_rng(0)
A = (RNG.standard_normal(SHAPE) * 300).astype(np.float16)  # products overflow fp16 in places
B = (RNG.standard_normal(SHAPE) * 300).astype(np.float16)


def _chain(f, x, a, b):
    """A few ops whose fp16 rounding shows: a * b (overflows), + 1/3, exp of a small value, then x."""
    ab = f.mul(x=a, y=b)
    third = f.add(x=f.mul(x=ab, y=1e-3), y=1.0 / 3.0)
    e = f.exp(x=f.mul(x=third, y=0.01))
    return f.add(x=f.mul(x=e, y=third), y=x)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_folded_constants_equal_the_same_program_with_the_constants_as_inputs(dtype):
    t = tensor(dtype, SHAPE)

    np_dtype = np.float16 if dtype == "fp16" else np.float32

    @mil.program(inputs={"x": t})
    def folded(f, x):
        return _chain(f, x, f.const(A.astype(np_dtype)), f.const(B.astype(np_dtype)))

    @mil.program(inputs={"x": t, "a": t, "b": t})
    def fed(f, x, a, b):
        return _chain(f, x, a, b)

    sim = runtime.open("sim", strict=False)  # fp32 I/O is not what the engine takes; numerics only
    k_folded, k_fed = sim.compile(folded), sim.compile(fed)
    assert len(k_folded.plan.steps) == 1  # everything but the final add with x was folded
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    got = next(iter(k_folded(x=x).values()))
    want = next(iter(k_fed(x=x, a=A, b=B).values()))
    np.testing.assert_array_equal(got, want)
    if dtype == "fp16":
        assert np.isinf(got).any()  # the overflow was kept, not computed in fp32
