"""Generation on the macOS backend, driven through the fake engine (tests/fake_objc.py): the rules bite.

The fake binds surfaces as the engine was measured to (alphabetically by MIL name, one allocation size per
direction, packed data, rows of 64 bytes or more: mechramc/Orion docs/ane_constraints.md) and refuses what
hardware refused (state ops on the direct route: sbryngelson/ane-guide part-4-workloads/14-llm-case-study.md,
"Two residency mechanisms"). A generation kernel has two inputs ("x" and "cache", declared in that order,
bound in the other) whose sizes differ, so it is the case those rules were written for.
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit.errors import CompilationFailed
from anekit.mil import Builder, StateType, tensor
from anekit.mil.printer import print_program
from anekit.runtime.ane import AneBackend, lifecycle
from anekit.runtime.ane.lifecycle import EngineModel
from anekit.runtime.sim import SimBackend

S = 32  # rows of 64 bytes in fp16: the smallest width the engine runs (rule surface.min-row-bytes)
C = 64


def _cache_program(stateful: bool):
    """out = 2 (cache + x), the cache a ``state<>`` input updated in the graph (CoreML's form) or a plain
    input the host writes (the direct route's form)."""
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, C, 1, S]))
    if stateful:
        cache = f.input("cache", StateType(tensor("fp16", [1, C, 1, S])))
        total = f.coreml_update_state(state=cache, value=f.add(x=f.read_state(input=cache), y=x))
    else:
        cache = f.input("cache", tensor("fp16", [1, C, 1, S]))
        total = f.add(x=cache, y=x, name="total")
    f.output(f.mul(x=total, y=2.0, name="out"))
    return b.build()


@pytest.fixture
def backend(fake, monkeypatch):
    monkeypatch.setattr(lifecycle, "LOAD_RETRY_DELAY", 0.0)
    return AneBackend(runtime=fake.runtime(), dialect="ios18")


def test_a_state_op_in_a_direct_route_program_is_refused(fake, backend):
    """The backend refuses a state<> input before anything reaches the engine; the fake engine, given the
    text anyway, refuses it at compile as the unentitled backend does; the same program with the cache as
    a plain input (what the generation kernels do) compiles and runs."""
    stateful = _cache_program(stateful=True)
    with pytest.raises(CompilationFailed, match=r"'cache' has type state<"):
        backend.compile(stateful)
    assert fake.sent() == []  # refused before any message to the engine
    engine = EngineModel(fake.runtime(), "main", 21, None, None)
    with pytest.raises(CompilationFailed, match=r"ANECCompile\(\) FAILED: state input 'cache', "):
        engine.compile(print_program(stateful, dialect="ios18"), {})
    engine.close()
    rng = np.random.default_rng(0)
    x, cache = (rng.standard_normal((1, C, 1, S)).astype(np.float32) for _ in range(2))
    plain = _cache_program(stateful=False)
    with backend.compile(plain) as k:
        got = k(x=x, cache=cache)["out"]
    want = 2 * (cache.astype(np.float16).astype(np.float64) + x.astype(np.float16).astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(got, SimBackend().compile(plain)(x=x, cache=cache)["out"])
