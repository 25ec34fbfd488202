"""The MAC's 4-lane first stage against the book's measurements (M1/H13), run as MIL programs.

Every expected value is the book's number (sbryngelson/ane-guide), never the simulator's:

- SWEEP: part-1-machine/03-numerics.md, table ``tbl:c3-cancel-sweep`` ("The cancellation-threshold
  survivor sweep, M1/H13 measured"): the sum of ``[b, -b, 1] x 16`` through a matmul against ones.
- LAYOUT: the same chapter, "the survivor count is layout-independent: the same result whether the one
  precedes or follows the negation"; part-6-silicon/20-datapath-mac.md: "the ``[+B, -B, +1]`` and
  ``[+B, +1, -B]`` orderings return byte-identical values".
- 5116: 03-numerics.md, "[4096] + [1] x 1024 = 5120, and the engine returns 5116" (listing
  ``lst:c3-accum-probe``, constants table ``tbl:c3-constants``).
- 16000: 03-numerics.md, "A reduction of sixteen thousand ones is bit exact".
- 8192: 20-datapath-mac.md, "sixteen unit increments all survive next to a partial of 8192 where a fp16
  accumulator would drop most of them" (the book gives no layout: here the partial is one tile of
  4 x 2048 and the ones follow in their own tiles).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.numerics_probe import fp16, probe, row

pytestmark = pytest.mark.usefixtures("fp16_path")  # with the compiled loops and without

# tbl:c3-cancel-sweep: (cancellation magnitude, fp16 spacing there, survivors of sixteen ones)
SWEEP = [
    (1024, 1, 16),
    (3000, 2, 16),
    (4090, 2, 16),
    (4096, 4, 4),
    (8000, 4, 4),
    (16000, 8, 4),
    (30000, 16, 4),
]
LAYOUTS = {
    "b,-b,1": lambda b: [b, -b, 1.0],  # the table's own
    "b,1,-b": lambda b: [b, 1.0, -b],  # the one precedes the negation (20-datapath-mac.md)
    "1,b,-b": lambda b: [1.0, b, -b],  # the listing's triple read from its one
}


def matmul_ones(f, x):
    """x [1, K] @ ones [K, 1]: the book's reduce_via_matmul."""
    return f.matmul(x=x, y=fp16(np.ones((x.type.shape[1], 1), np.float32)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("big, spacing, survivors", SWEEP)
def test_cancellation_sweep(big, spacing, survivors, layout):
    """SWEEP + LAYOUT: 16 survivors up to 4090, then the floor of exactly 4 from 4096 to 30000."""
    assert float(np.spacing(np.float16(big))) == spacing  # the table's second column
    x = row(*(LAYOUTS[layout](float(big)) * 16))
    assert probe(matmul_ones, "m1", x=x).item() == survivors


@pytest.mark.parametrize(
    "big", [b for b, _, _ in SWEEP] + [2048, 2500, 4000, 4094, 5000, 10000, 20000, 32752]
)
def test_never_more_survivors_than_ones(big):
    """SWEEP: the ones are what survives a cancellation, so no magnitude gives more than the 16 ones in the
    input (nor fewer than the 4 of the floor up to 30000's spacing)."""
    for layout in LAYOUTS.values():
        out = probe(matmul_ones, "m1", x=row(*(layout(float(big)) * 16))).item()
        assert 0 <= out <= 16


def test_worked_sum_5116_and_the_wide_accumulator():
    """5116 (not the exact 5120, not an fp16 running sum's 4096); 16000: sixteen thousand ones exact; 8192:
    sixteen ones survive next to a wide partial of 8192 (fp16 spacing 8 there)."""
    x = np.ones((1, 1025), np.float32)
    x[0, 0] = 4096
    assert probe(matmul_ones, "m1", x=x).item() == 5116
    assert probe(matmul_ones, "m1", x=np.ones((1, 16000), np.float32)).item() == 16000
    assert probe(matmul_ones, "m1", x=row(*([2048.0] * 4 + [1.0] * 16))).item() == 8208
    assert float(np.float16(8192) + np.float16(1)) == 8192  # what an fp16 accumulator does with each one


@pytest.mark.parametrize("chip", ("m1", "any"))
def test_first_stage_at_training_shapes(chip):
    """5116 and SWEEP inside kernels of the training shapes (stories15M: dim 288, hidden 768, seq 256): a
    1x1 conv of 288 input channels to 768 over 256 positions (an FFN up-projection) and a 768-term
    projection as a matmul, each holding the probes' rows among random activations. Numerics "exact"
    models the first stage at these sizes; "engine" (the default) only at probe sizes, where the same
    conv keeps the ones (float32 accumulation beyond 2^14 products)."""
    rng = np.random.default_rng(30)
    dim, hidden, seq = 288, 768, 256
    x = rng.standard_normal((1, dim, 1, seq)).astype(np.float16).astype(np.float32)
    x[0, :, 0, 0] = [4096.0] + [1.0] * (dim - 1)  # position 0: 4096 then 287 ones (exact: 4383)
    x[0, :, 0, 1] = ([4096.0, -4096.0, 1.0] * 96)[:dim]  # position 1: the sweep's floor at 4096, 96 ones
    w = rng.standard_normal((hidden, dim, 1, 1)).astype(np.float16).astype(np.float32) * 0.05
    w[0] = 1.0  # output channel 0 sums its input: the book's matmul against ones
    fast = probe(lambda f, v: f.conv1x1(v, fp16(w)), chip, x=x)
    assert fast[0, 0, 0, 0] == 4384  # float32 accumulation: 4383, stored as fp16
    out = probe(lambda f, v: f.conv1x1(v, fp16(w)), chip, x=x, numerics="exact")
    # 4096 + 1 + 1 + 1 in the first tile loses its three ones (the 5116 case): 4096 + 284 = 4380 (fp16: 4380)
    assert out[0, 0, 0, 0] == 4380
    # 96 ones in 24 periods of 12 lanes: one survivor per period, the floor's rate (16 ones -> 4)
    assert out[0, 0, 0, 1] == 24
    ones = x[0, :, 0, :].T.copy()  # (seq, dim) @ (dim, 1): the same rows as a matmul
    ones = np.concatenate([ones, np.ones((seq, hidden - dim), np.float32)], axis=1)
    got = probe(
        lambda f, v: f.matmul(x=v, y=fp16(np.ones((hidden, 2), np.float32))), chip, x=ones, numerics="exact"
    )
    assert got[0, 0] == 4096 + 284 + (hidden - dim)  # 4860: the tail of ones is exact in fp16 there
    assert got[1, 0] == 24 + (hidden - dim)


def test_compiled_first_stage_gives_the_numpy_models_bits(monkeypatch):
    """``jit.tiled_matmul`` (the compiled loop) and ``mac.tiled_product``'s numpy model agree bit for bit,
    over random fp16 operands of every scale, planted probe values, both tile roundings and flushes."""
    from anekit import jit
    from anekit.runtime.sim import mac

    if not jit.available():
        pytest.skip("numba is not installed (the `fast` extra)")
    rng = np.random.default_rng(7)
    for trial in range(120):
        m, k, n = (int(v) for v in rng.integers(1, 12, 3))
        k = int(rng.integers(1, 70))
        with np.errstate(over="ignore"):
            a = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-8, 4.5)).astype(np.float16)
        b = (rng.standard_normal((k, n)) * rng.choice([1.0, 100.0, 1e-3])).astype(np.float16)
        if trial % 4 == 0:
            a[rng.random(a.shape) < 0.25] = rng.choice([4096, -4096, 1, 3000, -30000, 2.0**-20])
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        flush, tile, ties = (
            bool(trial % 2),
            ("truncate", "even", "away")[trial % 3],
            ("even", "away")[trial % 5 == 0],
        )
        compiled = jit.tiled_matmul(a32, b32, 32768.0, flush, tile, ties)
        assert compiled is not None
        monkeypatch.setattr(mac, "_compiled", lambda *args: None)
        want, want_over = mac.tiled_product(a32, b32, 32768.0, flush, tile, ties)
        monkeypatch.undo()
        assert np.array_equal(
            compiled[0].astype(np.float32).view(np.uint32), want.astype(np.float32).view(np.uint32)
        )
        assert np.array_equal(compiled[1], want_over)


@pytest.mark.parametrize("chip", ("m2", "m3", "m4", "m5", "any"))
def test_the_sweep_on_the_other_chips(chip):
    """Only M1 was measured; the book: 'The accumulator width is a fixed hardware property, not a
    per-program or per-chip setting' (03-numerics.md) and 'fixed hardware on every device' (appendix D):
    predicted, every profile keeps the M1 sweep and 5116 (M5's tiles round ties away: no tie here)."""
    for big, _, survivors in SWEEP:
        for layout in LAYOUTS.values():
            assert probe(matmul_ones, chip, x=row(*(layout(float(big)) * 16))).item() == survivors
    x = np.ones((1, 1025), np.float32)
    x[0, 0] = 4096
    assert probe(matmul_ones, chip, x=x).item() == 5116


@pytest.mark.parametrize("position", range(1, 8))
def test_a_single_one_next_to_4096_rounds_away_in_any_tile(position):
    """03-numerics.md: 'A single one added next to one large resident value cannot expose the tile, because
    that value forces the whole wide partial onto its own coarse spacing and the one rounds away
    regardless of which tile it is in'."""
    x = np.zeros((1, 8), np.float32)
    x[0, 0], x[0, position] = 4096.0, 1.0
    assert probe(matmul_ones, "m1", x=x).item() == 4096
