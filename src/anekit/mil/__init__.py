"""The MIL language: types, IR, op registry, builder, text printer and parser, verifier."""

import anekit.mil.ops  # noqa: F401  (registers every op family)
from anekit.mil.builder import Builder, FunctionBuilder, program
from anekit.mil.dialect import DIALECTS, dialect_for_chip
from anekit.mil.ir import Block, Function, Op, Program, Var
from anekit.mil.parser import parse_literal, parse_program, parse_type
from anekit.mil.printer import format_literal, format_op, print_program
from anekit.mil.registry import Input, OpDef, get_op, known_ops, register_op
from anekit.mil.types import (
    DTYPES,
    DictType,
    DType,
    ListType,
    OpaqueType,
    StateType,
    TensorBufferType,
    TensorType,
    TupleType,
    Type,
    scalar,
    tensor,
)
from anekit.mil.values import BlobRef, Literal
from anekit.mil.verify import check, verify


def parse(text: str, source: str = "") -> Program:
    """Parse MIL text (syntax only; call ``verify`` for SSA and types)."""
    return parse_program(text, source)


def to_text(prog: Program, dialect: str | None = None) -> str:
    """The canonical MIL text of a program (in ``dialect``, "ios16" or "ios18", when given)."""
    return print_program(prog, dialect)


__all__ = [
    "DIALECTS",
    "DTYPES",
    "BlobRef",
    "Block",
    "Builder",
    "DType",
    "DictType",
    "Function",
    "FunctionBuilder",
    "Input",
    "ListType",
    "Literal",
    "Op",
    "OpDef",
    "OpaqueType",
    "Program",
    "StateType",
    "TensorBufferType",
    "TensorType",
    "TupleType",
    "Type",
    "Var",
    "check",
    "dialect_for_chip",
    "format_literal",
    "format_op",
    "get_op",
    "known_ops",
    "parse",
    "parse_literal",
    "parse_program",
    "parse_type",
    "print_program",
    "program",
    "register_op",
    "scalar",
    "tensor",
    "to_text",
    "verify",
]
