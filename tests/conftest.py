"""Shared test fixtures: the real-artifact corpus beside the project (skipped when absent), fp16 paths;
skipped tests summed up in one line per reason."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CORPUS = PROJECT_ROOT / ".." / "shared" / "corpus"
CORPUS_SAID = "../shared/corpus"  # how skip reasons name the corpus
EMPTY_PARAMETERS = "got empty parameter set"  # pytest's reason for a parametrize over corpus_files() == []


def corpus_path(*parts: str) -> Path:
    """A path inside the shared corpus; skips the test with a reason when the corpus is not there."""
    path = CORPUS.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"corpus file {'/'.join(parts)} not present (the corpus lives in ../shared/corpus)")
    return path


def corpus_files(folder: str, pattern: str) -> list[Path]:
    """Corpus files matching a glob, or [] when the corpus is absent (tests then skip)."""
    base = CORPUS / folder
    return sorted(base.glob(pattern)) if base.is_dir() else []


@pytest.fixture(autouse=True)
def _trials_memory_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The macOS backend's trial memory goes to a fresh file per test, never the user's cache."""
    from anekit.runtime.ane import memory

    path = tmp_path_factory.mktemp("trials") / memory.FILE_NAME
    monkeypatch.setattr(memory, "default_path", lambda: path)


@pytest.fixture(autouse=True)
def _fresh_engine_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh engine process: the process-wide compile count is zero (the harness
    keeps its own tally of what a real engine has compiled, ``tests.backend_harness.compiles_spent``), no
    program is loaded (``residency.RESIDENCY``), and the pause after a failed compile runs on a virtual
    clock (``pacing.PACER.clock``), never sleeping."""
    from anekit.runtime.ane import pacing, residency
    from anekit.runtime.base import PROCESS_COMPILES
    from tests.fake_objc import VirtualClock

    PROCESS_COMPILES.reset()
    clock = VirtualClock()
    monkeypatch.setattr(pacing, "PACER", pacing.CompilePacer(clock=clock, sleep=clock.sleep))
    monkeypatch.setattr(residency, "RESIDENCY", residency.Residency())


@pytest.fixture(autouse=True)
def _no_ranks_left_behind() -> Iterator[None]:
    """After a test that started ranks (tests/distributed_ranks.py), nothing of them runs on."""
    yield
    import sys

    ranks = sys.modules.get("distributed_ranks") or sys.modules.get("tests.distributed_ranks")
    if ranks is not None:
        ranks.end_leftovers()


@pytest.fixture(scope="module", params=["jit", "numpy"])
def fp16_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a module's tests twice: with anekit.jit's compiled loops, and with the numpy paths alone.

    Both must give the same bits; the jit run skips when numba is not installed.
    """
    from anekit import jit

    saved = os.environ.get("ANEKIT_JIT")
    os.environ["ANEKIT_JIT"] = "1" if request.param == "jit" else "0"
    jit.reset()
    try:
        if request.param == "jit" and not jit.available():
            pytest.skip("numba is not installed (the `fast` extra): only the numpy paths are tested")
        yield request.param
    finally:
        if saved is None:
            os.environ.pop("ANEKIT_JIT", None)
        else:
            os.environ["ANEKIT_JIT"] = saved
        jit.reset()


def _skip_reason(report: pytest.TestReport) -> str:
    """A skipped test's reason as one line; every reason that comes from the corpus's absence as one."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if CORPUS_SAID in reason or (reason.startswith(EMPTY_PARAMETERS) and not CORPUS.is_dir()):
        where = "is not beside the project" if not CORPUS.is_dir() else "lacks the files they read"
        return (
            f"they read real artifacts from {CORPUS_SAID} (public files, each listed with its origin in its "
            f"SOURCES.md), which {where}"
        )
    return reason


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """One line per skip reason, with its count, unless pytest lists every skip itself (``-rs``, ``-ra``)."""
    if set(config.option.reportchars) & set("saA"):
        return
    reasons = Counter(_skip_reason(r) for r in terminalreporter.stats.get("skipped", []))
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count} skipped: {reason} (pytest -rs lists each)")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A per-test user cache (ANEKIT_CACHE): what the built-in tokenizer trained (or not) shows in it."""
    path = tmp_path / "cache"
    monkeypatch.setenv("ANEKIT_CACHE", str(path))
    return path


# -- the objc fake (tests/fake_objc.py) for the macOS backend's tests -----------------------------------


@pytest.fixture
def tmpdir_ns(tmp_path: Path) -> Path:
    """The fake's NSTemporaryDirectory(): a fresh folder."""
    path = tmp_path / "T"
    path.mkdir()
    return path


@pytest.fixture
def fake(tmpdir_ns: Path) -> Iterator[object]:
    """A fake objc runtime that must end with no call that would crash, leak or break a rule on a real
    system."""
    from tests.fake_objc import FakeObjC

    f = FakeObjC(tmpdir_ns)
    yield f
    assert f.errors == [], "the fake saw calls that crash, leak or break a rule on a real system"
