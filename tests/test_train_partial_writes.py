"""What a run leaves when a write fails (a full disk, a file-size limit): one line naming the file whose
write failed and why (never "standard output"); nothing at all when it fails before its first complete
checkpoint; loss.csv and loss.png never ahead of the checkpoint. And a finished run resumed only samples:
it writes nothing.

The file-size limit is the kernel's (RLIMIT_FSIZE in the child, SIGXFSZ ignored so that write gets EFBIG);
the full disk of the Hugging Face run is ``fileio.fault_hook`` raising ENOSPC on its state file's writes."""

from __future__ import annotations

import csv
import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from anekit import fileio
from anekit.cli.main import main
from anekit.llama import checkpoint
from anekit.training import run
from tests.conftest import PROJECT_ROOT

QUICK = ["--accum", "1", "--sample-steps", "0"]
EFBIG_REASON = "file too large for the file system or the process's file size limit"  # outputs.REASONS


def _limited(size: int):
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def _train(args: list[str], cache: Path, limit: int | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANEKIT_CACHE=str(cache), PYTHONPATH=str(PROJECT_ROOT / "src"),
               PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    return subprocess.run([sys.executable, "-m", "anekit.cli.main", "train", *args], env=env,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=None if limit is None else _limited(limit))  # fmt: skip


def _csv_losses(out: Path) -> list[float]:
    with (out / "loss.csv").open() as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def test_a_file_size_limit_on_the_step_0_checkpoint_is_one_line_naming_it_and_leaves_nothing(
    tmp_path: Path, cache: Path
) -> None:
    assert main(["train", "--out", str(tmp_path / "warm"), "--steps", "1", *QUICK]) == 0  # the cache
    out = tmp_path / "run"
    done = _train(["--out", str(out), "--steps", "2", *QUICK], cache, limit=64 << 10)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"anekit: [blzt] cannot write checkpoint {out / 'ckpt.bin'}: {EFBIG_REASON}"
    ]
    assert not out.exists()  # no lock, no tokenizer copy, no temporary, no directory


def test_a_failed_final_checkpoint_leaves_loss_csv_at_the_checkpoints_steps(
    tmp_path: Path, cache: Path
) -> None:
    out = tmp_path / "run"
    stopped = run.Run(run.TrainOptions(out=out, steps=6, accum=1, checkpoint_every=1000))
    calls = {"n": 0}

    def stop_after_two() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    try:
        assert stopped.train(should_stop=stop_after_two).step == 2
    finally:
        stopped.close()
    saved = checkpoint.load_checkpoint_file(out / "ckpt.bin")
    assert saved.meta.step == 2 and len(_csv_losses(out)) == 2
    size = (out / "ckpt.bin").stat().st_size  # the step-6 record holds 4 more losses: it cannot fit
    done = _train(["--out", str(out), "--resume", "--sample-steps", "0"], cache, limit=size + 8)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"anekit: [blzt] cannot write checkpoint {out / 'ckpt.bin'}: {EFBIG_REASON}"
    ]
    assert done.stdout.splitlines()[0].endswith(f"steps 2/6 (continuing the run in {out})")
    after = checkpoint.load_checkpoint_file(out / "ckpt.bin")
    assert after.meta.step == 2
    assert _csv_losses(out) == pytest.approx(after.run["state"]["losses"], abs=1e-6)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary, no lock


def test_a_finished_run_resumed_only_samples_and_writes_nothing(tmp_path: Path, cache: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "2", *QUICK]) == 0
    capsys.readouterr()
    names = sorted(p.name for p in out.iterdir())
    before = {n: ((out / n).read_bytes(), (out / n).stat().st_mtime_ns) for n in names}
    assert main(["train", "--out", str(out), "--resume", "--sample-steps", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"anekit train: the run in {out} is finished (2/2 steps); sampling it (--force starts over)"
    )
    assert lines[1] == "sample:" and len(lines) >= 3
    assert sorted(p.name for p in out.iterdir()) == names
    assert {n: ((out / n).read_bytes(), (out / n).stat().st_mtime_ns) for n in names} == before


# -- the Hugging Face run ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    pytest.importorskip("tokenizers")
    from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

    model = tmp_path_factory.mktemp("hf_partial") / "llama"
    info = make_tokenizer(model, 512, "llama3")
    config = small("llama3", hidden_size=32, intermediate_size=64, num_attention_heads=2,
                   num_key_value_heads=2, num_hidden_layers=1, vocab_size=512,
                   bos_token_id=info.bos_id, eos_token_id=info.eos_id)  # fmt: skip
    make_checkpoint(model, config, dtype="float32", seed=3, std=0.05)
    return model


def _full_disk_on(name: str):
    def hook(point: str, path: Path) -> None:
        if point == "write" and path.name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return hook


@pytest.mark.parametrize("existing", [False, True])
def test_a_full_disk_on_the_hf_run_state_names_it_and_leaves_nothing(
    hf_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    existing: bool,
) -> None:  # fmt: skip
    out = tmp_path / "run"
    if existing:
        out.mkdir()
    monkeypatch.setattr(fileio, "fault_hook", _full_disk_on("state.safetensors"))
    args = ["train", "--init", str(hf_model), "--lora", "2", "--out", str(out), "--steps", "2", "--seq", "32",
            "--val-every", "0", *QUICK]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"anekit: [train] {out / 'state.safetensors'}: cannot write: no space left on the device"]
    if existing:
        assert list(out.iterdir()) == []  # no lock, no tokenizer files, no adapters/, no state file
    else:
        assert not out.exists()


# -- the paths a run record names -------------------------------------------------------------------------


def _renamed_record(ckpt: Path, **paths: str) -> None:
    """Rewrite ``ckpt`` with its run record's ``<field>.path`` set to the given paths."""
    ck = checkpoint.load_checkpoint_file(ckpt)
    record = dict(ck.run)
    for key, path in paths.items():
        record[key] = {**record[key], "path": path}
    checkpoint.save_checkpoint(ckpt, ck.params, ck.adam_m, ck.adam_v, ck.meta, run=record)


def _memory_limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_run_record_naming_a_device_or_fifo_as_its_data_is_refused_naming_the_field(
    tmp_path: Path, cache: Path, kind: str
) -> None:
    from anekit.llama.corpus import generate_corpus

    text = tmp_path / "stories.txt"
    text.write_text(generate_corpus())
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "3", "--data", str(text), *QUICK]) == 0
    stopped_at = checkpoint.load_checkpoint_file(out / "ckpt.bin")
    assert stopped_at.run["data"]["path"] == str(text.resolve())
    if kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
        says = "FIFO"
    else:
        target, says = Path("/dev/zero"), "character device"
    _renamed_record(out / "ckpt.bin", data=str(target))
    env = dict(os.environ, ANEKIT_CACHE=str(cache), PYTHONPATH=str(PROJECT_ROOT / "src"))
    done = subprocess.run([sys.executable, "-m", "anekit.cli.main", "train", "--out", str(out), "--resume",
                           "--sample-steps", "0"], env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=_memory_limited)  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"anekit: [train] the run record of {out / 'ckpt.bin'}: data.path {target}: "
    ), done.stderr
    assert says in lines[0].lower() or says in lines[0]


def test_a_run_records_model_directory_must_be_a_directory(tmp_path: Path) -> None:
    from anekit.errors import AnekitError

    with pytest.raises(AnekitError) as e:
        run.check_record_path(tmp_path / "state.safetensors", "base.path", "/dev/zero")
    assert str(e.value).startswith(f"[train] the run record of {tmp_path / 'state.safetensors'}: base.path ")
    (tmp_path / "m").mkdir()
    assert run.check_record_path(tmp_path / "x", "base.path", str(tmp_path / "m")) == tmp_path / "m"


def test_a_finished_run_whose_curves_a_kill_left_behind_gets_them_on_resume(tmp_path: Path, cache: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Killed between the last checkpoint's rename and the curves' commit: the resume writes the curves the
    checkpoint's losses give (the same bytes an unkilled run wrote), and nothing else."""
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "3", *QUICK]) == 0
    want = (out / "loss.csv").read_bytes()
    ckpt = (out / "ckpt.bin").stat().st_mtime_ns
    (out / "loss.csv").write_bytes(b"step,loss\n1,9.0\n")  # the previous segment's curve
    assert main(["train", "--out", str(out), "--resume", "--sample-steps", "0"]) == 0
    assert (out / "loss.csv").read_bytes() == want
    assert (out / "ckpt.bin").stat().st_mtime_ns == ckpt


def test_a_forced_hf_run_failing_at_its_start_keeps_the_run_it_found(
    hf_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--force over a run, the new state file failing: the old run's state file, tokenizer files and
    adapters (which this run did not create) stay as they were."""
    out = tmp_path / "run"
    args = ["train", "--init", str(hf_model), "--lora", "2", "--out", str(out), "--steps", "1", "--seq", "32",
            "--val-every", "0", *QUICK]  # fmt: skip
    assert main(args) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    monkeypatch.setattr(fileio, "fault_hook", _full_disk_on("state.safetensors"))
    assert main([*args, "--force"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {str(p) for p in after} == {str(p) for p in before}
    assert after[Path("state.safetensors")] == before[Path("state.safetensors")]
    assert after[Path("tokenizer.json")] == before[Path("tokenizer.json")]
