"""``anekit lint``: findings per line, exit status, JSON, every kind of target, and every preset's kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anekit import mil
from anekit.cli.main import main
from anekit.kernels import catalog
from anekit.kernels.config import PRESETS, preset
from anekit.mil import tensor
from anekit.rules import CHIPS, check_program, errors
from anekit.rules.doc import BEGIN, END, markdown

README = Path(__file__).resolve().parent.parent / "README.md"
GELU = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x) {
            tensor<fp16, [1, 64, 1, 32]> y = gelu(mode = string("EXACT"), x = x)[name = string("y")];
    } -> (y);
}
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_finding_per_line_with_its_rule_line_and_source_and_exit_1(tmp_path, capsys):
    assert main(["lint", str(_write(tmp_path / "g.mil", GELU))]) == 1
    out = capsys.readouterr().out.splitlines()
    finding = next(line for line in out if "op.gelu" in line)
    assert finding.startswith(f"{tmp_path / 'g.mil'}:4: op.gelu error main: gelu 'y' (line 4)")
    assert "mechramc/Orion docs/ane_constraints.md §10" in finding
    assert out[-1] == "1 programs: 1 errors, 2 warnings (chip: any)"  # warnings: two 4 KB surfaces


def test_a_clean_program_exits_0_and_json_lists_the_findings(tmp_path, capsys):
    path = _write(tmp_path / "t.mil", GELU.replace('gelu(mode = string("EXACT"), x = x)', "tanh(x = x)"))
    assert main(["lint", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == 0 and doc["chip"] == "any"
    findings = doc["programs"][0]["findings"]
    assert [(f["rule"], f["severity"]) for f in findings] == [("surface.min-bytes", "warn")] * 2
    assert all(f["source"].startswith("mechramc/Orion") for f in findings)


def test_unparsable_files_are_findings_and_the_others_still_get_linted(tmp_path, capsys):
    bad = _write(tmp_path / "a.mil", "program(1.3) {")
    good = _write(tmp_path / "b.mil", GELU)
    assert main(["lint", str(bad), str(good)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: mil.syntax error:" in out and "op.gelu" in out


def test_a_python_file_defining_programs(tmp_path, capsys):
    script = tmp_path / "prog.py"
    script.write_text(
        "from anekit import mil\nfrom anekit.mil import tensor\n\n"
        "@mil.program(inputs={'x': tensor('fp16', [1, 64, 1, 32])})\n"
        "def relu(f, x):\n    return f.relu(x=x)\n"
    )
    assert main(["lint", str(script), "--errors-only"]) == 0
    assert f"{script}::relu" not in capsys.readouterr().out  # no findings printed: clean
    (tmp_path / "none.py").write_text("x = 1\n")
    assert main(["lint", str(tmp_path / "none.py")]) == 1
    assert "defines no module-level Program" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["nowhere.mil"], "no such file or directory"),
        ([], "name at least one FILE_OR_DIR"),
    ],
)
def test_bad_targets_get_one_clear_line(tmp_path, capsys, args, message):
    assert main(["lint", *(str(tmp_path / a) for a in args)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("anekit: [lint]") and message in err and len(err.splitlines()) == 1


def test_a_directory_without_mil_and_a_package(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["lint", str(tmp_path / "empty")]) == 1
    assert "no .mil file below" in capsys.readouterr().err
    (tmp_path / "m.mlpackage").mkdir()  # an empty package: read, and refused naming the missing Manifest
    assert main(["lint", str(tmp_path / "m.mlpackage")]) == 1
    assert "has no Manifest.json" in capsys.readouterr().out


def test_the_chip_option(tmp_path, capsys):
    @mil.program(inputs={"x": tensor("fp16", [1, 64, 1, 32])})
    def prog(f, x):
        return f.cast(x=f.relu(x=x), dtype="fp32")

    path = _write(tmp_path / "c.mil", mil.to_text(prog))
    assert main(["lint", str(path)]) == 0
    assert main(["lint", str(path), "--chip", "m1"]) == 1
    assert "op.cast-m1-m2 error" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_kernel_of_every_preset_lints_without_errors(name):
    """Every kernel, baked and dynamic, for every preset, has no error finding, for any chip and for
    each chip (M1's rules are the strictest: the older dialect, one blob per weight file, no cast)."""
    cfg = preset(name)
    for kernel in [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS, *catalog.DYNAMIC_KERNELS]:
        program = catalog.build(kernel, cfg, None).program
        for chip in ("any", *CHIPS):
            broken = errors(check_program(program, chip=chip))
            assert not broken, (kernel, chip, [str(f) for f in broken])


def test_lint_over_a_kernel_dump_reports_no_error(tmp_path, capsys):
    assert main(["kernels", "dump", "--config", "stories260K", "--dynamic", str(tmp_path / "dump")]) == 0
    capsys.readouterr()
    assert main(["lint", str(tmp_path / "dump"), "--errors-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(f"{len(list((tmp_path / 'dump').rglob('*.mil')))} programs: 0 errors")


def test_the_readme_section_is_the_rule_book():
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "README lacks the generated rules section"
    section = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert section == markdown(), "README's rule table is stale: paste `anekit lint --rules` into it"
