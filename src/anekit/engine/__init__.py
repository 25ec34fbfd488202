"""Facts about the Neural Engine, each with its evidence, in one layer.

- ``anekit.engine.chips``: the one chip table (generations m1 ... m5 and their devices);
- ``anekit.engine.evidence``: the one evidence record and the one severity policy;
- ``anekit.engine.book`` (with ``ops``, ``op_matrix`` and ``extents``): the rule book — what it accepts;
- ``anekit.engine.numerics``: the numeric profiles — what it computes;
- ``anekit.engine.performance``: the per-device performance figures — how fast (read by ``anekit.cost``);
- ``anekit.engine.trials``: the questions the macOS backend settles by trying.
"""

from anekit.engine.chips import DEVICES, GENERATIONS, Device, UnknownChip, device
from anekit.engine.evidence import POLICY, ROUTES, Evidence, severity
from anekit.engine.numerics import (
    BEHAVIOURS,
    CHIPS,
    Behaviour,
    Finding,
    Profile,
    UnknownNumerics,
    behaviour,
    check_chip,
    profile,
)

__all__ = [
    "BEHAVIOURS",
    "CHIPS",
    "DEVICES",
    "GENERATIONS",
    "POLICY",
    "ROUTES",
    "Behaviour",
    "Device",
    "Evidence",
    "Finding",
    "Profile",
    "UnknownChip",
    "UnknownNumerics",
    "behaviour",
    "check_chip",
    "device",
    "profile",
    "severity",
]
