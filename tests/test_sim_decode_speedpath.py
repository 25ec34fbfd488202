"""Column-lazy runs of the simulator (runtime.sim.columns): a kernel told that its caller reads only its
first output columns computes fewer, with the same bits in those columns as the full run, NaN in the rest.

The reference is always the simulator with ``lazy_columns=False``: every column computed, as before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from anekit import mil
from anekit.engine.generation_routes import generation_route
from anekit.errors import EvalFailed
from anekit.generate.engine import EngineDecoder, make_engine_decoder
from anekit.llama.params import Params
from anekit.mil import tensor
from anekit.mil.builder import FunctionBuilder
from anekit.mil.ir import Function, Var
from anekit.models.config import preset
from anekit.runtime.sim import SimBackend, SimKernel
from anekit.runtime.sim.columns import candidates, narrowed
from anekit.runtime.sim.mac import ENGINE_MAC_PRODUCTS

WIDTH = 32


def _program(body: Callable[[FunctionBuilder, Var], Var], channels: int = 64, width: int = WIDTH) -> Any:
    b = mil.Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, channels, 1, width]))
    f.output(body(f, x))
    return b.build()


def _weight(rng: np.random.Generator, c_out: int, c_in: int) -> np.ndarray:
    return (rng.standard_normal((c_out, c_in, 1, 1)) / np.sqrt(c_in)).astype(np.float16)


def _norm_conv(f: FunctionBuilder, x: Var, c_out: int = 512, seed: int = 0) -> Var:
    """RMSNorm over the channels, then a pointwise conv: the shape of a generation head."""
    rng = np.random.default_rng(seed)
    c_in = 64
    sq = f.mul(x=x, y=x)
    ms = f.reduce_mean(x=sq, axes=[1], keep_dims=True)
    r = f.rsqrt(x=f.add(x=ms, y=np.float16(1e-5)))
    h = f.mul(x=f.mul(x=x, y=r), y=rng.standard_normal((1, c_in, 1, 1)).astype(np.float16))
    return f.conv1x1(x=h, weight=f.const(_weight(rng, c_out, c_in)))


def _fn(body: Callable[[FunctionBuilder, Var], Var], **kw: Any) -> Function:
    return _program(body, **kw).main


def _kernel(backend: SimBackend, prog: Any) -> SimKernel:
    kernel = backend.compile(prog).load()
    assert isinstance(kernel, SimKernel)
    return kernel


def _blas_narrows(c_out: int, c_in: int) -> bool:
    """Whether this BLAS gives column 0 of a (c_out, c_in) x (c_in, 32) float32 product the same bits with
    fewer columns (a width ``NarrowRuns`` tries)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, c_out, c_in)).astype(np.float16).astype(np.float32)
    x = rng.standard_normal((1, 1, c_in, WIDTH)).astype(np.float16).astype(np.float32)
    full = np.matmul(w, x)[..., :1].tobytes()
    return any(
        np.matmul(w, np.ascontiguousarray(x[..., :n]))[..., :1].tobytes() == full
        for n in candidates(1, WIDTH)
    )


# -- which programs are column-separable --------------------------------------------------------------


def test_a_norm_and_pointwise_conv_program_narrows_to_any_width() -> None:
    fn = _fn(_norm_conv)
    for n in (1, 5, 16):
        small = narrowed(fn, WIDTH, n)
        assert small is not None
        assert [v.type.shape for v in small.inputs] == [(1, 64, 1, n)]
        assert [v.type.shape for v in small.outputs] == [(1, 512, 1, n)]
    assert fn.inputs[0].type.shape == (1, 64, 1, WIDTH)  # the program itself is left as it was


@pytest.mark.parametrize(
    "what, body",
    [
        ("a reduction over the width", lambda f, x: f.reduce_sum(x=x, axes=[3], keep_dims=True)),
        ("a softmax over the width", lambda f, x: f.softmax(x=x, axis=3)),
        ("a softmax over the channels (not a listed op)", lambda f, x: f.softmax(x=x, axis=1)),
        (
            "a constant that varies along the width",
            lambda f, x: f.add(x=x, y=np.ones((1, 64, 1, WIDTH), np.float16)),
        ),
        (
            "a slice of the width",
            lambda f, x: f.slice_by_size(x=x, begin=[0, 0, 0, 0], size=[1, 64, 1, WIDTH]),
        ),
        ("a transpose", lambda f, x: f.transpose(x=x, perm=[0, 3, 2, 1])),
        (
            "a conv whose kernel spans columns",
            lambda f, x: f.conv(
                x=x,
                weight=np.ones((64, 64, 1, 3), np.float16),
                strides=[1, 1],
                pad_type="custom",
                pad=[0, 0, 1, 1],
                dilations=[1, 1],
                groups=1,
            ),
        ),
        (
            "a conv whose weight is a runtime value",
            lambda f, x: f.conv(
                x=x,
                weight=f.reshape(x=x, shape=[64, 32, 1, 1]),
                strides=[1, 1],
                pad_type="valid",
                pad=[0, 0, 0, 0],
                dilations=[1, 1],
                groups=2,
            ),
        ),
    ],
)
def test_a_program_that_mixes_columns_is_not_narrowed(what: str, body: Callable[..., Var]) -> None:
    assert narrowed(_fn(body), WIDTH, 1) is None, what


def test_candidate_widths_run_from_the_columns_asked_for_through_powers_of_two() -> None:
    assert candidates(1, 32) == [1, 2, 4, 8, 16]
    assert candidates(20, 128) == [20, 32, 64]
    assert candidates(32, 32) == []


# -- what a narrowed run gives ------------------------------------------------------------------------


def _run(kernel: SimKernel, x: np.ndarray, columns: int | None) -> np.ndarray:
    kernel.compute_columns(columns)
    (out,) = kernel(x=x).values()
    return out


@pytest.mark.parametrize("chip", ["any", "m1", "m4", "m5"])
def test_the_columns_asked_for_hold_the_full_runs_bits_and_the_others_nan(chip: str) -> None:
    prog = _program(_norm_conv)
    lazy, full = (
        _kernel(SimBackend(chip=chip), prog),
        _kernel(SimBackend(chip=chip, lazy_columns=False), prog),
    )
    rng = np.random.default_rng(7)
    for columns in (1, 3, 17):
        x = rng.standard_normal((1, 64, 1, WIDTH)).astype(np.float32)  # fresh values, not the probe's
        want = _run(full, x, columns)
        got = _run(lazy, x, columns)
        assert got.shape == want.shape == (1, 512, 1, WIDTH)
        assert got[..., :columns].tobytes() == want[..., :columns].tobytes()
        chosen = lazy._narrow.choose(columns) if lazy._narrow is not None else None
        if chosen is not None:  # a narrowed run: nothing past the columns asked for is handed out
            assert np.isnan(got[..., columns:]).all()
            assert np.isnan(lazy.outputs[0].read()[..., columns:]).all()
        assert not np.isnan(got[..., :columns]).any()
    if _blas_narrows(512, 64):  # then the kernel runs narrowed (not vacuously the full run), on M5 too
        assert lazy._narrow is not None and lazy._narrow.choose(1) is not None
    assert _run(lazy, x, None).tobytes() == _run(full, x, None).tobytes()  # every column again when asked


def test_a_width_whose_products_sum_in_another_order_is_not_chosen() -> None:
    """Where the BLAS computes a 1-column product in another order than the 64-column one (a GEMV on numpy's
    OpenBLAS), the float32 sums differ in their last bits and mostly round to the same fp16 values: the
    order probe must see the difference that the fp16 outputs hide. (A program wider than the decode
    width keeps the BLAS product; a narrower one sums in order: tests/test_sim_ordered.py.)"""
    rng = np.random.default_rng(3)
    wide = 2 * WIDTH
    w = _weight(rng, 512, 64).astype(np.float32).reshape(1, 512, 64)
    x = rng.standard_normal((1, 1, 64, wide)).astype(np.float16).astype(np.float32)
    one = np.matmul(w, np.ascontiguousarray(x[..., :1]))
    if one.tobytes() == np.matmul(w, x)[..., :1].tobytes():
        pytest.skip("this BLAS computes one column as it computes 64: nothing to tell apart")
    kernel = _kernel(
        SimBackend(chip="m4"),
        _program(lambda f, v: f.conv1x1(x=v, weight=f.const(_weight(rng, 512, 64))), width=wide),
    )
    assert not kernel.plan.ordered
    kernel.compute_columns(1)
    assert kernel._narrowed() is None or kernel._narrowed()[0] != 1  # type: ignore[index]


def test_no_narrowing_under_the_sanitizer_or_when_switched_off() -> None:
    prog = _program(_norm_conv)
    for backend in (SimBackend(chip="m4", sanitize=True), SimBackend(chip="m4", lazy_columns=False)):
        kernel = _kernel(backend, prog)
        kernel.compute_columns(1)
        assert kernel._narrowed() is None


def test_a_program_that_mixes_columns_runs_every_column() -> None:
    prog = _program(lambda f, x: f.softmax(x=x, axis=3))
    kernel = _kernel(SimBackend(chip="m4"), prog)
    x = np.random.default_rng(0).standard_normal((1, 64, 1, WIDTH)).astype(np.float32)
    out = _run(kernel, x, 1)
    assert not np.isnan(out).any()
    assert kernel._narrowed() is None


def test_a_column_count_below_one_is_refused_in_one_line() -> None:
    kernel = _kernel(SimBackend(), _program(_norm_conv))
    with pytest.raises(EvalFailed) as e:
        kernel.compute_columns(0)
    assert str(e.value) == "[main] compute_columns needs a column count >= 1, got 0"


# -- generation: the logits of every route, bit for bit -----------------------------------------------


def decode_logits(
    params: Params, backend: SimBackend, steps: int, chip: str = "any"
) -> tuple[np.ndarray, list[SimKernel]]:
    """A 9-token prompt, then ``steps`` greedy decode steps on ``chip``'s route: every logit, and the
    kernels ``backend`` compiled."""
    kernels: list[SimKernel] = []
    compile_ = backend._compile

    def keep(*a: Any) -> Any:
        k = compile_(*a)
        kernels.append(k)
        return k

    backend._compile = keep  # type: ignore[method-assign]
    with EngineDecoder(params, backend, generation_route(chip)) as dec:
        logits = [dec.forward(np.arange(9) % 200 + 3, 0)]
        for i in range(steps):
            logits.append(dec.forward([int(np.argmax(logits[-1]))], 9 + i))
    return np.stack(logits), kernels


def _logits(params: Params, chip: str, lazy: bool, steps: int) -> tuple[np.ndarray, list[SimKernel]]:
    return decode_logits(params, SimBackend(chip=chip, lazy_columns=lazy, compile_budget=1000), steps, chip)


@pytest.mark.parametrize("model", ["stories260K", "stories15M"])
@pytest.mark.parametrize("chip", ["any", "m1", "m3", "m4"])
def test_generation_logits_are_the_full_runs_bits_on_every_route(model: str, chip: str) -> None:
    """A prompt, then decode steps: every logit the decoder returns is the same bits with and without
    column-lazy runs; on every route some kernel did run narrowed (the head at least), m3's dynamic kernels
    too (their copies read the kernel's own input: ``kernels.generation.same_weight_columns``)."""
    params = Params.init(preset(model), seed=1)
    want, _ = _logits(params, chip, False, 3)
    got, kernels = _logits(params, chip, True, 3)
    assert got.tobytes() == want.tobytes()
    route = generation_route(chip)
    ran_narrowed = [k for k in kernels if k._narrow is not None and k._narrow._chosen.get(1)]
    if route.id.startswith("dynamic-"):
        assert ran_narrowed, f"no kernel of route {route.id} ran narrowed"
    elif _blas_narrows(params.cfg.vocab_size, params.cfg.dim):  # the head's product: then the head narrows
        assert ran_narrowed, f"no kernel of route {route.id} ran narrowed"
        if route.attention == "host":  # the projections and the MLP too: the host reads the tokens' columns
            assert any(k.outputs[0].shape[1] != params.cfg.vocab_size for k in ran_narrowed)


def test_narrowing_keeps_every_mac_op_on_the_path_the_full_run_takes() -> None:
    """A 32 x 32 conv of 32 columns is 32768 products, past the exact tile model's 16384 (the BLAS
    product); at 16 columns it would be 16384 and the engine numerics would model it exactly, in another
    order: that width is not even tried (17 is)."""
    rng = np.random.default_rng(5)
    prog = _program(lambda f, x: f.conv1x1(x=x, weight=f.const(_weight(rng, 32, 32))), channels=32)
    kernel = _kernel(SimBackend(chip="m4"), prog)
    kernel.compute_columns(1)
    chosen = kernel._narrowed()
    assert chosen is None or 32 * 32 * chosen[0] > ENGINE_MAC_PRODUCTS
    runs = kernel._narrow
    assert runs is not None
    sixteen, seventeen = narrowed(kernel.fn, WIDTH, 16), narrowed(kernel.fn, WIDTH, 17)
    assert sixteen is not None and seventeen is not None
    assert ENGINE_MAC_PRODUCTS == 32 * 32 * 16
    assert not runs._wide(sixteen) and runs._wide(seventeen)


def test_a_narrowed_plan_holds_the_full_plans_weights_not_a_copy() -> None:
    kernel = _kernel(SimBackend(chip="m4"), _program(_norm_conv))
    kernel.compute_columns(1)
    chosen = kernel._narrowed()
    if chosen is None:
        pytest.skip("this BLAS keeps no narrower width's bits")
    full = {id(v) for v in kernel.plan.constants.values()}
    weights = [v for v in chosen[1].constants.values() if v.size >= 512 * 64]
    assert weights and all(id(v) in full for v in weights)


def test_the_decoder_factory_passes_the_switch_to_the_simulator() -> None:
    params = Params.init(preset("stories260K"), seed=0)
    for lazy in (True, False):
        with make_engine_decoder(params, "sim", chip="m4", lazy_columns=lazy) as dec:
            assert isinstance(dec.backend, SimBackend) and dec.backend.lazy_columns is lazy


def _engine_attention_logits(params: Params, full_mlp: bool, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """A prompt, then decode steps, on M4's route (attention in the engine, the MLP a kernel of its own);
    ``full_mlp``: every column of the MLP run and added, padding columns included (before the MLP's columns
    were narrowed)."""
    from anekit.generate import block_route

    if full_mlp:

        def every_column(self: Any, kernel: Any, x: np.ndarray, n: int, post_norm: Any) -> np.ndarray:
            m = kernel.run({"x": x})["x"]
            return m if not self.cfg.post_norms else self._norm(m, post_norm)

        monkeypatch.setattr(block_route.BlockRunner, "_mlp", every_column)
    backend = SimBackend(chip="m4", compile_budget=1000)
    with EngineDecoder(params, backend, generation_route("m4")) as dec:
        logits = [dec.forward(np.arange(9) % 200 + 3, 0)]
        for i in range(4):
            logits.append(dec.forward([int(np.argmax(logits[-1]))], 9 + i))
    monkeypatch.undo()
    return np.stack(logits)


@pytest.mark.parametrize("model", ["stories260K", "gemma3"])
def test_the_mlps_padding_columns_change_no_real_tokens_bit(
    model: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """On the engine-attention routes only the real tokens' columns of the MLP kernel are read (a simulated
    kernel computes only those) and its padding columns add zeros to the residual: the next attention
    kernel masks padding keys from every real query, so every logit is the bits of the run that adds the
    MLP's own padding columns. Gemma 3: its post-norms and its sliding layers' banded masks."""
    if model == "gemma3":
        from anekit.hf.model import load_model
        from tests.test_models_gemma3 import CONFIG, make_gemma3

        make_gemma3(tmp_path, CONFIG)
        params = load_model(tmp_path, seq_len=32).params
        assert params.cfg.post_norms
    else:
        params = Params.init(preset(model), seed=2)
    narrowed_mlp = _engine_attention_logits(params, False, monkeypatch)
    every = _engine_attention_logits(params, True, monkeypatch)
    assert np.isfinite(every).all()
    assert narrowed_mlp.tobytes() == every.tobytes()
