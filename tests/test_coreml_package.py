"""Packages anekit writes: coremltools reads them back with the same ops, constants and I/O; round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anekit import runtime
from anekit.coreml import WEIGHT_PATH, load_mlpackage, save_mlpackage
from anekit.mil import Builder, StateType, tensor
from anekit.mil.values import BlobRef, tensor_literal
from tests.coreml_oracle import coremltools, ct_consts, ct_load, ct_ops

coremltools()  # skips the module without the coreml extra

RNG = np.random.default_rng(11)


def conv_program(threshold_note: str = "") -> tuple[object, dict[str, np.ndarray]]:
    """conv (64x32 fp16 weight: 4096 bytes) + bias (64 fp16: 128 bytes) + relu; returns the weights used."""
    w = (RNG.standard_normal((64, 32, 1, 1)) * 0.2).astype(np.float16)
    bias = RNG.standard_normal(64).astype(np.float16)
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 32, 1, 16]))
    y = f.conv(x=x, weight=f.const(w, name="w"), bias=f.const(bias, name="bias"), name="conv")
    f.output(f.relu(x=y, name="out"))
    return b.build(), {"w": w, "bias": bias}


def val_kind(spec, fn: str, const: str) -> str:
    """'blobFileValue' or 'immediateValue' of a const in the raw protobuf coremltools parsed."""
    block = spec.mlProgram.functions[fn].block_specializations[spec.mlProgram.functions[fn].opset]
    for op in block.operations:
        if op.type == "const" and op.outputs[0].name == const:
            return op.attributes["val"].WhichOneof("value")
    raise KeyError(const)


def test_coremltools_reads_what_anekit_writes(tmp_path):
    prog, values = conv_program()
    path = save_mlpackage(prog, tmp_path / "m.mlpackage", description="a conv")
    spec, ct_prog = ct_load(path)
    assert spec.specificationVersion == 9 and spec.WhichOneof("Type") == "mlProgram"
    assert spec.description.metadata.shortDescription == "a conv"
    # the same I/O
    assert [(i.name, list(i.type.multiArrayType.shape)) for i in spec.description.input] == [
        ("x", [1, 32, 1, 16])
    ]
    assert [(o.name, list(o.type.multiArrayType.shape)) for o in spec.description.output] == [
        ("out", [1, 64, 1, 16])
    ]
    fn = ct_prog.functions["main"]
    assert list(fn.inputs) == ["x"] and fn.inputs["x"].shape == (1, 32, 1, 16)
    assert [v.name for v in fn.outputs] == ["out"]
    # the same ops and the same constant values (the weight from the blob, the bias inline)
    assert ct_ops(fn) == [("conv", ("conv",)), ("relu", ("out",))]
    consts = ct_consts(ct_prog)
    np.testing.assert_array_equal(consts["w"], values["w"])
    np.testing.assert_array_equal(consts["bias"], values["bias"])
    assert (
        val_kind(spec, "main", "w") == "blobFileValue" and val_kind(spec, "main", "bias") == "immediateValue"
    )
    # the Manifest coremltools' package library reads
    manifest = json.loads((path / "Manifest.json").read_text())
    root = manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]
    assert root["path"] == "com.apple.CoreML/model.mlmodel" and root["author"] == "com.apple.CoreML"


def test_the_threshold_at_its_edges(tmp_path):
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 8, 1, 16]))
    arrays = {n: RNG.integers(0, 256, n).astype(np.uint8) for n in (1023, 1024, 1025)}
    for n, a in arrays.items():
        f.const(a, name=f"c{n}")
    f.output(f.relu(x=x))
    path = save_mlpackage(b.build(), tmp_path / "t.mlpackage", blob_threshold=1024)
    spec, ct_prog = ct_load(path)
    assert val_kind(spec, "main", "c1023") == "immediateValue"
    assert val_kind(spec, "main", "c1024") == "blobFileValue"
    assert val_kind(spec, "main", "c1025") == "blobFileValue"
    consts = ct_consts(ct_prog)
    for n, a in arrays.items():
        np.testing.assert_array_equal(consts[f"c{n}"], a)


# Every MILBlob dtype anekit's MIL has (fp8 has no MIL dtype), with values from its range.
def _values(dtype: str, n: int) -> np.ndarray:
    ranges = {
        "int4": (-8, 8),
        "uint1": (0, 2),
        "uint2": (0, 4),
        "uint3": (0, 8),
        "uint4": (0, 16),
        "uint6": (0, 64),
    }
    if dtype in ("fp16", "fp32", "bf16"):
        return RNG.standard_normal(n).astype(np.float32)
    if dtype in ranges:
        lo, hi = ranges[dtype]
        return RNG.integers(lo, hi, n)
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, n, endpoint=True, dtype=dtype)


BLOB_DTYPES = ["fp16", "fp32", "uint8", "int8", "bf16", "int16", "uint16", "int4", "uint1", "uint2", "uint4", "uint3", "uint6", "int32", "uint32"]  # fmt: skip


def _dtype_package(tmp_path, dtypes: list[str], size: int):
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 8, 1, 16]))
    lits = {d: tensor_literal(d, _values(d, size), (size,)) for d in dtypes}
    for d, lit in lits.items():
        f.const(lit, name=f"c_{d}")
    f.output(f.relu(x=x))
    return save_mlpackage(b.build(), tmp_path / f"d{size}.mlpackage", blob_threshold=1024), lits


def _spec_op(spec, name: str):
    ops = spec.mlProgram.functions["main"].block_specializations["CoreML8"].operations
    return next(o for o in ops if o.outputs and o.outputs[0].name == name)


@pytest.mark.parametrize("size", [37, 3001], ids=["inline", "blob"])
def test_every_blob_dtype(tmp_path, size):
    known = [d for d in BLOB_DTYPES if d != "bf16"]  # coremltools has no bf16 type: checked below
    path, lits = _dtype_package(tmp_path, known, size)
    spec, ct_prog = ct_load(path)
    consts = ct_consts(ct_prog)
    for d, lit in lits.items():
        kind = val_kind(spec, "main", f"c_{d}")
        stored = -(-size * lit.type.dtype.bits // 8)
        assert kind == ("blobFileValue" if stored >= 1024 else "immediateValue"), d
        wide = np.float64 if d.startswith(("fp", "bf")) else np.int64
        np.testing.assert_array_equal(np.asarray(consts[f"c_{d}"]).astype(wide), lit.value.astype(wide), d)
    # anekit reads every dtype back to the same literal (inline) or the same values (weight file)
    pkg = load_mlpackage(path)
    sim = runtime.open("sim", strict=False)
    for d, lit in lits.items():
        got = next(o for o in pkg.program.main.ops if o.outputs[0].name == f"c_{d}").attributes["val"]
        wide = np.float64 if d.startswith(("fp", "bf")) else np.int64
        if got.is_blob:
            b = Builder()
            f = b.function("main")
            f.output(f.identity(x=f.const(got, name="c"), name="y"))
            with sim.compile(b.build(), pkg.weights) as k:
                np.testing.assert_array_equal(k()["y"].astype(wide), lit.value.astype(wide), d)
        else:
            assert got == lit, d


@pytest.mark.parametrize("size", [37, 3001], ids=["inline", "blob"])
def test_bf16_constants_as_raw_bits(tmp_path, size):
    path, lits = _dtype_package(tmp_path, ["bf16"], size)
    spec = coremltools().models.MLModel(str(path), skip_model_load=True).get_spec()
    val = _spec_op(spec, "c_bf16").attributes["val"]
    if size * 2 >= 1024:
        raw = (path / "Data/com.apple.CoreML/weights/weight.bin").read_bytes()
        meta = val.blobFileValue.offset
        assert int.from_bytes(raw[meta : meta + 4], "little") == 0xDEADBEEF
        assert int.from_bytes(raw[meta + 4 : meta + 8], "little") == 5  # BFloat16
        bits = np.frombuffer(raw, "<u2", size, int.from_bytes(raw[meta + 16 : meta + 24], "little"))
    else:
        bits = np.frombuffer(val.immediateValue.tensor.bytes.values, "<u2")
    # bf16 is the high half of a float32 (these values are already rounded to bf16)
    expect = (lits["bf16"].value.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(bits, expect)
    got = next(o for o in load_mlpackage(path).program.main.ops if o.outputs[0].name == "c_bf16")
    assert got.attributes["val"].is_blob == (size * 2 >= 1024)


def test_a_multi_function_package(tmp_path):
    w = (RNG.standard_normal((16, 16, 1, 1)) * 0.1).astype(np.float16)
    b = Builder()
    for name, seq in (("prefill", 64), ("decode", 1)):
        f = b.function(name)
        x = f.input("x", tensor("fp16", [1, 16, 1, seq]))
        f.output(f.conv(x=x, weight=f.const(w, name="w"), name="y"))
    path = save_mlpackage(b.build(), tmp_path / "mf.mlpackage", default_function="decode", blob_threshold=64)
    spec, ct_prog = ct_load(path)
    assert spec.description.defaultFunctionName == "decode"
    assert [f.name for f in spec.description.functions] == ["prefill", "decode"]
    assert set(ct_prog.functions) == {"prefill", "decode"}
    for name, seq in (("prefill", 64), ("decode", 1)):
        fn = ct_prog.functions[name]
        assert fn.inputs["x"].shape == (1, 16, 1, seq) and ct_ops(fn) == [("conv", ("y",))]
        const = next(op for op in fn.operations if op.op_type == "const")
        np.testing.assert_array_equal(const.outputs[0].val, w)
    pkg = load_mlpackage(path)
    assert pkg.default_function == "decode" and list(pkg.program.functions) == ["prefill", "decode"]


def test_equal_constants_are_stored_once(tmp_path):
    """Two functions (or two consts) holding the same weight share one blob of weight.bin; a weight of
    other values has its own, and each function computes with its own."""
    from anekit.blob import BlobFile

    w = (RNG.standard_normal((16, 16, 1, 1)) * 0.1).astype(np.float16)
    other = w.copy()
    other[0, 0, 0, 0] += np.float16(1)
    b = Builder()
    for name in ("prefill", "decode"):
        f = b.function(name)
        x = f.input("x", tensor("fp16", [1, 16, 1, 32]))
        y = f.conv(x=x, weight=f.const(w.copy(), name="w"), name="y")
        f.output(f.conv(x=y, weight=f.const(other if name == "decode" else w.copy(), name="w2"), name="z"))
    path = save_mlpackage(b.build(), tmp_path / "shared.mlpackage", blob_threshold=64)
    blob = BlobFile(path / "Data" / "com.apple.CoreML" / "weights" / "weight.bin")
    try:
        assert len(blob.entries) == 2  # w (prefill's w, w2 and decode's w) and other
    finally:
        blob.close()
    ct_load(path)
    program = load_mlpackage(path).program
    sim = runtime.open("sim", strict=False)
    x = RNG.standard_normal((1, 16, 1, 32)).astype(np.float32)
    for name, second in (("prefill", w), ("decode", other)):
        with sim.compile(program, load_mlpackage(path).weights, function=name) as k:
            got = k(x=x)["z"]
        w64, s64 = w[:, :, 0, 0].astype(np.float64), second[:, :, 0, 0].astype(np.float64)
        want = s64 @ (w64 @ x[0, :, 0, :].astype(np.float64).astype(np.float16).astype(np.float64))
        np.testing.assert_allclose(got[0, :, 0, :], want, rtol=2e-2, atol=2e-2)


def test_a_package_with_states(tmp_path):
    b = Builder()
    f = b.function("main")
    cache = f.input("cache", StateType(tensor("fp16", [1, 8, 1, 32])))
    x = f.input("x", tensor("fp16", [1, 8, 1, 32]))
    old = f.read_state(input=cache, name="old")
    new = f.add(x=old, y=x, name="new")
    f.output(f.coreml_update_state(state=cache, value=new, name="stored"))
    prog = b.build()
    path = save_mlpackage(prog, tmp_path / "s.mlpackage")
    spec, ct_prog = ct_load(path)
    assert [s.name for s in spec.description.state] == ["cache"]
    assert list(spec.description.state[0].type.stateType.arrayType.shape) == [1, 8, 1, 32]
    assert [i.name for i in spec.description.input] == ["x"]
    fn = ct_prog.functions["main"]
    assert [op.op_type for op in fn.operations] == ["read_state", "add", "coreml_update_state"]
    assert load_mlpackage(path).program == prog  # write_state + read_state merged back


def test_round_trips(tmp_path):
    prog, _ = conv_program()
    # everything inline: the program comes back equal
    inline = load_mlpackage(save_mlpackage(prog, tmp_path / "a.mlpackage", blob_threshold=None))
    assert inline.program == prog and inline.weights == {}
    # with the weight file: save(load(pkg)) gives the same program and the same weight bytes
    first = load_mlpackage(save_mlpackage(prog, tmp_path / "b.mlpackage"))
    again = load_mlpackage(save_mlpackage(first.program, tmp_path / "c.mlpackage", weights=first.weights))
    assert again.program == first.program
    assert (tmp_path / "b.mlpackage/Data/com.apple.CoreML/weights/weight.bin").read_bytes() == (
        tmp_path / "c.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
    ).read_bytes()


def test_kernel_style_weight_files_are_copied_into_weight_bin(tmp_path):
    from anekit.blob import write_blobs

    w = (RNG.standard_normal((32, 32, 1, 1)) * 0.1).astype(np.float16)
    bias = RNG.standard_normal(32).astype(np.float16)
    (tmp_path / "w.bin").write_bytes(b"")
    write_blobs(tmp_path / "w.bin", [(w, "fp16")])
    write_blobs(tmp_path / "b.bin", [(bias, "fp16")])
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 32, 1, 16]))
    wv = f.weight(tensor("fp16", [32, 32, 1, 1]), "@model_path/weights/w.bin", 64, name="w")
    bv = f.weight(tensor("fp16", [32]), "@model_path/weights/b.bin", 64, name="bias")
    f.output(f.conv(x=x, weight=wv, bias=bv, name="y"))
    weights = {
        "@model_path/weights/w.bin": tmp_path / "w.bin",
        "@model_path/weights/b.bin": tmp_path / "b.bin",
    }
    path = save_mlpackage(b.build(), tmp_path / "k.mlpackage", weights=weights)
    spec, ct_prog = ct_load(path)
    assert (
        val_kind(spec, "main", "w") == "blobFileValue" and val_kind(spec, "main", "bias") == "immediateValue"
    )
    consts = ct_consts(ct_prog)
    np.testing.assert_array_equal(consts["w"], w)
    np.testing.assert_array_equal(consts["bias"], bias)


@pytest.mark.parametrize("consume", [False, True])
def test_one_weight_file_becomes_weight_bin_as_it_is(tmp_path, consume):
    """A program whose consts all come from one weight file: the file is taken whole (copied, or moved
    when the caller hands it over), offsets kept; a small const of it is still written inline."""
    from anekit.blob import write_blobs

    w = (RNG.standard_normal((32, 32, 1, 1)) * 0.1).astype(np.float16)
    bias = RNG.standard_normal(32).astype(np.float16)
    src = tmp_path / "all.bin"
    off_w, off_b = write_blobs(src, [(w, "fp16"), (bias, "fp16")])
    original = src.read_bytes()
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 32, 1, 16]))
    wv = f.weight(tensor("fp16", [32, 32, 1, 1]), WEIGHT_PATH, off_w, name="w")
    bv = f.weight(tensor("fp16", [32]), WEIGHT_PATH, off_b, name="bias")
    f.output(f.conv(x=x, weight=wv, bias=bv, name="y"))
    path = save_mlpackage(
        b.build(), tmp_path / "k.mlpackage", weights={WEIGHT_PATH: src}, consume_weights=consume
    )
    assert (path / "Data/com.apple.CoreML/weights/weight.bin").read_bytes() == original
    assert src.exists() is not consume
    spec, ct_prog = ct_load(path)
    assert (
        val_kind(spec, "main", "w") == "blobFileValue" and val_kind(spec, "main", "bias") == "immediateValue"
    )
    consts = ct_consts(ct_prog)
    np.testing.assert_array_equal(consts["w"], w)
    np.testing.assert_array_equal(consts["bias"], bias)
    loaded = load_mlpackage(path)
    ref = next(op for op in loaded.program.main.ops if op.outputs[0].name == "w").attributes["val"].value
    assert ref == BlobRef(WEIGHT_PATH, off_w)


def test_the_builder_option(tmp_path):
    w = (RNG.standard_normal((64, 64, 1, 1)) * 0.1).astype(np.float16)  # 8192 bytes: tracked
    small = RNG.standard_normal((64, 16, 1, 1)).astype(np.float16)  # 2048 bytes: under 4096, inline
    b = Builder(blob_storage=True, blob_threshold=4096)
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 64, 1, 16]))
    y = f.conv(x=x, weight=f.const(w, name="w"), name="y")
    f.const(small, name="small")
    f.output(y)
    prog = b.build()
    consts = {op.outputs[0].name: op.attributes["val"] for op in prog.main.ops if op.op_type == "const"}
    assert consts["w"].value == BlobRef(WEIGHT_PATH, 64) and not consts["small"].is_blob
    assert list(b.weights) == [WEIGHT_PATH]
    path = save_mlpackage(prog, tmp_path / "b.mlpackage", weights=b.weights, blob_threshold=None)
    spec, ct_prog = ct_load(path)
    assert (
        val_kind(spec, "main", "w") == "blobFileValue" and val_kind(spec, "main", "small") == "immediateValue"
    )
    np.testing.assert_array_equal(ct_consts(ct_prog)["w"], w)
    np.testing.assert_array_equal(ct_consts(ct_prog)["small"], small)
    # the builder's program runs on its weights exactly as the package does
    xv = RNG.standard_normal((1, 64, 1, 16)).astype(np.float32)
    sim = runtime.open("sim", strict=False, precision="fp32")
    with sim.compile(prog, b.weights) as k:
        direct = k(x=xv)["y"]
    pkg = load_mlpackage(path)
    with sim.compile(pkg.program, pkg.weights) as k:
        packaged = k(x=xv)["y"]
    np.testing.assert_array_equal(direct, packaged)
    expect = np.einsum("oc,bcs->bos", w[:, :, 0, 0].astype(np.float64), xv[:, :, 0, :].astype(np.float64))
    np.testing.assert_allclose(packaged[:, :, 0, :], expect, rtol=2e-3, atol=2e-3)


def test_an_ios16_program_keeps_its_opset(tmp_path):
    w = (RNG.standard_normal((64, 32, 1, 1)) * 0.2).astype(np.float16)
    b = Builder(version="1.0")
    f = b.function("main", opset="ios16")
    x = f.input("x", tensor("fp16", [1, 32, 1, 16]))
    f.output(f.conv(x=x, weight=f.const(w, name="w"), name="y"))
    prog = b.build()
    path = save_mlpackage(prog, tmp_path / "o.mlpackage")
    spec, ct_prog = ct_load(path)
    assert spec.specificationVersion == 7 and spec.mlProgram.functions["main"].opset == "CoreML6"
    np.testing.assert_array_equal(ct_consts(ct_prog)["w"], w)
    assert load_mlpackage(path).program.main.opset == "ios16"
