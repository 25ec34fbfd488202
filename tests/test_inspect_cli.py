"""``anekit inspect``: every artifact kind recognised by content, readable and JSON summaries, --diff,
and clear errors for unknown kinds and missing decoders."""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from anekit.blob import write_blobs
from anekit.cli.main import main
from anekit.errors import AnekitError, FormatError
from anekit.inspect import dispatch
from anekit.inspect.e5 import ArgFrame, E5Program, Operand, OpType, Section, TensorDescriptor, build_e5
from anekit.kernels.config import ModelConfig
from anekit.llama.checkpoint import CheckpointMeta, build_checkpoint
from anekit.llama.llama2c import write_llama2c
from anekit.llama.params import Params
from tests.conftest import corpus_files, corpus_path

TINY = ModelConfig(dim=16, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=24, seq_len=8)


def needs(module: str) -> None:
    """Skip when a decoder module another part of the project provides is not there yet."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not available yet")


def inspect(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["inspect", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def inspect_json(capsys, path: Path, status: int = 0) -> dict:
    """The JSON description; a bundle with problems is still described, with status 1 and its first
    problem as the one line on stderr."""
    rc, out, err = inspect(capsys, str(path), "--json")
    assert rc == status, err
    info = json.loads(out)
    if status:
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith("anekit: " + info["problems"][0])
    else:
        assert err == ""
    return info


# -- files made here ----------------------------------------------------------------------------------------


def make_milblob(path: Path, shift: float = 0.0) -> Path:
    write_blobs(path, [(np.ones((4, 4)), "fp16"), (np.arange(8.0) + shift, "fp16"), (np.zeros(3), "fp32")])
    return path


def make_blzt(path: Path, edit: bool = False) -> Path:
    params = Params.init(TINY, seed=0)
    if edit:
        params.layers[1].w2[3, 5] += 1.0
    m, v = params.zeros_like(), params.zeros_like()
    path.write_bytes(build_checkpoint(params, m, v, CheckpointMeta(step=7, total_steps=10, lr=0.5, loss=2.5)))
    return path


def make_e5(path: Path, middle: OpType = OpType.AneInference) -> Path:
    t = TensorDescriptor(dim=(1, 8, 1, 4), width=4, height=1, channels=8, storage_type=3)
    ops = [(0, OpType.Cast), (1, middle), (2, OpType.Cast)]
    path.write_bytes(
        build_e5(
            E5Program(
                symbol_names=("Op0_Cast", f"Op1_{middle.name}", "Op2_Cast"),
                sections=tuple(
                    Section(f"Op{i}_{k.name}", k, ArgFrame((Operand("x", 0, 0, t), Operand("y", 1, 1, t))))
                    for i, k in ops
                ),
            )
        )
    )
    return path


def make_mlpackage(root: Path) -> Path:
    data = root / "Data" / "com.apple.CoreML"
    (data / "weights").mkdir(parents=True)
    (data / "model.mlmodel").write_bytes(b"\x08\x07" + bytes(30))
    make_milblob(data / "weights" / "weight.bin")
    manifest = {
        "fileFormatVersion": "1.0.0",
        "itemInfoEntries": {
            "A": {"author": "com.apple.CoreML", "path": "com.apple.CoreML/model.mlmodel"},
            "B": {"author": "com.apple.CoreML", "path": "com.apple.CoreML/weights"},
        },
        "rootModelIdentifier": "A",
    }
    (root / "Manifest.json").write_text(json.dumps(manifest))
    return root


# -- every kind ---------------------------------------------------------------------------------------------

CORPUS_KINDS = [
    ("hwx", "*.hwx", "hwx", "anekit.inspect.hwx"),
    ("ane_td", "*.bin", "ane_td", "anekit.inspect.td"),
    ("mil", "*.mil", "mil", ""),
    ("llama2c", "stories260K.bin", "llama2c", ""),
    ("llama2c", "tokenizer.bin", "llama2c.tokenizer", ""),
    ("llama2c", "tokenizer.model", "sentencepiece", ""),
    ("plist", "*.plist", "plist", ""),
    ("mlmodelc", "*.mlmodelc", "mlmodelc", ""),
    ("mlmodelc", "*.mlmodelc/metadata.json", "json", ""),
    ("mlmodelc", "*.mlmodelc/**/coremldata.bin", "coremldata", ""),
    ("ane_weights", "*.weights", "ane_weights", ""),
]
CORPUS_CASES = [
    pytest.param(path, kind, module, id=f"{folder}/{path.name}")
    for folder, pattern, kind, module in CORPUS_KINDS
    for path in corpus_files(folder, pattern)
]


@pytest.mark.parametrize("path, kind, module", CORPUS_CASES)
def test_every_corpus_file_is_recognised_and_summarised(path, kind, module, capsys):
    if module:
        needs(module)
    info = inspect_json(capsys, path)
    assert info["file"] == str(path) and info["kind"] == kind
    rc, out, _ = inspect(capsys, str(path))
    assert rc == 0
    assert out.splitlines()[0].startswith(f"{path}: ") and f"[{kind}]" in out.splitlines()[0]


def test_corpus_summaries_hold_the_files_facts(capsys):
    mil = inspect_json(capsys, corpus_path("mil", "751k-hwx-model.mil"))
    assert mil["functions"][0]["signature"].startswith("main<ios18>(x: tensor<fp16, [1, 64, 64, 64]>)")
    assert mil["op_histogram"] == {"const": 21, "conv": 3, "relu": 3} and mil["verifies"] is True
    assert [r["offset"] for r in mil["blob_refs"]] == [64, 8320, 8512, 16768, 16960, 25216]

    bundle = inspect_json(capsys, corpus_path("mlmodelc", "add_model.mlmodelc"))
    assert [p["path"] for p in bundle["parts"]] == [
        "analytics/coremldata.bin",
        "coremldata.bin",
        "metadata.json",
        "model.mil",
    ]
    assert [p["size"] for p in bundle["parts"]] == [243, 319, 1727, 472]
    assert bundle["model_mil"]["op_histogram"] == {"mul": 1}
    assert bundle["metadata.json"]["mlProgramOperationTypeHistogram"] == {"Ios16.mul": 1}

    model = inspect_json(capsys, corpus_path("llama2c", "stories260K.bin"))
    assert model["config"] == {
        "dim": 64,
        "hidden_dim": 172,
        "n_layers": 5,
        "n_heads": 8,
        "n_kv_heads": 4,
        "vocab_size": 512,
        "seq_len": 512,
    }
    assert model["shared_classifier"] is True and model["rope_tables_stored"] is True

    tok = inspect_json(capsys, corpus_path("llama2c", "tokenizer.bin"))
    assert tok["vocab_size"] == 32000 and tok["max_token_length"] == 27 and tok["byte_fallback_pieces"] == 256
    sp = inspect_json(capsys, corpus_path("llama2c", "tokenizer.model"))
    assert sp["vocab_size"] == 32000 and sp["first_pieces"][:3] == ["<unk>", "<s>", "</s>"]


def test_hwx_summary_header(capsys):
    needs("anekit.inspect.hwx")
    info = inspect_json(capsys, corpus_path("hwx", "tinygrad-ops-relu-f37fecdd.hwx"))
    assert info["header"]["magic"] == "0xbeefface" and info["header"]["ncmds"] == 11


@pytest.mark.parametrize("path", corpus_files("ane_weights", "*"), ids=lambda p: p.name)
def test_ane_weight_files_are_described_with_the_plist_that_names_them(path, tmp_path, capsys):
    info = inspect_json(capsys, path)
    assert info["kind"] == "ane_weights" and info["file_size"] == path.stat().st_size
    # Beside a network plist that lists it (as ANECompiler's net.plist lists its weights), it says so.
    name = path.name.removeprefix("tinygrad-")
    (tmp_path / name).write_bytes(path.read_bytes())
    net = corpus_path("plist", "tinygrad-net.plist")
    (tmp_path / "net.plist").write_bytes(net.read_bytes())
    info = inspect_json(capsys, tmp_path / name)
    listed = name in ("model.espresso.weights", "net.additional.weights")  # net.plist's Weights array
    assert info["referenced_by"] == (["net.plist"] if listed else [])


def test_min_weights_read_as_the_uint16_count_they_hold(capsys):
    info = inspect_json(capsys, corpus_path("ane_weights", "tinygrad-min.weights"))
    assert info["as_uint16"]["range"] == [0, 1023] and info["as_fp16"]["count"] == 1024  # SOURCES.md


def test_coreml_metadata_and_coremldata_are_described(capsys):
    bundle = corpus_path("mlmodelc", "add_model.mlmodelc")
    meta = inspect_json(capsys, bundle / "metadata.json")
    assert meta["format"].startswith("CoreML compiled-model metadata")
    assert meta["contents"]["specificationVersion"] == 7
    assert meta["contents"]["mlProgramOperationTypeHistogram"] == {"Ios16.mul": 1}
    data = inspect_json(capsys, bundle / "coremldata.bin")
    assert "var_3" in data["strings"] and data["file_size"] == 319  # the output name of model.mil


@pytest.mark.parametrize("path", corpus_files("mlmodel", "*.mlmodel"), ids=lambda p: p.name)
def test_neural_network_specs_are_summarised(path, capsys):
    summary = inspect_json(capsys, str(path))
    assert summary["kind"] == "mlmodel" and summary["model_type"] == "neuralNetwork"


def test_files_made_here(tmp_path, capsys):
    blobs = inspect_json(capsys, make_milblob(tmp_path / "w.bin"))
    assert blobs["kind"] == "milblob" and len(blobs["entries"]) == 3

    ckpt = inspect_json(capsys, make_blzt(tmp_path / "ckpt.bin"))
    assert ckpt["kind"] == "blzt" and ckpt["meta"]["step"] == 7 and ckpt["meta"]["lr"] == 0.5
    assert ckpt["config"]["dim"] == 16 and ckpt["parameters"] == Params.init(TINY).count()
    assert (
        ckpt["config"]["n_kv_heads"] == 2 and ckpt["n_kv_heads_from_file_size"] is True
    )  # not in the header

    desc = inspect_json(capsys, make_e5(tmp_path / "d.e5"))
    assert desc["kind"] == "e5" and desc["op_chain"] == "Cast -> AneInference -> Cast"
    _, out, _ = inspect(capsys, str(tmp_path / "d.e5"))
    assert "op_chain: Cast -> AneInference -> Cast" in out and "dispatches: 1" in out

    write_llama2c(tmp_path / "m1.bin", Params.init(TINY, tied=False), version=1)
    ak42 = inspect_json(capsys, tmp_path / "m1.bin")
    assert ak42["kind"] == "llama2c" and ak42["format"].endswith("(ak42 version 1)")
    assert ak42["shared_classifier"] is False and ak42["tensors"][-1]["name"] == "wcls"
    write_llama2c(tmp_path / "m0.bin", Params.init(TINY, tied=False))
    assert inspect_json(capsys, tmp_path / "m0.bin")["format"].endswith("(legacy)")

    package = inspect_json(capsys, make_mlpackage(tmp_path / "m.mlpackage"), status=1)  # a made-up model
    assert package["kind"] == "mlpackage" and "not a CoreML Model protobuf" in package["problems"][0]
    assert package["weights"]["Data/com.apple.CoreML/weights/weight.bin"]["blobs"] == 3
    assert package["Manifest.json"]["items"] == ["com.apple.CoreML/model.mlmodel", "com.apple.CoreML/weights"]


def test_the_kind_comes_from_the_content_not_the_name(tmp_path, capsys):
    renamed = {
        "a.mil": make_milblob(tmp_path / "w.bin"),
        "b.bin": make_e5(tmp_path / "d.e5"),
        "c.hwx": make_blzt(tmp_path / "c.ckpt"),
    }
    for name, source in renamed.items():
        expected = inspect_json(capsys, source)["kind"]
        shutil.copy(source, tmp_path / name)
        assert inspect_json(capsys, tmp_path / name)["kind"] == expected
    shutil.copy(corpus_path("mil", "coremltools-add_model.mil"), tmp_path / "model.hwx")
    assert inspect_json(capsys, tmp_path / "model.hwx")["kind"] == "mil"


def claimants(path: Path) -> list[str]:
    """Every kind whose content test accepts the file (detection order must not hide an ambiguity)."""
    src = dispatch.Source.open(path)
    out = []
    for kind in dispatch.KINDS:
        if kind.directory != src.is_dir:
            continue
        if kind.module:
            mod = dispatch._load(kind.module)
            if mod is not None and dispatch._module_sniff(kind, mod, src):
                out.append(kind.name)
        elif kind.sniff(src):
            out.append(kind.name)
    return out


def test_no_two_kinds_claim_the_same_file(tmp_path):
    expected = {
        make_milblob(tmp_path / "w.bin"): ["milblob"],
        make_blzt(tmp_path / "c.bin"): ["blzt"],
        make_e5(tmp_path / "d.bin"): ["e5"],
        make_mlpackage(tmp_path / "m.mlpackage"): ["mlpackage"],
    }
    for folder, pattern, kind, module in CORPUS_KINDS:
        if not module or importlib.util.find_spec(module) is not None:
            expected.update({p: [kind] for p in corpus_files(folder, pattern)})
    expected.update({p: ["mlmodel"] for p in corpus_files("mlmodel", "*.mlmodel")})
    for path, kinds in expected.items():
        assert claimants(path) == kinds, path


# -- --diff -------------------------------------------------------------------------------------------------


def test_diff_of_two_hwx_copies_names_the_header_field_and_the_section(tmp_path, capsys):
    needs("anekit.inspect.hwx")
    a = tmp_path / "a.hwx"
    shutil.copy(corpus_path("hwx", "tinygrad-ops-relu-f37fecdd.hwx"), a)
    b = bytearray(a.read_bytes())
    struct.pack_into("<I", b, 8, 5)  # cpusubtype 4 -> 5
    b[0x4280 + 10] ^= 0xFF  # one byte of __TEXT,__const
    (tmp_path / "b.hwx").write_bytes(b)
    rc, out, _ = inspect(capsys, "--diff", str(a), str(tmp_path / "b.hwx"))
    assert rc == 0
    assert "header.cpusubtype: 0x4 -> 0x5" in out
    assert "0x428a (segments[1].sections[1] __const)" in out
    rc, out, _ = inspect(capsys, "--diff", str(a), str(tmp_path / "b.hwx"), "--json")
    result = json.loads(out)
    assert {"field": "header.cpusubtype", "a": "0x4", "b": "0x5"} in result["differences"]
    assert result["bytes"]["differing_bytes"] == 2


def test_diff_of_two_task_descriptor_payloads_points_at_the_descriptor(tmp_path, capsys):
    needs("anekit.inspect.td")
    a = tmp_path / "a.bin"
    shutil.copy(corpus_path("ane_td", "eiln-unary-atan.bin"), a)  # three descriptors at 0, 0x300, 0x600
    b = bytearray(a.read_bytes())
    b[0x310] ^= 1
    (tmp_path / "b.bin").write_bytes(b)
    result = dispatch.diff(a, tmp_path / "b.bin")
    assert result["kind"] == "ane_td" and result["bytes"]["differing_bytes"] == 1
    assert result["differences"] and all(
        c["field"].startswith("descriptors[1]") for c in result["differences"]
    )
    assert result["bytes"]["first_runs"] == ["0x310 (descriptors[1])"]


def test_diff_of_two_milblob_files_shows_which_weight_changed(tmp_path, capsys):
    a, b = make_milblob(tmp_path / "a.bin"), make_milblob(tmp_path / "b.bin", shift=1.0)
    rc, out, _ = inspect(capsys, "--diff", str(a), str(b))
    assert rc == 0
    changed = [line.split(":")[0] for line in out.splitlines()[3:] if not line.startswith("bytes")]
    assert changed == ["entries[1].crc32"]
    assert "(entries[1] data)" in out


def test_diff_of_two_checkpoints_names_the_edited_tensor(tmp_path, capsys):
    a, b = make_blzt(tmp_path / "a.bin"), make_blzt(tmp_path / "b.bin", edit=True)
    result = dispatch.diff(a, b)
    assert [c["field"] for c in result["differences"]] == [
        f"tensors[{i}].crc32"
        for i, t in enumerate(dispatch.inspect_path(a)[1]["tensors"])
        if t["name"] == "layers.1.w2"
    ]
    assert result["bytes"]["differing_bytes"] >= 1


def test_diff_of_two_descriptors_shows_the_op_type(tmp_path, capsys):
    a = make_e5(tmp_path / "a.e5")
    b = make_e5(tmp_path / "b.e5", middle=OpType.CpuInference)
    _, out, _ = inspect(capsys, "--diff", str(a), str(b))
    assert "sections[1].op_type: AneInference -> CpuInference" in out
    assert 'op_chain: "Cast -> AneInference -> Cast" -> "Cast -> CpuInference -> Cast"' in out


def test_diff_of_two_bundles_and_of_identical_files(tmp_path, capsys):
    a = tmp_path / "a.mlmodelc"
    shutil.copytree(corpus_path("mlmodelc", "add_model.mlmodelc"), a)
    b = tmp_path / "b.mlmodelc"
    shutil.copytree(a, b)
    (b / "model.mil").chmod(0o644)
    (b / "model.mil").write_text(
        (a / "model.mil").read_text().replace("mul(x = x, y = y)", "add(x = x, y = y)")
    )
    result = dispatch.diff(a, b)
    fields = [c["field"] for c in result["differences"]]
    assert "parts[3].crc32" in fields and "model_mil.op_histogram.add" in fields
    assert "bytes" not in result
    _, out, _ = inspect(capsys, "--diff", str(a / "model.mil"), str(a / "model.mil"))
    assert "no differences in the decoded fields" in out and "bytes: identical" in out


def test_a_bundle_with_a_bad_model_mil_or_a_missing_weight_is_still_described(tmp_path, capsys):
    bundle = tmp_path / "m.mlmodelc"
    (bundle / "weights").mkdir(parents=True)
    make_milblob(bundle / "weights" / "weight.bin")  # blobs at 64, 192, 320
    text = corpus_path("mil", "751k-hwx-model.mil").read_text()
    (bundle / "model.mil").write_text(text)
    info = inspect_json(capsys, bundle, status=1)
    assert info["weights"]["weights/weight.bin"]["blobs"] == 3
    missing = [("conv0_bias_0", 8320), ("conv1_weight_0", 8512), ("conv1_bias_0", 16768)]
    missing += [("conv2_weight_0", 16960), ("conv2_bias_0", 25216)]  # only the blob at 64 exists here
    assert info["model_mil"]["unresolved_blob_refs"] == [
        f"{op}: @model_path/weights/weight.bin offset {off}" for op, off in missing
    ]
    assert info["problems"][0] == (
        f"[inspect] {bundle}: model.mil: conv0_bias_0: @model_path/weights/weight.bin offset 8320 names no "
        "blob of the bundle's weight files"
    )
    (bundle / "model.mil").write_bytes(b"program(1.0)\n\xff\n")
    info = inspect_json(capsys, bundle, status=1)
    assert info["model_mil"]["error"].startswith("[mil]") and "not UTF-8" in info["model_mil"]["error"]


def test_diff_needs_two_files_of_one_kind(tmp_path, capsys):
    rc, _, err = inspect(
        capsys, "--diff", str(make_milblob(tmp_path / "w.bin")), str(make_e5(tmp_path / "d"))
    )
    assert rc == 1 and "--diff needs two files of one kind" in err and "milblob" in err and "e5" in err


# -- errors -------------------------------------------------------------------------------------------------


def test_unknown_kinds_fail_with_a_clear_message(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    noise = tmp_path / "noise.hwx"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "readme.txt").write_text("hi")
    for path in (empty, noise):
        rc, out, err = inspect(capsys, str(path))
        assert rc == 1 and out == "" and "not a file kind anekit can inspect" in err
    rc, _, err = inspect(capsys, str(folder))
    assert rc == 1 and "a directory that is neither a .mlpackage nor a .mlmodelc bundle" in err
    rc, _, err = inspect(capsys, str(tmp_path / "missing.bin"))
    assert rc == 1 and "cannot read" in err
    rc, _, err = inspect(capsys)
    assert rc == 1 and "give one FILE to describe, or --diff A B" in err


def test_a_broken_file_of_a_known_kind_reports_its_decoders_error(tmp_path, capsys):
    bad = bytearray(make_e5(tmp_path / "d.e5").read_bytes())
    struct.pack_into("<I", bad, bad.rfind(b"Op2_Cast") - 4, 0xFFFF)  # symbol_names[2]'s length
    (tmp_path / "bad.e5").write_bytes(bad)
    ckpt = bytearray(make_blzt(tmp_path / "c.bin").read_bytes())
    (tmp_path / "short.bin").write_bytes(ckpt[:-4])
    mil = tmp_path / "bad.mil"
    mil.write_text("program(1.0)\n{\n  func main<ios16>(tensor<fp16, [1]> x) {\n  } -> (y);\n}\n")
    rc, _, err = inspect(capsys, str(tmp_path / "short.bin"))
    assert rc == 1 and err.startswith("anekit: [blzt] file size")
    info = inspect_json(capsys, mil)  # parses but does not verify: reported, not fatal
    assert info["verifies"] is False and info["problems"] == [
        "main: function output 'y' is not defined in the function"
    ]
    mil.write_text(mil.read_text().replace("> x)", "> x"))
    rc, _, err = inspect(capsys, str(mil))
    assert rc == 1 and err.startswith(f"anekit: [mil.parse] {mil}:3:")
    rc, _, err = inspect(capsys, str(tmp_path / "bad.e5"))
    assert rc == 1 and "not a file kind anekit can inspect" in err  # a broken FlatBuffer is no known kind,
    assert "not an E5 dispatch descriptor ([e5] symbol_names[2] at byte" in err  # but the E5 decoder says why
    assert "string of 65535 bytes runs outside the buffer" in err


def test_a_missing_decoder_module_is_a_clear_error(tmp_path, capsys, monkeypatch):
    real_load = dispatch._load
    monkeypatch.setattr(
        dispatch,
        "_load",
        lambda m: None if m in ("anekit.inspect.hwx", "anekit.inspect.td") else real_load(m),
    )
    hwx = tmp_path / "x.bin"
    hwx.write_bytes(bytes.fromhex("cefaefbe80000000") + bytes(100))
    with pytest.raises(
        AnekitError, match=r"signature of the ANE hardware container .* anekit\.inspect\.hwx is not available"
    ):
        dispatch.identify(hwx)
    rc, _, err = inspect(capsys, str(hwx))
    assert rc == 1 and "anekit.inspect.hwx is not available" in err
    td = corpus_files("ane_td", "*.bin")
    if td:
        with pytest.raises(
            FormatError, match=r"decoders not available here: anekit\.inspect\.hwx .*anekit\.inspect\.td"
        ):
            dispatch.identify(td[0])


def test_a_decoder_that_fails_to_import_for_another_reason_is_not_hidden(monkeypatch):
    def broken(name, *a, **k):
        raise ModuleNotFoundError("No module named 'somedependency'", name="somedependency")

    monkeypatch.setattr(dispatch.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="somedependency"):
        dispatch._load("anekit.inspect.hwx")


def test_a_kernel_dump_directory_and_its_index_are_described(tmp_path, capsys):
    out = tmp_path / "dump"
    assert main(["kernels", "dump", "--config", "stories260K", str(out)]) == 0
    capsys.readouterr()
    index = json.loads((out / "kernels.json").read_text())
    info = inspect_json(capsys, out)
    assert info["kind"] == "kernel_dump" and info["config"] == index["config"]
    assert [k["name"] for k in info["kernels"]] == list(index["kernels"])
    for k in info["kernels"]:  # each kernel folder's own files, read back: its MIL verifies, its blobs exist
        folder = out / k["name"]
        assert k["verifies"] is True and k["unresolved_blob_refs"] == []
        assert k["weight_files"] == len(list((folder / "weights").glob("*.bin")))
    assert info["all_verify"] is True
    doc = inspect_json(capsys, out / "kernels.json")
    assert doc["kind"] == "json" and doc["format"].startswith("anekit kernel dump index")
    assert doc["contents"]["kernels"] == sorted(index["kernels"])
    (out / "kernels.json").unlink()
    rc, _, err = inspect(capsys, str(out))
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "no kernels.json" in err
