"""State ops of stateful (iOS18) functions: read a state, write a state.

A ``state<tensor<...>>`` function input is a buffer the runtime keeps across calls (CoreML's MLState;
anekit's simulator: ``kernel.states``). apple/coremltools ``converters/mil/mil/ops/defs/iOS18/states.py``
(read_state) and ``defs/coreml_dialect/ops.py`` (coreml_update_state) define the two ops.

The references see the state as the runtime's buffer itself (a numpy array, not a copy): ``read_state``
returns a copy of its contents, ``coreml_update_state`` writes into it. This is the only place where an
op reference has a side effect; the simulator runs the ops of a function in program order, so a read
after an update in the same call sees the update.
"""

from __future__ import annotations

import numpy as np

from anekit.mil import types as T
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op

# coreml_update_state's value dtypes (coremltools defs/coreml_dialect/ops.py).
UPDATE_T = frozenset({"fp16", "fp32", "int8", "int16", "int32", "uint8", "uint16", "bool"})


def _wrapped(a: InferArgs, name: str) -> T.TensorType:
    t = a.type(name)
    if not isinstance(t, T.StateType):
        raise a.error(f"input '{name}' must be a state, got {t}")
    if not isinstance(t.wrapped, T.TensorType):
        raise a.error(f"state '{name}' must wrap a tensor, got {t.wrapped}")
    return t.wrapped


@register_op
class read_state(OpDef):
    """read_state(input) (iOS18): a copy of the tensor held by the state ``input``.

    input: state<ST>, ST a tensor type. Output: ST.
    """

    inputs = {"input": Input()}

    def infer(self, a: InferArgs) -> T.Type:
        return _wrapped(a, "input")

    def reference(self, a: RefArgs) -> np.ndarray:
        return np.array(a["input"], copy=True)


@register_op
class coreml_update_state(OpDef):
    """coreml_update_state(state, value) (iOS18, CoreML dialect): store ``value`` in ``state``; the output
    is a copy of ``value`` (write_state followed by read_state).

    state: state<ST>, ST a tensor type. value: ST exactly (dtype and shape), dtype in {fp16, fp32, int8,
    int16, int32, uint8, uint16, bool}. Output: ST.
    """

    inputs = {"state": Input(), "value": Input(UPDATE_T)}

    def infer(self, a: InferArgs) -> T.Type:
        wrapped = _wrapped(a, "state")
        value = a.tensor("value")
        if value != wrapped:
            raise a.error(f"value {value} does not match the state's type {wrapped}")
        return wrapped

    def reference(self, a: RefArgs) -> np.ndarray:
        buf, value = a["state"], np.asarray(a["value"])
        if not isinstance(buf, np.ndarray) or not buf.flags.writeable:
            raise ValueError("the state is not a writable buffer held by the runtime")
        buf[...] = value.reshape(buf.shape)
        return np.array(buf, copy=True)
