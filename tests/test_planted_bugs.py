"""Behaviours whose one-line breakage the rest of the suite let through, each stated against its source.

Every expected value here is written from the public record or worked out in the test in float64 with
explicit fp16 rounding, never read back from the code under test:

- the MAC's subnormal flush at the smallest normal 2^-14 (kept) and just under it (flushed on M1, kept on
  M5): sbryngelson/ane-guide part-1-machine/03-numerics.md, 'Edge behavior a correctness oracle must
  model' (the record ``mac.subnormal-flush``);
- which lanes make a first-stage tile in the interior-partial check: the guide's 'Saturation hazard' and
  'Wide accumulator' (tiles of 4 consecutive lanes: ``mac.first-stage``, ``mac.interior-partials``);
- sqrt / rsqrt of a subnormal at and around the midpoint 2^-15 (``table.subnormal-input``, ANEForge pull
  request #263);
- the 2^15 output-port ceiling of a conv accumulating two taps on the simulator's large-op (wide) path,
  where a MAC op has more products than the exact tile model takes (the guide's 'Saturation hazard';
  ANEForge bench/numeric_cliffs.py matmul_saturation);
- every simulator store of an fp16 intermediate is rounded to fp16, small arrays too.
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.mil import tensor
from tests.numerics_probe import fp16, probe, row

INF = np.inf
CEILING = 32768.0  # 2^15: the MAC output port (GUIDE 'Saturation hazard'; CLIFFS: 32752 finite, 32768 inf)
MIN_NORMAL = 2.0**-14  # fp16's smallest normal
STEP = 2.0**-24  # fp16's subnormal step
WIDE = 8192  # more products than this take the wide path (probe-sized ops run the exact tile model)
pytestmark = pytest.mark.usefixtures("fp16_path")  # with the compiled loops and with numpy alone


def matmul_ones(f, x):
    """x [M, K] @ ones [K, 1]: a reduction through the MAC (the guide's reduce_via_matmul)."""
    return f.matmul(x=x, y=fp16(np.ones((x.type.shape[1], 1))))


# -- 1. the MAC flush threshold: 2^-14 is normal and kept; one step under it is subnormal ----------------


def _flushes(backend) -> int:
    """How many values the sanitizer saw flushed (its subnormal-flush count over every op)."""
    recs = backend.sanitizer.records()
    return sum(r["hazards"].get("subnormal-flush", {}).get("count", 0) for r in recs)


@pytest.mark.parametrize("k", (2, 2 * WIDE))  # the exact tile model, and the wide path
def test_mac_keeps_the_smallest_normal_and_flushes_one_step_under_it_on_m1(k):
    """GUIDE 'Edge behavior': subnormal operands and results inside a MAC become +0 on M1, 'The M5
    accumulator instead preserves denormals'; 2^-14 is a normal and passes either way. Row 0 holds both
    (the flush of a subnormal must leave the normal beside it), row 1 -2^-14 alone, row 2 2^-14 alone."""
    x = np.zeros((3, k), np.float32)
    x[0, 0], x[0, k // 2] = MIN_NORMAL - STEP, MIN_NORMAL
    x[1, k - 1] = -MIN_NORMAL
    x[2, 1] = MIN_NORMAL
    kept = [2 * MIN_NORMAL - STEP, -MIN_NORMAL, MIN_NORMAL]
    assert probe(matmul_ones, "m1", x=x).ravel().tolist() == [MIN_NORMAL, -MIN_NORMAL, MIN_NORMAL]
    assert probe(matmul_ones, "any", x=x).ravel().tolist() == [MIN_NORMAL, -MIN_NORMAL, MIN_NORMAL]
    assert probe(matmul_ones, "m5", x=x).ravel().tolist() == kept
    assert probe(matmul_ones, "m1", numerics="ieee", x=x).ravel().tolist() == kept
    # the same operand made by an elementwise op that keeps subnormals (x * 1, GUIDE): a MAC's own input
    echoed = lambda f, x: matmul_ones(f, f.mul(x=x, y=1.0))  # noqa: E731
    assert probe(echoed, "m1", x=x).ravel().tolist() == [MIN_NORMAL, -MIN_NORMAL, MIN_NORMAL]
    assert probe(echoed, "m5", x=x).ravel().tolist() == kept
    # the sanitizer counts the one subnormal operand, never the normals
    _, backend = probe(matmul_ones, "m1", sanitize=True, x=x)
    assert _flushes(backend) == 1
    _, backend = probe(matmul_ones, "m1", sanitize=True, x=x[1:])
    assert _flushes(backend) == 0


@pytest.mark.parametrize("k", (2, 2 * WIDE))
def test_mac_result_flush_at_the_smallest_normal(k):
    """Normal operands whose sum lands on 2^-14 keep it; a sum one step under it (a subnormal result) is
    +0 on M1 and kept on M5. 2^-13 - (2^-14 + 2^-24) = 2^-14 - 2^-24, both operands normal."""
    for low, total, m1 in ((MIN_NORMAL, MIN_NORMAL, MIN_NORMAL), (MIN_NORMAL + STEP, MIN_NORMAL - STEP, 0.0)):
        x = np.zeros((1, k), np.float32)
        x[0, 0], x[0, -1] = 2.0**-13, -low
        assert probe(matmul_ones, "m1", x=x).item() == m1, low
        assert probe(matmul_ones, "m5", x=x).item() == total, low


@pytest.mark.parametrize("width", (4, 2 * WIDE))
def test_conv_and_constant_weights_flush_at_the_smallest_normal(width):
    """The same threshold through a two-channel 1x1 conv, on a runtime input and on a constant weight."""
    for value, m1 in ((MIN_NORMAL, MIN_NORMAL), (MIN_NORMAL - STEP, 0.0)):
        x = np.zeros((1, 2, 1, width), np.float32)
        x[0, 0] = value
        conv = lambda f, x: f.conv1x1(x, fp16(np.ones((1, 2, 1, 1))))  # noqa: E731
        assert np.all(probe(conv, "m1", x=x) == m1), value
        assert np.all(probe(conv, "m5", x=x) == value), value
        ones = np.ones((1, 2, 1, width), np.float32)
        weight = fp16(np.array([value, 0.0]).reshape(1, 2, 1, 1))
        weighted = lambda f, x, w=weight: f.conv1x1(x, w)  # noqa: E731
        assert np.all(probe(weighted, "m1", x=ones) == m1), value
        assert np.all(probe(weighted, "m5", x=ones) == value), value


@pytest.mark.parametrize("width", (4, 2 * WIDE))
def test_two_tap_conv_result_flush_at_the_smallest_normal(width):
    """A 1x2 kernel summing 2^-13 and -2^-14 gives 2^-14 (kept); 2^-13 and -(2^-14 + 2^-24) give one step
    under it, a subnormal result: +0 on M1, kept on M5 (GUIDE 'Edge behavior')."""

    def two_taps(f, x):
        w = fp16(np.ones((1, 1, 1, 2)))
        return f.conv(x=x, weight=w, strides=[1, 1], pad_type="valid", pad=[0, 0, 0, 0], dilations=[1, 1])

    x = np.zeros((1, 1, 1, 4 * width), np.float32)  # outputs at 0, 4, 8 ...: 2^-14; at 2, 6, ...: under it
    x[..., 0::4], x[..., 1::4] = 2.0**-13, -MIN_NORMAL
    x[..., 2::4], x[..., 3::4] = 2.0**-13, -(MIN_NORMAL + STEP)
    m1, m5 = probe(two_taps, "m1", x=x), probe(two_taps, "m5", x=x)
    assert m1[..., 0::4].ravel().tolist() == [MIN_NORMAL] * width
    assert m1[..., 2::4].ravel().tolist() == [0.0] * width
    assert m5[..., 0::4].ravel().tolist() == [MIN_NORMAL] * width
    assert m5[..., 2::4].ravel().tolist() == [MIN_NORMAL - STEP] * width


# -- 2. which lanes make a 4-lane tile in the interior-partial check -----------------------------------


def _consecutive(k: int) -> list[list[int]]:
    """The first stage's tiles: 4 consecutive lanes ([0..3], [4..7], ...), in index order."""
    return [list(range(t, min(t + 4, k))) for t in range(0, k, 4)]


def _strided(k: int) -> list[list[int]]:
    """A wrong grouping: lane j with j + K/4, j + K/2, j + 3K/4."""
    q = k // 4
    return [[j, j + q, j + 2 * q, j + 3 * q] for j in range(q)]


def _interleaved(k: int) -> list[list[int]]:
    """A wrong grouping: [0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], ..."""
    return [[b + p + 2 * i for i in range(4)] for b in range(0, k, 8) for p in (0, 1)]


def _mac_row(lanes: np.ndarray, tiles: list[list[int]]) -> float:
    """One output of x @ ones under the guide's model, in float64: each tile's exact sum, the tiles summed
    in order; a tile or running partial reaching 2^15 overflows to inf with its sign (the lanes here are
    integers, so a tile's fp16 rounding is exact); else the sum rounded to fp16."""
    total = 0.0
    for tile in tiles:
        s = float(np.sum(lanes[tile].astype(np.float64)))
        for partial in (s, total + s):
            if abs(partial) >= CEILING:
                return float(np.copysign(INF, partial))
        total += s
    return float(np.float16(total))


def _tile_rows(k: int) -> np.ndarray:
    """Rows whose verdict depends on which lanes share a tile (20000 is an fp16 value; 40000 is not)."""
    rows = np.zeros((4, k), np.float32)
    rows[:, 8] = 1.0  # the sum each row would reach: 1
    rows[0, [0, 1]], rows[0, [2, 3]] = 20000, -20000  # one tile cancels at once: 1
    rows[1, [0, 2]], rows[1, [1, 3]] = 20000, -20000  # the same, interleaved: 1
    rows[2, [0, 1]], rows[2, [k // 4, k // 4 + 1]] = 20000, -20000  # a tile of 40000: inf
    rows[3, [0, 1]], rows[3, [6, 7]] = 20000, -20000  # a tile of 40000, cancelled a tile later: inf
    return rows


@pytest.mark.parametrize("chip", ("m1", "m5", "any"))
@pytest.mark.parametrize("k", (16, 4 * WIDE))  # the exact tile model; the wide path's partial check
def test_interior_partials_are_summed_in_tiles_of_four_consecutive_lanes(chip, k):
    """GUIDE 'Saturation hazard': an interior partial reaching 2^15 overflows though a later term cancels
    it; the partials are those of tiles of 4 consecutive lanes ('Wide accumulator': [4096] + [1] x 1024
    gives 5116; mac.first-stage). Each row's outcome is worked out here, and differs under the other
    groupings (checked), so the rows tell which lanes the simulator puts in a tile."""
    rows = _tile_rows(k)
    want = [_mac_row(r, _consecutive(k)) for r in rows]
    assert want == [1.0, 1.0, INF, INF]
    for wrong in (_strided(k), _interleaved(k)):  # the rows tell the groupings apart
        assert [_mac_row(r, wrong) for r in rows] != want
    got = probe(matmul_ones, chip, x=rows).ravel().tolist()
    assert got == want
    assert probe(matmul_ones, chip, numerics="ieee", x=rows).ravel().tolist() == [1.0] * 4


# -- 3. sqrt / rsqrt of a subnormal around the midpoint 2^-15 ------------------------------------------

ALL = ("m1", "m2", "m3", "m4", "m5", "any")


@pytest.mark.parametrize("chip", ALL)
def test_sqrt_and_rsqrt_read_a_subnormal_as_the_nearer_of_zero_and_the_smallest_normal(chip):
    """ANEForge pull request #263 (table.subnormal-input): the table reads a subnormal input as the nearer
    of 0 and 2^-14, so sqrt gives 0 or 2^-7 and rsqrt +inf or 2^7. One step either side of the midpoint
    2^-15 decides it; the midpoint itself, which no published point covers, is taken up to 2^-14 (the
    record's model: ``a >= 2^-15`` reads 2^-14), as is every value from it to the smallest normal."""
    mid = 2.0**-15
    x = row(mid - STEP, mid, mid + STEP, MIN_NORMAL - STEP, MIN_NORMAL, STEP)
    assert probe(lambda f, x: f.sqrt(x=x), chip, x=x).ravel().tolist() == [0, 2**-7, 2**-7, 2**-7, 2**-7, 0]
    rs = probe(lambda f, x: f.rsqrt(x=x, epsilon=0.0), chip, x=x).ravel().tolist()
    assert rs == [INF, 128, 128, 128, 128, INF]
    ideal = probe(lambda f, x: f.sqrt(x=x), chip, numerics="ieee", x=x).ravel()
    np.testing.assert_array_equal(ideal, np.sqrt(x.astype(np.float64)).astype(np.float16).ravel())


# -- 4. the 2^15 ceiling of a two-tap conv on the large-op path -----------------------------------------


@pytest.mark.parametrize("chip", ("m1", "m2", "m4", "m5", "any"))
def test_two_tap_conv_saturates_at_two_to_the_fifteen_on_the_wide_path(chip):
    """GUIDE 'Saturation hazard' (a two-channel conv) and CLIFFS matmul_saturation: an output reaching
    32768 is inf, 32752 passes; a one-input-channel 1x1 conv keeps the fp16 range (60000). Each conv here
    has 2 x 16384 products, more than the exact model's 8192: the simulator's wide path."""
    width = 4 * WIDE // 2
    two_channels = lambda f, x: f.conv1x1(x, fp16(np.ones((1, 2, 1, 1))))  # noqa: E731
    assert np.all(probe(two_channels, chip, x=np.full((1, 2, 1, width), 16384, np.float32)) == INF)
    assert np.all(probe(two_channels, chip, x=np.full((1, 2, 1, width), -16384, np.float32)) == -INF)
    assert np.all(probe(two_channels, chip, x=np.full((1, 2, 1, width), 16376, np.float32)) == 32752)
    assert np.all(
        probe(two_channels, chip, numerics="ieee", x=np.full((1, 2, 1, width), 16384, np.float32)) == 32768
    )

    def two_taps(f, x):  # one input channel, a 1x2 kernel: two taps along the width
        w = fp16(np.ones((1, 1, 1, 2)))
        return f.conv(x=x, weight=w, strides=[1, 1], pad_type="valid", pad=[0, 0, 0, 0], dilations=[1, 1])

    assert np.all(probe(two_taps, chip, x=np.full((1, 1, 1, 2 * width), 16384, np.float32)) == INF)
    assert np.all(probe(two_taps, chip, x=np.full((1, 1, 1, 2 * width), 16376, np.float32)) == 32752)
    one = lambda f, x: f.conv1x1(x, fp16(np.ones((2, 1, 1, 1))))  # noqa: E731  # 2 x 1 x 32768 products
    assert np.all(probe(one, chip, x=np.full((1, 1, 1, 2 * width), 60000, np.float32)) == 60000)


# -- 11. the simulator rounds every fp16 intermediate, small arrays too -----------------------------------


def _run(prog, x: np.ndarray, numerics: str) -> np.ndarray:
    backend = runtime.open("sim", strict=False, numerics=numerics)
    with backend.compile(prog) as kernel:
        (out,) = kernel(x=x).values()
    return out


@pytest.mark.parametrize("numerics", ("ieee", "engine"))
@pytest.mark.parametrize("n", (1, 3, 64, 2047, 4096))
def test_fp16_intermediates_are_stored_rounded_whatever_their_size(numerics, n):
    """MIL's fp16 tensors hold binary16 values: each op's fp16 result is rounded before the next op reads
    it. (x + 2^-12) - x is 0 for x in [1, 2) once the sum is rounded (2^-12 is under half an ulp there),
    2^-12 if it were not; (1.5 x) - x differs from 0.5 x by 1.5 x's rounding. The expected values are
    numpy's float16 per op."""
    rng = np.random.default_rng(n)
    x = (1 + (2 * rng.integers(0, 512, (1, n)) + 1) * 2.0**-10).astype(
        np.float32
    )  # odd last bit: 1.5 x rounds
    h = x.astype(np.float16)

    @mil.program(inputs={"x": tensor("fp16", [1, n])})
    def added(f, x):
        return f.sub(x=f.add(x=x, y=2.0**-12), y=x)

    @mil.program(inputs={"x": tensor("fp16", [1, n])})
    def scaled(f, x):
        return f.sub(x=f.mul(x=x, y=1.5), y=x)

    want_added = (h + np.float16(2.0**-12)) - h  # float16 arithmetic rounds each op's result
    want_scaled = (h * np.float16(1.5)) - h
    assert np.all(want_added == 0)
    assert np.all(want_scaled != (0.5 * x).astype(np.float16))  # the rounding shows
    np.testing.assert_array_equal(_run(added, x, numerics), want_added.astype(np.float32))
    np.testing.assert_array_equal(_run(scaled, x, numerics), want_scaled.astype(np.float32))
