"""Whether the Neural Engine backend can run here, and what ``anekit doctor`` reports about the framework."""

from __future__ import annotations

import functools
import platform
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

from anekit.errors import ClassNotFound
from anekit.rules import CHIPS
from anekit.runtime.ane.api import ANE_FRAMEWORK, CHAINING, CLASSES, MODEL_UUID, REALTIME, REQUIRED
from anekit.runtime.ane.objc import ObjCRuntime


def platform_supported() -> bool:
    """Darwin on arm64: the only place the framework exists."""
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def native_runtime() -> ObjCRuntime:
    """The system's objc runtime; ClassNotFound (saying to use the simulator) off Apple silicon."""
    if not platform_supported():
        raise ClassNotFound(
            f"[ane] the Neural Engine backend needs macOS on Apple silicon; this is {platform.system()} "
            f"{platform.machine()} — use the simulator (ANEKIT_BACKEND=sim)"
        )
    return ObjCRuntime()


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why this backend cannot run here, or None when it can: Darwin arm64, the framework loads and
    its four classes resolve. Never raises."""
    if not platform_supported():
        return f"ane needs macOS on Apple silicon; this is {platform.system()} {platform.machine()}"
    try:
        rt = ObjCRuntime()
        rt.load_framework(ANE_FRAMEWORK)
        missing = [name for name in CLASSES if not rt.lookup_class(name)]
    except Exception as e:  # anything at all means "not available"
        return f"ane: {e}"
    if missing:
        return f"ane: class {', '.join(missing)} not found ({rt.os_version})"
    return None


def is_available() -> bool:
    """True on Darwin arm64 when the framework loads and its four classes resolve (never raises)."""
    return unavailable_reason() is None


@dataclass(frozen=True)
class AneProbe:
    """What ``anekit doctor`` reports about the engine: platform, framework, classes and selectors."""

    system: str
    machine: str
    os_version: str
    chip: str
    framework: str
    classes: dict[str, bool] = field(default_factory=dict)
    messages: dict[str, bool] = field(default_factory=dict)
    available: bool = False

    def lines(self) -> list[str]:
        out = [
            f"os:        {self.system} {self.machine} ({self.os_version})",
            f"chip:      {self.chip}",
            f"framework: {self.framework}",
        ]
        out += [f"class      {'found  ' if ok else 'MISSING'} {name}" for name, ok in self.classes.items()]
        out += [f"selector   {'found  ' if ok else 'MISSING'} {name}" for name, ok in self.messages.items()]
        out.append(f"ane backend available: {'yes' if self.available else 'no'}")
        return out


def chip() -> str:
    """The CPU brand string (``Apple M4 Max``), or what the platform module knows."""
    if platform.system() == "Darwin":
        try:
            done = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def chip_name(brand: str | None = None) -> str:
    """The rule book's name of this Mac's chip ("m1".."m4") from its brand string, "any" otherwise."""
    found = re.search(r"\bM(\d+)\b", brand if brand is not None else chip())
    name = f"m{found.group(1)}" if found else "any"
    return name if name in CHIPS else "any"


def probe(runtime: ObjCRuntime | None = None) -> AneProbe:
    """Look for the framework, its classes and selectors (loads nothing off Darwin arm64 unless given one)."""
    base: dict[str, Any] = {"system": platform.system(), "machine": platform.machine(), "chip": chip()}
    if runtime is None and not platform_supported():
        os_version = platform.mac_ver()[0] or f"{platform.system()} {platform.release()}"
        return AneProbe(os_version=os_version, framework="not tried (needs macOS on Apple silicon)", **base)
    try:
        rt = runtime if runtime is not None else ObjCRuntime()
        rt.load_framework(ANE_FRAMEWORK)
    except Exception as e:
        version = runtime.os_version if runtime is not None else platform.mac_ver()[0]
        return AneProbe(os_version=version, framework=f"did not load: {e}", **base)
    every = (*REQUIRED, *REALTIME, *CHAINING, MODEL_UUID)
    class_names = dict.fromkeys((*CLASSES, *(m.cls for m in every)))
    classes = {name: bool(rt.lookup_class(name)) for name in class_names}
    messages = {str(m): rt.missing(m) is None for m in dict.fromkeys(every)}
    available = all(classes[name] for name in CLASSES)
    return AneProbe(
        os_version=rt.os_version,
        framework=f"loaded {ANE_FRAMEWORK}",
        classes=classes,
        messages=messages,
        available=available,
        **base,
    )
