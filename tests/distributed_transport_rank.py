"""One rank of the transport tests: ``python -m tests.distributed_transport_rank ENGINE CASE [TIMEOUT]``.

Each case checks what it received against arrays it rebuilds itself from a seed (the sender's values are a
function of the sender's rank alone), prints ``rank R ok`` and closes the transport; a failed check exits 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

from anekit.errors import AnekitError
from anekit.training.distributed.agree import agree
from anekit.training.distributed.open import open_transport
from anekit.training.distributed.transport import PeerLost, Transport
from anekit.training.distributed.wire import with_wire

BIG = 5_000_000  # float32 values: 20 MB, more than one 16 MiB chunk


def payload(rank: int) -> list[np.ndarray]:
    """What ``rank`` sends: random float32 bits (NaNs with payloads, infinities, -0, subnormals), a
    multi-chunk array, an int64 and an empty array."""
    rng = np.random.default_rng([7, rank])
    bits = rng.integers(0, 2**32, size=(3, 1001), dtype=np.uint32)
    bits[0, :4] = [0x7FC00001, 0xFF800000, 0x80000000, 0x00000001]
    return [
        bits.view(np.float32),
        rng.standard_normal(BIG).astype(np.float32),
        rng.integers(-(2**62), 2**62, size=17, dtype=np.int64),
        np.zeros((0, 4), dtype=np.float32),
    ]


def blank(rank: int) -> list[np.ndarray]:
    return [np.full_like(a, 0) for a in payload(rank)]


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b))


def case_exchange(t: Transport) -> None:
    """A chain 0 -> 1 -> ... -> last (each rank forwards what it got plus its own rank's payload check),
    a broadcast from the last rank, records of different lengths gathered, integers summed, a barrier."""
    r, n = t.rank, t.size
    if r > 0:
        got = blank(r - 1)
        t.recv(got, r - 1, "chain")
        check(same_bits(got, payload(r - 1)), f"rank {r}: chain from rank {r - 1} differs")
    if r < n - 1:
        t.send(payload(r), r + 1, "chain")
    mine = payload(r) if r == n - 1 else blank(n - 1)
    t.broadcast(mine, n - 1, "broadcast")
    check(same_bits(mine, payload(n - 1)), f"rank {r}: broadcast differs")
    records = t.all_gather_bytes(bytes([r]) * (r * 3), "gather")
    check(records == [bytes([i]) * (i * 3) for i in range(n)], f"rank {r}: gathered {records!r}")
    total = t.all_sum(np.array([r, 1, 2**40], dtype=np.int64), "sum")
    check(total.tolist() == [n * (n - 1) // 2, n, n * 2**40], f"rank {r}: summed {total.tolist()}")
    t.barrier("end")


def case_mismatch(t: Transport) -> None:
    """Rank 1 receives into arrays one value short of what rank 0 sends: one line, on rank 1."""
    if t.rank == 0:
        t.send([np.zeros(10, np.float32)], 1, "buckets of step 3")
    elif t.rank == 1:
        t.recv([np.zeros(9, np.float32)], 0, "buckets of step 3")


def case_hang(t: Transport) -> None:
    """The last rank stops itself (SIGSTOP: a hang) before the exchange; the others wait on it."""
    r, n = t.rank, t.size
    t.barrier("start")
    if r == n - 1:
        print(f"rank {r} stopping itself at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    if r == n - 2:
        print(f"rank {r} waits from {time.time():.3f}", flush=True)
        t.recv([np.zeros(8, np.float32)], n - 1, "gradients of step 7")
    t.all_gather_bytes(b"loss", "losses of step 7")


def case_die(t: Transport) -> None:
    """The last rank is killed (SIGKILL) before the exchange."""
    r, n = t.rank, t.size
    t.barrier("start")
    if r == n - 1:
        print(f"rank {r} killing itself at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    t.all_gather_bytes(b"loss", "losses of step 7")


def case_wire(t: Transport) -> None:
    """Rank 0 sends float32 values over an fp16 and a bf16 wire, rank 1 prints what it received (the
    test rounds them itself)."""
    values = np.array(json.loads(os.environ["WIRE_VALUES"]), dtype=np.float32)
    for kind in ("fp16", "bf16"):
        w = with_wire(t, kind)
        if t.rank == 0:
            w.send([values, np.arange(3, dtype=np.int32)], 1, f"wire {kind}")
        elif t.rank == 1:
            got = [np.zeros_like(values), np.zeros(3, np.int32)]
            w.recv(got, 0, f"wire {kind}")
            print(
                f"{kind} " + json.dumps({"bits": got[0].view(np.uint32).tolist(), "ints": got[1].tolist()}),
                flush=True,
            )
        last = np.array([1.0, 1 / 3], np.float32) if t.rank == 1 else np.zeros(2, np.float32)
        w.broadcast([last], 1, f"wire {kind} broadcast")
        if t.rank == 0:
            print(f"{kind} broadcast " + json.dumps(last.view(np.uint32).tolist()), flush=True)


def case_agree(t: Transport) -> None:
    """Ranks agree on equal fields; the last rank's ``data`` field differs when DIFFER is set."""
    fields = {"model": "dim=64", "data": "ab" * 40, "world size": str(t.size)}
    if os.environ.get("DIFFER") and t.rank == t.size - 1:
        fields["data"] = "cd" * 40
    agree(t, fields, "the run's fingerprint")


CASES = {
    "exchange": case_exchange,
    "mismatch": case_mismatch,
    "hang": case_hang,
    "die": case_die,
    "wire": case_wire,
    "agree": case_agree,
}


def check(ok: bool, message: str) -> None:
    if not ok:
        print(f"FAILED {message}", flush=True)
        sys.exit(1)


def main() -> int:
    engine, case = sys.argv[1], sys.argv[2]
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    t = open_transport(engine, timeout)
    try:
        CASES[case](t)
    except PeerLost as e:
        t.abort(f"[rank {t.rank}] {e.one_line()} (waited on rank {e.rank}, at {time.time():.3f})", 3)
    except AnekitError as e:
        t.abort(f"[rank {t.rank}] {e.one_line()}", 1)
    print(f"rank {t.rank} ok", flush=True)
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
