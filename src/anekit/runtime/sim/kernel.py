"""The simulator's kernel: its plan runs on the host, fp16 values crossing its surfaces without a second
conversion; a caller that reads only the first columns of its outputs may say so (``compute_columns``),
and the caller of a causal program may hand the kernel its narrowed copies (``causal``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from anekit import jit
from anekit.errors import EvalFailed
from anekit.fp16 import _round_fp16_fast, encode_fp16_values
from anekit.mil import types as T
from anekit.mil.ir import Function, Program
from anekit.runtime.base import Backend, Kernel, Surface, Weights, WeightSource, prepare_program
from anekit.runtime.sim.columns import Copy, NarrowRuns, fit
from anekit.runtime.sim.held import HeldSurface
from anekit.runtime.sim.kept import Source
from anekit.runtime.sim.mirror import Mirror, mirror_for
from anekit.runtime.sim.plan import Plan

_FP16_NAN = np.uint16(0x7E00)


class SimKernel(Kernel):
    """A kernel of the simulator: its plan runs on the host."""

    def __init__(
        self,
        backend: Backend,
        fn: Function,
        plan: Plan,
        rebuild: Callable[..., Plan] | None = None,
        wide_from: int | None = None,
        lazy: bool = True,
        weights: dict[str, WeightSource] | None = None,
    ) -> None:
        self.precision = plan.precision  # the backend's, which it compiled the plan with
        super().__init__(backend, fn)
        self.plan = plan
        self.fn = fn
        # compiles ``fn`` or a narrowed copy of it as ``plan`` was compiled: (function, precision, weight
        # files or None, the plan whose constants and ordering it takes) -> Plan
        self._rebuild = rebuild
        self._lazy = lazy and rebuild is not None  # False: every run computes every column
        self._weights = weights or {}  # the program's weight files, as compiled
        self._wide_from = wide_from  # the MAC size from which the numerics take the BLAS product
        self._columns: int | None = None  # the output columns the caller reads (None: all)
        self._narrow: NarrowRuns | None = None
        self._copies: Callable[[int], tuple[Program | Function, Weights] | None] | None = None
        # Where each function input comes from: a state buffer (by name) or the next input surface.
        self._state_inputs = [v.name if isinstance(v.type, T.StateType) else None for v in fn.inputs]
        self._state_shapes = {name: buf.shape for name, buf in self.states.items()}
        # Only while __call__ runs (surface id -> float32 array): the fp16 values just written to an input
        # surface and those just stored in an output surface, so that neither is converted back from fp16
        # (it would give the same bits).
        self._in_call = False
        self._written: dict[int, np.ndarray] = {}
        # surface id -> (float32 values, True if the caller may have them without a copy)
        self._results: dict[int, tuple[np.ndarray, bool]] = {}
        # surface id -> its buffer kept decoded between runs (None: decoded on each run)
        self._mirrors: dict[int, Mirror | None] = {}
        self._unmirrored: set[int] = set()  # surfaces the host rewrites whole: never mirrored again

    def compute_columns(self, columns: int | None) -> None:
        """The caller reads only output columns 0 .. ``columns``-1 of the next runs (None: every column).

        A column-separable program (``runtime.sim.columns``), or a causal one whose copies the caller
        handed over (``causal``), then runs narrowed to the fewest columns that give those columns the full
        run's bits, and every other column of its output surfaces holds NaN; any other program computes
        every column as before."""
        if columns is not None and columns < 1:
            raise EvalFailed(f"[{self.name}] compute_columns needs a column count >= 1, got {columns}")
        self._columns = columns

    def causal(self, copies: Callable[[int], tuple[Program | Function, Weights] | None]) -> None:
        """The caller's word that this program is causal along its width and is run on chunks padded to it:
        output column j depends on input columns 0 .. j alone (and on inputs that do not end in the width,
        such as a cache), and the columns past a chunk's real ones are padding the program masks from them
        (a generation kernel's attention over its own chunk: ``anekit.generate.layers``). ``copies(n)``: the
        same program built for a chunk of n columns (its inputs and outputs that end in the width end in
        n; a cache input as it is; the softmax over the cache and the chunk n keys shorter) and its weight
        files, or None where there is none.

        A kernel told ``compute_columns(c)`` then runs the narrowest copy, of the widths
        ``columns.candidates`` tries, whose first c columns ``NarrowRuns`` measures to be the full run's
        bits (the padding it drops adds only exact zeros where it is masked: a decode-shaped program's
        convs, matmuls, softmax sums and one-axis reductions are taken in order, ``runtime.sim.ordered``),
        and fills the other columns with NaN. The measurement checks the orders of summation; that the
        padding is masked is the caller's word. A kernel whose plan does not sum in order (wider than
        ``ORDERED_WIDTH``: prefill keeps the BLAS product) ignores its copies and computes every
        column. A copy whose weight file of a path holds other bytes than this kernel's is refused
        (EvalFailed)."""
        if self._rebuild is None or not self.plan.ordered:
            return
        self._copies = copies
        self._narrow = None

    def _width(self) -> int | None:
        shape = self.outputs[0].shape if self.outputs else ()
        return int(shape[-1]) if shape else None

    def _copy(self, n: int) -> Copy | None:
        """The causal copy at n columns, checked against this program: its function and weight files."""
        assert self._copies is not None
        found = self._copies(n)
        if found is None:
            return None
        program, files = found
        fn = program if isinstance(program, Function) else prepare_program(program).main
        width = self._width()
        pairs = [("input", a, b) for a, b in zip(self.fn.inputs, fn.inputs)]
        pairs += [("output", a, b) for a, b in zip(self.fn.outputs, fn.outputs)]
        for what, mine, theirs in pairs:
            a, b = getattr(mine.type, "shape", None), getattr(theirs.type, "shape", None)
            ok = a is not None and b is not None and mine.name == theirs.name and a[:-1] == b[:-1]
            cut_to_n = b is not None and a is not None and b[-1] == n and a[-1] == width
            ok = ok and (cut_to_n or (what == "input" and b is not None and a is not None and b[-1] == a[-1]))
            if not ok:
                raise EvalFailed(
                    f"[{self.name}] causal copy at {n} columns: {what} '{theirs.name}' {list(b or ())} does "
                    f"not match '{mine.name}' {list(a or ())} (the width cut to {n}, every other axis kept)"
                )
        if len(fn.inputs) != len(self.fn.inputs) or len(fn.outputs) != len(self.fn.outputs):
            raise EvalFailed(f"[{self.name}] causal copy at {n} columns: other inputs or outputs")
        files = dict(files)
        for path in files.keys() & self._weights.keys():
            if _file_bytes(files[path]) != _file_bytes(self._weights[path]):
                raise EvalFailed(
                    f"[{self.name}] causal copy at {n} columns: weight file '{path}' holds other bytes "
                    "than the kernel's"
                )
        return fn, files

    def _narrowed(self) -> tuple[int, Plan] | None:
        """The narrowed plan for the columns asked for, if one gives their bits."""
        columns, width = self._columns, self._width()
        if columns is None or not self._lazy or width is None or columns >= width:
            return None
        if self._narrow is None:
            rebuild = self._rebuild
            assert rebuild is not None

            def build(fn: Function, precision: str | None, files: Any) -> Plan:
                return rebuild(fn, precision, files, self.plan)

            copy = None if self._copies is None else self._copy
            self._narrow = NarrowRuns(self.fn, width, build, self.plan, self._wide_from, copy=copy)
        return self._narrow.choose(columns)

    def surface_dtype(self, dtype: T.DType) -> str:
        """In fp32 precision 16-bit float tensors travel in float32 surfaces (no rounding at the boundary)."""
        if self.precision == "fp32" and dtype.name in ("fp16", "bf16"):
            return "fp32"
        return dtype.name

    def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
        self._in_call = True
        try:
            return super().__call__(**arrays)
        finally:
            self._in_call = False
            self._written.clear()
            self._results.clear()

    def _new_input(self, like: Surface) -> Surface:
        """An input set's surface: fp16 ones hold their float32 values for the plan (``runtime.sim.held``)."""
        if like.dtype.name == "fp16":
            return HeldSurface(like.shape, "fp16", like.name)
        return super()._new_input(like)

    def evaluate(self, inputs: list[Surface] | None = None) -> dict[str, np.ndarray]:
        """``Kernel.evaluate``, the outputs handed over as ``__call__`` hands them (not decoded again)."""
        self._in_call = True
        try:
            return super().evaluate(inputs)
        finally:
            self._in_call = False
            self._written.clear()
            self._results.clear()

    def _write_input(self, surface: Surface, a: np.ndarray) -> None:
        """float32 into fp16: rounded once to fp16 values (the plan's input), which are encoded exactly."""
        if surface.dtype.name == "fp16" and a.dtype == np.float32:
            rounded = np.empty(a.shape, np.float32)
            with surface.view() as buf:
                if jit.round_encode_into(a, rounded, buf.view(np.uint16)):  # one pass: the common case
                    self._written[surface.id] = rounded
                    return
            values: np.ndarray | None = rounded
            if not jit.round_fp16_into(a, rounded):
                with np.errstate(all="ignore"):  # None for NaN, inf and |x| >= 65520: numpy casts those
                    values = _round_fp16_fast(a, None)
            if values is not None:
                with surface.view() as buf:
                    if encode_fp16_values(values, buf.view(np.uint16)):
                        self._written[surface.id] = values
                        return
        super()._write_input(surface, a)

    def _read_output(self, surface: Surface) -> np.ndarray:
        """The float32 values just stored in an fp16 (encoded) or fp32 output surface, else the surface
        decoded."""
        values = self._results.pop(surface.id, None)
        if values is None:
            return super()._read_output(surface)
        value, owned = values
        return value if owned else value.copy()

    def _unshared(self, value: Any, ins: list[np.ndarray], handed: list[Any]) -> bool:
        """True if an output array made by this run is referenced by nothing else: it owns its data and
        is none of the plan's constants, none of this run's inputs (a state buffer is one) and no output
        handed out before. Such a value is given to the caller as it is; any other is copied."""
        return (
            type(value) is np.ndarray
            and value.flags.owndata
            and id(value) not in self.plan.constant_ids
            and not any(value is x for x in ins)
            and not any(value is x for x in handed)
        )

    def _run(self) -> None:
        ins: list[np.ndarray] = []
        stored: set[int] = set()
        peaks: dict[int, float] = {}  # input index -> its largest |value|, where a mirror read it
        sources: dict[int, Source] = {}  # input index -> what changed in it (``runtime.sim.kept``)
        surfaces = iter(self.run_inputs)
        for state in self._state_inputs:
            if state is not None:
                buf = self.states.get(state)
                want = self._state_shapes[state]
                if buf is None or buf.shape != want:
                    raise EvalFailed(
                        f"[{self.name}] state '{state}' must be an array of shape {list(want)} in "
                        f"kernel.states, got {None if buf is None else list(buf.shape)}"
                    )
                ins.append(buf)  # the buffer itself: state ops read and write it in place
                continue
            surface = next(surfaces)
            if isinstance(surface, HeldSurface):  # an input set's: its float32 values, read in place
                values, nans, peak = surface.held()
                if nans == 0:  # with a NaN the plan's own store decodes it and coerces as the engine does
                    stored.add(len(ins))
                    peaks[len(ins)] = peak
                    sources[len(ins)] = surface.changes
                    ins.append(values)
                    continue
                with surface.view() as buf:
                    ins.append(buf)
                continue
            written = self._written.pop(surface.id, None)
            if written is not None:  # the values __call__ just wrote, already as fp16 values in float32
                stored.add(len(ins))
                ins.append(written)
                continue
            # The plan's input stores convert fp16 -> float32; a float32 surface is read in place: no step
            # writes into its inputs, and an output that is or views an input is copied before it is
            # handed out (``_unshared``, ``_read_output``). A large fp16 surface is kept decoded between
            # runs (``runtime.sim.mirror``): only what the host changed is decoded again.
            with surface.view() as buf:
                mirror = None
                if surface.id not in self._unmirrored:
                    mirror = self._mirrors[surface.id] = mirror_for(buf, self._mirrors.get(surface.id))
                if mirror is not None and mirror.refresh(buf):
                    if not mirror.worth:  # rewritten whole: decoded on each run from now on
                        self._unmirrored.add(surface.id)
                        del self._mirrors[surface.id]
                    stored.add(len(ins))
                    peaks[len(ins)] = mirror.peak
                    sources[len(ins)] = mirror.changes
                    ins.append(mirror.values)
                    continue
                ins.append(buf)
        narrow = self._narrowed()
        if narrow is not None:
            _, plan = narrow
            self._results.clear()
            fitted = fit(ins, plan.input_widths)
            kept = {
                i: m for i, m in sources.items() if fitted[i] is ins[i]
            }  # the inputs it reads as they are
            # a cut input's peak is at most its whole input's: the same coercion, no scan
            self._store_columns(plan.run(fitted, frozenset(stored), peaks, kept))
            return
        outs = self.plan.run(ins, frozenset(stored), peaks, sources)
        self._results.clear()
        handed: list[Any] = []
        for surface, value in zip(self.outputs, outs):
            with surface.view() as buf:
                try:
                    v = np.asarray(value).reshape(buf.shape)
                except ValueError as e:
                    raise EvalFailed(f"[{self.name}] output '{surface.name}': {e}") from e
                if (
                    buf.dtype == np.float16
                    and v.dtype == np.float32
                    and encode_fp16_values(v, buf.view(np.uint16))
                ):
                    if self._in_call:  # __call__ reads it next: hand it the float32 values
                        self._results[surface.id] = (v, self._unshared(value, ins, handed))
                        handed.append(value)
                else:
                    with np.errstate(over="ignore"):  # values past the fp16 range become inf
                        buf[...] = v
                    if self._in_call and buf.dtype == np.float32 and v.dtype == np.float32:
                        self._results[surface.id] = (v, self._unshared(value, ins, handed))  # the same values
                        handed.append(value)

    def _store_columns(self, outs: list[np.ndarray]) -> None:
        """A narrowed run's outputs into the output surfaces: the columns asked for, NaN in every other."""
        assert self._columns is not None
        c = self._columns
        for surface, value in zip(self.outputs, outs):
            with surface.view() as buf:
                v = np.asarray(value)
                if buf.ndim != v.ndim or buf.shape[:-1] != v.shape[:-1]:
                    raise EvalFailed(f"[{self.name}] output '{surface.name}' has shape {list(v.shape)}")
                if buf.dtype == np.float16:
                    buf.view(np.uint16)[...] = _FP16_NAN
                else:
                    buf[...] = np.nan
                with np.errstate(over="ignore"):  # values past the fp16 range become inf
                    buf[..., :c] = v[..., :c]
                if self._in_call and buf.dtype in (np.float16, np.float32) and v.dtype == np.float32:
                    # what __call__ reads next, without decoding the surface: the same values (fp16 values
                    # held in float32 are what the surface encodes), NaN where it holds NaN
                    handed = np.full(buf.shape, np.nan, np.float32)
                    handed[..., :c] = v[..., :c]
                    self._results[surface.id] = (handed, True)


def _file_bytes(source: WeightSource) -> bytes:
    """A weight file's bytes: the buffer given, or the file at the path."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    return Path(source).read_bytes()
