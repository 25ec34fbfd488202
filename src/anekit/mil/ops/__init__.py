"""The MIL op families; importing this package registers every op in ``anekit.mil.registry``."""

from __future__ import annotations

import importlib
import pkgutil


def _import_families() -> None:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_families()
