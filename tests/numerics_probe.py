"""Running one probe program in the simulator under a chip's numeric profile: the tests' harness."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anekit import mil
from anekit.mil import tensor
from anekit.runtime.sim import SimBackend


def probe(
    body: Callable[..., Any],
    chip: str = "m1",
    numerics: str = "engine",
    sanitize: bool = False,
    **inputs: np.ndarray,
) -> np.ndarray | tuple[np.ndarray, SimBackend]:
    """Build ``main(inputs) = body(f, *inputs)`` (every input fp16 of its array's shape), run it on the
    simulator with ``chip``'s profile (not strict: these are numeric probes, not programs for the
    engine's compiler) and return its single output (with the backend when ``sanitize``)."""
    types = {name: tensor("fp16", list(np.shape(v))) for name, v in inputs.items()}

    @mil.program(inputs=types)
    def prog(f: Any, *args: Any) -> Any:
        return body(f, *args)

    backend = SimBackend(chip=chip, strict=False, numerics=numerics, sanitize=sanitize)
    with backend.compile(prog) as kernel:
        out = kernel(**{k: np.asarray(v, np.float32) for k, v in inputs.items()})
    (value,) = out.values()
    return (value, backend) if sanitize else value


def row(*values: float) -> np.ndarray:
    """A [1, N] float32 row."""
    return np.asarray([values], dtype=np.float32)


def fp16(values: Any) -> Any:
    """A const argument of the builder in fp16 (a float32 array; the builder writes it as fp16)."""
    return np.asarray(values, dtype=np.float32)
