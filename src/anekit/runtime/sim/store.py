"""How the simulator holds a value between ops: stored in its declared dtype, rounded as the engine rounds.

fp16 values are rounded to nearest even (overflow to inf) and held in float32, bf16 likewise; precision
``"fp32"`` keeps every float value in float32. Ops that only move values (``VALUE_MOVING_OPS``) are stored
as they come when every float in and out has one dtype. The memory layout of a stored value is kept as it
has always been (``C_LAYOUT_FROM``), because it decides how numpy's matmul accumulates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anekit import jit
from anekit.fp16 import _round_fp16_fast, round_to_bf16, round_to_fp16
from anekit.mil import types as T
from anekit.mil.ir import Op

Store = Callable[[Any], np.ndarray]


def store_fn(dt: T.DType, precision: str) -> Store:
    """How a value of dtype ``dt`` is held between ops (the rounding of the simulated hardware)."""
    if dt.kind == "float":
        if precision == "fp32" or dt.name == "fp32":
            return lambda v: np.asarray(v, dtype=np.float32)
        # References compute on float32 operands; a float64 result (rare) is rounded to float32 first.
        if dt.name == "fp16":
            return store_fp16
        if dt.name == "bf16":
            return lambda v: round_to_bf16(np.asarray(v, dtype=np.float32))
        return lambda v: np.asarray(v, dtype=np.float64)
    if dt.kind == "string":
        return lambda v: np.asarray(v, dtype=object)
    storage = dt.np
    return lambda v: np.asarray(v).astype(storage)


SMALL = 2048  # below this many elements numpy's own casts cost less than the fast path's fixed calls


# Memory layout of stored fp16 values, kept as it has always been because it decides how numpy's matmul
# accumulates (BLAS or its own loop): C-contiguous from this many elements on, the op result's own
# element order below it.
C_LAYOUT_FROM = 4096


def store_fp16(v: Any) -> np.ndarray:
    """Round to fp16 values held in float32 (round to nearest even, overflow to inf)."""
    if isinstance(v, np.ndarray) and v.dtype == np.float16:  # already fp16 values: widening is exact
        return v.astype(np.float32) if v.size < C_LAYOUT_FROM else v.astype(np.float32, order="C")
    a = np.asarray(v, dtype=np.float32)
    out = np.empty(a.shape, np.float32) if a.size >= C_LAYOUT_FROM else np.empty_like(a)
    if jit.round_fp16_into(a, out):
        return out
    if a.size < SMALL:  # same values as round_to_fp16 (NaN stays NaN), less fixed cost
        return a.astype(np.float16).astype(np.float32)
    return round_to_fp16(a, out=out)


def store_fp16_result(v: Any, inputs: tuple[Any, ...]) -> np.ndarray:
    """``store_fp16`` of an op's result, rounding in place when the result is a fresh float32 array.

    In place only when nothing else can see the array: it owns its data and is none of the op's inputs
    (a reference may hand an input back). Same values and layout as ``store_fp16``.
    """
    if type(v) is np.ndarray and v.dtype == np.float32 and fresh(v, inputs):
        if jit.round_fp16_inplace(v):
            return v
        if v.size < SMALL:
            return store_fp16(v)
        if _round_fp16_fast(v, v) is not None:
            return v
        return round_to_fp16(v, out=v)
    return store_fp16(v)


def fresh(v: np.ndarray, inputs: tuple[Any, ...]) -> bool:
    """True if ``v`` owns writeable data laid out as a store would lay it out, and is none of ``inputs``."""
    flags = v.flags
    if not (flags.owndata and flags.writeable and (v.size < C_LAYOUT_FROM or flags.c_contiguous)):
        return False
    return all(v is not x for x in inputs)


def moved(v: np.ndarray) -> np.ndarray:
    """A moved value as the store would have laid it out (its values are already rounded)."""
    return np.ascontiguousarray(v) if v.size >= C_LAYOUT_FROM else v


# Ops whose outputs are input values moved around, never computed: with every float input already held in
# the output's dtype they need no rounding (it would give back the same bits).
VALUE_MOVING_OPS = frozenset(
    {
        "reshape", "transpose", "expand_dims", "squeeze", "flatten2d", "concat", "split", "stack",
        "slice_by_size", "slice_by_index", "tile", "reverse", "identity", "depth_to_space",
        "space_to_depth", "pixel_shuffle",
    }
)  # fmt: skip


def moves_values_only(op: Op, out_types: tuple[T.Type, ...]) -> bool:
    """True if ``op`` only moves values and every float tensor in and out has one dtype."""
    if op.op_type not in VALUE_MOVING_OPS:
        return False
    dtypes = set()
    for arg in op.inputs.values():
        for item in arg if isinstance(arg, tuple) else (arg,):
            t = item.type
            if isinstance(t, (T.TensorType, T.TensorBufferType)) and t.dtype.kind == "float":
                dtypes.add(t.dtype.name)
    for t in out_types:
        if not isinstance(t, T.TensorType) or t.dtype.kind != "float":
            return False
        dtypes.add(t.dtype.name)
    return len(dtypes) == 1


def store_for(t: T.Type, precision: str) -> Store:
    if isinstance(t, (T.TensorType, T.TensorBufferType)):
        return store_fn(t.dtype, precision)
    return np.asarray
