"""The transports between ranks: real ranks (mpiexec, mlx.launch) move arrays bit for bit, gather and sum in
rank order, agree or refuse in one line, and a lost rank ends the run within the timeout; the wire dtypes
round as IEEE does; the one-process pieces need no engine."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

from anekit.training.distributed.agree import agree
from anekit.training.distributed.open import open_transport
from anekit.training.distributed.transport import DistributedError, LocalTransport
from anekit.training.distributed.wire import with_wire
from tests.distributed_ranks import run_ranks, start_ranks

RANK = ["-m", "tests.distributed_transport_rank"]
ENGINES = ["mpi", "mlx"]


def ok_lines(out: str) -> set[str]:
    return {f"rank {r} ok" for r in re.findall(r"rank (\d+) ok$", out, re.M)}  # prterun may put a byte before


# -- one process


def test_open_transport_refuses_an_unknown_kind_in_one_line() -> None:
    with pytest.raises(
        DistributedError, match=r"--distributed: unknown transport 'nccl' \(expected one of mpi, mlx\)"
    ):
        open_transport("nccl")


def test_open_transport_refuses_a_timeout_that_is_not_positive() -> None:
    with pytest.raises(DistributedError, match=r"--peer-timeout: expected a number of seconds > 0, got 0"):
        open_transport(None, 0)


def test_local_transport_keeps_the_timeout_it_was_opened_with() -> None:
    t = open_transport(None, 7.5)
    assert isinstance(t, LocalTransport) and t.timeout == 7.5 and LocalTransport.timeout == 60.0


def test_wire_refuses_an_unknown_dtype_and_fp32_is_the_transport_itself() -> None:
    t = LocalTransport()
    assert with_wire(t, "fp32") is t
    with pytest.raises(DistributedError, match=r"--wire: unknown wire dtype 'fp8'"):
        with_wire(t, "fp8")


def test_agree_on_one_rank_passes_and_refuses_a_record_it_cannot_read() -> None:
    agree(LocalTransport(), {"a": "1"}, "fingerprint")

    class Garbled(LocalTransport):
        def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
            return [data, b"\xff not json"]

    with pytest.raises(DistributedError, match=r"fingerprint: rank 1 sent a record that is not a field list"):
        agree(Garbled(), {"a": "1"}, "fingerprint")


def test_agree_names_the_first_differing_field_in_rank_0s_order_and_a_missing_one() -> None:
    class Two(LocalTransport):
        def __init__(self, other: dict[str, str]) -> None:
            self.other = other

        def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
            return [data, json.dumps(list(self.other.items())).encode()]

    mine = {"model": "dim=64", "data": "a" * 64, "version": "1.0"}
    with pytest.raises(DistributedError) as e:
        agree(Two({"model": "dim=64", "data": "b" * 64, "version": "2.0"}), mine, "the run's fingerprint")
    assert str(e.value) == (
        "[distributed] the run's fingerprint: the ranks differ in data: rank 0 has 'aaaaaaaaaaaaaaaaaaaaa...', "
        "rank 1 has 'bbbbbbbbbbbbbbbbbbbbb...'; every rank must run the same job"
    )
    with pytest.raises(
        DistributedError, match=r"differ in version: rank 0 has '1.0', rank 1 has '\(no such field\)'"
    ):
        agree(Two({"model": "dim=64", "data": "a" * 64}), mine, "fp")


# -- real ranks


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("n", [2, 3])
def test_ranks_exchange_arrays_bit_for_bit_and_gather_and_sum_in_rank_order(engine: str, n: int) -> None:
    done = run_ranks(n, [*RANK, engine, "exchange", "20"], engine=engine, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ok_lines(done.stdout) == {f"rank {r} ok" for r in range(n)}, done.stdout + done.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_arrays_that_do_not_match_the_senders_are_refused_in_one_line(engine: str) -> None:
    done = run_ranks(2, [*RANK, engine, "mismatch", "10"], engine=engine, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "[rank 1] [distributed] buckets of step 3: rank 0 sent 40 bytes, rank 1 expected 36 (the ranks disagree "
        "on the arrays' shapes or dtypes)"
    ) in done.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_ranks_that_differ_refuse_on_every_rank_naming_the_field(engine: str) -> None:
    done = run_ranks(3, [*RANK, engine, "agree", "10"], engine=engine, timeout=60, env={"DIFFER": "1"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(
        r"\[rank \d\] \[distributed\] the run's fingerprint: the ranks differ in data: rank 0 has 'ababab.*', "
        r"rank 2 has 'cdcdcd.*'; every rank must run the same job",
        done.stderr,
    ), done.stderr
    assert not ok_lines(done.stdout)
    same = run_ranks(3, [*RANK, engine, "agree", "10"], engine=engine, timeout=60)
    assert same.returncode == 0 and len(ok_lines(same.stdout)) == 3, same.stdout + same.stderr


def _round_bf16(values: np.ndarray) -> np.ndarray:
    """bfloat16 rounding of float32 values (nearest, ties to even) in float64 arithmetic: the value of the
    two bfloat16 neighbours nearest to x, the even one on a tie."""
    out = []
    for x in values.astype(np.float64):
        if not np.isfinite(x) or x == 0:
            out.append(x)
            continue
        e = np.floor(np.log2(abs(x)))
        ulp = 2.0 ** (e - 7)
        lo = np.floor(x / ulp) * ulp
        hi = lo + ulp
        pick = lo if (x - lo < hi - x or (x - lo == hi - x and (lo / ulp) % 2 == 0)) else hi
        out.append(pick if abs(pick) <= float(np.finfo(np.float32).max) else np.copysign(np.inf, x))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_16_bit_wire_rounds_float32_as_ieee_and_leaves_other_dtypes_alone(engine: str) -> None:
    values = np.array(
        [1.0, 1 / 3, -2.5e-3, 65504.0, 70000.0, 1e-8, 3.0e38, 1.00390625, 1.01171875, -0.0], dtype=np.float32
    )
    done = run_ranks(
        2,
        [*RANK, engine, "wire", "10"],
        engine=engine,
        timeout=60,
        env={"WIRE_VALUES": json.dumps(values.tolist())},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = {
        m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^(fp16|bf16) (\{.*\})$", done.stdout, re.M)
    }
    with np.errstate(over="ignore"):
        fp16 = values.astype(np.float16).astype(np.float32)  # numpy's own IEEE rounding (70000 -> inf)
    assert got["fp16"]["bits"] == fp16.view(np.uint32).tolist()
    assert got["bf16"]["bits"] == _round_bf16(values).view(np.uint32).tolist()
    assert got["fp16"]["ints"] == got["bf16"]["ints"] == [0, 1, 2]
    # The root of a broadcast holds the rounded values too: rank 0 prints what it received from rank 1.
    sent = np.array([1.0, 1 / 3], np.float32)
    bc = {
        m.group(1): json.loads(m.group(2))
        for m in re.finditer(r"^(fp16|bf16) broadcast (\[.*\])$", done.stdout, re.M)
    }
    assert bc["fp16"] == sent.astype(np.float16).astype(np.float32).view(np.uint32).tolist()
    assert bc["bf16"] == _round_bf16(sent).view(np.uint32).tolist()


def _ended(out: str) -> float:
    return float(re.search(r"at (\d+\.\d+)\)", out).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_hung_rank_is_named_by_the_rank_waiting_on_it_within_the_timeout(engine: str) -> None:
    job = start_ranks(3, [*RANK, engine, "hang", "3"], engine=engine)
    job.wait_for(r"\[rank (\d)\] (.*)$", timeout=60)  # prterun may put a byte before a rank's line
    time.sleep(2)  # the other ranks' lines (mlx.launch passes each rank's output on in its own order)
    lines = re.findall(r"(\[rank \d\] .* at (\d+\.\d+)\))$", job.stderr, re.M)
    first = min(lines, key=lambda m: float(m[1]))[0]
    line = re.match(r"^\[rank (\d)\] (.*)$", first)
    assert line is not None
    assert line.group(2).startswith(
        "rank 2 did not answer within 3 s (gradients of step 7): it died, hung or lost its link"
    ), job.stderr
    waited = float(re.search(r"rank 1 waits from (\d+\.\d+)", job.stdout).group(1))  # type: ignore[union-attr]
    assert _ended(line.group(0)) - waited >= 3.0, job.stderr  # it did not give up early
    if engine == "mpi":  # mpiexec ends every rank, the stopped one too, with the aborting rank's code
        assert job.finish(timeout=30).returncode == 3, job.stderr
    else:  # mlx.launch's SIGTERM cannot end a stopped rank; ``anekit launch`` does (test_distributed_launch)
        job.kill()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_killed_rank_ends_every_rank(engine: str) -> None:
    done = run_ranks(3, [*RANK, engine, "die", "20"], engine=engine, timeout=60)
    assert done.returncode != 0 and not ok_lines(done.stdout), done.stdout + done.stderr
