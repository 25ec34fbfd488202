"""Running a program from Python as ``anekit run`` does (``anekit.tools.run``): inputs loaded as their
declared types or drawn at random, timed runs from the same states, tensor summaries. Values are checked
against numpy float64 computed here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from anekit import runtime
from anekit.errors import AnekitError
from anekit.runtime.session import Session
from anekit.tools import loader, run
from tests.test_tools_loader import _program_with_weights


def test_a_program_runs_from_python_with_its_inputs_and_timings(tmp_path: Path) -> None:
    path, w = _program_with_weights(tmp_path / "k")
    loaded = loader.open_program(path)
    fn = loaded.program.functions["main"]
    x = np.random.default_rng(5).standard_normal((1, 64, 1, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    feeds = run.fill_inputs(fn, {"x": run.load_input(fn, "x", tmp_path / "x.npy")})
    np.testing.assert_array_equal(feeds["x"], x)
    with Session(loaded.program, dict(loaded.weights), runtime.open("sim")) as session:
        kernel = session.kernel(loaded.function)
        outputs, times = run.timed_runs(session, kernel, feeds, repeat=3)
    want = x.astype(np.float16).astype(np.float64) * w.astype(np.float64)
    np.testing.assert_allclose(outputs["y"], want, rtol=2e-3, atol=1e-3)
    timing = run.Timing.of(1.0, times)
    assert len(times) == 4 and timing.repeat == 3 and timing.first_run_ms == times[0]
    assert timing.run_ms == sorted(times[1:])[1]  # the median of the three warm runs


def test_inputs_not_given_are_drawn_or_refused(tmp_path: Path) -> None:
    path, _ = _program_with_weights(tmp_path / "k")
    fn = loader.open_program(path).program.functions["main"]
    drawn = run.fill_inputs(fn, {}, seed=7)["x"]
    np.testing.assert_array_equal(
        drawn, np.random.default_rng(7).standard_normal((1, 64, 1, 32)).astype(np.float32)
    )
    with pytest.raises(AnekitError, match=r"^\[t\] no value for input 'x' \(inputs: x: "):
        run.fill_inputs(fn, {}, where="[t]")
    np.save(tmp_path / "bad.npy", np.ones((2, 3), np.float32))
    with pytest.raises(AnekitError, match="cannot load input 'x'"):
        run.load_input(fn, "x", tmp_path / "bad.npy")


def test_summaries_count_what_is_not_finite() -> None:
    v = np.array([1.0, np.nan, np.inf, -np.inf, np.inf, 3.0], np.float32)
    assert run.nonfinite(v) == "1 NaN, 2 +inf, 1 -inf"
    assert run.nonfinite(np.arange(3)) == ""
    assert (
        run.summary("y", v) == "y: [6] float32  min 1  max 3  mean 2  NOT FINITE: 1 NaN, 2 +inf, 1 -inf of 6"
    )
    assert run.describe(v) == {
        "shape": [6],
        "dtype": "float32",
        "min": 1.0,
        "max": 3.0,
        "mean": 2.0,
        "not_finite": "1 NaN, 2 +inf, 1 -inf",
    }
