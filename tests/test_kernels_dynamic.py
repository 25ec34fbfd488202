"""Dynamic-weight layer kernels against float64 references; new weights every run, one compile."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.kernels import ConfigError, LayoutError, ModelConfig, dynamic, forward, preset, reference
from tests.kernel_weights import fp16_exact, random_layer

CONFIGS = {
    "gqa-rope": ModelConfig(64, 128, 1, 8, 4, 100, 32),
    "mha-norope": ModelConfig(64, 128, 1, 4, 4, 100, 16, rope=False),
    "gqa-norope": ModelConfig(48, 96, 1, 6, 2, 100, 16, rope=False),
    "mqa-rope": ModelConfig(32, 64, 1, 4, 1, 100, 24),
}
GENERATORS = {
    "sdpa_fwd_dynamic": dynamic.sdpa_fwd_dynamic,
    "ffn_fwd_dynamic": dynamic.ffn_fwd_dynamic,
    "ffn_bwd_dynamic": dynamic.ffn_bwd_dynamic,
    "qkv_bwd_dynamic": dynamic.qkv_bwd_dynamic,
}


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _qkv_bwd_reference(dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, w: dict) -> dict[str, np.ndarray]:
    """dx (dim, S) = Wq^T dq + Wk^T dk + Wv^T dv, written per projection."""
    dx = np.zeros((w["wq"].shape[1], dq.shape[1]))
    for key, grad in (("wq", dq), ("wk", dk), ("wv", dv)):
        dx += np.asarray(w[key], dtype=np.float64).T @ np.asarray(grad, dtype=np.float64)
    return {"dx": dx}


def _case(name: str, cfg: ModelConfig, w: dict, seed: int) -> tuple[dict, dict]:
    """Activation parts (fp16 values) of kernel ``name`` and its float64 reference outputs."""
    rng = np.random.default_rng(seed)
    d, kv, s = cfg.dim, cfg.kv_dim, cfg.seq_len
    if name in ("sdpa_fwd_dynamic", "ffn_fwd_dynamic"):
        x = fp16_exact(rng.standard_normal((d, s)))
        ref = reference.sdpa_fwd if name == "sdpa_fwd_dynamic" else reference.ffn_fwd
        return {"x": x}, ref(cfg, x, w)
    if name == "ffn_bwd_dynamic":
        taps = reference.ffn_fwd(cfg, rng.standard_normal((d, s)), w)  # realistic h1, h3
        parts = {
            "dffn": fp16_exact(rng.standard_normal((d, s))),
            "h1": fp16_exact(taps["h1"]),
            "h3": fp16_exact(taps["h3"]),
        }
        return parts, reference.ffn_bwd(cfg, parts["dffn"], parts["h1"], parts["h3"], w)
    parts = {
        "dq": rng.standard_normal((d, s)),
        "dk": rng.standard_normal((kv, s)),
        "dv": rng.standard_normal((kv, s)),
    }
    parts = {k: fp16_exact(v) for k, v in parts.items()}
    return parts, _qkv_bwd_reference(parts["dq"], parts["dk"], parts["dv"], w)


def _check(got: dict, want: dict, tol: float) -> None:
    assert list(got) == list(want)
    for tap in want:
        assert got[tap].shape == want[tap].shape, tap
        assert _rel(got[tap], want[tap]) < tol, tap


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("name", GENERATORS)
def test_dynamic_kernel_matches_the_reference(name, cfg_name):
    cfg = CONFIGS[cfg_name]
    w = random_layer(cfg, seed=1)
    parts, want = _case(name, cfg, w, seed=2)
    spec = GENERATORS[name](cfg)
    _check(spec.run(runtime.open("sim"), w, **parts), want, 3e-3)


@pytest.mark.parametrize("name", GENERATORS)
def test_one_compile_serves_two_weight_sets(name):
    cfg = CONFIGS["gqa-rope"]
    backend = runtime.open("sim")
    spec = GENERATORS[name](cfg)
    kernel = spec.compile(backend)
    compiles = backend.compile_count
    outputs = []
    for seed in (1, 2):
        w = random_layer(cfg, seed=seed)
        parts, want = _case(name, cfg, w, seed=3)  # same activations, different weights
        got = spec.run(kernel, w, **parts)
        _check(got, want, 3e-3)
        outputs.append(got)
    assert backend.compile_count == compiles
    first = next(iter(outputs[0]))
    assert not np.allclose(outputs[0][first], outputs[1][first])  # the new weights really were used


@pytest.mark.parametrize("cfg_name", ["gqa-rope", "gqa-norope"])
def test_dynamic_forward_kernels_agree_with_the_baked_ones(cfg_name):
    cfg = CONFIGS[cfg_name]
    w = random_layer(cfg, seed=4)
    x = fp16_exact(np.random.default_rng(5).standard_normal((cfg.dim, cfg.seq_len)))
    backend = runtime.open("sim")
    for baked, dyn in (
        (forward.sdpa_fwd, dynamic.sdpa_fwd_dynamic),
        (forward.ffn_fwd, dynamic.ffn_fwd_dynamic),
    ):
        want = baked(cfg, w).run(backend, x=x)
        got = dyn(cfg).run(backend, w, x=x)
        for tap in want:
            # Same fp16 storage points; only fp32 summation order differs.
            assert _rel(got[tap], want[tap]) < 1e-3, tap


def test_packed_input_runs_as_a_plain_kernel_spec():
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg, seed=6)
    spec = dynamic.ffn_bwd_dynamic(cfg)
    parts, _ = _case("ffn_bwd_dynamic", cfg, w, seed=7)
    packed = spec.pack(w, **parts)
    assert packed.shape == (1, spec.inputs.channels, 1, spec.inputs.spatial)
    backend = runtime.open("sim")
    got, again = spec.run(backend, x=packed), spec.run(backend, w, **parts)
    for tap in got:
        np.testing.assert_array_equal(got[tap], again[tap])


# -- the packed layouts ------------------------------------------------------------------------------


def test_sdpa_fwd_columns():
    cfg = CONFIGS["gqa-rope"]  # dim 64, kv_dim 32, seq 32
    spec = dynamic.sdpa_fwd_dynamic(cfg)
    cols = spec.columns
    assert cols.names == ["act", "wq_t", "wk_t", "wv_t", "wo_t", "rms_att"]
    assert [cols.range(n) for n in cols.names] == [
        (0, 32),
        (32, 64),
        (96, 32),
        (128, 32),
        (160, 64),
        (224, 1),
    ]
    assert (spec.inputs.channels, spec.inputs.spatial) == (64, 225)
    assert spec.outputs == forward.sdpa_fwd_layout(cfg)
    w = random_layer(cfg, seed=8)
    blocks = spec.weight_columns(w)
    np.testing.assert_array_equal(blocks["wk_t"], w["wk"].T)  # (dim, kv_dim)
    np.testing.assert_array_equal(blocks["rms_att"][:, 0], w["rms_att"])
    # The mask and RoPE's pair swap and tables are baked: not trained, so not in the input.
    assert [name for name, _, _ in spec.weights.entries] == [
        "rope_swap_64",
        "rope_cos_64",
        "rope_sin_64",
        "rope_swap_32",
        "rope_cos_32",
        "rope_sin_32",
    ]
    assert list(spec.shared_files) == ["@model_path/weights/mask.bin"]  # the cached causal mask blob


def test_ffn_columns_and_row_padding():
    cfg = CONFIGS["gqa-rope"]  # dim 64, hidden 128, seq 32
    d, h, s = cfg.dim, cfg.hidden_dim, cfg.seq_len
    w = random_layer(cfg, seed=9)
    fwd = dynamic.ffn_fwd_dynamic(cfg)
    assert fwd.columns.names == ["act", "w1_t", "w3_t", "w2", "rms_ffn"]
    assert (fwd.inputs.channels, fwd.inputs.spatial) == (d, s + 3 * h + 1)
    np.testing.assert_array_equal(fwd.weight_columns(w)["w2"], w["w2"])  # packed untransposed
    bwd = dynamic.ffn_bwd_dynamic(cfg)
    assert (bwd.inputs.channels, bwd.inputs.spatial) == (d + 2 * h, s + 2 * d)
    parts, _ = _case("ffn_bwd_dynamic", cfg, w, seed=10)
    split = bwd.columns.split(bwd.pack(w, **parts))
    rows = bwd.pack(w, **parts).reshape(d + 2 * h, -1)
    np.testing.assert_array_equal(split["w2_t"], w["w2"].T)
    np.testing.assert_array_equal(split["w13"], np.concatenate([w["w1"], w["w3"]]))
    np.testing.assert_array_equal(rows[h:, s : s + d], 0)  # w2_t uses hidden of the dim + 2 hidden rows
    np.testing.assert_array_equal(rows[2 * h :, s + d :], 0)  # w13 uses 2 hidden rows
    qkv = dynamic.qkv_bwd_dynamic(cfg)
    assert (qkv.inputs.channels, qkv.inputs.spatial) == (d + 2 * cfg.kv_dim, s + d)
    np.testing.assert_array_equal(qkv.weight_columns(w)["wqkv"], np.concatenate([w["wq"], w["wk"], w["wv"]]))


def test_wrong_weight_shapes_are_rejected():
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg)
    w["wk"] = w["wk"].T
    with pytest.raises(LayoutError, match=r"weight 'wk' has shape \[64, 32\], expected \[32, 64\]"):
        dynamic.sdpa_fwd_dynamic(cfg).pack(w, x=np.zeros((64, 32)))
    with pytest.raises(LayoutError, match="weight 'w3' was not given"):
        dynamic.ffn_bwd_dynamic(cfg).weight_columns({"w1": w["w1"], "w2": w["w2"]})


# -- limits and presets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cfg", "width"),
    [
        ("sdpa_fwd_dynamic", ModelConfig(8192, 8192, 1, 64, 64, 100, 256), 256 + 4 * 8192 + 1),
        ("ffn_fwd_dynamic", ModelConfig(4096, 11008, 1, 32, 32, 100, 256), 256 + 3 * 11008 + 1),
        ("ffn_bwd_dynamic", ModelConfig(16384, 16384, 1, 128, 128, 100, 256), 256 + 2 * 16384),
        ("qkv_bwd_dynamic", ModelConfig(1024, 2048, 1, 2, 2, 100, 32000), 32000 + 1024),
    ],
)
def test_inputs_wider_than_the_spatial_limit_are_rejected(name, cfg, width):
    with pytest.raises(
        ConfigError, match=rf"\[{name}\] seq {cfg.seq_len} .* = {width} columns exceeds .*15-bit"
    ):
        GENERATORS[name](cfg)


@pytest.mark.parametrize("preset_name", ["stories15M", "stories110M"])
@pytest.mark.parametrize("name", GENERATORS)
def test_presets_generate_programs_that_verify(name, preset_name):
    cfg = preset(preset_name)
    spec = GENERATORS[name](cfg)
    mil.verify(spec.program)
    assert spec.inputs.spatial == spec.columns.columns <= 0x7FFF
    assert spec.activations.spatial == cfg.seq_len
    if preset_name == "stories15M":
        mil.verify(mil.parse(spec.text()))


# -- the float64 backward references against finite differences --------------------------------------


def _directional(f, x: np.ndarray, u: np.ndarray, eps: float = 1e-5) -> float:
    return (f(x + eps * u) - f(x - eps * u)) / (2 * eps)


def test_ffn_bwd_reference_matches_finite_differences():
    cfg = ModelConfig(16, 24, 1, 2, 2, 10, 5)
    rng = np.random.default_rng(11)
    w = {k: rng.standard_normal(v.shape) / 3 for k, v in random_layer(cfg).items()}
    xn = rng.standard_normal((cfg.dim, cfg.seq_len))
    dffn = rng.standard_normal((cfg.dim, cfg.seq_len))
    h1, h3 = w["w1"] @ xn, w["w3"] @ xn
    grads = reference.ffn_bwd(cfg, dffn, h1, h3, w)
    loss_x = lambda a: float(np.sum(dffn * reference.ffn(a, w)))  # noqa: E731
    loss_h1 = lambda a: float(np.sum(dffn * reference.ffn_down(a, h3, w)))  # noqa: E731
    loss_h3 = lambda a: float(np.sum(dffn * reference.ffn_down(h1, a, w)))  # noqa: E731
    for _ in range(3):
        for f, at, grad in (
            (loss_x, xn, grads["dx"]),
            (loss_h1, h1, grads["dh1"]),
            (loss_h3, h3, grads["dh3"]),
        ):
            u = rng.standard_normal(at.shape)
            fd, an = _directional(f, at, u), float(np.sum(grad * u))
            assert abs(fd - an) <= 1e-6 * max(1.0, abs(an))


def test_qkv_bwd_reference_matches_finite_differences():
    cfg = ModelConfig(16, 24, 1, 4, 2, 10, 5)
    rng = np.random.default_rng(12)
    w = {k: rng.standard_normal(v.shape) for k, v in random_layer(cfg).items()}
    d, kv, s = cfg.dim, cfg.kv_dim, cfg.seq_len
    dq, dk, dv = rng.standard_normal((d, s)), rng.standard_normal((kv, s)), rng.standard_normal((kv, s))

    def loss(xn: np.ndarray) -> float:
        return float(np.sum(dq * (w["wq"] @ xn)) + np.sum(dk * (w["wk"] @ xn)) + np.sum(dv * (w["wv"] @ xn)))

    dx = _qkv_bwd_reference(dq, dk, dv, w)["dx"]
    xn = rng.standard_normal((d, s))
    for _ in range(3):
        u = rng.standard_normal((d, s))
        fd, an = _directional(loss, xn, u), float(np.sum(dx * u))
        assert abs(fd - an) <= 1e-6 * max(1.0, abs(an))
