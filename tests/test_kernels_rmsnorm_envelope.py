"""RMSNorm kernels inside the engine's numeric envelope: 768 channels at RMS 0.005 and RMS 100, on the m1
profile (subnormals flushed in the MAC, the 2^15 port) and on "any", against float64 references.

At RMS 0.005 a fixed 1/sqrt(C) pre-scale makes every square an fp16 subnormal (about 3e-8) that a
flushing unit drops (1/rms would come out about 6x too large or infinite); at RMS 100 the plain squares
overflow. ``KernelBuilder.rms_inverse`` divides by the row's max |x| first (its docstring says why).
"""

from __future__ import annotations

import numpy as np
import pytest

from anekit.kernels import ModelConfig, backward, forward, reference
from anekit.runtime.sim import SimBackend
from tests.kernel_weights import fp16_exact

CFG = ModelConfig(768, 2048, 1, 12, 12, 32, 64, name="dim768")
TOL = 5e-3  # max-abs error relative to the reference's max-abs: fp16 storage through ~12 ops


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _inputs(rms: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = fp16_exact(rms * rng.standard_normal((CFG.dim, CFG.seq_len)))
    dy = fp16_exact(rng.standard_normal((CFG.dim, CFG.seq_len)))
    scale = 1 + 0.1 * rng.standard_normal(CFG.dim)
    return x, dy, scale


@pytest.mark.parametrize("chip", ["m1", "any"])
@pytest.mark.parametrize("rms", [0.005, 100.0])
def test_rmsnorm_forward_in_the_envelope(chip, rms):
    x, _, scale = _inputs(rms, 31)
    backend = SimBackend(chip=chip, sanitize=True)
    got = forward.final_rmsnorm(CFG, {"rms_final": scale}).run(backend, x=x)["xnorm"]
    want = reference.rmsnorm(x.astype(np.float64), scale, CFG.norm_eps)
    assert np.all(np.isfinite(got))
    assert _rel(got, want) < TOL
    hazards = {h for rec in backend.sanitizer.records() for h in rec["hazards"]}
    assert not hazards & {"mac-ceiling", "mac-partial", "indeterminate"}


@pytest.mark.parametrize("chip", ["m1", "any"])
@pytest.mark.parametrize("rms", [0.005, 100.0])
def test_rmsnorm_backward_in_the_envelope(chip, rms):
    x, dy, scale = _inputs(rms, 32)
    got = backward.rmsnorm_bwd(CFG, {"w": scale}).run(SimBackend(chip=chip), dy=dy, x=x)["dx"]
    want, _ = reference.rmsnorm_bwd(dy, x, scale, CFG.norm_eps)
    assert np.all(np.isfinite(got))
    assert _rel(got, want) < TOL


def test_a_fixed_prescale_fails_where_the_max_scale_holds():
    """The known-bad control: the 1/sqrt(C)-pre-scaled sum of squares run through a flushing MAC (a
    matmul against ones, as the guide routes reductions) loses the small end entirely at RMS 0.005."""
    from anekit import mil
    from anekit.mil import tensor

    x, _, _ = _inputs(0.005, 33)
    c = CFG.dim

    @mil.program(inputs={"x": tensor("fp16", [1, 1, 1, c])})
    def prescaled(f, v):
        xs = f.mul(x=v, y=float(1 / np.sqrt(c)))
        return f.matmul(x=f.mul(x=xs, y=xs), y=np.ones((c, 1), np.float32))

    col = x[:, :1].reshape(1, 1, 1, c)
    with SimBackend(chip="m1", strict=False).compile(prescaled) as k:
        (ms,) = k(x=col).values()
    assert ms.item() == 0  # every square a subnormal, flushed: 1/rms would be 1/sqrt(eps), not ~200
    with SimBackend(chip="m5", strict=False).compile(prescaled) as k:
        (ms5,) = k(x=col).values()
    assert ms5.item() > 0  # M5 keeps subnormals in the MAC
