"""Facts about the Neural Engine with their evidence: the numeric profiles (what it computes, per chip).

The rule book (what it accepts) is ``anekit.rules`` and the performance figures (how fast) are
``anekit.cost.chips``; all three keep each fact with its public source and status.
"""

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
    "Behaviour",
    "Finding",
    "Profile",
    "UnknownNumerics",
    "behaviour",
    "check_chip",
    "profile",
]
