"""Predicted engine time per kernel and per training step, per device, from each program's work and the
sourced figures of ``anekit.engine.performance``, with its error against published measurements
(``anekit cost``)."""

from anekit.cost.calibration import CONTEXT, NOT_USED, PUBLISHED, Measurement
from anekit.cost.fitting import Row, Summary, error_table, fit, fitted, predicted, summary
from anekit.cost.model import KernelTime, Params, predict, terms
from anekit.cost.step import step_kernels
from anekit.cost.work import Layer, Work, count
from anekit.engine.chips import DEVICES, UnknownChip
from anekit.engine.performance import Figure, Performance, performance


def chip(name: str) -> Performance:
    """The performance figures of device ``name`` ("m4", "m4-max", "M4 Max" ...); a one-line UnknownChip
    naming the known devices otherwise."""
    try:
        return performance(name)
    except UnknownChip:
        raise UnknownChip(f"[cost] unknown chip '{name}' (known: {', '.join(DEVICES)})") from None


__all__ = [
    "CONTEXT",
    "DEVICES",
    "NOT_USED",
    "PUBLISHED",
    "Figure",
    "KernelTime",
    "Layer",
    "Measurement",
    "Params",
    "Performance",
    "Row",
    "Summary",
    "UnknownChip",
    "Work",
    "chip",
    "count",
    "error_table",
    "fit",
    "fitted",
    "performance",
    "predict",
    "predicted",
    "step_kernels",
    "summary",
    "terms",
]
