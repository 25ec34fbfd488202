"""The training loop over several ranks (``anekit.training.distributed.order`` / ``ranks``): N ranks x
accumulation k train the bits of one process x accumulation N*k (weights, Adam moments, losses, loss
scale), for full training and LoRA, with one or two threads inside a rank; the blocks of the batch; the
agreed stop and compile-budget decisions; a diverged loss or a lost rank seen by every rank.

The ranks run as threads of this process over the in-process transport of ``distributed_fakes`` (every
message a copy). BLAS is held to one thread for the whole test: threads of one process share BLAS's
thread count, whose change alters a matmul's bits, and separate rank processes would not share it.
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from anekit import runtime
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params
from anekit.llama.step import StepResult
from anekit.training.distributed.order import buckets_of, local_micro, ordered_sum
from anekit.training.distributed.ranks import Ranks
from anekit.training.distributed.transport import DistributedError, LocalTransport, PeerLost
from anekit.training.loop import TrainConfig, TrainingDiverged, TrainState, train
from tests.distributed_fakes import Hub, run_ranks

CFG = ModelConfig(64, 176, 2, 4, 2, 512, 64, name="tiny")


@pytest.fixture(autouse=True)
def one_blas_thread(monkeypatch):
    monkeypatch.setattr("anekit.threads.USER_SET", True)  # the loop's own BLAS limits would race across ranks
    with threadpool_limits(limits=1, user_api="blas"):
        yield


class Windows:
    """Random windows (repeated tokens, so an embedding row gets several columns)."""

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        w = rng.integers(0, 40, seq_len + 1)
        return w[:-1], w[1:]


def _full(
    accum: int, transport=None, threads: int = 1, tied: bool = True, steps: int = 3, **kw
) -> TrainState:
    state = TrainState.fresh(Params.init(CFG, seed=3, tied=tied), TrainConfig())
    state.loss_scale = kw.pop("loss_scale", state.loss_scale)
    tc = TrainConfig(steps=steps, accum=accum, lr=3e-3, weights="dynamic")
    train(runtime.open("sim"), state, Windows(), tc, threads=threads, transport=transport, **kw)
    return state


def _same_state(one: TrainState, other: TrainState) -> None:
    assert other.losses == one.losses
    assert (other.step, other.adam_t, other.loss_scale) == (one.step, one.adam_t, one.loss_scale)
    for part in ("params", "adam_m", "adam_v"):
        for (name, a), (_, b) in zip(getattr(one, part).tensors(), getattr(other, part).tensors()):
            assert np.array_equal(a, b), (part, name)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("size,threads,k", [(2, 1, 2), (2, 2, 3), (3, 1, 2), (3, 2, 2)])
def test_n_ranks_train_the_bits_of_one_process(size, threads, k, tied):
    one = _full(size * k, tied=tied)
    ranks = run_ranks(size, lambda t: _full(size * k, t, threads, tied))
    for state in ranks:
        _same_state(one, state)
    assert all("comm" in state.seconds for state in ranks)


def test_skipped_steps_halve_the_loss_scale_on_every_rank_as_in_one_process():
    one = _full(4, loss_scale=2.0**40)  # every gradient out of the headroom: steps skipped, scale halved
    assert one.loss_scale < 2.0**40
    for state in run_ranks(2, lambda t: _full(4, t, loss_scale=2.0**40)):
        _same_state(one, state)


def _lora(accum: int, transport=None, threads: int = 1):
    from anekit.hf.adapters import Adapters, LoraSpec
    from anekit.training.lora import LoraTrainable, frozen_base

    base = frozen_base(Params.init(CFG, seed=1))
    adapters = Adapters.init(LoraSpec(4, 8.0, ("q", "v", "down")), CFG, np.random.default_rng(2))
    trainable = LoraTrainable(base, adapters)
    state = TrainState(base, None, None)
    tc = TrainConfig(steps=3, accum=accum, lr=1e-2, weights="dynamic", weight_decay=0.0)
    train(
        runtime.open("sim"), state, Windows(), tc, trainable=trainable, threads=threads, transport=transport
    )
    return state, trainable


@pytest.mark.parametrize("size,threads,k", [(2, 1, 2), (2, 2, 3), (3, 1, 2), (3, 2, 2)])
def test_n_ranks_train_the_lora_adapters_of_one_process(size, threads, k):
    one, mine = _lora(size * k)
    assert any(np.abs(b).max() > 0 for b in mine.adapters.b.values())
    for state, trainable in run_ranks(size, lambda t: _lora(size * k, t, threads)):
        assert state.losses == one.losses and state.loss_scale == one.loss_scale
        for key in mine.adapters.a:
            assert np.array_equal(trainable.adapters.a[key], mine.adapters.a[key]), key
            assert np.array_equal(trainable.adapters.b[key], mine.adapters.b[key]), key
        for name in mine.adam_m:
            assert np.array_equal(trainable.adam_m[name], mine.adam_m[name]), name
            assert np.array_equal(trainable.adam_v[name], mine.adam_v[name]), name


def test_the_blocks_cover_the_batch_once_in_rank_order():
    for size in range(1, 7):
        for accum in (size, 2 * size, 5 * size):
            blocks = [local_micro(rank, size, accum) for rank in range(size)]
            assert [i for b in blocks for i in b] == list(range(accum))
            assert {len(b) for b in blocks} == {accum // size}
    assert local_micro(1, 3, 6) == range(2, 4)


@pytest.mark.parametrize(
    "rank,size,accum,match",
    [
        (0, 3, 4, "4 sequences does not split over 3 ranks"),
        (2, 2, 4, "rank 2 is not one of the 2 ranks 0..1"),
        (-1, 2, 4, "rank -1 is not one"),
        (0, 0, 4, "world size must be a positive integer, got 0"),
        (0, 2, 0, "global batch must be a positive integer, got 0"),
        (0, 1, True, "global batch must be a positive integer, got True"),
    ],
)
def test_local_micro_refuses_what_does_not_split(rank, size, accum, match):
    with pytest.raises(DistributedError, match=match):
        local_micro(rank, size, accum)


def test_a_run_whose_batch_does_not_split_over_the_ranks_refuses_before_any_step():
    with pytest.raises(DistributedError, match="5 sequences does not split over 2 ranks"):
        run_ranks(2, lambda t: _full(5, t), peer=5.0)


def test_a_stop_asked_on_one_rank_stops_every_rank_after_the_same_step():
    stops = []
    for asking in (0, 1):

        def work(t, asking=asking):
            calls = [0]

            def should_stop() -> bool:
                calls[0] += 1
                return t.rank == asking and calls[0] == 3  # asked before the third step

            state = TrainState.fresh(Params.init(CFG, seed=3), TrainConfig())
            tc = TrainConfig(steps=5, accum=2, weights="dynamic")
            reason = train(runtime.open("sim"), state, Windows(), tc, should_stop=should_stop, transport=t)
            return reason, state.step

        stops.append(run_ranks(2, work, peer=5.0))
    assert stops == [[("stopped", 2)] * 2] * 2


def test_a_rank_short_of_compile_budget_stops_every_rank_for_a_restart():
    tc = TrainConfig(steps=4, accum=2, weights="baked")
    probe = runtime.open("sim", compile_budget=10**6)
    state = TrainState.fresh(Params.init(CFG, seed=3), TrainConfig())
    train(probe, state, Windows(), TrainConfig(steps=2, accum=1, weights="baked"))
    two_steps = probe.compile_count  # baked weights: every step compiles its kernels again

    def work(t):
        budget = two_steps if t.rank == 1 else 10**6
        state = TrainState.fresh(Params.init(CFG, seed=3), TrainConfig())
        return train(
            runtime.open("sim", compile_budget=budget), state, Windows(), tc, transport=t
        ), state.step

    assert run_ranks(2, work, peer=5.0) == [("budget", 2)] * 2


def test_a_loss_that_diverges_on_one_rank_stops_every_rank():
    def work(t):
        state = TrainState.fresh(Params.init(CFG, seed=3), TrainConfig())
        if t.rank == 1:
            state.params.rms_final[...] = np.nan  # this rank's sequences give a NaN loss
        tc = TrainConfig(steps=2, accum=4, weights="dynamic")
        try:
            train(runtime.open("sim"), state, Windows(), tc, transport=t)
        except TrainingDiverged as e:
            return str(e)
        return None

    lines = run_ranks(2, work, peer=5.0)
    assert lines[0] == lines[1]
    assert "loss is nan at step 0 (micro-step 2," in lines[0]


def test_a_rank_that_dies_is_named_by_the_rank_waiting_for_its_gradients():
    class Dies(Windows):
        def batch(self, rng, seq_len):
            raise RuntimeError("killed")

    def work(t):
        state = TrainState.fresh(Params.init(CFG, seed=3), TrainConfig())
        data = Dies() if t.rank == 1 else Windows()
        try:
            train(
                runtime.open("sim"),
                state,
                data,
                TrainConfig(steps=2, accum=2, weights="dynamic"),
                transport=t,
            )
        except PeerLost as e:
            return e.rank, e.what
        except RuntimeError as e:
            return str(e)

    assert run_ranks(2, work, peer=2.0) == [(1, "losses of step 1"), "killed"]


def test_every_rank_has_every_micro_batch_result_in_global_order():
    def work(t):
        ranks = Ranks(t, 6, _Summable())
        mine = [StepResult(float(i), i != 4, 0.5 * i) for i in ranks.micro]  # micro-batch 4 overflowed
        return ranks.gather(mine, 1)

    expected = [StepResult(float(i), i != 4, 0.5 * i) for i in range(6)]
    assert run_ranks(3, work) == [expected] * 3


def test_results_of_the_wrong_length_are_refused_naming_the_rank():
    def work(t):
        ranks = Ranks(t, 4, _Summable())
        mine = [StepResult(1.0, True)] * (3 if t.rank == 1 else 2)
        return ranks.gather(mine, 7)

    with pytest.raises(DistributedError, match="rank 1 sent 51 bytes of results for step 7, expected 34"):
        run_ranks(2, work)


class _Summable:
    """Two gradient tensors of float32; each buffer is a pair of arrays added a tensor at a time."""

    def __init__(self) -> None:
        self.total = [np.zeros(5, np.float32), np.zeros((2, 3), np.float32)]

    def zero(self) -> None:
        for t in self.total:
            t.fill(0.0)

    def gradient_tensors(self) -> list[np.ndarray]:
        return self.total

    def add_tensor(self, sink, index: int) -> None:
        self.total[index] += sink[index]


def test_small_tensors_travel_together_and_a_large_one_alone():
    arrays = [np.zeros(n, np.float32) for n in (5, 6, 25, 1, 1)]  # 20, 24, 100, 4, 4 bytes
    assert buckets_of(arrays, 48) == [[0, 1], [2], [3, 4]]
    assert buckets_of(arrays, 1) == [[0], [1], [2], [3], [4]]
    assert buckets_of(arrays, 10**6) == [[0, 1, 2, 3, 4]]
    assert buckets_of([], 48) == []


@pytest.mark.parametrize("limit", [1, 44, 4 << 20])
def test_the_chain_adds_in_micro_order_across_ranks(limit):
    """Values whose float32 sum depends on the order: the chain's result is the left fold, on every rank."""
    rng = np.random.default_rng(0)
    grads = [[(rng.standard_normal(5) * 10.0 ** rng.integers(-4, 8, 5)).astype(np.float32),
              (rng.standard_normal((2, 3)) * 10.0 ** rng.integers(-4, 8, (2, 3))).astype(np.float32)]
             for _ in range(6)]  # fmt: skip
    fold = [np.zeros(5, np.float32), np.zeros((2, 3), np.float32)]
    for g in grads:
        for j in range(2):
            fold[j] += g[j]
    reverse = [np.zeros(5, np.float32), np.zeros((2, 3), np.float32)]
    for g in reversed(grads):
        for j in range(2):
            reverse[j] += g[j]
    assert not all(np.array_equal(a, b) for a, b in zip(fold, reverse))  # the order shows in the bits

    def work(t):
        s = _Summable()
        block = local_micro(t.rank, t.size, 6)
        sinks = [grads[i] for i in block]
        if t.rank == 0:
            for g in sinks:
                for j in range(2):
                    s.total[j] += g[j]
            sinks = []
        ordered_sum(t, s, sinks, "gradients of step 1", limit)
        return s.total

    for size in (2, 3):
        for total in run_ranks(size, work):
            assert all(np.array_equal(a, b) for a, b in zip(total, fold))


def test_one_rank_sums_nothing_and_rank_0_keeps_no_buffers():
    s = _Summable()
    s.total[0][...] = 1.0
    ordered_sum(LocalTransport(), s, [], "gradients of step 1")
    assert np.array_equal(s.total[0], np.ones(5, np.float32))
    hub = Hub(2)
    with pytest.raises(DistributedError, match="rank 0 folds its sequences into its total itself"):
        ordered_sum(hub.transports()[0], s, [s.total], "gradients of step 1")


def test_a_trainable_without_gradient_tensors_is_refused_on_more_than_one_rank():
    class Plain:
        pass

    transport = Hub(2).transports()[0]
    with pytest.raises(DistributedError, match="Plain cannot be summed across ranks"):
        Ranks(transport, 4, Plain())
    assert Ranks(LocalTransport(), 4, Plain()).micro == range(4)


def test_the_fake_transport_copies_what_it_sends():
    hub = Hub(2)
    a, b = hub.transports()
    x = np.arange(4, dtype=np.float32)
    a.send([x], 1, "test")
    x[...] = -1.0
    got = np.zeros(4, np.float32)
    b.recv([got], 0, "test")
    assert np.array_equal(got, np.arange(4, dtype=np.float32))
    got[...] = 7.0
    assert np.array_equal(x, np.full(4, -1.0, np.float32))


def _blas_seen(monkeypatch) -> list[int]:
    """The BLAS thread counts the weight-gradient products run on, one per product, from now on."""
    from threadpoolctl import threadpool_info

    from anekit.llama.step import Gradients

    seen: list[int] = []
    matrix = Gradients.matrix

    def counted(self, *args):
        seen.append(next(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"))
        return matrix(self, *args)

    monkeypatch.setattr(Gradients, "matrix", counted)
    return seen


def test_a_fixed_blas_count_trains_the_same_bits_whatever_blas_started_with(monkeypatch):
    """A product's bits may depend on BLAS's thread count (OpenBLAS's split of a sum, by version and CPU);
    a run that fixes the count runs every product on it, whatever BLAS started with, so its bits are the
    same in any process."""
    seen = _blas_seen(monkeypatch)
    fixed = _full(4, blas_threads=2)  # this test's BLAS: one thread
    with threadpool_limits(limits=3, user_api="blas"):
        _same_state(fixed, _full(4, blas_threads=2))
    assert seen and set(seen) == {2}  # every product ran on the run's count, not the process's 1 or 3
    seen.clear()
    _full(4, blas_threads=1)
    assert seen and set(seen) == {1}


def test_a_sequence_runs_on_the_users_blas_count_when_set_else_on_its_share(monkeypatch):
    from anekit.models.config import preset
    from anekit.threads import cores
    from anekit.training.accumulate import sequence_blas

    with threadpool_limits(limits=3, user_api="blas"):
        assert (
            sequence_blas(preset("stories15M"), 1) == 3
        )  # the user's variable decides (this test's fixture)
    monkeypatch.setattr("anekit.threads.USER_SET", False)
    assert sequence_blas(CFG, 1) == 1  # small work: one thread
    assert sequence_blas(preset("stories15M"), 1) == cores()
    assert sequence_blas(preset("stories15M"), 2) == max(1, cores() // 2)


def test_one_rank_over_the_one_process_transport_trains_the_bits_of_no_transport():
    _same_state(_full(4), _full(4, LocalTransport()))


HF_SHAPES = {
    "qwen2": ModelConfig(64, 176, 2, 4, 2, 512, 64, qkv_bias=True, name="qwen2-tiny"),
    "qwen3": ModelConfig(64, 176, 2, 4, 2, 512, 64, qk_norm=True, attn_head_dim=32, name="qwen3-tiny"),
    "gemma3": ModelConfig(
        64,
        176,
        2,
        4,
        1,
        512,
        64,
        attn_head_dim=32,
        qk_norm=True,
        norm_offset=1.0,
        post_norms=True,
        mlp_act="gelu_tanh",
        embed_scale=8.0,
        attn_scale=32**-0.5,
        name="gemma3-tiny",
    ),
}


@pytest.mark.parametrize("family", sorted(HF_SHAPES))
def test_ranks_train_the_bits_of_one_process_for_hugging_face_layer_shapes(family, monkeypatch):
    """Biases, per-head q / k norms, post-norms and a scaled embedding: every kind of tensor."""
    monkeypatch.setitem(globals(), "CFG", HF_SHAPES[family])
    one = _full(4, tied=False)
    for state in run_ranks(2, lambda t: _full(4, t, 1, False)):
        _same_state(one, state)
