"""The sequences of a batch on several threads (``anekit.training.accumulate``): the same checkpoint, bit for
bit, as one thread, for full training (tied and untied classifiers) and for LoRA; a worker's error
reaches the caller."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params
from anekit.training.loop import TrainConfig, TrainState, train

CFG = ModelConfig(64, 176, 2, 4, 2, 512, 64, name="tiny")


class Windows:
    """Random windows (repeated tokens included, so an embedding row gets several columns)."""

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        w = rng.integers(0, 40, seq_len + 1)
        return w[:-1], w[1:]


def _run(threads: int, tied: bool, steps: int = 3) -> TrainState:
    state = TrainState.fresh(Params.init(CFG, seed=3, tied=tied), TrainConfig())
    tc = TrainConfig(steps=steps, accum=4, lr=3e-3, weights="dynamic")
    train(runtime.open("sim"), state, Windows(), tc, threads=threads)
    return state


@pytest.mark.parametrize("tied", [True, False])
def test_two_and_three_threads_train_the_same_bits_as_one(tied):
    one = _run(1, tied)
    for threads in (2, 3):
        many = _run(threads, tied)
        assert many.losses == one.losses
        for (name, a), (_, b) in zip(one.params.tensors(), many.params.tensors()):
            assert np.array_equal(a, b), (threads, name)
        for (name, a), (_, b) in zip(one.adam_v.tensors(), many.adam_v.tensors()):
            assert np.array_equal(a, b), (threads, name)


def test_lora_on_threads_trains_the_same_adapters_as_one_thread():
    from anekit.hf.adapters import Adapters, LoraSpec
    from anekit.training.lora import LoraTrainable, frozen_base

    results = []
    for threads in (1, 2):
        base = frozen_base(Params.init(CFG, seed=1))
        adapters = Adapters.init(LoraSpec(4, 8.0, ("q", "v", "down")), CFG, np.random.default_rng(2))
        trainable = LoraTrainable(base, adapters)
        state = TrainState(base, None, None)
        tc = TrainConfig(steps=3, accum=4, lr=1e-2, weights="dynamic", weight_decay=0.0)
        train(runtime.open("sim"), state, Windows(), tc, trainable=trainable, threads=threads)
        results.append((state.losses, adapters))
    (l1, a1), (l2, a2) = results
    assert l1 == l2
    assert all(np.array_equal(a1.a[k], a2.a[k]) and np.array_equal(a1.b[k], a2.b[k]) for k in a1.a)
    assert any(np.abs(b).max() > 0 for b in a1.b.values())


def test_an_error_in_a_worker_thread_reaches_the_caller():
    class Broken(Windows):
        def batch(self, rng, seq_len):
            tokens, targets = super().batch(rng, seq_len)
            targets[0] = 10**6  # outside the vocabulary: the loss refuses it
            return tokens, targets

    state = TrainState.fresh(Params.init(CFG, seed=3), TrainConfig())
    with pytest.raises(AnekitError, match="must lie in"):
        train(
            runtime.open("sim"), state, Broken(), TrainConfig(steps=1, accum=4, weights="dynamic"), threads=2
        )
    assert state.step == 0


def test_the_optimizer_in_chunks_on_threads_updates_the_same_bits(monkeypatch):
    from anekit.training import optimizer as trainer

    one = _run(1, tied=True, steps=2)
    monkeypatch.setattr(trainer, "ADAM_CHUNK", 1000)  # every matrix split over the threads
    many = _run(2, tied=True, steps=2)
    for (name, a), (_, b) in zip(one.params.tensors(), many.params.tensors()):
        assert np.array_equal(a, b), name


class _ZeroedTotal:
    """``FullTrainable`` as it was: the total zeroed before every batch and every gradient added to it."""

    def __init__(self, state: TrainState) -> None:
        from anekit.training.trainable import FullTrainable

        self.inner = FullTrainable(state)
        self.params, self.grads = self.inner.params, self.inner.grads

    def zero(self) -> None:
        for _, g in self.grads.tensors():
            g.fill(0.0)

    def sink(self, kernels: object) -> object:
        from anekit.llama.step import Gradients

        return Gradients(self.grads, kernels)  # type: ignore[arg-type]

    def worker_sink(self, kernels: object) -> object:
        return self.inner.worker_sink(kernels)

    def add(self, sink: object) -> None:
        sink.add_to(self.grads)  # type: ignore[attr-defined]

    def unscale(self, factor: float) -> bool:
        return self.inner.unscale(factor)

    def apply(self, state: TrainState, tc: TrainConfig, threads: int = 1) -> None:
        self.inner.apply(state, tc, threads)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_writing_the_first_gradient_trains_the_bits_of_adding_it_to_zeros(tied, threads):
    """A batch's first sequence writes its gradients into the total instead of adding them to zeros: the
    weights and both moments come out the same, bit for bit (a zero's sign is all that can differ in the
    gradient, and Adam cannot see it)."""
    tc = TrainConfig(steps=3, accum=3, lr=3e-3, weights="dynamic")
    states = []
    for zeroed in (False, True):
        state = TrainState.fresh(Params.init(CFG, seed=4, tied=tied), TrainConfig())
        trainable = _ZeroedTotal(state) if zeroed else None
        train(runtime.open("sim"), state, Windows(), tc, threads=threads, trainable=trainable)
        states.append(state)
    new, old = states
    assert new.losses == old.losses
    for part in ("params", "adam_m", "adam_v"):
        for (name, a), (_, b) in zip(getattr(new, part).tensors(), getattr(old, part).tensors()):
            assert np.array_equal(a, b), (part, name)


def test_the_optimizer_takes_every_core_for_a_model_of_several_chunks_and_one_thread_for_a_small_one(
    monkeypatch,
):
    from anekit.training import optimizer as trainer

    monkeypatch.setattr(trainer, "cores", lambda: 4)
    chunk = trainer.ADAM_CHUNK
    assert trainer.update_threads(1, 15_191_712) == 4  # stories15M: 14 chunks
    assert trainer.update_threads(1, 5 * chunk) == 4
    assert trainer.update_threads(1, 3 * chunk) == 1  # under 4 chunks: threads cost more than they give
    assert trainer.update_threads(2, 3 * chunk) == 2  # never fewer than the step's workers
    assert trainer.update_threads(8, 100 * chunk) == 8
    monkeypatch.setattr(trainer, "cores", lambda: 16)
    assert trainer.update_threads(1, 6 * chunk) == 6  # at most a thread a chunk
    monkeypatch.setattr(trainer, "cores", lambda: 1)
    assert trainer.update_threads(1, 100 * chunk) == 1  # one core (taskset): one thread
