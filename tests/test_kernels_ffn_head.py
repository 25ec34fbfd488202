"""FFN and head kernels (final RMSNorm, classifier, vocab softmax) and the FFN / RMSNorm backward
kernels against their float64 references; the backward references against central finite differences
of the forward references."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.kernels import LayoutError, ModelConfig, backward, catalog, forward, preset, reference
from tests.kernel_weights import fp16_exact, random_layer, stories260k_layer

CONFIGS = {
    "gqa-rope": ModelConfig(64, 128, 1, 8, 4, 100, 32),
    "mha-rope": ModelConfig(64, 160, 1, 4, 4, 100, 32),
    "gqa-norope": ModelConfig(48, 96, 1, 6, 2, 100, 32, rope=False),
    "mqa-rope": ModelConfig(32, 64, 1, 4, 1, 100, 32),
}
TOL = 5e-3  # kernel vs reference, relative to the output's max-abs (measured: 2.4e-4 .. 1.4e-3)
FD_TOL = 1e-6  # backward reference vs central differences of the forward reference


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _normal(rng: np.random.Generator, rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
    return fp16_exact(scale * rng.standard_normal((rows, cols)))


def _check_directional(
    f: Callable[..., np.ndarray],
    args: list[np.ndarray],
    upstream: np.ndarray,
    grads: list[np.ndarray],
    rng: np.random.Generator,
    trials: int = 3,
    eps: float = 1e-5,
) -> float:
    """Worst relative gap between <grads, d> and the central difference of <upstream, f(args + t d)>."""
    worst = 0.0
    for _ in range(trials):
        dirs = [rng.standard_normal(a.shape) * np.sqrt(np.mean(a * a)) for a in args]  # step relative to a

        plus = f(*(a + eps * d for a, d in zip(args, dirs)))
        minus = f(*(a - eps * d for a, d in zip(args, dirs)))
        numeric = float(np.sum(upstream * (plus - minus))) / (2 * eps)
        analytic = sum(float(np.sum(g * d)) for g, d in zip(grads, dirs))
        worst = max(worst, abs(numeric - analytic) / abs(analytic))
    return worst


# -- forward kernels ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_ffn_fwd_matches_the_reference(name):
    cfg = CONFIGS[name]
    w = random_layer(cfg, seed=1)
    x = _normal(np.random.default_rng(2), cfg.dim, cfg.seq_len)
    got = forward.ffn_fwd(cfg, w).run(runtime.open("sim"), x=x)
    want = reference.ffn_fwd(cfg, x, w)
    assert list(got) == ["ffn_out", "h1", "h3", "silu_out", "x2norm"]
    for tap in want:
        assert got[tap].shape == want[tap].shape
        assert _rel(got[tap], want[tap]) < TOL, tap


@pytest.mark.parametrize("name", CONFIGS)
def test_head_forward_kernels_match_the_references(name):
    cfg = CONFIGS[name]
    w = random_layer(cfg, seed=3)
    rng = np.random.default_rng(4)
    sim = runtime.open("sim")
    x = _normal(rng, cfg.dim, cfg.seq_len)
    got = forward.final_rmsnorm(cfg, w).run(sim, x=x)["xnorm"]
    assert _rel(got, reference.final_rmsnorm(cfg, x, w)["xnorm"]) < TOL
    xn = fp16_exact(got)
    got = forward.classifier_fwd(cfg, w).run(sim, x=xn)["logits"]
    assert got.shape == (cfg.vocab_size, cfg.seq_len)
    assert _rel(got, reference.classifier_fwd(cfg, xn, w)["logits"]) < TOL
    logits = fp16_exact(4.0 * rng.standard_normal((cfg.vocab_size, cfg.seq_len)) + 20.0)  # needs a max-shift
    probs = forward.softmax_vocab(cfg).run(sim, logits=logits)["probs"]
    assert _rel(probs, reference.softmax_vocab(cfg, logits)["probs"]) < 1e-3  # one fp16 rounding
    assert np.allclose(probs.sum(axis=0), 1.0, atol=2e-3)


def test_real_checkpoint_ffn_and_head():
    cfg, w = stories260k_layer(0)
    cfg = cfg.with_(seq_len=32)
    w16 = {k: fp16_exact(v) for k, v in w.items()}
    x = fp16_exact(w["embed"][np.arange(32) * 7 % cfg.vocab_size].T)  # (dim, 32): token embeddings
    sim = runtime.open("sim")
    got = forward.ffn_fwd(cfg, w16).run(sim, x=x)
    want = reference.ffn_fwd(cfg, x, w16)
    for tap in want:
        assert _rel(got[tap], want[tap]) < 1e-2, tap
    xn = forward.final_rmsnorm(cfg, w16).run(sim, x=x)["xnorm"]
    assert _rel(xn, reference.final_rmsnorm(cfg, x, w16)["xnorm"]) < 1e-2
    logits = forward.classifier_fwd(cfg, w16).run(sim, x=fp16_exact(xn))["logits"]
    assert _rel(logits, reference.classifier_fwd(cfg, fp16_exact(xn), w16)["logits"]) < 1e-2


# -- backward kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_ffn_bwd_matches_the_reference(name):
    cfg = CONFIGS[name]
    w = random_layer(cfg, seed=5)
    rng = np.random.default_rng(6)
    taps = reference.ffn_fwd(cfg, _normal(rng, cfg.dim, cfg.seq_len), w)
    h1, h3 = fp16_exact(taps["h1"]), fp16_exact(taps["h3"])
    dffn = _normal(rng, cfg.dim, cfg.seq_len)
    got = backward.ffn_bwd(cfg, w).run(runtime.open("sim"), dffn=dffn, h1=h1, h3=h3)
    want = reference.ffn_bwd(cfg, dffn, h1, h3, w)
    assert list(got) == ["dx", "dh1", "dh3"]
    for part in want:
        assert got[part].shape == want[part].shape
        assert _rel(got[part], want[part]) < TOL, part


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("x_rms", [1.0, 0.02])
def test_rmsnorm_bwd_matches_the_reference(name, x_rms):
    # rms 0.02: r = 50, r^3 = 125000 would overflow fp16 in the textbook formula
    cfg = CONFIGS[name]
    scale = random_layer(cfg, seed=7)["rms_ffn"]
    rng = np.random.default_rng(8)
    dy, x = _normal(rng, cfg.dim, cfg.seq_len), _normal(rng, cfg.dim, cfg.seq_len, x_rms)
    got = backward.rmsnorm_bwd(cfg, {"w": scale}).run(runtime.open("sim"), dy=dy, x=x)["dx"]
    want, _ = reference.rmsnorm_bwd(dy, x, scale, cfg.norm_eps)
    assert np.all(np.isfinite(got))
    assert _rel(got, want) < TOL


def test_ffn_and_rmsnorm_bwd_kernels_chain_to_the_residual_gradient():
    """rmsnorm_bwd(ffn_bwd(dffn).dx) on the engine is the gradient of ffn_out w.r.t. the residual x."""
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg, seed=11)
    rng = np.random.default_rng(12)
    sim = runtime.open("sim")
    x, dffn = _normal(rng, cfg.dim, cfg.seq_len), _normal(rng, cfg.dim, cfg.seq_len)
    taps = forward.ffn_fwd(cfg, w).run(sim, x=x)
    dxn = backward.ffn_bwd(cfg, w).run(sim, dffn=dffn, h1=taps["h1"], h3=taps["h3"])["dx"]
    dx = catalog.build("rmsnorm_ffn_bwd", cfg, w).run(sim, dy=dxn, x=x)["dx"]
    want = reference.rmsnorm_bwd(
        reference.ffn_bwd(cfg, dffn, *(reference.ffn_fwd(cfg, x, w)[k] for k in ("h1", "h3")), w)["dx"],
        x,
        w["rms_ffn"],
        cfg.norm_eps,
    )[0]
    assert _rel(dx, want) < 1e-2


# -- backward references against finite differences ---------------------------------------------------


@pytest.mark.parametrize("name", ["gqa-rope", "mqa-rope"])
def test_ffn_bwd_reference_matches_finite_differences(name):
    cfg = CONFIGS[name]
    w = random_layer(cfg, seed=13)
    rng = np.random.default_rng(14)
    xn = rng.standard_normal((cfg.dim, cfg.seq_len))
    dffn = rng.standard_normal((cfg.dim, cfg.seq_len))
    h1, h3 = w["w1"] @ xn, w["w3"] @ xn
    g = reference.ffn_bwd(cfg, dffn, h1, h3, w)
    assert _check_directional(lambda a: reference.ffn(a, w), [xn], dffn, [g["dx"]], rng) < FD_TOL
    down = lambda a, b: reference.ffn_down(a, b, w)  # noqa: E731
    assert _check_directional(down, [h1, h3], dffn, [g["dh1"], g["dh3"]], rng) < FD_TOL
    # each input on its own: perturb only h1, then only h3
    only_h1 = lambda a: reference.ffn_down(a, h3, w)  # noqa: E731
    only_h3 = lambda b: reference.ffn_down(h1, b, w)  # noqa: E731
    assert _check_directional(only_h1, [h1], dffn, [g["dh1"]], rng) < FD_TOL
    assert _check_directional(only_h3, [h3], dffn, [g["dh3"]], rng) < FD_TOL


@pytest.mark.parametrize("x_rms", [1.0, 0.02, 1e-3])
def test_rmsnorm_bwd_reference_matches_finite_differences(x_rms):
    rng = np.random.default_rng(15)
    channels, seq, eps = 24, 7, 1e-5
    x = x_rms * rng.standard_normal((channels, seq))
    scale = 1 + 0.1 * rng.standard_normal(channels)
    dy = rng.standard_normal((channels, seq))
    dx, dscale = reference.rmsnorm_bwd(dy, x, scale, eps)
    assert _check_directional(lambda a: reference.rmsnorm(a, scale, eps), [x], dy, [dx], rng) < FD_TOL
    by_scale = lambda s: reference.rmsnorm(x, s, eps)  # noqa: E731
    assert _check_directional(by_scale, [scale], dy, [dscale], rng) < FD_TOL


def test_rmsnorm_bwd_reference_per_element():
    rng = np.random.default_rng(16)
    x, scale, dy = rng.standard_normal((4, 3)), rng.standard_normal(4), rng.standard_normal((4, 3))
    dx, _ = reference.rmsnorm_bwd(dy, x, scale, 1e-5)
    h = 1e-6
    for i in range(4):
        for j in range(3):
            e = np.zeros_like(x)
            e[i, j] = h
            numeric = np.sum(
                dy * (reference.rmsnorm(x + e, scale, 1e-5) - reference.rmsnorm(x - e, scale, 1e-5))
            )
            assert abs(numeric / (2 * h) - dx[i, j]) < 1e-6 * np.max(np.abs(dx))


def test_chained_ffn_and_rmsnorm_bwd_references_match_finite_differences_of_ffn_fwd():
    cfg = CONFIGS["gqa-norope"]
    w = random_layer(cfg, seed=19)
    rng = np.random.default_rng(20)
    x, dffn = rng.standard_normal((cfg.dim, cfg.seq_len)), rng.standard_normal((cfg.dim, cfg.seq_len))
    taps = reference.ffn_fwd(cfg, x, w)
    dxn = reference.ffn_bwd(cfg, dffn, taps["h1"], taps["h3"], w)["dx"]
    dx, _ = reference.rmsnorm_bwd(dxn, x, w["rms_ffn"], cfg.norm_eps)
    ffn_out = lambda a: reference.ffn_fwd(cfg, a, w)["ffn_out"]  # noqa: E731
    assert _check_directional(ffn_out, [x], dffn, [dx], rng) < FD_TOL


# -- shapes, presets, errors --------------------------------------------------------------------------

GENERATORS = {
    "ffn_fwd": forward.ffn_fwd,
    "final_rmsnorm": forward.final_rmsnorm,
    "classifier_fwd": forward.classifier_fwd,
    "softmax_vocab": forward.softmax_vocab,
    "ffn_bwd": backward.ffn_bwd,
    "rmsnorm_bwd": backward.rmsnorm_bwd,
}


def _channels(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    d, h, v = cfg.dim, cfg.hidden_dim, cfg.vocab_size
    return {
        "ffn_fwd": (d, 2 * d + 3 * h),
        "final_rmsnorm": (d, d),
        "classifier_fwd": (d, v),
        "softmax_vocab": (v, v),
        "ffn_bwd": (d + 2 * h, d + 2 * h),
        "rmsnorm_bwd": (2 * d, d),
    }


@pytest.mark.parametrize("preset_name", ["stories15M", "stories110M"])
@pytest.mark.parametrize("kernel", GENERATORS)
def test_presets_generate_programs_whose_shapes_verify(preset_name, kernel):
    cfg = preset(preset_name)
    spec = GENERATORS[kernel](cfg)
    mil.verify(spec.program)
    assert (spec.inputs.channels, spec.outputs.channels) == _channels(cfg)[kernel]
    assert spec.inputs.spatial == spec.outputs.spatial == cfg.seq_len


def test_layouts():
    cfg = CONFIGS["gqa-rope"]
    assert forward.ffn_fwd_layout(cfg).parts == (
        ("ffn_out", 64),
        ("h1", 128),
        ("h3", 128),
        ("silu_out", 128),
        ("x2norm", 64),
    )
    ins, outs = backward.ffn_bwd_layouts(cfg)
    assert ins.parts == (("dffn", 64), ("h1", 128), ("h3", 128))
    assert outs.parts == (("dx", 64), ("dh1", 128), ("dh3", 128))
    ins, outs = backward.rmsnorm_bwd_layouts(cfg)
    assert ins.parts == (("dy", 64), ("x", 64)) and outs.parts == (("dx", 64),)


def test_weights_of_the_wrong_shape_are_rejected():
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg)
    with pytest.raises(LayoutError, match=r"weight 'w2' has shape \[128, 64\], expected \[64, 128\]"):
        backward.ffn_bwd(cfg, {**w, "w2": w["w2"].T})
    with pytest.raises(LayoutError, match="weight 'w' was not given"):
        backward.rmsnorm_bwd(cfg, {"rms_ffn": w["rms_ffn"]})
    with pytest.raises(LayoutError, match=r"weight 'w' has shape \[32\], expected \[64\]"):
        backward.rmsnorm_bwd(cfg, {"w": w["rms_ffn"][:32]})
