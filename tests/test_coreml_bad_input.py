"""Bad packages and bad saves: each is one anekit error naming the file, field or op; nothing half-written."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys

import numpy as np
import pytest

from anekit.coreml import CoreMLFormatError, CoreMLUnavailable, _proto, load_mlpackage, save_mlpackage
from anekit.errors import AnekitError, FormatError
from anekit.mil import Builder, tensor
from tests.coreml_oracle import coremltools

coremltools()

MODEL = "Data/com.apple.CoreML/model.mlmodel"
WEIGHTS = "Data/com.apple.CoreML/weights/weight.bin"


def program():
    w = np.random.default_rng(3).standard_normal((64, 32, 1, 1)).astype(np.float16)
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 32, 1, 16]))
    f.output(f.conv(x=x, weight=f.const(w, name="w"), name="y"))
    return b.build()


@pytest.fixture
def pkg(tmp_path):
    return save_mlpackage(program(), tmp_path / "m.mlpackage")


def spec_of(path):
    from anekit.coreml._proto import proto

    m = proto().Model.Model()
    m.ParseFromString((path / MODEL).read_bytes())
    return m


def write_spec(path, m):
    (path / MODEL).write_bytes(m.SerializeToString())


def blob_value(m):
    fn = m.mlProgram.functions["main"]
    for op in fn.block_specializations[fn.opset].operations:
        if op.type == "const" and op.attributes["val"].WhichOneof("value") == "blobFileValue":
            return op.attributes["val"].blobFileValue
    raise AssertionError("no blob value")


def refused(path, *words):
    with pytest.raises(CoreMLFormatError) as info:
        load_mlpackage(path)
    text = str(info.value)
    assert text.startswith("[mlpackage] "), text
    for w in words:
        assert w in text, text
    return text


def test_a_package_without_its_weight_file(pkg):
    (pkg / WEIGHTS).unlink()
    refused(pkg, "model.mlmodel", "weight file", "does not exist")


def test_a_blob_offset_past_the_end(pkg):
    m = spec_of(pkg)
    blob_value(m).offset = 1 << 40
    write_spec(pkg, m)
    refused(pkg, "blobFileValue.offset", "not a blob metadata record")


def test_a_blob_offset_not_on_a_metadata_record(pkg):
    m = spec_of(pkg)
    blob_value(m).offset = 128  # the data, not the record
    write_spec(pkg, m)
    refused(pkg, "blobFileValue.offset", "sentinel")


def test_a_blob_of_another_dtype_than_declared(pkg):
    raw = bytearray((pkg / WEIGHTS).read_bytes())
    struct.pack_into("<I", raw, 64 + 4, 2)  # fp16 -> fp32: the size no longer matches either
    (pkg / WEIGHTS).write_bytes(bytes(raw))
    refused(pkg, "holds", "declares")


def test_a_manifest_that_points_nowhere(pkg):
    doc = json.loads((pkg / "Manifest.json").read_text())
    doc["itemInfoEntries"][doc["rootModelIdentifier"]]["path"] = "com.apple.CoreML/gone.mlmodel"
    (pkg / "Manifest.json").write_text(json.dumps(doc))
    refused(pkg, "Manifest.json", "points nowhere")
    doc["rootModelIdentifier"] = "nobody"
    (pkg / "Manifest.json").write_text(json.dumps(doc))
    refused(pkg, "rootModelIdentifier", "names no entry")
    (pkg / "Manifest.json").write_text("{not json")
    refused(pkg, "Manifest.json", "not JSON")


@pytest.mark.parametrize("bad", ["../../outside.mlmodel", "/etc/passwd", "com.apple.CoreML/../../../x"])
def test_manifest_paths_that_leave_the_package(pkg, bad):
    doc = json.loads((pkg / "Manifest.json").read_text())
    doc["itemInfoEntries"][doc["rootModelIdentifier"]]["path"] = bad
    (pkg / "Manifest.json").write_text(json.dumps(doc))
    refused(pkg, "Manifest.json", "path")


@pytest.mark.parametrize("bad", ["@model_path/../../secret.bin", "/etc/passwd", "weights/weight.bin"])
def test_blob_paths_that_leave_the_package(pkg, bad):
    m = spec_of(pkg)
    blob_value(m).fileName = bad
    write_spec(pkg, m)
    refused(pkg, "fileName")


def test_symlinks_out_of_the_package_are_not_followed(pkg, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(str(pkg / WEIGHTS), outside / "weight.bin")
    os.symlink(outside / "weight.bin", pkg / WEIGHTS)
    refused(pkg, "symlink", "not followed")
    # a whole folder linked out: the model spec itself
    shutil.move(str(pkg / "Data"), outside / "Data")
    os.symlink(outside / "Data", pkg / "Data")
    refused(pkg, "symlink")


def test_a_symlink_inside_the_package_is_fine(pkg):
    shutil.move(str(pkg / WEIGHTS), pkg / "Data" / "real.bin")
    os.symlink(pkg / "Data" / "real.bin", pkg / WEIGHTS)
    assert load_mlpackage(pkg).program.main.ops


@pytest.mark.parametrize("how", ["truncated", "random", "empty"])
def test_a_broken_model_spec(pkg, how):
    raw = (pkg / MODEL).read_bytes()
    data = {"truncated": raw[: len(raw) // 2], "random": np.random.default_rng(0).bytes(3000), "empty": b""}[
        how
    ]
    (pkg / MODEL).write_bytes(data)
    refused(pkg, "model.mlmodel")


def test_an_op_the_registry_does_not_know(pkg):
    m = spec_of(pkg)
    fn = m.mlProgram.functions["main"]
    fn.block_specializations[fn.opset].operations[-1].type = "frobnicate"
    write_spec(pkg, m)
    refused(pkg, "frobnicate", "unknown op", "operations[")


def test_an_op_whose_types_do_not_check(pkg):
    m = spec_of(pkg)
    fn = m.mlProgram.functions["main"]
    fn.block_specializations[fn.opset].operations[-1].outputs[0].type.tensorType.dimensions[
        1
    ].constant.size = 7
    write_spec(pkg, m)
    refused(pkg, "does not verify", "conv")


def test_saving_into_an_existing_path(tmp_path, pkg):
    before = (pkg / MODEL).read_bytes()
    with pytest.raises(CoreMLFormatError, match="already exists"):
        save_mlpackage(program(), pkg)
    assert (pkg / MODEL).read_bytes() == before
    save_mlpackage(program(), pkg, overwrite=True)
    assert load_mlpackage(pkg).program == load_mlpackage(pkg).program
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlpackage"]


@pytest.mark.parametrize("stage", ["weights", "manifest", "rename"])
def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch, stage):
    import anekit.coreml.save as save_mod
    from anekit.blob import BlobWriter

    def boom(*a, **k):
        raise OSError(f"injected failure at {stage}")

    if stage == "weights":
        monkeypatch.setattr(BlobWriter, "append", boom)
    elif stage == "manifest":
        monkeypatch.setattr(save_mod, "manifest_json", boom)
    else:
        monkeypatch.setattr(save_mod, "replace_path", boom)
    with pytest.raises(OSError, match="injected"):
        save_mlpackage(program(), tmp_path / "m.mlpackage")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_overwrite_keeps_the_old_package(tmp_path, pkg, monkeypatch):
    import anekit.coreml.save as save_mod

    before = (pkg / MODEL).read_bytes()
    monkeypatch.setattr(save_mod, "manifest_json", lambda: (_ for _ in ()).throw(OSError("injected")))
    with pytest.raises(OSError):
        save_mlpackage(program(), pkg, overwrite=True)
    assert (pkg / MODEL).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlpackage"]


def test_programs_a_package_cannot_hold(tmp_path):
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("int16", [1, 4]))  # no CoreML feature type for int16
    f.output(f.identity(x=x))
    with pytest.raises(CoreMLFormatError, match="input 'x'"):
        save_mlpackage(b.build(), tmp_path / "i.mlpackage")
    with pytest.raises(CoreMLFormatError, match=r"\.mlpackage"):
        save_mlpackage(program(), tmp_path / "wrong.bin")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_weight_source_names_the_const(tmp_path):
    b = Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, 32, 1, 16]))
    w = f.weight(tensor("fp16", [64, 32, 1, 1]), "@model_path/weights/w.bin", 64, name="w")
    f.output(f.conv(x=x, weight=w))
    with pytest.raises(CoreMLFormatError, match=r"op 'w'.*w\.bin"):
        save_mlpackage(b.build(), tmp_path / "w.mlpackage")
    assert list(tmp_path.iterdir()) == []


def test_without_the_extra_every_entry_point_names_it(tmp_path, monkeypatch, pkg, capsys):
    from anekit.cli.main import main

    monkeypatch.setitem(sys.modules, "coremltools", None)
    monkeypatch.setitem(sys.modules, "coremltools.proto", None)
    monkeypatch.setattr(_proto, "_cached", None)
    for call in (lambda: save_mlpackage(program(), tmp_path / "n.mlpackage"), lambda: load_mlpackage(pkg)):
        with pytest.raises(
            CoreMLUnavailable, match=r"pip install -e '\.\[coreml\]' in anekit's checkout"
        ) as info:
            call()
        assert isinstance(info.value, AnekitError) and not isinstance(info.value, FormatError)
    assert main(["run", str(pkg), "--random", "0"]) == 1
    assert "pip install -e '.[coreml]' in anekit's checkout" in capsys.readouterr().err
    main(["lint", str(pkg)])
    assert "pip install -e '.[coreml]' in anekit's checkout" in capsys.readouterr().out
    assert not (tmp_path / "n.mlpackage").exists()


def test_an_update_state_given_a_tuple_is_refused_naming_the_op():
    """Beyond what verify refuses: the spec writer itself names the op given a tuple for its state."""
    from anekit.coreml.spec import program_to_model
    from anekit.mil import Function, Op, Program, StateType, Var

    cache = Var("cache", StateType(tensor("fp16", [1, 8, 1, 32])))
    x = Var("x", tensor("fp16", [1, 8, 1, 32]))
    out = Var("stored", tensor("fp16", [1, 8, 1, 32]))
    fn = Function("main", [cache, x])
    fn.block.ops.append(Op("coreml_update_state", {"state": (cache, cache), "value": x}, [out]))
    fn.block.outputs.append(out)
    with pytest.raises(CoreMLFormatError, match=r"coreml_update_state takes one state and one value"):
        program_to_model(Program({"main": fn}), lambda *a: None, default_function="main")
