"""Running one program as ``anekit run`` does: its inputs (loaded as their declared types, or drawn at
random), timed runs that all start from the same states, and a summary of every tensor.

The program is opened by ``anekit.tools.loader.open_program`` and run through a
``anekit.runtime.session.Session`` (its states kept across calls); compile, the first run (which includes
one-time setup) and the median of the warm runs are timed apart.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from anekit import mil, runtime
from anekit.errors import AnekitError
from anekit.inputs import load_npy
from anekit.mil import types as T

if TYPE_CHECKING:
    from anekit.runtime.session import Session


@dataclass(frozen=True)
class Timing:
    """What a run took: compiling, the first run (one-time setup included) and the median warm run."""

    compile_ms: float
    first_run_ms: float
    run_ms: float
    repeat: int  # warm runs timed

    @staticmethod
    def of(compile_ms: float, times: list[float]) -> Timing:
        """From the compile time and ``timed_runs``' times (the first run, then the warm ones)."""
        return Timing(compile_ms, times[0], statistics.median(times[1:]), len(times) - 1)


def load_input(fn: mil.Function, name: str, file: str | Path, where: str = "[run]") -> np.ndarray:
    """The input ``name`` of ``fn`` from the .npy file ``file``. The declared type decides before loading:
    the shape, and the dtypes taken (``anekit.inputs``: an integer or bool array for a float input is
    refused, never cast to fp16 without a word)."""
    var = next((v for v in fn.inputs if v.name == name), None)
    shape = getattr(var.type, "shape", None) if var is not None else None
    dt = getattr(var.type, "dtype", None) if var is not None else None
    expect = tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None
    kind = dt.kind if dt is not None and dt.kind in ("int", "uint", "bool") else "float"
    limits = dt.int_range() if dt is not None and kind in ("int", "uint") else None
    return load_npy(file, f"{where} cannot load input '{name}' from", expect, kind=kind, int_range=limits)


def fill_inputs(
    fn: mil.Function,
    given: Mapping[str, np.ndarray],
    seed: int | None = None,
    where: str = "[run]",
    hint: str = "",
) -> dict[str, np.ndarray]:
    """``given``, and every other tensor input of ``fn`` drawn from N(0, 1) with ``seed`` (None: none is
    drawn, and an input not given is refused, naming the inputs; its message ends with ``hint``). States
    are not inputs: they start at zero or from saved states."""
    feeds = dict(given)
    rng = np.random.default_rng(seed)
    tensors = [v for v in fn.inputs if not isinstance(v.type, T.StateType)]
    for v in tensors:
        if v.name not in feeds:
            if seed is None or not isinstance(v.type, (T.TensorType, T.TensorBufferType)):
                need = ", ".join(f"{x.name}: {x.type}" for x in tensors)
                raise AnekitError(f"{where} no value for input '{v.name}' (inputs: {need}){hint}")
            feeds[v.name] = rng.standard_normal([int(d) for d in v.type.shape]).astype(np.float32)
    return feeds


def timed_runs(
    session: Session, kernel: runtime.Kernel, feeds: dict[str, np.ndarray], repeat: int, sanitizer: Any = None
) -> tuple[dict[str, np.ndarray], list[float]]:
    """The outputs, and the times in ms of the first run (one-time setup included) and ``repeat`` warm
    runs; every run starts from the states the session had, so the states left are those of one call.
    The sanitizer counts the warm runs (the first computes the same values)."""
    start = {name: buf.copy() for name, buf in session.states.items()}
    times = []
    for i in range(1 + repeat):
        if i:
            session.load_states(start)
        if i == 1 and sanitizer is not None:
            sanitizer.clear()
        t0 = time.perf_counter()
        outputs = kernel(**feeds)
        times.append(1e3 * (time.perf_counter() - t0))
    return outputs, times


def nonfinite(value: np.ndarray) -> str:
    """ "" for an array of finite numbers, else how many of its values are NaN, +inf and -inf."""
    if not value.size or value.dtype.kind not in "fc":
        return ""
    counts = {
        "NaN": int(np.isnan(value).sum()),
        "+inf": int(np.isposinf(value).sum()),
        "-inf": int(np.isneginf(value).sum()),
    }
    return ", ".join(f"{n} {label}" for label, n in counts.items() if n)


def summary(name: str, value: np.ndarray) -> str:
    """One line: shape, dtype, range and mean of the finite values, and the count of the others."""
    line = f"{name}: {list(value.shape)} {value.dtype}"
    if value.size and value.dtype.kind == "f":
        finite = value[np.isfinite(value)]
        if finite.size:
            # float64 sums: a float16 mean of large finite values would itself overflow to inf
            mean = finite.astype(np.float64).mean()
            line += f"  min {finite.min():.4g}  max {finite.max():.4g}  mean {mean:.4g}"
    bad = nonfinite(value)
    if bad:
        line += f"  NOT FINITE: {bad} of {value.size}"
    return line


def describe(value: np.ndarray) -> dict[str, object]:
    """A tensor as JSON: shape, dtype, range and mean of its finite values, and the count of the others."""
    v = np.asarray(value)
    finite = v[np.isfinite(v)] if v.dtype.kind == "f" else v
    out: dict[str, object] = {"shape": list(v.shape), "dtype": str(v.dtype)}
    if finite.size:
        out.update(
            min=float(finite.min()), max=float(finite.max()), mean=float(finite.astype(np.float64).mean())
        )
    bad = nonfinite(v)
    if bad:
        out["not_finite"] = bad
    return out


def report(
    program: str,
    backend: runtime.Backend,
    timing: Timing,
    feeds: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
    states: Mapping[str, np.ndarray],
    sanitizer: Any = None,
) -> dict[str, object]:
    """The run as one JSON-ready dict (``program``: how the run names it)."""
    return {
        "program": program,
        "backend": backend.name,
        "chip": getattr(backend, "chip", None),
        "numerics": getattr(backend, "numerics", None),
        "compile_ms": timing.compile_ms,
        "first_run_ms": timing.first_run_ms,
        "run_ms": timing.run_ms,
        "repeat": timing.repeat,
        "inputs": {name: describe(np.asarray(v)) for name, v in feeds.items()},
        "outputs": {name: describe(v) for name, v in outputs.items()},
        "states": {name: describe(v) for name, v in states.items()},
        "sanitizer": None if sanitizer is None else sanitizer.records(),
    }
