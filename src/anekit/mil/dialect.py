"""MIL dialects: the ``program(1.3)`` / ``<ios18>`` text of current compilers and the older verbose
``program(1.0)`` / ``<ios16>`` text, which M1 / M2 engines are reported to need.

What differs between the two (each difference with the public text it comes from)::

                       ios18 (canonical)                     ios16 (verbose)
    header             program(1.3)                          program(1.0)
    function opset     func main<ios18>(...)                 func main<ios16>(...)
    scalars            string("x"), fp16(0x1p+0), int32(1)   tensor<string, []>("x"), tensor<fp16, []>(...)
    buildInfo          dict<string, string>(...)             dict<tensor<string, []>, tensor<string, []>>(...)
    BLOBFILE fields    path = string(...), offset =          path = tensor<string, []>(...), offset =
                       uint64(64)                            tensor<uint64, []>(64)
    ops                every registered op                   only ops of the iOS16 opset (OPS_SINCE below)
    types              + state<...>, tensor_buffer<...>,     tensor / list / dict / tuple of iOS16 dtypes
                       sub-byte dtypes (int4, uint1..uint6)

Sources: the header, opset, scalar and buildInfo spellings are those of coremlc's own ``model.mil`` for
an iOS16 target (corpus ``mil/coremltools-add_model.mil``: coremltools 8.1 / coremlc 3402) against
the iOS18 target (corpus ``mil/751k-hwx-model.mil``: coremltools 9.0 / coremlc 3600). The BLOBFILE
spelling is asserted by apple/coremltools' own multifunction tests (``validate_mil_text`` of the
``materialize_dynamic_shape_mlmodel`` tests: ``tensor<uint64, []>(64)`` for an iOS17 target,
``uint64(64)`` for iOS18), and hand-written program(1.0) generators that ran on M1 (e.g. the
Rust/Objective-C generators of the direct-ANE projects) write it that way too. That M1 / M2 need this
form is *reported*, not measured here: maderix/ANE pull request #6 ("Fix MIL syntax + M1/M2 support",
tested on an M1 Pro, macOS 26.3) says the shorthand scalar syntax only compiled on M4 and switches
to ``program(1.0)`` / ``<ios16>`` with ``tensor<string, []>`` scalars. The same report says the M1 / M2
engine cannot run ``cast``; that is an engine rule (the rule book's business), not a dialect one.

Printing in a dialect never changes what a program computes: it rewrites only the version header and
the function opsets, and refuses (``MilDialectError``, naming the op or type and the dialect) what the
older opset does not have, instead of writing text the compiler would reject.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from anekit.errors import MilDialectError, MilTypeError
from anekit.mil import types as T
from anekit.mil.ir import Arg, Function, Op, Program
from anekit.mil.registry import REGISTRY, OpDef, known_ops, op_arguments
from anekit.mil.values import Literal


@dataclass(frozen=True)
class Dialect:
    """How a dialect spells a program: its version header, opset and scalar style."""

    name: str
    version: str  # the ``program(...)`` header
    opset: str  # the ``func main<...>`` opset of every function
    scalar_style: str  # "tensor" (tensor<fp16, []>) or "scalar" (fp16)


DIALECTS: dict[str, Dialect] = {
    "ios18": Dialect("ios18", "1.3", "ios18", "scalar"),
    "ios16": Dialect("ios16", "1.0", "ios16", "tensor"),
}
OPSET_ORDER = ("ios15", "ios16", "ios17", "ios18")

# Ops anekit registers (or that appear in compiler output) that the iOS16 opset does not have, with
# the opset that introduced them: apple/coremltools ``converters/mil/mil/ops/defs/iOS17/`` (quantize,
# dequantize in quantization_ops.py) and ``defs/iOS18/`` (compression.py, states.py,
# tensor_transformation.py, transformers.py). tensor_buffer_to_tensor / tensor_to_tensor_buffer are
# compiler-internal ops that appear only as ``<ios17>`` in coremlc's dispatch dumps (corpus
# ``mil/751k-ctx-conv3x3.mil``). Ops defined in iOS15/16 and re-defined later with extra dtypes are
# not listed: their iOS16 form is a subset.
OPS_SINCE: dict[str, str] = {
    "quantize": "ios17",
    "dequantize": "ios17",
    "tensor_buffer_to_tensor": "ios17",
    "tensor_to_tensor_buffer": "ios17",
    "scaled_dot_product_attention": "ios18",
    "constexpr_blockwise_shift_scale": "ios18",
    "constexpr_lut_to_sparse": "ios18",
    "constexpr_sparse_blockwise_shift_scale": "ios18",
    "constexpr_cpu_blockwise_shift_scale": "ios18",
    "read_state": "ios18",
    "coreml_update_state": "ios18",
    "slice_update": "ios18",
}
# Ops whose iOS18 definition replaced the iOS16 one under the same name; anekit tells the two forms
# apart by their inputs (coremltools defs/iOS16/constexpr_ops.py vs defs/iOS18/compression.py): the
# iOS16 form has a ``shape`` input.
IOS16_FORM_INPUT = {"constexpr_lut_to_dense": "shape", "constexpr_sparse_to_dense": "shape"}
# Sub-byte dtypes arrived with the iOS18 compression ops (coremltools defs/iOS18/compression.py).
DTYPES_SINCE = dict.fromkeys(sorted(T.SUBBYTE), "ios18")

# Chips reported to need the verbose dialect: maderix/ANE pull request #6 (tested on an M1 Pro).
# Status "reported" (rule dialect.m1-m2 of the rule book); every other chip gets the canonical text,
# which is what maderix/ANE, Orion and anekit's kernels run on M3 / M4.
VERBOSE_CHIPS = frozenset({1, 2})
_CHIP = re.compile(r"\bm(\d+)\b", re.IGNORECASE)


def dialect(name: str) -> Dialect:
    """The dialect of that name; MilDialectError listing the known ones otherwise."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise MilDialectError(name, f"unknown dialect (known: {', '.join(DIALECTS)})") from None


def dialect_for_chip(chip: str | None) -> str:
    """The dialect reported for a chip: "ios16" for M1 / M2 (maderix/ANE PR #6, an M1 Pro under macOS 26),
    "ios18" else. The macOS backend does not use it: M1s also ran program(1.3) under macOS 15, so it tries
    both dialects and remembers what compiled (anekit.engine.trials, anekit.runtime.ane.memory).

    ``chip`` is a name such as "m1", "M2 Max" or the brand string "Apple M1 Pro"; an unknown or
    missing chip gets "ios18" (the canonical text every hardware-run project writes for M3 / M4).
    """
    match = _CHIP.search(chip or "")
    if match and int(match.group(1)) in VERBOSE_CHIPS:
        return "ios16"
    return "ios18"


def _newer(opset: str, than: str) -> bool:
    """True when ``opset`` is a later iOS opset than ``than`` (unknown opsets count as newer)."""
    if opset not in OPSET_ORDER:
        return True
    return OPSET_ORDER.index(opset) > OPSET_ORDER.index(than)


def _type_problem(t: T.Type, target: str) -> str | None:
    """Why a type cannot be written in the target dialect, or None."""
    if isinstance(t, T.StateType):
        return f"type {T.format_type(t)} (state types arrived in ios18)" if _newer("ios18", target) else None
    if isinstance(t, T.TensorBufferType):
        return f"type {T.format_type(t)} (tensor buffers are compiler-internal, ios17 and later)"
    if isinstance(t, T.TensorType):
        since = DTYPES_SINCE.get(t.dtype.name)
        if since and _newer(since, target):
            return f"dtype {t.dtype.name} (added in {since})"
        return None
    if isinstance(t, T.ListType):
        return _type_problem(t.elem, target)
    if isinstance(t, T.DictType):
        return _type_problem(t.key, target) or _type_problem(t.value, target)
    if isinstance(t, T.TupleType):
        return next((p for e in t.elems if (p := _type_problem(e, target))), None)
    return None


def _literals(arg: Arg) -> list[Literal]:
    if isinstance(arg, Literal):
        return [arg]
    if isinstance(arg, tuple):
        return [lit for a in arg for lit in _literals(a)]
    return []


def _registered(op_type: str) -> OpDef | None:
    known_ops()  # loads every op family
    return REGISTRY.get(op_type)


def _op_problem(op: Op, target: str) -> str | None:
    """Why an op cannot be written in the target dialect, or None."""
    since = OPS_SINCE.get(op.op_type)
    if since and _newer(since, target):
        return f"op '{op.op_type}' is not in the {target} opset (added in {since})"
    form_input = IOS16_FORM_INPUT.get(op.op_type)
    if form_input and target in ("ios15", "ios16") and form_input not in {**op.inputs, **op.attributes}:
        return (
            f"op '{op.op_type}' uses its ios18 form (no '{form_input}' input); {target} has only the old form"
        )
    opdef = _registered(op.op_type)
    if opdef is not None and opdef.forms and not (op.version and _newer(op.version, target)):
        try:
            op_arguments(opdef, op, target)
        except MilTypeError as e:
            return f"op '{op.op_type}' is not in a form of the {target} opset ({e.reason})"
    if op.version and _newer(op.version, target):
        return f"op '{op.op_type}<{op.version}>' is an {op.version} op version"
    values = [*op.outputs]
    for v in values:
        if problem := _type_problem(v.type, target):
            return f"op '{op.op_type}' output '{v.name}' has {problem}"
    for key, arg in op.inputs.items():
        for lit in _literals(arg):
            if problem := _type_problem(lit.type, target):
                return f"op '{op.op_type}' input '{key}' has {problem}"
    return None


def function_problems(fn: Function, name: str) -> list[tuple[Op | None, str]]:
    """Why each input (op None) or op of ``fn`` cannot be written in dialect ``name``."""
    target = dialect(name).opset
    found: list[tuple[Op | None, str]] = [
        (None, f"input '{v.name}' has {p}") for v in fn.inputs if (p := _type_problem(v.type, target))
    ]
    found += [(op, p) for op in fn.ops if (p := _op_problem(op, target))]
    return found


def check(prog: Program, name: str) -> list[str]:
    """Every reason the program cannot be written in dialect ``name`` (empty: it can)."""
    problems: list[str] = []
    for fn in prog.functions.values():
        for op, p in function_problems(fn, name):
            problems.append(f"function '{fn.name}' {p}" if op is None else f"{_where(fn, op)}: {p}")
    return problems


def _where(fn: Function, op: Op) -> str:
    return f"function '{fn.name}' ({op.where()})"


def require(prog: Program, name: str) -> Dialect:
    """The dialect, after checking the program fits it; MilDialectError naming every misfit otherwise."""
    d = dialect(name)
    problems = check(prog, name)
    if problems:
        raise MilDialectError(name, "the program cannot be written in this dialect", problems)
    return d
