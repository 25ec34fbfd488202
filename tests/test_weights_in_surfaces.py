"""Weights that live in the kernels' surfaces: input sets, block writes, and the dynamic step that uses them.

maderix/ANE's dynamic pipeline (training/training_dynamic/train.m) compiles each kernel once, gives every layer
its own input surfaces and requests, stages the weights there after each optimizer step and writes only the
activations per evaluation. These tests hold anekit's version of it to three things: an input set computes
exactly what the kernel's own inputs compute with the same contents (on the simulator and through the fake
engine, whose requests bind surfaces as the engine was measured to); the dynamic training step gives the bits
of packing every weight into the input on every run (the path the kernels took before, kept for weights that
are not a plain ``Params``); and an optimizer step moves no weight bytes but its own writes, counted here from
the model's shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.errors import SurfaceCreationFailed
from anekit.kernels import ModelConfig
from anekit.llama import Params
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import DynamicKernels, Timer, train_step
from anekit.mil import tensor
from anekit.runtime.ane import AneBackend
from anekit.runtime.base import Surface
from anekit.runtime.sim.held import HeldSurface
from anekit.training import loop
from anekit.training.state import TrainConfig, TrainState
from tests import test_llama_step as llama_step
from tests.fake_objc import FakeObjC


def _scale_program(channels: int = 4, width: int = 64) -> mil.Program:
    """out = x * 3 + 1 on [1, C, 1, W] fp16: every element's value is visible in the output."""
    b = mil.Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, channels, 1, width]))
    y = f.mul(x=x, y=np.float16(3.0))
    f.output(f.add(x=y, y=np.float16(1.0), name="out"))
    return b.build()


def _expected(x: np.ndarray) -> np.ndarray:
    """x * 3 + 1 with every value stored in fp16, as the engine stores it (numpy's float16 casts)."""
    h = x.astype(np.float16)
    return ((h * np.float16(3.0)).astype(np.float16) + np.float16(1.0)).astype(np.float32)


# -- input sets on the simulator ------------------------------------------------------------------------


def test_each_input_set_computes_what_its_contents_give_and_the_kernel_s_own_inputs_are_untouched():
    rng = np.random.default_rng(0)
    kernel = runtime.open("sim").compile(_scale_program()).load()
    a, b = kernel.input_set(), kernel.input_set()
    xa, xb = rng.standard_normal((2, 1, 4, 1, 64)).astype(np.float32) * 100
    a[0].write_block(xa.reshape(4, 64))
    b[0].write_block(xb.reshape(4, 64))
    assert isinstance(a[0], HeldSurface)
    np.testing.assert_array_equal(kernel.evaluate(a)["out"], _expected(xa))
    np.testing.assert_array_equal(kernel.evaluate(b)["out"], _expected(xb))
    np.testing.assert_array_equal(kernel.evaluate(a)["out"], _expected(xa))  # a's contents stayed
    np.testing.assert_array_equal(kernel.evaluate()["out"], _expected(np.zeros_like(xa)))  # its own: zeros


def test_a_block_write_rounds_once_to_fp16_and_leaves_the_rest_of_the_surface():
    rng = np.random.default_rng(1)
    kernel = runtime.open("sim").compile(_scale_program()).load()
    (s,) = kernel.input_set()
    whole = rng.standard_normal((4, 64)).astype(np.float32)
    s.write_block(whole)
    block = rng.standard_normal((2, 8)).astype(np.float32) * 1000
    s.write_block(block.T.T, 1, 40)  # rows 1-2, columns 40-47
    want = whole.copy()
    want[1:3, 40:48] = block
    with s.view() as buf:  # the bits: numpy's own cast of the float32 values
        np.testing.assert_array_equal(buf.reshape(4, 64), want.astype(np.float16))
    assert s.read().shape == (4, 64)
    np.testing.assert_array_equal(kernel.evaluate([s])["out"], _expected(want.reshape(1, 4, 1, 64)))


def test_what_is_written_through_the_raw_view_is_what_the_next_run_reads():
    kernel = runtime.open("sim").compile(_scale_program()).load()
    (s,) = kernel.input_set()
    s.write_block(np.ones((4, 64), np.float32))
    kernel.evaluate([s])
    with s.view() as buf:
        buf[0, 2, 0, 5] = np.float16(-7.5)
    want = np.ones((1, 4, 1, 64), np.float32)
    want[0, 2, 0, 5] = -7.5
    np.testing.assert_array_equal(kernel.evaluate([s])["out"], _expected(want))
    s.write_block(np.full((1, 2), 2.0, np.float32), 3, 0)  # a block write after a raw one keeps both
    want[0, 3, 0, :2] = 2.0
    np.testing.assert_array_equal(kernel.evaluate([s])["out"], _expected(want))


def test_a_nan_in_an_input_set_is_coerced_as_in_the_kernel_s_own_inputs():
    """The engine turns an input NaN into +inf (anekit.engine.numerics); a set holding one gives what the
    kernel's own input does."""
    kernel = runtime.open("sim").compile(_scale_program()).load()
    x = np.zeros((1, 4, 1, 64), np.float32)
    x[0, 1, 0, 3] = np.nan
    own = kernel(x=x)["out"]
    (s,) = kernel.input_set()
    s.write_block(x.reshape(4, 64))
    got = kernel.evaluate([s])["out"]
    np.testing.assert_array_equal(got, own)
    assert np.isinf(got[0, 1, 0, 3])


@pytest.mark.parametrize(
    "block, row, column",
    [(np.zeros((5, 1)), 0, 0), (np.zeros((1, 2)), 0, 63), (np.zeros(3), 0, 0), (np.zeros((1, 1)), -1, 0)],
)
def test_a_block_that_does_not_fit_is_refused_naming_the_surface(block, row, column):
    (s,) = runtime.open("sim").compile(_scale_program()).input_set()
    with pytest.raises(SurfaceCreationFailed, match=r"\[surface\] x"):
        s.write_block(block, row, column)


def test_only_a_set_the_kernel_made_can_be_run_on():
    kernel = runtime.open("sim").compile(_scale_program()).load()
    with pytest.raises(SurfaceCreationFailed, match="input_set"):
        kernel.run([Surface((1, 4, 1, 64))])


# -- input sets through the fake engine ------------------------------------------------------------------


def test_each_input_set_has_a_request_of_its_own_rebuilt_by_every_load(tmp_path):
    """The fake engine evaluates on the surfaces its request binds and refuses a request built before the
    model's latest load (maderix/ANE builds requests after load): every set must get its own request, and
    each reload must build them again."""
    (tmp_path / "T").mkdir()
    fake = FakeObjC(tmp_path / "T", chip="m4", macos="15.1")
    backend = AneBackend(runtime=fake.runtime(), dialect="ios18")
    rng = np.random.default_rng(3)
    with backend.compile(_scale_program()) as kernel:
        kernel.load()
        a = kernel.input_set()
        xa = rng.standard_normal((4, 64)).astype(np.float32)
        a[0].write_block(xa)
        b = kernel.input_set()  # made while loaded: its request is built now
        xb = rng.standard_normal((4, 64)).astype(np.float32) * 10
        b[0].write_block(xb)
        for _ in range(2):
            np.testing.assert_array_equal(kernel.evaluate(a)["out"], _expected(xa.reshape(1, 4, 1, 64)))
            np.testing.assert_array_equal(kernel.evaluate(b)["out"], _expected(xb.reshape(1, 4, 1, 64)))
            kernel.unload()  # the next evaluation reloads, and must rebind both sets
            kernel.load()
    assert fake.errors == [] and fake.refusals == []
    assert not [o for o in fake.live_objects() if o.cls.startswith("_ANERequest")]


# -- the dynamic training step ------------------------------------------------------------------------------


class _Repacked(Params):
    """Weights the kernels do not keep in their surfaces: packed into the input on every run, the path every
    dynamic run took before (and LoRA's merged weights still take)."""


def _repacked(p: Params) -> _Repacked:
    return _Repacked(p.cfg, p.embed, p.layers, p.rms_final, p.wcls)


def _train(cfg: ModelConfig, params: Params, steps: int, kernels_out: list) -> TrainState:
    tc = TrainConfig(steps=steps, accum=2, lr=1e-3, warmup=0, weights="dynamic", seed=5)
    state = TrainState.fresh(params, tc)
    backend = runtime.open("sim", compile_budget=10**6)
    tokens = np.random.default_rng(7).integers(0, cfg.vocab_size, 4096)

    class Data:
        def batch(self, rng, seq_len):
            i = int(rng.integers(0, tokens.size - seq_len - 1))
            return tokens[i : i + seq_len], tokens[i + 1 : i + seq_len + 1]

    made = []
    original = loop.make_kernels

    def spy(*args, **kwargs):
        k = original(*args, **kwargs)
        made.append(k)
        return k

    loop.make_kernels = spy  # type: ignore[assignment]
    try:
        loop.train(backend, state, Data(), tc)
    finally:
        loop.make_kernels = original  # type: ignore[assignment]
    kernels_out.extend(made)
    return state


@pytest.mark.parametrize("name", ["gqa-rope-tied", "mha-norope-untied"])
def test_a_dynamic_run_trains_the_bits_of_packing_every_weight_on_every_run(name, monkeypatch):
    cfg, tied = llama_step.CONFIGS[name]
    kept, repacked = [], []
    a = _train(cfg, llama_step._params(cfg, tied, seed=2), 3, kept)
    b = _train(cfg, _repacked(llama_step._params(cfg, tied, seed=2)), 3, repacked)
    assert a.losses == b.losses
    for (n, x), (_, y) in zip(a.params.tensors(), b.params.tensors()):
        np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32), err_msg=n)
    assert kept[0].staged_bytes > 0 and repacked[0].staged_bytes == 0


def _weight_elements_in_kernels(cfg: ModelConfig) -> int:
    """Counted from the shapes: every projection matrix sits in two kernels' inputs (its forward and its
    backward product: Wq, Wk, Wv in the SDPA forward and the QKV backward, Wo in the SDPA forward and the
    Wo^T matmul, W1 and W3 in the FFN forward and its second backward kernel, W2 in the FFN forward and its
    first backward kernel); each RMSNorm scale in its forward kernel, repeated over the seq_len columns."""
    d, h, q, kv = cfg.dim, cfg.hidden_dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    matrices = d * q + 2 * d * kv + q * d + 3 * d * h
    norms = 2 * d * cfg.seq_len
    return cfg.n_layers * (2 * matrices + norms)


def test_an_optimizer_step_writes_each_weight_once_into_each_surface_that_holds_it_and_nothing_else():
    cfg, tied = llama_step.CONFIGS["gqa-rope-tied"]
    stages = []
    original = DynamicKernels.stage

    def counting(self, params):
        stages.append(1)
        return original(self, params)

    DynamicKernels.stage = counting  # type: ignore[method-assign]
    try:
        made: list = []
        _train(cfg, llama_step._params(cfg, tied, seed=2), 4, made)
    finally:
        DynamicKernels.stage = original  # type: ignore[method-assign]
    assert len(stages) == 1  # staged once at the start; every later step's weights were written through
    per_step = 2 * _weight_elements_in_kernels(cfg)  # fp16 bytes
    assert made[0].staged_bytes == per_step * 5  # the first staging and four optimizer steps


def test_weights_changed_in_place_without_the_optimizer_are_staged_again_by_compile():
    cfg, tied = llama_step.CONFIGS["gqa-rope-tied"]
    params = llama_step._params(cfg, tied, seed=4)
    window = np.random.default_rng(0).integers(0, cfg.vocab_size, cfg.seq_len + 1)

    def step(kernels, p):
        grads = p.zeros_like()
        kernels.compile(p, Timer())
        return train_step(kernels, p, grads, window[:-1], window[1:], Timer(), 64.0), grads

    kernels = make_kernels(runtime.open("sim"), cfg, "dynamic")
    step(kernels, params)
    params.layers[1].w2 *= np.float32(1.5)  # in place, nobody told
    got, got_grads = step(kernels, params)
    fresh = make_kernels(runtime.open("sim"), cfg, "dynamic")
    want, want_grads = step(fresh, params)
    assert got.loss == want.loss
    for (n, x), (_, y) in zip(got_grads.tensors(), want_grads.tensors()):
        np.testing.assert_array_equal(x, y, err_msg=n)
