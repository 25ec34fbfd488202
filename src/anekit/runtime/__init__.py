"""The runtime: backends that compile MIL into kernels and run them on surfaces.

``open()`` returns the best backend available: ``ane`` on a Mac whose Neural Engine framework loads,
otherwise ``sim``; the ``ANEKIT_BACKEND`` environment variable overrides the choice.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from anekit.errors import AnekitError
from anekit.runtime.base import DEFAULT_COMPILE_BUDGET, Backend, Kernel, Surface

# name -> (module, class), best first; a backend module must import cleanly on every platform.
BACKENDS = {"ane": ("anekit.runtime.ane", "AneBackend"), "sim": ("anekit.runtime.sim", "SimBackend")}


def available() -> list[str]:
    """Names of the backends that can run on this machine, best first."""
    names = []
    for name in BACKENDS:
        module_name = BACKENDS[name][0]
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        probe = getattr(module, "is_available", None)
        if probe is None or probe():
            names.append(name)
    return names


def open(name: str | None = None, **options: Any) -> Backend:
    """A backend by name (``"sim"``, ``"ane"``), or the best available one."""
    if name is None:
        name = os.environ.get("ANEKIT_BACKEND") or available()[0]
    if name not in BACKENDS:
        raise AnekitError(f"[runtime] unknown backend '{name}' (known: {', '.join(BACKENDS)})")
    if name not in available():
        module = importlib.import_module(BACKENDS[name][0])
        reason = getattr(module, "unavailable_reason", lambda: "")()
        raise AnekitError(
            f"[runtime] backend '{name}' is not available on this machine" + (f": {reason}" if reason else "")
        )
    if name != "sim":
        check_numerics_options(name, options)
        for k in ("sanitize", "numerics", "chip"):
            options.pop(k, None)
    elif "chip" not in options:
        options["chip"] = default_chip()
    module_name, cls_name = BACKENDS[name]
    return getattr(importlib.import_module(module_name), cls_name)(**options)


def check_numerics_options(name: str | None, options: dict[str, Any]) -> None:
    """Refuse, with one line, the simulator's numerics options (``chip``, ``numerics``, ``sanitize``) for
    a backend that runs the engine itself (``name``; None: the best available): the engine computes with
    its own numerics and cannot report where they depart from the ideal machine."""
    if name is None:
        name = os.environ.get("ANEKIT_BACKEND") or available()[0]
    asked = [k for k in ("sanitize", "numerics", "chip") if options.get(k) not in (None, False)]
    if name != "sim" and asked:
        raise AnekitError(
            f"[runtime] backend '{name}' runs the engine itself: {', '.join(asked)} "
            "(the numeric profile and its sanitizer) need the simulator, backend 'sim'"
        )


def default_chip() -> str:
    """The simulator's default chip: this Mac's (its profile and rules), else "any"."""
    import sys

    if sys.platform != "darwin":
        return "any"
    try:
        from anekit.runtime.ane.availability import chip_name

        return chip_name()
    except Exception:  # no sysctl, an unknown brand: the conservative union
        return "any"


__all__ = [
    "DEFAULT_COMPILE_BUDGET",
    "Backend",
    "Kernel",
    "Surface",
    "available",
    "check_numerics_options",
    "open",
]
