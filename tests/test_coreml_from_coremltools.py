"""Packages coremltools writes (its own MIL builder + ct.convert) load into anekit and run in the simulator,
compared with float64 numpy; the corpus .mlmodel files are refused clearly; ``anekit run`` and ``lint``."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import runtime
from anekit.cli.main import main
from anekit.coreml import CoreMLFormatError, load_mlpackage, save_mlpackage
from tests.conftest import corpus_files, corpus_path
from tests.coreml_oracle import coremltools

coremltools()

RNG = np.random.default_rng(5)


def ct_package(tmp_path, prog, name: str, precision: str):
    ct = coremltools()
    model = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT32 if precision == "fp32" else ct.precision.FLOAT16,
        skip_model_load=True,
    )
    path = tmp_path / f"{name}.mlpackage"
    model.save(str(path))
    return path


def mlp_program(w1, b1, w2):
    ct = coremltools()
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec((1, 32, 1, 8), dtype=types.fp32)], opset_version=ct.target.iOS18)
    def prog(x):
        h = mb.conv(x=x, weight=w1, bias=b1, name="h")
        h = mb.relu(x=h, name="act")
        y = mb.conv(x=h, weight=w2, name="y")
        s = mb.softmax(x=y, axis=1, name="probs")
        return mb.add(x=s, y=mb.reduce_mean(x=y, axes=[1], keep_dims=True), name="out")

    return prog


def numpy_mlp(x, w1, b1, w2):
    """float64 reference: 1x1 convs as channel matmuls, relu, softmax over channels, plus the channel mean."""
    x = x.astype(np.float64)[0, :, 0, :]  # (C, S)
    h = np.maximum(w1[:, :, 0, 0].astype(np.float64) @ x + b1[:, None], 0)
    y = w2[:, :, 0, 0].astype(np.float64) @ h
    e = np.exp(y - y.max(axis=0))
    return (e / e.sum(axis=0) + y.mean(axis=0, keepdims=True))[None, :, None, :]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_coremltools_package_runs_in_the_simulator(tmp_path, precision):
    w1 = (RNG.standard_normal((64, 32, 1, 1)) * 0.2).astype(np.float32)
    b1 = RNG.standard_normal(64).astype(np.float32)
    w2 = (RNG.standard_normal((16, 64, 1, 1)) * 0.2).astype(np.float32)
    path = ct_package(tmp_path, mlp_program(w1, b1, w2), "mlp", precision)
    pkg = load_mlpackage(path)
    assert pkg.weights, "coremltools put the conv weights in weight.bin"
    x = RNG.standard_normal((1, 32, 1, 8)).astype(np.float32)
    sim = runtime.open("sim", strict=False, precision="fp32" if precision == "fp32" else "ane")
    with sim.compile(pkg.program, pkg.weights, function=pkg.default_function) as k:
        out = k(x=x)
    (got,) = out.values()
    tol = 1e-5 if precision == "fp32" else 2e-2
    np.testing.assert_allclose(got, numpy_mlp(x, w1, b1, w2), rtol=tol, atol=tol)
    # and anekit writes it back, each const where coremltools put it, into a package that loads the same
    again = save_mlpackage(
        pkg.program, tmp_path / "again.mlpackage", weights=pkg.weights, blob_threshold=None
    )
    assert load_mlpackage(again).program == pkg.program


def test_a_stateful_coremltools_package_loads(tmp_path):
    ct = coremltools()
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(
        input_specs=[
            mb.StateTensorSpec((1, 8, 1, 4), dtype=types.fp16),
            mb.TensorSpec((1, 8, 1, 4), dtype=types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def prog(cache, x):
        old = mb.read_state(input=cache)
        new = mb.add(x=old, y=x)
        mb.coreml_update_state(state=cache, value=new)
        return mb.mul(x=new, y=np.float16(2.0), name="out")

    path = ct_package(tmp_path, prog, "state", "fp16")
    pkg = load_mlpackage(path)
    fn = pkg.program.functions[pkg.default_function]
    assert [op.op_type for op in fn.ops if op.op_type != "const"] == [
        "read_state",
        "add",
        "coreml_update_state",
        "mul",
    ]
    assert str(fn.inputs[0].type) == "state<tensor<fp16, [1, 8, 1, 4]>>"


def test_anekit_run_and_lint_a_package(tmp_path, capsys):
    w1 = (RNG.standard_normal((64, 32, 1, 1)) * 0.2).astype(np.float32)
    b1 = RNG.standard_normal(64).astype(np.float32)
    w2 = (RNG.standard_normal((16, 64, 1, 1)) * 0.2).astype(np.float32)
    path = ct_package(tmp_path, mlp_program(w1, b1, w2), "mlp", "fp32")
    x = RNG.standard_normal((1, 32, 1, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    args = ["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out), "--no-strict"]
    assert main([*args, "--backend", "sim", "--precision", "fp32"]) == 0
    got = np.load(out)["out"]
    np.testing.assert_allclose(got, numpy_mlp(x, w1, b1, w2), rtol=1e-5, atol=1e-5)
    capsys.readouterr()
    main(["lint", str(path)])
    text = capsys.readouterr().out
    assert "1 program:" in text and "mil.syntax" not in text


def test_lint_warns_about_a_package_over_the_shard_size(tmp_path, capsys, monkeypatch):
    from anekit.rules import checks

    w = (RNG.standard_normal((64, 32, 1, 1)) * 0.2).astype(np.float16)
    from anekit.mil import Builder, tensor

    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 32, 1, 16]))
    f.output(f.conv(x=x, weight=w))
    path = save_mlpackage(b.build(), tmp_path / "big.mlpackage")
    monkeypatch.setattr(checks, "SHARD_WEIGHT_BYTES", 1000)  # this package's 4 KB stands in for > 250 MB
    main(["lint", str(path)])
    assert "package.shard-size warn" in capsys.readouterr().out


@pytest.mark.parametrize("path", corpus_files("mlmodel", "*.mlmodel"), ids=lambda p: p.name)
def test_corpus_neural_network_specs_are_refused_by_name(path):
    with pytest.raises(CoreMLFormatError, match="not an ML Program"):
        load_mlpackage(path)


def test_a_compiled_mlmodelc_is_not_a_package():
    with pytest.raises(CoreMLFormatError, match=r"Manifest\.json"):
        load_mlpackage(corpus_path("mlmodelc", "add_model.mlmodelc"))


def test_a_package_program_compiles_under_the_package_route_by_default(tmp_path):
    """`runtime.open("sim").compile(pkg.program, pkg.weights)` (the README's pattern) takes the package's
    route: its [1, 64, 1, 1] I/O are CoreML's buffers, not the direct route's IOSurfaces, whose row rule
    (surface.min-row-bytes) would refuse them."""
    ct = coremltools()
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    from anekit import mil
    from anekit.errors import CompilationFailed

    @mb.program(input_specs=[mb.TensorSpec((1, 64, 1, 1), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.relu(x=mb.mul(x=x, y=np.float16(0.5)), name="y")

    pkg = load_mlpackage(ct_package(tmp_path, prog, "decode_step", "fp16"))
    x = RNG.standard_normal((1, 64, 1, 1)).astype(np.float16)
    with runtime.open("sim").compile(pkg.program, pkg.weights) as k:
        got = k(x=x)["y"]
    np.testing.assert_array_equal(got, np.maximum(x.astype(np.float64) * 0.5, 0))  # exact in fp16
    with pytest.raises(CompilationFailed, match=r"surface\.min-row-bytes"):  # asked for: the direct route
        runtime.open("sim", route="direct").compile(pkg.program, pkg.weights)
    with pytest.raises(CompilationFailed, match="route direct"):  # the same program as MIL text: direct
        runtime.open("sim").compile(mil.to_text(pkg.program), pkg.weights)
