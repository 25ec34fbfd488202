"""Tensor-buffer ops of compiler-internal MIL: move between tensors and strided tensor buffers."""

from __future__ import annotations

import numpy as np

from anekit.mil import types as T
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op


@register_op
class tensor_buffer_to_tensor(OpDef):
    """tensor_buffer_to_tensor(input): the logical tensor held by a strided tensor buffer.

    input: tensor_buffer<T, shape=S, strides=..., interleave_factors=...>; output tensor<T, S>.
    The reference takes the buffer's logical contents (layout is a property of memory, not of values).
    """

    inputs = {"input": Input()}

    def infer(self, a: InferArgs) -> T.Type:
        t = a.type("input")
        if not isinstance(t, T.TensorBufferType):
            raise a.error(f"input 'input' must be a tensor_buffer, got {t}")
        return T.TensorType(t.dtype, t.shape)

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.asarray(a["input"])


@register_op
class tensor_to_tensor_buffer(OpDef):
    """tensor_to_tensor_buffer(input, strides, interleave_factors): a tensor placed in a strided buffer.

    input: tensor<T, S>; strides: int64 [rank]; interleave_factors: uint8 [rank] (default all 1).
    Output tensor_buffer<T, shape=S, strides, interleave_factors>; values are unchanged.
    """

    inputs = {
        "input": Input(),
        "strides": Input(T.INTS, rank=1, const=True),
        "interleave_factors": Input(T.INTS, rank=1, const=True, optional=True),
    }

    def infer(self, a: InferArgs) -> T.Type:
        t = a.tensor("input")
        strides = a.ints("strides")
        factors = a.ints("interleave_factors") if a.has("interleave_factors") else (1,) * t.rank
        for field, vals in (("strides", strides), ("interleave_factors", factors)):
            if len(vals) != t.rank:
                raise a.error(f"'{field}' has {len(vals)} entries; expected one per dimension ({t.rank})")
        return T.TensorBufferType(t.dtype, t.shape, strides, factors)

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.asarray(a["input"])
