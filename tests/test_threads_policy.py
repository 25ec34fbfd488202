"""BLAS's thread count is chosen per task (``anekit.threads``): limited inside, restored after, never
changed when the user set it; threads by default only where a sequence is enough work."""

from __future__ import annotations

import pytest

from anekit import threads
from anekit.kernels import preset
from anekit.training.accumulate import THREADS_MIN_FLOPS, blas_share, default_threads, sequence_flops


def _blas() -> list[int]:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_a_limit_holds_inside_and_is_undone_after(monkeypatch):
    monkeypatch.setattr(threads, "USER_SET", False)
    before = _blas()
    with threads.blas_threads(1):
        assert all(n == 1 for n in _blas())
    assert _blas() == before


def test_a_count_the_user_set_is_left_alone(monkeypatch):
    monkeypatch.setattr(threads, "USER_SET", True)
    before = _blas()
    with threads.blas_threads(1):
        assert _blas() == before


def test_small_models_train_on_one_thread_large_ones_on_every_core(monkeypatch):
    from anekit.training import accumulate

    monkeypatch.setattr(accumulate, "cores", lambda: 8)
    small, large = preset("default"), preset("stories15M")
    assert sequence_flops(small) < THREADS_MIN_FLOPS < sequence_flops(large)
    assert default_threads("sim", "dynamic", 4, small) == 1 and blas_share(small, 1) == 1
    assert default_threads("sim", "dynamic", 4, large) == 4 and blas_share(large, 4) == 2
    assert default_threads("sim", "dynamic", 16, large) == 8
    assert default_threads("sim", "baked", 4, large) == 1 and default_threads("ane", "dynamic", 4, large) == 1


def test_sampling_shares_blas_for_large_models_or_a_large_classifier(monkeypatch):
    """stories15M (15M weights) has a 32000 x 288 classifier: its decode step ran 6.0 -> 4.6 ms on two BLAS
    threads here; stories260K's 512 x 64 one gains nothing, and a 110M-weight model always shares."""
    from anekit.llama import Params

    monkeypatch.setattr(threads, "cores", lambda: 8)
    assert threads.for_sampling(None) == 1
    assert threads.for_sampling(Params.init(preset("stories260K"))) == 1
    assert threads.for_sampling(Params.init(preset("default"))) == 1
    stories15m = Params.init(preset("stories15M"))
    assert stories15m.count() < threads.SAMPLING_MIN_WEIGHTS
    assert stories15m.classifier.size >= threads.SAMPLING_MIN_MATRIX
    assert threads.for_sampling(stories15m) == 8
