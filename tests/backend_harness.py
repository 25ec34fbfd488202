"""The per-backend test harness: one set of cases runs over every backend in ``anekit.runtime.BACKENDS``.

A test module binds the fixtures (an assignment, so ruff sees no redefined import) and writes each
case once::

    from tests import backend_harness as harness

    target, backend, make_backend, reference_backend = (
        harness.target, harness.backend, harness.make_backend, harness.reference_backend
    )

    def test_something(backend, reference_backend):
        got = spec.run(backend, x=x)
        want = spec.run(reference_backend, x=x)
        assert_close(got["y"], want["y"], tolerance(backend.name), "y")

``target`` is parametrised over every known backend name, plus stand-ins: a real backend driven
through a fake of what it talks to (``ane-fake``: the ane backend over ``tests/fake_objc.py``, whose
engine runs the simulator), so its code runs every case on any machine. A target that cannot run
here is skipped with the reason (the backend module's ``unavailable_reason()`` when it has one).
``backend`` is a fresh instance per test (compile count 0); ``make_backend(**options)`` makes more
(e.g. with a small ``compile_budget``); ``reference_backend`` is what results are compared with: the
simulator, or, for the simulator itself, the simulator in fp32 precision (no fp16 rounding between
ops). Adding a backend to ``BACKENDS`` adds it to every case.

After each case on a stand-in, the fake must have seen nothing that would crash or leak on a real
system (its ``errors``: unknown selectors, over-releases, autoreleases with no pool, ...), and once
the case's kernels are gone every object the backend retained must have been released.

A real engine process manages only about ``DEFAULT_COMPILE_BUDGET`` compiles before it must restart,
and the budget is shared by every backend instance of the process: the harness counts the compiles
of every backend it created and, for targets with such a process limit, skips the remaining cases
with a reason once the limit is near instead of letting them fail with CompileBudgetExhausted.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anekit import runtime
from anekit.runtime import DEFAULT_COMPILE_BUDGET, Backend

REFERENCE = "sim"

# Why a backend is skipped when its module gives no reason of its own.
DEFAULT_REASONS = {"ane": "ane needs macOS on Apple silicon with the AppleNeuralEngine framework"}

# Targets whose compiles draw on a per-process budget of the engine (not only on the instance's own).
PROCESS_COMPILE_LIMIT = {"ane": DEFAULT_COMPILE_BUDGET}
# Compiles kept in reserve for the case about to start (the most any single case of the suite needs).
COMPILE_RESERVE = 8

# Largest max|got - want| / max|want| accepted for a whole kernel output. The simulator's kernels are
# within ~2e-3 of their float64 references (fp16 storage, fp32 accumulation); another backend may round
# differently inside an op (exp, reciprocal square root, accumulation order): ten fp16 ulps of the
# largest value.
TOLERANCE = {"sim": 5e-3}
DEFAULT_TOLERANCE = 1e-2
# Stand-ins whose engine is the simulator itself: their outputs must equal the simulator's bit for bit.
SAME_BITS_AS_REFERENCE = {"ane-fake"}


@dataclass(frozen=True)
class Target:
    """One parametrisation: a backend ``name`` and how to make one (``tmp`` is a scratch directory)."""

    id: str
    name: str
    make: Callable[[Path, dict[str, Any]], Backend]
    stand_in: bool = False


def _open(name: str) -> Callable[[Path, dict[str, Any]], Backend]:
    return lambda tmp, options: runtime.open(name, **options)


def _ane_over_fake_objc(tmp: Path, options: dict[str, Any]) -> Backend:
    from anekit.runtime.ane import AneBackend
    from tests.fake_objc import FakeObjC

    fake = FakeObjC(tmp)
    backend = AneBackend(runtime=fake.runtime(), **options)
    backend._harness_fake = fake  # type: ignore[attr-defined]  # checked after the case
    return backend


TARGETS: dict[str, Target] = {
    **{name: Target(name, name, _open(name)) for name in runtime.BACKENDS},
    "ane-fake": Target("ane-fake", "ane", _ane_over_fake_objc, stand_in=True),
}
BACKEND_NAMES: tuple[str, ...] = tuple(runtime.BACKENDS)

_created: dict[str, list[Backend]] = {}


def unavailable_reason(name: str) -> str | None:
    """None when backend ``name`` runs here; otherwise why not (the module's own words when it says)."""
    if name in runtime.available():
        return None
    default = DEFAULT_REASONS.get(name, f"backend '{name}' is not available on this machine")
    try:
        module = importlib.import_module(runtime.BACKENDS[name][0])
    except ImportError as e:
        return f"{default} (its module does not import: {e})"
    explain = getattr(module, "unavailable_reason", None)
    reason = explain() if callable(explain) else None
    return str(reason) if reason else default


def _stand_in_reason(target: Target) -> str | None:
    try:
        importlib.import_module(runtime.BACKENDS[target.name][0])
        importlib.import_module("tests.fake_objc")
    except ImportError as e:
        return f"{target.id}: the backend or its fake does not import: {e}"
    return None


def compiles_spent(target_id: str) -> int:
    """Compiles done so far in this process by every backend of ``target_id`` the harness created."""
    return sum(b.compiles_made for b in _created.get(target_id, []))


def skip_reason(target_id: str) -> str | None:
    """Why the cases of a target are skipped now (unavailable, or its process budget nearly spent)."""
    target = TARGETS[target_id]
    reason = _stand_in_reason(target) if target.stand_in else unavailable_reason(target.name)
    if reason is not None:
        return reason
    limit = PROCESS_COMPILE_LIMIT.get(target_id)
    if limit is not None and compiles_spent(target_id) + COMPILE_RESERVE > limit:
        return (
            f"{target_id}: this process has used {compiles_spent(target_id)} of the engine's ~{limit} "
            "compiles; run the remaining cases in a fresh process (pytest -k)"
        )
    return None


def open_backend(target_id: str, tmp: Path, **options: Any) -> Backend:
    """A new backend of ``target_id``, counted against the process's compile tally."""
    b = TARGETS[target_id].make(tmp, options)
    _created.setdefault(target_id, []).append(b)
    return b


def tolerance(name: str) -> float:
    """The relative tolerance (of the output's max-abs) for a kernel's outputs on backend ``name``."""
    return TOLERANCE.get(name, DEFAULT_TOLERANCE)


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (0 when both are all zero)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    return err / scale if scale else err


def assert_close(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    """Same shape, all finite, and ``rel_error(got, want) <= tol``; the message names the worst element."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)}, expected {list(want.shape)}"
    assert np.all(np.isfinite(got)), f"{what}: {int(np.sum(~np.isfinite(got)))} non-finite values"
    err = rel_error(got, want)
    if err > tol:
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        at = np.unravel_index(int(np.argmax(diff)), diff.shape)
        raise AssertionError(
            f"{what}: relative error {err:.2e} > {tol:.1e}; worst at {tuple(int(i) for i in at)}: "
            f"got {float(got[at])!r}, expected {float(want[at])!r}"
        )


def assert_fp16_close(got: np.ndarray, want: np.ndarray, what: str = "output") -> None:
    """Elementwise agreement to fp16 precision: within 2 ulps (relative 2^-9) or 1e-3 absolute."""
    got64, want64 = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    np.testing.assert_allclose(got64, want64, rtol=2**-9, atol=1e-3, err_msg=what)


@pytest.fixture(params=list(TARGETS), ids=lambda target_id: target_id)
def target(request: pytest.FixtureRequest) -> Target:
    """Each backend (and stand-in) in turn; skipped, with the reason, where it cannot run."""
    reason = skip_reason(request.param)
    if reason is not None:
        pytest.skip(reason)
    return TARGETS[request.param]


@pytest.fixture
def make_backend(
    request: pytest.FixtureRequest, target: Target, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Backend]]:
    """``make_backend(**options)``: a new backend of the target; stand-ins' fakes are checked afterwards."""
    made: list[Backend] = []
    failed_before = request.session.testsfailed

    def make(**options: Any) -> Backend:
        b = open_backend(target.id, tmp_path_factory.mktemp(target.id), **options)
        made.append(b)
        return b

    yield make
    gc.collect()  # kernels the case dropped are released now, through the fake
    for b in made:
        fake = getattr(b, "_harness_fake", None)
        if fake is None:
            continue
        assert not fake.errors, f"{target.id}: the fake runtime saw {fake.errors}"
        if request.session.testsfailed == failed_before:  # a failed case's traceback keeps kernels alive
            live = [f"{o.cls} (retain count {o.rc})" for o in fake.live_objects()]
            assert not live, f"{target.id}: objects never released once every kernel is gone: {live}"


@pytest.fixture
def backend(make_backend: Callable[..., Backend]) -> Backend:
    """A fresh backend of each available kind (default options), compile count 0."""
    return make_backend()


@pytest.fixture
def reference_backend(target: Target) -> Backend:
    """What results on ``backend`` are compared with: the simulator, or the fp32 simulator for "sim"."""
    if target.name == REFERENCE:
        return runtime.open(REFERENCE, precision="fp32")
    return runtime.open(REFERENCE)
