"""The sanitizer: per op, where a chip's numerics depart from the ideal machine or lose information.

Counted while a simulator kernel runs with a chip's numeric profile (``runtime.sim.numerics``): one
``Event`` per op and hazard, with the count and the largest offending magnitude. ``lines()`` gives one
line per op, ``summary()`` one line for a whole run (training prints it per checkpoint), ``records()`` and
``to_json()`` the same as data.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

HAZARDS = {
    "mac-ceiling": "MAC output at or over the 2^15 port ceiling became inf",
    "mac-partial": "a MAC's running partial reached 2^15: the output became inf",
    "nan-coerced": "NaN input coerced to +inf",
    "indeterminate": "indeterminate form (IEEE NaN) became +0",
    "subnormal-flush": "subnormal value flushed (MAC operand/product/result, or table input)",
    "slice-saturated": "width-offset slice element over 4094 became inf (x16 crop gain)",
    "table-domain": "activation input outside the table's domain: clamped to its end knot",
    "table-collapse": "activation table's special value (softplus/softsign collapse, log(+0), origin bias)",
    "signed-zero": "-0 read as +0 before a reciprocal",
    "round-shift": "round() of |x| >= 1024 moved by the fp16 add of 0.5",
}


@dataclass
class Event:
    """What the sanitizer saw at one op for one hazard."""

    op: str
    op_type: str
    hazard: str
    count: int = 0
    largest: float = 0.0  # the largest offending magnitude (the ideal value where there is one)


class Sanitizer:
    """Counts the hazards each op met while a kernel ran (accumulated over runs until ``clear``)."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], Event] = {}

    def note(self, op: str, op_type: str, hazard: str, count: int, largest: float = 0.0) -> None:
        """``count`` values of ``op`` met ``hazard`` (one of ``HAZARDS``); ``largest``: the largest offending
        magnitude."""
        if hazard not in HAZARDS:
            raise ValueError(f"[sanitizer] unknown hazard {hazard!r} (known: {', '.join(HAZARDS)})")
        if count <= 0:
            return
        ev = self.events.get((op, hazard))
        if ev is None:
            ev = self.events[(op, hazard)] = Event(op, op_type, hazard)
        ev.count += int(count)
        if math.isfinite(largest) or math.isnan(ev.largest):
            ev.largest = max(ev.largest, float(largest))
        else:
            ev.largest = float(largest)

    def clear(self) -> None:
        self.events.clear()

    def records(self) -> list[dict[str, Any]]:
        """One record per op: its type and, per hazard, the count and the largest offending value."""
        by_op: dict[str, dict[str, Any]] = {}
        for ev in self.events.values():
            rec = by_op.setdefault(ev.op, {"op": ev.op, "op_type": ev.op_type, "hazards": {}})
            rec["hazards"][ev.hazard] = {"count": ev.count, "largest": ev.largest}
        return list(by_op.values())

    def lines(self) -> list[str]:
        """One line per op: ``op (type): hazard N (largest V), ...``."""
        out = []
        for rec in self.records():
            parts = [
                f"{h} {v['count']}" + (f" (largest {v['largest']:.6g})" if v["largest"] else "")
                for h, v in rec["hazards"].items()
            ]
            out.append(f"{rec['op']} ({rec['op_type']}): " + ", ".join(parts))
        return out

    def summary(self) -> str:
        """One line: per hazard the total count and the ops it fired at (most first); "" if none fired."""
        totals: dict[str, dict[str, int]] = {}
        for ev in self.events.values():
            totals.setdefault(ev.hazard, {}).setdefault(ev.op, 0)
            totals[ev.hazard][ev.op] += ev.count
        parts = []
        for hazard, ops in totals.items():
            ranked = sorted(ops.items(), key=lambda kv: -kv[1])
            where = ", ".join(op for op, _ in ranked[:3]) + (
                f" +{len(ranked) - 3} ops" if len(ranked) > 3 else ""
            )
            parts.append(f"{hazard} {sum(ops.values())} at {where}")
        return "; ".join(parts)

    def to_json(self) -> str:
        return json.dumps(self.records(), indent=1)
