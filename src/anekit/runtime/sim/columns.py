"""Column-lazy runs: a plan run on the first columns of its width only, where that gives their bits.

A decode kernel is 32 columns wide (the narrowest fp16 surface the engine runs) and its caller reads the
real tokens' columns, usually one. Two kinds of program have a narrower copy:

- a *column-separable* one — every runtime tensor is rank 4 with the kernel's width as its last axis, and
  every op computes each column from the same column of its operands (pointwise convs, elementwise ops and
  activations with constants that do not vary along the width, reductions and concatenations over other
  axes): its copy at n columns is itself with the width cut (``narrowed``);
- a *causal* one, whose caller vouches for it (``kernel.SimKernel.causal``): an attention over a cache and
  the chunk's own keys, where column j sees the chunk's columns 0 .. j only and the padding columns are
  masked from the real ones. Its copy is the same program built by its caller for a chunk of n columns
  (the cache as it is, the softmax n keys shorter).

Either copy's first c <= n columns are the full run's bits only if every sum they take is taken the same
way whatever the number of columns (and of masked keys). The elementwise ops do; a matrix product need
not: the BLAS the simulator's convs call picks its kernels and their summation orders by the call's shape,
so column 0 of a 16-column product may differ from column 0 of the 32-column one (with the OpenBLAS of
numpy's wheels on x86-64 a 1-column product is a GEMV, and 1 to 15 columns all give other float32 sums
than 32; 16 to 31 give the same first 8). So a decode-shaped program at most 32 columns wide sums its
convs, matmuls, softmax rows and one-axis reductions in ascending order instead (``runtime.sim.ordered``),
the same sums at every width; a wider one keeps the BLAS product. Which narrow widths keep the bits is
still measured, not assumed: ``NarrowRuns`` runs the full program and each candidate copy on the same
random inputs once, first in float32 from op to op (the order probe: a sum taken in another order shows in
its last bits there, where an fp16 rounding would mostly hide it), then with the chip's numerics, and
keeps the narrowest whose first c columns agree with the full run bit for bit in every output of both;
when none does, the full plan runs. A width at which a MAC op would fall to the engine numerics' exact
tile model (``runtime.sim.mac``) while the full run takes the float32 product is not tried (a chip whose
MAC rounds ties away rounds that float32 sum away, at every width alike). The orders of summation depend
on the shapes of a call, not on the values, so one agreement on random values of the real shapes, with the
real weights, stands for every input — for a causal copy, every input whose padding the program masks, which
is its caller's word, not measured.

Only the columns asked for are handed out: a narrowed run leaves NaN in every other column of its output
surfaces (``kernel.SimKernel.compute_columns``), so a column that was not computed cannot be read as if it
had been.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np

from anekit.mil import types as T
from anekit.mil.ir import Block, Function, Op, Var
from anekit.mil.ops.activation import _Activation
from anekit.mil.ops.elementwise import _Binary, _Unary
from anekit.mil.ops.reduction import _ReduceAxes
from anekit.mil.registry import get_op, op_arguments
from anekit.mil.values import Literal

Arg = Var | Literal | tuple


def _literal(arg: object) -> Literal | None:
    """The constant an argument holds (inline or a ``const`` op's), else None."""
    if isinstance(arg, Literal):
        return arg
    if isinstance(arg, Var):
        return arg.const
    return None


def _width_free(t: T.Type) -> bool:
    """A constant operand that broadcasts along the width: a scalar, or a last axis of 1."""
    return isinstance(t, T.TensorType) and (t.rank == 0 or t.shape[-1] == 1)


def _local_conv(args: dict[str, Arg]) -> bool:
    """A conv whose output column j reads input column j alone: a constant weight one column wide (strides,
    padding and dilation along the width would change the width, which ``narrowed`` refuses)."""
    weight = _literal(args.get("weight"))
    return weight is not None and isinstance(weight.type, T.TensorType) and weight.type.shape[-1:] == (1,)


def _local(op: Op, args: dict[str, Arg]) -> bool:
    """Whether ``op`` computes each output column from the same column of its operands alone, given that
    every runtime tensor it reads and makes ends in the kernel's width (``narrowed`` checks that: a
    reduction or a concatenation over the width changes the width, so they need no rule of their own)."""
    if op.op_type == "conv":
        return _local_conv(args)
    if op.op_type == "concat":
        return True
    return isinstance(get_op(op.op_type), (_Binary, _Unary, _Activation, _ReduceAxes))


def _operands(arg: Arg) -> Iterable[Var | Literal]:
    return arg if isinstance(arg, tuple) else (arg,)


def _retyped(t: T.Type, width: int, columns: int) -> T.Type | None:
    """A runtime tensor's type with ``columns`` in place of the width; None if it is not (.., width)."""
    if not isinstance(t, T.TensorType) or t.rank != 4 or t.shape[-1] != width:
        return None
    return T.TensorType(t.dtype, (*t.shape[:-1], columns))


def narrowed(fn: Function, width: int, columns: int) -> Function | None:
    """``fn`` with every runtime tensor's width cut to ``columns`` (the constants as they are), or None when
    ``fn`` is not column-separable at ``width`` (the module docstring)."""
    new: dict[str, Var] = {}

    def runtime(v: Var) -> bool:
        return v.name in new

    inputs = []
    for v in fn.inputs:
        t = _retyped(v.type, width, columns)
        if t is None:
            return None
        new[v.name] = Var(v.name, t)
        inputs.append(new[v.name])
    ops: list[Op] = []
    for op in fn.ops:
        if op.op_type == "const":
            ops.append(op)
            continue
        opdef = get_op(op.op_type)
        args = op_arguments(opdef, op)
        moving = [a for arg in args.values() for a in _operands(arg) if isinstance(a, Var) and runtime(a)]
        if not moving:
            ops.append(op)  # constants only: folded when the plan is built, as in the full program
            continue
        if any(_retyped(a.type, width, columns) is None for a in moving):
            return None
        if op.op_type == "concat":
            values = args.get("values")
            if not all(isinstance(a, Var) and runtime(a) for a in _operands(values or ())):
                return None  # a constant block of columns
        elif op.op_type != "conv" and not isinstance(opdef, _ReduceAxes):
            for arg in args.values():
                for a in _operands(arg):
                    if not (isinstance(a, Var) and runtime(a)) and not _width_free(a.type):
                        return None  # a constant that varies along the width
        if not _local(op, args):
            return None
        outs = []
        for v in op.outputs:
            t = _retyped(v.type, width, columns)
            if t is None:
                return None
            new[v.name] = Var(v.name, t)
            outs.append(new[v.name])

        def swap(arg: Arg) -> Arg:
            if isinstance(arg, tuple):
                return tuple(swap(a) for a in arg)
            return new[arg.name] if isinstance(arg, Var) and runtime(arg) else arg

        inputs_of = {k: swap(a) for k, a in op.inputs.items()}
        attributes = {k: swap(a) for k, a in op.attributes.items()}
        ops.append(Op(op.op_type, inputs_of, outs, attributes, op.version, op.line))  # type: ignore[arg-type]
    outputs = []
    for v in fn.outputs:
        floating = isinstance(v.type, T.TensorType) and v.type.dtype.name in ("fp16", "fp32")
        if not runtime(v) or not floating:
            return None  # an output the narrowed run could not mark (NaN) where it computed nothing
        outputs.append(new[v.name])
    return Function(fn.name, inputs, Block(ops, outputs), fn.opset, dict(fn.attributes), fn.line)


def separable_width(fn: Function, widest: int | None = None) -> int | None:
    """The width of a column-separable ``fn`` (the last axis every runtime tensor shares), else None; a
    program wider than ``widest`` is not looked at further (a training kernel's hundreds of ops)."""
    if not fn.inputs:
        return None
    t = fn.inputs[0].type
    if not isinstance(t, T.TensorType) or t.rank != 4 or not isinstance(t.shape[-1], int):
        return None
    width = int(t.shape[-1])
    if widest is not None and width > widest:
        return None
    return width if narrowed(fn, width, width) is not None else None


def candidates(columns: int, width: int) -> list[int]:
    """The narrow widths tried for ``columns`` of ``width``, narrowest first: ``columns``, then each power
    of two above it, all below ``width``."""
    out, n = [], columns
    while n < width:
        out.append(n)
        n = 1 << n.bit_length() if n & (n - 1) else n * 2
    return out


def same_columns(full: list[np.ndarray], narrow: list[np.ndarray], columns: int) -> bool:
    """Whether every output's first ``columns`` columns hold the same bits in both runs."""
    for a, b in zip(full, narrow):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape[:-1] != b.shape[:-1]:
            return False
        if a[..., :columns].tobytes() != b[..., :columns].tobytes():  # tobytes: C order, views too
            return False
    return True


# A narrowed copy of a program: its function, and its weight files where they are not the full program's
# (None: the same files).
Copy = tuple[Function, Any]
Build = Callable[[Function, "str | None", Any], Any]


class NarrowRuns:
    """The narrowed plans of one function, built when first asked for, and which of them gives the full
    run's bits in the first c columns (measured once per c: the module docstring).

    ``copy(n)`` gives the function narrowed to n columns and its weight files (None: ``fn`` has no such
    copy at n): ``narrowed``'s for a column-separable program, a causal program's own (``causal``).
    ``build(fn, precision, weights)`` compiles a function as the full plan ``full`` was compiled
    (``precision`` None: the same precision and numerics; "fp32": no rounding between ops, the order
    probe's; ``weights`` None: the full program's files), reusing ``full``'s constants. ``wide_from``: the
    fewest products a MAC op must have for the chip's numerics to compute it with the float32 product the
    order probe measures (the smaller ones run the exact tile model); None where the numerics compute
    every MAC op otherwise (no narrowing)."""

    def __init__(
        self,
        fn: Function,
        width: int,
        build: Build,
        full: Any,
        wide_from: int | None,
        seed: int = 0,
        copy: Callable[[int], Copy | None] | None = None,
    ) -> None:
        self.fn, self.width, self.build, self.full = fn, width, build, full
        self.wide_from, self.seed = wide_from, seed
        self.copy = copy if copy is not None else self._separable
        self._chosen: dict[int, tuple[int, Any] | None] = {}  # columns asked -> (narrow width, plan)

    def _separable(self, n: int) -> Copy | None:
        narrow = narrowed(self.fn, self.width, n)
        return None if narrow is None else (narrow, None)

    def _wide(self, fn: Function) -> bool:
        """Every MAC op of ``fn`` large enough for the numerics' float32 path (that of the full plan's, whose
        MAC ops are at least as large)."""
        if self.wide_from is None:
            return False
        for op in fn.ops:
            if op.op_type not in ("conv", "matmul") or all(v.const is not None for v in op.input_vars()):
                continue
            count = mac_products(op)
            if count is None or count < self.wide_from:
                return False
        return True

    def choose(self, columns: int) -> tuple[int, Any] | None:
        """(n, the plan narrowed to n columns) whose first ``columns`` columns are the full plan's bits, the
        narrowest such; None when the full plan must run."""
        if columns not in self._chosen:
            self._chosen[columns] = self._measure(columns)
        return self._chosen[columns]

    def _measure(self, columns: int) -> tuple[int, Any] | None:
        tries = []  # (n, the function narrowed to n columns, its files), at the widths its MAC ops allow
        for n in candidates(columns, self.width):
            found = self.copy(n)
            if found is not None and self._wide(found[0]):
                tries.append((n, *found))
        if not tries:
            return None
        rng = np.random.default_rng(self.seed)
        shapes = [tuple(int(d) for d in cast(T.TensorType, v.type).shape) for v in self.fn.inputs]
        raw = [rng.standard_normal(shape).astype(np.float16).astype(np.float32) for shape in shapes]
        # The order probe: float32 from op to op, so a product or sum taken in another order shows in
        # its last bits instead of vanishing in an fp16 rounding.
        exact = self.build(self.fn, "fp32", None)
        exact_out = [np.array(v, copy=True) for v in exact.run(raw)]
        inputs = [store(a) for store, a in zip(self.full.input_stores, raw)]
        full_out = [np.array(v, copy=True) for v in self.full.run(inputs)]
        for n, fn, weights in tries:
            probe = self.build(fn, "fp32", weights).run(fit(raw, input_widths(fn)))
            if not same_columns(exact_out, probe, columns):
                continue
            plan = self.build(fn, None, weights)  # then the run itself, with the chip's numerics
            if same_columns(full_out, plan.run(fit(inputs, input_widths(fn))), columns):
                return n, plan
        return None


def mac_products(op: Op) -> int | None:
    """The products a conv or matmul op of static types takes (output elements times the terms of each),
    else None."""
    (out,) = op.outputs
    if not isinstance(out.type, T.TensorType) or not out.type.is_static:
        return None
    size = math.prod(int(d) for d in out.type.shape)
    args = op_arguments(get_op(op.op_type), op)
    if op.op_type == "conv":
        weight = args.get("weight")
        w_type = weight.type if isinstance(weight, (Var, Literal)) else None
        if not isinstance(w_type, T.TensorType) or w_type.rank < 3 or not w_type.is_static:
            return None
        return size * int(w_type.shape[1])  # the numerics' count: each output's input channels
    x = args.get("x")
    x_type = x.type if isinstance(x, (Var, Literal)) else None
    if not isinstance(x_type, T.TensorType) or not x_type.is_static or x_type.rank < 1:
        return None
    flag = _literal(args.get("transpose_x"))
    swapped = flag is not None and bool(np.asarray(flag.value)) and x_type.rank >= 2
    return size * int(x_type.shape[-2] if swapped else x_type.shape[-1])


def input_widths(fn: Function) -> tuple[int | None, ...]:
    """The last axis of each of ``fn``'s inputs (None where it is not a static tensor's)."""
    out: list[int | None] = []
    for v in fn.inputs:
        t = v.type
        static = isinstance(t, T.TensorType) and t.rank >= 1 and isinstance(t.shape[-1], int)
        out.append(int(cast(T.TensorType, t).shape[-1]) if static else None)
    return tuple(out)


def fit(inputs: list[np.ndarray], widths: tuple[int | None, ...]) -> list[np.ndarray]:
    """The inputs of a narrowed copy whose inputs end in ``widths`` (``input_widths``): each cut to its
    first columns (``cut``) where the copy's is narrower, as it is where not (a causal program's cache)."""
    return [a if w is None or a.shape[-1] == w else cut(a, w) for a, w in zip(inputs, widths)]


def cut(a: np.ndarray, columns: int) -> np.ndarray:
    """The first ``columns`` columns of an input, C-contiguous (as a plan's inputs are)."""
    return np.ascontiguousarray(a[..., :columns])
