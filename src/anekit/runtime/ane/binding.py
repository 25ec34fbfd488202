"""Which surface binds to which MIL parameter: the function the engine compiles and the order of its I/O.

The engine binds the request's k-th input surface to the function's k-th input parameter in
ALPHABETICAL order of the MIL names, not in declaration order, and the k-th output surface to the
k-th output variable by name likewise; any other order gives silently wrong data (mechramc/Orion
docs/ane_constraints.md §3 for outputs, §13 for inputs, where all 6 permutations of 3 inputs were
tried; rule surface.bind-alphabetical). So the function handed to the engine declares its inputs and
its outputs sorted by name (declaration order and alphabetical order then agree, Orion's own advice),
and the request lists surfaces in that order with indices 0..n-1. The kernel's ``inputs`` /
``outputs`` keep the program's order and names: the order is invisible to users.

"Alphabetical" is taken as code-point order (what sorting the UTF-8 names gives); the reports only
show names whose case-insensitive and code-point orders agree.

Outputs that are a function input, or repeat another output, are not sent to the engine: they are
copied on the host after each run (``host_copies``).

Shapes the engine was measured to refuse on its chip and route (rows under 64 bytes, ...) are refused
before anything is compiled by the rule book (``anekit.rules``), which the backend enforces for its
chip; ``Layout.plan`` is what ``anekit.rules.check_surface_plan`` judges.
"""

from __future__ import annotations

from dataclasses import dataclass

from anekit.errors import CompilationFailed
from anekit.mil import types as T
from anekit.mil.ir import Block, Function, Var
from anekit.runtime.ane.surfaces import uniform_allocation


def io_nbytes(v: Var) -> int:
    """Bytes of a function input / output tensor (static shape required)."""
    t = v.type
    if isinstance(t, T.StateType):  # rule program.state-ops-direct (sbryngelson/ane-guide chapter 14)
        raise CompilationFailed(
            f"[compile] '{v.name}' has type {t}: the direct route has no states (rule "
            "program.state-ops-direct: the backend's conversion rejects state ops, no state object to bind); "
            "keep a cache in a plain input surface the host writes"
        )
    if not isinstance(t, (T.TensorType, T.TensorBufferType)):
        raise CompilationFailed(
            f"[compile] '{v.name}' has type {t}; kernel inputs and outputs must be tensors"
        )
    if not all(isinstance(d, int) for d in t.shape):
        raise CompilationFailed(
            f"[compile] '{v.name}' has the symbolic shape {t}; kernels need static shapes"
        )
    count = 1
    for d in t.shape:
        count *= int(d)
    return count * t.dtype.np.itemsize


def binding_order(names: list[str]) -> list[int]:
    """Indices of ``names`` in the order the engine binds them: alphabetical by MIL name (Orion §3, §13)."""
    return sorted(range(len(names)), key=lambda i: (names[i], i))


@dataclass(frozen=True)
class Layout:
    """The function the engine compiles and how its I/O maps back to the program's.

    ``inputs[k]`` / ``outputs[k]``: the program's input / output index bound to the request's k-th
    input / output surface (the k-th name in alphabetical order). ``host_copies``: (source kind
    "input" | "output", source index, output index) for outputs filled on the host after each run.
    ``input_alloc`` / ``output_alloc``: the one allocation size of every input / output surface.
    """

    fn: Function
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    host_copies: tuple[tuple[str, int, int], ...]
    input_alloc: int
    output_alloc: int

    def plan(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """``([(MIL name, allocation bytes)] of the inputs, ... of the outputs)`` in binding order."""
        return (
            [(v.name, self.input_alloc) for v in self.fn.inputs],
            [(v.name, self.output_alloc) for v in self.fn.outputs],
        )

    @classmethod
    def of(cls, fn: Function) -> Layout:
        in_bytes = [io_nbytes(v) for v in fn.inputs]
        out_bytes = [io_nbytes(v) for v in fn.outputs]
        input_index = {v.name: i for i, v in enumerate(fn.inputs)}
        computed: list[int] = []
        first: dict[str, int] = {}
        copies = []
        for j, v in enumerate(fn.outputs):
            if v.name in input_index:
                copies.append(("input", input_index[v.name], j))
            elif v.name in first:
                copies.append(("output", first[v.name], j))
            else:
                first[v.name] = j
                computed.append(j)
        if not computed:
            raise CompilationFailed(
                f"[compile] every output of '{fn.name}' is an input or a repeated output; the engine needs "
                "at least one computed output"
            )
        inputs = binding_order([v.name for v in fn.inputs])
        out_order = binding_order([fn.outputs[j].name for j in computed])
        outputs = [computed[k] for k in out_order]
        block = Block(list(fn.ops), [fn.outputs[j] for j in outputs])
        engine_fn = Function("main", [fn.inputs[i] for i in inputs], block, fn.opset, dict(fn.attributes))
        return cls(
            engine_fn,
            tuple(inputs),
            tuple(outputs),
            tuple(copies),
            uniform_allocation(in_bytes),
            uniform_allocation(out_bytes),
        )
