"""anekit: program the Apple Neural Engine directly, with a faithful simulator everywhere else.

``anekit.train(out, ...)`` and ``anekit.Run`` train from Python as ``anekit train`` does (see
``anekit.training.run``); they load on first use, so importing anekit stays cheap.
"""

from typing import Any

from anekit.errors import AnekitError

__version__ = "0.1.0"

__all__ = ["AnekitError", "Run", "TrainOptions", "__version__", "train"]

_LAZY = {"train": "anekit.training.run", "Run": "anekit.training.run", "TrainOptions": "anekit.training.run"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'anekit' has no attribute {name!r}")
