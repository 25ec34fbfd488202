"""``anekit doctor --smoke``: the ladder, its report, its failures and its bad inputs.

On a machine without the engine the backend under test is the simulator, and the reference is the
simulator too: a passing ladder there proves that every rung's program is generated, printed (in
either dialect), parsed, verified, compiled, loaded and run end to end, that the comparison, report
and exit status work -- not that the silicon computes the same numbers (that is what the ladder is
for on a Mac). The failure cases inject backends that fail or misbehave in known ways, so the report
is checked against a known cause.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anekit.cli import doctor_cmd
from anekit.errors import CompilationFailed, EvalFailed
from anekit.kernels import preset
from anekit.runtime.sim import SimBackend, SimKernel
from anekit.tools import smoke

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RUNG_KEYS = {
    "name",
    "what",
    "sha256",
    "inputs",
    "constructs",
    "outputs",
    "status",
    "stage",
    "error",
    "max_err",
    "tolerance",
    "ms",
    "stage_ms",
}


def _doctor(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="anekit")
    doctor_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", *argv])
    return args.run(args)


@pytest.fixture
def sim_only(monkeypatch):
    """The doctor sees the simulator as the best backend, whatever this machine has."""
    monkeypatch.setenv("ANEKIT_BACKEND", "sim")


def _use_backend(monkeypatch, backend):
    monkeypatch.setattr(doctor_cmd.runtime, "open", lambda *a, **k: backend)


class FailingCompile(SimBackend):
    """A backend whose compiler refuses one rung's program (found by a name in its text)."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def _compile(self, prog, fn, weights):
        if any(op.name == self.marker for op in fn.ops):
            raise CompilationFailed("[compile] ANECCompile() FAILED (injected)")
        return super()._compile(prog, fn, weights)


class FailingRun(SimBackend):
    """A backend whose every kernel fails at run time."""

    def _compile(self, prog, fn, weights):
        kernel = super()._compile(prog, fn, weights)

        def boom() -> None:
            raise EvalFailed("[run] evaluateWithQoS failed: status 0x1d (injected)")

        kernel._run = boom
        return kernel


class MisboundInputs(SimBackend):
    """A backend that binds several input surfaces in reverse order (a binding-order bug)."""

    def _compile(self, prog, fn, weights):
        kernel = super()._compile(prog, fn, weights)
        assert isinstance(kernel, SimKernel)
        kernel.plan.input_slots = kernel.plan.input_slots[::-1]
        return kernel


# -- the ladder on this machine -------------------------------------------------------------------------


def test_ladder_runs_every_rung_and_passes_in_the_simulator(sim_only, capsys):
    assert _doctor("--smoke") == 0
    out = capsys.readouterr().out
    names = smoke.rung_names()
    for i, name in enumerate(names, 1):
        line = next(x for x in out.splitlines() if x.split()[:2] == [str(i), name])
        assert " PASS " in line and "max_err 0 " in line and line.endswith(" ms")
    assert "  1 elementwise        [1,64,1,32] -> [1,64,1,32]  PASS" in out
    assert "3x[1,64,1,32] -> 2x[1,64,1,32]" in out
    assert f"{len(names)}/{len(names)} rungs pass on sim" in out
    assert "the ladder ran in the simulator" in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="what the ladder says off a Mac")
def test_ladder_off_a_mac_says_there_is_no_engine(monkeypatch, capsys):
    monkeypatch.delenv("ANEKIT_BACKEND", raising=False)
    assert _doctor("--smoke") == 0
    assert "no Neural Engine here: the ladder ran in the simulator" in capsys.readouterr().out


def test_ladder_in_the_ios16_dialect_passes_too(sim_only, capsys, tmp_path):
    out = tmp_path / "r.json"
    assert _doctor("--smoke", "--dialect", "ios16", "--json", str(out)) == 0
    report = json.loads(out.read_text())
    assert report["dialect"] == "ios16" and report["ok"]
    assert "MIL dialect ios16" in capsys.readouterr().out


def test_json_report_has_machine_backend_and_every_rung(sim_only, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert _doctor("--smoke", "--json", str(out)) == 0
    report = json.loads(out.read_text())
    assert {
        "doctor",
        "backend",
        "chip",
        "dialect",
        "config",
        "seed",
        "tolerance",
        "rungs",
        "summary",
        "ok",
    } <= (report.keys())
    assert report["doctor"]["open"]["backend"] == "sim"
    assert report["backend"]["name"] == "sim" and report["config"] == "stories260K"
    assert report["tolerance"] == {"atol": smoke.ATOL, "rtol": smoke.RTOL}
    rungs = report["rungs"]
    assert [r["name"] for r in rungs] == smoke.rung_names()
    for r in rungs:
        assert set(r) == RUNG_KEYS
        assert r["status"] == "pass" and r["error"] is None and r["max_err"] == 0.0
        assert len(r["sha256"]) == 64 and r["ms"] >= 0 and set(r["stage_ms"]) == {"compile", "load", "run"}
    assert rungs[2]["inputs"] == {"zeta": [1, 64, 1, 32], "alpha": [1, 64, 1, 32], "mid": [1, 64, 1, 32]}
    assert list(rungs[2]["outputs"]) == ["y_sum", "b_prod"]
    assert report["summary"] == {"rungs": len(rungs), "passed": len(rungs), "failed": []}
    assert not [p for p in tmp_path.iterdir() if p.name != "report.json"]  # no temporary file left
    assert f"wrote {out}" in capsys.readouterr().out


def test_json_to_stdout_keeps_the_lines_on_stderr(sim_only, capsys):
    assert _doctor("--smoke", "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"] is True
    assert "rungs pass on sim" in captured.err


def test_plain_doctor_json_out_writes_the_machine_report(sim_only, tmp_path, capsys):
    out = tmp_path / "doctor.json"
    assert _doctor("--json", str(out)) == 0
    assert json.loads(out.read_text())["open"]["backend"] == "sim"


# -- failures are reported, and the ladder goes on ------------------------------------------------------


def test_a_compile_failure_is_reported_and_the_ladder_goes_on(sim_only, monkeypatch, tmp_path, capsys):
    _use_backend(monkeypatch, FailingCompile("y"))  # the conv rung's output op is named "y" (and rung 1's)
    out = tmp_path / "r.json"
    assert _doctor("--smoke", "--json", str(out)) == 1
    report = json.loads(out.read_text())
    by_name = {r["name"]: r for r in report["rungs"]}
    for name in ("elementwise", "conv1x1"):
        r = by_name[name]
        assert r["status"] == "fail" and r["stage"] == "compile"
        assert r["error"] == "CompilationFailed: [compile] ANECCompile() FAILED (injected)"
        assert r["max_err"] is None
    assert by_name["multi_io"]["status"] == "pass"
    assert all(by_name[n]["status"] == "pass" for n in smoke.construct_names() + smoke.kernel_names())
    assert report["summary"]["failed"] == ["elementwise", "conv1x1"] and report["ok"] is False
    text = capsys.readouterr().out
    assert "compile: CompilationFailed: [compile] ANECCompile() FAILED (injected)" in text
    assert "failed: elementwise, conv1x1" in text


def test_a_run_failure_is_reported_with_its_stage(sim_only, monkeypatch, capsys):
    _use_backend(monkeypatch, FailingRun())
    assert _doctor("--smoke") == 1
    text = capsys.readouterr().out
    assert "run: EvalFailed: [run] evaluateWithQoS failed: status 0x1d (injected)" in text
    assert f"0/{len(smoke.rung_names())} rungs pass on sim" in text


def test_misbound_inputs_fail_the_multi_input_rung_on_its_numbers():
    """The multi-input rung exists to catch a binding-order bug: the numbers must give it away."""
    rungs = [smoke.multi_io_rung("ios18", np.random.default_rng(0))]
    (result,) = smoke.run_ladder(MisboundInputs(), rungs)
    assert result.status == "fail" and result.stage == "compare"
    assert result.max_err > result.tolerance
    assert "differs from the simulator" in result.error


def test_a_program_the_simulator_refuses_is_a_failed_rung():
    good = smoke.elementwise_rung("ios18", np.random.default_rng(0))
    bad_text = good.text.replace("mul(x = x, y = ", "mul(x = x, zz = ")
    bad = smoke.Rung("refused", bad_text, {}, good.inputs, "a program that does not verify")
    failed_generate = ("broken_generator", "KeyError: 'wq'")
    results = smoke.run_ladder(SimBackend(), [bad, failed_generate, good])
    assert [r.status for r in results] == ["fail", "fail", "pass"]
    assert results[0].stage == "reference"
    assert "the simulator refused it at compile: CompilationFailed" in results[0].error
    assert "unexpected input 'zz'" in results[0].error
    assert results[1].stage == "generate" and results[1].error == "KeyError: 'wq'"


def test_max_error_treats_matching_infinities_as_equal_and_nan_as_failure():
    inf, nan = float("inf"), float("nan")
    assert smoke.max_error(np.array([1.0, inf, -inf]), np.array([1.0, inf, -inf])) == 0.0
    assert smoke.max_error(np.array([1.0, nan]), np.array([1.0, 2.0])) == inf
    assert smoke.max_error(np.array([1.0, 2.5]), np.array([1.0, 2.0])) == 0.5
    assert smoke.max_error(np.zeros(3), np.zeros(4)) == inf


def test_the_ladder_uses_a_preset_given_by_name(sim_only, tmp_path):
    out = tmp_path / "r.json"
    assert _doctor("--smoke", "--config", "stories260K", "--json", str(out)) == 0
    cfg = preset("stories260K")
    sdpa = next(r for r in json.loads(out.read_text())["rungs"] if r["name"] == "sdpa_fwd")
    assert sdpa["inputs"]["x"] == [1, cfg.dim, 1, cfg.seq_len]


# -- bad input: one anekit line, no traceback, nothing written ------------------------------------------


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT / "src"), ANEKIT_BACKEND="sim")
    return subprocess.run(
        [sys.executable, "-m", "anekit.cli.main", "doctor", *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str], starts: str) -> None:
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), proc.stderr
    assert proc.stdout == ""


def test_cli_unknown_config_is_a_usage_error(tmp_path):
    proc = _cli("--smoke", "--config", "stories7B", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == ""
    assert "argument --config: unknown preset 'stories7B'" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_cli_json_in_a_missing_directory_is_one_error_line(tmp_path):
    proc = _cli("--smoke", "--json", "no/such/dir/out.json", cwd=tmp_path)
    _one_error_line(
        proc, "anekit: [doctor] --json no/such/dir/out.json: directory no/such/dir does not exist"
    )
    assert list(tmp_path.iterdir()) == []


def test_cli_json_onto_a_directory_is_one_error_line(tmp_path):
    (tmp_path / "d").mkdir()
    proc = _cli("--smoke", "--json", "d", cwd=tmp_path)
    _one_error_line(proc, "anekit: [doctor] --json d: is a directory")
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write anywhere")
def test_cli_json_in_a_read_only_directory_is_one_error_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        proc = _cli("--smoke", "--json", "ro/out.json", cwd=tmp_path)
        _one_error_line(proc, "anekit: [doctor] --json ro/out.json: not writable")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_cli_smoke_exit_status_and_file(tmp_path):
    proc = _cli("--smoke", "--json", "out.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "out.json").read_text())["ok"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize("dialect", ["ios18", "ios16"])
def test_every_rung_of_the_ladder_lints_without_errors_for_every_chip(dialect):
    """anekit's own programs stay clean: no rung breaks an error rule of the book on any chip."""
    from anekit.kernels import preset
    from anekit.mil import parse, verify
    from anekit.rules import CHIPS, check_program, errors

    for rung in smoke.ladder(preset("stories260K"), dialect):
        assert not isinstance(rung, tuple), rung
        program = verify(parse(rung.text))
        for chip in ("any", *CHIPS):
            broken = errors(check_program(program, chip, rung.weights or None))
            assert not broken, (rung.name, chip, [f.short() for f in broken])


# -- --report FILE: the first-contact report ------------------------------------------------------------


def test_report_in_the_simulator_is_a_valid_first_contact_report(sim_only, tmp_path, capsys):
    from anekit.engine import report as first

    out = tmp_path / "first.json"
    assert _doctor("--smoke", "--report", str(out)) == 0
    doc = json.loads(out.read_text())
    r = first.load_report(out)  # the schema's checks, every field
    assert doc["schema"] == "anekit-doctor-report" and doc["version"] == 1 and doc["backend"] == "sim"
    assert r.backend == "sim" and r.macos == "" and r.evidence() == {}  # the simulator is not hardware
    assert [x.name for x in r.rungs] == smoke.rung_names()
    assert all(x.ran for x in r.rungs)
    exercised = {c for x in r.rungs for c in x.constructs}
    assert set(first.construct_ids()) <= exercised  # every construct the engine layer knows has a rung
    assert [p.id for p in r.probes] == [
        "mac.output-ceiling",
        "input.nan-coercion",
        "mac.subnormal-flush",
        "slice.width-offset-gain",
    ]
    ceiling = r.probes[0]
    assert ceiling.got == ("7c00", "77ff")  # 64 x 512 saturates at the port; 64 x 511.75 = 32752
    assert ceiling.inputs["x"].shape == (1, 64, 1, 32) and len(ceiling.inputs["x"].nonzero) == 128
    assert set(ceiling.inputs["x"].nonzero[:2]) == {(0, 0, "6000"), (0, 1, "5fff")}  # 512, 511.75
    assert [p.name for p in tmp_path.iterdir()] == ["first.json"]  # no temporary file left
    assert (
        f"wrote the first-contact report {out} (from the simulator: no evidence)" in capsys.readouterr().out
    )


def test_report_names_the_failed_stage_and_the_constructs(sim_only, monkeypatch, tmp_path):
    from anekit.engine import report as first

    _use_backend(monkeypatch, FailingCompile("qk"))  # the matmul of the Q K^T rung
    out = tmp_path / "first.json"
    assert _doctor("--smoke", "--report", str(out)) == 1
    by_name = {x.name: x for x in first.load_report(out).rungs}
    qk = by_name["matmul_activations"]
    assert qk.constructs == ("matmul.activations",)
    assert qk.compile == first.Stage("failed", "CompilationFailed: [compile] ANECCompile() FAILED (injected)",
                                     qk.compile.ms)  # fmt: skip
    assert (qk.load, qk.run, qk.compare) == (first.Stage(), first.Stage(), first.Stage())
    assert by_name["conv1x1"].ran and by_name["conv1x1"].constructs == ("conv.baked",)


def test_report_is_written_atomically(sim_only, tmp_path, monkeypatch):
    from anekit import fileio

    out = tmp_path / "first.json"
    out.write_text("the previous report\n")

    def crash(point, path):
        if point == "fsync" and path.name == "first.json":
            raise fileio.SimulatedCrash(point)

    monkeypatch.setattr(fileio, "fault_hook", crash)
    with pytest.raises(fileio.SimulatedCrash):
        _doctor("--smoke", "--report", str(out))
    assert out.read_text() == "the previous report\n"  # never half-written


def _refused(tmp_path, *argv: str, starts: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = _cli("--smoke", *argv, cwd=tmp_path)
    _one_error_line(proc, starts)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_report_over_a_symlink_is_refused(tmp_path):
    (tmp_path / "target.json").write_text("kept\n")
    (tmp_path / "link.json").symlink_to("target.json")
    _refused(
        tmp_path, "--report", "link.json", starts="anekit: [doctor] --report link.json: is a symbolic link"
    )
    assert (tmp_path / "target.json").read_text() == "kept\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_cli_report_onto_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    _refused(
        tmp_path,
        "--report",
        "fifo",
        starts="anekit: [doctor] --report fifo: a FIFO (named pipe), not a regular",
    )


def test_cli_report_over_the_json_output_is_refused(tmp_path):
    _refused(tmp_path, "--json", "r.json", "--report", "./r.json",
             starts="anekit: [doctor] --report ./r.json: is the --json output too")  # fmt: skip


def test_cli_report_over_an_input_is_refused(tmp_path, monkeypatch):
    """The doctor reads the trials memory (its input): the report never goes over it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "trials.json").write_text('{"version": 1, "entries": []}\n')
    monkeypatch.setenv("ANEKIT_CACHE", str(cache))
    _refused(
        tmp_path,
        "--report",
        "cache/trials.json",
        starts="anekit: [doctor] --report cache/trials.json: is the input",
    )
    assert (cache / "trials.json").read_text() == '{"version": 1, "entries": []}\n'


def test_cli_report_needs_smoke(tmp_path):
    proc = _cli("--report", "r.json", cwd=tmp_path)
    _one_error_line(proc, "anekit: [doctor] --report needs --smoke")
    assert list(tmp_path.iterdir()) == []


def test_cli_report_with_json_writes_both(tmp_path):
    from anekit.engine import report as first

    proc = _cli("--smoke", "--json", "ladder.json", "--report", "first.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "ladder.json").read_text())["ok"] is True
    assert first.load_report(tmp_path / "first.json").backend == "sim"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.json", "ladder.json"]


# -- the construct rungs ------------------------------------------------------------------------------------


def test_every_construct_of_the_vocabulary_has_a_small_rung_of_its_own():
    from anekit.engine.constructs import CONSTRUCTS
    from anekit.tools import smoke_constructs

    vocabulary = set(CONSTRUCTS)  # the version-1 ids and every one the engine layer added since

    rng = np.random.default_rng(0)
    built = [b(rng) for b in smoke_constructs.RUNGS]
    assert [c.name for c in built] == smoke.construct_names()
    alone = {c.constructs[0] for c in built if len(c.constructs) == 1}
    assert alone | {"rmsnorm.scale-repeated", "rmsnorm.fused-before-matmuls"} == vocabulary - {"conv.baked"}
    assert {c for b in built for c in b.constructs} | {"conv.baked"} == vocabulary
    for c in built:  # small: no surface over [1, 192, 1, 320] (act + Wq, Wk, Wv + the scale: 5 x 64)
        shapes = [v.type.shape for v in c.program.main.inputs] + [
            v.type.shape for v in c.program.main.outputs
        ]
        assert all(s[1] <= 192 and s[3] <= 320 for s in shapes), (c.name, shapes)
        assert smoke_constructs.constructs_in(c.program) == tuple(sorted(c.constructs)), c.name


@pytest.mark.parametrize(
    "kernel, has, lacks",
    [
        # the baked FFN is 1x1 convs and the gate: no matmul (forward.ffn_fwd)
        ("ffn_fwd", {"conv.baked", "gate.silu", "rmsnorm.peak-normalised"}, {"matmul.activations", "matmul.dynamic-weights"}),
        # baked attention: convs for the projections, Q K^T and probs @ V as matmuls, RoPE as the swap conv
        ("sdpa_fwd", {"conv.baked", "matmul.activations", "softmax.scores", "rope.swap-conv"},
         {"matmul.dynamic-weights", "rmsnorm.scale-repeated", "rmsnorm.fused-before-matmuls"}),
        # the dynamic SDPA: the RMSNorm with the repeated scale ahead of Q, K, V as dynamic matmuls
        ("sdpa_fwd_dynamic", {"matmul.dynamic-weights", "matmul.activations", "rmsnorm.scale-repeated",
                              "rmsnorm.fused-before-matmuls"}, {"conv.baked"}),
        ("ffn_bwd_w2t_dynamic", {"matmul.dynamic-weights"}, {"matmul.activations", "conv.baked"}),
        # the vocabulary softmax is over channels, not the key axis
        ("softmax_vocab", set(), {"softmax.scores"}),
    ],
)  # fmt: skip
def test_the_constructs_found_in_the_kernels(kernel, has, lacks):
    from anekit.kernels import catalog
    from anekit.tools import smoke_constructs

    cfg = preset("stories260K")
    found = set(
        smoke_constructs.constructs_in(catalog.build(kernel, cfg, catalog.random_weights(cfg, 0)).program)
    )
    assert has <= found and not (lacks & found), (kernel, found)


def test_the_readme_says_how_to_run_it_and_send_the_file():
    """The README's "First contact" section: the exact command, and where the file goes."""
    from anekit.cli.main import build_parser

    readme = (PROJECT_ROOT / "README.md").read_text()
    section = readme.split("## First contact", 1)[1].split("\n## ", 1)[0]
    command = "anekit doctor --smoke --report first-contact.json"
    assert f"```sh\n{command}\n```" in section
    args = build_parser().parse_args(command.split()[1:])
    assert (args.command, args.smoke, args.report) == ("doctor", True, "first-contact.json")
    assert "open an issue on the\nproject's tracker and attach the file" in section
    assert "http" not in section  # no address is invented


# -- the generation rungs -----------------------------------------------------------------------------------


def test_the_generation_rungs_are_a_prefill_and_a_decode_kernel_with_the_host_s_inputs():
    """After the construct rungs, before the kernels: the prefill and the decode layers kernel, their inputs
    as the host writes them for a chunk past position 0 (a cache whose slots before the position hold keys
    and values, a mask that hides every other slot), declared x then cache."""
    from anekit.tools import smoke_constructs

    names = smoke.rung_names()
    assert smoke.generation_names() == ["gen_prefill", "gen_decode"]
    at = names.index("gen_prefill")
    assert names[at - 1] == smoke.construct_names()[-1] and names[at + 2] == smoke.kernel_names()[0]
    rng = np.random.default_rng(0)
    for build, width, real in ((smoke_constructs.gen_prefill, 64, 40), (smoke_constructs.gen_decode, 32, 1)):
        c = build(rng)
        pos = smoke_constructs.GEN_POSITION[c.name.removeprefix("gen_")]
        assert [v.name for v in c.program.main.inputs] == ["x", "cache"]
        assert c.inputs is not None and set(c.inputs) == {"x", "cache"}
        x, cache = c.inputs["x"][0, :, 0, :], c.inputs["cache"][0, :, 0, :]
        assert x.shape[1] == width and (cache.shape[1] + width) & (cache.shape[1] + width - 1) == 0
        assert np.all(cache[:, pos:] == 0) and np.all(np.abs(cache[:, :pos]).max(axis=0) > 0)
        dim, hd = 64, 32  # the rungs' model: two heads of 32 channels
        assert np.all(x[:dim, real:] == 0) and np.all(np.abs(x[:dim, :real]).max(axis=0) > 0)
        mask = x[dim + 2 * hd :]  # (capacity, W): after x, cos and sin
        assert mask.shape[0] == cache.shape[1]
        assert np.all(mask[:pos] == 0) and np.all(mask[pos:] < -1e4)
        # channels 0 and 1 of cos and sin: the first pair's angle, position * frequency 1, at each column
        positions = np.arange(pos, pos + width)
        np.testing.assert_allclose(x[dim : dim + 2], np.cos([positions, positions]), atol=1e-6)
        np.testing.assert_allclose(x[dim + hd : dim + hd + 2], np.sin([positions, positions]), atol=1e-6)
        assert {"softmax.scores", "matmul.activations", "rope.slice-concat"} <= set(c.constructs)


@pytest.mark.parametrize("name", ["gen_prefill", "gen_decode"])
def test_a_generation_rung_fails_on_a_backend_that_misreads_its_cache(name):
    """The cache matters to the rung's numbers: a backend that binds the two inputs the wrong way round, or
    reads a cache of zeros, fails the rung (the kernel's outputs move past the ladder's tolerance)."""
    from anekit.tools import smoke_constructs

    build = getattr(smoke_constructs, name)
    rung = smoke.construct_rung(build, None, np.random.default_rng(0))
    assert smoke.run_rung(rung, SimBackend(), SimBackend(precision="ane")).status == "pass"
    swapped = smoke.run_rung(rung, MisboundInputs(), SimBackend(precision="ane"))
    assert swapped.status == "fail" and swapped.stage in ("run", "compare"), swapped
    want, _, _ = smoke._execute(SimBackend(precision="ane"), rung)
    zero = dataclasses.replace(rung, inputs=dict(rung.inputs, cache=np.zeros_like(rung.inputs["cache"])))
    lost, _, _ = smoke._execute(SimBackend(precision="ane"), zero)  # what a backend that lost the cache gives
    assert want is not None and lost is not None
    assert smoke.max_error(lost["out"], want["out"]) > 3 * smoke.tolerance(want)
