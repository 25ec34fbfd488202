"""The MIL builder: Python calls -> IR, with automatic names and eager type inference.

    b = Builder()
    f = b.function("main", opset="ios18")
    x = f.input("x", tensor("fp16", [1, 64, 1, 16]))
    y = f.relu(x=f.mul(x=x, y=0.5))
    f.output(y)
    program = b.build()

or, for one function, the decorator form::

    @program(inputs={"x": tensor("fp16", [1, 64, 1, 16])})
    def prog(f, x):
        return f.relu(x=x)

Every call checks its inputs against the op's spec and infers the output types right away, so a
shape error is raised at the call that caused it, naming the op and its input types. Python and
numpy values passed as inputs become named ``const`` ops. Python floats, numpy float scalars and
float64 arrays take the dtype of the op's first float tensor input (fp32 when there is none), so
``mul(x=fp16_tensor, y=0.5)`` makes an fp16 constant; float32 / float16 arrays keep their dtype;
Python ints and int64 arrays become int32. Pass a Literal (or ``f.const(value, dtype=...)``) to
choose a dtype explicitly.

With ``Builder(blob_storage=True, blob_threshold=4096)`` the builder tracks large constants as weights
while the program is built (the "builder option" of the CoreML weight-blob spec): every const whose data
takes at least ``blob_threshold`` bytes is appended to one in-memory MILBlob file as it is created, and
the const refers to it as ``BLOBFILE(@model_path/weights/weight.bin, offset)``; smaller ones stay inline.
``b.weights`` is then ``{"@model_path/weights/weight.bin": bytes}`` — what a backend's ``compile`` and
``anekit.coreml.save_mlpackage(..., weights=b.weights, blob_threshold=None)`` take. The program holds
no second copy of the data.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from anekit.errors import MilVerifyError
from anekit.mil import types as T
from anekit.mil.ir import DEFAULT_OPSET, DEFAULT_PROGRAM_VERSION, Arg, Block, Function, Op, Program, Var
from anekit.mil.registry import get_op
from anekit.mil.values import Literal, blob_literal, build_info, from_python, string_literal

# The header the ANE training kernels use; the in-memory compiler accepts it.
DEFAULT_BUILD_INFO = {
    "coremlc-component-MIL": "3510.2.1",
    "coremlc-version": "3505.4.1",
    "coremltools-component-milinternal": "",
    "coremltools-version": "9.0",
}

_NAME = re.compile(r"[A-Za-z_]\w*\Z")


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise MilVerifyError(
            [f"'{name}' is not a valid MIL name (letters, digits, '_'; not starting with a digit)"]
        )
    return name


BLOB_WEIGHT_PATH = "@model_path/weights/weight.bin"
# Dtypes the weight file takes: every MILBlob dtype from iOS18, only these four before (coremltools
# converters/mil/backend/mil/load.py should_use_weight_file).
_BLOB_DTYPES = frozenset(
    {"fp16", "fp32", "uint8", "int8", "bf16", "int16", "uint16", "int32", "uint32"}
    | {"int4", "uint1", "uint2", "uint3", "uint4", "uint6"}
)
_PRE_IOS18_BLOB_DTYPES = frozenset({"fp16", "fp32", "uint8", "int8"})


def weight_file_dtypes(opset: str) -> frozenset[str]:
    """The dtypes a const of a function of ``opset`` may keep in a weight file (BlobFileValue)."""
    return _PRE_IOS18_BLOB_DTYPES if opset in ("ios15", "ios16", "ios17") else _BLOB_DTYPES


class _WeightTracker:
    """The constants a builder keeps as weights: one MILBlob file, in memory, appended as consts come."""

    def __init__(self, threshold: int) -> None:
        import io

        from anekit.blob import _BlobStream  # the blob layer writes the file; imported only when asked for

        self.threshold = threshold
        self._buf = io.BytesIO()
        self._stream = _BlobStream(self._buf)

    def track(self, lit: Literal, opset: str) -> Literal:
        t, value = lit.type, lit.value
        if not isinstance(t, T.TensorType) or not t.is_static or not isinstance(value, np.ndarray):
            return lit
        allowed = weight_file_dtypes(opset)
        nbytes = -(-(t.numel or 0) * t.dtype.bits // 8)
        if t.dtype.name not in allowed or nbytes < self.threshold:
            return lit
        if t.dtype.name == "bf16":  # held as float32 values already rounded to bf16: store their bits
            from anekit.fp16 import f32_to_bf16_bits

            value = f32_to_bf16_bits(value)
        offset = self._stream.append(value, t.dtype.name)
        return blob_literal(t, BLOB_WEIGHT_PATH, offset)

    def weights(self) -> dict[str, bytes]:
        self._stream._finish()
        return {BLOB_WEIGHT_PATH: self._buf.getvalue()} if self._stream.count else {}


class FunctionBuilder:
    """Builds one function; every registered op is a method: ``f.conv(x=..., weight=...)``."""

    def __init__(self, fn: Function, tracker: _WeightTracker | None = None) -> None:
        self.fn = fn
        self._tracker = tracker
        self._names: set[str] = {v.name for v in fn.inputs}
        self._counters: dict[str, int] = {}

    # -- names ---------------------------------------------------------------------------------

    def _fresh(self, base: str) -> str:
        n = self._counters.get(base, 0)
        while f"{base}_{n}" in self._names:
            n += 1
        self._counters[base] = n + 1
        return f"{base}_{n}"

    def _claim(self, name: str | None, base: str) -> str:
        if name is None:
            name = self._fresh(base)
        _check_name(name)
        if name in self._names:
            raise MilVerifyError([f"name '{name}' is already used in function '{self.fn.name}'"])
        self._names.add(name)
        return name

    # -- inputs, constants, outputs --------------------------------------------------------------

    def input(self, name: str, type_: T.Type) -> Var:
        """Declare a function input."""
        v = Var(self._claim(name, "input"), type_)
        self.fn.inputs.append(v)
        return v

    def const(self, value: Any, name: str | None = None, dtype: str | None = None) -> Var:
        """A ``const`` op holding ``value`` (a Literal, or a Python / numpy value; ``dtype`` forces one)."""
        if isinstance(value, Literal):
            lit = value
        elif dtype is not None:
            from anekit.mil.values import tensor_literal

            lit = tensor_literal(dtype, value)
        else:
            lit = from_python(value)
        if self._tracker is not None:
            lit = self._tracker.track(lit, self.fn.opset)
        out = Var(self._claim(name, "const"), lit.type)
        attrs = {"name": string_literal(out.name), "val": lit}
        self.fn.block.ops.append(Op("const", {}, [out], attrs))
        return out

    def weight(self, type_: T.TensorType, path: str, offset: int, name: str | None = None) -> Var:
        """A ``const`` whose value is a BLOBFILE reference (``offset`` of the blob's metadata record)."""
        return self.const(blob_literal(type_, path, offset), name=name)

    def conv1x1(self, x: Var, weight: Var, name: str | None = None) -> Var:
        """A pointwise ``conv`` (stride 1, no padding, one group): the engine's dense layer."""
        return self.conv(
            x=x,
            weight=weight,
            strides=[1, 1],
            pad_type="valid",
            pad=[0, 0, 0, 0],
            dilations=[1, 1],
            groups=1,
            name=name,
        )

    def output(self, *vars_: Var) -> None:
        """Set the function's outputs."""
        for v in vars_:
            if not isinstance(v, Var):
                raise MilVerifyError([f"function outputs must be variables, got {type(v).__name__}"])
        self.fn.block.outputs = list(vars_)

    # -- ops ---------------------------------------------------------------------------------------

    def op(
        self,
        op_type: str,
        *,
        name: str | None = None,
        version: str | None = None,
        attributes: dict[str, Literal] | None = None,
        **inputs: Any,
    ) -> Any:
        """Add an op; returns its output Var (a tuple of Vars for several outputs)."""
        opdef = get_op(op_type)
        float_dtype = self._float_dtype(inputs)
        base = name if name is not None else op_type
        given = [k for k, v in inputs.items() if v is not None]
        # The iOS16 / iOS17 constexpr forms carry their parameters as attributes (``Form``).
        as_attributes = any(
            f.place == "attributes" and self.fn.opset in f.opsets and f.fits("attributes", given)
            for f in opdef.forms
        )
        args: dict[str, Arg] = {}
        params: dict[str, Literal] = {}  # the parameters, when the op's form carries them as attributes
        for key in given:
            value = inputs[key]
            if as_attributes:
                params[key] = value if isinstance(value, Literal) else from_python(value, float_dtype)
            else:
                args[key] = self._arg(value, f"{base}_{key}" if name else None, float_dtype)
        where = f"{name or op_type}"
        out_types = opdef.type_outputs({**args, **params}, where)
        out_name = self._claim(name, op_type)
        if len(out_types) == 1:
            outputs = [Var(out_name, out_types[0])]
        else:
            outputs = [Var(self._claim(f"{out_name}_{i}", op_type), t) for i, t in enumerate(out_types)]
        attrs = {"name": string_literal(out_name)}
        attrs.update(attributes or {})
        attrs.update(params)
        self.fn.block.ops.append(Op(op_type, args, outputs, attrs, version=version))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        get_op(op_type)  # an unknown op is an UnknownOpError naming it

        def call(**kwargs: Any) -> Any:
            return self.op(op_type, **kwargs)

        call.__name__ = op_type
        return call

    def _float_dtype(self, inputs: dict[str, Any]) -> str:
        for v in inputs.values():
            items = v if isinstance(v, (tuple, list)) else (v,)
            for item in items:
                if isinstance(item, Var) and isinstance(item.type, T.TensorType) and item.type.dtype.is_float:
                    return item.type.dtype.name
        return "fp32"

    def _arg(self, value: Any, name: str | None, float_dtype: str) -> Arg:
        if isinstance(value, Var):
            return value
        if isinstance(value, tuple) or (
            isinstance(value, list) and value and all(isinstance(x, Var) for x in value)
        ):
            return tuple(self._arg(x, None, float_dtype) for x in value)
        lit = value if isinstance(value, Literal) else from_python(value, float_dtype)
        return self.const(lit, name=name)


class Builder:
    """Builds a Program of one or more functions (``blob_storage``: keep large consts as weights)."""

    def __init__(
        self,
        version: str = DEFAULT_PROGRAM_VERSION,
        build: dict[str, str] | None = None,
        *,
        blob_storage: bool = False,
        blob_threshold: int = 1024,
    ) -> None:
        info = DEFAULT_BUILD_INFO if build is None else build
        attrs = {"buildInfo": build_info(info)} if info else {}
        self.prog = Program(version=version, attributes=attrs)
        if blob_threshold < 0:
            raise ValueError(f"blob_threshold must be >= 0, got {blob_threshold}")
        self.blob_threshold = blob_threshold
        self._tracker = _WeightTracker(blob_threshold) if blob_storage else None

    @property
    def weights(self) -> dict[str, bytes]:
        """The weight file of the tracked consts (``{}`` without ``blob_storage`` or when none was large)."""
        return self._tracker.weights() if self._tracker is not None else {}

    def function(self, name: str = "main", opset: str = DEFAULT_OPSET) -> FunctionBuilder:
        _check_name(name)
        if name in self.prog.functions:
            raise MilVerifyError([f"function '{name}' is already defined"])
        fn = Function(name, [], Block(), opset=opset)
        self.prog.add_function(fn)
        return FunctionBuilder(fn, self._tracker)

    def build(self) -> Program:
        for fn in self.prog.functions.values():
            if not fn.outputs:
                raise MilVerifyError([f"function '{fn.name}' has no outputs: call output(...)"])
        return self.prog


def program(
    inputs: dict[str, T.Type],
    opset: str = DEFAULT_OPSET,
    name: str = "main",
    version: str = DEFAULT_PROGRAM_VERSION,
) -> Callable[[Callable[..., Any]], Program]:
    """Decorator: the function body builds ``main``; its return value (Var or tuple) is the output."""

    def wrap(body: Callable[..., Any]) -> Program:
        b = Builder(version=version)
        f = b.function(name, opset=opset)
        args = [f.input(k, t) for k, t in inputs.items()]
        result = body(f, *args)
        outs: Sequence[Var] = result if isinstance(result, (tuple, list)) else (result,)
        f.output(*outs)
        return b.build()

    return wrap
