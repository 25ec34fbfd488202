"""The simulator's engine numerics: ops computed as a chip's numeric profile says, and the sanitizer.

``EngineNumerics`` binds to each step of a simulator plan what the profile (``anekit.engine.numerics``)
changes about it, on top of the ideal machine (fp16 storage, fp32 accumulation, exact functions):

* every program input: NaN becomes +inf (``input.nan-coercion``);
* every float result: NaN becomes +0 — the engine never emits NaN (``indeterminate.plus-zero``);
* MAC ops (matmul, linear, einsum, conv, conv_transpose): the output port saturates at 2^15 (a conv
  reading a single input value per output keeps the fp16 range), a running partial that reaches it
  overflows, subnormal operands / products / results are flushed on chips that flush, ties round as the
  chip rounds; a MAC of at most ``EXACT_MAC_PRODUCTS`` products runs the 4-lane first-stage model
  exactly (``mac.first-stage``), a larger one accumulates in float32 as before;
* slices with a nonzero width begin: elements over 4094 saturate on chips with the x16 crop gain;
* reductions (reduce_sum / reduce_mean): one wide sum, ties rounded away from zero;
* tables: sigmoid's domain clamp, gelu's and silu's origin bias, softplus / softsign / log collapses,
  sqrt / rsqrt reading subnormals as 0 or 2^-14, the sign of zero dropped before inverse / rsqrt,
  ``round`` half away through an fp16 add, softmax's max subtraction with inf - inf = +0.

The ``Sanitizer`` counts, per op, every place where the engine's result departs from the ideal one or
loses information (one record per op and hazard: count and the largest offending magnitude).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from anekit import jit
from anekit.engine.numerics import FP16_MAX, FP16_MIN_NORMAL, SOFTPLUS_COLLAPSE, TABLES, Profile
from anekit.mil import types as T

# A MAC op with at most this many products (probe-sized programs) runs the exact 4-lane first-stage
# model; larger ones accumulate in float32 (BLAS), within the tiles' roundings (a few fp16 ulps) of it.
EXACT_MAC_PRODUCTS = 1 << 13
MAC_OPS = frozenset({"matmul", "linear", "einsum", "conv", "conv_transpose"})
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

HAZARDS = {
    "mac-ceiling": "MAC output at or over the 2^15 port ceiling became inf",
    "mac-partial": "a MAC's running partial reached 2^15: the output became inf",
    "nan-coerced": "NaN input coerced to +inf",
    "indeterminate": "indeterminate form (IEEE NaN) became +0",
    "subnormal-flush": "subnormal value flushed (MAC operand/product/result, or table input)",
    "slice-saturated": "width-offset slice element over 4094 became inf (x16 crop gain)",
    "table-domain": "activation input outside the table's domain: clamped to its end knot",
    "table-collapse": "activation table's special value (softplus/softsign collapse, log(+0), origin bias)",
    "signed-zero": "-0 read as +0 before a reciprocal",
    "round-shift": "round() of |x| >= 1024 moved by the fp16 add of 0.5",
}


@dataclass
class Event:
    """What the sanitizer saw at one op for one hazard."""

    op: str
    op_type: str
    hazard: str
    count: int = 0
    largest: float = 0.0  # the largest offending magnitude (the ideal value where there is one)


class Sanitizer:
    """Counts the hazards each op met while a kernel ran (accumulated over runs until ``clear``)."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], Event] = {}

    def note(self, op: str, op_type: str, hazard: str, count: int, largest: float = 0.0) -> None:
        if count <= 0:
            return
        ev = self.events.get((op, hazard))
        if ev is None:
            ev = self.events[(op, hazard)] = Event(op, op_type, hazard)
        ev.count += int(count)
        if math.isfinite(largest) or math.isnan(ev.largest):
            ev.largest = max(ev.largest, float(largest))
        else:
            ev.largest = float(largest)

    def clear(self) -> None:
        self.events.clear()

    def merge(self, other: Sanitizer) -> None:
        for ev in other.events.values():
            self.note(ev.op, ev.op_type, ev.hazard, ev.count, ev.largest)

    def records(self) -> list[dict[str, Any]]:
        """One record per op: its type and, per hazard, the count and the largest offending value."""
        by_op: dict[str, dict[str, Any]] = {}
        for ev in self.events.values():
            rec = by_op.setdefault(ev.op, {"op": ev.op, "op_type": ev.op_type, "hazards": {}})
            rec["hazards"][ev.hazard] = {"count": ev.count, "largest": ev.largest}
        return list(by_op.values())

    def lines(self) -> list[str]:
        """One line per op: ``op (type): hazard N (largest V), ...``."""
        out = []
        for rec in self.records():
            parts = [
                f"{h} {v['count']}" + (f" (largest {v['largest']:.6g})" if v["largest"] else "")
                for h, v in rec["hazards"].items()
            ]
            out.append(f"{rec['op']} ({rec['op_type']}): " + ", ".join(parts))
        return out

    def summary(self) -> str:
        """One line: per hazard the total count and the ops it fired at (most first); "" if none fired."""
        totals: dict[str, dict[str, int]] = {}
        for ev in self.events.values():
            totals.setdefault(ev.hazard, {}).setdefault(ev.op, 0)
            totals[ev.hazard][ev.op] += ev.count
        parts = []
        for hazard, ops in totals.items():
            ranked = sorted(ops.items(), key=lambda kv: -kv[1])
            where = ", ".join(op for op, _ in ranked[:3]) + (
                f" +{len(ranked) - 3} ops" if len(ranked) > 3 else ""
            )
            parts.append(f"{hazard} {sum(ops.values())} at {where}")
        return "; ".join(parts)

    def to_json(self) -> str:
        return json.dumps(self.records(), indent=1)


# -- fp16 rounding helpers (float64 in, float64 fp16 values out) --------------------------------------


def round16(v: np.ndarray, ties: str = "even") -> np.ndarray:
    """``v`` rounded to fp16 values (held in float64); ``ties`` "even" (IEEE) or "away" from zero."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(all="ignore"):
        h = v.astype(np.float16).astype(np.float64)
        if ties == "away":
            a, ha = np.abs(v), np.abs(h)
            up = np.nextafter(ha.astype(np.float16), np.float16(np.inf)).astype(np.float64)
            tie_down = (ha < a) & (a - ha == up - a)
            if tie_down.any():
                h = np.where(tie_down, np.copysign(up, v), h)
    return h


def _flush(v: np.ndarray) -> np.ndarray:
    """Subnormal fp16 values (|v| < 2^-14) to +0."""
    return np.where(np.abs(v) < FP16_MIN_NORMAL, 0.0, v)


def _subnormal_count(v: np.ndarray) -> int:
    a = np.abs(v)
    return int(np.count_nonzero((a < FP16_MIN_NORMAL) & (a > 0)))


# -- MAC ops -----------------------------------------------------------------------------------------


def mac_operands(op_type: str, values: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The op as a batched product a (..., M, K) @ b (..., K, N) of its input values, where it is one
    (matmul, linear, a 1x1 stride-1 unpadded single-group conv), else None."""
    if op_type == "matmul":
        x, y = np.asarray(values["x"]), np.asarray(values["y"])
        if x.ndim < 2 or y.ndim < 2:
            return None
        if _flag(values.get("transpose_x")):
            x = np.swapaxes(x, -1, -2)
        if _flag(values.get("transpose_y")):
            y = np.swapaxes(y, -1, -2)
        return x, y
    if op_type == "linear":
        x, w = np.asarray(values["x"]), np.asarray(values["weight"])
        if x.ndim < 2 or values.get("bias") is not None:
            return None
        return x, w.T
    if op_type == "conv":
        x, w = np.asarray(values["x"]), np.asarray(values["weight"])
        if x.ndim != 4 or w.ndim != 4 or w.shape[2:] != (1, 1) or values.get("bias") is not None:
            return None
        if int(np.asarray(values.get("groups", 1))) != 1 or str(values.get("pad_type", "valid")) not in (
            "valid",
            "same",
            "same_lower",
        ):
            return None
        for key in ("strides", "dilations"):
            if key in values and values[key] is not None and np.any(np.asarray(values[key]) != 1):
                return None
        n, c, h, wd = x.shape
        return w[:, :, 0, 0], x.reshape(n, c, h * wd)
    return None


def _flag(v: Any) -> bool:
    return bool(np.asarray(v)) if v is not None else False


def accumulation_terms(op_type: str, values: dict[str, Any]) -> int:
    """How many products each output of a MAC op accumulates (a conv: input channels / groups x taps)."""
    if op_type in ("conv", "conv_transpose"):
        w = np.asarray(values["weight"])
        return int(np.prod(w.shape[1:])) if op_type == "conv" else int(np.prod(w.shape[2:])) * w.shape[0]
    ops = mac_operands(op_type, values)
    return 2 if ops is None else int(ops[0].shape[-1])


def tiled_product(
    a: np.ndarray, b: np.ndarray, ceiling: float, flush: bool, tile_rounding: str, ties: str
) -> tuple[np.ndarray, np.ndarray]:
    """The 4-lane first-stage model of a @ b (``mac.first-stage``): products rounded to fp16, each tile of
    4 consecutive lanes summed and rounded to fp16 (``tile_rounding``: "truncate" toward zero, "even" or
    "away"), tiles accumulated wide (float64) in order, the output rounded to fp16 (``ties``).

    Returns (the output before the port's ceiling, True where the tile or running partial reached
    ``ceiling``; those outputs are already +/-inf with the sign of the partial).
    """
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    k = a64.shape[-1]
    shape = (*np.broadcast_shapes(a64.shape[:-2], b64.shape[:-2]), a64.shape[-2], b64.shape[-1])
    acc = np.zeros(shape)
    over = np.zeros(shape, dtype=bool)
    sign = np.zeros(shape)
    with np.errstate(all="ignore"):
        for t in range(0, k, 4):
            exact = np.zeros(shape)
            for j in range(t, min(t + 4, k)):
                p = round16(a64[..., :, j : j + 1] * b64[..., j : j + 1, :])
                exact = exact + (_flush(p) if flush else p)
            tile = _truncate16(exact) if tile_rounding == "truncate" else round16(exact, tile_rounding)
            if flush:
                tile = _flush(tile)
            acc = acc + tile
            for partial in (tile, acc):
                hit = (np.abs(partial) >= ceiling) & ~over
                sign = np.where(hit, np.sign(partial), sign)
                over |= hit
    out = round16(acc, ties)
    if flush:
        out = _flush(out)
    out = np.where(over, sign * np.inf, out)
    return out, over


def _truncate16(v: np.ndarray) -> np.ndarray:
    """``v`` rounded toward zero to fp16 values (float64 in and out)."""
    h = round16(v)
    a, ha = np.abs(v), np.abs(h)
    down = np.nextafter(ha.astype(np.float16), np.float16(0)).astype(np.float64)
    return np.where(ha > a, np.copysign(down, v), h)


def partial_overflow(a: np.ndarray, b: np.ndarray, ceiling: float) -> np.ndarray | None:
    """Outputs of a @ b where a 4-lane tile or the running sum of tiles (in index order) reaches ``ceiling``,
    though the output may not: a boolean mask, or None when the bound max|a| max|b| K shows none can."""
    k = a.shape[-1]
    if a.size == 0 or b.size == 0:
        return None
    with np.errstate(all="ignore"):
        if float(np.max(np.abs(a))) * float(np.max(np.abs(b))) * k < ceiling:
            return None
        bound = np.matmul(np.abs(a).astype(np.float32), np.abs(b).astype(np.float32))
    suspects = np.argwhere(bound >= ceiling)
    shape = bound.shape
    mask = np.zeros(shape, dtype=bool)
    a_b = np.broadcast_to(a, shape[:-2] + a.shape[-2:])
    b_b = np.broadcast_to(b, shape[:-2] + b.shape[-2:])
    for idx in suspects:
        *batch, m, n = (int(i) for i in idx)
        prods = a_b[(*batch, m)].astype(np.float64) * b_b[(*batch, slice(None), n)].astype(np.float64)
        tiles = np.pad(prods, (0, -k % 4)).reshape(-1, 4).sum(axis=1)  # the first stage's 4-lane tiles
        worst = max(float(np.max(np.abs(tiles))), float(np.max(np.abs(np.cumsum(tiles)))))
        mask[tuple(idx)] = worst >= ceiling
    return mask


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
    """A profile's numerics for one simulator plan, with an optional sanitizer."""

    def __init__(self, profile: Profile, sanitizer: Sanitizer | None = None) -> None:
        global _LOOPS
        _LOOPS = jit.loops()  # as ``anekit.jit`` decides now (ANEKIT_JIT may have changed)
        self.profile = profile
        self.sanitizer = sanitizer
        self.ceiling = profile.mac_ceiling
        self.flush = profile.flushes_mac_subnormals
        self.mac_ties = profile.mac_ties
        self.tile_rounding = str(profile["mac.first-stage"])
        self.reduce_ties = str(profile["reduce.tie-rounding"])
        self.slice_gain = profile.slice_gain
        self.partials = bool(profile["mac.interior-partials"])
        self.sqrt_subnormals = bool(profile["table.subnormal-input"])
        self.signed_zero = bool(profile["recip.signed-zero"])
        self.round_away = bool(profile["round.half-away"])
        self.tables = profile["activation.tables"]
        self._scans: dict[int, tuple[np.ndarray, int, float, np.ndarray | None]] = {}
        self._input_peaks: dict[int, float] = {}  # program input slot -> its largest |value| this run
        # Slots whose every reader is a MAC op (set by the plan once it is built): their values may be
        # flushed in place, no other op sees the subnormals go.
        self.mac_only_slots: frozenset[int] = frozenset()

    def begin_run(self) -> None:
        """Forget the operand scans and input peaks of the last run (a plan calls this before and after
        each run)."""
        self._scans.clear()
        self._input_peaks.clear()

    def scan(self, v: np.ndarray) -> tuple[int, float, np.ndarray | None]:
        """(fp16 subnormals in MAC operand ``v``, its largest finite |value|, its flushed copy or None),
        once per array and run: an activation feeding several products is scanned and flushed once. The
        entry holds ``v`` itself, so its id cannot be reused while the run lasts."""
        found = self._scans.get(id(v))
        if found is not None and found[0] is v:
            return found[1], found[2], found[3]
        subnormals, big = _scan(v)
        flushed = _flushed(v) if subnormals and self.flush else None
        self._scans[id(v)] = (v, subnormals, big, flushed)
        return subnormals, big, flushed

    def _note(self, op: Any, hazard: str, count: int, largest: float = 0.0) -> None:
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

    # -- outputs -----------------------------------------------------------------------------------

    def no_nan(self, op: Any, v: Any) -> Any:
        """NaN -> +0 in a float result."""
        if type(v) is np.ndarray and v.dtype == _F32:
            flags = v.flags
            if flags.c_contiguous and flags.writeable and _LOOPS is not None:  # the hot path, direct
                n = _LOOPS.nan_to_zero(v.reshape(-1))
                if n and self.sanitizer is not None:
                    self._note(op, "indeterminate", n)
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
        self._note(op, "indeterminate", n)
        return v

    def fused_store(self, op_type: str) -> str | None:
        """How an op's fresh fp16 result may be corrected inside its store ("even" / "away": the ties of
        the rounding, NaN -> +0 either way), or None when the op needs more than that (MAC ops, tables,
        slices, ops computed here) or nothing (NaN-free ops)."""
        if op_type in REDUCE_OPS:
            return self.reduce_ties
        if op_type in MAC_OPS or op_type in OVERRIDES or op_type in LIGHT or op_type in SLICE_OPS:
            return None
        return None if op_type in NAN_FREE else "even"

    def round_store(self, op: Any, out: np.ndarray, away: bool) -> np.ndarray | None:
        """Round a fresh float32 result to fp16 in place with NaN -> +0 (and ties away), in one pass."""
        if _LOOPS is None:
            return None
        n = _LOOPS.round_fp16_nan0_inplace(out.reshape(-1), away)
        if n and self.sanitizer is not None:
            self._note(op, "indeterminate", n)
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
        if op_type in SLICE_OPS and self.slice_gain:
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
    ) -> Runner:
        """``runner`` (the step's ideal runner) under the profile: the op's own fast runner with the
        profile's corrections around it where that gives the profile's result, the op computed here
        (``evaluate``) otherwise; ``runner`` itself when the profile changes nothing about the op."""
        op_type = step.op.op_type
        slots = dict(step.args)
        out_slots = step.out_slots

        def computed(env: list[Any]) -> None:
            for slot, value in zip(out_slots, self.evaluate(step, values_of(env), reference)):
                env[slot] = value

        if op_type in MAC_OPS:
            return self._bind_mac(step, runner, values_of, reference, slots, constants) or computed
        if op_type in LIGHT:
            return LIGHT[op_type](self, step, runner, values_of, reference, slots) or computed
        if op_type in OVERRIDES:
            return computed
        if op_type in SLICE_OPS and self.slice_gain:
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
        source = dict(step.args).get("x")
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
            self._note(op, "slice-saturated", *found)
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
        begin_slot = slots.get("begin")

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
    ) -> Runner | None:
        """The wide path around the op's own runner: operands scanned (flushed where the chip flushes),
        then the output port in one pass. None where the op must be computed here (probe-sized ops run
        the exact tile model; M5-style tie rounding; operands of unknown shape)."""
        op, op_type = step.op, step.op.op_type
        if self.mac_ties != "even":
            return None  # M5-style ties need the unrounded product: computed here
        operands = [(k, slots[k]) for k in ("x", "y", "weight") if isinstance(slots.get(k), int)]
        constant_peaks: dict[int, float] = {}  # constant operands, scanned once here
        for _, slot in operands:
            v = constants.get(slot)
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                subnormals, constant_peaks[slot] = _scan(v)
                if subnormals and self.flush:
                    return None  # a constant holding subnormals: computed here (flushed) every run
        (out_slot,) = step.out_slots
        sizes: dict[tuple[Any, ...], tuple[bool, int]] = {}  # operand shapes -> (exact model?, terms)
        last: list[Any] = [None, (False, 0)]  # the operand shapes of the last run, and what they gave
        slot_list = [s for _, s in operands]
        sanitizer, flush = self.sanitizer, self.flush
        in_place: list[bool] | None = None  # per operand: only MAC ops read its slot (known once built)

        def mac(env: list[Any]) -> None:
            nonlocal in_place
            shapes = [getattr(env[s], "shape", None) for s in slot_list]
            if shapes == last[0]:
                exact, terms = last[1]
            else:
                key = tuple(shapes)
                known = sizes.get(key)
                if known is None:
                    values = values_of(env)
                    ops = mac_operands(op_type, values)
                    exact = ops is not None and _products(*ops) <= EXACT_MAC_PRODUCTS
                    known = sizes[key] = (exact, accumulation_terms(op_type, values))
                last[0], last[1] = shapes, known
                exact, terms = known
            if exact:  # a probe-sized op: the exact tile model
                (env[out_slot],) = self.evaluate(step, values_of(env), reference)
                return
            if in_place is None:
                in_place = [flush and s in self.mac_only_slots for s in slot_list]
            single_tap = op_type in ("conv", "conv_transpose") and terms < 2
            ceiling = math.inf if single_tap else self.ceiling
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
                        self._note(op, "subnormal-flush", n)
                    largest *= big
                    continue
                if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                    subnormals, big, flushed = self.scan(v)
                    largest *= big
                    if flushed is not None:
                        self._note(op, "subnormal-flush", subnormals)
                        swapped.append((slot, v))
                        env[slot] = flushed
            if swapped:
                try:
                    runner(env)
                finally:
                    for slot, v in swapped:
                        env[slot] = v
            else:
                runner(env)
            out = env[out_slot]
            if not (out.flags.writeable and out.flags.owndata):  # a product is a fresh array: else copy
                out = env[out_slot] = np.array(out, dtype=np.float32)
            nans, over, biggest, flushed = _port(out, ceiling, flush)
            if sanitizer is not None:
                self._note(op, "indeterminate", nans)
                self._note(op, "mac-ceiling", over, biggest)
                self._note(op, "subnormal-flush", flushed)
            if largest * terms >= ceiling and self.partials and not single_tap:
                ops = (
                    mac_operands(op_type, values_of(env)) if op_type in ("matmul", "linear", "conv") else None
                )
                if ops is not None:
                    self._partials(op, out, ops, ceiling)

        return mac

    def _partials(self, op: Any, out: np.ndarray, ops: tuple[np.ndarray, np.ndarray], ceiling: float) -> None:
        """Outputs whose running partial reached the ceiling (``partial_overflow``) become +/-inf in place."""
        mask = partial_overflow(*ops, ceiling)
        if mask is None:
            return
        mask = mask.reshape(out.shape) & np.isfinite(out)
        n = int(np.count_nonzero(mask))
        if n:
            self._note(op, "mac-partial", n, float(np.max(np.abs(out[mask]))))
            out[mask] = np.inf * np.where(out[mask] < 0, -1.0, 1.0)

    # -- per-op numerics ---------------------------------------------------------------------------

    def _slice(self, step: Any, values: Values, out: Any) -> Any:
        begin = np.asarray(values.get("begin", 0)).reshape(-1)
        if not (isinstance(out, np.ndarray) and out.dtype.kind == "f" and begin.size and begin[-1] != 0):
            return out
        big = np.abs(out) > SLICE_SAFE
        n = int(np.count_nonzero(big & np.isfinite(out)))
        if n:
            self._note(step.op, "slice-saturated", n, float(np.max(np.abs(out[big & np.isfinite(out)]))))
            out = np.where(big, np.copysign(np.inf, out), out).astype(out.dtype)
        return out

    def _mac(self, step: Any, values: Values, reference: Callable[[Values], list[Any]]) -> Any:
        op, op_type = step.op, step.op.op_type
        # The port saturates for matmul / linear / einsum whatever K (the guide measured K = 1), and for a
        # conv that accumulates two or more taps; a single-tap conv keeps the fp16 range.
        single_tap = op_type in ("conv", "conv_transpose") and accumulation_terms(op_type, values) < 2
        ceiling = math.inf if single_tap else self.ceiling
        largest: dict[str, float] = {}
        copied = False
        for key in ("x", "y", "weight"):  # subnormal operands read as +0 where the chip flushes
            v = values.get(key)
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                subnormals, largest[key] = _scan(v)
                if subnormals and self.flush:
                    self._note(op, "subnormal-flush", subnormals)
                    if not copied:  # the caller's dict stays as it was
                        values, copied = dict(values), True
                    values[key] = _flushed(v)
        ops = mac_operands(op_type, values)
        (store,) = step.stores
        if ops is not None and _products(*ops) <= EXACT_MAC_PRODUCTS:
            a, b = ops
            exact, over = tiled_product(a, b, ceiling, self.flush, self.tile_rounding, self.mac_ties)
            ideal = np.matmul(a.astype(np.float64), b.astype(np.float64))
            out = exact.reshape(_out_shape(step, values, exact))
            self._note(
                op,
                "mac-partial",
                int(np.count_nonzero(over & (np.abs(ideal) < ceiling))),
                float(np.max(np.abs(ideal[over]), initial=0.0)),
            )
            ceiling_hits = over & (np.abs(ideal) >= ceiling)
            self._note(
                op,
                "mac-ceiling",
                int(np.count_nonzero(ceiling_hits)),
                float(np.max(np.abs(ideal[ceiling_hits]), initial=0.0)),
            )
            return self.no_nan(op, store(out.astype(np.float32)))
        # Wide path: the reference's float32 product, then the port.
        (raw,) = reference(values)
        raw = np.asarray(raw, dtype=np.float32)
        if self.mac_ties == "away":
            raw = round16(raw, "away").astype(np.float32)
        out = store(raw)
        if not out.flags.writeable or (np.may_share_memory(out, raw) and out is not raw):
            out = out.copy()
        nans, over, biggest, flushed = _port(out, ceiling, self.flush)
        self._note(op, "indeterminate", nans)
        self._note(op, "mac-ceiling", over, biggest)
        self._note(op, "subnormal-flush", flushed)
        if self.partials and not single_tap and ops is not None:
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
    return out if out is not None else _flush(v).astype(v.dtype)


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


def _products(a: np.ndarray, b: np.ndarray) -> int:
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return int(np.prod(batch)) * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _out_shape(step: Any, values: Values, product: np.ndarray) -> tuple[int, ...]:
    """The op's own output shape for the (…, M, N) product (a conv's [N, C, H, W])."""
    if step.op.op_type == "conv":
        x = np.asarray(values["x"])
        return (x.shape[0], product.shape[-2], x.shape[2], x.shape[3])
    return product.shape


# -- ops computed here ---------------------------------------------------------------------------------


def _x(values: Values) -> np.ndarray:
    return np.asarray(values["x"], dtype=np.float64)


def _eps(values: Values, default: float) -> float:
    """The op's epsilon as the engine holds it: an fp16 value."""
    e = values.get("epsilon")
    return float(np.float16(default if e is None else float(np.asarray(e))))


def _table(name: str) -> Any:
    return TABLES[name]


def _sigmoid(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = np.asarray(values["x"])
    lo, hi = SIGMOID_KNOTS
    out_of = (x < lo) | (x > hi)
    n = int(np.count_nonzero(out_of))
    if n:
        num._note(step.op, "table-domain", n, float(np.max(np.abs(x[out_of]))))
        values = {**values, "x": np.clip(x, lo, hi).astype(x.dtype)}
    return reference(values)


def _tanh(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    return [np.tanh(_x(values))]


def _with_origin(num: EngineNumerics, step: Any, x: np.ndarray, y: np.ndarray, table: str) -> np.ndarray:
    origin = _table(table).origin
    zero = x == 0
    n = int(np.count_nonzero(zero))
    if n and origin is not None:
        num._note(step.op, "table-collapse", n, abs(origin))
        y = np.where(zero, origin, y)
    return y


def _gelu(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    from anekit.mil.ops.activation import erf_np

    x = _x(values)
    mode = str(values.get("mode", "EXACT"))
    with np.errstate(all="ignore"):
        if mode == "TANH_APPROXIMATION":
            y = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        elif mode == "SIGMOID_APPROXIMATION":
            y = x / (1.0 + np.exp(-1.702 * x))
        else:
            y = 0.5 * x * (1.0 + erf_np(x / math.sqrt(2.0)))
        y = np.where(np.isposinf(x), np.inf, y)  # inf * (1 + 1) / 2, not inf * 0
        y = np.where(np.isneginf(x), 0.0, y)
    return [_with_origin(num, step, x, y, "gelu")]


def _silu(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = _x(values)
    with np.errstate(all="ignore"):
        y = x / (1.0 + np.exp(-x))
        y = np.where(np.isneginf(x), 0.0, y)
    return [_with_origin(num, step, x, y, "silu")]


def _softplus(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = _x(values)
    collapse = x >= SOFTPLUS_COLLAPSE
    num._note(
        step.op,
        "table-collapse",
        int(np.count_nonzero(collapse)),
        float(np.max(np.abs(x[collapse]), initial=0.0)),
    )
    with np.errstate(all="ignore"):
        y = np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))
    return [np.where(collapse, 0.0, y)]


def _softsign(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = _x(values)
    inf = np.isposinf(x)
    num._note(step.op, "table-collapse", int(np.count_nonzero(inf)), math.inf)
    with np.errstate(all="ignore"):
        y = x / (1.0 + np.abs(x))
        y = np.where(np.isneginf(x), -1.0, y)
    return [np.where(inf, 0.0, y)]


def _log(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    v = _x(values) + _eps(values, 1e-45)
    zero = v == 0
    num._note(step.op, "table-collapse", int(np.count_nonzero(zero)))
    with np.errstate(all="ignore"):
        y = np.log(v)
    return [np.where(zero, _table("log").special[0.0], y)]


def _table_input(num: EngineNumerics, step: Any, v: np.ndarray) -> np.ndarray:
    """sqrt / rsqrt read a subnormal as the nearer of 0 and 2^-14; the sign of a zero is dropped."""
    if num.sqrt_subnormals:
        a = np.abs(v)
        sub = (a > 0) & (a < FP16_MIN_NORMAL)
        n = int(np.count_nonzero(sub))
        if n:
            num._note(step.op, "subnormal-flush", n)
            v = np.where(sub, np.where(a >= FP16_MIN_NORMAL / 2, np.copysign(FP16_MIN_NORMAL, v), 0.0), v)
    return v


def _unsigned_zero(num: EngineNumerics, step: Any, v: np.ndarray) -> np.ndarray:
    if not num.signed_zero:
        return v
    neg0 = (v == 0) & np.signbit(v)
    n = int(np.count_nonzero(neg0))
    if n:
        num._note(step.op, "signed-zero", n)
        v = np.where(neg0, 0.0, v)
    return v


def _sqrt(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    v = _table_input(num, step, _x(values))
    with np.errstate(all="ignore"):
        return [np.sqrt(np.where(v == 0, 0.0, v))]  # sqrt(-0) is +0 on the engine


def _rsqrt(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    v = _unsigned_zero(num, step, _table_input(num, step, _x(values) + _eps(values, 1e-12)))
    with np.errstate(all="ignore"):
        return [1.0 / np.sqrt(v)]


def _inverse(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    v = _unsigned_zero(num, step, _x(values) + _eps(values, 1e-4))
    with np.errstate(all="ignore"):
        return [1.0 / v]


def _round(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = _x(values)
    if not num.round_away:
        return [np.round(x)]
    a = np.abs(x)
    big = (a >= 1024) & np.isfinite(a) & (a != np.floor(a) + 0.5)
    num._note(step.op, "round-shift", int(np.count_nonzero(big)), float(np.max(a[big], initial=0.0)))
    with np.errstate(all="ignore"):
        return [np.copysign(np.floor(round16(a + 0.5, "away")), x)]


def _softmax(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    if np.isfinite(values["x"]).all():
        return reference(values)  # max-subtracted already: the engine's softmax on finite rows
    x = _x(values)
    axis = int(np.asarray(values.get("axis", -1)))
    with np.errstate(all="ignore"):
        d = x - np.max(x, axis=axis, keepdims=True)
        d = np.where(np.isnan(d), 0.0, d)  # inf - inf = +0 on the engine: an inf lane takes the mass
        e = np.exp(d)
        return [e / np.sum(e, axis=axis, keepdims=True)]


def _reduce(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    """The reduction's wide (float32) result, rounded to fp16 with the chip's ties (away: 2049 -> 2050)."""
    (raw,) = reference(values)
    raw = np.asarray(raw, dtype=np.float32)
    if num.reduce_ties != "away":
        return [raw]
    away = jit.round_fp16_away(raw)
    return [round16(raw, "away").astype(np.float32) if away is None else away]


def _light_sigmoid(
    num: EngineNumerics,
    step: Any,
    runner: Runner,
    values_of: Any,
    reference: Reference,
    slots: dict[str, Any],
) -> Runner | None:
    """sigmoid's own runner, on inputs clipped to the table's domain when some lie outside it."""
    x_slot = slots.get("x")
    if not isinstance(x_slot, int):
        return None
    lo, hi = SIGMOID_KNOTS
    op = step.op

    def run(env: list[Any]) -> None:
        x = env[x_slot]
        if x.size and (float(np.min(x)) < lo or float(np.max(x)) > hi):
            out_of = (x < lo) | (x > hi)
            num._note(op, "table-domain", int(np.count_nonzero(out_of)), float(np.max(np.abs(x[out_of]))))
            env[x_slot] = np.clip(x, lo, hi).astype(x.dtype)
            try:
                runner(env)
            finally:
                env[x_slot] = x
        else:
            runner(env)

    return run


def _light_softmax(
    num: EngineNumerics,
    step: Any,
    runner: Runner,
    values_of: Any,
    reference: Reference,
    slots: dict[str, Any],
) -> Runner | None:
    """softmax's own runner on finite rows; the engine's (inf - inf = +0) where a row holds an inf."""
    x_slot, (out_slot,) = slots.get("x"), step.out_slots
    if not isinstance(x_slot, int):
        return None

    def run(env: list[Any]) -> None:
        x = env[x_slot]
        if _all_finite(x):
            runner(env)
        else:
            (env[out_slot],) = num.evaluate(step, values_of(env), reference)

    return run


def _all_finite(x: Any) -> bool:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        return bool(np.isfinite(x).all())
    with np.errstate(invalid="ignore"):
        n = jit.count_nan(x - x)  # NaN exactly where x is +/-inf (x holds no NaN: inputs are coerced)
    return bool(np.isfinite(x).all()) if n is None else n == 0


def _real_div(num: EngineNumerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    y = np.asarray(values["y"])
    if y.dtype.kind == "f":
        neg0 = (y == 0) & np.signbit(y)
        if neg0.any():
            num._note(step.op, "signed-zero", int(np.count_nonzero(neg0)))
            values = {**values, "y": np.where(neg0, 0.0, y).astype(y.dtype)}
    return reference(values)


def _light_real_div(
    num: EngineNumerics,
    step: Any,
    runner: Runner,
    values_of: Any,
    reference: Reference,
    slots: dict[str, Any],
) -> Runner | None:
    """real_div's own runner, its divisor's -0 read as +0 (the reciprocal path drops the sign of a zero),
    then NaN -> +0 (0 / 0, inf / inf)."""
    y_slot, (out_slot,) = slots.get("y"), step.out_slots
    if not isinstance(y_slot, int) or not num.signed_zero:
        return None
    op = step.op

    def run(env: list[Any]) -> None:
        y = env[y_slot]
        neg0 = (y == 0) & np.signbit(y) if isinstance(y, np.ndarray) and y.dtype.kind == "f" else None
        if neg0 is not None and neg0.any():
            num._note(op, "signed-zero", int(np.count_nonzero(neg0)))
            env[y_slot] = np.where(neg0, 0.0, y).astype(y.dtype)
            try:
                runner(env)
            finally:
                env[y_slot] = y
        else:
            runner(env)
        env[out_slot] = num.no_nan(op, env[out_slot])

    return run


LIGHT = {"sigmoid": _light_sigmoid, "softmax": _light_softmax, "real_div": _light_real_div}
SIGMOID_KNOTS = tuple(float(np.float16(e)) for e in TABLES["sigmoid"].domain)  # the end knots' fp16 inputs

OVERRIDES: dict[str, Callable[[EngineNumerics, Any, Values, Reference], list[np.ndarray]]] = {
    "sigmoid": _sigmoid,
    "tanh": _tanh,
    "gelu": _gelu,
    "silu": _silu,
    "softplus": _softplus,
    "softsign": _softsign,
    "log": _log,
    "sqrt": _sqrt,
    "rsqrt": _rsqrt,
    "inverse": _inverse,
    "round": _round,
    "softmax": _softmax,
    "reduce_sum": _reduce,
    "reduce_mean": _reduce,
    "real_div": _real_div,
}
