"""The macOS backend: kernels compile, load and run on the Neural Engine through AppleNeuralEngine.framework.

The private framework is driven through ``objc`` (ctypes, no pyobjc). One module per job:

    objc          the Objective-C runtime through ctypes: classes, messages, pools, NSError conversion
    api           the classes and messages used, declared once as data
    availability  is_available / unavailable_reason / probe (``anekit doctor``)
    surfaces      IOSurface-backed ``Surface``s and their allocation sizes (uniform per direction)
    binding       the function the engine compiles and the order surfaces bind (alphabetical by name)
    weights       weight files in the model directory, named by their bytes; reserved names refused
    request       the _ANERequest, built after every load
    lifecycle     one _ANEInMemoryModel: compile, load, evaluate (standard / real-time), unload
    pacing        the pause after a failed compile (one compile-service restart, about 15 s)
    residency     the loaded-program ceiling of a process (LRU unload) and the periodic refresh
    realtime      the real-time variants, tried in the evidence's order, the one that worked kept
    memory        which MIL dialect compiled, per chip and macOS, remembered in a per-user file
    kernel        AneKernel (with its per-kernel lock)
    chaining      _ANEChainingRequest, opt-in, with a sequential fallback
    backend       AneBackend: compile (the MIL dialect trial), kernels, chains

Every engine fact applied here names its public source in the module that applies it (mechramc/Orion
docs/ane_constraints.md, maderix/ANE training/*, sbryngelson/ane-guide, ncdrone/rustane), with the
anekit rule id. What a process shares — the compile budget (``anekit.runtime.base.PROCESS_COMPILES``),
the compile pacing, the loaded programs — is counted once per process, over every backend object.
None of them has been observed by this project, which had no Mac: ``tests/fake_objc.py`` encodes the
same published rules independently, and the backend is tested against it.

Importing this package loads nothing (no framework, no library): it imports on every platform.
"""

from __future__ import annotations

from anekit.errors import ClassNotFound
from anekit.rules.checks import MIN_ROW_BYTES, SPATIAL_MULTIPLE
from anekit.runtime.ane.api import (
    ANE_FRAMEWORK,
    CHAINING,
    CHAINING_REQUEST,
    CLASSES,
    CLIENT_EVALUATE_REALTIME,
    MODEL_ANE_MODEL,
    MODEL_COMPILE,
    MODEL_UUID,
    QOS,
    REALTIME,
    REQUEST,
    REQUIRED,
)
from anekit.runtime.ane.availability import AneProbe, is_available, probe, unavailable_reason
from anekit.runtime.ane.backend import AneBackend
from anekit.runtime.ane.binding import Layout
from anekit.runtime.ane.chaining import Chain
from anekit.runtime.ane.kernel import AneKernel
from anekit.runtime.ane.surfaces import MIN_SURFACE_BYTES, SURFACE_ALIGNMENT, AneSurface, uniform_allocation
from anekit.runtime.ane.weights import RESERVED_NAMES

__all__ = [
    "ANE_FRAMEWORK",
    "CHAINING",
    "CHAINING_REQUEST",
    "CLASSES",
    "CLIENT_EVALUATE_REALTIME",
    "MIN_ROW_BYTES",
    "MIN_SURFACE_BYTES",
    "MODEL_ANE_MODEL",
    "MODEL_COMPILE",
    "MODEL_UUID",
    "QOS",
    "REALTIME",
    "REQUEST",
    "REQUIRED",
    "RESERVED_NAMES",
    "SPATIAL_MULTIPLE",
    "SURFACE_ALIGNMENT",
    "AneBackend",
    "AneKernel",
    "AneProbe",
    "AneSurface",
    "Chain",
    "ClassNotFound",
    "Layout",
    "is_available",
    "probe",
    "unavailable_reason",
    "uniform_allocation",
]
