"""runtime.sim.heap: glibc's heap tuned once per process, a no-op elsewhere or when switched off."""

from __future__ import annotations

import platform

import pytest

from anekit import runtime
from anekit.runtime.sim import heap


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_done", False)
    monkeypatch.setenv("ANEKIT_KEEP_HEAP", "0")
    assert heap.keep_freed_memory() is False
    assert heap._done is False


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)
def test_tuned_on_glibc_when_a_simulator_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_done", False)
    monkeypatch.delenv("ANEKIT_KEEP_HEAP", raising=False)
    runtime.open("sim")
    assert heap._done is True
    assert heap.keep_freed_memory() is True  # once per process: later calls only report it
