"""Whole programs in the simulator: real compiler output with weight files, and BLOBFILE error paths."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.blob import build_blob_bytes, write_blobs
from anekit.cli.main import main
from anekit.errors import CompilationFailed
from anekit.mil import tensor
from tests.conftest import corpus_path

WEIGHT_PATH = "@model_path/weights/weight.bin"


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def test_coremlc_three_conv_model_runs_with_its_weight_file(tmp_path):
    """751k-hwx-model.mil: three 1x1 conv 64->64 + bias + relu, weights at offsets 64, 8320, ..."""
    text = corpus_path("mil", "751k-hwx-model.mil").read_text()
    rng = np.random.default_rng(0)
    layers = [(rng.standard_normal((64, 64, 1, 1)) / 8, rng.standard_normal(64) / 4) for _ in range(3)]
    items = [
        item for w, b in layers for item in ((w.astype(np.float32), "fp16"), (b.astype(np.float32), "fp16"))
    ]
    offsets = write_blobs(tmp_path / "weight.bin", items)
    assert offsets == [64, 8320, 8512, 16768, 16960, 25216]  # exactly what the program's BLOBFILEs say

    kernel = runtime.open("sim").compile(text, {WEIGHT_PATH: tmp_path / "weight.bin"})
    x = rng.standard_normal((1, 64, 64, 64)).astype(np.float16)
    got = kernel(x=x)["relu2"]

    v = x.astype(np.float64).reshape(64, -1)  # independent float64 reference: (channels, pixels)
    for w, b in layers:
        w16 = w.astype(np.float16).astype(np.float64)[:, :, 0, 0]
        b16 = b.astype(np.float16).astype(np.float64)
        v = np.maximum(w16 @ v + b16[:, None], 0.0)
    assert _rel_err(got, v.reshape(1, 64, 64, 64)) < 1e-2


def _conv3x3_same(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3 'same' convolution (cross-correlation) of (C, H, W) by (O, C, 3, 3), as nine shifted matmuls."""
    c, h, wd = x.shape
    padded = np.zeros((c, h + 2, wd + 2))
    padded[:, 1:-1, 1:-1] = x
    out = np.zeros((w.shape[0], h, wd))
    for dy in range(3):
        for dx in range(3):
            window = padded[:, dy : dy + h, dx : dx + wd].reshape(c, -1)
            out += (w[:, :, dy, dx] @ window).reshape(-1, h, wd)
    return out


def test_compiler_internal_tensor_buffer_program_runs(tmp_path):
    """751k-ctx-conv3x3.mil: tensor_buffer input, five inline-BLOBFILE 3x3 'same' convs, four relus."""
    text = corpus_path("mil", "751k-ctx-conv3x3.mil").read_text()
    rng = np.random.default_rng(1)
    weights = [(rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32) for _ in range(5)]
    data, offsets = build_blob_bytes([(w, "fp16") for w in weights])
    assert offsets == [64, 73856, 147648, 221440, 295232]

    kernel = runtime.open("sim").compile(text, {"@model_path/weights/weights.bin": data})
    x = rng.standard_normal((1, 64, 32, 32)).astype(np.float16)
    got = kernel(x0=x)["wrap_out_1_relu"]

    v = x.astype(np.float64)[0]
    for i, w in enumerate(weights):
        v = _conv3x3_same(v, w.astype(np.float16).astype(np.float64))
        if i != 2:  # the program's third conv (conv_0) feeds the fourth directly, with no relu
            v = np.maximum(v, 0.0)
    assert _rel_err(got, v[None]) < 2e-2


def test_coremltools_program_1_0_runs():
    text = corpus_path("mil", "coremltools-add_model.mil").read_text()
    x, y = np.linspace(-2, 2, 10).reshape(1, 10), np.linspace(3, -1, 10).reshape(1, 10)
    with pytest.raises(CompilationFailed, match=r"surface\.min-row-bytes error main: input 'x' \[1, 10\]"):
        runtime.open("sim").compile(text)  # 20-byte rows: refused on the in-memory route
    assert runtime.open("sim", route="coreml").compile(text)  # a CoreML program: CoreML's own buffers
    got = runtime.open("sim", strict=False).compile(text)(x=x, y=y)["var_3"]
    np.testing.assert_allclose(got, x * y, rtol=1e-3)


# -- BLOBFILE errors name the const ---------------------------------------------------------------


def _conv_program(offset: int = 64, dtype: str = "fp16", shape=(4, 4, 1, 1)) -> mil.Program:
    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, 32])})
    def prog(f, x):
        w = f.weight(tensor(dtype, list(shape)), WEIGHT_PATH, offset, name="wq")
        return f.conv(x=x, weight=w, name="y")

    return prog


def _weights(values=None, dtype="fp16") -> bytes:
    w = np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1) if values is None else values
    return build_blob_bytes([(w, dtype)])[0]


def test_a_good_weight_file_compiles_and_runs():
    k = runtime.open("sim").compile(_conv_program(), {WEIGHT_PATH: _weights()})
    x = np.arange(128, dtype=np.float16).reshape(1, 4, 1, 32)
    np.testing.assert_array_equal(k(x=x)["y"], x)


@pytest.mark.parametrize(
    "program, weights, message",
    [
        (_conv_program(offset=100), _weights(), r"const 'wq'.*offset 100"),
        (_conv_program(offset=4096), _weights(), r"const 'wq'.*offset 4096"),
        (
            _conv_program(dtype="fp32"),
            _weights(),
            r"const 'wq' \(tensor<fp32.*holds fp16, the const declares fp32",
        ),
        (_conv_program(), _weights(np.ones((4, 2, 1, 1), np.float32)), r"const 'wq'.*shape \[4, 4, 1, 1\]"),
        (_conv_program(), _weights()[:100], r"const 'wq'"),
        (_conv_program(), b"not a weight file at all, not at all, not at all, not at all, ok", r"const 'wq'"),
    ],
    ids=[
        "offset-not-a-record",
        "offset-past-end",
        "dtype-mismatch",
        "shape-mismatch",
        "truncated",
        "garbage",
    ],
)
def test_bad_blobfile_references_raise_compilation_failed_naming_the_const(program, weights, message):
    with pytest.raises(CompilationFailed, match=message):
        runtime.open("sim").compile(program, {WEIGHT_PATH: weights})


def test_a_weight_file_path_that_does_not_exist(tmp_path):
    with pytest.raises(CompilationFailed, match=r"const 'wq'.*does not exist"):
        runtime.open("sim").compile(_conv_program(), {WEIGHT_PATH: tmp_path / "missing.bin"})


def test_weights_may_be_keyed_without_the_model_path_prefix():
    k = runtime.open("sim").compile(_conv_program(), {"weights/weight.bin": _weights()})
    assert k(x=np.ones((1, 4, 1, 32)))["y"].shape == (1, 4, 1, 32)


def test_compressed_weights_are_expanded_at_compile_time():
    lut = np.array([-1.0, -0.5, 0.5, 1.0], dtype=np.float16)
    idx = np.array([0, 1, 2, 3, 3, 2, 1, 0, 0, 0, 3, 3, 1, 2, 1, 2], dtype=np.uint8)

    @mil.program(inputs={"x": tensor("fp16", [1, 4, 1, 32])})
    def prog(f, x):
        from anekit.mil.values import tensor_literal

        w = f.constexpr_lut_to_dense(
            indices=tensor_literal("uint2", idx.reshape(4, 4, 1, 1)), lut=lut.reshape(1, 1, 1, 1, 4, 1)
        )
        return f.conv(x=x, weight=w, name="y")

    k = runtime.open("sim").compile(prog)
    assert len(k.plan.steps) == 1  # only the conv runs; the dense weight was built once
    x = np.random.default_rng(2).standard_normal((1, 4, 1, 32)).astype(np.float16)
    want = lut[idx].astype(np.float64).reshape(4, 4) @ x.astype(np.float64).reshape(4, 32)
    np.testing.assert_allclose(k(x=x)["y"].reshape(4, 32), want, rtol=2e-3, atol=2e-3)


# -- anekit run ------------------------------------------------------------------------------------


def test_anekit_run_with_weights_inputs_and_outputs(tmp_path, capsys):
    (tmp_path / "model" / "weights").mkdir(parents=True)
    (tmp_path / "model" / "weights" / "weight.bin").write_bytes(_weights())
    (tmp_path / "k.mil").write_text(mil.to_text(_conv_program()))
    x = np.arange(128, dtype=np.float32).reshape(1, 4, 1, 32)
    np.save(tmp_path / "x.npy", x)
    code = main(
        [
            "run",
            str(tmp_path / "k.mil"),
            "--weights",
            str(tmp_path / "model"),
            "--input",
            f"x={tmp_path / 'x.npy'}",
            "--output",
            str(tmp_path / "out.npz"),
            "--repeat",
            "3",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "backend sim (chip any, numerics engine), compile" in out and "y: [1, 4, 1, 32] float32" in out
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], x)


def test_anekit_run_with_one_weight_file_and_random_inputs(tmp_path, capsys):
    (tmp_path / "w.bin").write_bytes(_weights())
    (tmp_path / "k.mil").write_text(mil.to_text(_conv_program()))
    assert main(["run", str(tmp_path / "k.mil"), "--weights", str(tmp_path / "w.bin"), "--random", "0"]) == 0


def test_anekit_run_reports_missing_inputs_and_bad_programs(tmp_path, capsys):
    (tmp_path / "k.mil").write_text(mil.to_text(_conv_program()))
    (tmp_path / "w.bin").write_bytes(_weights())
    assert main(["run", str(tmp_path / "k.mil"), "--weights", str(tmp_path / "w.bin")]) == 1
    assert "no value for input 'x'" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "k.mil"), "--random", "0"]) == 1
    assert "const 'wq' refers to weight file" in capsys.readouterr().err
    (tmp_path / "bad.mil").write_text("program(1.3) {")
    assert main(["run", str(tmp_path / "bad.mil")]) == 1
    assert "[mil.parse]" in capsys.readouterr().err


def test_bf16_and_int8_weights_read_as_values():
    w_bf16 = np.array([1.0, -2.5, 3.140625, 1e-3], dtype=np.float32)
    w_int8 = np.array([-128, -1, 0, 127], dtype=np.int8)
    data, (off_b, off_i) = build_blob_bytes([(w_bf16, "bf16"), (w_int8, "int8")])

    @mil.program(inputs={"x": tensor("fp16", [4])})
    def prog(f, x):
        b = f.weight(tensor("bf16", [4]), WEIGHT_PATH, off_b, name="b")
        i = f.weight(tensor("int8", [4]), WEIGHT_PATH, off_i, name="i")
        return f.identity(x=x, name="y"), b, i

    # Rank-1 tensors and an identity output: blob reading, not engine acceptance, so not strict.
    out = runtime.open("sim", strict=False).compile(prog, {WEIGHT_PATH: data})(x=np.zeros(4))
    # bf16 keeps 8 significant bits: 3.140625 is exact, 1e-3 rounds to the nearest bf16 value.
    np.testing.assert_array_equal(out["b"], [1.0, -2.5, 3.140625, 0.00099945068359375])
    np.testing.assert_array_equal(out["i"], w_int8)
