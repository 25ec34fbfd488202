"""Dynamic-weight layer kernels against float64 references; new weights every run, one compile."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.cli.train_cmd import _config as train_config
from anekit.kernels import (
    ConfigError,
    LayoutError,
    ModelConfig,
    backward,
    catalog,
    composable,
    dynamic,
    forward,
    reference,
)
from tests.kernel_weights import fp16_exact, random_layer

CONFIGS = {
    "gqa-rope": ModelConfig(64, 128, 1, 8, 4, 100, 32),
    "mha-norope": ModelConfig(64, 128, 1, 4, 4, 100, 32, rope=False),
    "gqa-norope": ModelConfig(48, 96, 1, 6, 2, 100, 32, rope=False),
    "mqa-rope": ModelConfig(32, 64, 1, 4, 1, 100, 32),
}
GENERATORS = {
    "sdpa_fwd_dynamic": dynamic.sdpa_fwd_dynamic,
    "ffn_fwd_dynamic": dynamic.ffn_fwd_dynamic,
    "ffn_bwd_w2t_dynamic": dynamic.ffn_bwd_w2t_dynamic,
    "ffn_bwd_w13t_dynamic": dynamic.ffn_bwd_w13t_dynamic,
    "qkv_bwd_dynamic": dynamic.qkv_bwd_dynamic,
}
# Every preset and the model ``anekit train`` uses by default.
MODELS = ["stories260K", "stories15M", "stories110M", "default"]


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _qkv_bwd_reference(dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, w: dict) -> dict[str, np.ndarray]:
    """dx (dim, S) = Wq^T dq + Wk^T dk + Wv^T dv, written per projection."""
    dx = np.zeros((w["wq"].shape[1], dq.shape[1]))
    for key, grad in (("wq", dq), ("wk", dk), ("wv", dv)):
        dx += np.asarray(w[key], dtype=np.float64).T @ np.asarray(grad, dtype=np.float64)
    return {"dx": dx}


def _swiglu_bwd_reference(
    dgate: np.ndarray, h1: np.ndarray, h3: np.ndarray, w: dict
) -> dict[str, np.ndarray]:
    """float64 dx, dh1, dh3 of gate = silu(h1) * h3 and x2norm -> (W1 x, W3 x), given dgate (hidden, S)."""
    dgate, h1, h3 = (np.asarray(a, dtype=np.float64) for a in (dgate, h1, h3))
    sig = 1.0 / (1.0 + np.exp(-h1))
    dh1 = dgate * h3 * (sig + h1 * sig * (1.0 - sig))  # d silu / d h1 = sig + h1 sig (1 - sig)
    dh3 = dgate * h1 * sig
    w1, w3 = np.asarray(w["w1"], dtype=np.float64), np.asarray(w["w3"], dtype=np.float64)
    return {"dx": w1.T @ dh1 + w3.T @ dh3, "dh1": dh1, "dh3": dh3}


def _case(name: str, cfg: ModelConfig, w: dict, seed: int) -> tuple[dict, dict]:
    """Activation parts (fp16 values) of kernel ``name`` and its float64 reference outputs."""
    rng = np.random.default_rng(seed)
    d, kv, s = cfg.dim, cfg.kv_dim, cfg.seq_len
    if name in ("sdpa_fwd_dynamic", "ffn_fwd_dynamic"):
        x = fp16_exact(rng.standard_normal((d, s)))
        ref = reference.sdpa_fwd if name == "sdpa_fwd_dynamic" else reference.ffn_fwd
        return {"x": x}, ref(cfg, x, w)
    if name == "ffn_bwd_w2t_dynamic":
        dffn = fp16_exact(rng.standard_normal((d, s)))
        return {"dffn": dffn}, {"dgate": np.asarray(w["w2"], dtype=np.float64).T @ dffn}
    if name == "ffn_bwd_w13t_dynamic":
        taps = reference.ffn_fwd(cfg, rng.standard_normal((d, s)), w)  # realistic h1, h3
        parts = {
            "dgate": fp16_exact(rng.standard_normal((cfg.hidden_dim, s))),
            "h1": fp16_exact(taps["h1"]),
            "h3": fp16_exact(taps["h3"]),
        }
        return parts, _swiglu_bwd_reference(parts["dgate"], parts["h1"], parts["h3"], w)
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


def test_the_two_ffn_backward_kernels_equal_the_baked_one():
    """dgate from the first kernel, fed to the second, gives the baked FFN backward within fp16 noise."""
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg, seed=4)
    rng = np.random.default_rng(5)
    taps = reference.ffn_fwd(cfg, rng.standard_normal((cfg.dim, cfg.seq_len)), w)
    parts = {
        "dffn": fp16_exact(rng.standard_normal((cfg.dim, cfg.seq_len))),
        "h1": fp16_exact(taps["h1"]),
        "h3": fp16_exact(taps["h3"]),
    }
    backend = runtime.open("sim")
    dgate = dynamic.ffn_bwd_w2t_dynamic(cfg).run(backend, w, dffn=parts["dffn"])["dgate"]
    got = dynamic.ffn_bwd_w13t_dynamic(cfg).run(backend, w, dgate=dgate, h1=parts["h1"], h3=parts["h3"])
    want = reference.ffn_bwd(cfg, parts["dffn"], parts["h1"], parts["h3"], w)
    baked = backward.ffn_bwd(cfg, w).run(backend, **parts)
    _check(got, want, 3e-3)
    for tap in baked:
        assert _rel(got[tap], baked[tap]) < 2e-3, tap


def test_packed_input_runs_as_a_plain_kernel_spec():
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg, seed=6)
    spec = dynamic.ffn_bwd_w13t_dynamic(cfg)
    parts, _ = _case("ffn_bwd_w13t_dynamic", cfg, w, seed=7)
    packed = spec.pack(w, **parts)
    assert packed.shape == (1, spec.inputs.channels, 1, spec.inputs.spatial)
    backend = runtime.open("sim")
    got, again = spec.run(backend, x=packed), spec.run(backend, w, **parts)
    for tap in got:
        np.testing.assert_array_equal(got[tap], again[tap])


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("name", GENERATORS)
def test_pack_equals_packing_activations_weights_and_segments_in_turn(name, cfg_name):
    """``pack`` writes straight into the input; the same bits as composing the layouts' own packs."""
    cfg = CONFIGS[cfg_name]
    w = random_layer(cfg, seed=8)
    spec = GENERATORS[name](cfg)
    parts, _ = _case(name, cfg, w, seed=9)
    act = spec.activations.pack(parts).reshape(spec.activations.channels, spec.activations.spatial)
    blocks = dict(spec.weight_columns(w))
    acts = spec.columns.activation_segments
    if len(acts) == 1:
        blocks[acts[0].name] = act
    else:
        blocks.update(spec.activations.split(act))
    want = spec.columns.pack(blocks)
    got = spec.pack(w, **parts)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# -- the packed layouts ------------------------------------------------------------------------------


def test_sdpa_fwd_columns_start_at_multiples_of_64():
    cfg = CONFIGS["gqa-rope"]  # dim 64, kv_dim 32, seq 32
    spec = dynamic.sdpa_fwd_dynamic(cfg)
    cols = spec.columns
    assert cols.names == ["act", "wq_t", "wk_t", "wv_t", "wo_t", "rms_att"]
    assert [cols.range(n) for n in cols.names] == [
        (0, 32),
        (64, 64),
        (128, 32),
        (192, 32),
        (256, 64),
        (320, 32),  # the RMSNorm scale as a full segment: repeated over the 32 positions
    ]
    assert cols.padding() == [(32, 32), (160, 32), (224, 32), (352, 32)]
    assert cols.padded_columns == 32 + 32 + 32 + 32
    assert (spec.inputs.channels, spec.inputs.spatial) == (64, 384)
    assert spec.outputs == forward.sdpa_fwd_layout(cfg)
    w = random_layer(cfg, seed=8)
    blocks = spec.weight_columns(w)
    np.testing.assert_array_equal(blocks["wk_t"], w["wk"].T)  # (dim, kv_dim)
    np.testing.assert_array_equal(blocks["rms_att"], np.repeat(w["rms_att"][:, None], 32, axis=1))
    x = np.ones((cfg.dim, cfg.seq_len))
    rows = spec.pack(w, x=x).reshape(64, 384)
    for offset, count in cols.padding():
        np.testing.assert_array_equal(rows[:, offset : offset + count], 0)
    np.testing.assert_array_equal(rows[:, 128:160], w["wk"].T)
    assert "columns 352..384  (padding)  zeros x 32" in cols.describe()
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


def test_ffn_and_qkv_columns():
    cfg = CONFIGS["gqa-rope"]  # dim 64, hidden 128, kv_dim 32, seq 32
    d, h, s = cfg.dim, cfg.hidden_dim, cfg.seq_len
    w = random_layer(cfg, seed=9)
    fwd = dynamic.ffn_fwd_dynamic(cfg)
    assert fwd.columns.names == ["act", "w1_t", "w3_t", "w2", "rms_ffn"]
    assert (fwd.inputs.channels, fwd.inputs.spatial) == (d, 64 + 3 * h + 64)
    np.testing.assert_array_equal(fwd.weight_columns(w)["w2"], w["w2"])  # packed untransposed
    w2t = dynamic.ffn_bwd_w2t_dynamic(cfg)
    assert (w2t.inputs.channels, w2t.inputs.spatial) == (d, 64 + h)
    np.testing.assert_array_equal(w2t.weight_columns(w)["w2"], w["w2"])  # W2 as stored = (W2^T)^T
    w13 = dynamic.ffn_bwd_w13t_dynamic(cfg)
    assert w13.columns.names == ["dgate", "h1", "h3", "w1", "w3"]
    assert (w13.inputs.channels, w13.inputs.spatial) == (h, 3 * 64 + 2 * d)
    parts, _ = _case("ffn_bwd_w13t_dynamic", cfg, w, seed=10)
    rows = w13.pack(w, **parts).reshape(h, -1)
    np.testing.assert_array_equal(rows[:, 0:s], parts["dgate"])  # the activations side by side
    np.testing.assert_array_equal(rows[:, 64 : 64 + s], parts["h1"])
    np.testing.assert_array_equal(rows[:, 128 : 128 + s], parts["h3"])
    np.testing.assert_array_equal(rows[:, 192 : 192 + d], w["w1"])  # W1 as stored (hidden, dim)
    np.testing.assert_array_equal(rows[:, 256 : 256 + d], w["w3"])
    np.testing.assert_array_equal(rows[:, s:64], 0)
    qkv = dynamic.qkv_bwd_dynamic(cfg)
    assert (qkv.inputs.channels, qkv.inputs.spatial) == (d + 2 * cfg.kv_dim, 64 + d)
    np.testing.assert_array_equal(qkv.weight_columns(w)["wqkv"], np.concatenate([w["wq"], w["wk"], w["wv"]]))


def test_wrong_weight_shapes_are_rejected():
    cfg = CONFIGS["gqa-rope"]
    w = random_layer(cfg)
    w["wk"] = w["wk"].T
    with pytest.raises(LayoutError, match=r"weight 'wk' has shape \[64, 32\], expected \[32, 64\]"):
        dynamic.sdpa_fwd_dynamic(cfg).pack(w, x=np.zeros((64, 32)))
    with pytest.raises(LayoutError, match="weight 'w3' was not given"):
        dynamic.ffn_bwd_w13t_dynamic(cfg).weight_columns({"w1": w["w1"], "w2": w["w2"]})


# -- limits and presets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cfg", "width"),
    [
        ("sdpa_fwd_dynamic", ModelConfig(8192, 8192, 1, 64, 64, 100, 256), 256 + 4 * 8192 + 256),
        ("ffn_fwd_dynamic", ModelConfig(4096, 11008, 1, 32, 32, 100, 256), 256 + 3 * 11008 + 256),
        ("ffn_bwd_w2t_dynamic", ModelConfig(64, 32768, 1, 1, 1, 100, 256), 256 + 32768),
        ("ffn_bwd_w13t_dynamic", ModelConfig(16384, 64, 1, 128, 128, 100, 256), 3 * 256 + 2 * 16384),
        ("qkv_bwd_dynamic", ModelConfig(1024, 2048, 1, 2, 2, 100, 32000), 32000 + 1024),
    ],
)
def test_inputs_wider_than_the_spatial_limit_are_rejected(name, cfg, width):
    with pytest.raises(
        ConfigError, match=rf"\[{name}\] activation columns .* = {width} columns exceeds .*15-bit"
    ):
        GENERATORS[name](cfg)


def _model(name: str) -> ModelConfig:
    return train_config(name)


def _surfaces(spec) -> list[tuple[str, int, int]]:
    """(what, channels, spatial) of the kernel's input and output surfaces."""
    return [
        ("input", spec.inputs.channels, spec.inputs.spatial),
        ("output", spec.outputs.channels, spec.outputs.spatial),
    ]


def test_the_catalog_lists_exactly_these_dynamic_kernels():
    assert list(catalog.DYNAMIC_KERNELS) == list(GENERATORS)
    for name in GENERATORS:
        assert catalog.generator(name) is GENERATORS[name]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", GENERATORS)
def test_presets_generate_programs_that_verify(name, model):
    cfg = _model(model)
    spec = GENERATORS[name](cfg)
    mil.verify(spec.program)
    assert spec.inputs.spatial == spec.columns.columns <= 0x7FFF
    assert spec.activations.spatial == cfg.seq_len
    if model in ("stories15M", "default"):
        mil.verify(mil.parse(spec.text()))


def _dynamic_specs(cfg: ModelConfig) -> dict:
    """Every dynamic kernel the training step runs for ``cfg``, the Wo^T matmul included."""
    specs = {name: gen(cfg) for name, gen in GENERATORS.items()}
    specs["dynamic_matmul"] = composable.dynamic_matmul(cfg.dim, cfg.dim, cfg.seq_len)
    return specs


@pytest.mark.parametrize("model", MODELS)
def test_every_surface_width_is_a_multiple_of_64(model):
    """rustane "ANE Gotchas": spatial widths that are not a multiple of 16 corrupt data silently.

    The inputs are padded to multiples of 64; the outputs are seq_len wide, a multiple of 64 in every
    preset and in the default model.
    """
    for name, spec in _dynamic_specs(_model(model)).items():
        for what, _, spatial in _surfaces(spec):
            assert spatial % 64 == 0, f"{name} {what} is {spatial} wide"
        for seg, offset in zip(spec.columns.segments, spec.columns.offsets):
            assert offset % 64 == 0, f"{name}: segment {seg.name} starts at column {offset}"


@pytest.mark.parametrize("model", MODELS)
def test_no_large_operand_is_a_transposed_matmul_operand(model):
    """maderix's dynamic kernels transpose the activations, never a weight: no matmul operand whose last
    two dims both exceed 128 has transpose_x / transpose_y set."""
    for name, spec in _dynamic_specs(_model(model)).items():
        for op in spec.program.main.ops:
            if op.op_type != "matmul":
                continue
            for operand, flag in (("x", "transpose_x"), ("y", "transpose_y")):
                shape = op.inputs[operand].type.shape
                if _literal(op.inputs[flag]) and min(shape[-2:]) > 128:
                    raise AssertionError(f"{name}: {op.where()} transposes its {operand} {list(shape)}")


def _literal(arg) -> object:
    """The Python value of a literal argument or of a const var."""
    lit = arg.const if isinstance(arg, mil.Var) else arg
    return lit.scalar()


@pytest.mark.parametrize("model", MODELS)
def test_no_same_shape_reshape_and_no_identity_output(model):
    for name, spec in _dynamic_specs(_model(model)).items():
        ops = spec.program.main.ops
        for op in ops:
            if op.op_type == "reshape":
                assert op.inputs["x"].type.shape != op.outputs[0].type.shape, f"{name}: {op.where()}"
        (out,) = spec.program.main.outputs
        assert out.op.op_type not in ("identity", "const", "reshape_like"), f"{name}: {out.op.where()}"
        assert out.name == "out"


@pytest.mark.parametrize("model", MODELS)
def test_inputs_are_dense_and_under_16_mb(model):
    """No surface over 16 MiB (maderix splits such kernels) and at most 15% of an input is zeros for the
    two stories presets (padding columns, rows a segment leaves empty; the old one-kernel FFN backward
    was a third zeros). The worst is stories15M's SDPA forward: 288-column segments padded to 320."""
    cfg = _model(model)
    for name, spec in _dynamic_specs(cfg).items():
        for what, channels, spatial in _surfaces(spec):
            assert channels * spatial * 2 <= 16 * 2**20, f"{name} {what}: {channels} x {spatial}"
        cols = spec.columns
        assert all(s.rows == cols.channels for s in cols.segments), name  # no rows left empty
        used = sum(s.rows * s.columns for s in cols.segments)
        if model in ("stories15M", "stories110M"):
            assert used >= 0.85 * cols.channels * cols.columns, (
                f"{name}: {used / (cols.channels * cols.columns)}"
            )


def test_stories110m_largest_input_is_the_ffn_forward():
    cfg = _model("stories110M")
    sizes = {
        name: spec.inputs.channels * spec.inputs.spatial * 2 for name, spec in _dynamic_specs(cfg).items()
    }
    assert max(sizes, key=sizes.get) == "ffn_fwd_dynamic"
    assert sizes["ffn_fwd_dynamic"] == 768 * (256 + 3 * 2048 + 256) * 2  # 9.75 MiB (rms_ffn 768 x 256)
    assert sizes["ffn_bwd_w13t_dynamic"] == 2048 * (3 * 256 + 2 * 768) * 2  # 9.0 MiB


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
