"""The MIL IR: Program -> Function(s) -> Block -> Op -> Var, in SSA form.

An op's inputs map each input name to an argument: a Var (a value defined earlier), a Literal written
inline (``epsilon = fp32(0x1.5p-17)``), or a tuple of those (``values = (a, b, c)``). Every op has one
or more output Vars. ``const`` ops hold their value in the ``val`` attribute, like MIL text does.
Equality is structural, so ``parse(print(p)) == p`` is meaningful.

The canonical text of each node is written here too (``format_op``, ``format_function``,
``format_program``), as the program has it: its own version and opsets. ``anekit.mil.printer`` writes a
program in a dialect, checking it fits first; its docstring describes the text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Union

from anekit.mil import types as T
from anekit.mil.values import Literal, format_literal

DEFAULT_PROGRAM_VERSION = "1.3"
DEFAULT_OPSET = "ios18"


class Var:
    """A named SSA value: a function input or the output of an op."""

    __slots__ = ("name", "op", "type")

    def __init__(self, name: str, type_: T.Type, op: Op | None = None) -> None:
        self.name = name
        self.type = type_
        self.op = op

    @property
    def const(self) -> Literal | None:
        """The literal value when this var is the output of a ``const`` op, else None."""
        op = self.op
        if op is not None and op.op_type == "const":
            val = op.attributes.get("val")
            return val if isinstance(val, Literal) else None
        return None

    def __repr__(self) -> str:
        return f"Var({self.name}: {self.type})"


Arg = Union[Var, Literal, tuple]


class Op:
    """One operation: ``outputs = op_type<version>(inputs)[attributes]``."""

    __slots__ = ("attributes", "inputs", "line", "op_type", "outputs", "version")

    def __init__(
        self,
        op_type: str,
        inputs: dict[str, Arg],
        outputs: list[Var],
        attributes: dict[str, Literal] | None = None,
        version: str | None = None,
        line: int | None = None,
    ) -> None:
        self.op_type = op_type
        self.version = version
        self.inputs = inputs
        self.outputs = outputs
        self.attributes = attributes if attributes is not None else {}
        self.line = line
        for v in outputs:
            v.op = self

    @property
    def name(self) -> str:
        """The ``name`` attribute if present, else the first output's name."""
        attr = self.attributes.get("name")
        if isinstance(attr, Literal):
            try:
                return str(attr.scalar())
            except ValueError:
                pass
        return self.outputs[0].name if self.outputs else self.op_type

    def input_vars(self) -> Iterator[Var]:
        """Every Var this op reads, tuple arguments flattened."""
        for arg in self.inputs.values():
            if isinstance(arg, Var):
                yield arg
            elif isinstance(arg, tuple):
                for a in arg:
                    if isinstance(a, Var):
                        yield a

    def where(self) -> str:
        out = ", ".join(v.name for v in self.outputs)
        line = f"line {self.line}: " if self.line else ""
        return f"{line}{out} = {self.op_type}"

    def _key(self) -> tuple[Any, ...]:
        def arg_key(a: Arg) -> Any:
            if isinstance(a, Var):
                return ("var", a.name)
            if isinstance(a, tuple):
                return ("tuple", tuple(arg_key(x) for x in a))
            return ("lit", a)

        return (
            self.op_type,
            self.version,
            tuple(sorted((k, arg_key(v)) for k, v in self.inputs.items())),
            tuple((v.name, v.type) for v in self.outputs),
            tuple(sorted(self.attributes.items(), key=lambda kv: kv[0])),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Op) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # unhashable on purpose: mutable, equal by structure

    def __repr__(self) -> str:
        return f"Op({self.where()})"


class Block:
    """An ordered list of ops and the vars it returns."""

    __slots__ = ("ops", "outputs")

    def __init__(self, ops: list[Op] | None = None, outputs: list[Var] | None = None) -> None:
        self.ops = ops if ops is not None else []
        self.outputs = outputs if outputs is not None else []

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Block)
            and self.ops == other.ops
            and [v.name for v in self.outputs] == [v.name for v in other.outputs]
        )

    __hash__ = None  # type: ignore[assignment]  # unhashable on purpose: mutable, equal by structure


class Function:
    """``func name<opset>(inputs) [attributes] { block } -> (outputs);``"""

    __slots__ = ("attributes", "block", "inputs", "line", "name", "opset")

    def __init__(
        self,
        name: str,
        inputs: list[Var],
        block: Block | None = None,
        opset: str = DEFAULT_OPSET,
        attributes: dict[str, Literal] | None = None,
        line: int | None = None,
    ) -> None:
        self.name = name
        self.opset = opset
        self.inputs = inputs
        self.block = block if block is not None else Block()
        self.attributes = attributes if attributes is not None else {}
        self.line = line

    @property
    def ops(self) -> list[Op]:
        return self.block.ops

    @property
    def outputs(self) -> list[Var]:
        return self.block.outputs

    def input(self, name: str) -> Var:
        for v in self.inputs:
            if v.name == name:
                return v
        raise KeyError(f"function '{self.name}' has no input '{name}'")

    def signature(self) -> str:
        """``main<ios18>(x: tensor<fp16, [1, 64, 1, 16]>) -> (y: tensor<...>)``"""
        ins = ", ".join(f"{v.name}: {v.type}" for v in self.inputs)
        outs = ", ".join(f"{v.name}: {v.type}" for v in self.outputs)
        return f"{self.name}<{self.opset}>({ins}) -> ({outs})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Function)
            and self.name == other.name
            and self.opset == other.opset
            and [(v.name, v.type) for v in self.inputs] == [(v.name, v.type) for v in other.inputs]
            and self.attributes == other.attributes
            and self.block == other.block
        )

    __hash__ = None  # type: ignore[assignment]  # unhashable on purpose: mutable, equal by structure


class Program:
    """A MIL program: a version, header attributes (``buildInfo``) and named functions."""

    __slots__ = ("attributes", "functions", "version")

    def __init__(
        self,
        functions: dict[str, Function] | None = None,
        version: str = DEFAULT_PROGRAM_VERSION,
        attributes: dict[str, Literal] | None = None,
    ) -> None:
        self.version = version
        self.attributes = attributes if attributes is not None else {}
        self.functions = functions if functions is not None else {}

    @property
    def main(self) -> Function:
        """The ``main`` function, or the only function."""
        if "main" in self.functions:
            return self.functions["main"]
        if len(self.functions) == 1:
            return next(iter(self.functions.values()))
        raise KeyError(f"program has no 'main' function (functions: {', '.join(self.functions)})")

    def add_function(self, fn: Function) -> Function:
        self.functions[fn.name] = fn
        return fn

    def op_count(self) -> int:
        return sum(len(f.ops) for f in self.functions.values())

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Program)
            and self.version == other.version
            and self.attributes == other.attributes
            and list(self.functions) == list(other.functions)
            and all(self.functions[k] == other.functions[k] for k in self.functions)
        )

    __hash__ = None  # type: ignore[assignment]  # unhashable on purpose: mutable, equal by structure

    def __str__(self) -> str:
        return format_program(self)


FUNC_INDENT = "    "
STMT_INDENT = "            "
CLOSE_INDENT = "        "


def scalar_style_for(version: str) -> str:
    """How a program of this version spells scalar types: "tensor" for 1.0, "scalar" after."""
    return "tensor" if version.strip() == "1.0" else "scalar"


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


def format_program(prog: Program, version: str | None = None, opset: str | None = None) -> str:
    """The text of a program; ``version`` and ``opset`` (a dialect's) replace the program's own.

    Nothing is checked: ``anekit.mil.printer.print_program`` checks that a program fits a dialect.
    """
    version = prog.version if version is None else version
    style = scalar_style_for(version)
    parts = [f"program({version})\n"]
    if prog.attributes:
        parts.append(_attrs(prog.attributes, style) + "\n")
    parts.append("{\n")
    parts.extend(format_function(fn, style, opset) for fn in prog.functions.values())
    parts.append("}\n")
    return "".join(parts)
