"""Ordered products (runtime.sim.ordered): in a column-separable program at most 32 columns wide, every conv
sums each output over its input channels in ascending order, so a column's bits do not depend on how many
columns run, and a decode kernel narrows to the one column its caller reads.

The reference for the sums is a scalar loop written here: float32 scalars, one rounding per product and
per sum, from +0. Every test runs with the compiled loops and with the numpy paths alone (``fp16_path``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from anekit import mil
from anekit.mil import tensor
from anekit.mil.builder import FunctionBuilder
from anekit.mil.ir import Var
from anekit.runtime.sim import SimBackend, SimKernel
from anekit.runtime.sim.ordered import (
    ORDERED_CONV,
    ORDERED_WIDTH,
    OrderedConv,
    ordered_conv,
    ordered_matmul,
    ordered_program,
    transposed_layout,
)

pytestmark = pytest.mark.usefixtures("fp16_path")

SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3e-39, 65504.0, 3.4e38, -3.4e38, 1.0, -1.0], np.float32
)


def scalar_sums(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out[i, n] = (((+0 + w[i, 0] x[0, n]) + w[i, 1] x[1, n]) + ...) in float32 scalars."""
    m, k = w.shape
    out = np.empty((m, x.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        for i in range(m):
            for n in range(x.shape[1]):
                acc = np.float32(0.0)
                for j in range(k):
                    acc = np.float32(acc + np.float32(w[i, j] * x[j, n]))
                out[i, n] = acc
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, any NaN matching any NaN (a NaN's payload is the hardware's, not the sum's)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a)
    return a.shape == b.shape and bool((nan == np.isnan(b)).all()) and a[~nan].tobytes() == b[~nan].tobytes()


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 7, 3), (37, 19, 32), (1100, 9, 2), (3, 300, 5)])
def test_each_output_is_the_sum_in_ascending_order(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    w = (rng.standard_normal((m, k)) * 10.0 ** rng.integers(-6, 6, (m, k))).astype(np.float32)
    x = rng.standard_normal((k, n)).astype(np.float32)  # not fp16 values: products round in float32
    with np.errstate(all="ignore"):
        got = ordered_matmul(w, x)
    assert got.flags.c_contiguous and got.shape == (m, n)
    assert same_bits(got, scalar_sums(w, x))


def test_special_values_and_signed_zeros_sum_as_the_scalar_loop_does() -> None:
    """Every pair of special values (zeros of both signs, infinities, NaN, subnormals, the float32 extremes
    whose products overflow): a -0 product added to +0 gives +0, inf - inf gives NaN, overflow gives inf."""
    pairs = np.array([(a, b) for a in SPECIALS for b in SPECIALS], np.float32)  # (144, 2)
    w = pairs[:, :1].T.repeat(3, axis=0)  # (3, 144): each row the same
    x = np.stack([pairs[:, 1], -pairs[:, 1]], axis=1)  # (144, 2)
    with np.errstate(all="ignore"):
        assert same_bits(ordered_matmul(w, x), scalar_sums(w, x))
        for a, b in pairs:  # one product alone, then a sum of two
            w1 = np.array([[a, b]], np.float32)
            x1 = np.array([[b], [a]], np.float32)
            assert same_bits(ordered_matmul(w1, x1), scalar_sums(w1, x1)), (a, b)
    zero = ordered_matmul(np.array([[-1.0]], np.float32), np.array([[0.0]], np.float32))
    assert zero.tobytes() == np.float32(0.0).tobytes()  # +0, not -0: the sum starts from +0


def test_a_column_has_the_same_bits_whatever_the_number_of_columns() -> None:
    """Column j of an N-column product is the 1-column product of column j, for every N to 32: exhaustively
    over the widths, with the weights of the stories15M classifier's shape (32000 x 288)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32000, 288)).astype(np.float16).astype(np.float32)
    x = rng.standard_normal((288, ORDERED_WIDTH)).astype(np.float16).astype(np.float32)
    ones = [ordered_matmul(w, np.ascontiguousarray(x[:, j : j + 1])) for j in range(ORDERED_WIDTH)]
    for n in (2, 3, 16, 17, 31, 32):
        got = ordered_matmul(w, np.ascontiguousarray(x[:, :n]))
        for j in range(n):
            assert got[:, j].tobytes() == ones[j][:, 0].tobytes(), (n, j)


def test_the_weights_layout_changes_no_bit_and_is_stored_without_a_second_copy() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 40, 1, 1)).astype(np.float32)
    f = transposed_layout(w)
    assert np.array_equal(f, w) and f.shape == w.shape and not f.flags.c_contiguous
    assert f.reshape(48, 40).T.flags.c_contiguous  # the loop's (C_in, C_out) operand, a view
    assert transposed_layout(f) is f  # stored once: a plan reusing it leaves it as it is
    x = rng.standard_normal((1, 40, 1, 5)).astype(np.float32)
    args: tuple[Any, ...] = ((1, 1), (1, 1), [(0, 0), (0, 0)], [1, 5], 1)
    assert ordered_conv(x, f, *args).tobytes() == ordered_conv(x, w, *args).tobytes()
    assert same_bits(
        ordered_conv(x, w, *args).reshape(48, 5), scalar_sums(w.reshape(48, 40), x.reshape(40, 5))
    )


def test_a_conv_with_groups_and_a_3x1_kernel_sums_each_offset_in_order_then_adds_the_offsets() -> None:
    """The general conv: per kernel offset and group the ordered product, the offsets added in turn."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 1)).astype(np.float32)  # groups 2: 6 in, 4 out, a 3 x 1 kernel
    got = ordered_conv(x, w, (1, 1), (1, 1), [(1, 1), (0, 0)], [5, 4], 2)
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 0)])
    want = np.zeros((2, 4, 5, 4), np.float32)
    for b in range(2):
        for g in range(2):
            for o in range(2):
                for h in range(5):
                    for col in range(4):
                        total = np.float32(0.0)
                        for dh in range(3):
                            part = scalar_sums(
                                w[g * 2 + o : g * 2 + o + 1, :, dh, 0],
                                xp[b, g * 3 : g * 3 + 3, h + dh, col : col + 1],
                            )[0, 0]
                            total = part if dh == 0 else np.float32(total + part)
                        want[b, g * 2 + o, h, col] = total
    assert same_bits(got, want)


# -- which plans order their products ---------------------------------------------------------------


def _program(body: Callable[[FunctionBuilder, Var], Var], channels: int, width: int) -> Any:
    b = mil.Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, channels, 1, width]))
    f.output(body(f, x))
    return b.build()


def _norm_conv(seed: int = 0, c_in: int = 64, c_out: int = 512) -> Callable[[FunctionBuilder, Var], Var]:
    """RMSNorm over the channels, then a pointwise conv: the shape of a generation head."""
    rng = np.random.default_rng(seed)

    def body(f: FunctionBuilder, x: Var) -> Var:
        ms = f.reduce_mean(x=f.mul(x=x, y=x), axes=[1], keep_dims=True)
        r = f.rsqrt(x=f.add(x=ms, y=np.float16(1e-5)))
        h = f.mul(x=f.mul(x=x, y=r), y=rng.standard_normal((1, c_in, 1, 1)).astype(np.float16))
        weight = (rng.standard_normal((c_out, c_in, 1, 1)) / np.sqrt(c_in)).astype(np.float16)
        return f.conv1x1(x=h, weight=f.const(weight))

    return body


def _kernel(backend: SimBackend, prog: Any) -> SimKernel:
    kernel = backend.compile(prog).load()
    assert isinstance(kernel, SimKernel)
    return kernel


def _convs(kernel: SimKernel) -> list[Any]:
    return [s.opdef for s in kernel.plan.steps if s.op.op_type == "conv"]


def test_a_narrow_column_separable_program_orders_its_convs_and_a_wider_one_does_not() -> None:
    narrow = _kernel(SimBackend(chip="m4"), _program(_norm_conv(), 64, ORDERED_WIDTH))
    assert ordered_program(narrow.fn) and narrow.plan.ordered
    assert _convs(narrow) == [ORDERED_CONV]
    weight = next(v for v in narrow.plan.constants.values() if v.shape == (512, 64, 1, 1))
    assert weight.reshape(512, 64).T.flags.c_contiguous  # stored as the ordered loop reads it
    wide = _kernel(SimBackend(chip="m4"), _program(_norm_conv(), 64, 2 * ORDERED_WIDTH))
    assert not ordered_program(wide.fn) and not wide.plan.ordered
    assert not any(isinstance(op, OrderedConv) for op in _convs(wide))


def test_a_decode_shaped_program_sums_in_order_whether_or_not_it_mixes_its_columns() -> None:
    """The decision is the program's shapes alone (its outputs and an input end in one width of at most 32):
    an attention over its own chunk mixes columns and still sums in order (its causal copies need it:
    tests/test_sim_causal.py), and so does a dynamic kernel, whose activations are the first W columns of
    an input that holds its weights after them. A program whose outputs end in no input's width and that
    reads no input's first W columns keeps the BLAS product."""

    def mixed(f: FunctionBuilder, x: Var) -> Var:
        return _norm_conv()(f, f.softmax(x=x, axis=3))

    kernel = _kernel(SimBackend(chip="m4"), _program(mixed, 64, ORDERED_WIDTH))
    assert kernel.plan.ordered and _convs(kernel) == [ORDERED_CONV]

    def columns_after(f: FunctionBuilder, x: Var) -> Var:
        act = f.slice_by_size(x=x, begin=[0, 0, 0, 0], size=[1, 64, 1, ORDERED_WIDTH])
        return _norm_conv()(f, act)

    dynamic = _kernel(SimBackend(chip="m4"), _program(columns_after, 64, ORDERED_WIDTH + 64))
    assert ordered_program(dynamic.fn) and dynamic.plan.ordered

    def columns_later(f: FunctionBuilder, x: Var) -> Var:
        act = f.slice_by_size(x=x, begin=[0, 0, 0, 64], size=[1, 64, 1, ORDERED_WIDTH])
        return _norm_conv()(f, act)

    other = _kernel(SimBackend(chip="m4"), _program(columns_later, 64, ORDERED_WIDTH + 64))
    assert not ordered_program(other.fn) and not other.plan.ordered


def _tie_program() -> tuple[Any, np.ndarray, np.ndarray]:
    """A decode-shaped conv whose ordered sums land on fp16 ties (w0 x0 + w1 x1 with x1 = 2^-11 x0: halfway
    between two fp16 values for w1 = 1, and no tie for the others), its weight (512, 64) and input."""
    rng = np.random.default_rng(9)
    w = np.zeros((512, 64), np.float32)
    w[:, 0] = rng.choice([1.0, -1.0, 1.0009765625, -1.5, 3.0], 512)  # 1 + 2^-10 among them: an odd last bit
    w[:, 1] = rng.choice([1.0, 1.0, -1.0, 0.5], 512)
    x = np.zeros((1, 64, 1, ORDERED_WIDTH), np.float32)
    x[0, 0, 0] = rng.choice([1.0, 2.0, -4.0], ORDERED_WIDTH)
    x[0, 1, 0] = x[0, 0, 0] * 2.0**-11

    def body(f: FunctionBuilder, v: Var) -> Var:
        return f.conv1x1(x=v, weight=f.const(w.astype(np.float16).reshape(512, 64, 1, 1)))

    return _program(body, 64, ORDERED_WIDTH), w, x


def test_a_chip_whose_mac_rounds_ties_away_sums_in_order_and_rounds_each_sum_away() -> None:
    """M5 rounds a MAC's float32 sum to fp16 with ties away from zero: its decode-shaped programs sum in order
    as every chip's do, the store rounds each sum away (against ``mac.round16``, numpy's rounding of the
    exact sums, here exact in float32), M4's to even at the same ties, and a run narrowed to one column
    keeps those bits."""
    from anekit.runtime.sim.mac import round16

    prog, w, x = _tie_program()
    exact = (w.astype(np.float64) @ x[0, :, 0].astype(np.float64)).reshape(1, 512, 1, ORDERED_WIDTH)
    ties = round16(exact, "away") != round16(exact, "even")
    assert ties.sum() > 500  # a quarter of the rows hit a tie in every column
    m5, m4 = _kernel(SimBackend(chip="m5"), prog), _kernel(SimBackend(chip="m4"), prog)
    assert m5.plan.ordered and _convs(m5) == [ORDERED_CONV]
    (got,) = m5(x=x).values()
    (even,) = m4(x=x).values()
    assert same_bits(got, round16(exact, "away").astype(np.float32))
    assert same_bits(even, round16(exact, "even").astype(np.float32))
    m5.compute_columns(1)
    (narrow,) = m5(x=x).values()
    chosen = m5._narrowed()
    assert chosen is not None and chosen[0] == 1
    assert same_bits(narrow[..., :1], got[..., :1]) and np.isnan(narrow[..., 1:]).all()


@pytest.mark.parametrize("chip", ["any", "m1", "m4", "m5"])
def test_the_head_of_a_decode_step_narrows_to_the_one_column_read(chip: str) -> None:
    """A stories15M-shaped head (288 channels, 2048 of its 32000 rows): told that the caller reads column 0,
    the kernel runs that column alone (its norm's mean over the channels is summed channel after channel
    at every width: ``OrderedReduceMean``), and column 0 has the full run's bits."""
    prog = _program(_norm_conv(seed=3, c_in=288, c_out=2048), 288, ORDERED_WIDTH)
    lazy, full = (
        _kernel(SimBackend(chip=chip), prog),
        _kernel(SimBackend(chip=chip, lazy_columns=False), prog),
    )
    x = np.random.default_rng(4).standard_normal((1, 288, 1, ORDERED_WIDTH)).astype(np.float32)
    lazy.compute_columns(1)
    full.compute_columns(1)
    (got,) = lazy(x=x).values()
    (want,) = full(x=x).values()
    chosen = lazy._narrowed()
    assert chosen is not None and chosen[0] == 1
    assert got[..., :1].tobytes() == want[..., :1].tobytes()
