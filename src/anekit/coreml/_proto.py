"""coremltools' generated protobuf classes (the ``coreml`` extra), imported once, quietly, or one clear error.

anekit writes no protobuf encoder of its own: Model.proto, MIL.proto and FeatureTypes.proto come from
the classes coremltools ships (``coremltools.proto``). Importing them runs coremltools' package
``__init__``, which on Linux logs "Failed to load _MLModelProxy" lines (its native runtime exists only
on macOS); those are silenced here. Without coremltools every CoreML entry point raises
``CoreMLUnavailable`` naming the extra.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import NamedTuple

from anekit.errors import CoreMLUnavailable, install_hint

EXTRA_HINT = install_hint("coreml")


class Proto(NamedTuple):
    """The generated modules anekit uses."""

    Model: ModuleType  # Model_pb2: Model, ModelDescription, FeatureDescription, FunctionDescription
    MIL: ModuleType  # MIL_pb2: Program, Function, Block, Operation, Value, ValueType, DataType
    Features: ModuleType  # FeatureTypes_pb2: ArrayFeatureType, StateFeatureType, FeatureType


_cached: Proto | None = None


def proto() -> Proto:
    """The protobuf modules; ``CoreMLUnavailable`` (one message naming the extra) when they cannot load."""
    global _cached
    if _cached is not None:
        return _cached
    log = logging.getLogger("coremltools")
    level = log.level
    log.setLevel(logging.ERROR)  # the macOS-only runtime proxies fail to load on Linux: not our concern
    try:
        from coremltools.proto import FeatureTypes_pb2, MIL_pb2, Model_pb2
    except Exception as e:  # ImportError, or a broken install failing inside coremltools' own __init__
        raise CoreMLUnavailable(
            f"[coreml] CoreML packages need coremltools' protobuf classes, which did not import "
            f"({type(e).__name__}: {e}); install the extra: {EXTRA_HINT}"
        ) from e
    finally:
        log.setLevel(level)
    _cached = Proto(Model_pb2, MIL_pb2, FeatureTypes_pb2)
    return _cached
