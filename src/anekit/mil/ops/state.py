"""State ops of iOS18 stateful functions: read a ``state<tensor<...>>`` input, and write it back.

A function input of type ``state<tensor<fp16, S>>`` is a tensor the runtime keeps between calls (CoreML's
MLState, law 8 of the empirical-laws reference). In a CoreML package ``coreml_update_state`` is stored
as the pair ``write_state(input, data)`` + ``read_state(input)`` (coremltools
``converters/mil/backend/mil/load.py``, ``translate_coreml_update_state_op``); ``anekit.coreml`` writes
and reads that pair. The references are value-level: they give the value read or written; keeping the
state between calls is the runtime's business.
"""

from __future__ import annotations

import numpy as np

from anekit.mil import types as T
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op


def _state_tensor(a: InferArgs, name: str) -> T.TensorType:
    t = a.type(name)
    if not isinstance(t, T.StateType) or not isinstance(t.wrapped, T.TensorType):
        raise a.error(f"input '{name}' must be a state<tensor<...>>, got {t}")
    return t.wrapped


@register_op
class read_state(OpDef):
    """read_state(input): the tensor a state holds. input: state<tensor<T, S>>; output tensor<T, S>."""

    inputs = {"input": Input()}

    def infer(self, a: InferArgs) -> T.Type:
        return _state_tensor(a, "input")

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.array(a["input"], copy=True)


@register_op
class coreml_update_state(OpDef):
    """coreml_update_state(state, value): store ``value`` in ``state`` and return it.

    state: state<tensor<T, S>>; value: tensor<T, S> (same dtype and shape); output tensor<T, S>.
    """

    inputs = {"state": Input(), "value": Input()}

    def infer(self, a: InferArgs) -> T.Type:
        wrapped = _state_tensor(a, "state")
        value = a.tensor("value")
        if value != wrapped:
            raise a.error(f"value {value} does not match the state's tensor {wrapped}")
        return wrapped

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.array(a["value"], copy=True)
