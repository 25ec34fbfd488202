"""Simulator cases for the compute families: reductions, matmul / linear / einsum / conv / conv_transpose,
pooling, normalisation and attention.

Expectations come from the loop-style float64 implementations of the op unit tests (written apart
from the ops' references) plus the spec-level geometry below. Baked weights are rounded to fp16 here
so the float64 param an expectation sees equals the fp16 const the builder makes of it.

Tolerances: the simulator computes each op in float32 and rounds its output to fp16 once, so an
output is off by at most 2**-11 of its magnitude (rtol 1e-3 keeps a factor-2 margin). ``ROUND`` adds
an atol for the float32 error of short computations and the fp16 subnormal spacing; ``ACC`` a larger
atol for long float32 accumulations (matmul, conv, sums over many elements) whose result can cancel
to near zero while the float32 error scales with the sum of the magnitudes. Outputs that are one of
the inputs (max, min, max_pool) or integers are compared exactly.
"""

from __future__ import annotations

import math

import numpy as np

from tests.sim_cases import SimCase, rng
from tests.test_ops_attention import loop_sdpa
from tests.test_ops_linear import loop_conv, loop_conv_transpose, loop_einsum, loop_matmul, same_pad
from tests.test_ops_pool_norm import loop_lrn, loop_pool
from tests.test_ops_reduction import FNS, loop_arg, loop_cumsum, loop_reduce

ROUND = {"rtol": 1e-3, "atol": 1e-6}
ACC = {"rtol": 1e-3, "atol": 1e-4}
EXACT = {"rtol": 0.0, "atol": 0.0}


def _h(a: np.ndarray) -> np.ndarray:
    """fp16-representable float64 values (what an fp16 const holds)."""
    return np.asarray(a, dtype=np.float64).astype(np.float16).astype(np.float64)


def _f16(v: float) -> float:
    return float(np.float16(v))


def _normal(label: str, *shape: int, scale: float = 1.0) -> np.ndarray:
    return rng(f"compute/{label}").standard_normal(shape) * scale


def _uniform(label: str, lo: float, hi: float, *shape: int) -> np.ndarray:
    return rng(f"compute/{label}").uniform(lo, hi, shape)


def _ints(label: str, lo: int, hi: int, *shape: int) -> np.ndarray:
    return rng(f"compute/{label}").integers(lo, hi, shape).astype(np.int32)


# -- reduction.py ---------------------------------------------------------------------------------


def _reduce(op: str):
    def expected(x, axes=None, keep_dims=False, **_):
        return loop_reduce(x, None if axes is None else list(axes), keep_dims, FNS[op])

    return expected


def _reduce_case(op, x, label, tol=ROUND, **params):
    return SimCase(op, {"x": x}, _reduce(op), params=params, label=label, **tol)


def _int_reduce(fn):
    """Integer reductions truncate a fractional result toward zero and stay integer."""

    def expected(x, axes=None, keep_dims=False, **_):
        vals = loop_reduce(x, None if axes is None else list(axes), keep_dims, fn)
        return np.trunc(vals).astype(np.int64)

    return expected


def _arg(pick_max: bool):
    def expected(x, axis=-1, keep_dims=False, **_):
        return loop_arg(x, axis, keep_dims, pick_max)

    return expected


def _cumsum(x, axis=0, exclusive=False, reverse=False, **_):
    return loop_cumsum(x, axis, exclusive, reverse)


_ties = rng("compute/arg-ties").integers(-2, 3, (1, 6, 1, 8)).astype(np.float64)  # equal maxima: first wins

REDUCTION_CASES = [
    _reduce_case("reduce_sum", _normal("sum-c", 1, 8, 1, 16), "channels_keep", axes=[1], keep_dims=True),
    _reduce_case("reduce_sum", _normal("sum-all", 1, 8, 1, 16), "all_axes_scalar", ACC),
    SimCase(
        "reduce_sum",
        {"x": _ints("sum-int", -50, 50, 1, 8, 1, 16)},
        _int_reduce(math.fsum),
        params={"axes": [-1]},
        label="int32",
    ),
    _reduce_case("reduce_mean", _normal("mean-s", 1, 8, 1, 16), "last_keep", axes=[-1], keep_dims=True),
    _reduce_case("reduce_mean", _normal("mean-cs", 1, 8, 1, 16), "two_axes", axes=[1, 3]),
    SimCase(
        "reduce_mean",
        {"x": _ints("mean-int", -9, 10, 1, 6, 1, 5)},
        _int_reduce(lambda v: math.fsum(v) / len(v)),
        params={"axes": [1], "keep_dims": True},
        label="int32_truncates",
    ),
    _reduce_case("reduce_max", _normal("max-c", 1, 8, 1, 16), "channels", EXACT, axes=[1]),
    _reduce_case("reduce_max", _normal("max-all", 1, 8, 1, 16), "all_axes_keep", EXACT, keep_dims=True),
    _reduce_case("reduce_min", _normal("min-s", 1, 8, 1, 16), "last_keep", EXACT, axes=[-1], keep_dims=True),
    _reduce_case("reduce_min", _normal("min-all", 1, 8, 1, 16), "all_axes", EXACT),
    # factors near 1 keep the product of 8 well inside fp16
    _reduce_case("reduce_prod", _uniform("prod", 0.7, 1.4, 1, 4, 1, 8), "last", axes=[3]),
    _reduce_case(
        "reduce_prod", _uniform("prod-c", 0.7, 1.4, 1, 4, 1, 8), "channels_keep", axes=[1], keep_dims=True
    ),
    _reduce_case("reduce_l1_norm", _normal("l1", 1, 8, 1, 16), "channels_keep", axes=[1], keep_dims=True),
    _reduce_case("reduce_l1_norm", _normal("l1-all", 1, 8, 1, 16), "all_axes"),
    _reduce_case("reduce_l2_norm", _normal("l2", 1, 8, 1, 16), "channels_keep", axes=[1], keep_dims=True),
    _reduce_case("reduce_l2_norm", _normal("l2-all", 1, 8, 1, 16), "all_axes"),
    _reduce_case("reduce_sum_square", _normal("ss", 1, 8, 1, 16), "last", axes=[-1]),
    _reduce_case(
        "reduce_sum_square", _normal("ss-c", 1, 8, 1, 16), "channels_keep", axes=[1], keep_dims=True
    ),
    # positive inputs: the log of the sum is defined
    _reduce_case("reduce_log_sum", _uniform("ls", 0.1, 2.0, 1, 8, 1, 16), "channels", axes=[1]),
    _reduce_case(
        "reduce_log_sum", _uniform("ls-all", 0.1, 2.0, 1, 8, 1, 16), "all_axes_keep", keep_dims=True
    ),
    _reduce_case(
        "reduce_log_sum_exp", _normal("lse", 1, 8, 1, 16), "channels_keep", axes=[1], keep_dims=True
    ),
    # exp(100) overflows float32: only the max-shifted form gets these right
    _reduce_case(
        "reduce_log_sum_exp", 100.0 + _normal("lse-big", 1, 8, 1, 16), "large_values_stable", axes=[-1]
    ),
    SimCase(
        "reduce_argmax", {"x": _normal("amax", 1, 8, 1, 16)}, _arg(True), params={"axis": 1}, label="channels"
    ),
    SimCase(
        "reduce_argmax",
        {"x": _normal("amax-s", 1, 8, 1, 16)},
        _arg(True),
        params={"keep_dims": True},
        label="default_axis_keep",
    ),
    SimCase(
        "reduce_argmax",
        {"x": _normal("amax-u16", 1, 8, 1, 16)},
        _arg(True),
        params={"axis": 3, "output_dtype": "uint16"},
        label="uint16",
    ),
    SimCase("reduce_argmax", {"x": _ties}, _arg(True), params={"axis": 1}, label="ties_first_index"),
    SimCase(
        "reduce_argmin", {"x": _normal("amin", 1, 8, 1, 16)}, _arg(False), params={"axis": -1}, label="last"
    ),
    SimCase(
        "reduce_argmin",
        {"x": _ties},
        _arg(False),
        params={"axis": 1, "keep_dims": True},
        label="ties_first_index_keep",
    ),
    SimCase("cumsum", {"x": _normal("cs-default", 6, 16)}, _cumsum, label="default_axis0", **ROUND),
    SimCase(
        "cumsum", {"x": _normal("cs", 1, 8, 1, 16)}, _cumsum, params={"axis": -1}, label="inclusive", **ROUND
    ),
    SimCase(
        "cumsum",
        {"x": _normal("cs-ex", 1, 8, 1, 16)},
        _cumsum,
        params={"axis": 3, "exclusive": True},
        label="exclusive",
        **ROUND,
    ),
    SimCase(
        "cumsum",
        {"x": _normal("cs-rev", 1, 8, 1, 16)},
        _cumsum,
        params={"axis": -1, "reverse": True},
        label="reverse",
        **ROUND,
    ),
    SimCase(
        "cumsum",
        {"x": _normal("cs-exrev", 1, 8, 1, 16)},
        _cumsum,
        params={"axis": 1, "exclusive": True, "reverse": True},
        label="exclusive_reverse_channels",
        **ROUND,
    ),
    SimCase(
        "cumsum",
        {"x": _ints("cs-int", -100, 100, 1, 4, 1, 16)},
        _cumsum,
        params={"axis": -1, "exclusive": True},
        label="int32",
    ),
]


# -- linear.py ------------------------------------------------------------------------------------


def _matmul(x, y, transpose_x=False, transpose_y=False, **_):
    if transpose_x:
        x = np.swapaxes(x, -1, -2)
    if transpose_y and y.ndim >= 2:
        y = np.swapaxes(y, -1, -2)
    return loop_matmul(x, y)


def _linear(x, weight, bias=None, **_):
    out = loop_matmul(x, np.swapaxes(weight, 0, 1))
    return out if bias is None else out + bias


def _einsum(values, equation, **_):
    return loop_einsum(equation, *values)


def _conv(x, weight, bias=None, strides=None, pad_type="valid", pad=None, dilations=None, groups=1, **_):
    nsp = x.ndim - 2
    strides = [1] * nsp if strides is None else list(strides)
    dil = [1] * nsp if dilations is None else list(dilations)
    if pad_type in ("same", "same_lower"):
        pads = [
            same_pad(d, k, s, dl, pad_type == "same_lower")
            for d, k, s, dl in zip(x.shape[2:], weight.shape[2:], strides, dil)
        ]
    elif pad_type == "custom":
        pads = [(pad[2 * i], pad[2 * i + 1]) for i in range(nsp)]
    else:
        pads = [(0, 0)] * nsp
    return loop_conv(x, weight, bias, strides, pads, dil, groups)


def _conv_transpose(
    x,
    weight,
    bias=None,
    pad=None,
    output_padding=None,
    output_shape=None,
    pad_type="valid",
    strides=None,
    dilations=None,
    groups=1,
    **_,
):
    """The spec's geometry: the full scatter buffer cropped by pad_before to the output size."""
    nsp = x.ndim - 2
    din = x.shape[2:]
    strides = [1] * nsp if strides is None else list(strides)
    dil = [1] * nsp if dilations is None else list(dilations)
    opad = [0] * nsp if output_padding is None else list(output_padding)
    p = list(pad) if pad_type == "custom" else [0] * (2 * nsp)
    dks = [(k - 1) * dl + 1 for k, dl in zip(weight.shape[2:], dil)]
    full = [(d - 1) * s + dk for d, s, dk in zip(din, strides, dks)]
    same = pad_type in ("same", "same_lower")
    if output_shape is not None:
        outs = list(output_shape)[-nsp:]
    elif same:
        outs = [d * s + op for d, s, op in zip(din, strides, opad)]
    else:
        outs = [f - p[2 * i] - p[2 * i + 1] + opad[i] for i, f in enumerate(full)]
    if same:
        befores = []
        for o, dk, s in zip(outs, dks, strides):
            total = max(0, (math.ceil(o / s) - 1) * s + dk - o)
            befores.append(total - total // 2 if pad_type == "same_lower" else total // 2)
    else:
        befores = [p[2 * i] for i in range(nsp)]
    return loop_conv_transpose(x, weight, bias, strides, befores, outs, dil, groups)


def _mm(label, x, y, **params):
    return SimCase("matmul", {"x": x, "y": y}, _matmul, params=params, label=label, **ACC)


def _conv_case(label, x, weight, runtime_weight=False, **params):
    inputs = {"x": x, "weight": weight} if runtime_weight else {"x": x}
    if not runtime_weight:
        params = {"weight": _h(weight), **params}
    if "bias" in params:
        params["bias"] = _h(params["bias"])
    return SimCase("conv", inputs, _conv, params=params, label=label, **ACC)


def _convt_case(label, x, weight, runtime_weight=False, **params):
    inputs = {"x": x, "weight": weight} if runtime_weight else {"x": x}
    if not runtime_weight:
        params = {"weight": _h(weight), **params}
    if "bias" in params:
        params["bias"] = _h(params["bias"])
    return SimCase("conv_transpose", inputs, _conv_transpose, params=params, label=label, **ACC)


LINEAR_CASES = [
    # -- matmul: activations x activations (a runtime "weight"), transposes, broadcasting, constants
    _mm("attention_scores_runtime", _normal("mm-q", 1, 2, 8, 16), _normal("mm-kt", 1, 2, 16, 12)),
    _mm("transpose_y", _normal("mm-ty-x", 1, 2, 8, 16), _normal("mm-ty-y", 1, 2, 12, 16), transpose_y=True),
    _mm("transpose_x", _normal("mm-tx-x", 1, 16, 8), _normal("mm-tx-y", 1, 16, 6), transpose_x=True),
    _mm(
        "transpose_both",
        _normal("mm-txy-x", 2, 16, 8),
        _normal("mm-txy-y", 2, 6, 16),
        transpose_x=True,
        transpose_y=True,
    ),
    _mm("batch_broadcast", _normal("mm-bb-x", 2, 1, 4, 16), _normal("mm-bb-y", 3, 16, 5)),
    _mm("vector_x", _normal("mm-v-x", 16), _normal("mm-v-y", 3, 16, 5)),
    SimCase(
        "matmul",
        {"x": _normal("mm-w-x", 1, 12, 32)},
        _matmul,
        params={"y": _h(_normal("mm-w-y", 32, 24, scale=0.25))},
        label="baked_fp16_weight",
        **ACC,
    ),
    SimCase(
        "matmul",
        {"x": _normal("mm-w32-x", 1, 12, 32)},
        _matmul,
        # an fp32 const with an fp16 activation (iOS17 mixed form): the output takes x's fp16
        params={"y": _normal("mm-w32-y", 24, 32, scale=0.25).astype(np.float32), "transpose_y": True},
        label="fp32_const_weight_transposed",
        **ACC,
    ),
    SimCase(
        "matmul",
        {"x": _ints("mm-int-x", -8, 8, 2, 3, 6), "y": _ints("mm-int-y", -8, 8, 2, 6, 4)},
        lambda x, y, **_: loop_matmul(x, y).astype(np.int64),
        label="int32",
    ),
    # -- linear
    SimCase(
        "linear",
        {"x": _normal("lin-x", 1, 12, 32)},
        _linear,
        params={"weight": _h(_normal("lin-w", 24, 32, scale=0.25)), "bias": _h(_normal("lin-b", 24))},
        label="baked_bias",
        **ACC,
    ),
    SimCase(
        "linear",
        {"x": _normal("lin-nb-x", 12, 32)},
        _linear,
        params={"weight": _h(_normal("lin-nb-w", 20, 32, scale=0.25))},
        label="baked_no_bias",
        **ACC,
    ),
    SimCase(
        "linear",
        {"x": _normal("lin-rt-x", 2, 6, 16), "weight": _normal("lin-rt-w", 10, 16)},
        _linear,
        params={"bias": _h(_normal("lin-rt-b", 10))},
        label="runtime_weight",
        **ACC,
    ),
    # -- einsum: the two forms coremltools lowers, and a general batched contraction
    SimCase(
        "einsum",
        {"values": [_normal("es-a", 1, 4, 3, 6), _normal("es-b", 1, 6, 3, 5)]},
        _einsum,
        params={"equation": "nchw,nwhu->nchu"},
        label="nchw_nwhu",
        **ACC,
    ),
    SimCase(
        "einsum",
        {"values": [_normal("es-c", 4, 3, 6), _normal("es-d", 6, 3, 5)]},
        _einsum,
        params={"equation": "chw,whr->chr"},
        label="chw_whr",
        **ACC,
    ),
    SimCase(
        "einsum",
        {"values": [_normal("es-q", 1, 2, 4, 8), _normal("es-k", 1, 2, 6, 8)]},
        _einsum,
        params={"equation": "bhqd,bhkd->bhqk"},
        label="bhqd_bhkd",
        **ACC,
    ),
    # -- conv: ANE 1x1 over [1, C, 1, S], then 2-D 3x3 geometry
    _conv_case(
        "1x1_ane_baked_bias",
        _normal("c1-x", 1, 16, 1, 12),
        _normal("c1-w", 8, 16, 1, 1, scale=0.25),
        bias=_normal("c1-b", 8),
    ),
    _conv_case("1x1_ane_runtime_weight", _normal("c1r-x", 1, 16, 1, 12), _normal("c1r-w", 8, 16, 1, 1), True),
    _conv_case(
        "1x1_ane_runtime_weight_bias",
        _normal("c1rb-x", 1, 16, 1, 12),
        _normal("c1rb-w", 8, 16, 1, 1),
        True,
        bias=_normal("c1rb-b", 8),
    ),
    _conv_case("3x3_valid", _normal("c3v-x", 1, 4, 6, 7), _normal("c3v-w", 6, 4, 3, 3, scale=0.3)),
    _conv_case(
        "3x3_same_bias",
        _normal("c3s-x", 1, 4, 6, 7),
        _normal("c3s-w", 6, 4, 3, 3, scale=0.3),
        pad_type="same",
        bias=_normal("c3s-b", 6),
    ),
    # stride 2 on even sizes: one padding element, after for same, before for same_lower
    _conv_case(
        "3x3_same_stride2",
        _normal("c3ss-x", 1, 4, 6, 8),
        _normal("c3ss-w", 6, 4, 3, 3, scale=0.3),
        pad_type="same",
        strides=[2, 2],
    ),
    _conv_case(
        "3x3_same_lower_stride2",
        _normal("c3sl-x", 1, 4, 6, 8),
        _normal("c3sl-w", 6, 4, 3, 3, scale=0.3),
        pad_type="same_lower",
        strides=[2, 2],
    ),
    _conv_case(
        "3x3_custom_strides",
        _normal("c3c-x", 1, 4, 6, 7),
        _normal("c3c-w", 5, 4, 3, 3, scale=0.3),
        pad_type="custom",
        pad=[1, 0, 2, 1],
        strides=[1, 2],
    ),
    # a pad given with pad_type valid is ignored
    _conv_case(
        "3x3_valid_ignores_pad",
        _normal("c3vp-x", 1, 4, 5, 5),
        _normal("c3vp-w", 3, 4, 3, 3, scale=0.3),
        pad_type="valid",
        pad=[1, 1, 1, 1],
    ),
    _conv_case(
        "3x3_groups2",
        _normal("c3g-x", 1, 4, 6, 6),
        _normal("c3g-w", 6, 2, 3, 3, scale=0.3),
        pad_type="same",
        groups=2,
        bias=_normal("c3g-b", 6),
    ),
    _conv_case(
        "3x3_depthwise",
        _normal("c3dw-x", 1, 4, 6, 6),
        _normal("c3dw-w", 4, 1, 3, 3, scale=0.3),
        pad_type="same",
        groups=4,
    ),
    _conv_case(
        "3x3_dilation2",
        _normal("c3d-x", 1, 3, 7, 8),
        _normal("c3d-w", 4, 3, 3, 3, scale=0.3),
        pad_type="custom",
        pad=[2, 2, 1, 1],
        dilations=[2, 2],
    ),
    _conv_case(
        "3x3_same_dilation_stride",
        _normal("c3dss-x", 1, 3, 7, 8),
        _normal("c3dss-w", 4, 3, 3, 3, scale=0.3),
        pad_type="same",
        dilations=[2, 1],
        strides=[2, 2],
    ),
    _conv_case(
        "3x3_runtime_weight_stride2",
        _normal("c3r-x", 1, 4, 6, 6),
        _normal("c3r-w", 6, 4, 3, 3, scale=0.3),
        True,
        pad_type="custom",
        pad=[1, 1, 1, 1],
        strides=[2, 2],
    ),
    _conv_case("1d_same", _normal("c1d-x", 1, 8, 12), _normal("c1d-w", 6, 8, 3, scale=0.3), pad_type="same"),
    # -- conv_transpose
    _convt_case(
        "2x2_stride2_bias",
        _normal("ct-x", 1, 4, 3, 4),
        _normal("ct-w", 4, 3, 2, 2, scale=0.5),
        strides=[2, 2],
        bias=_normal("ct-b", 3),
    ),
    _convt_case(
        "3x3_custom_output_padding",
        _normal("ctc-x", 1, 4, 3, 3),
        _normal("ctc-w", 4, 2, 3, 3, scale=0.5),
        pad_type="custom",
        pad=[1, 1, 0, 1],
        strides=[2, 2],
        output_padding=[1, 1],
    ),
    _convt_case(
        "3x3_same_stride2",
        _normal("cts-x", 1, 2, 3, 4),
        _normal("cts-w", 2, 3, 3, 3, scale=0.5),
        pad_type="same",
        strides=[2, 2],
    ),
    _convt_case(
        "3x3_same_lower_stride2",
        _normal("ctsl-x", 1, 2, 3, 4),
        _normal("ctsl-w", 2, 3, 3, 3, scale=0.5),
        pad_type="same_lower",
        strides=[2, 2],
    ),
    _convt_case(
        "groups2_dilation",
        _normal("ctg-x", 1, 4, 3, 3),
        _normal("ctg-w", 4, 2, 2, 3, scale=0.5),
        groups=2,
        dilations=[2, 1],
        strides=[1, 2],
    ),
    _convt_case(
        "output_shape_custom",
        _normal("cto-x", 1, 2, 3, 3),
        _normal("cto-w", 2, 2, 3, 3, scale=0.5),
        pad_type="custom",
        pad=[1, 1, 1, 1],
        strides=[2, 2],
        output_shape=[1, 2, 6, 6],
    ),
    _convt_case(
        "1d_upsample_runtime_weight",
        _normal("ct1-x", 1, 8, 6),
        _normal("ct1-w", 8, 4, 4, scale=0.5),
        True,
        pad_type="custom",
        pad=[1, 1],
        strides=[2],
    ),
]


# -- pool.py --------------------------------------------------------------------------------------


def _pool(kind: str):
    def expected(
        x,
        kernel_sizes,
        pad_type,
        strides=None,
        pad=None,
        ceil_mode=False,
        exclude_padding_from_average=False,
        **_,
    ):
        ks = list(kernel_sizes)
        st = [1] * len(ks) if strides is None else list(strides)
        return loop_pool(x, kind, ks, st, pad_type, pad, ceil_mode, exclude_padding_from_average)

    return expected


def _pool_case(op, label, x, tol=ROUND, **params):
    kind = {"max_pool": "max", "avg_pool": "avg", "l2_pool": "l2"}[op]
    return SimCase(op, {"x": x}, _pool(kind), params=params, label=label, **tol)


# ceil_mode geometry: 6 + 1 + 1 with a 3-window at stride 2 gives 4 windows (3 without ceil_mode)
_CEIL = {
    "kernel_sizes": [3, 3],
    "strides": [2, 2],
    "pad_type": "custom",
    "pad": [1, 1, 1, 1],
    "ceil_mode": True,
}

POOL_CASES = [
    _pool_case(
        "max_pool",
        "ane_1x2_valid",
        _normal("mp-ane", 1, 8, 1, 16),
        EXACT,
        kernel_sizes=[1, 2],
        strides=[1, 2],
        pad_type="valid",
    ),
    _pool_case(
        "max_pool",
        "2x2_valid",
        _normal("mp-2", 1, 4, 6, 8),
        EXACT,
        kernel_sizes=[2, 2],
        strides=[2, 2],
        pad_type="valid",
    ),
    # all-negative inputs: the padding (-inf) must never win
    _pool_case(
        "max_pool",
        "3x3_same_negative",
        -1.0 - np.abs(_normal("mp-s", 1, 3, 7, 8)),
        EXACT,
        kernel_sizes=[3, 3],
        strides=[2, 2],
        pad_type="same",
    ),
    _pool_case("max_pool", "3x3_custom_ceil", -1.0 - np.abs(_normal("mp-c", 1, 3, 6, 6)), EXACT, **_CEIL),
    _pool_case(
        "max_pool",
        "1d_same_lower",
        _normal("mp-1d", 1, 4, 9),
        EXACT,
        kernel_sizes=[4],
        strides=[2],
        pad_type="same_lower",
    ),
    _pool_case(
        "avg_pool",
        "ane_1x4_valid",
        _normal("ap-ane", 1, 8, 1, 16),
        kernel_sizes=[1, 4],
        strides=[1, 4],
        pad_type="valid",
    ),
    _pool_case(
        "avg_pool",
        "3x3_custom_count_pad",
        _normal("ap-inc", 1, 3, 6, 7),
        kernel_sizes=[3, 3],
        strides=[1, 1],
        pad_type="custom",
        pad=[1, 1, 1, 1],
    ),
    _pool_case(
        "avg_pool",
        "3x3_custom_exclude_pad",
        _normal("ap-exc", 1, 3, 6, 7),
        kernel_sizes=[3, 3],
        strides=[1, 1],
        pad_type="custom",
        pad=[1, 1, 1, 1],
        exclude_padding_from_average=True,
    ),
    _pool_case("avg_pool", "3x3_custom_ceil", _normal("ap-ceil", 1, 3, 6, 6), **_CEIL),
    _pool_case(
        "avg_pool",
        "3x3_custom_ceil_exclude",
        _normal("ap-ceil-ex", 1, 3, 6, 6),
        **_CEIL,
        exclude_padding_from_average=True,
    ),
    _pool_case(
        "avg_pool",
        "2x2_same_lower_stride2",
        _normal("ap-sl", 1, 3, 5, 7),
        kernel_sizes=[2, 2],
        strides=[2, 2],
        pad_type="same_lower",
    ),
    _pool_case(
        "l2_pool",
        "2x2_valid",
        _normal("l2p-2", 1, 4, 6, 8),
        kernel_sizes=[2, 2],
        strides=[2, 2],
        pad_type="valid",
    ),
    _pool_case("l2_pool", "3x3_custom_ceil", _normal("l2p-c", 1, 3, 6, 6), **_CEIL),
    _pool_case(
        "l2_pool", "1d_same", _normal("l2p-1d", 1, 4, 9), kernel_sizes=[3], strides=[2], pad_type="same"
    ),
]


# -- normalization.py -----------------------------------------------------------------------------

_EPS = _f16(1e-5)  # an fp16 const: the float64 expectation uses the value the program holds
_EPS3 = _f16(1e-3)


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _batch_norm(x, mean, variance, gamma=None, beta=None, epsilon=1e-5, **_):
    cs = _channel_shape(x)
    y = (x - mean.reshape(cs)) / np.sqrt(variance.reshape(cs) + epsilon)
    if gamma is not None:
        y = y * gamma.reshape(cs)
    return y if beta is None else y + beta.reshape(cs)


def _moments_norm(x, axes, epsilon):
    """(x - mean) / sqrt(biased var + epsilon) over axes, from math.fsum row statistics."""
    red = sorted(a % x.ndim for a in axes)
    kept = [i for i in range(x.ndim) if i not in red]
    rows = np.transpose(x, kept + red).reshape(-1, math.prod(x.shape[i] for i in red))
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        m = math.fsum(row) / row.size
        v = math.fsum((t - m) ** 2 for t in row) / row.size
        out[r] = (row - m) / math.sqrt(v + epsilon)
    out = out.reshape([x.shape[i] for i in kept + red])
    return np.transpose(out, np.argsort(kept + red))


def _instance_norm(x, gamma=None, beta=None, epsilon=1e-5, **_):
    y = _moments_norm(x, range(2, x.ndim), epsilon)
    cs = _channel_shape(x)
    if gamma is not None:
        y = y * gamma.reshape(cs)
    return y if beta is None else y + beta.reshape(cs)


def _layer_norm(x, axes=None, gamma=None, beta=None, epsilon=1e-5, **_):
    axes = list(range(x.ndim)) if axes is None else [a % x.ndim for a in axes]
    y = _moments_norm(x, axes, epsilon)
    shape = [n if i in axes else 1 for i, n in enumerate(x.shape)]
    if gamma is not None:
        y = y * gamma.reshape(shape)
    return y if beta is None else y + beta.reshape(shape)


def _l2_norm(x, epsilon=1e-6, **_):
    out = np.empty_like(x)
    for lead in np.ndindex(*x.shape[:-3]):
        block = x[lead]
        out[lead] = block / math.sqrt(math.fsum(float(t) ** 2 for t in block.ravel()) + epsilon)
    return out


def _lrn(x, size, alpha=1e-4, beta=0.75, k=1.0, **_):
    return loop_lrn(x, size, alpha, beta, k)


NORMALIZATION_CASES = [
    SimCase(
        "batch_norm",
        {"x": _normal("bn-x", 1, 8, 1, 16)},
        _batch_norm,
        params={
            "mean": _h(_normal("bn-m", 8, scale=0.5)),
            "variance": _h(_uniform("bn-v", 0.5, 2.0, 8)),
            "gamma": _h(_normal("bn-g", 8)),
            "beta": _h(_normal("bn-b", 8)),
            "epsilon": _EPS,
        },
        label="ane_affine",
        **ROUND,
    ),
    SimCase(
        "batch_norm",
        {"x": _normal("bn3-x", 1, 6, 10)},
        _batch_norm,
        params={"mean": _h(_normal("bn3-m", 6, scale=0.5)), "variance": _h(_uniform("bn3-v", 0.5, 2.0, 6))},
        label="rank3_default_eps",
        **ROUND,
    ),
    SimCase(
        "instance_norm",
        {"x": _normal("in-x", 1, 4, 4, 6, scale=2.0) + 1.0},
        _instance_norm,
        params={"gamma": _h(_normal("in-g", 4)), "beta": _h(_normal("in-b", 4)), "epsilon": _EPS},
        label="affine",
        **ROUND,
    ),
    SimCase("instance_norm", {"x": _normal("in3-x", 2, 3, 10)}, _instance_norm, label="rank3_plain", **ROUND),
    SimCase(
        "layer_norm",
        {"x": _normal("ln-c", 1, 8, 1, 16, scale=2.0) + 0.5},
        _layer_norm,
        params={
            "axes": [1],
            "gamma": _h(_normal("ln-c-g", 8)),
            "beta": _h(_normal("ln-c-b", 8)),
            "epsilon": _EPS,
        },
        label="ane_channels_affine",
        **ROUND,
    ),
    SimCase(
        "layer_norm",
        {"x": _normal("ln-l", 2, 6, 16)},
        _layer_norm,
        params={
            "axes": [-1],
            "gamma": _h(_normal("ln-l-g", 16)),
            "beta": _h(_normal("ln-l-b", 16)),
            "epsilon": _EPS3,
        },
        label="last_axis_affine",
        **ROUND,
    ),
    SimCase("layer_norm", {"x": _normal("ln-all", 3, 4, 5)}, _layer_norm, label="all_axes_plain", **ROUND),
    SimCase(
        "l2_norm",
        {"x": _normal("l2n", 1, 8, 1, 16)},
        _l2_norm,
        params={"epsilon": _EPS},
        label="ane",
        **ROUND,
    ),
    SimCase("l2_norm", {"x": _normal("l2n4", 2, 3, 4, 5)}, _l2_norm, label="batched_default_eps", **ROUND),
    SimCase(
        "local_response_norm",
        {"x": _normal("lrn5", 1, 8, 3, 4)},
        _lrn,
        params={"size": 5, "alpha": 0.5, "beta": 0.75, "k": 2.0},
        label="size5",
        **ROUND,
    ),
    SimCase(
        "local_response_norm",
        {"x": _normal("lrn2", 1, 6, 2, 5)},
        _lrn,
        params={"size": 2, "alpha": 1.0, "beta": 0.5, "k": 1.0},
        label="size2_even_window",
        **ROUND,
    ),
    SimCase(
        "local_response_norm",
        {"x": _normal("lrnd", 1, 6, 2, 5, scale=10.0)},
        _lrn,
        params={"size": 3},
        label="defaults",
        **ROUND,
    ),
]


# -- attention.py ---------------------------------------------------------------------------------


def _sdpa(query, key, value, attn_mask=None, **_):
    return loop_sdpa(query, key, value, attn_mask)


_causal = np.tril(np.ones((8, 8), dtype=bool))
# an additive mask as a model feeds it: a per-position bias plus -1e4 on the future positions
_additive = np.where(_causal, _normal("sdpa-bias", 8, 8, scale=0.5), -1e4)[None, None]

ATTENTION_CASES = [
    SimCase(
        "scaled_dot_product_attention",
        {
            "query": _normal("sdpa-q", 1, 2, 8, 16),
            "key": _normal("sdpa-k", 1, 2, 10, 16),
            "value": _normal("sdpa-v", 1, 2, 10, 12),
        },
        _sdpa,
        label="no_mask",
        **ROUND,
    ),
    SimCase(
        "scaled_dot_product_attention",
        {
            "query": _normal("sdpa-cq", 1, 2, 8, 16),
            "key": _normal("sdpa-ck", 1, 2, 8, 16),
            "value": _normal("sdpa-cv", 1, 2, 8, 12),
        },
        _sdpa,
        params={"attn_mask": _causal},
        label="causal_bool_const",
        **ROUND,
    ),
    SimCase(
        "scaled_dot_product_attention",
        {
            "query": _normal("sdpa-aq", 1, 2, 8, 16),
            "key": _normal("sdpa-ak", 1, 2, 8, 16),
            "value": _normal("sdpa-av", 1, 2, 8, 12),
            "attn_mask": _additive,
        },
        _sdpa,
        label="additive_float_runtime",
        **ROUND,
    ),
    SimCase(
        "scaled_dot_product_attention",
        {
            "query": _normal("sdpa-pq", 2, 4, 8),
            "key": _normal("sdpa-pk", 2, 6, 8),
            "value": _normal("sdpa-pv", 2, 6, 5),
            # a key-padding mask fed at runtime, broadcast over batch and queries
            "attn_mask": np.array([True, True, True, True, False, False]),
        },
        _sdpa,
        label="rank3_runtime_bool_padding",
        **ROUND,
    ),
]


CASES = REDUCTION_CASES + LINEAR_CASES + POOL_CASES + NORMALIZATION_CASES + ATTENTION_CASES
