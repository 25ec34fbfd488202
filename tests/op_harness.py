"""Test harness for op definitions: type an op from numpy inputs and run its numpy reference.

``infer_op("add", x=a, y=b)`` types the op with every input as a constant literal (so type rules that
need constants see them); ``var(dtype, shape)`` stands for a runtime input of that type. ``run_op``
types the op, runs its reference on the arrays exactly as given (float64 for tests), and checks the
output shapes against the inferred types.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anekit.mil import types as T
from anekit.mil.ir import Var
from anekit.mil.registry import get_op
from anekit.mil.values import Literal, from_python


def var(dtype: str, shape: tuple[T.Dim, ...] | list[T.Dim], name: str = "v") -> Var:
    """A non-constant input of the given type."""
    return Var(name, T.tensor(dtype, shape))


def _as_arg(value: Any, float_dtype: str) -> Any:
    if isinstance(value, (Var, Literal)):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], (np.ndarray, Var, Literal)):
        return tuple(_as_arg(v, float_dtype) for v in value)
    return from_python(value, float_dtype)


def infer_op(op: str, float_dtype: str = "fp32", **inputs: Any) -> tuple[T.Type, ...]:
    """The output types of ``op`` for these inputs (numpy arrays / Python values become literals)."""
    args = {k: _as_arg(v, float_dtype) for k, v in inputs.items()}
    return get_op(op).type_outputs(args)


def run_op(op: str, float_dtype: str = "fp32", **inputs: Any) -> tuple[np.ndarray, ...]:
    """Type ``op``, run its reference on the given arrays, and check output shapes against the types."""
    types = infer_op(op, float_dtype, **inputs)
    values = {
        k: tuple(np.asarray(x) for x in v)
        if isinstance(v, (tuple, list)) and v and isinstance(v[0], np.ndarray)
        else np.asarray(v)
        for k, v in inputs.items()
    }
    outs = get_op(op).run(values, types)
    assert len(outs) == len(types), f"{op}: {len(outs)} outputs, {len(types)} types"
    for o, t in zip(outs, types):
        if isinstance(t, T.TensorType) and t.is_static:
            assert tuple(np.shape(o)) == tuple(t.shape), (
                f"{op}: output shape {np.shape(o)} != inferred {t.shape}"
            )
    return outs
