"""On a Mac: run a package through CoreML (law 2's compute unit) and check its residency (law 6).

``predict(package, inputs, compute_units="cpu_and_ne")`` loads one function of the package with
coremltools' ``MLModel`` on ``compute_units`` (law 2 says CPU_AND_NE, not ALL, so nothing silently moves
to the GPU) and runs it. The function is ``function`` or the package's default (``anekit export`` writes
``prefill`` and ``decode``, ``decode`` the default). Its inputs are checked against the function's own
description (every name, no other; each array cast to the declared dtype, reshaped when only its shape
differs: ``pos=3`` is ``[1, 1, 1, 1]`` int32), so the README's plain numpy arrays and integers work.

A stateful function (the KV caches of ``prefill`` / ``decode``) runs on ``state``, an ``MLState`` from
``make_state`` that carries the caches from one call to the next, or on a fresh zeroed one. A package
with several functions keeps its states in each ``FunctionDescription``, not in the model's top-level
description, which is where the states are looked for here. ``open_function`` keeps the loaded model
for many calls (``anekit.generate.coreml_decoder`` drives ``prefill`` and ``decode`` on one state).

``check_residency`` is law 6's gate: MLComputePlan (coremltools' ``MLComputePlan.load_from_path``) must
prefer the Neural Engine for every ``conv`` of every function; compile success proves nothing. Off macOS
(or without coremltools) every entry point raises ``NotOnMac`` saying why, in one line.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anekit.errors import AnekitError, install_hint

COMPUTE_UNITS = {
    "cpu_and_ne": "CPU_AND_NE",
    "cpu_only": "CPU_ONLY",
    "cpu_and_gpu": "CPU_AND_GPU",
    "all": "ALL",
}

# FeatureTypes.proto ArrayFeatureType.ArrayDataType values -> numpy (the proto's own numbering).
ARRAY_DTYPES: dict[int, type[np.generic]] = {
    65552: np.float16,  # FLOAT16 = 0x10000 | 16
    65568: np.float32,  # FLOAT32 = 0x10000 | 32
    65600: np.float64,  # DOUBLE = 0x10000 | 64
    131104: np.int32,  # INT32 = 0x20000 | 32
    131080: np.int8,  # INT8 = 0x20000 | 8
}


class NotOnMac(AnekitError):
    """CoreML itself is needed (macOS with coremltools); the message says what is missing."""


def _coremltools() -> Any:
    if platform.system() != "Darwin":
        raise NotOnMac(
            f"[coreml] running a package needs CoreML, which only macOS has (this is {platform.system()}); "
            "run it in the simulator with `anekit sample` / `anekit run` instead"
        )
    try:
        import coremltools as ct
    except ImportError as e:
        raise NotOnMac(f"[coreml] coremltools is not installed: {install_hint('coreml')} ({e})") from e
    return ct


def _units(ct: Any, compute_units: str) -> Any:
    if compute_units not in COMPUTE_UNITS:
        raise AnekitError(f"[coreml] compute_units {compute_units!r} (known: {', '.join(COMPUTE_UNITS)})")
    return getattr(ct.ComputeUnit, COMPUTE_UNITS[compute_units])


@contextlib.contextmanager
def _boundary(package: str | Path, what: str) -> Iterator[None]:
    """The one place where CoreML's errors become anekit errors (anekit's own pass through)."""
    try:
        yield
    except AnekitError:
        raise
    except Exception as e:
        raise AnekitError(f"[coreml] {package}: {what} failed: {type(e).__name__}: {e}") from e


@dataclass(frozen=True)
class Feature:
    """One input or output of a function, as its description declares it."""

    name: str
    dtype: type[np.generic] | None  # None: not a multi-array (or a dtype anekit does not map)
    shape: tuple[int, ...]  # () when the description gives none


def _feature(fd: Any) -> Feature:
    arr = fd.type.multiArrayType
    return Feature(fd.name, ARRAY_DTYPES.get(int(arr.dataType)), tuple(int(s) for s in arr.shape))


def _description(spec: Any, function: str | None, package: str | Path) -> tuple[str | None, Any]:
    """(the function's name, the description of its features): one FunctionDescription of a package with
    several functions (``function``, else the default one), else the model's top-level description."""
    desc = spec.description
    if not len(desc.functions):
        if function not in (None, "main"):
            raise AnekitError(f"[coreml] {package} has one function, 'main', not {function!r}")
        return function, desc
    name = function or desc.defaultFunctionName
    for fn in desc.functions:
        if fn.name == name:
            return name, fn
    names = ", ".join(f.name for f in desc.functions)
    raise AnekitError(f"[coreml] {package} has no function {name!r} (it has: {names})")


class CoreMLFunction:
    """One function of a package loaded through CoreML on a compute unit, ready for many calls."""

    def __init__(self, package: str | Path, function: str | None = None, compute_units: str = "cpu_and_ne"):
        ct = _coremltools()
        units = _units(ct, compute_units)
        self.package = package
        with _boundary(package, "loading"):
            spec = ct.utils.load_spec(str(package))  # the description alone: no model compiled yet
        self.function, desc = _description(spec, function, package)
        with _boundary(package, "loading"):
            kwargs = {"function_name": self.function} if self.function else {}
            self.model = ct.models.MLModel(str(package), compute_units=units, **kwargs)
        self.inputs = {f.name: f for f in map(_feature, desc.input)}
        self.outputs = {f.name: f for f in map(_feature, desc.output)}
        self.states = tuple(s.name for s in desc.state)  # the KV caches of an anekit export

    @property
    def stateful(self) -> bool:
        return bool(self.states)

    def make_state(self) -> Any:
        """A fresh ``MLState`` (every state zero), to pass to ``predict`` call after call."""
        with _boundary(self.package, "make_state"):
            return self.model.make_state()

    def feed(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """``inputs`` as the function declares them: every name, each in its dtype and shape."""
        what = f"[coreml] {self.package}: function {self.function or 'main'!r}"
        missing = [n for n in self.inputs if n not in inputs]
        extra = [n for n in inputs if n not in self.inputs]
        if missing or extra:
            said = f"missing {missing[0]!r}" if missing else f"no input {extra[0]!r}"
            raise AnekitError(f"{what} takes inputs {', '.join(self.inputs)}: {said}")
        feed = {}
        for name, f in self.inputs.items():
            a = np.asarray(inputs[name])
            if f.dtype is not None and a.dtype != f.dtype:
                a = a.astype(f.dtype)
            if f.shape and a.shape != f.shape:
                if a.size != int(np.prod(f.shape)):
                    raise AnekitError(f"{what}: input {name!r} is {list(a.shape)}, expected {list(f.shape)}")
                a = a.reshape(f.shape)
            feed[name] = a
        return feed

    def predict(self, inputs: Mapping[str, Any], state: Any = None) -> dict[str, np.ndarray]:
        """The outputs for ``inputs``; a stateful function runs on ``state`` (or a fresh one)."""
        feed = self.feed(inputs)
        with _boundary(self.package, "prediction"):
            if self.stateful:
                out = self.model.predict(feed, state=state if state is not None else self.model.make_state())
            else:
                out = self.model.predict(feed)
        return {k: np.asarray(v) for k, v in out.items()}


def open_function(
    package: str | Path, function: str | None = None, compute_units: str = "cpu_and_ne"
) -> CoreMLFunction:
    """One function of ``package`` (default: the package's default) loaded through CoreML."""
    return CoreMLFunction(package, function, compute_units)


def make_state(package: str | Path, function: str | None = None, compute_units: str = "cpu_and_ne") -> Any:
    """A fresh ``MLState`` for ``package``'s stateful function: pass it to ``predict`` to carry the KV
    caches from call to call."""
    return open_function(package, function, compute_units).make_state()


def predict(
    package: str | Path,
    inputs: Mapping[str, Any],
    compute_units: str = "cpu_and_ne",
    function: str | None = None,
    state: Any = None,
) -> dict[str, np.ndarray]:
    """Outputs of one function of ``package`` for ``inputs`` through CoreML on ``compute_units``.

    A stateful function uses ``state`` (from ``make_state``) or a fresh one."""
    if compute_units not in COMPUTE_UNITS:  # a bad name is refused on any machine
        raise AnekitError(f"[coreml] compute_units {compute_units!r} (known: {', '.join(COMPUTE_UNITS)})")
    return open_function(package, function, compute_units).predict(inputs, state)


def residency(package: str | Path, compute_units: str = "cpu_and_ne") -> list[tuple[str, str, str]]:
    """(function, op, preferred device) for every conv of every function, from MLComputePlan."""
    ct = _coremltools()
    units = _units(ct, compute_units)
    with _boundary(package, "MLComputePlan"):
        compiled = ct.models.MLModel(str(package), compute_units=units).get_compiled_model_path()
        plan = ct.models.compute_plan.MLComputePlan.load_from_path(path=compiled, compute_units=units)
    rows = []
    for fname, fn in plan.model_structure.program.functions.items():
        for op in fn.block.operations:
            if op.operator_name.endswith("conv"):
                usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
                device = type(usage.preferred_compute_device).__name__ if usage else "unknown"
                name = op.outputs[0].name if op.outputs else op.operator_name
                rows.append((fname, name, device))
    return rows


def check_residency(package: str | Path, compute_units: str = "cpu_and_ne") -> list[str]:
    """Law 6's gate: lines describing the check; AnekitError naming each conv that is not on the engine."""
    rows = residency(package, compute_units)
    off = [r for r in rows if "NeuralEngine" not in r[2]]
    if off:
        listing = ", ".join(f"{fn}:{op} -> {dev}" for fn, op, dev in off[:10])
        raise AnekitError(
            f"[residency] {package}: {len(off)} of {len(rows)} conv ops are not on the Neural Engine: "
            f"{listing}"
        )
    return [f"residency {package}: all {len(rows)} conv ops prefer the Neural Engine (MLComputePlan)"]
