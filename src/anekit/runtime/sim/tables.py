"""The ops a chip's profile computes itself: activation tables, reciprocals, round, softmax, reductions.

Each ``OVERRIDES`` function takes the op's input values (and its own numpy reference, for the parts
that are the ideal op on changed inputs) and returns its unrounded outputs; each ``LIGHT`` binder wraps
the op's own fast runner with the profile's change where that gives the same result (sigmoid on clipped
inputs, softmax on finite rows, real_div by an unsigned zero). Table values, clamps and collapses come
from the chip's binding (``runtime.sim.chip``: its ``activation.tables``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from anekit import jit
from anekit.engine.numerics import FP16_MIN_NORMAL, SOFTPLUS_COLLAPSE
from anekit.runtime.sim.chip import ChipNumerics
from anekit.runtime.sim.mac import round16

Values = dict[str, Any]
Runner = Callable[[list[Any]], None]
Reference = Callable[[Values], list[Any]]


class Numerics(Protocol):
    """What an op computed here asks of the numerics it runs under (``runtime.sim.numerics.EngineNumerics``):
    the chip's values, the sanitizer's ``note``, NaN -> +0 of a result, and the op computed in full."""

    chip: ChipNumerics

    def note(self, op: Any, hazard: str, count: int, largest: float = 0.0) -> None: ...

    def no_nan(self, op: Any, v: Any) -> Any: ...

    def evaluate(self, step: Any, values: Values, reference: Reference) -> list[Any]: ...


def _x(values: Values) -> np.ndarray:
    return np.asarray(values["x"], dtype=np.float64)


def _eps(values: Values, default: float) -> float:
    """The op's epsilon as the engine holds it: an fp16 value."""
    e = values.get("epsilon")
    return float(np.float16(default if e is None else float(np.asarray(e))))


def _sigmoid(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = np.asarray(values["x"])
    lo, hi = num.chip.sigmoid_knots
    out_of = (x < lo) | (x > hi)
    n = int(np.count_nonzero(out_of))
    if n:
        num.note(step.op, "table-domain", n, float(np.max(np.abs(x[out_of]))))
        values = {**values, "x": np.clip(x, lo, hi).astype(x.dtype)}
    return reference(values)


def _with_origin(num: Numerics, step: Any, x: np.ndarray, y: np.ndarray, table: str) -> np.ndarray:
    origin = num.chip.tables[table].origin
    zero = x == 0
    n = int(np.count_nonzero(zero))
    if n and origin is not None:
        num.note(step.op, "table-collapse", n, abs(origin))
        y = np.where(zero, origin, y)
    return y


def _gelu(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
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


def _silu(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = _x(values)
    with np.errstate(all="ignore"):
        y = x / (1.0 + np.exp(-x))
        y = np.where(np.isneginf(x), 0.0, y)
    return [_with_origin(num, step, x, y, "silu")]


def _softplus(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = _x(values)
    collapse = x >= SOFTPLUS_COLLAPSE
    num.note(
        step.op,
        "table-collapse",
        int(np.count_nonzero(collapse)),
        float(np.max(np.abs(x[collapse]), initial=0.0)),
    )
    with np.errstate(all="ignore"):
        y = np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))
    return [np.where(collapse, 0.0, y)]


def _softsign(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = _x(values)
    inf = np.isposinf(x)
    num.note(step.op, "table-collapse", int(np.count_nonzero(inf)), math.inf)
    with np.errstate(all="ignore"):
        y = x / (1.0 + np.abs(x))
        y = np.where(np.isneginf(x), -1.0, y)
    return [np.where(inf, 0.0, y)]


def _log(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    v = _x(values) + _eps(values, 1e-45)
    zero = v == 0
    num.note(step.op, "table-collapse", int(np.count_nonzero(zero)))
    with np.errstate(all="ignore"):
        y = np.log(v)
    return [np.where(zero, num.chip.tables["log"].special[0.0], y)]


def _table_input(num: Numerics, step: Any, v: np.ndarray) -> np.ndarray:
    """sqrt / rsqrt read a subnormal as the nearer of 0 and 2^-14; the sign of a zero is dropped."""
    if num.chip.sqrt_subnormals:
        a = np.abs(v)
        sub = (a > 0) & (a < FP16_MIN_NORMAL)
        n = int(np.count_nonzero(sub))
        if n:
            num.note(step.op, "subnormal-flush", n)
            v = np.where(sub, np.where(a >= FP16_MIN_NORMAL / 2, np.copysign(FP16_MIN_NORMAL, v), 0.0), v)
    return v


def _unsigned_zero(num: Numerics, step: Any, v: np.ndarray) -> np.ndarray:
    if not num.chip.signed_zero:
        return v
    neg0 = (v == 0) & np.signbit(v)
    n = int(np.count_nonzero(neg0))
    if n:
        num.note(step.op, "signed-zero", n)
        v = np.where(neg0, 0.0, v)
    return v


def _sqrt(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    v = _table_input(num, step, _x(values))
    with np.errstate(all="ignore"):
        return [np.sqrt(np.where(v == 0, 0.0, v))]  # sqrt(-0) is +0 on the engine


def _rsqrt(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    v = _unsigned_zero(num, step, _table_input(num, step, _x(values) + _eps(values, 1e-12)))
    with np.errstate(all="ignore"):
        return [1.0 / np.sqrt(v)]


def _inverse(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    v = _unsigned_zero(num, step, _x(values) + _eps(values, 1e-4))
    with np.errstate(all="ignore"):
        return [1.0 / v]


def _round(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    x = _x(values)
    if not num.chip.round_away:
        return [np.round(x)]
    a = np.abs(x)
    big = (a >= 1024) & np.isfinite(a) & (a != np.floor(a) + 0.5)
    num.note(step.op, "round-shift", int(np.count_nonzero(big)), float(np.max(a[big], initial=0.0)))
    with np.errstate(all="ignore"):
        return [np.copysign(np.floor(round16(a + 0.5, "away")), x)]


def _softmax(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    if np.isfinite(values["x"]).all():
        return reference(values)  # max-subtracted already: the engine's softmax on finite rows
    x = _x(values)
    axis = int(np.asarray(values.get("axis", -1)))
    with np.errstate(all="ignore"):
        d = x - np.max(x, axis=axis, keepdims=True)
        d = np.where(np.isnan(d), 0.0, d)  # inf - inf = +0 on the engine: an inf lane takes the mass
        e = np.exp(d)
        return [e / step.opdef.axis_sum(e, axis)]  # the op's own sum: in order in an ordered plan


def _reduce(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    """The reduction's wide (float32) result, rounded to fp16 with the chip's ties (away: 2049 -> 2050)."""
    (raw,) = reference(values)
    raw = np.asarray(raw, dtype=np.float32)
    if num.chip.reduce_ties != "away":
        return [raw]
    away = jit.round_fp16_away(raw)
    return [round16(raw, "away").astype(np.float32) if away is None else away]


def run_with(runner: Runner, env: list[Any], slot: int, value: Any) -> None:
    """Run ``runner`` with ``value`` in ``slot`` in place of what is there, then put that back."""
    saved = env[slot]
    env[slot] = value
    try:
        runner(env)
    finally:
        env[slot] = saved


def _light_sigmoid(
    num: Numerics,
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
    lo, hi = num.chip.sigmoid_knots
    op = step.op

    def run(env: list[Any]) -> None:
        x = env[x_slot]
        if x.size and (float(np.min(x)) < lo or float(np.max(x)) > hi):
            out_of = (x < lo) | (x > hi)
            num.note(op, "table-domain", int(np.count_nonzero(out_of)), float(np.max(np.abs(x[out_of]))))
            run_with(runner, env, x_slot, np.clip(x, lo, hi).astype(x.dtype))
        else:
            runner(env)

    return run


def _light_softmax(
    num: Numerics,
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


def _real_div(num: Numerics, step: Any, values: Values, reference: Reference) -> list[np.ndarray]:
    y = np.asarray(values["y"])
    if y.dtype.kind == "f":
        neg0 = (y == 0) & np.signbit(y)
        if neg0.any():
            num.note(step.op, "signed-zero", int(np.count_nonzero(neg0)))
            values = {**values, "y": np.where(neg0, 0.0, y).astype(y.dtype)}
    return reference(values)


def _light_real_div(
    num: Numerics,
    step: Any,
    runner: Runner,
    values_of: Any,
    reference: Reference,
    slots: dict[str, Any],
) -> Runner | None:
    """real_div's own runner, its divisor's -0 read as +0 (the reciprocal path drops the sign of a zero),
    then NaN -> +0 (0 / 0, inf / inf)."""
    y_slot, (out_slot,) = slots.get("y"), step.out_slots
    if not isinstance(y_slot, int) or not num.chip.signed_zero:
        return None
    op = step.op

    def run(env: list[Any]) -> None:
        y = env[y_slot]
        neg0 = (y == 0) & np.signbit(y) if isinstance(y, np.ndarray) and y.dtype.kind == "f" else None
        if neg0 is not None and neg0.any():
            num.note(op, "signed-zero", int(np.count_nonzero(neg0)))
            run_with(runner, env, y_slot, np.where(neg0, 0.0, y).astype(y.dtype))
        else:
            runner(env)
        env[out_slot] = num.no_nan(op, env[out_slot])

    return run


LIGHT = {"sigmoid": _light_sigmoid, "softmax": _light_softmax, "real_div": _light_real_div}

OVERRIDES: dict[str, Callable[[Numerics, Any, Values, Reference], list[np.ndarray]]] = {
    "sigmoid": _sigmoid,
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
