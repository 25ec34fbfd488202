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

Each piece is written beside what it spells, so that the IR depends on nothing above it: a type by
``anekit.mil.types.format_type``, a literal by ``anekit.mil.values.format_literal``, an op, a function
and a program by ``anekit.mil.ir``. This module adds the dialects and is where callers import from.

``print_program(p, dialect="ios16")`` writes the program in the older verbose dialect (``program(1.0)``,
``func main<ios16>``, tensor-spelled scalars) that M1 / M2 engines are reported to need, refusing ops
the iOS16 opset does not have; ``dialect="ios18"`` writes ``program(1.3)`` / ``<ios18>``. Without a
dialect the program is printed as it is (its own version and opsets). See ``anekit.mil.dialect``.
"""

from __future__ import annotations

from anekit.mil.dialect import require
from anekit.mil.ir import (
    CLOSE_INDENT,
    FUNC_INDENT,
    STMT_INDENT,
    Program,
    format_function,
    format_op,
    format_program,
    scalar_style_for,
)
from anekit.mil.values import format_decimal, format_float, format_literal

__all__ = [
    "CLOSE_INDENT",
    "FUNC_INDENT",
    "STMT_INDENT",
    "format_decimal",
    "format_float",
    "format_function",
    "format_literal",
    "format_op",
    "format_program",
    "print_program",
    "scalar_style_for",
]


def print_program(prog: Program, dialect: str | None = None) -> str:
    """The canonical MIL text of a program; in ``dialect`` ("ios16" or "ios18") when one is given.

    A dialect rewrites the version header and every function's opset; a program that uses what the
    dialect lacks raises MilDialectError naming the op (or type) and the dialect.
    """
    if dialect is None:
        return format_program(prog)
    d = require(prog, dialect)
    return format_program(prog, d.version, d.opset)
