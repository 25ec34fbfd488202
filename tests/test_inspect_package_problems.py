"""`anekit inspect` on a damaged package or bundle says what is wrong instead of showing an empty manifest
(a corrupt or hostile Manifest.json, a missing or truncated weight.bin, a model.mil that does not parse),
and fails: the description on stdout, the first problem as the one line on stderr, exit status 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from anekit.cli.main import main
from tests.conftest import corpus_path
from tests.test_cli_run import _program_with_weights


def _export(tmp_path):
    out = tmp_path / "m.mlpackage"
    assert (
        main(["export", str(corpus_path("llama2c", "stories260K.bin")), "--to", "mlpackage", str(out)]) == 0
    )
    return out


def _inspect(capsys, path, status=0):
    """The JSON description; with problems, status 1 and the first one as the only line on stderr."""
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == status
    out, err = capsys.readouterr()
    info = json.loads(out)
    if status == 0:
        assert err == "" and info["problems"] == []
    else:
        assert info["problems"] and err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith("anekit: " + info["problems"][0])
    return info


def _text(capsys, path):
    """``(status, stdout, stderr)`` of the readable description."""
    capsys.readouterr()
    status = main(["inspect", str(path)])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_sound_package_has_no_problems(tmp_path, capsys):
    assert _inspect(capsys, _export(tmp_path))["problems"] == []


def test_a_missing_weight_file_and_a_corrupt_manifest_are_named(tmp_path, capsys):
    pkg = _export(tmp_path)
    broken = tmp_path / "nw.mlpackage"
    shutil.copytree(pkg, broken)
    [weights] = list(broken.rglob("weight.bin"))
    weights.unlink()
    problems = _inspect(capsys, broken, status=1)["problems"]
    assert "weight" in problems[0] and "does not exist" in problems[0]
    for text, says in (
        ("{}", None),
        ("[" * 100_000 + "]" * 100_000, "nested 100000 deep"),
        ("not", "not JSON"),
    ):
        bad = tmp_path / f"m{len(text)}.mlpackage"
        shutil.copytree(pkg, bad)
        (bad / "Manifest.json").write_text(text)
        info = _inspect(capsys, bad, status=1)
        assert info["problems"], text[:10]
        if says is not None:
            assert says in info["Manifest.json"]["error"]


def test_a_truncated_weight_file_fails_after_the_description(tmp_path, capsys):
    pkg = _export(tmp_path)
    [weights] = list(pkg.rglob("weight.bin"))
    with open(weights, "r+b") as f:
        f.truncate(1000)  # the header still declares every blob; 1000 bytes hold far fewer
    info = _inspect(capsys, pkg, status=1)
    assert "[milblob] header.count" in info["problems"][0] and "a 1000-byte file" in info["problems"][0]
    status, out, err = _text(capsys, pkg)
    assert status == 1 and out.startswith(f"{pkg}: ") and "Manifest.json" in out  # still described
    assert err == f"anekit: {info['problems'][0]}\n"


def _compiled(folder: Path) -> Path:
    """folder (an .mlmodelc): model.mil multiplying x by a [1, 64, 1, 32] fp16 weight in weights/."""
    _program_with_weights(folder)
    return folder


def test_a_broken_compiled_bundle_is_described_and_fails(tmp_path, capsys):
    sound = _compiled(tmp_path / "m.mlmodelc")
    assert _inspect(capsys, sound)["model_mil"]["unresolved_blob_refs"] == []

    truncated = tmp_path / "t.mlmodelc"
    shutil.copytree(sound, truncated)
    with open(truncated / "weights" / "weight.bin", "r+b") as f:
        f.truncate(100)
    problem = _inspect(capsys, truncated, status=1)["problems"][0]
    assert problem.startswith(f"[inspect] {truncated}: weights/weight.bin: [milblob]")

    unparsable = tmp_path / "p.mlmodelc"
    shutil.copytree(sound, unparsable)
    (unparsable / "model.mil").write_text("program(1.0)\n{\n")
    problem = _inspect(capsys, unparsable, status=1)["problems"][0]
    assert problem.startswith(f"[mil.parse] {unparsable / 'model.mil'}:3:1:")

    no_weights = tmp_path / "w.mlmodelc"
    shutil.copytree(sound, no_weights)
    (no_weights / "weights" / "weight.bin").unlink()
    problem = _inspect(capsys, no_weights, status=1)["problems"][0]
    assert problem.startswith(f"[inspect] {no_weights}: model.mil: ") and "names no blob" in problem

    metadata = tmp_path / "j.mlmodelc"
    shutil.copytree(sound, metadata)
    (metadata / "metadata.json").write_text("[{")
    status, out, err = _text(capsys, metadata)
    assert status == 1 and "compiled CoreML model" in out.splitlines()[0]
    assert err.startswith(f"anekit: [inspect] {metadata}: metadata.json: ") and err.count("\n") == 1


def test_a_kernel_dump_with_a_missing_program_fails(tmp_path, capsys):
    out = tmp_path / "dump"
    assert main(["kernels", "dump", "--config", "stories260K", str(out)]) == 0
    assert _inspect(capsys, out)["all_verify"] is True
    first = sorted(p for p in out.iterdir() if (p / "model.mil").is_file())[0]
    (first / "model.mil").unlink()
    problem = _inspect(capsys, out, status=1)["problems"][0]
    assert problem == f"[inspect] {out}: {first.name}: {first.name}/model.mil is missing"
