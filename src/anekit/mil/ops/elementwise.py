"""Elementwise ops: broadcasting arithmetic, comparisons, logical ops, select and unary math."""

from __future__ import annotations

import math

import numpy as np

from anekit.mil import types as T
from anekit.mil.ops._util import broadcast
from anekit.mil.registry import InferArgs, Input, OpDef, RefArgs, register_op

# Dtype domains (the union of coremltools' iOS15..iOS18 definitions).
BINARY_T = frozenset({"fp16", "fp32", "int32"})
FLOAT_T = frozenset({"fp16", "fp32"})
UNARY_INT_T = frozenset({"fp16", "fp32", "int32"})
BOOL_T = frozenset({"bool"})
SELECT_T = frozenset({"fp16", "fp32", "int32", "bool"})


# -- helpers shared with the activation family ------------------------------------------------------


def param_fits(a: InferArgs, name: str, target: str = "x") -> None:
    """Check that the optional parameter ``name`` (usually a scalar) broadcasts into ``target``'s shape
    without changing it; a clear error otherwise. Symbolic dims are given the benefit of the doubt."""
    if not a.has(name):
        return
    p = a.tensor(name).shape
    x = a.tensor(target).shape
    ok = len(p) <= len(x)
    if ok:
        for dp, dx in zip(reversed(p), reversed(x)):
            if dp == 1 or dp == dx or isinstance(dp, str) or isinstance(dx, str):
                continue
            ok = False
            break
    if not ok:
        raise a.error(
            f"input '{name}' of shape {list(p)} must be a scalar or broadcast to the shape of "
            f"'{target}' {list(x)} without changing it"
        )


def like(result: object, dtype: np.dtype) -> np.ndarray:
    """``result`` as an array of ``dtype`` (keeps rank-0 results arrays; undoes accidental upcasts)."""
    out = np.asarray(result)
    if out.dtype != dtype:
        with np.errstate(all="ignore"):
            out = out.astype(dtype)
    return out


def _float_or(dt: np.dtype) -> np.dtype:
    """The dtype itself when it is a float, else float64 (for computing on integer inputs)."""
    return dt if dt.kind == "f" else np.dtype(np.float64)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


def erf_np(x: np.ndarray) -> np.ndarray:
    """The error function, vectorised, accurate to about 1e-15 (computed in float64, returned in the
    input's float dtype).

    |x| < 2.5: erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n (2x^2)^n x / (1*3*...*(2n+1)), a series of
    positive terms (no cancellation). |x| >= 2.5: erf(x) = sign(x) * (1 - erfc(|x|)) with erfc from
    its Laplace continued fraction, evaluated bottom-up at a fixed depth.
    """
    x = np.asarray(x)
    out_dtype = _float_or(x.dtype)
    w = x.astype(np.float64)
    stop = np.finfo(out_dtype).eps / 4
    depth = 25 if out_dtype == np.float64 else 12
    out = np.empty_like(w)
    ax = np.abs(w)
    small = ax < 2.5
    with np.errstate(all="ignore"):
        xs = w[small]
        x2 = xs * xs
        term = xs.copy()
        total = xs.copy()
        n = 0
        while term.size:
            n += 1
            term *= (2.0 * x2) / (2 * n + 1)
            total += term
            if not np.any(np.abs(term) > stop * np.abs(total)):
                break
        out[small] = _TWO_OVER_SQRT_PI * np.exp(-x2) * total
        big = ~small
        xb = ax[big]
        f = xb.copy()
        for k in range(depth, 0, -1):
            f = xb + (k / 2.0) / f
        erfc = np.exp(-xb * xb) * _INV_SQRT_PI / f
        erfc = np.where(np.isinf(xb), 0.0, erfc)
        out[big] = np.where(np.isnan(xb), np.nan, np.sign(w[big]) * (1.0 - erfc))
    return like(out, out_dtype)


# -- binary ops ------------------------------------------------------------------------------------


class _Binary(OpDef):
    """Elementwise binary op with numpy broadcasting; x and y share the dtype T."""

    inputs = {"x": Input(BINARY_T), "y": Input(BINARY_T)}
    same_dtype = ("x", "y")
    out_bool = False

    def infer(self, a: InferArgs) -> T.Type:
        dt = T.bool_ if self.out_bool else a.tensor("x").dtype
        return T.TensorType(dt, broadcast(a, "x", "y"))

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reference(self, a: RefArgs) -> np.ndarray:
        x, y = np.asarray(a["x"]), np.asarray(a["y"])
        with np.errstate(all="ignore"):
            r = self.compute(x, y)
        return like(r, np.dtype(bool) if self.out_bool else np.result_type(x, y))


@register_op
class add(_Binary):
    """add(x, y): x + y elementwise with numpy broadcasting (rank-0 either side).

    x, y: tensor<T> with T in {fp16, fp32, int32} (the same for both). Output: tensor<T, broadcast shape>.
    Integers wrap on overflow.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x + y


@register_op
class sub(_Binary):
    """sub(x, y): x - y elementwise with numpy broadcasting (rank-0 either side).

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<T, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x - y


@register_op
class mul(_Binary):
    """mul(x, y): x * y elementwise with numpy broadcasting (rank-0 either side).

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<T, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x * y


@register_op
class real_div(_Binary):
    """real_div(x, y): x / y elementwise with numpy broadcasting.

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<T, broadcast shape>.
    Floats: IEEE division (x/0 is +-inf, 0/0 NaN). int32: the output type stays int32, so the true
    quotient is truncated toward zero (C semantics); integer division by zero gives 0.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "iu" and y.dtype.kind in "iu":
            safe = np.where(y == 0, 1, y)
            q = (np.abs(x) // np.abs(safe)) * (np.sign(x) * np.sign(safe))
            return np.where(y == 0, 0, q)
        return np.true_divide(x, y)


@register_op
class floor_div(_Binary):
    """floor_div(x, y): x / y rounded toward negative infinity, elementwise with broadcasting.

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<T, broadcast shape>.
    Python/numpy ``//`` semantics; integer division by zero gives 0.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.floor_divide(x, y)


@register_op
class pow_(_Binary):
    """pow(x, y): x ** y elementwise with broadcasting (e.g. ``pow(x = t, y = -0.5)``).

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<T, broadcast shape>.
    Floats: IEEE pow (a negative base to a non-integer power is NaN). int32: computed in float and
    truncated toward zero, so a negative exponent gives 0 unless |x| == 1, and 0 to a negative power
    (a division by zero) gives 0.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "iu" and y.dtype.kind in "iu":
            p = np.trunc(np.power(x.astype(np.float64), y.astype(np.float64)))
            return np.where(np.isfinite(p), p, 0)
        return np.power(x, y)


@register_op
class maximum(_Binary):
    """maximum(x, y): the larger of x and y elementwise with broadcasting (NaN propagates).

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<T, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.maximum(x, y)


@register_op
class minimum(_Binary):
    """minimum(x, y): the smaller of x and y elementwise with broadcasting (NaN propagates).

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<T, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.minimum(x, y)


@register_op
class mod(_Binary):
    """mod(x, y): x % y elementwise with broadcasting, floored: the result has the sign of y
    (Python/numpy ``%``, consistent with ``floor_div``: x == floor_div(x, y) * y + mod(x, y)).

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<T, broadcast shape>.
    Integer mod by zero gives 0; float mod by zero gives NaN.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.mod(x, y)


# -- comparisons -------------------------------------------------------------------------------------


class _Compare(_Binary):
    out_bool = True


@register_op
class equal(_Compare):
    """equal(x, y): x == y elementwise with broadcasting.

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.equal(x, y)


@register_op
class not_equal(_Compare):
    """not_equal(x, y): x != y elementwise with broadcasting (true where either is NaN).

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.not_equal(x, y)


@register_op
class greater(_Compare):
    """greater(x, y): x > y elementwise with broadcasting.

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.greater(x, y)


@register_op
class greater_equal(_Compare):
    """greater_equal(x, y): x >= y elementwise with broadcasting.

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.greater_equal(x, y)


@register_op
class less(_Compare):
    """less(x, y): x < y elementwise with broadcasting.

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.less(x, y)


@register_op
class less_equal(_Compare):
    """less_equal(x, y): x <= y elementwise with broadcasting.

    x, y: tensor<T> with T in {fp16, fp32, int32}. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.less_equal(x, y)


# -- logical ops -------------------------------------------------------------------------------------


class _Logical(_Compare):
    inputs = {"x": Input(BOOL_T), "y": Input(BOOL_T)}


@register_op
class logical_and(_Logical):
    """logical_and(x, y): x AND y elementwise with broadcasting.

    x, y: tensor<bool>. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.logical_and(x, y)


@register_op
class logical_or(_Logical):
    """logical_or(x, y): x OR y elementwise with broadcasting.

    x, y: tensor<bool>. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.logical_or(x, y)


@register_op
class logical_xor(_Logical):
    """logical_xor(x, y): x XOR y elementwise with broadcasting.

    x, y: tensor<bool>. Output: tensor<bool, broadcast shape>.
    """

    def compute(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.logical_xor(x, y)


@register_op
class logical_not(OpDef):
    """logical_not(x): NOT x elementwise. x: tensor<bool>; output tensor<bool> of x's shape."""

    inputs = {"x": Input(BOOL_T)}

    def infer(self, a: InferArgs) -> T.Type:
        return a.tensor("x")

    def reference(self, a: RefArgs) -> np.ndarray:
        return like(np.logical_not(a["x"]), np.dtype(bool))


@register_op
class select(OpDef):
    """select(cond, a, b): a where cond is true, else b; all three broadcast together.

    cond: tensor<bool>. a, b: tensor<T> with T in {fp16, fp32, int32, bool} (the same for both).
    Output: tensor<T, broadcast(cond, a, b)>. (coremltools types the output from a and b alone; the
    broadcast here also covers a cond of higher rank, as numpy.where does.)
    """

    inputs = {"cond": Input(BOOL_T), "a": Input(SELECT_T), "b": Input(SELECT_T)}
    same_dtype = ("a", "b")

    def infer(self, a: InferArgs) -> T.Type:
        return T.TensorType(a.tensor("a").dtype, broadcast(a, "cond", "a", "b"))

    def reference(self, a: RefArgs) -> np.ndarray:
        x, y = np.asarray(a["a"]), np.asarray(a["b"])
        return like(np.where(np.asarray(a["cond"], dtype=bool), x, y), np.result_type(x, y))


# -- unary math ---------------------------------------------------------------------------------------


class _Unary(OpDef):
    """Elementwise unary op: output has x's type."""

    inputs = {"x": Input(FLOAT_T)}

    def infer(self, a: InferArgs) -> T.Type:
        return a.tensor("x")

    def compute(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        with np.errstate(all="ignore"):
            r = self.compute(x)
        return like(r, x.dtype)


class _UnaryInt(_Unary):
    inputs = {"x": Input(UNARY_INT_T)}


class _UnaryEps(_Unary):
    """Unary op with an optional constant ``epsilon`` added to x first."""

    inputs = {"x": Input(FLOAT_T), "epsilon": Input(FLOAT_T, const=True)}

    def infer(self, a: InferArgs) -> T.Type:
        param_fits(a, "epsilon")
        return a.tensor("x")

    def reference(self, a: RefArgs) -> np.ndarray:
        x = np.asarray(a["x"])
        eps = np.asarray(a["epsilon"], dtype=x.dtype)
        with np.errstate(all="ignore"):
            r = self.compute(x + eps)
        return like(r, x.dtype)


@register_op
class abs_(_UnaryInt):
    """abs(x): |x| elementwise. x: tensor<T>, T in {fp16, fp32, int32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.abs(x)


@register_op
class exp(_Unary):
    """exp(x): e**x elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.exp(x)


@register_op
class exp2(_UnaryInt):
    """exp2(x): 2**x elementwise. x: tensor<T>, T in {fp16, fp32, int32}; output has x's type
    (int32: the power is truncated toward zero, so negative exponents give 0)."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "iu":
            return np.trunc(np.exp2(x.astype(np.float64)))
        return np.exp2(x)


@register_op
class log(_UnaryEps):
    """log(x, epsilon = 1e-45): natural log of (x + epsilon) elementwise.

    x: tensor<T>, T in {fp16, fp32}. epsilon: optional const scalar in {fp16, fp32} (iOS15 requires
    x's dtype, iOS17+ allows either), default 1e-45. Output has x's type. log(0) is -inf; negative
    arguments give NaN.
    """

    inputs = {"x": Input(FLOAT_T), "epsilon": Input(FLOAT_T, const=True, default=1e-45)}

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.log(x)


@register_op
class sqrt(_Unary):
    """sqrt(x): square root elementwise (NaN for negative x). x: tensor<T>, T in {fp16, fp32}."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.sqrt(x)


@register_op
class rsqrt(_UnaryEps):
    """rsqrt(x, epsilon = 1e-12): 1 / sqrt(x + epsilon) elementwise.

    x: tensor<T>, T in {fp16, fp32}. epsilon: optional const scalar in {fp16, fp32} (iOS15 requires
    x's dtype, iOS17+ allows either), default 1e-12. Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "epsilon": Input(FLOAT_T, const=True, default=1e-12)}

    def compute(self, x: np.ndarray) -> np.ndarray:
        return 1.0 / np.sqrt(x)


@register_op
class inverse(_UnaryEps):
    """inverse(x, epsilon = 1e-4): 1 / (x + epsilon) elementwise.

    x: tensor<T>, T in {fp16, fp32}. epsilon: optional const scalar in {fp16, fp32} (iOS15 requires
    x's dtype, iOS17+ allows either), default 1e-4. Output has x's type.
    """

    inputs = {"x": Input(FLOAT_T), "epsilon": Input(FLOAT_T, const=True, default=1e-4)}

    def compute(self, x: np.ndarray) -> np.ndarray:
        return 1.0 / x


@register_op
class sin(_Unary):
    """sin(x): sine (radians) elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.sin(x)


@register_op
class cos(_Unary):
    """cos(x): cosine (radians) elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.cos(x)


@register_op
class tan(_Unary):
    """tan(x): tangent (radians) elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.tan(x)


@register_op
class tanh(_Unary):
    """tanh(x): hyperbolic tangent elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x)


@register_op
class atan(_Unary):
    """atan(x): inverse tangent elementwise, in (-pi/2, pi/2). x: tensor<T>, T in {fp16, fp32}."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.arctan(x)


@register_op
class asin(_Unary):
    """asin(x): inverse sine elementwise (NaN outside [-1, 1]). x: tensor<T>, T in {fp16, fp32}."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.arcsin(x)


@register_op
class acos(_Unary):
    """acos(x): inverse cosine elementwise (NaN outside [-1, 1]). x: tensor<T>, T in {fp16, fp32}."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.arccos(x)


@register_op
class atanh(_Unary):
    """atanh(x): inverse hyperbolic tangent elementwise (+-inf at +-1, NaN beyond).
    x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.arctanh(x)


@register_op
class sinh(_Unary):
    """sinh(x): hyperbolic sine elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.sinh(x)


@register_op
class cosh(_Unary):
    """cosh(x): hyperbolic cosine elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.cosh(x)


@register_op
class erf(_Unary):
    """erf(x): the Gauss error function elementwise. x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return erf_np(x)


@register_op
class sign(_UnaryInt):
    """sign(x): -1, 0 or 1 by the sign of x, elementwise (NaN stays NaN).
    x: tensor<T>, T in {fp16, fp32, int32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.sign(x)


@register_op
class floor(_Unary):
    """floor(x): round toward negative infinity elementwise. x: tensor<T>, T in {fp16, fp32}."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.floor(x)


@register_op
class ceil(_Unary):
    """ceil(x): round toward positive infinity elementwise. x: tensor<T>, T in {fp16, fp32}."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.ceil(x)


@register_op
class round_(_Unary):
    """round(x): round to the nearest integer elementwise, ties to even (0.5 -> 0, 1.5 -> 2,
    -2.5 -> -2), as coremltools documents ("0.5 is rounded to 0") and evaluates it (numpy.round).
    x: tensor<T>, T in {fp16, fp32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.rint(x)


@register_op
class square(_UnaryInt):
    """square(x): x * x elementwise. x: tensor<T>, T in {fp16, fp32, int32}; output has x's type."""

    def compute(self, x: np.ndarray) -> np.ndarray:
        return np.square(x)
