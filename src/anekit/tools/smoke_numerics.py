"""The numeric rungs of the smoke ladder (``anekit doctor --smoke``): probes that tell the chips' numeric
profiles apart.

Each rung is a program of the smoke ladder's proven shape ([1, 64, 1, 32] fp16 surfaces, see
``anekit.tools.smoke``) whose one probed output element reads one behaviour of ``anekit.engine.numerics``:

* ``mac_ceiling``: a 1x1 conv summing 64 channels of 512 (32768) and of 511.75 (32752): the 2^15 port;
* ``nan_coercion``: x * 1 of a NaN: +inf on the engine, NaN on an IEEE machine;
* ``subnormal_mac``: a 1x1 conv summing two 2^-24: +0 where the MAC flushes (M1), 2^-23 where it keeps;
* ``slice_4096``: a slice at width offset 32 of a 4096: +inf with the x16 crop gain (M1, M2), else 4096.

The expected value of each rung on every chip comes from the simulator running the same program with
that chip's profile, so the report says which profiles the machine matches and where it differs from
the profile anekit assumed for its chip: the first run on real hardware tells whether the record holds.
Each result also keeps its inputs (the nonzero elements) and the elements it read, and gives the values
as fp16 bits (``bits``): what a first-contact report (``anekit.engine.report``) records of a probe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anekit.blob import fp16_blob
from anekit.engine.numerics import CHIPS
from anekit.fp16 import f32_to_f16_bits
from anekit.mil import Builder, tensor
from anekit.mil.printer import print_program
from anekit.runtime.base import Backend
from anekit.runtime.sim import SimBackend

CHANNELS, SPATIAL = 64, 32
WEIGHT_FILE = "@model_path/weights/ones.bin"


@dataclass(frozen=True)
class NumericRung:
    """One probe program: its text, weights and input, and the output element it reads."""

    name: str
    behaviour: str  # the id in anekit.engine.numerics
    text: str
    weights: dict[str, bytes]
    inputs: dict[str, np.ndarray]
    probes: tuple[tuple[int, int], ...]  # (channel, position) of the elements read, in order


@dataclass
class NumericResult:
    """What one rung read on the machine, and what each chip's profile predicts."""

    name: str
    behaviour: str
    got: list[float] | None
    expected: dict[str, list[float]]
    matches: list[str] = field(default_factory=list)
    error: str | None = None
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # the probe's inputs, by MIL name
    read: tuple[tuple[int, int], ...] = ()  # (channel, position) of each element read

    def to_json(self) -> dict[str, Any]:
        def clean(v: list[float] | None) -> list[Any] | None:
            return None if v is None else [x if np.isfinite(x) else str(x) for x in v]

        return {
            "name": self.name,
            "behaviour": self.behaviour,
            "got": clean(self.got),
            "expected": {c: clean(v) for c, v in self.expected.items()},
            "matches": self.matches,
            "error": self.error,
        }


def bits(values: list[float]) -> list[str]:
    """fp16 values as their bits, 4 lower-case hex digits each (``[inf, 1.0]`` -> ``["7c00", "3c00"]``)."""
    return [f"{int(b):04x}" for b in f32_to_f16_bits(np.asarray(values, dtype=np.float32)).ravel()]


def nonzero(x: np.ndarray) -> list[tuple[int, int, str]]:
    """The nonzero (or NaN) elements of a [1, C, 1, S] input as (channel, position, fp16 bits)."""
    flat = np.asarray(x, dtype=np.float32).reshape(x.shape[1], -1)  # (C, S)
    where = np.argwhere((flat != 0) | np.isnan(flat))
    return [(int(c), int(s), bits([float(flat[c, s])])[0]) for c, s in where]


def _program(body: Callable[[Any, Any], Any], spatial: int = SPATIAL) -> Any:
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, CHANNELS, 1, spatial]))
    f.output(body(f, x))
    return b.build()


def _ones_conv(f: Any, x: Any) -> Any:
    w = f.weight(tensor("fp16", [CHANNELS, CHANNELS, 1, 1]), WEIGHT_FILE, 64, name="ones")
    return f.conv1x1(x, w, "y")


def rungs(dialect: str | None) -> list[NumericRung]:
    ones = {WEIGHT_FILE: fp16_blob(np.ones((CHANNELS, CHANNELS, 1, 1), np.float32))}
    conv = _program(_ones_conv)
    ceiling = np.zeros((1, CHANNELS, 1, SPATIAL), np.float32)
    ceiling[0, :, 0, 0] = 512.0  # 64 x 512 = 32768: the port's ceiling
    ceiling[0, :, 0, 1] = 511.75  # 64 x 511.75 = 32752: the largest fp16 under it
    nan = np.zeros((1, CHANNELS, 1, SPATIAL), np.float32)
    nan[0, 0, 0, 0] = np.nan
    tiny = np.zeros((1, CHANNELS, 1, SPATIAL), np.float32)
    tiny[0, :2, 0, 0] = 2.0**-24  # two subnormals summed in the MAC: 2^-23, or +0 where it flushes
    wide = np.zeros((1, CHANNELS, 1, 2 * SPATIAL), np.float32)
    wide[0, 0, 0, SPATIAL + 3] = 4096.0  # read through a slice at width offset 32
    sliced = _program(
        lambda f, x: f.slice_by_size(x=x, begin=[0, 0, 0, SPATIAL], size=[1, CHANNELS, 1, SPATIAL], name="y"),
        2 * SPATIAL,
    )
    times_one = _program(lambda f, x: f.mul(x=x, y=1.0, name="y"))
    return [
        NumericRung("mac_ceiling", "mac.output-ceiling", print_program(conv, dialect), ones, {"x": ceiling},
                    ((0, 0), (0, 1))),
        NumericRung("nan_coercion", "input.nan-coercion", print_program(times_one, dialect), {}, {"x": nan},
                    ((0, 0),)),
        NumericRung("subnormal_mac", "mac.subnormal-flush", print_program(conv, dialect), ones, {"x": tiny},
                    ((0, 0),)),
        NumericRung("slice_4096", "slice.width-offset-gain", print_program(sliced, dialect), {}, {"x": wide},
                    ((0, 3),)),
    ]  # fmt: skip


def _read(backend: Backend, rung: NumericRung) -> list[float]:
    with backend.compile(rung.text, rung.weights) as kernel:
        (out,) = kernel(**rung.inputs).values()
    out = np.asarray(out, dtype=np.float64).reshape(CHANNELS, -1)
    return [float(out[c, s]) for c, s in rung.probes]


def _same(a: list[float], b: list[float]) -> bool:
    return all((x == y) or (np.isnan(x) and np.isnan(y)) for x, y in zip(a, b))


def run(backend: Backend, dialect: str | None) -> list[NumericResult]:
    """Every numeric rung on ``backend``, with each chip profile's expectation beside it."""
    results = []
    for rung in rungs(dialect):
        expected = {c: _read(SimBackend(chip=c, strict=False), rung) for c in CHIPS}
        result = NumericResult(
            rung.name, rung.behaviour, None, expected, inputs=dict(rung.inputs), read=rung.probes
        )
        try:
            result.got = _read(backend, rung)
        except Exception as e:  # a refusal is a finding of this rung, not a crash of the ladder
            result.error = f"{type(e).__name__}: {e}"
        else:
            result.matches = [c for c, v in expected.items() if _same(result.got, v)]
        results.append(result)
    return results


def profiles_matched(results: list[NumericResult]) -> list[str]:
    """The chips whose profile predicts every rung that ran."""
    ran = [r for r in results if r.got is not None]
    return [c for c in CHIPS if all(c in r.matches for r in ran)] if ran else []


def format_result(r: NumericResult) -> str:
    """``name (behaviour): got [...]; matches m1, m2`` (or what each profile predicts when none match)."""
    if r.got is None:
        return f"    {r.name:<14} ({r.behaviour}): {r.error}"
    got = ", ".join(f"{v:g}" for v in r.got)
    if r.matches:
        return f"    {r.name:<14} ({r.behaviour}): got [{got}]; as the profiles of {', '.join(r.matches)}"
    said = "; ".join(f"{c} [{', '.join(f'{v:g}' for v in vals)}]" for c, vals in r.expected.items())
    return f"    {r.name:<14} ({r.behaviour}): got [{got}]; NO profile predicts it ({said})"


def differences(results: list[NumericResult], assumed: str) -> list[str]:
    """One line per behaviour where the machine departs from the profile anekit assumed (``assumed``)."""
    if assumed not in CHIPS:
        return []
    out = []
    for r in results:
        if r.got is not None and assumed not in r.matches:
            want = ", ".join(f"{v:g}" for v in r.expected[assumed])
            got = ", ".join(f"{v:g}" for v in r.got)
            out.append(f"{r.behaviour}: got [{got}], the {assumed} profile says [{want}]")
    return out
