"""coremltools as the oracle of the CoreML tests: its MLModel (skip_model_load) and its milproto loader."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

ct = None


def coremltools() -> Any:
    """coremltools, imported quietly; the test skips when it is not installed."""
    global ct
    if ct is None:
        log = logging.getLogger("coremltools")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            ct = pytest.importorskip("coremltools")
        finally:
            log.setLevel(level)
    return ct


def ct_load(path: Path) -> tuple[Any, Any]:
    """(Model spec, coremltools' own Program) of a package, through MLModel and the milproto loader."""
    ct_ = coremltools()
    from coremltools.converters.mil.frontend.milproto.load import load

    model = ct_.models.MLModel(str(path), skip_model_load=True)
    spec = model.get_spec()
    weights_dir = str(Path(path) / "Data" / "com.apple.CoreML" / "weights")
    prog = load(spec, specification_version=spec.specificationVersion, file_weights_dir=weights_dir)
    return spec, prog


def ct_consts(prog: Any) -> dict[str, Any]:
    """``{const name: value}`` of every const of every function of a coremltools Program."""
    out = {}
    for fn in prog.functions.values():
        for op in fn.operations:
            if op.op_type == "const":
                out[op.outputs[0].name] = op.outputs[0].val
    return out


def ct_ops(fn: Any) -> list[tuple[str, tuple[str, ...]]]:
    """(op type, output names) of the non-const ops of a coremltools function."""
    return [(op.op_type, tuple(v.name for v in op.outputs)) for op in fn.operations if op.op_type != "const"]
