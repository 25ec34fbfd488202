"""``anekit train --distributed`` with real ranks (mpiexec, mlx.launch on loopback): N ranks x ``--accum k``
write the checkpoint one process writes with ``--accum N*k`` (every tensor, every loss, bit for bit), for a
llama2.c preset and a LoRA run of a Hugging Face model; a run resumed on another world size continues
exactly; a compile budget ends every rank with 75 and the resume finishes the run exactly; and the
refusals, each one line before anything is written.

Every process here runs BLAS on one thread (``BLAS``): a float32 matmul's bits depend on its thread count,
and the comparison is of one sequence's arithmetic on a rank against the same sequence's in one process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anekit.llama import corpus, tokenizer
from anekit.llama.checkpoint import load_checkpoint_file
from tests.conftest import corpus_path
from tests.distributed_ranks import MAX_TIMEOUT, need_engine, run_ranks

PROJECT_ROOT = Path(__file__).resolve().parents[1]
BLAS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
QUIET = ["--sample-steps", "0", "--backend", "sim"]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, **BLAS, "ANEKIT_CACHE": str(cache), **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT / "src"), env.get("PYTHONPATH", "")]).strip(
        os.pathsep
    )
    return env


def _rank_env(cache: Path) -> dict[str, str]:
    """What the ranks get besides the launcher's environment (``distributed_ranks.rank_env``)."""
    return {**BLAS, "ANEKIT_CACHE": str(cache)}


def _one(
    args: list[str], cache: Path, timeout: float = MAX_TIMEOUT, **env: str
) -> subprocess.CompletedProcess:
    """``anekit ARGS`` in one process, with the ranks' environment."""
    return subprocess.run([sys.executable, "-m", "anekit.cli.main", *args], env=_env(cache, **env),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _ranks(n: int, args: list[str], cache: Path, engine: str = "mpi", timeout: float = MAX_TIMEOUT) -> Any:
    need_engine(engine)
    return run_ranks(
        n, ["-m", "anekit.cli.main", *args], engine=engine, timeout=timeout, env=_rank_env(cache)
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A small story file, the default 512-token tokenizer (trained once into a private cache), the cache."""
    d = tmp_path_factory.mktemp("inputs")
    cache = d / "cache"
    tokenizer.default_tokenizer(vocab_size=512, cache_dir=cache / "tokenizers")
    (d / "stories.txt").write_text(corpus.generate_corpus(40, 1))
    return d / "stories.txt", tokenizer.default_tokenizer_path(512, cache / "tokenizers"), cache


def _default(out: Path, inputs: tuple[Path, Path, Path], *extra: str) -> list[str]:
    data, tok, _ = inputs
    return ["train", "--out", str(out), "--data", str(data), "--tokenizer", str(tok), "--seed", "1", *QUIET,
            *extra]  # fmt: skip


def _blzt(out: Path) -> dict[str, Any]:
    ck = load_checkpoint_file(out / "ckpt.bin")
    assert ck.run is not None and ck.adam_m is not None and ck.adam_v is not None
    tensors = {f"{kind}.{name}": a for kind, container in (("p", ck.params), ("m", ck.adam_m), ("v", ck.adam_v))
               for name, a in container.tensors()}  # fmt: skip
    return {"tensors": tensors, "state": {k: ck.run["state"][k] for k in ("step", "adam_t", "loss_scale", "losses")},
            "run": ck.run}  # fmt: skip


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["state"] == b["state"]
    assert list(a["tensors"]) == list(b["tensors"])
    for name, x in a["tensors"].items():
        y = b["tensors"][name]
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def _ok(done: Any) -> Any:
    assert done.returncode == 0, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return done


# --------------------------------------------------------------------------------------------------------
# N ranks x accum k == 1 process x accum N*k
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["mpi", "mlx"])
def test_two_ranks_of_stories15m_write_the_checkpoint_of_one_process_with_the_whole_batch(engine, tmp_path):
    need_engine(engine)
    tok = corpus_path("llama2c", "tokenizer.bin")
    data = tmp_path / "stories.txt"
    data.write_text(corpus.generate_corpus(12, 3))
    cache = tmp_path / "cache"
    common = ["--config", "stories15M", "--tokenizer", str(tok), "--data", str(data), "--steps", "2", "--seed",
              "3", *QUIET]  # fmt: skip
    _ok(_one(["train", "--out", str(tmp_path / "one"), "--accum", "4", *common], cache))
    done = _ok(_ranks(2, ["train", "--out", str(tmp_path / "two"), "--accum", "2", "--distributed", engine,
                          *common], cache, engine))  # fmt: skip
    one, two = _blzt(tmp_path / "one"), _blzt(tmp_path / "two")
    _assert_same(one, two)
    assert two["run"]["train"]["accum"] == 4  # the global batch is what the checkpoint keeps
    assert (two["run"]["world"], two["run"]["micro_order"], two["run"]["worlds"]) == (2, "global index blocks",
                                                                                      [[0, 2]])  # fmt: skip
    assert (one["run"]["world"], one["run"]["worlds"]) == (1, [[0, 1]])
    assert done.stdout.count("anekit train:") == 1  # rank 0 alone prints
    assert "4 sequences per step (2 on each of 2 ranks" in done.stdout
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir()
    )


def test_three_ranks_of_one_sequence_are_one_process_of_three(tmp_path, inputs):
    cache = inputs[2]
    _ok(_one(_default(tmp_path / "one", inputs, "--steps", "3", "--accum", "3"), cache))
    args = _default(tmp_path / "three", inputs, "--steps", "3", "--accum", "1", "--distributed", "mpi")
    done = _ok(_ranks(3, args, cache))
    _assert_same(_blzt(tmp_path / "one"), _blzt(tmp_path / "three"))
    assert done.stdout.count("anekit train:") == 1 and done.stdout.count("trained 3 steps") == 1
    assert done.stderr.strip() == ""  # the other ranks print nothing


# --------------------------------------------------------------------------------------------------------
# a Hugging Face model's LoRA run
# --------------------------------------------------------------------------------------------------------


def _hf_state(out: Path) -> dict[str, Any]:
    import json

    from anekit.hf.safetensors_io import read_header
    from anekit.hf.training import RUN_KEY

    refs, metadata = read_header(out / "state.safetensors")
    record = json.loads(metadata[RUN_KEY])
    state = {k: record["state"][k] for k in ("step", "adam_t", "loss_scale", "losses", "val_losses")}
    return {"tensors": {name: ref.to_float32() for name, ref in sorted(refs.items())}, "state": state,
            "run": record}  # fmt: skip


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_two_ranks_of_a_hugging_face_fine_tuning_are_one_process_with_the_whole_batch(mode, tmp_path):
    """LoRA (the adapters and their moments, PEFT's adapter file) and full fine-tuning (every weight, the
    model directory written at the end)."""
    pytest.importorskip("tokenizers")
    import json

    from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

    model = tmp_path / "qwen"
    info = make_tokenizer(model, 512, "qwen")
    config = small("qwen3", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32, num_hidden_layers=2, vocab_size=512, bos_token_id=info.eos_id,
                   eos_token_id=info.eos_id)  # fmt: skip
    make_checkpoint(model, config, dtype="bfloat16", seed=2, std=0.05)
    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"prompt": f"what is {a} plus {b}?", "completion": str(a + b)} for a in range(6) for b in range(6)
    ]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:30]))
    (data / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[30:]))
    cache = tmp_path / "cache"
    lora = ["--lora", "4", "--lr", "5e-3"] if mode == "lora" else ["--lr", "1e-3"]
    common = ["--init", str(model), *lora, "--data", str(data), "--steps", "3", "--seq", "32", "--val-every", "2",
              *QUIET]  # fmt: skip
    _ok(_one(["train", "--out", str(tmp_path / "one"), "--accum", "4", *common], cache))
    _ok(_ranks(2, ["train", "--out", str(tmp_path / "two"), "--accum", "2", "--distributed", "mpi", *common],
               cache))  # fmt: skip
    one, two = _hf_state(tmp_path / "one"), _hf_state(tmp_path / "two")
    _assert_same(one, two)
    assert sorted(one["state"]["val_losses"]) == ["0", "2", "3"]
    assert two["run"]["world"] == 2 and two["run"]["train"]["accum"] == 4
    product = "adapters/adapter_model.safetensors" if mode == "lora" else "model/model.safetensors"
    assert (tmp_path / "one" / product).read_bytes() == (tmp_path / "two" / product).read_bytes()


# --------------------------------------------------------------------------------------------------------
# resume across world sizes, the compile budget
# --------------------------------------------------------------------------------------------------------

# A run from Python (``Run``; ``distributed`` from argv, "" for one process), resumed or not, stopped after
# step ``stop`` (0: not stopped); under mpiexec every rank runs it and the stop is agreed. A rank other than
# 0 is given an OUT that does not exist: it must neither need nor make one.
RUN_SCRIPT = """
import os, sys
from pathlib import Path
from anekit.training.options import TrainOptions
from anekit.training.run import Run

out, data, tok, accum, kind, resume, stop = sys.argv[1:8]
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
out = Path(out) if rank == 0 else Path(out).parent / f"rank{rank}-out"
run = Run(TrainOptions(out=out, data=Path(data), tokenizer=Path(tok), steps=None if resume else 4,
                       accum=None if resume else int(accum), seed=None if resume else 1, backend="sim",
                       distributed=kind or None, resume=bool(resume)))
try:
    print(run.train(should_stop=lambda: bool(int(stop)) and run.state.step >= int(stop)).reason, run.rank)
finally:
    run.close()
"""


def _script(tmp_path: Path, out: Path, inputs: tuple[Path, Path, Path], ranks: int, accum: int = 0,
            resume: bool = False, stop: int = 0) -> Any:  # fmt: skip
    script = tmp_path / "run_script.py"
    script.write_text(RUN_SCRIPT)
    data, tok, cache = inputs
    args = [
        str(out),
        str(data),
        str(tok),
        str(accum),
        "mpi" if ranks > 1 else "",
        "1" if resume else "",
        str(stop),
    ]
    if ranks == 1:
        return _ok(subprocess.run([sys.executable, str(script), *args], env=_env(cache), capture_output=True,
                                  text=True, timeout=MAX_TIMEOUT))  # fmt: skip
    need_engine("mpi")
    done = _ok(
        run_ranks(ranks, [str(script), *args], engine="mpi", timeout=MAX_TIMEOUT, env=_rank_env(cache))
    )
    assert not any(out.parent.glob("rank*-out")), "a rank other than 0 wrote an output directory"
    return done


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, inputs: tuple[Path, Path, Path]) -> dict[str, Any]:
    """One process, 4 steps of 2 sequences: what every resumed run below must give."""
    out = tmp_path_factory.mktemp("straight") / "run"
    _ok(_one(_default(out, inputs, "--steps", "4", "--accum", "2"), inputs[2]))
    return _blzt(out)


def test_two_ranks_stopped_at_step_2_resumed_by_one_process_finish_the_run_exactly(
    tmp_path, inputs, straight
):
    out = tmp_path / "run"
    stopped = _script(tmp_path, out, inputs, ranks=2, accum=1, stop=2)
    assert sorted(stopped.stdout.split()) == ["0", "1", "stopped", "stopped"]
    assert _blzt(out)["state"]["step"] == 2
    _ok(_one(_default(out, inputs, "--resume"), inputs[2]))
    resumed = _blzt(out)
    _assert_same(straight, resumed)
    assert resumed["run"]["worlds"] == [[0, 2], [2, 1]] and resumed["run"]["world"] == 1
    assert resumed["run"]["marks"] == [[2, "resume"]]


def test_one_process_stopped_at_step_2_resumed_on_two_ranks_finishes_the_run_exactly(
    tmp_path, inputs, straight
):
    """Rank 1's OUT does not exist: the run's state comes from rank 0."""
    out = tmp_path / "run"
    _script(tmp_path, out, inputs, ranks=1, accum=2, stop=2)
    done = _script(tmp_path, out, inputs, ranks=2, resume=True)
    assert sorted(done.stdout.split()) == ["0", "1", "done", "done"]
    resumed = _blzt(out)
    _assert_same(straight, resumed)
    assert resumed["run"]["worlds"] == [[0, 1], [2, 2]] and resumed["run"]["world"] == 2


def test_a_compile_budget_ends_every_rank_with_75_and_the_resume_finishes_exactly(tmp_path, inputs):
    """Baked weights recompile per step: a budget of 45 holds two steps of the default model."""
    cache = inputs[2]
    _ok(_one(_default(tmp_path / "one", inputs, "--steps", "3", "--accum", "2", "--weights", "baked"), cache))
    out = tmp_path / "two"
    args = _default(out, inputs, "--steps", "3", "--accum", "1", "--weights", "baked", "--distributed", "mpi",
                    "--compile-budget", "45")  # fmt: skip
    done = _ranks(2, args, cache)
    assert done.returncode == 75, (done.stdout[-2000:], done.stderr[-2000:])
    assert "every rank exits 75" in done.stdout
    assert _blzt(out)["state"]["step"] == 2
    _ok(_ranks(2, _default(out, inputs, "--resume", "--distributed", "mpi", "--compile-budget", "45"), cache))
    _assert_same(_blzt(tmp_path / "one"), _blzt(out))


def test_sigterm_to_one_rank_stops_every_rank_after_the_same_step_and_the_resume_is_exact(tmp_path, inputs):
    """The stop is agreed at a step boundary: rank 0 saves, every rank exits 143 (128 + SIGTERM), though the
    signal reached rank 1 only; the resume on 2 ranks finishes the run of one process."""
    import signal
    import time

    from tests.distributed_ranks import rank_pids, start_ranks

    need_engine("mpi")
    cache = inputs[2]
    steps = "200"
    _ok(_one(_default(tmp_path / "one", inputs, "--steps", steps, "--accum", "2"), cache))
    out = tmp_path / "two"
    args = _default(out, inputs, "--steps", steps, "--accum", "1", "--distributed", "mpi")
    started = start_ranks(2, ["-m", "anekit.cli.main", *args], "mpi", _rank_env(cache))
    pids = rank_pids(started, 2)
    started.wait_for("anekit train:")
    time.sleep(1.0)  # into the run's steps
    os.kill(next(p for p in pids if _rank_of(p) == 1), signal.SIGTERM)  # rank 0 learns it by the exchange
    done = started.finish(MAX_TIMEOUT)
    assert done.returncode == 128 + signal.SIGTERM, (done.stdout[-2000:], done.stderr[-2000:])
    stopped = _blzt(out)["state"]["step"]
    assert stopped < int(steps)
    assert _anekit_lines(done.stderr) == [
        f"anekit: stopped by SIGTERM at step {stopped}/{steps}: saved {out / 'ckpt.bin'} (weights, Adam state, "
        f"run state); continue with: anekit train --out {out} --resume"
    ], done.stderr
    _ok(_ranks(2, _default(out, inputs, "--resume", "--distributed", "mpi"), cache))
    _assert_same(_blzt(tmp_path / "one"), _blzt(out))


def _rank_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(int(e.split(b"=")[1]) for e in environ if e.startswith(b"OMPI_COMM_WORLD_RANK="))


def test_a_hung_rank_ends_the_run_on_every_rank_naming_it_and_the_intact_checkpoint(tmp_path, inputs):
    """Rank 1 stopped (SIGSTOP) mid-run: rank 0 waits --peer-timeout, prints one line naming rank 1, the
    exchange and the checkpoint left, and every rank ends with 3; the checkpoint resumes exactly."""
    import signal
    import time

    from tests.distributed_ranks import rank_pids, start_ranks

    need_engine("mpi")
    cache = inputs[2]
    steps = "200"
    _ok(_one(_default(tmp_path / "one", inputs, "--steps", steps, "--accum", "2"), cache))
    out = tmp_path / "two"
    args = _default(out, inputs, "--steps", steps, "--accum", "1", "--distributed", "mpi", "--peer-timeout", "3",
                    "--checkpoint-every", "5")  # fmt: skip
    started = start_ranks(2, ["-m", "anekit.cli.main", *args], "mpi", _rank_env(cache))
    pids = rank_pids(started, 2)
    started.wait_for("anekit train:")
    time.sleep(1.5)  # into the run's steps
    os.kill(next(p for p in pids if _rank_of(p) == 1), signal.SIGSTOP)
    t0 = time.monotonic()
    done = started.finish(60)
    assert time.monotonic() - t0 < 30  # the longest step + 3 s, with the launcher's own time
    assert done.returncode == 3, (done.stdout[-2000:], done.stderr[-2000:])
    # The stopped rank may speak too: the launcher's abort continues it (SIGCONT) before it ends it, and
    # on waking its own wait has run past the timeout. Every other line is such a timeout line.
    lines = [line for line in _anekit_lines(done.stderr) if "rank 1 did not answer" in line]
    assert len(lines) == 1, done.stderr
    others = [line for line in _anekit_lines(done.stderr) if line not in lines]
    assert all(re.match(r"anekit: \[train\] rank \d+ did not answer within", line) for line in others), others
    saved = _blzt(out)["state"]["step"]
    # S = 3 s point to point; a gather waits S + 1 (rank 0) or S + 2 (the others) so a point-to-point waiter
    # speaks first (anekit.training.distributed.mpi)
    assert re.match(r"anekit: \[train\] rank 1 did not answer within [345] s \(", lines[0]), lines[0]
    assert lines[0].endswith(f"; ending the run on every rank; the checkpoint of step {saved} is intact")
    _ok(_ranks(2, _default(out, inputs, "--resume", "--distributed", "mpi"), cache))
    _assert_same(_blzt(tmp_path / "one"), _blzt(out))


# --------------------------------------------------------------------------------------------------------
# refusals: one line, nothing written
# --------------------------------------------------------------------------------------------------------


def _anekit_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "anekit:" in line]


def test_a_world_size_that_does_not_divide_the_stored_batch_is_refused_in_one_line(tmp_path, inputs):
    out = tmp_path / "run"
    _ok(_one(_default(out, inputs, "--steps", "2", "--accum", "3"), inputs[2]))
    before = (out / "ckpt.bin").read_bytes()
    done = _ranks(2, _default(out, inputs, "--resume", "--distributed", "mpi"), inputs[2])
    assert done.returncode == 1
    lines = _anekit_lines(done.stderr)
    assert lines == [f"anekit: [train] --resume: the run in {out} takes 3 sequences a step, which 2 ranks cannot "
                     "share evenly; resume it on a number of ranks that divides 3 (1, 3)"], done.stderr  # fmt: skip
    assert (out / "ckpt.bin").read_bytes() == before


def test_a_per_rank_accum_that_contradicts_the_stored_batch_is_refused_in_one_line(tmp_path, inputs):
    out = tmp_path / "run"
    _ok(_one(_default(out, inputs, "--steps", "2", "--accum", "4"), inputs[2]))
    done = _ranks(2, _default(out, inputs, "--resume", "--distributed", "mpi", "--accum", "1"), inputs[2])
    assert done.returncode == 1
    assert _anekit_lines(done.stderr) == [
        f"anekit: [train] --resume: --accum 1 per rank on 2 ranks (2 sequences a step) contradicts the run in "
        f"{out} (4 a step: --accum 2 on 2 ranks); drop it to continue that run"
    ], done.stderr


def test_distributed_mlx_without_mlx_is_one_line_naming_the_extra(tmp_path, inputs):
    hidden = tmp_path / "no_mlx" / "mlx"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named mlx')\n")
    out = tmp_path / "run"
    env = {"PYTHONPATH": str(hidden.parent)}
    done = _one(_default(out, inputs, "--distributed", "mlx", "--steps", "1"), inputs[2], **env)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("anekit: [distributed]") and "mlx" in lines[0], done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--wire", "fp16"], "anekit: [train] --wire fp16 applies to a run over several processes"),
        (["--distributed", "tcp"], "invalid choice: 'tcp'"),
        (["--peer-timeout", "0", "--distributed", "mpi"], "--peer-timeout"),
    ],
)
def test_bad_distributed_options_are_refused_before_anything_is_written(tmp_path, inputs, extra, expected):
    out = tmp_path / "run"
    done = _one(_default(out, inputs, "--steps", "1", *extra), inputs[2], timeout=60)
    assert done.returncode in (1, 2)
    assert expected in done.stderr
    assert not out.exists()


# --------------------------------------------------------------------------------------------------------
# the start, with ranks as threads of this process (tests/distributed_fakes.py): who refuses, and how
# --------------------------------------------------------------------------------------------------------


def _start(tmp_path: Path, inputs: tuple[Path, Path, Path], options: list[dict[str, Any]]) -> list[Any]:
    """Each rank's ``Run`` of the default model with its own options (over ``base``), opened and trained
    one step; each rank's result, or the error it raised."""
    from anekit.training.options import TrainOptions
    from anekit.training.run import Run
    from tests.distributed_fakes import run_ranks as thread_ranks

    data, tok, _ = inputs
    base = dict(out=tmp_path / "run", data=data, tokenizer=tok, steps=1, accum=1, backend="sim")

    def work(transport: Any) -> Any:
        try:
            run = Run(TrainOptions(**{**base, **options[transport.rank]}), transport=transport)
            try:
                return run.train().reason
            finally:
                run.close()
        except Exception as e:  # what each rank raised, compared below
            return e

    return thread_ranks(len(options), work, timeout=100, peer=30)


def test_ranks_given_other_data_refuse_before_any_step_naming_the_field_and_the_ranks(tmp_path, inputs):
    from anekit.training.distributed.follow import StartRefused
    from anekit.training.distributed.transport import DistributedError

    other = tmp_path / "other.txt"
    other.write_text(corpus.generate_corpus(30, 2))
    lead, follower = _start(tmp_path, inputs, [{}, {"data": other}])
    assert isinstance(lead, DistributedError) and not isinstance(lead, StartRefused)
    assert "the ranks differ in data sha256: rank 0 has '" in str(lead) and "rank 1 has '" in str(lead)
    assert isinstance(follower, StartRefused)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_rank_that_cannot_read_its_inputs_is_named_by_rank_0(tmp_path, inputs):
    from anekit.training.distributed.follow import StartRefused

    missing = tmp_path / "nowhere.txt"
    lead, follower = _start(tmp_path, inputs, [{}, {"data": missing}])
    assert str(lead).startswith("[train] rank 1 cannot start the run: [data] cannot read text file"), lead
    assert str(missing) in str(lead)
    assert isinstance(follower, StartRefused)
    assert not (tmp_path / "run").exists()


def test_a_run_rank_0_refuses_ends_every_rank_before_it_reads_anything(tmp_path, inputs):
    from anekit.training.distributed.follow import StartRefused

    out = tmp_path / "run"
    _ok(_one(_default(out, inputs, "--steps", "1", "--accum", "2"), inputs[2]))
    before = (out / "ckpt.bin").read_bytes()
    lead, follower = _start(tmp_path, inputs, [{}, {"data": tmp_path / "nowhere.txt"}])
    assert str(lead).startswith(f"[train] {out} holds a run"), lead
    assert isinstance(follower, StartRefused) and "rank 0 refused the run" in str(follower)
    assert (out / "ckpt.bin").read_bytes() == before


def test_ranks_as_threads_train_the_bits_of_one_process(tmp_path, inputs):
    """The same start and state hand-over, in one process (quick): rank 1's OUT is another directory,
    which it never creates."""
    lead, follower = _start(tmp_path, inputs, [{"steps": 2}, {"steps": 2, "out": tmp_path / "elsewhere"}])
    assert (lead, follower) == ("done", "done")
    assert not (tmp_path / "elsewhere").exists()
    _ok(_one(_default(tmp_path / "one", inputs, "--steps", "2", "--accum", "2", "--seed", "0"), inputs[2]))
    _assert_same(_blzt(tmp_path / "one"), _blzt(tmp_path / "run"))


def test_the_world_fields_are_checked_and_a_record_without_them_still_loads(tmp_path):
    import anekit
    from anekit.errors import FormatError
    from anekit.llama.run_record import check_run_record

    anekit.train(tmp_path / "run", steps=1, accum=1, quiet=True)
    record = load_checkpoint_file(tmp_path / "run" / "ckpt.bin").run
    assert record is not None
    assert {k: record[k] for k in ("world", "micro_order", "worlds")} == {
        "world": 1,
        "micro_order": "global index blocks",
        "worlds": [[0, 1]],
    }
    older = {k: v for k, v in record.items() if k not in ("world", "micro_order", "worlds", "blas_threads")}
    assert check_run_record(older) is older  # a record written before runs spread over ranks
    for key, bad, expected in (("world", 0, "an integer in 1 .. 65536"), ("micro_order", "by rank", "one of"),
                               ("worlds", [[0, 0]], "an integer in 1 .. 65536")):  # fmt: skip
        with pytest.raises(FormatError, match=f"run record {key}.*must be {expected}"):
            check_run_record({**record, key: bad})
