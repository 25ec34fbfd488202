"""A step's host work beside its kernels (``anekit.llama.host_queue``): the same bits as the sequential
step on the simulator and on the engine backend's fake (gradients, losses, whole runs on one and two
threads), a job's error reaching the caller as an anekit error, no thread left after a step, and the jobs'
BLAS on the thread count the caller fixed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from anekit import runtime
from anekit.errors import AnekitError, OptionError
from anekit.kernels import ModelConfig
from anekit.kernels.route import kernel_route
from anekit.llama import Params, step
from anekit.llama.host_queue import HostJobFailed, HostQueue, overlap_pays
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Gradients, Timer, train_step
from anekit.runtime.ane import AneBackend
from anekit.training.accumulate import fixed_blas
from tests.fake_objc import FakeObjC
from tests.test_llama_step import _params  # weights well above fp16 noise, rounded to fp16 values

BASE = ModelConfig(64, 128, 2, 4, 2, 64, 32)  # rows of 64 bytes and more: shapes the fake's rules accept
CONFIGS = {
    "tied": (BASE, True),
    "untied": (BASE, False),
    "qwen3-like": (BASE.with_(attn_head_dim=32, qkv_bias=True, qk_norm=True), False),
}


def _windows(cfg: ModelConfig, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w = rng.integers(0, cfg.vocab_size // 2, cfg.seq_len + 1)  # repeated tokens: rows summed
        out.append((w[:-1], w[1:]))
    return out


class Lagging(Gradients):
    """``Gradients`` whose products start late: on the host thread, the jobs fall behind the step, so an
    operand the step changed (or a kernel run overwrote) before a job read it would change the bits."""

    def matrix(self, layer, key, dy, x):
        time.sleep(0.001)
        super().matrix(layer, key, dy, x)

    def classifier(self, params, dlogits, xf):
        time.sleep(0.005)
        super().classifier(params, dlogits, xf)


def _steps(kernels, params: Params, overlap: bool, fresh: bool) -> tuple[list[float], Params]:
    """Three sequences into one total (the first written when ``fresh``, as a batch's first is), each step
    reusing the kernels' buffers of the one before; overlapped, the jobs lag (``Lagging``)."""
    grads = params.zeros_like()
    for _, g in grads.tensors():
        g.fill(np.nan if fresh else 0.5)  # a fresh total's stale contents must never be read
    losses = []
    for j, (tokens, targets) in enumerate(_windows(kernels.cfg, 3, seed=7)):
        sink = (Lagging if overlap else Gradients)(grads, kernels, fresh=fresh and j == 0)
        result = train_step(kernels, params, sink, tokens, targets, Timer(), loss_scale=64.0, overlap=overlap)
        losses.append(result.loss)
    return losses, grads


def _assert_same(a: tuple[list[float], Params], b: tuple[list[float], Params]) -> None:
    assert a[0] == b[0]
    for (name, x), (_, y) in zip(a[1].tensors(), b[1].tensors()):
        assert np.array_equal(x, y), name
        assert np.isfinite(x).all(), name


def _fake_backend(tmp_path, latency: float = 0.0) -> tuple[FakeObjC, AneBackend]:
    folder = tmp_path / "T"
    folder.mkdir(exist_ok=True)
    fake = FakeObjC(folder, chip="m4", eval_latency=latency)
    return fake, AneBackend(runtime=fake.runtime())


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("weights", ["baked", "dynamic"])
@pytest.mark.parametrize("fresh", [True, False])
def test_the_overlapped_step_gives_the_sequential_bits_on_the_simulator(name, weights, fresh):
    cfg, tied = CONFIGS[name]
    params = _params(cfg, tied, seed=3)
    kernels = make_kernels(runtime.open("sim"), cfg, weights)
    kernels.compile(params, Timer())
    try:
        _assert_same(_steps(kernels, params, False, fresh), _steps(kernels, params, True, fresh))
    finally:
        kernels.close()


@pytest.mark.parametrize("route", ["dynamic-engine-attention", "conv-host-attention"])
def test_a_route_with_the_norm_or_attention_on_the_host_gives_the_sequential_bits(route):
    cfg, tied = CONFIGS["tied"]
    params = _params(cfg, tied, seed=4)
    kernels = make_kernels(runtime.open("sim"), cfg, None, kernel_route(route))
    kernels.compile(params, Timer())
    try:
        _assert_same(_steps(kernels, params, False, True), _steps(kernels, params, True, True))
    finally:
        kernels.close()


@pytest.mark.parametrize("tied", [True, False])
def test_the_overlapped_step_gives_the_sequential_bits_on_the_engine_fake(tmp_path, tied):
    """On the fake each evaluation also takes 5 ms of real time, the host free meanwhile: the jobs run
    while later kernels run, as on the engine; the step on the fake is the simulator's, bit for bit."""
    params = _params(BASE, tied, seed=5)
    fake, backend = _fake_backend(tmp_path, latency=0.005)
    kernels = make_kernels(backend, BASE, "dynamic")
    kernels.compile(params, Timer())
    sim = make_kernels(runtime.open("sim", chip="m4"), BASE, "dynamic")
    sim.compile(params, Timer())
    try:
        before, t0 = fake.evaluations, time.perf_counter()
        inline = _steps(kernels, params, False, True)
        assert time.perf_counter() - t0 >= 0.005 * (fake.evaluations - before) > 0  # each took its latency
        _assert_same(inline, _steps(kernels, params, True, True))
        _assert_same(inline, _steps(sim, params, False, True))
    finally:
        kernels.close()
        sim.close()
    assert fake.errors == [] and fake.refusals == []
    assert not [t for t in threading.enumerate() if t.name == "anekit-host"]


def test_the_engine_backend_overlaps_by_default_and_the_simulator_does_not(tmp_path):
    seen: list[set[str]] = []

    class Where(Gradients):
        def matrix(self, layer, key, dy, x):
            seen[-1].add(threading.current_thread().name)
            super().matrix(layer, key, dy, x)

    params = _params(BASE, True, seed=6)
    _, engine = _fake_backend(tmp_path)
    ((tokens, targets),) = _windows(BASE, 1, seed=8)
    for backend in (engine, runtime.open("sim")):
        kernels = make_kernels(backend, BASE, "dynamic")
        kernels.compile(params, Timer())
        seen.append(set())
        train_step(kernels, params, Where(params.zeros_like(), kernels), tokens, targets, Timer())
        kernels.close()
    main = threading.current_thread().name
    assert seen == [{"anekit-host"}, {main}]
    assert overlap_pays("ane") and not overlap_pays("sim")


def _whole_run(threads: int, tied: bool, overlap: bool, monkeypatch) -> object:
    from anekit.training.loop import TrainConfig, TrainState, train

    monkeypatch.setattr(step, "overlap_pays", lambda name: overlap)  # what train_step decides by default
    cfg = ModelConfig(64, 176, 2, 4, 2, 512, 64, name="tiny")

    class Windows:
        def batch(self, rng, seq_len):
            w = rng.integers(0, 40, seq_len + 1)
            return w[:-1], w[1:]

    state = TrainState.fresh(Params.init(cfg, seed=3, tied=tied), TrainConfig())
    tc = TrainConfig(steps=2, accum=4, lr=3e-3, weights="dynamic")
    train(runtime.open("sim"), state, Windows(), tc, threads=threads)
    return state


@pytest.mark.parametrize("tied", [True, False])
def test_whole_runs_on_one_and_two_threads_train_the_same_bits_with_each_its_own_queue(tied, monkeypatch):
    want = _whole_run(1, tied, False, monkeypatch)
    for threads in (1, 2):
        got = _whole_run(threads, tied, True, monkeypatch)
        assert got.losses == want.losses
        for (name, a), (_, b) in zip(want.params.tensors(), got.params.tensors()):
            assert np.array_equal(a, b), (threads, name)
        for (name, a), (_, b) in zip(want.adam_v.tensors(), got.adam_v.tensors()):
            assert np.array_equal(a, b), (threads, name)
    assert not [t for t in threading.enumerate() if t.name == "anekit-host"]


class _Failing(Gradients):
    """Raises ``error`` when layer 0's wq gradient is formed, recording the jobs run after it."""

    def __init__(self, grads: Params, kernels, error: BaseException) -> None:
        super().__init__(grads, kernels)
        self.error = error
        self.after: list[str] = []
        self.failed = False

    def matrix(self, layer, key, dy, x):
        if self.failed:
            self.after.append(f"{layer}.{key}")
        if (layer, key) == (0, "wq"):
            self.failed = True
            raise self.error
        super().matrix(layer, key, dy, x)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_error_in_a_host_job_reaches_the_caller_and_no_thread_is_left(overlap):
    params = _params(BASE, True, seed=9)
    kernels = make_kernels(runtime.open("sim"), BASE, "dynamic")
    kernels.compile(params, Timer())
    ((tokens, targets),) = _windows(BASE, 1, seed=10)
    try:
        own = OptionError("[test] an anekit error")
        sink = _Failing(params.zeros_like(), kernels, own)
        with pytest.raises(OptionError) as caught:
            train_step(kernels, params, sink, tokens, targets, Timer(), overlap=overlap)
        assert caught.value is own  # anekit's own error, as it was raised
        sink = _Failing(params.zeros_like(), kernels, ValueError("shapes disagree"))
        kind = HostJobFailed if overlap else ValueError  # inline: the step's error as it always was
        with pytest.raises(kind, match="shapes disagree") as caught_foreign:
            train_step(kernels, params, sink, tokens, targets, Timer(), overlap=overlap)
        if overlap:
            assert isinstance(caught_foreign.value, AnekitError)
            assert "layer 0 wq" in str(caught_foreign.value)
            assert isinstance(caught_foreign.value.__cause__, ValueError)
        assert sink.after == []  # no job ran after the failed one
    finally:
        kernels.close()
    assert not [t for t in threading.enumerate() if t.name == "anekit-host"]


def test_an_error_of_the_step_itself_leaves_no_thread_running():
    class Refusing:
        """Kernels whose SDPA backward 2 fails: the step raises with host jobs still queued."""

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def run(self, layer, name, **parts):
            if name == "sdpa_bwd2":
                raise OptionError("[test] the kernel failed")
            return self.inner.run(layer, name, **parts)

    params = _params(BASE, True, seed=11)
    kernels = make_kernels(runtime.open("sim"), BASE, "dynamic")
    kernels.compile(params, Timer())
    ((tokens, targets),) = _windows(BASE, 1, seed=12)
    try:
        with pytest.raises(OptionError, match="the kernel failed"):
            train_step(Refusing(kernels), params, params.zeros_like(), tokens, targets, Timer(), overlap=True)
    finally:
        kernels.close()
    assert not [t for t in threading.enumerate() if t.name == "anekit-host"]


@pytest.mark.parametrize("blas", [1, 2])
def test_a_job_s_products_run_on_the_blas_threads_the_caller_fixed(blas):
    from threadpoolctl import ThreadpoolController

    libs = [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
    if not libs:
        pytest.skip("no BLAS library threadpoolctl can control")
    counts: list[int] = []
    with fixed_blas(blas):
        jobs = HostQueue()
        jobs.submit("count", lambda: counts.append(libs[0].get_num_threads()))
        jobs.drain()
        jobs.close()
    assert counts == [blas]


def test_the_jobs_run_in_the_order_they_were_submitted_on_one_thread():
    order: list[tuple[int, str]] = []
    jobs = HostQueue()
    for i in range(200):
        jobs.submit(f"job {i}", lambda i=i: order.append((i, threading.current_thread().name)))
    jobs.drain()
    jobs.close()
    assert order == [(i, "anekit-host") for i in range(200)]
    assert not jobs.alive()


def test_lora_trains_the_same_adapters_with_its_products_on_the_host_thread(monkeypatch):
    from anekit.hf.adapters import Adapters, LoraSpec
    from anekit.training.loop import TrainConfig, TrainState, train
    from anekit.training.lora import LoraTrainable, frozen_base

    cfg = ModelConfig(64, 176, 2, 4, 2, 512, 64, name="tiny")

    class Windows:
        def batch(self, rng, seq_len):
            w = rng.integers(0, 40, seq_len + 1)
            return w[:-1], w[1:]

    results = []
    for overlap in (False, True):
        monkeypatch.setattr(step, "overlap_pays", lambda name, overlap=overlap: overlap)
        base = frozen_base(Params.init(cfg, seed=1))
        adapters = Adapters.init(LoraSpec(4, 8.0, ("q", "v", "down")), cfg, np.random.default_rng(2))
        tc = TrainConfig(steps=2, accum=2, lr=1e-2, weights="dynamic", weight_decay=0.0)
        state = TrainState(base, None, None)
        train(runtime.open("sim"), state, Windows(), tc, trainable=LoraTrainable(base, adapters))
        results.append((state.losses, adapters))
    (l1, a1), (l2, a2) = results
    assert l1 == l2
    assert all(np.array_equal(a1.a[k], a2.a[k]) and np.array_equal(a1.b[k], a2.b[k]) for k in a1.a)
    assert any(np.abs(b).max() > 0 for b in a1.b.values())
