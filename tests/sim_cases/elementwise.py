"""Simulator cases for the elementwise ops (binary arithmetic, comparisons, logical ops, select, unary
math) and the activation ops (sigmoid / relu families, gelu modes, softplus, clip and friends, softmax).

Tolerances: a runtime fp16 input is exact in float32, each op computes in float32 and rounds its
result once to fp16, so a float output is within half an fp16 ulp (relative 2**-11 ~ 4.9e-4) of the
float64 value, plus float32 evaluation error (~1e-7). ``_FP16`` (rtol 1e-3, atol 1e-5) covers that with
a small margin and is tighter than the harness default, so a missing or double rounding shows. Float
constants (Python floats, float64 arrays) become fp16 consts; their values are chosen exactly
representable in fp16 unless a case is about that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.sim_cases import SimCase, rng

SHAPE = (1, 8, 1, 16)  # the ANE layout [1, C, 1, S]
CHAN = (1, 8, 1, 1)  # one value per channel
ROW = (1, 1, 1, 16)  # one value per sequence position
_FP16 = {"rtol": 1e-3, "atol": 1e-5}
# fp32 runtime inputs: one float32 rounding of the result plus libm error of an ulp or two.
_FP32 = {"dtype": "fp32", "rtol": 2e-6, "atol": 1e-7}
# The smallest magnitude that rounds to infinity in fp16 (halfway between 65504 and 2**16).
_FP16_OVERFLOW = 65520.0


def _case(op: str, label: str, inputs: dict[str, Any], expected: Callable[..., Any], **kw: Any) -> SimCase:
    return SimCase(op, inputs, expected, label=label, **{**_FP16, **kw})


def _map(fn: Callable[..., Any], *arrays: Any, dtype: Any = np.float64) -> np.ndarray:
    """Apply a Python scalar function to the broadcast elements one by one (no numpy ufunc involved)."""
    bs = np.broadcast_arrays(*[np.asarray(a) for a in arrays])
    flat = [fn(*[v.item() for v in vals]) for vals in zip(*[b.ravel() for b in bs])]
    return np.array(flat, dtype=dtype).reshape(bs[0].shape)


def _fp16_overflow(v: np.ndarray) -> np.ndarray:
    """The exact result as fp16 storage sees it: magnitudes past the rounding threshold become inf."""
    return np.where(np.abs(v) >= _FP16_OVERFLOW, np.sign(v) * np.inf, v)


def _away_from_zero(g: np.random.Generator, lo: float, hi: float, shape: tuple[int, ...]) -> np.ndarray:
    """Values with lo <= |v| <= hi and random signs (divisors)."""
    return np.where(g.random(shape) < 0.5, -1.0, 1.0) * g.uniform(lo, hi, shape)


def _ignore(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """An expectation computed with floating-point warnings silenced (inf / NaN are the point)."""

    def wrapped(**kw: Any) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(**kw)

    return wrapped


# -- binary arithmetic ----------------------------------------------------------------------------------

Sampler = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _unif(lo: float, hi: float) -> Sampler:
    return lambda g, shape: g.uniform(lo, hi, shape)


def _divisor(g: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return _away_from_zero(g, 0.5, 4.0, shape)


# op -> (float64 formula, x sampler, y sampler, const scalar y, runtime scalar x)
FLOAT_BINARY: dict[
    str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], Sampler, Sampler, float, float]
] = {
    "add": (lambda x, y: x + y, _unif(-8, 8), _unif(-8, 8), 2.5, -1.25),
    "sub": (lambda x, y: x - y, _unif(-8, 8), _unif(-8, 8), 0.75, 3.0),
    "mul": (lambda x, y: x * y, _unif(-4, 4), _unif(-4, 4), -1.5, 0.125),
    "real_div": (lambda x, y: x / y, _unif(-8, 8), _divisor, 3.0, 2.0),
    "floor_div": (lambda x, y: np.floor(x / y), _unif(-10, 10), _divisor, 1.5, 7.0),
    # Positive bases: a negative base to a non-integer power is NaN (a case of its own below).
    "pow": (lambda x, y: x**y, _unif(0.25, 3), _unif(-2, 2), -0.5, 2.0),
    "maximum": (lambda x, y: np.where(x > y, x, y), _unif(-4, 4), _unif(-4, 4), 0.0, 1.0),
    "minimum": (lambda x, y: np.where(x < y, x, y), _unif(-4, 4), _unif(-4, 4), 0.0, 1.0),
    # Floored modulo: the result has the sign of y.
    "mod": (lambda x, y: x - np.floor(x / y) * y, _unif(-10, 10), _divisor, 2.0, 5.5),
}

# Exact integer semantics, written with Python ints (division by zero gives 0 for the int32 forms).
INT_BINARY: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "real_div": lambda a, b: 0 if b == 0 else (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1),
    "floor_div": lambda a, b: 0 if b == 0 else a // b,
    # Computed in float and truncated toward zero: 2**-1 -> 0, (-1)**-3 -> -1, 0**-1 (division by zero) -> 0.
    "pow": lambda a, b: 0 if (a == 0 and b < 0) else int(a**b),
    "maximum": lambda a, b: a if a > b else b,
    "minimum": lambda a, b: a if a < b else b,
    "mod": lambda a, b: 0 if b == 0 else a % b,
}


def _binary_cases() -> list[SimCase]:
    cases = []
    for op, (fn, sx, sy, const_y, scalar_x) in FLOAT_BINARY.items():

        def expect(x: np.ndarray, y: np.ndarray, fn: Callable = fn, **_: Any) -> np.ndarray:
            return fn(np.asarray(x), np.asarray(y))

        g = rng(f"{op}/tensors")
        cases.append(_case(op, "tensors", {"x": sx(g, SHAPE), "y": sy(g, SHAPE)}, expect))
        g = rng(f"{op}/bcast")
        cases.append(_case(op, "bcast_channel", {"x": sx(g, SHAPE), "y": sy(g, CHAN)}, expect))
        g = rng(f"{op}/const_y")
        # The ANE idiom: a tensor with an fp16 scalar const (rank 0) on the right.
        cases.append(_case(op, "const_scalar_y", {"x": sx(g, SHAPE)}, expect, params={"y": const_y}))
        g = rng(f"{op}/scalar_x")
        # A rank-0 runtime input on the left, broadcast against a [1, C, 1, S] tensor.
        cases.append(_case(op, "runtime_scalar_x", {"x": np.array(scalar_x), "y": sy(g, SHAPE)}, expect))
        g = rng(f"{op}/int32")
        if op == "pow":
            x = g.integers(-4, 5, (1, 4, 1, 6))
            y = g.integers(-2, 5, (1, 4, 1, 6))
        else:
            x = g.integers(-50, 51, (1, 4, 1, 6))
            y = g.integers(-7, 8, (1, 4, 1, 6))
            y[0, :, 0, 0] = 0  # integer division / mod by zero gives 0
        cases.append(
            _case(
                op,
                "int32",
                {"x": x, "y": y},
                lambda x, y, f=INT_BINARY[op], **_: _map(
                    f, x.astype(np.int64), y.astype(np.int64), dtype=np.int64
                ),
            )
        )
    return cases


def _binary_special_cases() -> list[SimCase]:
    g = rng("binary/specials")
    big = np.where(g.random(SHAPE) < 0.5, -1.0, 1.0) * g.uniform(150.0, 300.0, SHAPE)
    x0 = g.uniform(-4, 4, SHAPE)
    x0[0, :4, 0, :4] = 0.0
    y0 = g.uniform(-4, 4, SHAPE)
    y0[0, ::2, 0, ::3] = 0.0
    xn = g.uniform(-4, 4, SHAPE)
    yn = g.uniform(-4, 4, SHAPE)
    xn[0, 1, 0, ::3] = np.nan
    yn[0, 2, 0, ::4] = np.nan
    xn[0, 3, 0, :2] = [np.inf, -np.inf]
    xi = np.array([[2**31 - 1, -(2**31), 2**30, 7], [-1, 5, -(2**30), 0]])
    yi = np.array([[1, -1, 2**30, -7], [-(2**31) + 1, 2**31 - 6, -(2**30) - 1, 0]])
    return [
        # x * 300 spans 45000..90000: products past 65520 overflow to +-inf in the fp16 output.
        _case(
            "mul", "fp16_overflow", {"x": big}, lambda x, y, **_: _fp16_overflow(x * y), params={"y": 300.0}
        ),
        # IEEE division by zero: +-inf, and NaN for 0 / 0.
        _case("real_div", "by_zero", {"x": x0, "y": y0}, _ignore(lambda x, y, **_: x / y)),
        _case("maximum", "nan_inf", {"x": xn, "y": yn}, _ignore(lambda x, y, **_: np.maximum(x, y))),
        _case("minimum", "nan_inf", {"x": xn, "y": yn}, _ignore(lambda x, y, **_: np.minimum(x, y))),
        # A negative base: integer exponents are exact, a non-integer exponent gives NaN.
        _case(
            "pow",
            "negative_base",
            {"x": g.uniform(-3, -0.25, SHAPE), "y": np.array([3.0, 2.0, -1.0, 0.5] * 2).reshape(CHAN)},
            _ignore(lambda x, y, **_: np.power(x, y)),
        ),
        # int32 add wraps around on overflow.
        _case(
            "add",
            "int32_wraps",
            {"x": xi, "y": yi},
            lambda x, y, **_: (x.astype(np.int64) + y + 2**31) % 2**32 - 2**31,
        ),
        _case(
            "add",
            "fp32",
            {"x": g.uniform(-8, 8, SHAPE), "y": g.uniform(-8, 8, CHAN)},
            lambda x, y, **_: x + y,
            **_FP32,
        ),
        _case(
            "real_div",
            "fp32",
            {"x": g.uniform(-8, 8, SHAPE)},
            lambda x, y, **_: x / y,
            params={"y": 3.0},
            **_FP32,
        ),
    ]


# -- comparisons ----------------------------------------------------------------------------------------

COMPARE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "equal": lambda x, y: x == y,
    "not_equal": lambda x, y: x != y,
    "greater": lambda x, y: x > y,
    "greater_equal": lambda x, y: x >= y,
    "less": lambda x, y: x < y,
    "less_equal": lambda x, y: x <= y,
}


def _halves(g: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Multiples of 0.5 in [-2, 2]: plenty of exact ties."""
    return g.integers(-4, 5, shape) / 2.0


def _compare_cases() -> list[SimCase]:
    cases = []
    for op, fn in COMPARE.items():

        def expect(x: np.ndarray, y: np.ndarray, fn: Callable = fn, **_: Any) -> np.ndarray:
            return np.asarray(fn(np.asarray(x), np.asarray(y)), dtype=bool)

        g = rng(f"{op}/ties")
        cases.append(_case(op, "ties_bcast", {"x": _halves(g, SHAPE), "y": _halves(g, ROW)}, expect))
        g = rng(f"{op}/const_y")
        cases.append(_case(op, "const_scalar_y", {"x": _halves(g, SHAPE)}, expect, params={"y": 0.5}))
        g = rng(f"{op}/scalar_x")
        cases.append(_case(op, "runtime_scalar_x", {"x": np.array(-0.5), "y": _halves(g, SHAPE)}, expect))
        g = rng(f"{op}/nan")
        x, y = _halves(g, SHAPE), _halves(g, SHAPE)
        x[0, 0, 0, ::3] = np.nan
        y[0, 1, 0, ::2] = np.nan
        x[0, 2, 0, :4] = [np.inf, -np.inf, np.inf, -np.inf]
        y[0, 2, 0, :4] = [np.inf, np.inf, -np.inf, -np.inf]
        cases.append(_case(op, "nan_inf", {"x": x, "y": y}, _ignore(expect)))
        g = rng(f"{op}/int32")
        cases.append(
            _case(op, "int32", {"x": g.integers(-3, 4, SHAPE), "y": g.integers(-3, 4, CHAN)}, expect)
        )
    return cases


# -- logical ops and select -----------------------------------------------------------------------------

LOGICAL: dict[str, Callable[[bool, bool], bool]] = {
    "logical_and": lambda a, b: a and b,
    "logical_or": lambda a, b: a or b,
    "logical_xor": lambda a, b: a != b,
}


def _bools(g: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(g.random(shape) < 0.5)


def _logical_cases() -> list[SimCase]:
    cases = []
    for op, fn in LOGICAL.items():

        def expect(x: Any, y: Any, fn: Callable = fn, **_: Any) -> np.ndarray:
            return _map(fn, np.asarray(x, dtype=bool), np.asarray(y, dtype=bool), dtype=bool)

        g = rng(f"{op}/bcast")
        cases.append(_case(op, "bcast", {"x": _bools(g, SHAPE), "y": _bools(g, ROW)}, expect))
        g = rng(f"{op}/scalar_x")
        cases.append(_case(op, "runtime_scalar_x_true", {"x": np.array(True), "y": _bools(g, SHAPE)}, expect))
        g = rng(f"{op}/const_y")
        cases.append(_case(op, "const_scalar_y_false", {"x": _bools(g, SHAPE)}, expect, params={"y": False}))
    g = rng("logical_not")
    cases += [
        _case(
            "logical_not",
            "tensor",
            {"x": _bools(g, SHAPE)},
            lambda x, **_: _map(lambda v: not v, x, dtype=bool),
        ),
        _case("logical_not", "rank0", {"x": np.array(False)}, lambda x, **_: np.array(not bool(x))),
    ]
    return cases


def _select(cond: Any, a: Any, b: Any, **_: Any) -> np.ndarray:
    bs = np.broadcast_arrays(np.asarray(cond), np.asarray(a), np.asarray(b))
    return _map(lambda c, p, q: p if c else q, *bs, dtype=np.asarray(a).dtype)


def _select_cases() -> list[SimCase]:
    g = rng("select")
    return [
        _case(
            "select",
            "tensors",
            {"cond": _bools(g, SHAPE), "a": g.standard_normal(SHAPE), "b": g.standard_normal(SHAPE)},
            _select,
        ),
        # The attention-mask idiom: a per-position condition, a tensor, and a -inf const.
        _case(
            "select",
            "mask_const_b",
            {"cond": _bools(g, ROW), "a": g.standard_normal(SHAPE)},
            _select,
            params={"b": -np.inf},
        ),
        # cond of higher rank than a (per channel) and b (a rank-0 runtime input).
        _case(
            "select",
            "cond_higher_rank",
            {"cond": _bools(g, SHAPE), "a": g.standard_normal(CHAN), "b": np.array(0.5)},
            _select,
        ),
        _case(
            "select",
            "int32",
            {"cond": _bools(g, SHAPE), "a": g.integers(-100, 100, SHAPE), "b": g.integers(-100, 100, ROW)},
            _select,
        ),
        _case(
            "select", "bool", {"cond": _bools(g, SHAPE), "a": _bools(g, SHAPE), "b": _bools(g, CHAN)}, _select
        ),
    ]


# -- unary math -----------------------------------------------------------------------------------------

# op -> (scalar formula on Python floats, sampling range); epsilon ops take the default as a keyword.
UNARY: dict[str, tuple[Callable[..., float], tuple[float, float]]] = {
    "abs": (lambda v: -v if v < 0 else v, (-5, 5)),
    "exp": (math.exp, (-6, 6)),
    "exp2": (lambda v: 2.0**v, (-8, 8)),
    "log": (lambda v, epsilon=1e-45: math.log(v + epsilon), (0.01, 50)),
    "sqrt": (math.sqrt, (0, 100)),
    "rsqrt": (lambda v, epsilon=1e-12: 1.0 / math.sqrt(v + epsilon), (0.01, 100)),
    "inverse": (lambda v, epsilon=1e-4: 1.0 / (v + epsilon), (0.1, 10)),
    "sin": (math.sin, (-7, 7)),
    "cos": (math.cos, (-7, 7)),
    "tan": (math.tan, (-1.4, 1.4)),
    "tanh": (math.tanh, (-4, 4)),
    "atan": (math.atan, (-10, 10)),
    "asin": (math.asin, (-1, 1)),
    "acos": (math.acos, (-1, 1)),
    "atanh": (math.atanh, (-0.95, 0.95)),
    "sinh": (math.sinh, (-5, 5)),
    "cosh": (math.cosh, (-5, 5)),
    "erf": (math.erf, (-3, 3)),
    "sign": (lambda v: float((v > 0) - (v < 0)), (-3, 3)),
    "floor": (math.floor, (-5, 5)),
    "ceil": (math.ceil, (-5, 5)),
    "round": (round, (-5, 5)),  # Python's round() is half to even
    "square": (lambda v: v * v, (-8, 8)),
}


def _unary_expect(fn: Callable[..., float]) -> Callable[..., np.ndarray]:
    def expect(x: np.ndarray, epsilon: float | None = None, **_: Any) -> np.ndarray:
        if epsilon is None:
            return _map(fn, x)
        return _map(lambda v: fn(v, epsilon=epsilon), x)

    return expect


def _unary_cases() -> list[SimCase]:
    cases = []
    for op, (fn, (lo, hi)) in UNARY.items():
        x = rng(f"{op}/main").uniform(lo, hi, SHAPE)
        if op in ("sign", "floor", "ceil", "round", "abs"):
            x[0, 0, 0, :] = np.arange(-4, 4, 0.5)  # zeros, integers and halves
        if op == "inverse":
            x = np.where(rng("inverse/signs").random(SHAPE) < 0.5, -x, x)
        cases.append(_case(op, "main", {"x": x}, _unary_expect(fn)))
    g = rng("unary/extra")
    ints = np.arange(-12, 12).reshape(1, 4, 1, 6)
    cases += [
        _case("abs", "int32", {"x": ints}, lambda x, **_: _map(abs, x, dtype=np.int64)),
        _case(
            "sign", "int32", {"x": ints}, lambda x, **_: _map(lambda v: (v > 0) - (v < 0), x, dtype=np.int64)
        ),
        _case("square", "int32", {"x": ints * 100}, lambda x, **_: _map(lambda v: v * v, x, dtype=np.int64)),
        # Negative exponents truncate toward zero: 2**-k -> 0.
        _case(
            "exp2",
            "int32",
            {"x": np.arange(-6, 18).reshape(1, 4, 1, 6)},
            lambda x, **_: _map(lambda v: 2**v if v >= 0 else 0, x, dtype=np.int64),
        ),
        _case(
            "log",
            "epsilon",
            {"x": g.uniform(0, 20, SHAPE)},
            _unary_expect(UNARY["log"][0]),
            params={"epsilon": 0.5},
        ),
        _case(
            "rsqrt",
            "epsilon",
            {"x": g.uniform(0, 20, SHAPE)},
            _unary_expect(UNARY["rsqrt"][0]),
            params={"epsilon": 2.0**-6},
        ),
        _case(
            "inverse",
            "epsilon",
            {"x": g.uniform(0, 20, SHAPE)},
            _unary_expect(UNARY["inverse"][0]),
            params={"epsilon": 2.0},
        ),
        # Ties round to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0, -2.5 -> -2.
        _case(
            "round",
            "ties_to_even",
            {"x": (np.arange(-16, 16) / 2.0).reshape(1, 2, 1, 16)},
            lambda x, **_: _map(round, x),
        ),
        # e**x past ~11.09 overflows fp16 (65504 is its largest finite value).
        _case(
            "exp",
            "fp16_overflow",
            {"x": g.uniform(9, 13, SHAPE)},
            lambda x, **_: _fp16_overflow(_map(math.exp, x)),
        ),
        _case("exp", "fp32", {"x": g.uniform(-20, 20, SHAPE)}, lambda x, **_: _map(math.exp, x), **_FP32),
        _case("erf", "fp32", {"x": g.uniform(-4, 4, SHAPE)}, lambda x, **_: _map(math.erf, x), **_FP32),
        # Outside the domain: NaN (sqrt, log, asin, acos of out-of-range values), poles: +-inf.
        _case(
            "sqrt",
            "negative_nan",
            {"x": np.array([[4.0, -1.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 2.0]])},
            _ignore(lambda x, **_: np.sqrt(x)),
        ),
        _case(
            "log",
            "zero_and_negative",
            {"x": np.array([[0.0, -1.0, 1.0, np.e, np.inf, 0.5]])},
            _ignore(lambda x, epsilon, **_: np.log(x + epsilon)),
            params={"epsilon": 0.0},
        ),
        # With epsilon 0: 1 / +-0. Note -0.0 + 0.0 is +0.0, so inverse(-0.0) is +inf, not -inf.
        _case(
            "inverse",
            "zero_pole",
            {"x": np.array([[0.0, -0.0, 0.25, -4.0]])},
            _ignore(lambda x, epsilon, **_: 1.0 / (x + epsilon)),
            params={"epsilon": 0.0},
        ),
        _case(
            "atanh",
            "poles",
            {"x": np.array([[-1.0, 1.0, 0.0, 0.5, 1.5]])},
            _ignore(lambda x, **_: np.arctanh(x)),
        ),
        _case(
            "asin",
            "out_of_range",
            {"x": np.array([[-1.5, -1.0, 0.0, 1.0, 1.5]])},
            _ignore(lambda x, **_: np.arcsin(x)),
        ),
        _case(
            "acos",
            "out_of_range",
            {"x": np.array([[-1.5, -1.0, 0.0, 1.0, 1.5]])},
            _ignore(lambda x, **_: np.arccos(x)),
        ),
        _case(
            "sign",
            "nan",
            {"x": np.array([[np.nan, -np.inf, -0.0, 0.0, np.inf, 3.0]])},
            _ignore(lambda x, **_: np.array([[np.nan, -1.0, 0.0, 0.0, 1.0, 1.0]])),
        ),
    ]
    return cases


# -- activations ----------------------------------------------------------------------------------------


def _sig(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _gelu_exact(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _map(math.erf, x / math.sqrt(2.0)))


def _per_c(p: np.ndarray, rank: int) -> np.ndarray:
    return np.asarray(p, dtype=np.float64).reshape((1, -1) + (1,) * (rank - 2))


def _activation_cases() -> list[SimCase]:
    g = rng("activation")

    def u(lo: float, hi: float, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
        return g.uniform(lo, hi, shape)

    halves = np.arange(-4, 4, 0.5).reshape(ROW)  # exact ties at the kinks (0, alpha, beta)
    x_kinks = np.concatenate([np.broadcast_to(halves, (1, 1, 1, 16)), u(-8, 8, (1, 7, 1, 16))], axis=1)
    x_c = u(-4, 4)
    x3 = u(-4, 4, (1, 8, 16))
    x5 = u(-4, 4, (1, 4, 2, 2, 3))
    alpha_c = np.arange(1, 9) / 16.0
    sp_alpha = np.array([0.5, 1.0, 1.5, 2.0, 0.25, 0.75, 1.25, 3.0])
    sp_beta = np.array([1.0, -1.0, 0.5, 2.0, -0.5, 1.5, 0.25, -2.0])
    return [
        _case("sigmoid", "main", {"x": u(-8, 8)}, lambda x, **_: _sig(x)),
        _case(
            "sigmoid_hard",
            "main",
            {"x": x_kinks},
            lambda x, alpha, beta, **_: np.clip(alpha * x + beta, 0.0, 1.0),
            params={"alpha": 0.25, "beta": 0.5},
        ),
        # iOS17+: fp32 (rank-0 tensor) params on an fp16 x; the expectation uses their float32 values.
        _case(
            "sigmoid_hard",
            "fp32_params",
            {"x": u(-6, 6)},
            lambda x, alpha, beta, **_: np.clip(alpha.astype(np.float64) * x + beta, 0.0, 1.0),
            params={"alpha": np.array(0.2, np.float32), "beta": np.array(0.5, np.float32)},
        ),
        _case("relu", "main", {"x": x_kinks}, lambda x, **_: np.where(x > 0, x, 0.0)),
        _case(
            "relu6",
            "main",
            {"x": x_kinks + 3.0},
            lambda x, **_: np.where(x < 0, 0.0, np.where(x > 6, 6.0, x)),
        ),
        _case(
            "leaky_relu",
            "main",
            {"x": x_kinks},
            lambda x, alpha, **_: np.where(x >= 0, x, alpha * x),
            params={"alpha": 0.125},
        ),
        _case(
            "leaky_relu",
            "fp32_alpha",
            {"x": u(-8, 8)},
            lambda x, alpha, **_: np.where(x >= 0, x, np.float64(alpha) * x),
            params={"alpha": np.array(0.01, np.float32)},
        ),
        _case(
            "elu",
            "main",
            {"x": u(-6, 4)},
            lambda x, alpha, **_: np.where(x > 0, x, alpha * _map(math.expm1, x)),
            params={"alpha": 1.5},
        ),
        _case("silu", "main", {"x": u(-8, 8)}, lambda x, **_: x * _sig(x)),
        # mode omitted: EXACT is the default.
        _case("gelu", "default_exact", {"x": u(-5, 5)}, lambda x, **_: _gelu_exact(x)),
        _case("gelu", "EXACT", {"x": u(-5, 5)}, lambda x, **_: _gelu_exact(x), params={"mode": "EXACT"}),
        _case(
            "gelu",
            "TANH_APPROXIMATION",
            {"x": u(-5, 5)},
            lambda x, **_: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
            params={"mode": "TANH_APPROXIMATION"},
        ),
        _case(
            "gelu",
            "SIGMOID_APPROXIMATION",
            {"x": u(-5, 5)},
            lambda x, **_: x * _sig(1.702 * x),
            params={"mode": "SIGMOID_APPROXIMATION"},
        ),
        _case("softplus", "main", {"x": u(-8, 8)}, lambda x, **_: _map(lambda v: math.log1p(math.exp(v)), x)),
        # Large inputs: log(1 + e**x) must not overflow in float32 (e**100 does not fit); the result is ~x.
        _case(
            "softplus",
            "large",
            {"x": u(80, 120)},
            lambda x, **_: x + _map(lambda v: math.log1p(math.exp(-v)), x),
        ),
        _case(
            "prelu",
            "rank4_per_channel",
            {"x": x_c},
            lambda x, alpha, **_: np.where(x > 0, x, _per_c(alpha, 4) * x),
            params={"alpha": alpha_c},
        ),
        _case(
            "prelu",
            "rank3_shared",
            {"x": x3},
            lambda x, alpha, **_: np.where(x > 0, x, _per_c(alpha, 3) * x),
            params={"alpha": np.full(8, 0.25)},
        ),
        _case(
            "prelu",
            "rank5_shared",
            {"x": x5},
            lambda x, alpha, **_: np.where(x > 0, x, _per_c(alpha, 5) * x),
            params={"alpha": np.full(4, 0.375)},
        ),
        _case(
            "softplus_parametric",
            "rank4",
            {"x": x_c},
            lambda x, alpha, beta, **_: _per_c(alpha, 4) * np.log1p(np.exp(_per_c(beta, 4) * x)),
            params={"alpha": sp_alpha, "beta": sp_beta},
        ),
        _case(
            "softplus_parametric",
            "rank3",
            {"x": x3},
            lambda x, alpha, beta, **_: _per_c(alpha, 3) * np.log1p(np.exp(_per_c(beta, 3) * x)),
            params={"alpha": sp_alpha, "beta": sp_beta},
        ),
        _case("softsign", "main", {"x": u(-8, 8)}, lambda x, **_: x / (1.0 + np.abs(x))),
        _case(
            "scaled_tanh",
            "main",
            {"x": u(-4, 4)},
            lambda x, alpha, beta, **_: alpha * np.tanh(beta * x),
            params={"alpha": 1.75, "beta": 0.625},
        ),
        _case(
            "clip",
            "main",
            {"x": x_kinks},
            lambda x, alpha, beta, **_: np.where(x < alpha, alpha, np.where(x > beta, beta, x)),
            params={"alpha": -1.0, "beta": 2.0},
        ),
        # alpha > beta is accepted and yields beta everywhere.
        _case(
            "clip",
            "reversed_bounds",
            {"x": u(-4, 4)},
            lambda x, alpha, beta, **_: np.full_like(x, beta),
            params={"alpha": 1.0, "beta": -1.0},
        ),
        _case(
            "clamped_relu",
            "main",
            {"x": x_kinks},
            lambda x, alpha, beta, **_: np.minimum(np.where(x >= 0, x, alpha * x), beta),
            params={"alpha": 0.25, "beta": 1.5},
        ),
        _case(
            "clamped_relu",
            "negative_beta",
            {"x": x_kinks},
            lambda x, alpha, beta, **_: np.minimum(np.where(x >= 0, x, alpha * x), beta),
            params={"alpha": 0.5, "beta": -0.75},
        ),
        _case(
            "threshold",
            "main",
            {"x": x_kinks},
            lambda x, alpha, **_: np.where(x > alpha, x, alpha),
            params={"alpha": 0.25},
        ),
        _case(
            "threshold",
            "int32",
            {"x": np.arange(-12, 12).reshape(1, 4, 1, 6)},
            lambda x, alpha, **_: _map(lambda v: max(v, alpha), x, dtype=np.int64),
            params={"alpha": 2},
        ),
        _case(
            "thresholded_relu",
            "main",
            {"x": x_kinks},
            lambda x, alpha, **_: np.where(x >= alpha, x, 0.0),
            params={"alpha": 0.5},
        ),
        _case(
            "linear_activation",
            "main",
            {"x": u(-8, 8)},
            lambda x, alpha, beta, **_: alpha * x + beta,
            params={"alpha": -1.5, "beta": 0.75},
        ),
    ]


def _softmax(x: np.ndarray, axis: int = -1, **_: Any) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def _softmax_cases() -> list[SimCase]:
    g = rng("softmax")
    large = 1000.0 + g.uniform(-8, 8, SHAPE)
    large[0, 4:, 0, :] -= 2000.0  # rows around -1000
    large[0, :, 0, ::5] = -np.inf  # masked positions (never a whole row)
    return [
        _case("softmax", "default_axis", {"x": g.uniform(-6, 6, SHAPE)}, _softmax),
        _case("softmax", "axis_channels", {"x": g.uniform(-6, 6, SHAPE)}, _softmax, params={"axis": 1}),
        _case("softmax", "axis_-3", {"x": g.uniform(-6, 6, SHAPE)}, _softmax, params={"axis": -3}),
        _case("softmax", "axis_2_rank4", {"x": g.uniform(-6, 6, (1, 4, 6, 8))}, _softmax, params={"axis": 2}),
        _case("softmax", "axis_0_rank2", {"x": g.uniform(-6, 6, (6, 16))}, _softmax, params={"axis": 0}),
        # Size-1 axis: every output is 1.
        _case("softmax", "axis_size1", {"x": g.uniform(-6, 6, SHAPE)}, _softmax, params={"axis": 2}),
        # Logits near +-1000 (exp overflows/underflows without the max subtraction) and -inf masks.
        _case("softmax", "large_logits_masked", {"x": large}, _ignore(_softmax)),
        _case("softmax", "fp32", {"x": g.uniform(-20, 20, SHAPE)}, _softmax, params={"axis": -1}, **_FP32),
    ]


CASES = [
    *_binary_cases(),
    *_binary_special_cases(),
    *_compare_cases(),
    *_logical_cases(),
    *_select_cases(),
    *_unary_cases(),
    *_activation_cases(),
    *_softmax_cases(),
]
