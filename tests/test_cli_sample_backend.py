"""``anekit sample --backend cpu|sim|ane|coreml``: the simulator's generation kernels give the CPU's greedy
text (stories260K), the flags reach the engine decoder, and every backend this machine or model cannot run
is one line (exit status 1) before the model is read; a prompt longer than the context is refused before
any kernel is compiled; Ctrl-C prints what was generated, the held-back text included, and exits 130."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anekit.cli import sample_cmd
from anekit.cli.main import main
from anekit.generate import backends
from anekit.kernels.config import ModelConfig
from anekit.llama.llama2c import Tokenizer, read_tokenizer_bin, write_llama2c, write_tokenizer_bin
from anekit.llama.params import Params
from anekit.llama.sample import CpuDecoder
from anekit.tools import sample as sample_tool
from tests.conftest import corpus_path

ON_MAC = platform.system() == "Darwin"
TINY = ModelConfig(16, 32, 1, 2, 2, 13, 32, name="tiny")


@pytest.fixture(scope="module")
def stories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """stories260K and a 512-piece tokenizer (llama2's first pieces: its vocabulary size)."""
    full = read_tokenizer_bin(corpus_path("llama2c", "tokenizer.bin"))
    tok = tmp_path_factory.mktemp("tok") / "tok512.bin"
    write_tokenizer_bin(tok, Tokenizer(full.vocab[:512], full.scores[:512]))
    return corpus_path("llama2c", "stories260K.bin"), tok


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n", *(bytes([c]) for c in b" abcdefghi")]
    write_llama2c(tmp_path / "model.bin", Params.init(TINY, seed=0))
    write_tokenizer_bin(tmp_path / "tokenizer.bin", Tokenizer(pieces, [0.0] * len(pieces)))
    return tmp_path / "model.bin"


def sample(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["sample", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(capsys: pytest.CaptureFixture[str], says: str, *argv: str) -> None:
    rc, out, err = sample(capsys, *argv)
    assert rc == 1 and out == "", err
    assert err.count("\n") == 1 and err.startswith("anekit: [sample] ") and says in err, err


@pytest.mark.parametrize(
    "chip", [None, "m1", "m5"]
)  # the legacy, conv-host-attention, baked-engine-attention routes
def test_sim_gives_the_cpus_greedy_text(stories: tuple[Path, Path], capsys, chip: str | None):
    """From BOS the CPU's top-2 logit gap stays above the simulator's fp16 error (at most 0.09 on m1) for
    34 positions; at position 35 it is 0.034 and the two may part (m1 and m2 both do): 30 steps."""
    model, tok = stories
    common = [str(model), "--tokenizer", str(tok), "--temperature", "0", "--steps", "30"]
    rc, cpu, cpu_err = sample(capsys, *common, "--backend", "cpu")
    assert rc == 0 and " s on cpu: " in cpu_err, cpu_err
    rc, sim, sim_err = sample(capsys, *common, "--backend", "sim", *(["--chip", chip] if chip else []))
    assert rc == 0 and f" s on sim, chip {chip or 'any'}, route " in sim_err, sim_err
    assert sim == cpu and len(cpu) > 20
    assert "30 tokens generated, 30 positions" in sim_err  # BOS, then 30 sampled (the last never run)


def test_the_engine_flags_reach_the_engine_decoder(tiny: Path, capsys, monkeypatch):
    calls: list[tuple[Any, ...]] = []

    def engine_decoder(params: Params, backend: str, chip: str, macos: str, numerics: str | None) -> Any:
        calls.append((params.cfg, backend, chip, macos, numerics))
        return CpuDecoder(params)

    monkeypatch.setattr(sample_tool, "engine_decoder", engine_decoder)
    argv = [str(tiny), "--backend", "sim", "--chip", "m2", "--macos", "15.3", "--numerics", "ieee"]
    rc, _, err = sample(capsys, *argv, "--temperature", "0", "--steps", "8")
    assert rc == 0, err
    assert calls == [(TINY, "sim", "m2", "15.3", "ieee")]
    assert " s on sim, chip m2: " in err


@pytest.mark.skipif(ON_MAC, reason="off-Mac behaviour")
def test_backend_ane_off_a_mac(tiny: Path, capsys):
    one_line(capsys, "--backend ane needs a Mac with the Neural Engine", str(tiny), "--backend", "ane")


def test_backend_ane_on_a_mac_without_the_engine(tiny: Path, capsys, monkeypatch):
    monkeypatch.setattr(backends, "platform_supported", lambda: True)
    monkeypatch.setattr(backends, "unavailable_reason", lambda: "ane: class _ANEClient not found (15.1)")
    one_line(
        capsys,
        "the Neural Engine is not available on this Mac (ane: class _ANEClient",
        str(tiny),
        "--backend",
        "ane",
    )
    assert backends.default_backend() == "cpu"


def test_chip_and_numerics_are_the_macs_own_on_the_engine(tiny: Path, capsys, monkeypatch):
    monkeypatch.setattr(backends, "platform_supported", lambda: True)
    monkeypatch.setattr(backends, "unavailable_reason", lambda: None)
    for flag in (["--chip", "m3"], ["--numerics", "ieee"]):
        one_line(
            capsys,
            "on the Neural Engine (--backend ane) they are this Mac's own",
            str(tiny),
            "--backend",
            "ane",
            *flag,
        )


def test_the_default_is_ane_on_a_mac_with_the_engine_else_cpu(tiny: Path, capsys, monkeypatch):
    rc, _, err = sample(capsys, str(tiny), "--steps", "4")
    assert rc == 0 and (" s on cpu: " in err or ON_MAC), err
    monkeypatch.setattr(backends, "unavailable_reason", lambda: None)
    assert backends.default_backend() == "ane" and backends.default_backend(package=True) == "sim"
    monkeypatch.setattr(backends, "unavailable_reason", lambda: "ane needs macOS on Apple silicon")
    assert backends.default_backend() == "cpu"


def test_backend_coreml_needs_a_package_and_macos(tiny: Path, tmp_path: Path, capsys):
    one_line(
        capsys,
        "--backend coreml runs an `anekit export` package (.mlpackage); MODEL is not one",
        str(tiny),
        "--backend",
        "coreml",
    )
    if ON_MAC:
        return
    package = tmp_path / "m.mlpackage"
    package.mkdir()  # refused on the name alone: nothing of it is read
    one_line(
        capsys, "--backend coreml needs CoreML, which only macOS has", str(package), "--backend", "coreml"
    )
    one_line(
        capsys,
        "MODEL is an exported package, which runs with --backend sim",
        str(package),
        "--backend",
        "cpu",
    )


def test_engine_flags_apply_to_the_engine_backends_only(tiny: Path, capsys):
    one_line(
        capsys,
        "apply to --backend sim / ane on a model, not to --backend cpu",
        str(tiny),
        "--backend",
        "cpu",
        "--chip",
        "m1",
    )


@pytest.mark.parametrize("backend", ["cpu", "sim"])
def test_a_prompt_longer_than_the_context_is_refused_before_a_kernel(
    tiny: Path, capsys, monkeypatch, backend: str
):
    def engine_decoder(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a kernel was compiled for a prompt that cannot fit")

    monkeypatch.setattr(sample_tool, "engine_decoder", engine_decoder)
    prompt = "a" * (TINY.seq_len + 5)  # one token per letter here (no merges): 38 with BOS and " "
    one_line(
        capsys,
        "longer than the model's context of 32 (seq_len)",
        str(tiny),
        "--backend",
        backend,
        "--prompt",
        prompt,
    )


class Letters:
    """Ids 5 and 9 only matter: 5 is "a", 9 half a UTF-8 sequence (what a byte token decodes to alone)."""

    bos_id = 1
    vocab_size = TINY.vocab_size

    def encode(self, text: str, bos: bool, eos: bool) -> list[int]:
        return [1] * bos

    def decode(self, ids: list[int]) -> str:
        return "".join({5: "a", 9: "\ufffd"}.get(i, "") for i in ids)


def test_ctrl_c_prints_what_was_generated_and_exits_130(tiny: Path, capsys, monkeypatch):
    calls = []

    def forward(self: CpuDecoder, tokens: Any, pos: int) -> np.ndarray:
        calls.append(pos)
        if len(calls) == 3:
            raise KeyboardInterrupt
        logits = np.zeros(TINY.vocab_size, np.float32)
        logits[5 if len(calls) == 1 else 9] = 1.0
        return logits

    monkeypatch.setattr(CpuDecoder, "forward", forward)
    monkeypatch.setattr(sample_cmd, "load_tokenizer", lambda args, cfg, run=None: Letters())
    rc, out, err = sample(capsys, str(tiny), "--temperature", "0")
    assert rc == 130 and calls == [0, 1, 2]
    assert out == "a\ufffd\n"  # the piece the stream held back (an unfinished sequence) is printed too
    assert err == "anekit: interrupted\n"


def test_sigint_during_generation_prints_the_text_so_far_and_exits_130(stories: tuple[Path, Path]):
    """A real SIGINT to a real process, sent once text has been printed (the simulator's kernels are slow
    enough to be caught in the middle of 512 positions)."""
    import os
    import signal
    import subprocess
    import sys

    model, tok = stories
    env = {**os.environ, "PYTHONPATH": str(Path(sample_cmd.__file__).parents[2])}
    argv = [sys.executable, "-m", "anekit.cli.main", "sample", str(model), "--tokenizer", str(tok)]
    argv += ["--backend", "sim", "--chip", "m1", "--temperature", "0", "--steps", "512"]
    # SIGINT's default action in the child, as in a terminal: a suite started in the background of a
    # non-interactive shell inherits SIGINT ignored, and Python then installs no KeyboardInterrupt for it.
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.read(8)  # blocks until generation has printed something
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.decode() == "anekit: interrupted\n"
    text = (first + rest).decode()
    assert len(text) >= 8 and text.endswith("\n") and "tokens generated" not in text


@pytest.mark.parametrize("chip", [None, "m1"])
def test_sim_gives_the_cpus_greedy_text_for_a_hugging_face_llama(tmp_path: Path, capsys, chip: str | None):
    from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

    info = make_tokenizer(tmp_path, 512, "llama3")
    config = small("llama3", vocab_size=512, bos_token_id=info.bos_id, eos_token_id=info.eos_id)
    make_checkpoint(tmp_path, config, dtype="float32", seed=11, std=0.08)
    common = [str(tmp_path), "--prompt", "the little cat", "--temperature", "0", "--steps", "24"]
    rc, cpu, err = sample(capsys, *common, "--backend", "cpu")
    assert rc == 0 and "17 tokens generated" in err, err
    rc, sim, err = sample(capsys, *common, "--backend", "sim", *(["--chip", chip] if chip else []))
    assert rc == 0 and f" s on sim, chip {chip or 'any'}, route " in err, err
    assert sim == cpu and cpu.startswith("the little cat")
