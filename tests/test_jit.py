"""anekit.jit's compiled loops against independent references: numpy's float16 cast and the bit path.

The loops must give the bits of ``fp16.f16_bits_to_f32(fp16.f32_to_f16_bits(x))`` (rounding) and of
``x.astype(np.float16)`` (encoding) for every pattern: a spread over all 2**32 float32 patterns, every
pattern next to a rounding tie, and the special values.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from anekit import fp16, jit

U16, U32 = np.uint16, np.uint32


@pytest.fixture(autouse=True)
def loops() -> None:
    os.environ.pop("ANEKIT_JIT", None)
    jit.reset()
    if not jit.available():
        pytest.skip("numba is not installed (the `fast` extra): the compiled loops are not in use")


def spread_patterns() -> np.ndarray:
    """Every 4099th float32 pattern, every pattern within 2 of a tie between adjacent halves, specials."""
    spread = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(U32)
    halves = np.arange(0x7C00, dtype=U32)  # every finite non-negative half
    as_f32 = fp16.f16_bits_to_f32(halves.astype(U16)).view(U32)
    ties = as_f32[:-1] + ((as_f32[1:] - as_f32[:-1]) >> U32(1))  # midpoints between neighbours
    near = (ties[:, None].astype(np.int64) + np.arange(-2, 3)).reshape(-1).astype(U32)
    specials = np.array(
        [
            0,
            0x7F800000,
            0x7FC00000,
            0x7F800001,
            0x7FFFFFFF,
            0x477FF000,
            0x477FEFFF,
            0x477FE000,
            1,
            0x33000000,
        ],
        dtype=U32,
    )
    positive = np.concatenate([spread, near, specials])
    return np.concatenate([positive, positive | U32(0x80000000)])


def bit_path(x: np.ndarray) -> np.ndarray:
    return fp16.f16_bits_to_f32(fp16.f32_to_f16_bits(x)).view(U32)


def test_rounding_into_a_fresh_array_equals_the_bit_path() -> None:
    x = spread_patterns().view(np.float32)
    out = np.empty_like(x)
    assert jit.round_fp16_into(x, out)
    np.testing.assert_array_equal(out.view(U32), bit_path(x))


def test_rounding_in_place_equals_the_bit_path() -> None:
    x = spread_patterns().view(np.float32)
    want = bit_path(x)
    assert jit.round_fp16_inplace(x)
    np.testing.assert_array_equal(x.view(U32), want)


def test_round_to_fp16_takes_the_loops_in_every_form() -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 300)) * 300).astype(np.float32)
    want = bit_path(x)
    np.testing.assert_array_equal(fp16.round_to_fp16(x).view(U32), want)
    out = np.empty_like(x)
    assert fp16.round_to_fp16(x, out=out) is out
    np.testing.assert_array_equal(out.view(U32), want)
    fortran = np.asfortranarray(x)
    np.testing.assert_array_equal(fp16.round_to_fp16(fortran).view(U32), want)
    y = x.copy()
    assert fp16.round_to_fp16(y, out=y) is y
    np.testing.assert_array_equal(y.view(U32), want)


def test_layouts_the_loops_cannot_walk_are_declined() -> None:
    x = np.ones((8, 8), np.float32)
    assert not jit.round_fp16_inplace(x[:, ::2])
    assert not jit.round_fp16_into(x, np.empty((8, 8), np.float32, order="F"))
    assert not jit.round_fp16_into(x, x)  # overlap: the caller's in-place path handles it
    assert not jit.round_fp16_into(x.astype(np.float64), np.empty((8, 8), np.float32))
    assert jit.encode_fp16_values(x[:, ::2], np.empty((8, 4), U16)) is None


def test_encoding_equals_numpys_cast_for_every_finite_half() -> None:
    halves = np.arange(1 << 16, dtype=U32).astype(U16)
    finite = halves[(halves & U16(0x7C00)) != U16(0x7C00)]
    x = fp16.f16_bits_to_f32(finite)
    out = np.empty(x.shape, U16)
    assert jit.encode_fp16_values(x, out) is True
    np.testing.assert_array_equal(out, x.astype(np.float16).view(U16))


@pytest.mark.parametrize("bad", [np.inf, -np.nan, 65520.0, 1.0 + 2.0**-20])
def test_encoding_refuses_values_that_are_not_finite_halves(bad: float) -> None:
    x = np.full(100, 0.5, np.float32)
    x[37] = bad
    assert jit.encode_fp16_values(x, np.empty(100, U16)) is False


def test_switched_off_by_the_environment() -> None:
    os.environ["ANEKIT_JIT"] = "0"
    try:
        jit.reset()
        assert not jit.available()
        x = np.ones(10, np.float32)
        assert not jit.round_fp16_inplace(x)
        assert jit.encode_fp16_values(x, np.empty(10, U16)) is None
    finally:
        os.environ.pop("ANEKIT_JIT")
        jit.reset()


def test_adamw_in_one_pass_gives_the_numpy_paths_bits() -> None:
    from anekit.llama import cpu_ops

    rng = np.random.default_rng(2)
    shape = (300, 77)
    start = [
        rng.standard_normal(shape).astype(np.float32),
        np.zeros(shape, np.float32),
        np.zeros(shape, np.float32),
    ]
    grads = [rng.standard_normal(shape).astype(np.float32) * 10.0**-k for k in range(4)]
    results = {}
    for mode in ("1", "0"):
        os.environ["ANEKIT_JIT"] = mode
        jit.reset()
        w, m, v = (a.copy() for a in start)
        for t, g in enumerate(grads, start=1):
            cpu_ops.adamw_update(w, g, m, v, t, 3e-3, apply_decay=t % 2 == 0)
        results[mode] = (w, m, v)
    for fast, slow in zip(results["1"], results["0"]):
        np.testing.assert_array_equal(fast.view(U32), slow.view(U32))


def test_adamw_divides_by_zero_as_numpy_does() -> None:
    """eps 0 and a zero second moment: 0 / 0 is NaN on both paths (numpy's error model, not an exception)."""
    from anekit.llama import cpu_ops

    results = {}
    try:
        for mode in ("1", "0"):
            os.environ["ANEKIT_JIT"] = mode
            jit.reset()
            w = np.ones(70, np.float32)
            g = np.zeros(70, np.float32)
            g[::7] = np.float32(0.5)
            m, v = np.zeros(70, np.float32), np.zeros(70, np.float32)
            with np.errstate(invalid="ignore", divide="ignore"):
                cpu_ops.adamw_update(w, g, m, v, 1, 1e-2, eps=0.0, grad_scale=0.25)
            results[mode] = (w, g, m, v)
    finally:
        os.environ.pop("ANEKIT_JIT")
        jit.reset()
    assert np.isnan(results["1"][0][1]) and not np.isnan(results["1"][0][0])
    for fast, slow in zip(results["1"], results["0"]):
        np.testing.assert_array_equal(fast.view(U32), slow.view(U32))


def test_rounding_and_encoding_in_one_pass_equal_the_two_passes() -> None:
    x = spread_patterns().view(np.float32)
    rounded = bit_path(x).view(np.float32)
    finite = np.abs(rounded) <= 65504  # NaN and inf excluded
    x = x[finite]
    values, halves = np.empty_like(x), np.empty(x.shape, U16)
    assert jit.round_encode_into(x, values, halves) is True
    np.testing.assert_array_equal(values.view(U32), bit_path(x))
    np.testing.assert_array_equal(halves, values.astype(np.float16).view(U16))
    over = np.array([1.0, 65519.0, 65520.0, 2.0], np.float32)  # 65520 rounds to inf: not a finite half
    assert jit.round_encode_into(over, np.empty(4, np.float32), np.empty(4, U16)) is False
    assert jit.round_encode_into(x, x, halves) is None  # overlap: declined, nothing written


def test_a_block_rounded_into_a_grid_in_one_pass_equals_the_bit_path_and_its_counts() -> None:
    x = spread_patterns().view(np.float32)
    rows = 97
    cols = x.size // rows
    block = x[: rows * cols].reshape(rows, cols)
    grid = np.full((rows + 5, cols + 9), 7.0, np.float32)
    found = jit.round_block_into(block, grid, 3, 4)
    want = bit_path(block).view(np.float32)
    np.testing.assert_array_equal(grid[3 : 3 + rows, 4 : 4 + cols].view(U32), want.view(U32))
    outside = np.ones(grid.shape, bool)
    outside[3 : 3 + rows, 4 : 4 + cols] = False
    assert (grid[outside] == 7.0).all()  # nothing written beside the block
    nan = np.isnan(want)
    assert found == (int(nan.sum()), float(np.abs(want[~nan]).max()))  # inf counts in the peak


@pytest.mark.parametrize("factor", [1 / 1024, 0.3, 3.0e38, 1.0])
def test_scaling_in_one_pass_gives_numpys_products_and_says_whether_all_are_finite(factor: float) -> None:
    x = spread_patterns().view(np.float32).copy()
    want = x.copy()
    with np.errstate(all="ignore"):
        want *= factor  # numpy: the Python float taken as float32
    finite = jit.scale_all_finite(x, factor)
    np.testing.assert_array_equal(x.view(U32), want.view(U32))
    assert finite is False  # the patterns hold inf and NaN
    ok = np.linspace(-2, 2, 1001, dtype=np.float32).reshape(7, 143)
    with np.errstate(over="ignore"):
        ok_want = ok * np.float32(factor)  # 3e38: some products overflow to inf
    assert jit.scale_all_finite(ok, factor) is bool(np.isfinite(ok_want).all())
    np.testing.assert_array_equal(ok, ok_want)


def test_blocks_the_block_loop_cannot_walk_are_declined_and_nothing_is_written() -> None:
    grid = np.zeros((8, 8), np.float32)
    column = np.broadcast_to(np.ones((4, 1), np.float32), (4, 8))  # a norm scale repeated along columns
    assert jit.round_block_into(column, grid, 0, 0) is None
    assert jit.round_block_into(np.ones((4, 2), np.float32).T, grid, 0, 0) is None  # transposed: numpy's
    assert jit.round_block_into(np.ones((4, 4), np.float32), grid, 6, 0) is None  # past the grid
    assert jit.round_block_into(grid[:2, :2], grid, 0, 0) is None  # overlap
    assert jit.round_block_into(np.ones((2, 2), np.float64), grid, 0, 0) is None
    assert not grid.any()


@pytest.mark.parametrize(
    ("shape", "perm"),
    [
        ((768, 2048), (1, 0)),  # a weight matrix, row stride 8 KiB
        ((1, 1, 256, 2048), (0, 1, 3, 2)),  # a product's (T, hidden) rows turned to channels
        ((1, 1, 13, 1024), (0, 1, 3, 2)),  # row stride 4 KiB, sizes no multiple of the 8 x 8 tile
        ((3, 1, 2048), (2, 1, 0)),
    ],
)
def test_transposed_copy_holds_numpys_copy(shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    """The tiled loop fills the array numpy's transposed copy makes: same elements (bit patterns, NaN
    payloads and negative zeros included), same shape and strides."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 1 << 32, size=shape, dtype=np.uint64).astype(U32).view(np.float32)
    view = x.transpose(perm)
    out = np.empty(view.shape, np.float32)
    assert jit.copy_transposed(view, out)
    expected = np.array(view, order="C")
    assert out.strides == expected.strides
    assert out.view(U32).tobytes() == expected.view(U32).tobytes()


def test_transposed_copies_numpy_does_well_are_left_to_it() -> None:
    """Row strides that are no multiple of 4 KiB, three non-unit axes, a C-contiguous view, a non-float32
    source or a C-discontiguous target: declined, nothing written."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 1, 2048, 256)).astype(np.float32)
    cases = [
        (x.transpose(0, 1, 3, 2), np.empty((1, 1, 256, 2048), np.float32)),  # row stride 1 KiB
        (
            rng.standard_normal((2, 8, 1024)).astype(np.float32).transpose(0, 2, 1),
            np.empty((2, 1024, 8), np.float32),
        ),
        (x, np.empty(x.shape, np.float32)),
        (x.astype(np.float64).transpose(0, 1, 3, 2)[..., :1024], np.empty((1, 1, 256, 1024), np.float32)),
        (
            np.zeros((8, 1024), np.float32).T,
            np.empty((1024, 16), np.float32)[:, :8],
        ),
    ]
    for view, out in cases:
        out[...] = 7.0
        assert not jit.copy_transposed(view, out)
        assert (out == 7.0).all()


_STEP_SIGNATURES = """
import json, sys
import numpy as np
from numba.core.registry import CPUDispatcher
from anekit import jit, runtime
from anekit import _jit_loops as loops
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params
from anekit.training.loop import TrainConfig, TrainState, train

def seen():
    # the loops anekit calls; a helper (_half, _round) is compiled on its own only on a cache miss
    return {n: sorted(map(str, f.signatures)) for n in dir(loops) if not n.startswith("_")
            and isinstance(f := getattr(loops, n), CPUDispatcher) and f.signatures}

if sys.argv[1] == "preload":
    jit.preload()
    print(json.dumps(seen()))
    raise SystemExit(0)

class Windows:
    def batch(self, rng, seq_len):
        t = rng.integers(0, 16, seq_len + 1)
        return t[:-1], t[1:]

cfg = ModelConfig(64, 176, 2, 4, 2, 512, 64, name="tiny")
state = TrainState.fresh(Params.init(cfg, seed=3), TrainConfig())
train(runtime.open("sim"), state, Windows(), TrainConfig(steps=2, accum=1, weights="dynamic"))
print(json.dumps(seen()))
"""


def _signatures_in_a_fresh_process(what: str) -> dict[str, list[str]]:
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ANEKIT_JIT"}
    done = subprocess.run(
        [sys.executable, "-c", _STEP_SIGNATURES, what], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_preload_loads_every_loop_signature_that_a_training_step_calls():
    """What a fresh process's training steps call is loaded by ``jit.preload`` (else the first step waits
    for it), and the preload loads nothing a step does not call beside stories15M's (the list is
    ``_jit_loops.step_signatures``: a new loop or a new signature in the step must be added there)."""
    # A loop compiled afresh compiles the loops it calls as loops of their own (round_port_inplace's
    # mac_port); loaded from the cache it does not. The first preload fills the cache for the list.
    _signatures_in_a_fresh_process("preload")
    stepped = _signatures_in_a_fresh_process("train")
    preloaded = _signatures_in_a_fresh_process("preload")
    assert stepped, "a simulated training step calls compiled loops"
    for name, signatures in stepped.items():
        assert set(signatures) <= set(preloaded.get(name, [])), (name, signatures)
    assert set(preloaded) == set(jit.loops().step_signatures())  # every listed loop was loaded


def test_the_background_preload_starts_one_thread_however_often_it_is_asked() -> None:
    jit.preload_in_background()
    first = jit._preloading
    assert first is not None
    jit.preload_in_background()
    assert jit._preloading is first
    first.join(120)
    assert not first.is_alive()
