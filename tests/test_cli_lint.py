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
            tensor<fp16, [1, 64, 1, 32]> y = gelu(x = x)[name = string("y")];
    } -> (y);
}
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_finding_per_line_with_its_rule_chip_route_and_source_and_exit_1(tmp_path, capsys):
    """gelu without its mode: refused on the M4's in-memory route (Orion §10), measured native on M1."""
    path = _write(tmp_path / "g.mil", GELU)
    assert main(["lint", str(path), "--chip", "m4"]) == 1
    out = capsys.readouterr().out.splitlines()
    finding = next(line for line in out if "op.gelu-mode" in line)
    assert finding.startswith(f"{path}:4: op.gelu-mode error main: gelu 'y' (line 4)")
    assert "(chip m4, route direct: error on m4; warn on m3)" in finding
    assert "mechramc/Orion docs/ane_constraints.md §10" in finding and "against: " in finding
    assert out[-1].startswith("1 program: 1 error, ") and out[-1].endswith("(chip: m4, route: direct)")
    assert main(["lint", str(path), "--chip", "m1"]) == 0  # the book measured gelu native on the M1
    assert "op.gelu-mode" not in capsys.readouterr().out


def test_a_clean_program_exits_0_and_json_lists_the_findings(tmp_path, capsys):
    path = _write(tmp_path / "t.mil", GELU.replace("gelu(x = x)", 'gelu(mode = string("EXACT"), x = x)'))
    assert main(["lint", str(path), "--json", "--chip", "m1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] == 0 and doc["chip"] == "m1" and doc["route"] == "direct"
    findings = doc["programs"][0]["findings"]
    assert findings == []
    path = _write(tmp_path / "n.mil", GELU.replace("[1, 64, 1, 32]", "[1, 32, 1, 32]"))
    assert main(["lint", str(path), "--json", "--chip", "m1"]) == 0
    findings = json.loads(capsys.readouterr().out)["programs"][0]["findings"]
    assert {(f["rule"], f["severity"], f["chip"], f["route"]) for f in findings} == {
        ("tensor.channels-multiple-64", "warn", "m1", "direct")
    }
    assert all("Espresso" in f["source"] and f["decision"] for f in findings)


def test_the_route_option(tmp_path, capsys):
    """The book measured single ops through the e5rt runtime at small shapes: on that route the in-memory
    route's surface rules do not apply, and an op measured native there lints clean."""
    small = GELU.replace("[1, 64, 1, 32]", "[1, 4, 1, 4]").replace("gelu(x = x)", "sigmoid(x = x)")
    path = _write(tmp_path / "s.mil", small)
    assert main(["lint", str(path), "--chip", "m1", "--route", "e5rt"]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1] == "1 program: 0 errors, 0 warnings (chip: m1, route: e5rt)"
    )
    assert main(["lint", str(path), "--chip", "m5"]) == 1
    assert "surface.min-row-bytes error" in capsys.readouterr().out
    for args, message in (
        (["--route", "tpu"], "argument --route: unknown route 'tpu' (choose one of: direct, e5rt, coreml)"),
        (["--chip", "m9"], "argument --chip: unknown chip 'm9' (choose one of: any, m1, m2, m3, m4, m5)"),
    ):
        with pytest.raises(SystemExit) as e:  # a usage error, as every flag's unknown value
            main(["lint", str(path), *args])
        assert e.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"anekit lint: error: {message}"


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
        return f.sin(x=f.relu(x=x))

    path = _write(tmp_path / "c.mil", mil.to_text(prog))
    assert main(["lint", str(path)]) == 0  # a warning for "any": an error on m1, m2 only
    assert main(["lint", str(path), "--chip", "m4"]) == 0
    assert main(["lint", str(path), "--chip", "m1"]) == 1
    assert "op.from-m3 error" in capsys.readouterr().out


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
    for chip in CHIPS:
        assert main(["lint", str(tmp_path / "dump"), "--errors-only", "--chip", chip]) == 0, chip


def test_the_readme_section_is_the_rule_book():
    text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "README lacks the generated rules section"
    section = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert section == markdown(), "README's rule table is stale: paste `anekit lint --rules` into it"


def test_a_python_file_runs_as_a_script_less_its_main_block_and_help_says_so(tmp_path, capsys):
    """Linting a .py file executes it: --help says so; it runs under its own __name__ (its __main__ block
    does not run), with sys.argv and sys.path as `python FILE` gives them, and its prints go to stderr."""
    with pytest.raises(SystemExit):
        main(["lint", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "A Python file is executed to find its programs" in help_text
    assert 'its `if __name__ == "__main__":` block is not run' in help_text
    (tmp_path / "lint_sibling_shapes.py").write_text("SHAPE = [1, 64, 1, 32]\n")
    marker = tmp_path / "main-block-ran"
    script = _write(
        tmp_path / "prog.py",
        "import sys\nfrom pathlib import Path\n\nfrom lint_sibling_shapes import SHAPE\n\n"
        "from anekit import mil\nfrom anekit.mil import tensor\n\n"
        "print('running as', __name__, sys.argv)\n\n"
        "@mil.program(inputs={'x': tensor('fp16', SHAPE)})\n"
        "def relu(f, x):\n    return f.relu(x=x)\n\n"
        f"if __name__ == '__main__':\n    Path({str(marker)!r}).write_text('ran')\n",
    )
    assert main(["lint", str(script), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["programs"][0]["target"] == f"{script}::relu"
    assert captured.err == f"running as __anekit_lint__ {[str(script)]}\n"
    assert not marker.exists()


def test_a_python_file_that_exits_is_one_error_line(tmp_path, capsys):
    script = _write(tmp_path / "bye.py", "import sys\nsys.exit(3)\n")
    assert main(["lint", str(script)]) == 1
    assert capsys.readouterr().err == f"anekit: [lint] {script}: running it failed: it called sys.exit(3)\n"


def test_a_dump_whose_weights_were_deleted_is_an_error_naming_each_missing_file(tmp_path, capsys):
    dump = tmp_path / "dump"
    assert main(["kernels", "dump", "--config", "stories260K", str(dump)]) == 0
    capsys.readouterr()
    assert main(["lint", str(dump), "--errors-only"]) == 0
    removed = sorted(dump.rglob("*.bin"))
    assert removed
    for f in removed:
        f.unlink()
    assert main(["lint", str(dump), "--errors-only"]) == 1
    out = capsys.readouterr().out
    assert out.count("mil.weights error: const") >= len(removed) and "which is not in" in out


@mil.program(inputs={"q": tensor("fp16", [1, 4, 64, 32])})
def _scores(f, q):
    return f.matmul(x=q, y=q, transpose_y=True)


def test_the_macos_option(tmp_path, capsys):
    """matmul on the M1 under macOS 26: an error (maderix pull request #6, macOS 26.3); under macOS 15 the
    rule does not apply (M1 Pro / Max trained on 15); with no version named, a warning naming both."""
    path = _write(tmp_path / "m.mil", mil.to_text(_scores))
    assert main(["lint", str(path), "--chip", "m1", "--macos", "26"]) == 1
    out = capsys.readouterr().out.splitlines()
    finding = next(line for line in out if "op.matmul-sdpa-m1" in line)
    assert (
        " op.matmul-sdpa-m1 error " in finding
        and "(chip m1, route direct, macOS 26: error on m1, m2)" in finding
    )
    assert out[-1].endswith("(chip: m1, route: direct, macOS: 26)")
    assert main(["lint", str(path), "--chip", "m2", "--macos", "26.3"]) == 1
    assert "op.matmul-sdpa-m1 error" in capsys.readouterr().out
    assert main(["lint", str(path), "--chip", "m1", "--macos", "15.3"]) == 0
    assert "op.matmul-sdpa-m1" not in capsys.readouterr().out
    assert main(["lint", str(path), "--chip", "m1"]) == 0
    out = capsys.readouterr().out
    assert "op.matmul-sdpa-m1 warn" in out and out.splitlines()[-1].endswith("(chip: m1, route: direct)")
    assert main(["lint", str(path), "--chip", "m1", "--macos", "26", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["macos"] == "26" and doc["errors"] == 1
    assert [f["macos"] for f in doc["programs"][0]["findings"] if f["rule"] == "op.matmul-sdpa-m1"] == ["26"]
    with pytest.raises(SystemExit) as e:
        main(["lint", str(path), "--macos", "Tahoe"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "anekit lint: error: argument --macos: macOS version 'Tahoe' is not a version number (expected a "
        "major version such as 15 or 26, or a full one such as 15.3 or 26.0.1)"
    )


def test_the_training_route_of_every_chip_lints_clean_under_every_macos():
    """Issue 30's "done when", the lint part: for each of m1 .. m5 and each macOS major the engine layer
    knows (and none named), the kernels of that chip's training route give no error and no warning from a
    rule the evidence contests or contradicts. Skipped until the routes and their kernel sets exist."""
    routes = pytest.importorskip("anekit.engine.training_routes")
    specs_of = pytest.importorskip("anekit.kernels.route_specs").route_specs
    from anekit.kernels.route import kernel_route

    cfg = preset("stories260K")
    for chip in CHIPS:
        for macos in ("", *getattr(routes, "MACOS_MAJORS", ("15", "26"))):
            chosen = routes.training_route(chip, macos)
            for name, spec in specs_of(cfg, kernel_route(chosen.id)).items():
                found = check_program(spec.program, chip, macos=macos)
                contested = [f.short() for f in found if f.is_error or f.rule.conflicted]
                assert not contested, (chip, macos or "any macOS", chosen.id, name, contested)
