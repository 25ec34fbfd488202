"""On a Mac: run a package through CoreML (law 2's compute unit) and check its residency (law 6).

``predict`` loads the package with coremltools' ``MLModel`` on ``compute_units`` (default
``"cpu_and_ne"``: law 2 says CPU_AND_NE, not ALL, so nothing silently moves to the GPU) and runs one
function; a stateful function's states are made by the model (``make_state``) and can be passed back in
to continue a sequence. ``check_residency`` is law 6's gate: MLComputePlan (coremltools'
``MLComputePlan.load_from_path``) must prefer the Neural Engine for every ``conv`` of every function;
compile success proves nothing. Off macOS (or without coremltools) both raise ``NotOnMac`` saying why.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
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


def predict(
    package: str | Path,
    inputs: Mapping[str, Any],
    compute_units: str = "cpu_and_ne",
    function: str | None = None,
    state: Any = None,
) -> dict[str, np.ndarray]:
    """Outputs of one function of ``package`` for ``inputs`` through CoreML on ``compute_units``.

    A stateful function uses ``state`` (from ``make_state``) or a fresh one."""
    if compute_units not in COMPUTE_UNITS:
        raise AnekitError(f"[coreml] compute_units {compute_units!r} (known: {', '.join(COMPUTE_UNITS)})")
    ct = _coremltools()
    units = getattr(ct.ComputeUnit, COMPUTE_UNITS[compute_units])
    kwargs = {"function_name": function} if function else {}
    try:
        model = ct.models.MLModel(str(package), compute_units=units, **kwargs)
        feed = {k: np.asarray(v) for k, v in inputs.items()}
        if state is None and model._spec.description.state:  # a stateful model: CoreML holds the caches
            state = model.make_state()
        out = model.predict(feed, state=state) if state is not None else model.predict(feed)
    except Exception as e:  # the one boundary where CoreML's errors become anekit errors
        raise AnekitError(f"[coreml] {package}: prediction failed: {type(e).__name__}: {e}") from e
    return {k: np.asarray(v) for k, v in out.items()}


def residency(package: str | Path, compute_units: str = "cpu_and_ne") -> list[tuple[str, str, str]]:
    """(function, op, preferred device) for every conv of every function, from MLComputePlan."""
    ct = _coremltools()
    units = getattr(ct.ComputeUnit, COMPUTE_UNITS[compute_units])
    try:
        compiled = ct.models.MLModel(str(package), compute_units=units).get_compiled_model_path()
        plan = ct.models.compute_plan.MLComputePlan.load_from_path(path=compiled, compute_units=units)
    except Exception as e:
        raise AnekitError(f"[coreml] {package}: MLComputePlan failed: {type(e).__name__}: {e}") from e
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
