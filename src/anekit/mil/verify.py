"""The MIL verifier: SSA, every use defined, declared types equal inferred types, outputs exist.

``check(program)`` lists every problem found; ``verify(program)`` raises on the first kind found,
with all of them in the message: MilTypeError when an op is ill-typed (or unknown), MilVerifyError
for structural problems (a name defined twice, an undefined use, a missing output, a type anekit
cannot model, a tensor over ``MAX_ELEMENTS`` elements).
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.errors import MilError, MilTypeError, MilVerifyError
from anekit.mil import types as T
from anekit.mil.ir import Function, Op, Program, Var
from anekit.mil.registry import get_op, op_arguments
from anekit.mil.values import Literal


@dataclass(frozen=True)
class Problem:
    """One finding: where it is, what is wrong, and whether it is a typing problem."""

    function: str
    line: int | None
    message: str
    error: MilError

    def __str__(self) -> str:
        return f"{self.function}: {self.message}"


# The most elements one tensor may hold: 2^31 (4 GiB of fp16), far above any engine surface or weight
# (an IOSurface is at most a few hundred MB), and small enough that a simulator or host buffer of that
# size is not itself the failure. A shape over it (a typo, [1, 100000, 1, 100000], dims of 2^40) is
# refused here, before anything allocates it.
MAX_ELEMENTS = 1 << 31


def _too_large(t: T.Type) -> int | None:
    """The element count of a static tensor (or tensor buffer / state of one) over ``MAX_ELEMENTS``."""
    if isinstance(t, T.StateType):
        return _too_large(t.wrapped)
    shape = getattr(t, "shape", None)
    if not isinstance(shape, tuple) or not all(isinstance(d, int) for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d
    return n if n > MAX_ELEMENTS else None


def _dims_compatible(declared: T.Dim, inferred: T.Dim) -> bool:
    return declared == inferred or isinstance(declared, str) or isinstance(inferred, str)


def types_compatible(declared: T.Type, inferred: T.Type) -> bool:
    """Declared equals inferred, where a symbolic or unknown dim on either side matches any dim."""
    if declared == inferred:
        return True
    if isinstance(declared, T.TensorType) and isinstance(inferred, T.TensorType):
        return (
            declared.dtype == inferred.dtype
            and declared.rank == inferred.rank
            and all(_dims_compatible(d, i) for d, i in zip(declared.shape, inferred.shape))
        )
    if isinstance(declared, T.TensorBufferType) and isinstance(inferred, T.TensorBufferType):
        return declared.dtype == inferred.dtype and len(declared.shape) == len(inferred.shape)
    return False


def _opaque_in(t: T.Type) -> bool:
    if type(t) is T.TensorType:
        return False
    if isinstance(t, T.OpaqueType):
        return True
    if isinstance(t, T.ListType):
        return _opaque_in(t.elem)
    if isinstance(t, T.DictType):
        return _opaque_in(t.key) or _opaque_in(t.value)
    if isinstance(t, T.TupleType):
        return any(_opaque_in(e) for e in t.elems)
    if isinstance(t, T.StateType):
        return _opaque_in(t.wrapped)
    return False


class _FunctionChecker:
    def __init__(self, fn: Function) -> None:
        self.fn = fn
        self.problems: list[Problem] = []
        self.defined: dict[str, Var] = {}

    def structural(self, line: int | None, message: str) -> None:
        message = f"line {line}: {message}" if line else message
        self.problems.append(Problem(self.fn.name, line, message, MilVerifyError([message])))

    def typing(self, line: int | None, err: MilTypeError) -> None:
        self.problems.append(Problem(self.fn.name, line, str(err), err))

    def define(self, v: Var, line: int | None) -> None:
        if v.name in self.defined:
            self.structural(line, f"'{v.name}' is defined twice (SSA: every name is assigned once)")
        self.defined[v.name] = v
        if _opaque_in(v.type):
            self.structural(line, f"'{v.name}' has a type anekit cannot model: {v.type}")
        count = _too_large(v.type)
        if count is not None:
            self.structural(
                line, f"'{v.name}' holds {count} elements ({v.type}), over the limit of {MAX_ELEMENTS}"
            )

    def run(self) -> list[Problem]:
        for v in self.fn.inputs:
            self.define(v, self.fn.line)
        for op in self.fn.ops:
            self.op(op)
        for v in self.fn.outputs:
            if self.defined.get(v.name) is not v:
                self.structural(None, f"function output '{v.name}' is not defined in the function")
        if not self.fn.outputs:
            self.structural(self.fn.line, "function returns no outputs")
        return self.problems

    def op(self, op: Op) -> None:
        undefined = [v.name for v in op.input_vars() if self.defined.get(v.name) is not v]
        for name in undefined:
            self.structural(op.line, f"'{name}' is used by {op.op_type} before it is defined (or never)")
        if not undefined:
            self.type_op(op)
        for v in op.outputs:
            self.define(v, op.line)

    def type_op(self, op: Op) -> None:
        where = op.where()
        try:
            opdef = get_op(op.op_type, where)
        except MilTypeError as e:
            self.typing(op.line, e)
            return
        if op.op_type == "const":
            val = op.attributes.get("val")
            if op.inputs:
                self.typing(op.line, MilTypeError("const", "const takes no inputs", where=where))
            elif not isinstance(val, Literal):
                self.typing(op.line, MilTypeError("const", "const needs a 'val' attribute", where=where))
            elif len(op.outputs) != 1 or not types_compatible(op.outputs[0].type, val.type):
                spelled = ", ".join(str(v.type) for v in op.outputs)
                msg = f"declared type {spelled} does not match the value's type {val.type}"
                self.typing(op.line, MilTypeError("const", msg, where=where))
            return
        for v in op.input_vars():
            if _opaque_in(v.type):
                return  # already reported where it was defined
        try:
            args = op_arguments(opdef, op, self.fn.opset)
            inferred = opdef.type_outputs(args, where)
        except MilTypeError as e:
            self.typing(op.line, e)
            return
        declared = tuple(v.type for v in op.outputs)
        if len(declared) != len(inferred) or not all(map(types_compatible, declared, inferred)):
            d = ", ".join(map(str, declared))
            i = ", ".join(map(str, inferred))
            err = MilTypeError(
                op.op_type,
                f"declared output type(s) {d} but the inputs give {i}",
                input_types={k: str(_arg_type_text(a)) for k, a in args.items()},
                where=where,
            )
            self.typing(op.line, err)


def _arg_type_text(a: object) -> str:
    if isinstance(a, (Var, Literal)):
        return str(a.type)
    if isinstance(a, tuple):
        return "(" + ", ".join(_arg_type_text(x) for x in a) + ")"
    return "?"


def check(prog: Program) -> list[Problem]:
    """Every problem in the program (empty when it verifies)."""
    problems: list[Problem] = []
    if not prog.functions:
        problems.append(
            Problem("<program>", None, "program has no functions", MilVerifyError(["no functions"]))
        )
    for fn in prog.functions.values():
        problems.extend(_FunctionChecker(fn).run())
    return problems


def verify(prog: Program) -> Program:
    """Raise MilTypeError / MilVerifyError listing every problem; return the program when it verifies."""
    problems = check(prog)
    if not problems:
        return prog
    first = problems[0].error
    if isinstance(first, MilTypeError) and len(problems) == 1:
        raise first
    listing = [str(p) for p in problems]
    if isinstance(first, MilTypeError):
        err = MilTypeError(
            first.op,
            first.reason + "\n" + "\n".join(f"  - {p}" for p in listing[1:]),
            input_types=first.input_types,
            where=first.where,
            problems=listing,
        )
        raise err
    raise MilVerifyError(listing)
