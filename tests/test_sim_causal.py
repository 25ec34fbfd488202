"""Causal copies (runtime.sim.kernel.SimKernel.causal): a program that attends over its own chunk after a
cache, its padding columns masked, is run for the chunk's real columns only, with the full run's bits there.

What makes the bits the same is the order of every sum the dropped padding takes part in: the convs, the
matmuls and the softmax's sum are taken in ascending order (runtime.sim.ordered), so the exact zeros a
masked key adds leave them as they are. The references: scalar float32 loops written here for the sums,
and for a kernel the same program run with every column computed (``lazy_columns=False``). Known-bad
copies (not causal, of other shapes, holding other weights) are refused or never chosen."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from anekit import mil
from anekit.errors import EvalFailed
from anekit.generate.layers import causal_copies
from anekit.kernels.gen_blocks import MASK_VALUE
from anekit.kernels.generation import gen_weights, layers_kernel
from anekit.kernels.route import KernelRoute
from anekit.llama.params import Params
from anekit.mil import tensor
from anekit.models.config import preset
from anekit.runtime.sim import SimBackend, SimKernel
from anekit.runtime.sim.ordered import (
    OrderedReduceMean,
    OrderedReduceSum,
    OrderedSoftmax,
    ordered_batched,
    sequential_sum,
)
from tests.test_sim_decode_speedpath import decode_logits
from tests.test_sim_ordered import SPECIALS, same_bits, scalar_sums

CHANNELS, CAPACITY, WIDTH = 256, 96, 32  # every MAC op past the exact tile model's 2^14 products at 1 column


# -- the sums ---------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("fp16_path")
@pytest.mark.parametrize(
    "xs, ys",
    [
        ((2, 3, 5, 7), (2, 3, 7, 4)),
        ((1, 3, 5, 7), (2, 1, 7, 33)),  # batch axes broadcast
        ((7,), (2, 7, 4)),  # a row vector
        ((3, 5, 7), (7,)),  # a column vector
        ((1, 2, 1, 300), (1, 2, 300, 48)),  # one query over 300 keys: a narrowed attention's product
    ],
)
def test_a_batched_ordered_product_sums_each_output_in_ascending_order(
    xs: tuple[int, ...], ys: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(sum(xs) + sum(ys))
    x = (rng.standard_normal(xs) * 10.0 ** rng.integers(-5, 5, xs)).astype(np.float32)
    y = rng.standard_normal(ys).astype(np.float32)
    got = ordered_batched(x, y)
    want = np.matmul(x.astype(np.float64), y.astype(np.float64))  # only for its shape
    assert got.shape == want.shape and got.flags.c_contiguous
    x2 = x[None, :] if x.ndim == 1 else x
    y2 = y[:, None] if y.ndim == 1 else y
    batch = np.broadcast_shapes(x2.shape[:-2], y2.shape[:-2])
    xb = np.broadcast_to(x2, (*batch, *x2.shape[-2:])).reshape(-1, *x2.shape[-2:])
    yb = np.broadcast_to(y2, (*batch, *y2.shape[-2:])).reshape(-1, *y2.shape[-2:])
    ref = np.stack([scalar_sums(a, b) for a, b in zip(xb, yb)]).reshape(want.shape)
    assert same_bits(got, ref)


@pytest.mark.usefixtures("fp16_path")
def test_special_values_in_a_batched_product_sum_as_the_scalar_loop_does() -> None:
    x = np.stack([SPECIALS, SPECIALS[::-1]])[None]  # (1, 2, 12)
    y = np.stack([SPECIALS, -SPECIALS, np.ones_like(SPECIALS)], axis=1)[None]  # (1, 12, 3)
    with np.errstate(all="ignore"):
        assert same_bits(ordered_batched(x, y), scalar_sums(x[0], y[0])[None])


def _running_sums(e: np.ndarray, axis: int) -> np.ndarray:
    """The sum along ``axis`` term after term from the first, in float32 scalars (axis kept)."""
    moved = np.moveaxis(e, axis, -1)
    out = np.empty((*moved.shape[:-1], 1), np.float32)
    for index in np.ndindex(moved.shape[:-1]):
        acc = moved[index][0]
        for v in moved[index][1:]:
            acc = np.float32(acc + v)
        out[index] = acc
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_the_sequential_sum_is_the_running_sum_along_any_axis(axis: int) -> None:
    rng = np.random.default_rng(4)
    e = (rng.standard_normal((3, 130, 5)) * 10.0 ** rng.integers(-4, 4, (3, 130, 5))).astype(np.float32)
    e[0, :12, 0] = SPECIALS
    with np.errstate(all="ignore"):
        assert same_bits(sequential_sum(e, axis), _running_sums(e, axis))


@pytest.mark.parametrize("op", [OrderedReduceSum(), OrderedReduceMean()])
def test_an_ordered_channel_sum_of_one_column_is_its_sum_in_a_wider_tensor(op: Any) -> None:
    """numpy sums the channels of a 1-column tensor pairwise and those of a wider one channel after channel:
    the ordered reduction sums every width channel after channel (the scalar loop), so its bits at two or
    more columns are numpy's, unchanged, and one column gets them too."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((1, 288, 1, 32)) * 10.0 ** rng.integers(-3, 3, (1, 288, 1, 32))).astype(
        np.float32
    )
    running = _running_sums(x, 1)
    want = running if isinstance(op, OrderedReduceSum) else running / np.float32(288)
    for n in (1, 2, 32):
        got = op.compute(np.ascontiguousarray(x[..., :n]), (1,), True)
        assert got.tobytes() == np.ascontiguousarray(want[..., :n]).tobytes()
    wide = op.compute(x, (1,), True)
    plain = (
        np.sum(x, axis=1, keepdims=True)
        if isinstance(op, OrderedReduceSum)
        else np.mean(x, axis=1, keepdims=True)
    )
    assert wide.tobytes() == plain.tobytes()  # numpy's bits where it sums in order already
    assert op.compute(x, (1,), False).shape == (1, 1, 32)


def test_an_ordered_softmax_keeps_a_rows_bits_when_masked_keys_are_dropped() -> None:
    """The softmax over the cache and a chunk of 32 keys, for a query that sees the cache and one key of
    the chunk: dropping the 31 masked keys leaves every probability's bits (their exponentials are exact
    zeros, added last)."""
    rng = np.random.default_rng(9)
    softmax = OrderedSoftmax()
    for length in (481, 993, 200):
        row = rng.standard_normal((2, 3, 1, length)).astype(np.float16).astype(np.float32)
        row[..., length - 31 :] += MASK_VALUE  # the chunk's padding keys, masked
        values = {"x": row, "axis": np.int32(-1)}
        full = softmax.reference(_args(softmax, values))
        values["x"] = np.ascontiguousarray(row[..., : length - 31])
        short = softmax.reference(_args(softmax, values))
        assert (full[..., length - 31 :] == 0).all()
        assert full[..., : length - 31].tobytes() == short.tobytes()


def _args(opdef: Any, values: dict[str, Any]) -> Any:
    from anekit.mil.registry import RefArgs

    return RefArgs(opdef, values, ())


# -- a causal program and its copies ----------------------------------------------------------------------


def attention_program(width: int, masked: bool = True, seed: int = 0) -> Any:
    """A one-head attention over a cache of CAPACITY slots and the chunk's own ``width`` keys, a conv
    before and after: query i sees every cache slot and chunk keys 0 .. i (``masked`` False: every key,
    the padding included, so column 0 depends on the others)."""
    rng = np.random.default_rng(seed)

    def weight() -> np.ndarray:
        return (rng.standard_normal((CHANNELS, CHANNELS, 1, 1)) / 16).astype(np.float16)

    wq, wk, wv, wo = weight(), weight(), weight(), weight()
    chunk = np.where(np.arange(width)[None, :] <= np.arange(width)[:, None], 0.0, MASK_VALUE)
    mask = np.zeros((1, 1, width, CAPACITY + width), np.float16)
    if masked:
        mask[0, 0, :, CAPACITY:] = chunk
    b = mil.Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, CHANNELS, 1, width]))
    cache = f.input("cache", tensor("fp16", [1, CHANNELS, 1, CAPACITY]))
    q = f.conv1x1(x=x, weight=f.const(wq, name="wq"))
    k = f.conv1x1(x=x, weight=f.const(wk, name="wk"))
    v = f.conv1x1(x=x, weight=f.const(wv, name="wv"))
    keys = f.concat(values=(cache, k), axis=3)  # (1, C, 1, CAP + W)
    vals = f.concat(values=(cache, v), axis=3)
    q_rows = f.transpose(x=f.reshape(x=q, shape=[1, 1, CHANNELS, width]), perm=[0, 1, 3, 2])  # (1, 1, W, C)
    k_cols = f.reshape(x=keys, shape=[1, 1, CHANNELS, CAPACITY + width])
    scores = f.matmul(x=q_rows, y=k_cols)  # (1, 1, W, CAP + W)
    scaled = f.mul(x=scores, y=np.float16(1 / 16))
    probs = f.softmax(x=f.add(x=scaled, y=f.const(mask, name="mask")), axis=-1)
    v_rows = f.transpose(x=f.reshape(x=vals, shape=[1, 1, CHANNELS, CAPACITY + width]), perm=[0, 1, 3, 2])
    mixed = f.matmul(x=probs, y=v_rows)  # (1, 1, W, C)
    back = f.reshape(x=f.transpose(x=mixed, perm=[0, 1, 3, 2]), shape=[1, CHANNELS, 1, width])
    f.output(f.conv1x1(x=f.add(x=back, y=x), weight=f.const(wo, name="wo"), name="out"))
    return b.build()


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, CHANNELS, 1, WIDTH)).astype(np.float32)
    return x, rng.standard_normal((1, CHANNELS, 1, CAPACITY)).astype(np.float32)


def _causal_kernel(backend: SimBackend, width: int = WIDTH, masked: bool = True) -> SimKernel:
    kernel = backend.compile(attention_program(width, masked)).load()
    assert isinstance(kernel, SimKernel)
    kernel.causal(lambda n: (attention_program(n, masked), {}))
    return kernel


def _run(kernel: SimKernel, columns: int | None, seed: int = 1) -> np.ndarray:
    x, cache = _inputs(seed)
    kernel.compute_columns(columns)
    return kernel(x=x, cache=cache)["out"]


@pytest.mark.parametrize("chip", ["any", "m1", "m4", "m5"])
def test_a_causal_kernel_runs_its_real_columns_with_the_full_runs_bits(chip: str) -> None:
    lazy = _causal_kernel(SimBackend(chip=chip, strict=False))
    full = _causal_kernel(SimBackend(chip=chip, strict=False, lazy_columns=False))
    assert lazy.plan.ordered and full.plan.ordered  # the same sums whether or not a backend narrows
    for columns, seed in ((1, 1), (3, 2), (1, 3)):
        want, got = _run(full, None, seed), _run(lazy, columns, seed)
        assert got[..., :columns].tobytes() == want[..., :columns].tobytes()
        assert np.isnan(got[..., columns:]).all()  # nothing past the real columns is handed out
        chosen = lazy._narrowed()
        assert chosen is not None and chosen[0] == columns  # no norm inside: the columns asked for
        assert np.isfinite(want).all()


def test_a_copy_that_is_not_causal_is_measured_and_never_chosen() -> None:
    """Every query sees the padding keys: column 0 of a 1-column copy is another number than the full
    run's, the measurement sees it and the kernel computes every column."""
    lazy = _causal_kernel(SimBackend(strict=False), masked=False)
    full = _causal_kernel(SimBackend(strict=False, lazy_columns=False), masked=False)
    got = _run(lazy, 1)
    assert lazy._narrowed() is None
    assert got.tobytes() == _run(full, None).tobytes()


def test_a_copy_of_other_shapes_is_refused_naming_the_input() -> None:
    kernel = SimBackend(strict=False).compile(attention_program(WIDTH)).load()
    assert isinstance(kernel, SimKernel)
    kernel.causal(lambda n: (attention_program(n + 1), {}))  # one column too many
    kernel.compute_columns(1)
    x, cache = _inputs(0)
    with pytest.raises(EvalFailed, match=r"causal copy at 1 columns: input 'x' \[1, 256, 1, 2\]"):
        kernel(x=x, cache=cache)


def test_a_program_wider_than_a_decode_kernel_keeps_its_products_and_every_column() -> None:
    kernel = _causal_kernel(SimBackend(strict=False), width=64)
    assert not kernel.plan.ordered
    kernel.compute_columns(1)
    assert kernel._narrowed() is None


def test_the_copy_shares_the_kernels_weights_and_reads_its_own_mask() -> None:
    kernel = _causal_kernel(SimBackend(strict=False))
    _run(kernel, 1)
    chosen = kernel._narrowed()
    assert chosen is not None
    plan = chosen[1]
    full = {n: kernel.plan.constants[s] for n, s in kernel.plan.slot_of.items() if s in kernel.plan.constants}
    mine = {name: plan.constants[slot] for name, slot in plan.slot_of.items() if slot in plan.constants}
    for name in ("wq", "wk", "wv", "wo"):
        assert mine[name] is full[name]  # one copy of each weight
    assert mine["mask"].shape == (1, 1, 1, CAPACITY + 1) and full["mask"].shape == (
        1,
        1,
        WIDTH,
        CAPACITY + WIDTH,
    )


# -- the generation layers kernels ------------------------------------------------------------------------

ROUTE = KernelRoute("baked", "engine", "engine", "conv")  # the legacy route's


def test_a_layers_copy_holding_other_weights_is_refused_naming_the_file() -> None:
    cfg = preset("stories260K")
    mine, theirs = (gen_weights(Params.init(cfg, seed=s)) for s in (0, 1))
    gen = layers_kernel(cfg, 0, 1, width=WIDTH, capacity=480, route=ROUTE, weights=mine)
    kernel = gen.compile(SimBackend(strict=False)).load()
    causal_copies(
        kernel,
        lambda n: layers_kernel(cfg, 0, 1, width=WIDTH, capacity=480, route=ROUTE, weights=theirs, columns=n),
    )
    kernel.compute_columns(1)
    with pytest.raises(EvalFailed, match=r"causal copy at 1 columns: weight file '.*' holds other bytes"):
        kernel.run()


def _layers_narrowed(kernels: list[SimKernel]) -> list[int]:
    """The widths the decode layers kernels ran at, for one real token."""
    return [
        k._narrow._chosen[1][0]  # type: ignore[index]
        for k in kernels
        if "cache" in k.input_names and k._narrow is not None and k._narrow._chosen.get(1)
    ]


def test_the_legacy_decode_step_runs_the_layers_kernel_for_its_token_with_the_full_runs_bits() -> None:
    """stories15M's shapes in two layers: the decode step's layers kernel runs its causal copy of one column
    and every logit of a prompt and the decode steps after it is the bits of the run that computes every
    column."""
    params = Params.init(preset("stories15M").with_(n_layers=2, seq_len=64), seed=3)
    want, _ = decode_logits(params, SimBackend(lazy_columns=False, compile_budget=100), 4)
    got, kernels = decode_logits(params, SimBackend(compile_budget=100), 4)
    assert got.tobytes() == want.tobytes()
    widths = _layers_narrowed(kernels)
    assert widths and all(w == 1 for w in widths)


@pytest.mark.parametrize("model", ["qwen3", "gemma3"])
def test_every_family_decodes_narrowed_with_the_full_runs_bits(
    model: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Qwen 3 (q / k norms, GQA) and Gemma 3 (post-norms, sliding layers' banded masks, its embedding
    scale) on the ideal machine, whose MAC ops are all float32 products (so the small fixtures narrow too):
    the same logits bit for bit, and the layers kernels ran narrowed."""
    from tests.test_generate_engine import _hf

    params = _hf(tmp_path_factory, model)
    want, _ = decode_logits(params, SimBackend(numerics="ieee", lazy_columns=False, compile_budget=100), 5)
    got, kernels = decode_logits(params, SimBackend(numerics="ieee", compile_budget=100), 5)
    assert np.isfinite(want).all()
    assert got.tobytes() == want.tobytes()
    assert _layers_narrowed(kernels)


@pytest.mark.parametrize("chip", ["m4", "m5"])
def test_the_engine_attention_routes_run_their_attention_kernels_for_the_token(chip: str) -> None:
    """M4's and M5's route (baked weights, the norms on the host, one attention kernel a layer): each
    attention kernel runs its causal copy of one column, the logits the full run's bits (on M5 each sum
    rounded with its ties away from zero, in the narrowed run as in the full one)."""
    params = Params.init(preset("stories15M").with_(n_layers=2, seq_len=64), seed=4)
    backend = SimBackend(chip=chip, lazy_columns=False, compile_budget=100)
    want, _ = decode_logits(params, backend, 3, chip)
    got, kernels = decode_logits(params, SimBackend(chip=chip, compile_budget=100), 3, chip)
    assert got.tobytes() == want.tobytes()
    widths = _layers_narrowed(kernels)
    assert len(widths) == 2 and all(w == 1 for w in widths)  # both layers' attention kernels
