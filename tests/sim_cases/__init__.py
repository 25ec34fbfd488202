"""Per-op simulator cases: each family module lists SimCase entries with independent float64 expectations.

A case names the op, its runtime tensor inputs (become function inputs: fp16 surfaces for float
arrays unless ``dtype`` says otherwise; int8 / uint8 / int16 / uint16 arrays keep their type, other
integer arrays become int32; bool arrays bool; a list of
arrays is a tuple input such as concat's ``values``), its constant parameters (become const ops),
and ``expected``: an independent float64 numpy function, written apart from the op's reference,
called with the runtime inputs (as float64, after rounding to the input dtype) and the params,
returning one array or a tuple of arrays (one per output).
"""

from __future__ import annotations

import importlib
import pkgutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class SimCase:
    op: str
    inputs: dict[str, Any]
    expected: Callable[..., Any]
    params: dict[str, Any] = field(default_factory=dict)
    dtype: str = "fp16"  # dtype of the float runtime inputs
    rtol: float = 4e-3
    atol: float = 2e-3
    label: str = ""
    opset: str = "ios18"  # the function's opset: "ios16" for the iOS16 forms of the constexpr ops

    @property
    def id(self) -> str:
        return f"{self.op}-{self.label}" if self.label else self.op


def all_cases() -> list[SimCase]:
    """Every case of every family module in this package."""
    cases: list[SimCase] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        cases.extend(getattr(module, "CASES", []))
    return cases


def rng(seed: str) -> np.random.Generator:
    """A generator seeded from a label, so cases do not depend on each other."""
    return np.random.default_rng(zlib.crc32(seed.encode()))
