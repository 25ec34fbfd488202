"""Facts about the Neural Engine, each with its evidence, in one layer.

- ``anekit.engine.chips``: the one chip table (generations m1 ... m5 and their devices);
- ``anekit.engine.evidence``: the one evidence record and the one severity policy;
- ``anekit.engine.book`` (with ``ops``, ``op_matrix`` and ``extents``): the rule book — what it accepts;
- ``anekit.engine.numerics``: the numeric profiles — what it computes;
- ``anekit.engine.performance``: the per-device performance figures — how fast (read by ``anekit.cost``);
  ``anekit.engine.host``: the host CPU's figures beside it (fp32 matmul rate, stream rate, compile time);
- ``anekit.engine.trials``: the questions the macOS backend settles by trying;
- ``anekit.engine.constructs``: the constructs of the training kernels with their hardware runs, and the
  precedent policy; ``anekit.engine.training_routes``: the training route each chip and macOS get;
- ``anekit.engine.report``: a Mac's first-contact report (``anekit doctor --smoke --report FILE``) read
  back as measured evidence per construct, and the reports shipped in ``anekit/engine/reports/``.
"""

from anekit.engine.chips import DEVICES, GENERATIONS, Device, UnknownChip, device
from anekit.engine.constructs import CONSTRUCTS, MACOS_MAJORS, Construct, Precedent, precedent
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
from anekit.engine.training_routes import TrainingRoute, route_table, training_route

__all__ = [
    "BEHAVIOURS",
    "CHIPS",
    "CONSTRUCTS",
    "DEVICES",
    "GENERATIONS",
    "MACOS_MAJORS",
    "POLICY",
    "ROUTES",
    "Behaviour",
    "Construct",
    "Device",
    "Evidence",
    "Finding",
    "Precedent",
    "Profile",
    "TrainingRoute",
    "UnknownChip",
    "UnknownNumerics",
    "behaviour",
    "check_chip",
    "device",
    "precedent",
    "profile",
    "route_table",
    "severity",
    "training_route",
]
