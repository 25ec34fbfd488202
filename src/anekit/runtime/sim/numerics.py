"""The simulator's engine numerics: ops computed as a chip's numeric profile says, and the sanitizer.

``EngineNumerics`` binds to each step of a simulator plan what the chip's numerics (``runtime.sim.chip``:
its profile in ``anekit.engine.numerics``, resolved once) change about it, on top of the ideal machine
(fp16 storage, fp32 accumulation, exact functions):

* every program input: NaN becomes +inf (``input.nan-coercion``);
* every float result: NaN becomes +0 — the engine never emits NaN (``indeterminate.plus-zero``);
* MAC ops (matmul, linear, einsum, conv, conv_transpose): the output port saturates at 2^15 (a conv
  reading a single input value per output keeps the fp16 range), a running partial that reaches it
  overflows, subnormal operands / products / results are flushed on chips that flush, ties round as the
  chip rounds; a MAC of at most ``exact_products`` products (numerics "engine": ``ENGINE_MAC_PRODUCTS``,
  2^14, every published probe; "exact": ``EXACT_MAC_PRODUCTS``, 2^26, every stories15M training kernel)
  runs the 4-lane first-stage model exactly (``mac.first-stage``; compiled by ``anekit.jit``
  where numba is installed, the same bits), a larger one accumulates in float32 (numpy's BLAS product;
  in the convs and matmuls of a narrow decode-shaped program, each output in ascending order:
  ``runtime.sim.ordered``);
* slices with a nonzero width begin: elements over 4094 saturate on chips with the x16 crop gain;
* reductions (reduce_sum / reduce_mean): one wide sum, ties rounded away from zero;
* tables: sigmoid's domain clamp, gelu's and silu's origin bias, softplus / softsign / log collapses,
  sqrt / rsqrt reading subnormals as 0 or 2^-14, the sign of zero dropped before inverse / rsqrt,
  ``round`` half away through an fp16 add, softmax's max subtraction with inf - inf = +0.

The MAC model is ``runtime.sim.mac``, the ops computed here are in ``runtime.sim.tables``, and the
``runtime.sim.sanitizer.Sanitizer`` counts, per op, every place where the engine's result departs from the
ideal one or loses information (one record per op and hazard: count and the largest offending value).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from anekit import jit
from anekit.engine.numerics import FP16_MAX, FP16_MIN_NORMAL
from anekit.mil import types as T
from anekit.runtime.sim.chip import ChipNumerics
from anekit.runtime.sim.mac import (
    ENGINE_MAC_PRODUCTS,
    MAC_OPS,
    accumulation_terms,
    flush16,
    mac_operands,
    partial_overflow,
    products,
    round16,
    tiled_product,
)
from anekit.runtime.sim.sanitizer import Sanitizer
from anekit.runtime.sim.tables import LIGHT, OVERRIDES

SLICE_OPS = frozenset({"slice_by_size", "slice_by_index"})
REDUCE_OPS = frozenset({"reduce_sum", "reduce_mean"})
SLICE_SAFE = FP16_MAX / 16  # 4094: the largest fp16 value a x16 crop gain keeps finite

# Ops that give no NaN when no input holds one (inputs are coerced, every other result corrected): their
# results need no NaN -> +0 pass.
NAN_FREE = frozenset(
    {
        "relu", "relu6", "tanh", "exp", "exp2", "maximum", "minimum", "abs", "clip", "select",
        "reduce_max", "reduce_min", "floor", "ceil", "sign", "leaky_relu", "clamped_relu", "threshold",
        "gather", "gather_along_axis", "pad", "fill", "cast", "argmax", "argmin",
    }
)  # fmt: skip

# -- the numerics bound to a plan --------------------------------------------------------------------

Values = dict[str, Any]
_F32 = np.dtype(np.float32)
# The compiled loops (numba, ``anekit.jit``), called directly on the hot paths; None without them (every
# path then has its numpy twin). Looked up whenever an EngineNumerics is made: importing this module does
# not import numba.
_LOOPS: Any = None
Runner = Callable[[list[Any]], None]
Reference = Callable[[Values], list[Any]]


class EngineNumerics:
    """A chip's numerics (``runtime.sim.chip.ChipNumerics``) bound to one simulator plan, with an optional
    sanitizer."""

    def __init__(
        self,
        chip: ChipNumerics,
        sanitizer: Sanitizer | None = None,
        exact_products: int = ENGINE_MAC_PRODUCTS,
    ) -> None:
        global _LOOPS
        # MAC ops of at most this many products run the exact first-stage model (numerics "engine":
        # ENGINE_MAC_PRODUCTS, probe sizes; "exact": EXACT_MAC_PRODUCTS, training-kernel sizes)
        self.exact_products = exact_products
        _LOOPS = jit.loops()  # as ``anekit.jit`` decides now (ANEKIT_JIT may have changed)
        self.chip = chip  # what the chip computes (``runtime.sim.chip``)
        self.sanitizer = sanitizer
        self._scans: dict[int, tuple[np.ndarray, int, float, np.ndarray | None]] = {}
        self._input_peaks: dict[int, float] = {}  # program input slot -> its largest |value| this run
        # Slots whose every reader is a MAC op (set by the plan once it is built): their values may be
        # flushed in place, no other op sees the subnormals go.
        self.mac_only_slots: frozenset[int] = frozenset()
        # The MAC steps' constant operands scanned once, when they are bound: id -> (the array, its fp16
        # subnormals, its largest finite |value|); the entry holds the array, so its id stays its own.
        self._constant_scans: dict[int, tuple[np.ndarray, int, float]] = {}
        # Read-only arrays a plan hands to several runs (``runtime.sim.kept``), scanned once: as ``_scans``.
        self._held_scans: dict[int, tuple[np.ndarray, int, float, np.ndarray | None]] = {}
        self._held: set[int] = set()  # the ids of the arrays held (the plan's kept steps hold them alive)

    def hold(self, v: np.ndarray) -> None:
        """``v`` (read-only, its own data) is handed to later runs as it is: its scan, made when a run
        first asks for it (``scan``), is kept until ``release``."""
        self._held.add(id(v))

    def release(self, v: np.ndarray) -> None:
        """Forget ``hold``'s scan of ``v``."""
        self._held.discard(id(v))
        found = self._held_scans.get(id(v))
        if found is not None and found[0] is v:
            del self._held_scans[id(v)]

    def begin_run(self) -> None:
        """Forget the operand scans and input peaks of the last run (a plan calls this before and after
        each run)."""
        self._scans.clear()
        self._input_peaks.clear()

    def scan(self, v: np.ndarray) -> tuple[int, float, np.ndarray | None]:
        """(fp16 subnormals in MAC operand ``v``, its largest finite |value|, its flushed copy or None),
        once per array and run: an activation feeding several products is scanned and flushed once. The
        entry holds ``v`` itself, so its id cannot be reused while the run lasts."""
        found = self._scans.get(id(v)) or self._held_scans.get(id(v))
        if found is not None and found[0] is v:
            return found[1], found[2], found[3]
        subnormals, big = _scan(v)
        flushed = _flushed(v) if subnormals and self.chip.flush else None
        entry = (v, subnormals, big, flushed)
        self._scans[id(v)] = entry
        if id(v) in self._held and not v.flags.writeable:
            self._held_scans[id(v)] = entry
        return subnormals, big, flushed

    def note(self, op: Any, hazard: str, count: int, largest: float = 0.0) -> None:
        """Tell the sanitizer (when there is one) that ``count`` values of ``op`` met ``hazard``."""
        if self.sanitizer is not None and count:
            self.sanitizer.note(op.name, op.op_type, hazard, count, largest)

    # -- inputs ------------------------------------------------------------------------------------

    def coerce_input(self, value: Any, name: str, slot: int | None = None) -> Any:
        """NaN -> +inf in a float input (a fresh array when it changes). With ``slot``, the input's largest
        |value| is kept for the run: a width-offset slice of an input under 4094 cannot saturate."""
        if not (isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size):
            return value
        if _LOOPS is not None and value.dtype == _F32 and value.flags.c_contiguous:
            n, peak = _LOOPS.nan_peak(value.reshape(-1))
        else:
            with np.errstate(invalid="ignore"):
                n = int(np.count_nonzero(np.isnan(value)))
                peak = float(np.max(np.abs(value), initial=0.0, where=~np.isnan(value)))
        if slot is not None:
            self._input_peaks[slot] = math.inf if n else peak
        if n == 0:
            return value
        nan = np.isnan(value)
        if self.sanitizer is not None:
            self.sanitizer.note(name, "input", "nan-coerced", int(nan.sum()), math.inf)
        out = value.copy()
        out[nan] = np.inf
        return out

    def known_input(self, slot: int, peak: float) -> None:
        """A program input known to hold no NaN and no |value| above ``peak``: ``coerce_input`` without
        the scan (it would change nothing)."""
        self._input_peaks[slot] = peak

    # -- outputs -----------------------------------------------------------------------------------

    def no_nan(self, op: Any, v: Any) -> Any:
        """NaN -> +0 in a float result."""
        if type(v) is np.ndarray and v.dtype == _F32:
            flags = v.flags
            if flags.c_contiguous and flags.writeable and _LOOPS is not None:  # the hot path, direct
                n = _LOOPS.nan_to_zero(v.reshape(-1))
                if n and self.sanitizer is not None:
                    self.note(op, "indeterminate", n)
                return v
        if not (isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size):
            return v
        n = jit.nan_to_zero(v)
        if n is None:
            nan = np.isnan(v)
            n = int(np.count_nonzero(nan))
            if n:
                if not v.flags.writeable:
                    v = v.copy()
                v[nan] = 0.0
        self.note(op, "indeterminate", n)
        return v

    def fused_store(self, op_type: str) -> str | None:
        """How an op's fresh fp16 result may be corrected inside its store ("even" / "away": the ties of
        the rounding, NaN -> +0 either way), or None when the op needs more than that (MAC ops, tables,
        slices, ops computed here) or nothing (NaN-free ops)."""
        if op_type in REDUCE_OPS:
            return self.chip.reduce_ties
        if op_type in MAC_OPS or op_type in OVERRIDES or op_type in LIGHT or op_type in SLICE_OPS:
            return None
        return None if op_type in NAN_FREE else "even"

    def round_store(self, op: Any, out: np.ndarray, away: bool) -> np.ndarray | None:
        """Round a fresh float32 result to fp16 in place with NaN -> +0 (and ties away), in one pass."""
        if _LOOPS is None:
            return None
        n = _LOOPS.round_fp16_nan0_inplace(out.reshape(-1), away)
        if n and self.sanitizer is not None:
            self.note(op, "indeterminate", n)
        return out

    def store_numpy(
        self,
        op: Any,
        o: Any,
        inputs: tuple[Any, ...],
        plain: Callable[[Any, tuple[Any, ...]], Any],
        away: bool,
    ) -> np.ndarray:
        """``round_store``'s result the numpy way (no compiled loops, or a result that is not a fresh
        float32 array): the plain store (ties to even) or the ties-away rounding, then NaN -> +0."""
        if away:
            stored = round16(np.asarray(o, dtype=np.float32), "away").astype(np.float32)
        else:
            stored = plain(o, inputs)
        return self.no_nan(op, stored)

    def flushed_constants(self, step: Any, constants: dict[int, Any]) -> dict[int, tuple[np.ndarray, int]]:
        """The constant operands of a MAC step that hold fp16 subnormals on a chip that flushes them:
        slot -> (the operand flushed, how many subnormals it held), made once when the plan is built
        instead of on every run (a weight matrix almost always holds a few). Empty elsewhere."""
        if not self.chip.flush or self.chip.mac_ties != "even" or step.op.op_type not in MAC_OPS:
            return {}
        found: dict[int, tuple[np.ndarray, int]] = {}
        args = dict(step.args)
        for key in ("x", "y", "weight"):
            slot = args.get(key)
            if not isinstance(slot, int):
                continue
            v = constants.get(slot)
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                subnormals, _ = _scan(v)
                if subnormals:
                    flushed = _flushed(v)
                    flushed.flags.writeable = False  # a constant: no runner writes into it
                    found[slot] = (flushed, subnormals)
        return found

    def needs_values(self, op_type: str) -> bool:
        """Whether the op is computed here (rather than by its reference, then corrected)."""
        return op_type in MAC_OPS or op_type in OVERRIDES

    def evaluate(self, step: Any, values: Values, reference: Callable[[Values], list[Any]]) -> list[Any]:
        """The op's stored outputs under the profile: ``reference(values)`` gives its ideal stored outputs."""
        op_type = step.op.op_type
        if op_type in MAC_OPS:
            return [self._mac(step, values, reference)]
        outs = OVERRIDES[op_type](self, step, values, reference)
        return [self.no_nan(step.op, store(o)) for store, o in zip(step.stores, outs)]

    def after(self, step: Any, values: Values, out: Any) -> Any:
        """Correct an output computed by the op's own reference (every op not computed here)."""
        op_type = step.op.op_type
        if op_type in SLICE_OPS and self.chip.slice_gain:
            out = self._slice(step, values, out)
        return self.no_nan(step.op, out)

    # -- runners: what a plan step runs under the profile --------------------------------------------

    def bind(
        self,
        step: Any,
        runner: Runner,
        values_of: Callable[[list[Any]], Values],
        reference: Callable[[Values], list[Any]],
        constants: dict[int, Any],
        ported: list[Any] | None = None,
        flushed: dict[int, tuple[np.ndarray, int]] | None = None,
    ) -> Runner:
        """``runner`` (the step's ideal runner) under the profile: the op's own fast runner with the
        profile's corrections around it where that gives the profile's result, the op computed here
        (``evaluate``) otherwise; ``runner`` itself when the profile changes nothing about the op.
        ``flushed``: a MAC step's constant operands flushed once (``flushed_constants``), which ``runner``
        was bound to."""
        op_type = step.op.op_type
        slots = dict(step.args)
        out_slots = step.out_slots

        def computed(env: list[Any]) -> None:
            for slot, value in zip(out_slots, self.evaluate(step, values_of(env), reference)):
                env[slot] = value

        if op_type in MAC_OPS:
            for key in ("x", "y", "weight"):  # scanned here once, not on every run ``evaluate`` makes
                v = constants.get(slots[key]) if isinstance(slots.get(key), int) else None
                if isinstance(v, np.ndarray) and v.dtype.kind == "f" and id(v) not in self._constant_scans:
                    self._constant_scans[id(v)] = (v, *_scan(v))
            mac = self._bind_mac(step, runner, values_of, reference, slots, constants, ported, flushed or {})
            return mac or computed
        if op_type in LIGHT:
            return LIGHT[op_type](self, step, runner, values_of, reference, slots) or computed
        if op_type in OVERRIDES:
            return computed
        if op_type in SLICE_OPS and self.chip.slice_gain:
            return self._bind_slice(step, runner, slots, constants)
        floats = any(isinstance(t, T.TensorType) and t.dtype.kind == "float" for t in step.out_types)
        if not floats or step.moves_only or op_type in NAN_FREE:
            return runner
        op = step.op
        no_nan = self.no_nan
        if len(out_slots) == 1:
            (out_slot,) = out_slots

            def corrected_one(env: list[Any]) -> None:
                runner(env)
                env[out_slot] = no_nan(op, env[out_slot])

            return corrected_one

        def corrected(env: list[Any]) -> None:
            runner(env)
            for slot in out_slots:
                env[slot] = no_nan(op, env[slot])

        return corrected

    def slice_saturation(self, step: Any) -> Callable[[Any], Any]:
        """A width-offset slice's values on a chip with the x16 crop gain: |v| > 4094 becomes +/-inf. A
        slice of a program input whose largest |value| this run is at most 4094 is left as it is."""
        op = step.op
        source: Any = dict(step.args).get("x")  # a slot (an int)
        peaks = self._input_peaks

        def saturate(out: Any) -> Any:
            if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.size):
                return out
            if peaks.get(source, math.inf) <= SLICE_SAFE:
                return out  # sliced from an input with nothing over 4094
            found = jit.saturate_over(out, SLICE_SAFE) if out.flags.writeable else None
            if found is None:
                big = (np.abs(out) > SLICE_SAFE) & np.isfinite(out)
                found = (int(np.count_nonzero(big)), float(np.max(np.abs(out[big]), initial=0.0)))
                if found[0]:
                    out = np.where(big, np.copysign(np.inf, out), out).astype(np.float32)
            self.note(op, "slice-saturated", *found)
            return out

        return saturate

    def width_offset(self, step: Any, constants: dict[int, Any]) -> bool | None:
        """Whether a slice's begin on the last axis is nonzero: True / False for a constant begin, None for
        a runtime one (known only when it runs)."""
        begin_slot = dict(step.args).get("begin")
        begin = constants.get(begin_slot) if isinstance(begin_slot, int) else None
        if begin is None:
            return None if isinstance(begin_slot, int) else False
        return bool(np.asarray(begin).reshape(-1)[-1:].any())

    def _bind_slice(
        self, step: Any, runner: Runner, slots: dict[str, Any], constants: dict[int, Any]
    ) -> Runner:
        offset = self.width_offset(step, constants)
        if offset is False:
            return runner  # the clean route: a zero width begin
        saturate = self.slice_saturation(step)
        (out_slot,) = step.out_slots
        begin_slot: Any = slots.get("begin")  # a slot: the begin is a runtime value here

        def sliced(env: list[Any]) -> None:
            runner(env)
            if offset or np.asarray(env[begin_slot]).reshape(-1)[-1:].any():
                env[out_slot] = saturate(env[out_slot])

        return sliced

    def _bind_mac(
        self,
        step: Any,
        runner: Runner,
        values_of: Callable[[list[Any]], Values],
        reference: Callable[[Values], list[Any]],
        slots: dict[str, Any],
        constants: dict[int, Any],
        ported: list[Any] | None = None,
        flushed: dict[int, tuple[np.ndarray, int]] | None = None,
    ) -> Runner | None:
        """The wide path around the op's own runner (``ported``: the cell where a runner whose store is the
        output port leaves the port's counts): operands scanned (flushed where the chip flushes),
        then the output port in one pass. None where the op must be computed here (probe-sized ops run
        the exact tile model; M5-style tie rounding without a ported runner; operands of unknown shape).

        A constant operand holding subnormals on a chip that flushes is read flushed: ``flushed`` holds
        its flushed copy (made once, ``flushed_constants``; ``runner`` is bound to it), which stands in
        its slot while the op runs and its output port and partials are worked out, as ``evaluate``
        reads it; the sanitizer hears of its subnormals on every run as ``evaluate`` tells it."""
        op, op_type = step.op, step.op.op_type
        away = self.chip.mac_ties != "even"
        if away and ported is None:
            return None  # M5-style ties need the unrounded product, which only a ported runner rounds
        operands = [(k, slots[k]) for k in ("x", "y", "weight") if isinstance(slots.get(k), int)]
        constant_peaks: dict[int, float] = {}  # constant operands, scanned once here
        for _, slot in operands:
            v = constants.get(slot)
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                subnormals, constant_peaks[slot] = _scan(v)
                if subnormals and self.chip.flush and slot not in (flushed or {}):
                    return None  # a constant holding subnormals: computed here (flushed) every run
        (out_slot,) = step.out_slots
        port = self.port_ceiling(step)  # the ceiling the store applies, when ``ported``
        sizes: dict[tuple[Any, ...], tuple[bool, int]] = {}  # operand shapes -> (exact model?, terms)
        last: list[Any] = [None, (False, 0)]  # the operand shapes of the last run, and what they gave
        slot_list = [s for _, s in operands]
        sanitizer, flush = self.sanitizer, self.chip.flush
        in_place: list[bool] | None = None  # per operand: only MAC ops read its slot (known once built)
        preflushed = [(slot, value, count) for slot, (value, count) in (flushed or {}).items()]

        def mac(env: list[Any]) -> None:
            shapes = [getattr(env[s], "shape", None) for s in slot_list]
            if shapes == last[0]:
                exact, terms = last[1]
            else:
                key = tuple(shapes)
                known = sizes.get(key)
                if known is None:
                    values = values_of(env)
                    ops = mac_operands(op_type, values)
                    exact = ops is not None and products(*ops) <= self.exact_products
                    known = sizes[key] = (exact, accumulation_terms(op_type, values))
                last[0], last[1] = shapes, known
                exact, terms = known
            if exact:  # a probe-sized op: the exact tile model
                (env[out_slot],) = self.evaluate(step, values_of(env), reference)
                return
            if not preflushed:
                wide(env, terms, False)
                return
            held = [env[slot] for slot, _, _ in preflushed]
            for slot, value, count in preflushed:  # read flushed, as ``evaluate`` reads it
                env[slot] = value
                if sanitizer is not None:
                    self.note(op, "subnormal-flush", count)
            try:
                wide(env, terms, True)
            finally:
                for (slot, _, _), value in zip(preflushed, held):
                    env[slot] = value

        def wide(env: list[Any], terms: int, held: bool) -> None:
            """The product by ``runner`` on the operands scanned and flushed (``held``: flushed operands
            stay in their slots until the partials are worked out)."""
            nonlocal in_place
            if in_place is None:
                in_place = [flush and s in self.mac_only_slots for s in slot_list]
            single_tap = op_type in ("conv", "conv_transpose") and terms < 2
            ceiling = math.inf if single_tap else self.chip.mac_ceiling
            largest = 1.0
            swapped = []
            for slot, alone_ok in zip(slot_list, in_place):
                if slot in constant_peaks:
                    largest *= constant_peaks[slot]
                    continue
                v = env[slot]
                if alone_ok and _LOOPS is not None and _alone(v) and v.dtype == _F32 and v.flags.c_contiguous:
                    n, big = _LOOPS.scan_flush_inplace(
                        v.reshape(-1)
                    )  # no other reader: flushed where it lies
                    if n and sanitizer is not None:
                        self.note(op, "subnormal-flush", n)
                    largest *= big
                    continue
                if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                    subnormals, big, flushed = self.scan(v)
                    largest *= big
                    if flushed is not None:
                        self.note(op, "subnormal-flush", subnormals)
                        swapped.append((slot, v))
                        env[slot] = flushed
            if ported is not None:
                ported[0] = None
            try:
                runner(env)
            finally:
                if not held:
                    for slot, v in swapped:
                        env[slot] = v
            try:
                finish(env, ceiling, largest, terms, single_tap)
            finally:
                if held:  # the partials read every operand flushed, as ``evaluate`` reads them
                    for slot, v in swapped:
                        env[slot] = v

        def finish(env: list[Any], ceiling: float, largest: float, terms: int, single_tap: bool) -> None:
            """The output port on the product, then the running partials where they can reach it."""
            out = env[out_slot]
            if ported is not None and ported[0] is not None and ceiling == port:
                nans, over, biggest, n_flushed = ported[0]  # the store was the port
            elif away:  # the product was rounded to even by a store that was not the port: computed here
                (env[out_slot],) = self.evaluate(step, values_of(env), reference)
                return
            else:
                if not (out.flags.writeable and out.flags.owndata):  # a product is a fresh array: else copy
                    out = env[out_slot] = np.array(out, dtype=np.float32)
                nans, over, biggest, n_flushed = _port(out, ceiling, flush)
            if sanitizer is not None:
                self.note(op, "indeterminate", nans)
                self.note(op, "mac-ceiling", over, biggest)
                self.note(op, "subnormal-flush", n_flushed)
            if largest * terms >= ceiling and self.chip.partials and not single_tap:
                ops = (
                    mac_operands(op_type, values_of(env)) if op_type in ("matmul", "linear", "conv") else None
                )
                if ops is not None:
                    self._partials(op, out, ops, ceiling)

        return mac

    def port_ceiling(self, step: Any) -> float | None:
        """The output-port ceiling of a MAC step, known from its types: matmul and linear always have it,
        a conv with two or more taps (input channels / groups x kernel) too, a single-tap conv none
        (inf); None when the types do not tell (a conv weight of unknown shape)."""
        op_type = step.op.op_type
        if op_type in ("matmul", "linear", "einsum"):
            return self.chip.mac_ceiling
        if op_type == "conv":
            w = step.op.inputs.get("weight")
            shape = getattr(getattr(w, "type", None), "shape", None)
            if shape is None or not all(isinstance(d, int) for d in shape[1:]):
                return None
            return self.chip.mac_ceiling if math.prod(shape[1:]) >= 2 else math.inf
        return None

    def _partials(self, op: Any, out: np.ndarray, ops: tuple[np.ndarray, np.ndarray], ceiling: float) -> None:
        """Outputs whose running partial reached the ceiling (``partial_overflow``) become +/-inf in place."""
        mask = partial_overflow(*ops, ceiling)
        if mask is None:
            return
        mask = mask.reshape(out.shape) & np.isfinite(out)
        n = int(np.count_nonzero(mask))
        if n:
            self.note(op, "mac-partial", n, float(np.max(np.abs(out[mask]))))
            out[mask] = np.inf * np.where(out[mask] < 0, -1.0, 1.0)

    # -- per-op numerics ---------------------------------------------------------------------------

    def _slice(self, step: Any, values: Values, out: Any) -> Any:
        """A slice computed by its reference (a folded constant): saturated as a width-offset slice is."""
        begin = np.asarray(values.get("begin", 0)).reshape(-1)
        if not (begin.size and begin[-1] != 0):
            return out
        return self.slice_saturation(step)(out)

    def _mac(self, step: Any, values: Values, reference: Callable[[Values], list[Any]]) -> Any:
        op, op_type = step.op, step.op.op_type
        # The port saturates for matmul / linear / einsum whatever K (the guide measured K = 1), and for a
        # conv that accumulates two or more taps; a single-tap conv keeps the fp16 range.
        single_tap = op_type in ("conv", "conv_transpose") and accumulation_terms(op_type, values) < 2
        ceiling = math.inf if single_tap else self.chip.mac_ceiling
        largest: dict[str, float] = {}
        copied = False
        for key in ("x", "y", "weight"):  # subnormal operands read as +0 where the chip flushes
            v = values.get(key)
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                known = self._constant_scans.get(id(v))
                subnormals, largest[key] = known[1:] if known is not None and known[0] is v else _scan(v)
                if subnormals and self.chip.flush:
                    self.note(op, "subnormal-flush", subnormals)
                    if not copied:  # the caller's dict stays as it was
                        values, copied = dict(values), True
                    values[key] = _flushed(v)
        ops = mac_operands(op_type, values)
        (store,) = step.stores
        if ops is not None and products(*ops) <= self.exact_products:
            a, b = ops
            exact, over = tiled_product(
                a, b, ceiling, self.chip.flush, self.chip.tile_rounding, self.chip.mac_ties
            )
            ideal = np.matmul(a.astype(np.float64), b.astype(np.float64))
            out = exact.reshape(_out_shape(step, values, exact))
            self.note(
                op,
                "mac-partial",
                int(np.count_nonzero(over & (np.abs(ideal) < ceiling))),
                float(np.max(np.abs(ideal[over]), initial=0.0)),
            )
            ceiling_hits = over & (np.abs(ideal) >= ceiling)
            self.note(
                op,
                "mac-ceiling",
                int(np.count_nonzero(ceiling_hits)),
                float(np.max(np.abs(ideal[ceiling_hits]), initial=0.0)),
            )
            return self.no_nan(op, store(out.astype(np.float32)))
        # Wide path: the reference's float32 product, then the port.
        (raw,) = reference(values)
        raw = np.asarray(raw, dtype=np.float32)
        if self.chip.mac_ties == "away":  # the compiled rounding where there is one: the same bits
            away = jit.round_fp16_away(raw)
            raw = round16(raw, "away").astype(np.float32) if away is None else away
        out = store(raw)
        if not out.flags.writeable or (np.may_share_memory(out, raw) and out is not raw):
            out = out.copy()
        nans, n_over, biggest, n_flushed = _port(out, ceiling, self.chip.flush)
        self.note(op, "indeterminate", nans)
        self.note(op, "mac-ceiling", n_over, biggest)
        self.note(op, "subnormal-flush", n_flushed)
        if self.chip.partials and not single_tap and ops is not None:
            k = ops[0].shape[-1]
            bound = max(largest.values(), default=math.inf)
            if len(largest) < 2 or bound * min(largest.values()) * k >= ceiling:
                self._partials(op, out, ops, ceiling)
        return out


def _alone(v: Any) -> bool:
    """Whether ``v`` is an array nothing else can see: it owns its data (no view of another array), and
    its only references are the plan's slot, the caller's local name, this function's parameter and
    getrefcount's own argument (a view of it, another slot or a cache holding it would add one)."""
    return type(v) is np.ndarray and v.flags.owndata and v.flags.writeable and sys.getrefcount(v) <= 4


def _scan(v: np.ndarray) -> tuple[int, float]:
    """(fp16 subnormals in ``v``, its largest finite |value|)."""
    if _LOOPS is not None and v.dtype == _F32:  # a strided view is read through a dense copy
        return _LOOPS.scan_operand(np.ascontiguousarray(v).reshape(-1))
    found = jit.scan_operand(v) if v.dtype == np.float32 else None
    if found is not None:
        return found
    a = np.abs(v)
    finite = a[np.isfinite(a)]
    return int(np.count_nonzero((a < FP16_MIN_NORMAL) & (a > 0))), float(finite.max(initial=0.0))


def _flushed(v: np.ndarray) -> np.ndarray:
    out = jit.flush_subnormals(v)
    return out if out is not None else flush16(v).astype(v.dtype)


def _port(out: np.ndarray, ceiling: float, flush: bool) -> tuple[int, int, float, int]:
    """The MAC output port in place on fp16 values (``jit.mac_port``'s numpy twin)."""
    if _LOOPS is not None and out.dtype == _F32 and out.flags.c_contiguous and out.flags.writeable:
        return _LOOPS.mac_port(out.reshape(-1), np.float32(ceiling), flush)
    found = jit.mac_port(out, ceiling, flush)
    if found is not None:
        return found
    nan = np.isnan(out)
    out[nan] = 0.0
    with np.errstate(invalid="ignore"):
        a = np.abs(out)
        hit = (a >= ceiling) & np.isfinite(out)
        biggest = float(a[hit].max(initial=0.0))
        out[hit] = np.copysign(np.inf, out[hit])
        sub = (a < FP16_MIN_NORMAL) & (a > 0) if flush else np.zeros(out.shape, bool)
        out[sub] = 0.0
    return int(nan.sum()), int(hit.sum()), biggest, int(sub.sum())


def _out_shape(step: Any, values: Values, product: np.ndarray) -> tuple[int, ...]:
    """The op's own output shape for the (…, M, N) product (a conv's [N, C, H, W])."""
    if step.op.op_type == "conv":
        x = np.asarray(values["x"])
        return (x.shape[0], product.shape[-2], x.shape[2], x.shape[3])
    return product.shape
