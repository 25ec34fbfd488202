"""The ``const`` op: a value held in the op's ``val`` attribute (inline or a BLOBFILE reference)."""

from __future__ import annotations

from typing import Any

from anekit.mil import types as T
from anekit.mil.registry import InferArgs, OpDef, RefArgs, register_op


@register_op
class const(OpDef):
    """const()[name = string("w"), val = <literal>]: no inputs; the output has the literal's type.

    The value lives in the ``val`` attribute, not in an input; builders and the parser type the
    output from that attribute, so ``infer`` is never asked for it.
    """

    inputs = {}

    def infer(self, a: InferArgs) -> T.Type:
        raise a.error("const takes its type from its 'val' attribute, not from inputs")

    def reference(self, a: RefArgs) -> Any:
        raise NotImplementedError("const values are read from the 'val' attribute")
