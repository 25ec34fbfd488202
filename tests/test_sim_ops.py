"""Every op of the registry runs in the simulator and matches an independent float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.mil import tensor
from anekit.mil.registry import known_ops
from tests.sim_cases import SimCase, all_cases

CASES = all_cases()
# Ops a single-op program cannot exercise on its own: const is every program's constant, and a
# tensor_buffer input only exists in whole programs (tests/test_runtime.py runs one).
# State ops read a state<...> input, which no surface carries alone: tests/test_ops_state.py covers them.
NOT_RUNNABLE_ALONE = {"const", "tensor_buffer_to_tensor", "read_state", "coreml_update_state"}


def _input_dtype(a: np.ndarray, case: SimCase) -> str:
    if a.dtype == np.bool_:
        return "bool"
    if a.dtype.kind in "iu":  # narrow integer activations keep their type (e.g. int8 for dequantize)
        return {"int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16"}.get(
            a.dtype.name, "int32"
        )
    return case.dtype


def _build(case: SimCase) -> tuple[mil.Program, dict[str, np.ndarray]]:
    b = mil.Builder()
    f = b.function(opset=case.opset)
    feeds: dict[str, np.ndarray] = {}
    args: dict = {}
    for key, value in case.inputs.items():
        if isinstance(value, list):
            vars_ = []
            for i, item in enumerate(value):
                a = np.asarray(item)
                vars_.append(f.input(f"{key}_{i}", tensor(_input_dtype(a, case), a.shape)))
                feeds[f"{key}_{i}"] = a
            args[key] = tuple(vars_)
        else:
            a = np.asarray(value)
            args[key] = f.input(key, tensor(_input_dtype(a, case), a.shape))
            feeds[key] = a
    out = f.op(case.op, **args, **case.params)
    outs = out if isinstance(out, tuple) else (out,)
    f.output(*outs)
    return b.build(), feeds


def _as_stored(a: np.ndarray, dtype: str) -> np.ndarray:
    if a.dtype.kind == "f":
        return a.astype(np.float16 if dtype == "fp16" else np.float32).astype(np.float64)
    return a


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_runs_in_the_simulator_and_matches_float64(case):
    prog, feeds = _build(case)
    kernel = runtime.open("sim", numerics="ieee", strict=False).compile(prog)  # op numerics in any shape
    with kernel:
        got = kernel(**feeds)
    stored = {
        k: [_as_stored(np.asarray(x), case.dtype) for x in v]
        if isinstance(v, list)
        else _as_stored(np.asarray(v), case.dtype)
        for k, v in case.inputs.items()
    }
    expected = case.expected(**stored, **case.params)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(expected) == len(kernel.output_names)
    for name, want in zip(kernel.output_names, expected):
        want = np.asarray(want)
        have = got[name]
        assert have.shape == want.shape, f"{name}: shape {have.shape} != {want.shape}"
        if want.dtype.kind in "biu":
            np.testing.assert_array_equal(have, want)
        else:
            np.testing.assert_allclose(have, want, rtol=case.rtol, atol=case.atol, equal_nan=True)


def test_every_registered_op_has_a_simulator_case():
    covered = {c.op for c in CASES}
    missing = sorted(set(known_ops()) - covered - NOT_RUNNABLE_ALONE)
    assert not missing, f"ops without a simulator case: {missing}"
