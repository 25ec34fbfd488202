"""Test vectors from the public hardware record, run as MIL programs on each chip's numeric profile.

Each case names its chip(s), its source and section. Expected values are the published outputs (or,
where a source gives only a bound, the bound); the ideal machine ("ieee") is run beside where it shows the
probe tells the two apart. Sources:

- GUIDE: sbryngelson/ane-guide part-1-machine/03-numerics.md (M1/H13 measured unless noted).
- CLIFFS: sbryngelson/ANEForge bench/numeric_cliffs.py, results per machine in bench/results/rooflines/
  (matmul_saturation, slice_saturation, reduce_exactness).
- ANEForge issue #113 (softplus), #115 (matmul saturation), pull request #116 (round), #263 (sqrt).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.numerics_probe import fp16, probe, row

INF = np.inf
pytestmark = pytest.mark.usefixtures("fp16_path")  # every probe with the compiled loops and without
ALL = ("m1", "m2", "m3", "m4", "m5", "any")


def ones_col(k: int) -> np.ndarray:
    return np.ones((k, 1), np.float32)


def matmul_ones(f, x):
    """x [1, K] @ ones [K, 1]: a reduction through the MAC (the guide's reduce_via_matmul)."""
    return f.matmul(x=x, y=fp16(ones_col(x.type.shape[1])))


# -- GUIDE 'Saturation hazard' / CLIFFS matmul_saturation: the MAC output port at 2^15 ---------------


@pytest.mark.parametrize("chip", ("m1", "m2", "m4", "m5", "any"))
@pytest.mark.parametrize("k", (4, 8, 32, 64, 128))
def test_matmul_ceiling_is_k_invariant(chip, k):
    """CLIFFS matmul_saturation: x = full(K, total/K) @ ones[K, 16]; 32752 stays finite, 32768 is inf
    (bisected cliff 32758.8 on M1, M2 Max, M4 Pro/Max, M5, M5 Pro, M6)."""
    body = lambda f, x: f.matmul(x=x, y=fp16(np.ones((k, 16))))  # noqa: E731
    ok = probe(body, chip, x=np.full((1, k), 32752 / k, np.float32))
    assert np.all(ok == 32752)
    over = probe(body, chip, x=np.full((1, k), 32768 / k, np.float32))
    assert np.all(over == INF)
    assert np.all(probe(body, chip, numerics="ieee", x=np.full((1, k), 32768 / k, np.float32)) == 32768)


@pytest.mark.parametrize(
    "k, fill, expected",
    [(32, 1000, 32000), (33, 1000, INF), (4, 8100, 32400), (8, 4050, 32400), (64, 506.25, 32400),
     (4, 8320, INF), (8, 4200, INF), (64, 550, INF)],
)  # fmt: skip
def test_matmul_ceiling_issue_115(k, fill, expected):
    """ANEForge issue #115 (M5): all-1000 inputs with ones weights, K=32 exact, K=33 inf; K=4/8/64: 32400
    exact, 33280/33600/35200 inf."""
    body = lambda f, x: f.matmul(x=x, y=fp16(np.ones((k, 16))))  # noqa: E731
    out = probe(body, "m5", x=np.full((1, k), fill, np.float32))
    assert np.all(out == expected)


@pytest.mark.parametrize("chip", ALL)
def test_linear_ceiling_k1_k2(chip):
    """GUIDE 'Saturation hazard': 32752 passes a linear, 32768 returns inf, for K = 1 and K = 2."""
    lin = lambda f, x: f.linear(x=x, weight=fp16(np.ones((1, x.type.shape[1]))))  # noqa: E731
    assert probe(lin, chip, x=row(32752)).item() == 32752
    assert probe(lin, chip, x=row(32768)).item() == INF
    assert probe(lin, chip, x=row(16376, 16376)).item() == 32752
    assert probe(lin, chip, x=row(16384, 16384)).item() == INF
    assert probe(lin, chip, x=row(-16384, -16384)).item() == -INF  # predicted by symmetry


@pytest.mark.parametrize("chip", ALL)
def test_conv_ceiling_two_channels_but_not_one(chip):
    """GUIDE: the ceiling holds for a two-channel conv; a 1x1 conv with a single input channel passes a
    fill of 60000."""
    two = lambda f, x: f.conv1x1(x, fp16(np.ones((1, 2, 1, 1))))  # noqa: E731
    assert probe(two, chip, x=np.full((1, 2, 1, 16), 16384, np.float32)).max() == INF
    assert probe(two, chip, x=np.full((1, 2, 1, 16), 16376, np.float32)).max() == 32752
    one = lambda f, x: f.conv1x1(x, fp16(np.ones((1, 1, 1, 1))))  # noqa: E731
    assert np.all(probe(one, chip, x=np.full((1, 1, 1, 16), 60000, np.float32)) == 60000)


@pytest.mark.parametrize("chip", ALL)
def test_interior_partial_overflows_though_it_cancels(chip):
    """GUIDE: 'An interior partial that exceeds 2^15 overflows to infinity even when a later cancellation
    would have brought the final result back into range.'"""
    x = row(20000, 20000, 0, 0, -20000, -20000, 0, 0, 1, 1)  # 4-lane tiles 40000, -40000, 2: the sum is 2
    assert probe(matmul_ones, chip, x=x).item() == INF
    assert probe(matmul_ones, chip, numerics="ieee", x=x).item() == 2
    # within one tile the lanes are summed at once: 20000 + 20000 - 20000 - 20000 does not overflow
    assert probe(matmul_ones, chip, x=row(20000, 20000, -20000, -20000, 1, 1)).item() == 2
    # the same on the wide path (more products than the exact model takes): 40000 then back to 2
    big = np.tile(np.array([[20000, 20000, 0, 0, -20000, -20000, 0, 0]], np.float32), (1, 2048))
    big[0, -2:] += 1
    out = probe(lambda f, x: f.matmul(x=x, y=fp16(np.ones((x.type.shape[1], 32)))), chip, x=big)
    assert np.all(out == INF)


@pytest.mark.parametrize("chip", ALL)
def test_reduce_sum_and_elementwise_keep_the_fp16_range(chip):
    """GUIDE: 'A reduce-sum rounds to 65504 first and then overflows, an elementwise multiply overflows at
    the true fp16 limit near 65536'; square input where the output first reaches infinity: 256."""
    rs = lambda f, x: f.reduce_sum(x=x, axes=[1], keep_dims=True)  # noqa: E731
    assert probe(rs, chip, x=row(30000, 30000)).item() == 60000
    assert probe(rs, chip, x=row(32752, 32752)).item() == 65504
    assert probe(rs, chip, x=row(40000, 40000)).item() == INF
    sq = lambda f, x: f.mul(x=x, y=x)  # noqa: E731
    assert probe(sq, chip, x=row(255.875)).item() == 65472
    assert probe(sq, chip, x=row(256)).item() == INF
    exp = lambda f, x: f.exp(x=x)  # noqa: E731
    assert probe(exp, chip, x=row(11.0859375)).item() < INF  # the fp16 below 11.094
    assert probe(exp, chip, x=row(11.09375)).item() == INF  # GUIDE constants: 11.094


# -- GUIDE 'Wide accumulator': the 4-lane first stage ------------------------------------------------


def test_first_stage_5116():
    """GUIDE: [4096] + [1] x 1024 through a matmul against ones returns 5116 (M1), not 5120 nor 4096."""
    x = np.ones((1, 1025), np.float32)
    x[0, 0] = 4096
    assert probe(matmul_ones, "m1", x=x).item() == 5116
    assert probe(matmul_ones, "any", x=x).item() == 5116
    assert probe(matmul_ones, "m1", numerics="ieee", x=x).item() == 5120


@pytest.mark.parametrize("big", (1024, 3000, 4000, 4090))
@pytest.mark.parametrize("order", ("one-last", "one-first"))
def test_first_stage_cancellation_keeps_sixteen_ones(big, order):
    """GUIDE listing c3-accum-probe: [4000, -4000, 1] x 16 -> 16 (an fp16 running sum gives 0), and the
    survivor sweep's 16 up to 4090, the same whether the one precedes or follows the pair."""
    triple = [big, -big, 1.0] if order == "one-last" else [1.0, big, -big]
    assert probe(matmul_ones, "m1", x=row(*(triple * 16))).item() == 16


def test_sixteen_thousand_ones_exact():
    """GUIDE: 'A reduction of sixteen thousand ones is bit exact' (exact model: 16000 products)."""
    assert probe(matmul_ones, "m1", x=np.ones((1, 16000), np.float32)).item() == 16000


# -- the 2049 case: CLIFFS reduce_exactness vs the guide ----------------------------------------------


@pytest.mark.parametrize("chip", ALL)
def test_reduce_sum_2049_reads_2050(chip):
    """CLIFFS reduce_exactness: reshape -> reduce_sum of [257, 256 x 7] (target 2049) reads 2050 on M1,
    M2 Max, M4 Pro/Max, M5, M5 Pro, M6; every total up to 2048 is exact."""
    rs = lambda f, x: f.reduce_sum(x=x, axes=[1], keep_dims=True)  # noqa: E731
    assert probe(rs, chip, x=row(257, *[256] * 7)).item() == 2050
    assert probe(rs, chip, x=row(*[256] * 8)).item() == 2048
    for total in range(2040, 2049):
        r = row(*(total // 8 + (i < total % 8) for i in range(8)))
        assert probe(rs, chip, x=r).item() == total
    assert probe(rs, chip, numerics="ieee", x=row(257, *[256] * 7)).item() == 2048


def test_mac_2049_even_on_m1_away_on_m5():
    """GUIDE 'Edge behavior': a partial of 2049 at spacing 2 rounds to 2048 on M1; the M5 returns 2050."""
    assert probe(matmul_ones, "m1", x=row(2048, 1)).item() == 2048
    assert probe(matmul_ones, "m5", x=row(2048, 1)).item() == 2050


# -- GUIDE 'Edge behavior a correctness oracle must model' ------------------------------------------


NAN_PROBES = [
    ("add 0", lambda f, x: f.add(x=x, y=0.0), INF),
    ("relu", lambda f, x: f.relu(x=x), INF),
    ("exp", lambda f, x: f.exp(x=x), INF),
    ("maximum 0", lambda f, x: f.maximum(x=x, y=0.0), INF),
    ("sigmoid", lambda f, x: f.sigmoid(x=x), 1.0),
    ("tanh", lambda f, x: f.tanh(x=x), 1.0),
    ("erf", lambda f, x: f.erf(x=x), 1.0),
]


@pytest.mark.parametrize("chip", ALL)
@pytest.mark.parametrize("name, body, expected", NAN_PROBES, ids=[p[0] for p in NAN_PROBES])
def test_nan_is_coerced_to_plus_inf(chip, name, body, expected):
    """GUIDE: NaN + 0, relu(NaN), exp(NaN), maximum(NaN, 0) give +inf; sigmoid, tanh, erf of NaN give 1."""
    assert probe(body, chip, x=row(np.nan)).item() == expected
    assert np.isnan(probe(body, chip, numerics="ieee", x=row(np.nan)).item()) or name in ("maximum 0",)


@pytest.mark.parametrize("chip", ALL)
def test_softmax_row_with_nan_puts_the_mass_there(chip):
    """GUIDE: 'a softmax of a lane holding a NaN puts all the mass on that lane'; softmax([1000, 1, 2, 3])
    = [1, 0, 0, 0]; four equal values give four quarters."""
    sm = lambda f, x: f.softmax(x=x, axis=-1)  # noqa: E731
    assert probe(sm, chip, x=row(1, np.nan, 2, 3)).tolist() == [[0, 1, 0, 0]]
    assert probe(sm, chip, x=row(1000, 1, 2, 3)).tolist() == [[1, 0, 0, 0]]
    assert probe(sm, chip, x=row(5, 5, 5, 5)).tolist() == [[0.25] * 4]


INDETERMINATE = [
    ("inf - inf", lambda f, x, y: f.sub(x=x, y=y), (INF, INF)),
    ("0 * inf", lambda f, x, y: f.mul(x=x, y=y), (0.0, INF)),
    ("sqrt(-1)", lambda f, x, y: f.sqrt(x=f.add(x=x, y=y)), (-1.0, 0.0)),
    ("rsqrt(-1)", lambda f, x, y: f.rsqrt(x=f.add(x=x, y=y)), (-1.0, 0.0)),
    ("log(-1)", lambda f, x, y: f.log(x=f.add(x=x, y=y)), (-1.0, 0.0)),
]


@pytest.mark.parametrize("chip", ALL)
@pytest.mark.parametrize("name, body, xy", INDETERMINATE, ids=[p[0] for p in INDETERMINATE])
def test_indeterminate_forms_give_plus_zero(chip, name, body, xy):
    """GUIDE: inf - inf, 0 * inf, sqrt(-1), rsqrt(-1), log(-1) return +0 (the engine never emits NaN)."""
    out = probe(body, chip, x=row(xy[0]), y=row(xy[1])).item()
    assert out == 0 and not math.copysign(1, out) < 0
    assert np.isnan(probe(body, chip, numerics="ieee", x=row(xy[0]), y=row(xy[1])).item())


@pytest.mark.parametrize("chip", ALL)
def test_subnormals_echo_elementwise(chip):
    """GUIDE: 'A fp16 denormal down to 2^-24 echoes bit-exactly through x + 0 and x * 1'."""
    tiny = 2.0**-24
    assert probe(lambda f, x: f.add(x=x, y=0.0), chip, x=row(tiny)).item() == tiny
    assert probe(lambda f, x: f.mul(x=x, y=1.0), chip, x=row(tiny)).item() == tiny
    assert probe(lambda f, x: f.mul(x=x, y=4.0), chip, x=row(tiny)).item() == 4 * tiny


def test_subnormals_flushed_in_the_mac_on_m1_kept_on_m5():
    """GUIDE: a pair of denormals summed inside a matmul, with a representable denormal total, returns +0
    on M1; 'The M5 accumulator instead preserves denormals'."""
    x = row(2.0**-24, 2.0**-24)
    assert probe(matmul_ones, "m1", x=x).item() == 0
    assert probe(matmul_ones, "any", x=x).item() == 0
    assert probe(matmul_ones, "m5", x=x).item() == 2.0**-23
    assert probe(matmul_ones, "m1", numerics="ieee", x=x).item() == 2.0**-23


@pytest.mark.parametrize("chip", ALL)
def test_zero_sign_dropped_before_reciprocals(chip):
    """GUIDE: the reciprocal and rsqrt of -0 return +inf; sqrt(-0) is +0."""
    neg0 = row(-0.0)
    assert probe(lambda f, x: f.inverse(x=x, epsilon=0.0), chip, x=neg0).item() == INF
    assert probe(lambda f, x: f.rsqrt(x=x, epsilon=0.0), chip, x=neg0).item() == INF
    s = probe(lambda f, x: f.sqrt(x=x), chip, x=neg0).item()
    assert s == 0 and math.copysign(1, s) > 0


@pytest.mark.parametrize("chip", ALL)
def test_table_collapses(chip):
    """GUIDE: softplus and softsign of +inf return +0; log(+0) returns -45440."""
    assert probe(lambda f, x: f.softplus(x=x), chip, x=row(INF)).item() == 0
    assert probe(lambda f, x: f.softsign(x=x), chip, x=row(INF)).item() == 0
    assert probe(lambda f, x: f.log(x=x), chip, x=row(0.0)).item() == -45440


@pytest.mark.parametrize("chip", ALL)
def test_softplus_collapses_at_the_mac_ceiling(chip):
    """ANEForge issue #113 (M5): softplus [5, 10, 11, 12, 88, 1000] -> [5.008, 10, 0, 0, 0, 0]."""
    out = probe(lambda f, x: f.softplus(x=x), chip, x=row(5, 10, 11, 12, 88, 1000))
    assert out.tolist() == [[5.0078125, 10.0, 0, 0, 0, 0]]


@pytest.mark.parametrize("chip", ALL)
def test_origin_biases(chip):
    """GUIDE: gelu(0) = -0.000543 and swish(0) = -0.001259 (fp16 values of those)."""
    assert probe(lambda f, x: f.gelu(x=x), chip, x=row(0.0)).item() == np.float16(-0.000543)
    assert probe(lambda f, x: f.silu(x=x), chip, x=row(0.0)).item() == np.float16(-0.001259)
    assert probe(lambda f, x: f.gelu(x=x), chip, numerics="ieee", x=row(0.0)).item() == 0


@pytest.mark.parametrize("chip", ALL)
def test_sigmoid_clamped_to_its_domain(chip):
    """GUIDE constants: sigmoid table domain [-9.938, +8.320]; past it, the end knots."""
    lo = probe(lambda f, x: f.sigmoid(x=x), chip, x=row(-9.938, -20, -1000))
    assert np.all(lo == np.float16(1 / (1 + math.exp(-float(np.float16(-9.938))))))
    assert probe(lambda f, x: f.sigmoid(x=x), chip, numerics="ieee", x=row(-20)).item() < lo[0, 0]


@pytest.mark.parametrize("name, fn, bound", [("sigmoid", "sigmoid", 0.0034), ("tanh", "tanh", 0.0017),
                                             ("gelu", "gelu", 0.0059)])  # fmt: skip
def test_tables_within_the_measured_error(name, fn, bound):
    """GUIDE 'Activation functions': worst absolute error on device sigmoid 0.0034, tanh 0.0017, gelu
    0.0059: the profile's tables stay within those of the exact function, over a dense sweep."""
    x = np.linspace(-12, 12, 4096, dtype=np.float32).astype(np.float16).astype(np.float64)
    out = probe(lambda f, v: getattr(f, fn)(x=v), "m1", v=x.reshape(1, -1).astype(np.float32)).ravel()
    exact = {"sigmoid": 1 / (1 + np.exp(-x)), "tanh": np.tanh(x),
             "gelu": 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))}[name]  # fmt: skip
    assert np.max(np.abs(out - exact)) <= bound


# -- CLIFFS slice_saturation: the width-offset x16 crop gain --------------------------------------------


def crop_left_1(f, x):
    """af.crop(x, 0, 0, 1, 0): a slice with begin 1 on the width axis."""
    return f.slice_by_size(x=x, begin=[0, 0, 0, 1], size=[1, 1, 1, 7])


def fill(v: float) -> np.ndarray:
    x = np.zeros((1, 1, 1, 8), np.float32)
    x[0, 0, 0, 4] = v
    return x


@pytest.mark.parametrize("chip", ("m1", "m2", "m3", "any"))
def test_width_offset_slice_saturates_on_m1_m2(chip):
    """CLIFFS slice_saturation (M1, M2 Max; M2 Pro PR #145): 4094 finite, 4096 inf; M2 4100 inf. m3 has no
    data and takes the clamp."""
    assert probe(crop_left_1, chip, x=fill(4094))[0, 0, 0, 3] == 4094
    assert probe(crop_left_1, chip, x=fill(4096))[0, 0, 0, 3] == INF
    assert probe(crop_left_1, chip, x=fill(-4100))[0, 0, 0, 3] == -INF
    zero_begin = lambda f, x: f.slice_by_size(x=x, begin=[0, 0, 0, 0], size=[1, 1, 1, 7])  # noqa: E731
    assert probe(zero_begin, chip, x=fill(60000))[0, 0, 0, 4] == 60000  # the control: zero offset


@pytest.mark.parametrize("chip", ("m1", "m2", "any"))
@pytest.mark.parametrize("axis", (0, 1, 2))
def test_offset_slice_on_other_axes_keeps_the_range(chip, axis):
    """GUIDE 'Saturation hazard': 'a nonzero begin offset on the height, channel, or batch axis stays
    finite at the same fill values' (60000 passes; only the width axis has the x16 gain)."""
    x = np.full((2, 2, 2, 8), 60000, np.float32)
    begin, size = [0, 0, 0, 0], [2, 2, 2, 8]
    begin[axis], size[axis] = 1, 1
    out = probe(lambda f, v: f.slice_by_size(x=v, begin=begin, size=size), chip, x=x)
    assert np.all(out == 60000)


@pytest.mark.parametrize("chip", ALL)
def test_negative_zero_echoes_as_plus_zero(chip):
    """GUIDE 'Edge behavior': 'A negative zero echoes as positive zero through x + 0'."""
    out = probe(lambda f, x: f.add(x=x, y=0.0), chip, x=row(-0.0)).item()
    assert out == 0 and math.copysign(1, out) > 0


@pytest.mark.parametrize("chip", ("m4", "m5"))
def test_width_offset_slice_exact_on_m4_m5(chip):
    """CLIFFS slice_saturation (M4 Pro, M4 Max, M5, M5 Pro): still finite at 60000."""
    assert probe(crop_left_1, chip, x=fill(60000))[0, 0, 0, 3] == 60000


# -- round, sqrt of subnormals ------------------------------------------------------------------------


@pytest.mark.parametrize("chip", ALL)
def test_round_half_away_and_large_values(chip):
    """ANEForge pull request #116 (M5): 'ANE round is half-away-from-zero'; round(1024)=1025,
    round(1025)=1026, round(-2047)=-2048."""
    out = probe(lambda f, x: f.round(x=x), chip, x=row(0.5, 1.5, 2.5, -2.5, 1024, 1025, -2047, 3.4))
    assert out.tolist() == [[1, 2, 3, -3, 1025, 1026, -2048, 3]]


@pytest.mark.parametrize("chip", ALL)
def test_sqrt_of_subnormals(chip):
    """ANEForge pull request #263: sqrt(0 + eps) for eps 1e-9, 1e-7, 1e-6, 6e-5, 1e-4 (as fp16) gives 0, 0,
    0, 7.8125e-3, 1.0e-2 (the device's 1.0338e-2 for 1e-4 is the table's error: within 4 %)."""
    out = probe(lambda f, x: f.sqrt(x=x), chip, x=row(1e-9, 1.192e-7, 1.013e-6, 6.002e-5, 1e-4)).ravel()
    assert out[:4].tolist() == [0, 0, 0, 0.0078125]
    assert abs(out[4] - 1.0338e-2) / 1.0338e-2 < 0.04


# -- GUIDE 'fp16 datapath': int8 weights reconstructed to fp16 before the multiply ------------------------


@pytest.mark.parametrize("chip", ("m1", "m5", "any"))
def test_int8_weight_reconstructed_to_fp16(chip):
    """GUIDE: 'it dequantizes an int8 ... weight to fp16 on the way in': w = fp16(s * (q - z)), read back
    exactly through a 1x1 conv whose input is the identity (one product per output, no accumulation)."""
    from anekit import mil
    from anekit.mil import tensor
    from anekit.runtime.sim import SimBackend

    rng = np.random.default_rng(5)
    c = 16
    q = rng.integers(-127, 128, (c, c, 1, 1)).astype(np.int8)
    scale = (rng.uniform(0.001, 0.05, c)).astype(np.float16)
    zero = rng.integers(-3, 4, c).astype(np.int8)

    @mil.program(inputs={"x": tensor("fp16", [1, c, 1, c])})
    def prog(f, x):
        w = f.constexpr_affine_dequantize(quantized_data=q, zero_point=zero, scale=scale, axis=0)
        return f.conv1x1(x, w)

    with SimBackend(chip=chip, strict=False).compile(prog) as k:
        (out,) = k(x=np.eye(c, dtype=np.float32).reshape(1, c, 1, c)).values()
    want = (scale.astype(np.float64)[:, None] * (q[:, :, 0, 0].astype(np.float64) - zero[:, None])).astype(
        np.float16
    )
    np.testing.assert_array_equal(out.reshape(c, c), want.astype(np.float32))
