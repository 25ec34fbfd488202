"""The backend protocol: Backend.compile -> Kernel (load / run / unload) with Surface buffers.

Every backend implements the same small protocol (DESIGN.md "Backends")::

    backend.compile(program | mil_text, weights={name: bytes | path}) -> Kernel
    kernel.load(); kernel.run(); kernel.unload()        # also a context manager; unload is idempotent
    kernel.inputs / kernel.outputs -> [Surface]         # write, run, read: surfaces are reused
    kernel(x=array, ...) -> {output name: array}         # the same with numpy arrays
    kernel.states -> {state name: array}                 # buffers of state<...> inputs, kept across runs
    kernel.input_set() -> [Surface]; kernel.run(inputs=set)  # more input surfaces, bound per run
    backend.compile_count, backend.compile_budget

Compiles are a per-process budget on the engine: mechramc/Orion docs/ane_constraints.md §5 (first
documented by maderix/ANE) measured the compiler failing after about 119 compiles per process, and both
projects count them in one process-wide counter (Orion core/ane_runtime.m ``g_compile_count``, maderix/ANE
training/stories_config.h ``g_compile_count`` against ``MAX_COMPILES 100``). A backend that drives the
engine counts on ``PROCESS_COMPILES``, shared by every backend object of the process; the simulator gives
each backend object its own ``CompileCounter`` (each stands for a fresh engine process, which is how the
trainer's checkpoint-and-re-execute is exercised off a Mac). ``PROCESS_COMPILES.reset()`` is for tests
only: it pretends the process is new.

A function input of type ``state<tensor<...>>`` (a stateful iOS18 function, CoreML's MLState) gets no
surface: it is a buffer the kernel holds across runs, zero when the kernel is made, in ``kernel.states``
(name -> numpy array of the wrapped shape; float states hold float32 values). Ops read and write it in
place. Two kernels share states by sharing the dict: ``decode.states = prefill.states``.

A Surface is a tensor buffer, usually [1, C, 1, S] fp16 (channels = model dim, spatial = sequence).
``read`` / ``write`` take a channel offset so several results can share one surface ("taps");
``write_block`` stores a (rows, columns) block at a channel and a column, so one surface can keep
contents that change at different rates (a dynamic kernel's weights beside its activations).

Input sets: one compiled kernel can run on several sets of input surfaces (``input_set``), each made by
the backend as the kernel's own inputs are; ``run(inputs=s)`` evaluates on set ``s``, the outputs being
the kernel's. maderix/ANE's dynamic pipeline (training/training_dynamic/train.m, "per-layer IOSurfaces +
requests") compiles each kernel once and gives every layer its own input surface and request, its
weights staged there once per optimizer step: only the activations are written per evaluation.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from os import PathLike
from typing import Any, Union

import numpy as np

from anekit.errors import (
    AnekitError,
    CompilationFailed,
    CompileBudgetExhausted,
    LoadFailed,
    SurfaceCreationFailed,
)
from anekit.mil import types as T
from anekit.mil.ir import Function, Program
from anekit.mil.parser import parse_program
from anekit.mil.verify import verify

DEFAULT_COMPILE_BUDGET = 100  # compiles a real ANE process manages before it must restart

WeightSource = Union[bytes, bytearray, memoryview, str, "PathLike[str]"]
Weights = Mapping[str, WeightSource]

_surface_ids = itertools.count(1)


class Surface:
    """A tensor buffer shared between the host and the engine; [1, C, 1, S] for ANE tensors.

    ``read(ch_offset, channels)`` returns float32 rows ``(channels, spatial)``; ``write(array,
    ch_offset)`` stores rows (converted to the surface dtype, fp16 rounding to nearest even).
    ``view()`` gives the raw buffer as a numpy array of the storage dtype, under the surface's lock.
    For a tensor of shape [N, C, d2, d3, ...] the rows are the C channels of batch 0 and spatial is
    d2 * d3 * ... (N must be 1 for channel access).
    """

    def __init__(self, shape: tuple[int, ...], dtype: str = "fp16", name: str = "") -> None:
        if any(not isinstance(d, int) or d <= 0 for d in shape):  # () is a scalar: one element
            raise SurfaceCreationFailed(f"[surface] {name or 'surface'}: shape {list(shape)} must be static")
        self.shape = tuple(shape)
        self.dtype = T.dtype(dtype)
        if self.dtype.kind == "string":
            raise SurfaceCreationFailed(f"[surface] {name}: string tensors cannot live in a surface")
        self.name = name
        self.id = next(_surface_ids)
        self._lock = threading.Lock()
        self._data = np.zeros(self.shape, dtype=self.dtype.np)

    # -- geometry ----------------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return int(self._data.nbytes)

    @property
    def channels(self) -> int:
        return self.shape[1] if len(self.shape) >= 2 else 1

    @property
    def spatial(self) -> int:
        n = 1
        for d in self.shape[2:]:
            n *= d
        return n if len(self.shape) >= 2 else (self.shape[0] if self.shape else 1)

    def _rows(self) -> np.ndarray:
        if len(self.shape) >= 2 and self.shape[0] != 1:
            raise SurfaceCreationFailed(
                f"[surface] {self.name}: channel access needs batch 1, shape is {list(self.shape)}"
            )
        return self._data.reshape(self.channels, self.spatial)

    def _span(self, ch_offset: int, channels: int | None) -> tuple[int, int]:
        n = self.channels - ch_offset if channels is None else channels
        if ch_offset < 0 or n < 0 or ch_offset + n > self.channels:
            raise SurfaceCreationFailed(
                f"[surface] {self.name}: channels {ch_offset}..{ch_offset + n} are outside 0..{self.channels}"
            )
        return ch_offset, ch_offset + n

    # -- access ------------------------------------------------------------------------------------

    def read(self, ch_offset: int = 0, channels: int | None = None) -> np.ndarray:
        """A float32 (or the integer dtype's) copy of ``channels`` rows starting at ``ch_offset``."""
        lo, hi = self._span(ch_offset, channels)
        with self._lock:
            rows = self._rows()[lo:hi]
            return rows.astype(np.float32) if self.dtype.is_float else rows.copy()

    def write(self, array: Any, ch_offset: int = 0) -> None:
        """Store ``array`` (``(channels, spatial)``, ``[1, channels, 1, spatial]`` or the full shape)."""
        a = np.asarray(array)
        if a.shape == self.shape and ch_offset == 0:
            rows = a.reshape(self.channels, self.spatial) if len(self.shape) >= 2 else a.reshape(1, -1)
        elif a.ndim == 4 and a.shape[0] == 1 and a.shape[2] == 1:
            rows = a.reshape(a.shape[1], a.shape[3])
        elif a.ndim == 2:
            rows = a
        elif a.ndim == 1 and self.channels == 1:
            rows = a.reshape(1, -1)
        else:
            raise SurfaceCreationFailed(
                f"[surface] {self.name}: cannot write an array of shape {list(a.shape)} into "
                f"{list(self.shape)} (expected (channels, {self.spatial}) rows or the full shape)"
            )
        if rows.shape[1] != self.spatial:
            raise SurfaceCreationFailed(
                f"[surface] {self.name}: rows have {rows.shape[1]} spatial elements, expected {self.spatial}"
            )
        lo, hi = self._span(ch_offset, rows.shape[0])
        with self._lock, np.errstate(over="ignore"):  # values past the fp16 range become inf
            if len(self.shape) >= 2:
                self._rows()[lo:hi] = rows.astype(self.dtype.np, copy=False)
            else:
                self._data.reshape(-1)[:] = rows.reshape(-1).astype(self.dtype.np, copy=False)

    def write_block(self, block: Any, row: int = 0, column: int = 0) -> None:
        """Store the (rows, columns) float ``block`` at channel ``row`` and spatial column ``column`` of a
        [1, C, 1, W] surface (rounded to the surface dtype, fp16 to nearest even); the rest is left as it
        is. SurfaceCreationFailed when the block does not fit."""
        a = np.asarray(block)
        self._check_block(a, row, column)
        with self.view() as buf, np.errstate(over="ignore"):  # values past the fp16 range become inf
            grid = buf.reshape(self.channels, self.spatial)
            grid[row : row + a.shape[0], column : column + a.shape[1]] = a.astype(self.dtype.np, copy=False)

    def _check_block(self, a: np.ndarray, row: int, column: int) -> None:
        """SurfaceCreationFailed unless ``a`` is a (rows, columns) block that fits at (``row``, ``column``)
        of a batch-1 surface."""
        if len(self.shape) >= 2 and self.shape[0] != 1:
            raise SurfaceCreationFailed(
                f"[surface] {self.name}: block access needs batch 1, shape is {list(self.shape)}"
            )
        if a.ndim != 2:
            raise SurfaceCreationFailed(
                f"[surface] {self.name}: a block is (rows, columns), got shape {list(a.shape)}"
            )
        rows_fit = row >= 0 and row + a.shape[0] <= self.channels
        if not (rows_fit and column >= 0 and column + a.shape[1] <= self.spatial):
            raise SurfaceCreationFailed(
                f"[surface] {self.name}: a {a.shape[0]} x {a.shape[1]} block at channel {row}, column "
                f"{column} does not fit {self.channels} x {self.spatial}"
            )

    def view(self) -> _LockedView:
        """The raw buffer (storage dtype, full shape), zero-copy, while holding the surface's lock:
        ``with surface.view() as buf: ...``."""
        return _LockedView(self)

    def __repr__(self) -> str:
        return f"Surface(#{self.id} {self.name}: {self.dtype.name} {list(self.shape)})"


class _LockedView:
    """``Surface.view``'s context manager: the surface's lock held while its buffer is in use (a plain class,
    not a generator-based context manager, which costs several times more; kernels enter one per surface
    on every call). The buffer is read after the lock is taken: an engine's surface maps it only then."""

    __slots__ = ("surface",)

    def __init__(self, surface: Surface) -> None:
        self.surface = surface

    def __enter__(self) -> np.ndarray:
        self.surface._lock.__enter__()
        return self.surface._data

    def __exit__(self, *exc: Any) -> None:
        self.surface._lock.__exit__(*exc)


class Kernel:
    """A compiled program with its input and output surfaces; load before running."""

    def __init__(self, backend: Backend, fn: Function, name: str = "") -> None:
        self.backend = backend
        self.name = name or fn.name
        tensors = [v for v in fn.inputs if not isinstance(v.type, T.StateType)]
        self.input_names = [v.name for v in tensors]
        self.output_names = [v.name for v in fn.outputs]
        self.inputs = [_surface_for(v.type, v.name, self.surface_dtype) for v in tensors]
        self.states: dict[str, np.ndarray] = {
            v.name: _state_buffer(v.type, v.name) for v in fn.inputs if isinstance(v.type, T.StateType)
        }
        self.outputs = [_surface_for(v.type, v.name, self.surface_dtype) for v in fn.outputs]
        self.input_sets: list[list[Surface]] = []  # further input surfaces (``input_set``)
        self._run_inputs: list[Surface] | None = None  # the set of the run in progress (None: ``inputs``)
        self._loaded = False
        self._closed = False
        # Objects with a close() method that the kernel owns; released on close and at garbage collection.
        self._owned: list[Any] = []
        self._finalizer = weakref.finalize(self, Kernel._release, self._owned)

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def is_loaded(self) -> bool:
        return self._loaded

    def load(self) -> Kernel:
        if self._closed:
            raise LoadFailed(f"[{self.name}] kernel is closed; compile it again")
        if not self._loaded:
            self._load()
            self._loaded = True
        return self

    def unload(self) -> None:
        """Free the kernel's engine resources; safe to call any number of times."""
        if self._loaded:
            self._loaded = False
            self._unload()

    def close(self) -> None:
        """Unload and release everything (temporary files, surfaces on the engine)."""
        self.unload()
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Kernel:
        return self.load()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, inputs: list[Surface] | None = None) -> None:
        """Run on the current contents of the input surfaces (``inputs``: a set from ``input_set``, else the
        kernel's own); results land in the output surfaces."""
        if not self._loaded:
            raise LoadFailed(f"[{self.name}] kernel is not loaded: call load() (or use it in a with block)")
        if inputs is not None and self.input_set_index(inputs) is None:
            raise SurfaceCreationFailed(
                f"[{self.name}] run(inputs=...) takes a set made by this kernel's input_set()"
            )
        self._run_inputs = inputs
        try:
            self._run()
        finally:
            self._run_inputs = None

    def evaluate(self, inputs: list[Surface] | None = None) -> dict[str, np.ndarray]:
        """``run(inputs)`` on the surfaces as they are, then every output as ``kernel(**arrays)`` returns
        it: for an input set whose contents the caller wrote itself (``Surface.write_block``)."""
        if not self._loaded:
            self.load()
        self.run(inputs)
        return {name: self._read_output(surface) for surface, name in zip(self.outputs, self.output_names)}

    def input_set_index(self, inputs: list[Surface]) -> int | None:
        """Which of ``input_sets`` holds exactly these surfaces, in this order (None: none)."""
        for i, have in enumerate(self.input_sets):
            if len(have) == len(inputs) and all(a is b for a, b in zip(have, inputs)):
                return i
        return None

    @property
    def run_inputs(self) -> list[Surface]:
        """The input surfaces the run in progress reads (a backend's ``_run`` takes them from here)."""
        return self.inputs if self._run_inputs is None else self._run_inputs

    def input_set(self) -> list[Surface]:
        """A further set of input surfaces (the shapes and dtypes of ``inputs``), zeroed, owned by the kernel
        and released with it: write it, then ``run(inputs=the set)``. What a set holds stays between runs,
        so contents that change rarely (a layer's weights) are written once, not before every run."""
        if self._closed:
            raise LoadFailed(f"[{self.name}] kernel is closed; compile it again")
        surfaces = [self._new_input(s) for s in self.inputs]
        self.input_sets.append(surfaces)
        self._added_input_set(surfaces)
        return surfaces

    def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
        """Write the named inputs, run, and return every output as a numpy array of its full shape.

        Float outputs come back as float32, integer and bool outputs in their own dtype.
        """
        missing = [n for n in self.input_names if n not in arrays]
        unknown = [n for n in arrays if n not in self.input_names]
        if missing or unknown:
            raise SurfaceCreationFailed(
                f"[{self.name}] inputs are {self.input_names}; missing {missing}, unexpected {unknown}"
            )
        for surface, name in zip(self.inputs, self.input_names):
            a = np.asarray(arrays[name])
            if a.shape != surface.shape:
                raise SurfaceCreationFailed(
                    f"[{self.name}] input '{name}' has shape {list(a.shape)}, expected {list(surface.shape)}"
                )
            self._write_input(surface, a)
        if not self._loaded:
            self.load()
        self.run()
        return {name: self._read_output(surface) for surface, name in zip(self.outputs, self.output_names)}

    def _write_input(self, surface: Surface, a: np.ndarray) -> None:
        """Store one input array of the surface's shape, converted to the surface dtype."""
        with surface.view() as buf:
            buf[...] = a.astype(surface.dtype.np, copy=False)

    def _read_output(self, surface: Surface) -> np.ndarray:
        """One output surface's contents: float32 for float dtypes, else a copy in its own dtype."""
        with surface.view() as buf:
            return buf.astype(np.float32) if surface.dtype.is_float else buf.copy()

    # -- backend hooks -------------------------------------------------------------------------

    def surface_dtype(self, dtype: T.DType) -> str:
        """The dtype a surface holding a tensor of ``dtype`` stores (the tensor's own, by default)."""
        return dtype.name

    def _new_input(self, like: Surface) -> Surface:
        """A surface for an input set, of ``like``'s shape and dtype (the backend's kind of surface)."""
        return Surface(like.shape, like.dtype.name, like.name)

    def _added_input_set(self, surfaces: list[Surface]) -> None:
        """Backend work for a new input set (the engine binds it in a request of its own)."""

    def _load(self) -> None:
        """Backend work to load; the default has nothing to do."""

    def _unload(self) -> None:
        """Backend work to unload; the default has nothing to do."""

    def _run(self) -> None:
        raise NotImplementedError

    @staticmethod
    def _release(resources: list[Any]) -> None:
        for r in resources:
            with contextlib.suppress(Exception):  # a finalizer must not raise
                r.close()


def _surface_for(t: T.Type, name: str, surface_dtype: Callable[[T.DType], str]) -> Surface:
    if isinstance(t, (T.TensorType, T.TensorBufferType)):
        dtype = surface_dtype(t.dtype)
        if not all(isinstance(d, int) for d in t.shape):
            raise CompilationFailed(
                f"[compile] '{name}' has the symbolic shape {t}; kernels need static shapes"
            )
        return Surface(tuple(int(d) for d in t.shape), dtype, name)
    raise CompilationFailed(f"[compile] '{name}' has type {t}; kernel inputs and outputs must be tensors")


def _state_buffer(t: T.StateType, name: str) -> np.ndarray:
    """The zeroed buffer of a state input: float32 for float states (values rounded by the ops)."""
    w = t.wrapped
    if not isinstance(w, T.TensorType) or not w.is_static:
        raise CompilationFailed(f"[compile] state '{name}' has type {t}; states must wrap static tensors")
    dtype = np.float32 if w.dtype.is_float else w.dtype.np
    return np.zeros(tuple(int(d) for d in w.shape), dtype=dtype)


def strict_default() -> bool:
    """Backends refuse what the rule book refuses unless ``ANEKIT_STRICT`` says 0 / false / no / off."""
    return os.environ.get("ANEKIT_STRICT", "1").strip().lower() not in ("0", "false", "no", "off")


class CompileCounter:
    """Compiles counted against a budget: one per process for the engine (``PROCESS_COMPILES``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def take(self) -> None:
        """Count one compile (failed compiles count too: the engine counts them)."""
        with self._lock:
            self._count += 1

    def reset(self) -> None:
        """For tests: count from zero, as a fresh process would."""
        with self._lock:
            self._count = 0


# The engine's compiles of this process, shared by every backend object that drives the engine (rule
# process.compile-budget: mechramc/Orion docs/ane_constraints.md §5, about 119 per process).
PROCESS_COMPILES = CompileCounter()


class Backend:
    """Base of the backends: compile accounting and program preparation shared by all.

    ``compile_count`` is what the counter this backend draws on has counted (``counter``: the process's
    ``PROCESS_COMPILES`` for a backend that drives the engine; by default a counter of its own);
    ``compiles_made`` is what this object compiled itself.

    ``chip`` and ``macos`` say what the backend runs on, as the engine layer's training route takes them
    (``anekit.engine.training_routes.training_route(backend.chip, backend.macos)``): the ane backend
    reports the Mac's; the simulator its chip profile, and "" for macOS (every major the engine layer
    knows).
    """

    name = "base"
    chip = "any"
    macos = ""

    def __init__(
        self, compile_budget: int = DEFAULT_COMPILE_BUDGET, counter: CompileCounter | None = None
    ) -> None:
        self.compile_budget = compile_budget
        self.counter = counter if counter is not None else CompileCounter()
        self.compiles_made = 0

    @property
    def compile_count(self) -> int:
        """Compiles counted against ``compile_budget`` (for the engine: by every backend of the process)."""
        return self.counter.count

    def count_compile(self) -> None:
        """One more compile against the budget (each attempt the engine sees is one)."""
        self.counter.take()
        self.compiles_made += 1

    def compile(
        self, program: Program | str, weights: Weights | None = None, *, function: str = "main"
    ) -> Kernel:
        """Compile MIL (a Program or its text) with its weight files into a Kernel (not yet loaded).

        Every call counts against ``compile_budget``, failed compiles included (the engine counts
        them too); CompileBudgetExhausted is raised before compiling once the budget is used up.
        """
        if self.compile_count >= self.compile_budget:
            raise CompileBudgetExhausted(self.compile_budget)
        self.count_compile()
        prog = prepare_program(program)
        if function in prog.functions:
            fn = prog.functions[function]
        elif function == "main" and len(prog.functions) == 1:
            fn = prog.main
        else:
            have = ", ".join(prog.functions)
            raise CompilationFailed(f"[compile] the program has no function '{function}' (it has: {have})")
        return self._compile(prog, fn, dict(weights or {}))

    def _compile(self, prog: Program, fn: Function, weights: dict[str, WeightSource]) -> Kernel:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} compiles {self.compile_count}/{self.compile_budget}>"


def prepare_program(program: Program | str) -> Program:
    """Parse (if text) and verify; any problem becomes CompilationFailed carrying the original message."""
    prog = None
    try:
        prog = parse_program(program, "<program>") if isinstance(program, str) else program
        return verify(prog)
    except AnekitError as e:
        raise CompilationFailed(f"[compile] the program does not verify:\n{e}{_no_path_hint(prog)}") from e


def _no_path_hint(prog: Program | None) -> str:
    """A line naming the ops of ``prog`` the engine has no path for (rule op.no-engine-path): anekit's
    registry leaves most of them out, so they fail to verify before the rule book sees them."""
    if prog is None:
        return ""
    from anekit.engine.ops import NO_PATH

    found = sorted({op.op_type for fn in prog.functions.values() for op in fn.ops if op.op_type in NO_PATH})
    if not found:
        return ""
    return f"\nop.no-engine-path: the engine has no path for {', '.join(found)} on any chip"
