"""The chip binding: which chip's numerics a simulated kernel computes with, resolved in this one place.

``check_chip`` says whether a name is one the simulator knows (a chip with a numeric profile and rules,
or "any"); ``bind`` resolves a name once to its ``ChipNumerics``: the chip's numeric profile
(``anekit.engine.numerics.profile``) read into the values the simulator's numerics apply (the MAC port,
subnormal flushes, tie rounding, the slice gain, the table behaviours and the activation tables
themselves). Everything else in the simulator asks this module; nothing reads a profile directly.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from anekit.engine.numerics import Profile, profile
from anekit.engine.numerics import check_chip as numeric_chip
from anekit.rules import check_chip as rules_chip


def check_chip(chip: str) -> str:
    """``chip`` if it names a chip with a numeric profile and rules, or "any"; an error naming the choices
    otherwise."""
    return rules_chip(numeric_chip(chip))


@dataclass(frozen=True)
class ChipNumerics:
    """One chip's numerics as the simulator applies them (each field: the profile behaviour it reads)."""

    chip: str
    profile: Profile
    mac_ceiling: float  # mac.output-ceiling: the MAC output port saturates here
    flush: bool  # mac.subnormal-flush: subnormal operands, products and results read as +0
    mac_ties: str  # mac.tie-rounding: "even" or "away"
    tile_rounding: str  # mac.first-stage: how a 4-lane tile is rounded
    reduce_ties: str  # reduce.tie-rounding
    slice_gain: int  # slice.width-offset-gain: 0 where there is none
    partials: bool  # mac.interior-partials: a running partial that reaches the ceiling overflows
    sqrt_subnormals: bool  # table.subnormal-input: sqrt / rsqrt read a subnormal as 0 or 2^-14
    signed_zero: bool  # recip.signed-zero: the sign of a zero is dropped before a reciprocal
    round_away: bool  # round.half-away: round() through an fp16 add of 0.5
    tables: Mapping[str, Any]  # activation.tables: the piecewise-linear tables, by op
    sigmoid_knots: tuple[float, float]  # sigmoid's end knots as fp16 inputs (its table's domain)


@functools.cache
def bind(chip: str = "any") -> ChipNumerics:
    """The numerics of ``chip`` ("any": the conservative union of every chip), resolved once per name."""
    chip = check_chip(chip)
    p = profile(chip)
    tables = p["activation.tables"]
    lo, hi = tables["sigmoid"].domain
    return ChipNumerics(
        chip=chip,
        profile=p,
        mac_ceiling=p.mac_ceiling,
        flush=p.flushes_mac_subnormals,
        mac_ties=p.mac_ties,
        tile_rounding=str(p["mac.first-stage"]),
        reduce_ties=str(p["reduce.tie-rounding"]),
        slice_gain=p.slice_gain,
        partials=bool(p["mac.interior-partials"]),
        sqrt_subnormals=bool(p["table.subnormal-input"]),
        signed_zero=bool(p["recip.signed-zero"]),
        round_away=bool(p["round.half-away"]),
        tables=tables,
        sigmoid_knots=(float(np.float16(lo)), float(np.float16(hi))),
    )
