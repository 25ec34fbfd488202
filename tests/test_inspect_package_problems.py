"""`anekit inspect` on a damaged package says what is wrong instead of showing an empty manifest: a
corrupt or hostile Manifest.json, a missing weight.bin."""

from __future__ import annotations

import json
import shutil

from anekit.cli.main import main
from tests.conftest import corpus_path


def _export(tmp_path):
    out = tmp_path / "m.mlpackage"
    assert (
        main(["export", str(corpus_path("llama2c", "stories260K.bin")), "--to", "mlpackage", str(out)]) == 0
    )
    return out


def _inspect(capsys, path):
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_sound_package_has_no_problems(tmp_path, capsys):
    assert _inspect(capsys, _export(tmp_path))["problems"] == []


def test_a_missing_weight_file_and_a_corrupt_manifest_are_named(tmp_path, capsys):
    pkg = _export(tmp_path)
    broken = tmp_path / "nw.mlpackage"
    shutil.copytree(pkg, broken)
    [weights] = list(broken.rglob("weight.bin"))
    weights.unlink()
    problems = _inspect(capsys, broken)["problems"]
    assert problems and "weight" in problems[0]
    for text, says in (
        ("{}", None),
        ("[" * 100_000 + "]" * 100_000, "nested 100000 deep"),
        ("not", "not JSON"),
    ):
        bad = tmp_path / f"m{len(text)}.mlpackage"
        shutil.copytree(pkg, bad)
        (bad / "Manifest.json").write_text(text)
        info = _inspect(capsys, bad)
        assert info["problems"], text[:10]
        if says is not None:
            assert says in info["Manifest.json"]["error"]
