"""A MAC op whose constant weight holds fp16 subnormals, on a chip that flushes them: the weight is flushed
once when the plan is built (not copied and rescanned on every run), and each run gives the bits and the
sanitizer record of the op computed the per-run way (``EngineNumerics.evaluate``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from anekit import jit
from anekit.kernels import catalog, forward, preset
from anekit.runtime.sim import SimBackend
from anekit.runtime.sim import numerics as numerics_module
from anekit.runtime.sim.mac import MAC_OPS
from anekit.runtime.sim.numerics import EngineNumerics

pytestmark = pytest.mark.usefixtures("fp16_path")  # with and without the compiled loops

SUBNORMAL = 3e-6  # under fp16's smallest normal 2^-14 (6.1e-5), above its smallest subnormal
EVERY = 97  # one weight in EVERY made subnormal


def _weights(big: bool) -> tuple[Any, dict[str, Any]]:
    """The default preset's FFN weights with subnormals planted in w1 and w3 (and, with ``big``, rows and
    a norm scale large enough to reach the MAC port's 2^15 and its running partials)."""
    cfg = preset("default")
    w = dict(catalog.random_weights(cfg))
    for key in ("w1", "w3"):
        w[key] = w[key].copy()
        w[key].flat[::EVERY] = SUBNORMAL
        if big:
            w[key][3, :] = 20.0
            w[key][4, ::3] = 9.0
    if big:
        w["rms_ffn"] = (np.asarray(w["rms_ffn"]) * 40).astype(np.float32)
    return cfg, w


def _run(chip: str, w: dict[str, Any], cfg: Any, scale: float) -> tuple[list[np.ndarray], list[Any]]:
    """The FFN kernel's outputs after two runs, and its sanitizer's events."""
    backend = SimBackend(compile_budget=10**6, chip=chip, sanitize=True)
    kernel = forward.ffn_fwd(cfg, w).compile(backend)
    x = (np.random.default_rng(0).standard_normal(kernel.inputs[0].shape) * scale).astype(np.float32)
    with kernel:
        kernel.inputs[0].write(x)
        kernel.run()
        kernel.run()
        outs = [s.read().copy() for s in kernel.outputs]
    assert backend.sanitizer is not None
    events = sorted((k, e.count, e.largest) for k, e in backend.sanitizer.events.items())
    return outs, events


def _per_run(chip: str, w: dict[str, Any], cfg: Any, scale: float) -> tuple[list[np.ndarray], list[Any]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EngineNumerics, "flushed_constants", lambda self, step, constants: {})
        return _run(chip, w, cfg, scale)


@pytest.mark.parametrize("chip", ["any", "m1", "m4", "m5"])
@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("scale", [1.0, 300.0, 1e-5])
def test_flushed_once_gives_the_per_run_bits_and_record(chip: str, big: bool, scale: float) -> None:
    cfg, w = _weights(big)
    outs, events = _run(chip, w, cfg, scale)
    want_outs, want_events = _per_run(chip, w, cfg, scale)
    assert events == want_events
    for got, want in zip(outs, want_outs):
        assert got.tobytes() == want.tobytes()
    if big and chip != "m5" and scale >= 1:  # the case reaches the partials, not only the flush
        hazards = {hazard for (_, hazard), _, _ in events}
        assert {"mac-partial", "subnormal-flush"} <= hazards


def test_the_flushed_weight_is_not_recomputed_on_each_run(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, w = _weights(False)
    backend = SimBackend(compile_budget=10**6, chip="any", sanitize=True)
    kernel = forward.ffn_fwd(cfg, w).compile(backend)
    computed: list[str] = []
    evaluate = EngineNumerics.evaluate

    def counting(self: EngineNumerics, step: Any, values: Any, reference: Any) -> list[Any]:
        if step.op.op_type in MAC_OPS:
            computed.append(step.op.name)
        return evaluate(self, step, values, reference)

    monkeypatch.setattr(EngineNumerics, "evaluate", counting)
    with kernel:
        kernel.inputs[0].write(
            np.random.default_rng(1).standard_normal(kernel.inputs[0].shape).astype(np.float32)
        )
        kernel.run()
    assert computed == []


def _flushes(w: dict[str, Any], cfg: Any, x: np.ndarray, runs: int) -> tuple[np.ndarray, dict[str, int]]:
    """The FFN kernel's output after ``runs`` runs on ``x``, and its subnormal flushes counted per op."""
    backend = SimBackend(compile_budget=10**6, chip="any", sanitize=True)
    kernel = forward.ffn_fwd(cfg, w).compile(backend)
    with kernel:
        kernel.inputs[0].write(x)
        for _ in range(runs):
            kernel.run()
        out = kernel.outputs[0].read().copy()
    assert backend.sanitizer is not None
    events = backend.sanitizer.events.items()
    return out, {op: e.count for (op, hazard), e in events if hazard == "subnormal-flush"}


def test_a_flushed_weight_reads_as_zero_and_is_counted_once_per_run() -> None:
    """An independent check: the kernel computes what it computes with those weights set to +0, and the
    sanitizer counts each of them once per run on top of what that kernel counts."""
    cfg, w = _weights(False)
    zeroed = dict(w)
    planted: dict[str, int] = {}
    for key in ("w1", "w3"):
        small = (np.abs(w[key]) < 2.0**-14) & (w[key] != 0)
        planted[key] = int(np.count_nonzero(small))
        zeroed[key] = np.where(small, np.float32(0.0), w[key]).astype(np.float32)
    assert planted["w1"] >= w["w1"].size // EVERY
    x = np.random.default_rng(2).standard_normal((1, cfg.dim, 1, cfg.seq_len)).astype(np.float32)
    runs = 3
    out, flushes = _flushes(w, cfg, x, runs)
    out_zeroed, flushes_zeroed = _flushes(zeroed, cfg, x, runs)
    assert out.tobytes() == out_zeroed.tobytes()
    extra = {op: n - flushes_zeroed.get(op, 0) for op, n in flushes.items() if n != flushes_zeroed.get(op, 0)}
    assert sorted(extra.values()) == sorted(runs * n for n in planted.values())


def _with_jit(on: bool, cfg: Any, w: dict[str, Any]) -> tuple[list[np.ndarray], list[Any]]:
    os.environ["ANEKIT_JIT"] = "1" if on else "0"
    jit.reset()
    return _run("m5", w, cfg, 300.0)


@pytest.mark.parametrize("big", [False, True])
def test_ties_away_products_agree_compiled_and_in_numpy(big: bool) -> None:
    """M5 rounds a MAC's products with ties away from zero: the compiled rounding and numpy's agree."""
    if not jit.available():
        pytest.skip("numba is not installed: only the numpy paths exist")
    cfg, w = _weights(big)
    saved = os.environ.get("ANEKIT_JIT")
    try:
        compiled, numpy_way = _with_jit(True, cfg, w), _with_jit(False, cfg, w)
    finally:
        os.environ.pop("ANEKIT_JIT", None) if saved is None else os.environ.__setitem__("ANEKIT_JIT", saved)
        jit.reset()
    assert compiled[1] == numpy_way[1]
    for got, want in zip(compiled[0], numpy_way[0]):
        assert got.tobytes() == want.tobytes()


def test_a_constant_operand_is_scanned_once_not_on_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """On M5 (whose MAC ties round away) a MAC's weights are scanned when it is bound, never on a run; the
    activations are scanned on every run, each array once."""
    cfg, w = _weights(False)
    backend = SimBackend(compile_budget=10**6, chip="m5", sanitize=True)
    kernel = forward.ffn_fwd(cfg, w).compile(backend)
    scanned: list[np.ndarray] = []
    scan = numerics_module._scan

    def counting(v: np.ndarray) -> tuple[int, float]:
        scanned.append(v)
        return scan(v)

    monkeypatch.setattr(numerics_module, "_scan", counting)
    with kernel:
        kernel.inputs[0].write(np.ones(kernel.inputs[0].shape, np.float32))
        kernel.run()
    constants = list(kernel.plan.constants.values())
    assert len(scanned) >= 2  # the activation operands: the input, then the hidden layer
    assert not any(v is c for v in scanned for c in constants)
