"""The MIL text printer: emits the canonical text the ANE in-memory compiler takes.

Canonical form (what coremlc writes into model.mil)::

    program(1.3)
    [buildInfo = dict<string, string>({{"coremltools-version", "9.0"}})]
    {
        func main<ios18>(tensor<fp16, [1, 64, 1, 16]> x) {
                tensor<fp16, [1, 64, 1, 16]> y = relu(x = x)[name = string("y")];
            } -> (y);
    }

Functions are indented 4 spaces, statements 12, the closing ``} -> (...)`` 8. Op inputs and attributes
are printed sorted by name. Floating-point values print as C hex floats (``0x1.5p-17``: exact); inside a
dict literal they print as shortest-round-trip decimals (``0.0046742807655237523``), as coremlc does.
Programs of version 1.0 spell scalars ``tensor<fp16, []>`` (BLOBFILE's path and offset included);
later versions spell them ``fp16``. Text ends with a newline.

``print_program(p, dialect="ios16")`` writes the program in the older verbose dialect (``program(1.0)``,
``func main<ios16>``, tensor-spelled scalars) that M1 / M2 engines are reported to need, refusing ops
the iOS16 opset does not have; ``dialect="ios18"`` writes ``program(1.3)`` / ``<ios18>``. Without a
dialect the program is printed as it is (its own version and opsets). See ``anekit.mil.dialect``.
"""

from __future__ import annotations

import math

import numpy as np

from anekit.mil import types as T
from anekit.mil.dialect import require
from anekit.mil.ir import Arg, Function, Op, Program, Var
from anekit.mil.values import BlobRef, Literal

FUNC_INDENT = "    "
STMT_INDENT = "            "
CLOSE_INDENT = "        "


def scalar_style_for(version: str) -> str:
    """How a program of this version spells scalar types: "tensor" for 1.0, "scalar" after."""
    return "tensor" if version.strip() == "1.0" else "scalar"


def format_float(value: float) -> str:
    """A C99 ``%a`` hex float: ``0x1p+0``, ``-0x1.8p+1``, ``0x0p+0``, ``inf``, ``nan``."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = float(value).hex()  # e.g. '0x1.5000000000000p-17'
    sign = "-" if text.startswith("-") else ""
    mantissa, exponent = text.lstrip("-")[2:].split("p")
    whole, _, frac = mantissa.partition(".")
    frac = frac.rstrip("0")
    body = f"{whole}.{frac}" if frac else whole
    exp = int(exponent)
    if whole == "0" and not frac:
        exp = 0
    return f"{sign}0x{body}p{exp:+d}"


def format_decimal(value: float, dt: T.DType) -> str:
    """Shortest decimal that round-trips at the dtype's precision (``%.17g`` for fp64)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    digits = {64: 17, 32: 9}.get(dt.bits, 5)
    return f"{value:.{digits}g}"


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def _element(v: object, dt: T.DType, in_dict: bool = False) -> str:
    if dt.kind == "string":
        return _quote(str(v))
    if dt.kind == "bool":
        return "true" if v else "false"
    if dt.kind == "float":
        f = float(v)  # type: ignore[arg-type]
        return format_decimal(f, dt) if in_dict else format_float(f)
    return str(int(v))  # type: ignore[call-overload]


def _payload(lit: Literal, style: str, in_dict: bool = False) -> str:
    """The text inside ``TYPE(...)`` for a literal."""
    t, v = lit.type, lit.value
    if isinstance(v, BlobRef):
        path = f"{T.format_type(T.TensorType(T.string, ()), style)}({_quote(v.path)})"
        offset = f"{T.format_type(T.TensorType(T.uint64, ()), style)}({v.offset})"
        return f"BLOBFILE(path = {path}, offset = {offset})"
    if isinstance(t, T.TensorType):
        assert isinstance(v, np.ndarray)
        if v.ndim == 0:
            return _element(v.item(), t.dtype, in_dict)
        flat = v.ravel().tolist()
        return "[" + ", ".join(_element(x, t.dtype, in_dict) for x in flat) + "]"
    if isinstance(t, T.ListType):
        return "[" + ", ".join(_payload(e, style, in_dict) for e in v) + "]"  # type: ignore[union-attr]
    if isinstance(t, T.DictType):
        pairs = (f"{{{_payload(k, style, True)}, {_payload(x, style, True)}}}" for k, x in v)  # type: ignore
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"cannot print a literal of type {t}")


def format_literal(lit: Literal, style: str = "scalar") -> str:
    """``tensor<int32, [2]>([1, 1])``, ``fp16(0x1p+0)``, ``dict<string, string>({{"a", "b"}})``."""
    return f"{T.format_type(lit.type, style)}({_payload(lit, style)})"


def _arg(a: Arg, style: str) -> str:
    if isinstance(a, Var):
        return a.name
    if isinstance(a, Literal):
        return format_literal(a, style)
    return "(" + ", ".join(_arg(x, style) for x in a) + ")"


def _attrs(attributes: dict[str, Literal], style: str) -> str:
    if not attributes:
        return ""
    body = ", ".join(f"{k} = {format_literal(attributes[k], style)}" for k in sorted(attributes))
    return f"[{body}]"


def format_op(op: Op, style: str = "scalar") -> str:
    """One statement, without indentation: ``tensor<...> y = relu(x = x)[name = string("y")];``"""
    outs = ", ".join(f"{T.format_type(v.type, style)} {v.name}" for v in op.outputs)
    version = f"<{op.version}>" if op.version else ""
    args = ", ".join(f"{k} = {_arg(op.inputs[k], style)}" for k in sorted(op.inputs))
    return f"{outs} = {op.op_type}{version}({args}){_attrs(op.attributes, style)};"


def format_function(fn: Function, style: str = "scalar", opset: str | None = None) -> str:
    """One function; ``opset`` replaces the function's own (a dialect's opset)."""
    ins = ", ".join(f"{T.format_type(v.type, style)} {v.name}" for v in fn.inputs)
    attrs = _attrs(fn.attributes, style)
    opset = opset or fn.opset
    opset = f"<{opset}>" if opset else ""
    head = f"{FUNC_INDENT}func {fn.name}{opset}({ins}){' ' + attrs if attrs else ''} {{\n"
    body = "".join(f"{STMT_INDENT}{format_op(op, style)}\n" for op in fn.ops)
    outs = ", ".join(v.name for v in fn.outputs)
    return f"{head}{body}{CLOSE_INDENT}}} -> ({outs});\n"


def print_program(prog: Program, dialect: str | None = None) -> str:
    """The canonical MIL text of a program; in ``dialect`` ("ios16" or "ios18") when one is given.

    A dialect rewrites the version header and every function's opset; a program that uses what the
    dialect lacks raises MilDialectError naming the op (or type) and the dialect.
    """
    version, opset = prog.version, None
    if dialect is not None:
        d = require(prog, dialect)
        version, opset = d.version, d.opset
    style = scalar_style_for(version)
    parts = [f"program({version})\n"]
    if prog.attributes:
        parts.append(_attrs(prog.attributes, style) + "\n")
    parts.append("{\n")
    parts.extend(format_function(fn, style, opset) for fn in prog.functions.values())
    parts.append("}\n")
    return "".join(parts)
