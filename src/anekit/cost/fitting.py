"""The least-squares fit of the cost model's three efficiencies, and its error on the published timings.

The fit minimises the sum of squared log errors, log(predicted / measured), over the measurements whose
role is ``fit`` (``anekit.cost.calibration``), by a Nelder-Mead search over the logarithms of the
parameters (no derivatives, deterministic). The error is reported on every measurement; the model is
judged on the ``held out`` ones alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

from anekit.cost.calibration import FIT, HELD_OUT, PUBLISHED, Measurement
from anekit.cost.model import Params, Terms, combine, terms
from anekit.engine.performance import performance

START = Params(0.5, 0.5, 0.5)


Parts = tuple[tuple[Terms, int], ...]  # (one evaluation's terms, evaluations)


@cache
def _parts(m: Measurement) -> tuple[Parts, Parts]:
    """The terms of ``m``'s workload and of its baseline (none but for a per-layer figure)."""
    perf = performance(m.device)
    base = m.baseline() if m.baseline is not None else ()
    return (
        tuple((terms(w, perf, m.route), n) for w, n in m.workload()),
        tuple((terms(w, perf, m.route), n) for w, n in base),
    )


def predicted(m: Measurement, params: Params) -> float:
    """The model's time for ``m`` (ms): its workload's evaluations, less the baseline's (a per-layer
    figure)."""
    work, base = _parts(m)
    total = sum(n * combine(t, params).ms for t, n in work)
    return total - sum(n * combine(t, params).ms for t, n in base)


def nelder_mead(
    f: Callable[[list[float]], float], x0: Sequence[float], step: float = 0.5, rounds: int = 3
) -> list[float]:
    """The minimum of ``f`` near ``x0`` by the Nelder-Mead simplex, restarted ``rounds`` times."""
    best = list(x0)
    for _ in range(rounds):
        simplex = [best] + [
            [x + (step if i == j else 0.0) for j, x in enumerate(best)] for i in range(len(best))
        ]
        values = [f(p) for p in simplex]
        for _ in range(400 * len(best)):
            order = sorted(range(len(simplex)), key=values.__getitem__)
            simplex, values = [simplex[i] for i in order], [values[i] for i in order]
            if values[-1] - values[0] < 1e-12:
                break
            centre = [sum(c) / (len(simplex) - 1) for c in zip(*simplex[:-1])]
            worst = simplex[-1]

            def toward(t: float, worst: list[float] = worst, centre: list[float] = centre) -> list[float]:
                return [c + t * (c - w) for c, w in zip(centre, worst)]

            reflected = toward(1.0)
            fr = f(reflected)
            if fr < values[0]:
                expanded = toward(2.0)
                fe = f(expanded)
                simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
            elif fr < values[-2]:
                simplex[-1], values[-1] = reflected, fr
            else:
                contracted = toward(-0.5)
                fc = f(contracted)
                if fc < values[-1]:
                    simplex[-1], values[-1] = contracted, fc
                else:
                    simplex = [simplex[0]] + [
                        [(a + b) / 2 for a, b in zip(simplex[0], p)] for p in simplex[1:]
                    ]
                    values = [values[0]] + [f(p) for p in simplex[1:]]
        best = simplex[min(range(len(simplex)), key=values.__getitem__)]
        step /= 4
    return best


def fit(
    measurements: Sequence[Measurement] = PUBLISHED,
    measured: Callable[[Measurement], float] = lambda m: m.ms,
) -> Params:
    """The parameters minimising the squared log error over the ``fit`` measurements (``measured``: the
    times to fit, the published ones by default)."""
    used = [m for m in measurements if m.role == FIT]
    targets = [math.log(measured(m)) for m in used]

    def loss(x: list[float]) -> float:
        params = Params(*(math.exp(v) for v in x))
        total = 0.0
        for m, target in zip(used, targets):
            t = predicted(m, params)
            total += (math.log(t) - target) ** 2 if t > 0 else 1e6
        return total

    x = nelder_mead(
        loss,
        [math.log(v) for v in (START.compute_efficiency, START.dram_efficiency, START.surface_efficiency)],
    )
    return Params(*(math.exp(v) for v in x))


@cache
def fitted() -> Params:
    """The parameters fitted on the published ``fit`` measurements."""
    return fit()


@dataclass(frozen=True)
class Row:
    measurement: Measurement
    predicted_ms: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return self.predicted_ms / self.measurement.ms - 1.0


def error_table(params: Params | None = None) -> list[Row]:
    params = params or fitted()
    return [Row(m, predicted(m, params)) for m in PUBLISHED]


@dataclass(frozen=True)
class Summary:
    """The model's error on the held-out measurements."""

    held_out: int
    median_error: float  # median |error|
    within_30: float  # share with |error| <= 30%
    worst: Row
    fit_median_error: float


def summary(rows: Sequence[Row] | None = None) -> Summary:
    rows = list(rows if rows is not None else error_table())
    held = [r for r in rows if r.measurement.role == HELD_OUT]
    fitted_on = [r for r in rows if r.measurement.role == FIT]
    if not held:
        raise ValueError("[cost] no held-out measurement to judge the model on")
    return Summary(
        held_out=len(held),
        median_error=_median([abs(r.error) for r in held]),
        within_30=sum(abs(r.error) <= 0.30 for r in held) / len(held),
        worst=max(held, key=lambda r: abs(r.error)),
        fit_median_error=_median([abs(r.error) for r in fitted_on]),
    )


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
