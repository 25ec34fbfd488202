"""An fp16 input surface kept decoded between runs (``runtime.sim.mirror``): the host's in-place writes are
seen, NaNs still coerced, and every result and sanitizer record is the one the surface decoded on each
run gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from anekit import jit
from anekit.generate.engine import EngineDecoder
from anekit.kernels import dynamic, forward, preset
from anekit.llama.params import Params
from anekit.runtime.base import Surface
from anekit.runtime.sim import SimBackend, SimKernel, mirror

pytestmark = pytest.mark.skipif(not jit.available(), reason="the mirror needs the compiled loops (numba)")

EVERY_SIZE = 1  # with MIRROR_FROM this low every fp16 input is mirrored
NEVER = 1 << 62


def _events(backend: SimBackend) -> list[Any]:
    assert backend.sanitizer is not None
    return sorted((k, e.count, e.largest) for k, e in backend.sanitizer.events.items())


def _decode(chip: str, params: Params) -> tuple[np.ndarray, list[Any]]:
    """Logits of a prompt, three tokens after it, and a second prompt after a reset."""
    backend = SimBackend(compile_budget=10**6, chip=chip, sanitize=True)
    out = []
    with EngineDecoder(params, backend, prefill_width=32) as dec:
        out.append(dec.forward(np.arange(40) % params.cfg.vocab_size, 0))
        for i in range(3):
            out.append(dec.forward([7 + i], 40 + i))
        dec.reset()
        out.append(dec.forward(np.arange(20) % 50, 0))
        out.append(dec.forward([3], 20))
    return np.stack(out), _events(backend)


@pytest.mark.parametrize("chip", ["any", "m1", "m5"])
def test_generation_gives_the_same_bits_on_held_input_sets_as_on_mirrored_surfaces(
    chip: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every generation kernel runs on a held input set written by blocks (``generate.layers.Compiled``);
    the same kernels on plain surfaces, decoded whole on each run or mirrored, give the same logits and the
    same sanitizer records."""
    params = Params.init(preset("default"), seed=3)
    want, want_events = _decode(chip, params)  # held input sets
    monkeypatch.setattr(
        SimKernel, "_new_input", lambda self, like: Surface(like.shape, like.dtype.name, like.name)
    )
    monkeypatch.setattr(mirror, "MIRROR_FROM", NEVER)
    plain, plain_events = _decode(chip, params)
    monkeypatch.setattr(mirror, "MIRROR_FROM", EVERY_SIZE)
    got, events = _decode(chip, params)
    assert plain.tobytes() == want.tobytes() and got.tobytes() == want.tobytes()
    assert plain_events == want_events and events == want_events


def _kernel(kind: str) -> Any:
    """A kernel on m1 (its slices with a width offset saturate past 4094 unless the input's largest value
    says they cannot): the final norm, or the dynamic-weight FFN, whose weights are sliced from its
    input's columns."""
    cfg = preset("default")
    weights = {"rms_final": np.linspace(0.5, 2.0, cfg.dim, dtype=np.float32)}
    backend = SimBackend(compile_budget=10**6, chip="m1", sanitize=True)
    spec = forward.final_rmsnorm(cfg, weights) if kind == "norm" else dynamic.ffn_fwd_dynamic(cfg)
    return spec.compile(backend).load(), backend


@pytest.mark.parametrize("kind", ["norm", "dynamic"])
def test_in_place_writes_nan_and_large_values_are_seen(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    mirrored, m_backend = _kernel(kind)
    plain, p_backend = _kernel(kind)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(mirrored.inputs[0].shape) * 0.1).astype(np.float16)
    edits = [
        lambda b: None,
        lambda b: b.__setitem__((0, slice(3, 9), 0, 5), np.float16(5000.0)),  # a column written in place
        lambda b: b.__setitem__((0, slice(3, 9), 0, -5), np.float16(6000.0)),  # past 4094, a weight column
        lambda b: b.__setitem__((0, 7, 0, 6), np.float16(np.nan)),  # coerced to +inf: the plain way
        lambda b: b.__setitem__((0, 7, 0, 6), np.float16(1e-6)),  # a subnormal where the NaN was
        lambda b: b.__setitem__((0, slice(None), 0, 2), np.float16(-0.0)),
    ]
    for edit in edits:
        for kernel in (mirrored, plain):
            with kernel.inputs[0].view() as buf:
                if edit is edits[0]:
                    buf[...] = x
                edit(buf)
            monkeypatch.setattr(mirror, "MIRROR_FROM", EVERY_SIZE if kernel is mirrored else NEVER)
            kernel.run()
        assert mirrored.outputs[0].read().tobytes() == plain.outputs[0].read().tobytes()
    assert _events(m_backend) == _events(p_backend)
    hazards = {hazard for (_, hazard), _, _ in _events(m_backend)}
    assert "nan-coerced" in hazards
    assert kind != "dynamic" or "slice-saturated" in hazards
    (surface,) = mirrored.inputs
    found = mirrored._mirrors[surface.id]
    assert found is not None  # the mirror served
    with surface.view() as buf:
        assert found.values.tobytes() == buf.astype(np.float32).tobytes()
    assert plain._mirrors[plain.inputs[0].id] is None


def test_the_mirror_decodes_every_half_pattern_as_the_store_does() -> None:
    """Every fp16 pattern (NaNs included) through the table against numpy's own cast."""
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = patterns.view(np.float16).astype(np.float32)
    assert mirror.decode_table().tobytes() == want.tobytes()
    m = mirror.Mirror(np.zeros((1, 1 << 16), np.float16), jit.loops())
    changed, nans, peak, lo, hi = jit.loops().refresh_fp16_mirror(
        patterns, m.seen, m._flat, mirror.decode_table(), m._nans, m._peaks, mirror.BLOCK, 1 << 16
    )
    assert (lo, hi) == (1, 1 << 16)  # every column but the first (+0) changed
    assert m.values.tobytes() == want.reshape(1, -1).tobytes()
    assert changed == (1 << 16) - 1  # every pattern but +0, which was there
    assert nans == int(np.count_nonzero(np.isnan(want)))
    assert mirror.decode_table()[peak] == np.inf  # the largest non-NaN magnitude


def test_a_surface_rewritten_whole_is_no_longer_mirrored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step rewrites its packed weights whole: the second copy is let go, the results stay."""
    monkeypatch.setattr(mirror, "MIRROR_FROM", EVERY_SIZE)
    mirrored, _ = _kernel("dynamic")
    monkeypatch.setattr(mirror, "MIRROR_FROM", NEVER)
    plain, _ = _kernel("dynamic")
    rng = np.random.default_rng(1)
    (surface,) = mirrored.inputs
    for step in range(3):
        x = (rng.standard_normal(surface.shape) * 0.1).astype(np.float32)
        for kernel in (mirrored, plain):
            monkeypatch.setattr(mirror, "MIRROR_FROM", EVERY_SIZE if kernel is mirrored else NEVER)
            kernel.inputs[0].write(x)
            kernel.run()
        assert mirrored.outputs[0].read().tobytes() == plain.outputs[0].read().tobytes()
        assert (surface.id in mirrored._mirrors) == (step == 0)
    assert surface.id in mirrored._unmirrored


def test_the_nan_count_and_peak_follow_every_change_block_by_block() -> None:
    """Columns rewritten one after another, NaNs and infinities written into some and overwritten later,
    a size that is no multiple of a block: after each refresh the count and the peak are those of the whole
    buffer read again, and the values its cast."""
    rng = np.random.default_rng(11)
    buf = rng.standard_normal((1, 37, 1, 61)).astype(np.float16)
    m = mirror.Mirror(buf, jit.loops())
    for step in range(40):
        col = int(rng.integers(0, 61))
        buf[0, :, 0, col] = rng.standard_normal(37).astype(np.float16)
        if step % 3 == 0:
            buf[0, int(rng.integers(0, 37)), 0, col] = np.nan
        if step % 7 == 0:
            buf[0, int(rng.integers(0, 37)), 0, int(rng.integers(0, 61))] = -np.inf
        m.refresh(buf)
        bits = buf.view(np.uint16) & np.uint16(0x7FFF)
        nan = bits > np.uint16(0x7C00)
        assert m.nans == int(np.count_nonzero(nan))
        assert m.peak == float(np.max(np.abs(buf[~nan]).astype(np.float32)))
        assert m.values.tobytes() == buf.astype(np.float32).tobytes()
