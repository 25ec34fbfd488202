"""Predicted engine time per kernel and per training step, per chip, with sourced figures and its error
against published measurements (``anekit cost``)."""

from anekit.cost.calibration import PUBLISHED, error_table, fit, fitted
from anekit.cost.chips import CHIPS, Chip, Figure, UnknownChip, chip
from anekit.cost.model import Params, predict
from anekit.cost.step import step_kernels
from anekit.cost.work import Work, count

__all__ = [
    "CHIPS",
    "PUBLISHED",
    "Chip",
    "Figure",
    "Params",
    "UnknownChip",
    "Work",
    "chip",
    "count",
    "error_table",
    "fit",
    "fitted",
    "predict",
    "step_kernels",
]
