"""The MPI transport: ranks started by ``mpiexec`` (Open MPI), talking through mpi4py's ``COMM_WORLD``.

Every exchange is point to point (``Isend`` / ``Irecv``) and polled against a deadline, never a blocking
call: a rank that died, hangs or lost its link turns into ``PeerLost`` after ``timeout`` seconds without
progress, naming the rank waited on. The collectives are built from the same messages in a fixed shape, so
that the rank that waits knows whom it waits for:

- ``broadcast``: the root sends to every other rank (a star); a receiver waits on the root, the root on the
  receivers that have not taken their copy.
- ``all_gather_bytes``, ``all_sum``, ``barrier``: every rank sends to rank 0, which names the ranks it has
  not heard from, combines (``all_sum`` adds in rank order) and sends the result back. The other ranks
  wait on rank 0 a little longer than ``timeout`` (``LEAF_GRACE``), so that when one rank is lost, rank 0,
  which knows which one, is the first to say so.

Arrays travel as their raw bytes (bit for bit, any dtype), each in chunks of at most ``CHUNK_BYTES`` with
at most ``WINDOW`` chunks in flight, so the memory MPI buffers and the time between two polls stay
bounded whatever the size of a gradient bucket. A small header (the byte count) goes first, so a receiver
whose arrays do not match the sender's gets one line saying so, never a truncated or garbled array.

``close`` finalizes MPI: a rank that ends without it is reported by ``mpiexec`` as a failed job.
``abort`` prints its line and calls ``MPI_Abort``: ``mpiexec`` then ends every rank (with SIGTERM, then
SIGKILL) and exits with the code given.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from anekit.errors import install_hint
from anekit.training.distributed.transport import DEFAULT_TIMEOUT, DistributedError, PeerLost, sum_over_ranks

CHUNK_BYTES = 16 << 20  # the largest single message: a gradient bucket of any size goes in such pieces
WINDOW = 4  # chunks in flight at once per call
HUB_GRACE = 1.0  # seconds rank 0 waits for the others' records beyond the timeout (module docstring)
LEAF_GRACE = 2.0  # seconds a rank waits on rank 0's reply beyond the timeout
POLL_MAX = 0.002  # the longest sleep between two polls, seconds

# Message tags, one per kind of exchange, so that a broadcast can never be taken for a send.
TAG_P2P = 101
TAG_BCAST = 102
TAG_UP = 103  # to rank 0
TAG_DOWN = 104  # from rank 0


def load_mpi() -> Any:
    """mpi4py's ``MPI`` module (initializing MPI), or one line naming the extra to install."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError(
            "[distributed] the MPI transport needs mpi4py and an MPI library "
            f"({install_hint('distributed')}): {e}"
        ) from None
    return MPI


def _chunks(array: np.ndarray) -> list[np.ndarray]:
    """The array's bytes as contiguous uint8 views of at most CHUNK_BYTES each (none for an empty one)."""
    flat = array.reshape(-1).view(np.uint8)
    return [flat[i : i + CHUNK_BYTES] for i in range(0, flat.size, CHUNK_BYTES)]


def _contiguous(arrays: Sequence[np.ndarray], what: str, writable: bool) -> list[np.ndarray]:
    out = []
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise DistributedError(
                f"[distributed] {what}: array {i} is a {type(a).__name__}, not a numpy array"
            )
        if writable:
            if not (a.flags.c_contiguous and a.flags.writeable):
                raise DistributedError(
                    f"[distributed] {what}: array {i} must be C-contiguous and writable to receive in place"
                )
            out.append(a)
        else:
            out.append(np.ascontiguousarray(a))
    return out


class MpiTransport:
    """The ranks of ``mpiexec -n N``; see the module docstring for how each exchange goes."""

    name = "mpi"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, comm: Any = None) -> None:
        if not timeout > 0:
            raise DistributedError(
                f"[distributed] timeout: expected a number of seconds > 0, got {timeout!r}"
            )
        mpi = load_mpi()
        self._mpi = mpi
        self._comm = comm if comm is not None else mpi.COMM_WORLD
        self.rank: int = self._comm.Get_rank()
        self.size: int = self._comm.Get_size()
        shared = self._comm.Split_type(mpi.COMM_TYPE_SHARED)
        self.local_size: int = shared.Get_size()
        shared.Free()
        self.timeout = float(timeout)
        self._closed = False

    # -- the polled wait every exchange goes through

    def _wait(self, requests: list[Any], peers: list[int], what: str, limit: float) -> None:
        """Wait until every request completes; ``peers[i]`` is the rank request i waits on. Raises PeerLost
        (its ``rank`` the lowest of those not heard from) after ``limit`` seconds in which no request
        completed."""
        pending = list(range(len(requests)))
        deadline = time.monotonic() + limit
        pause = 0.0
        while pending:
            done = [i for i in pending if requests[i].Test()]
            if done:
                pending = [i for i in pending if i not in done]
                deadline = time.monotonic() + limit
                pause = 0.0
                continue
            if time.monotonic() > deadline:
                raise self._lost(sorted({peers[i] for i in pending}), what, limit)
            time.sleep(pause)
            pause = min(POLL_MAX, pause + 0.0001)

    def _lost(self, ranks: list[int], what: str, limit: float) -> PeerLost:
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
        verb = "did" if len(ranks) == 1 else "do"
        return PeerLost(
            ranks[0],
            what,
            f"{who} {verb} not answer within {limit:g} s ({what}): it died, hung or lost its link",
        )

    def _windowed(
        self,
        post: Callable[[np.ndarray, int], Any],
        pieces: list[tuple[np.ndarray, int]],
        what: str,
        limit: float,
    ) -> None:
        """Post ``post(chunk, peer)`` for each piece, at most WINDOW in flight, waiting on each window."""
        for start in range(0, len(pieces), WINDOW):
            batch = pieces[start : start + WINDOW]
            self._wait([post(chunk, peer) for chunk, peer in batch], [peer for _, peer in batch], what, limit)

    def _check_peer(self, peer: int, role: str, what: str) -> None:
        if not (0 <= peer < self.size) or peer == self.rank:
            raise DistributedError(
                f"[distributed] {what}: {role} {peer} is not another rank of this run "
                f"(rank {self.rank} of {self.size})"
            )

    # -- arrays, point to point

    def _send_to(self, arrays: list[np.ndarray], dsts: list[int], tag: int, what: str) -> None:
        header = np.array([sum(a.nbytes for a in arrays)], dtype=np.int64)
        self._windowed(
            lambda c, d: self._comm.Isend(c, dest=d, tag=tag), [(header, d) for d in dsts], what, self.timeout
        )
        pieces = [(c, d) for a in arrays for c in _chunks(a) for d in dsts]
        self._windowed(lambda c, d: self._comm.Isend(c, dest=d, tag=tag), pieces, what, self.timeout)

    def _recv_from(self, arrays: list[np.ndarray], src: int, tag: int, what: str, limit: float) -> None:
        header = np.zeros(1, dtype=np.int64)
        self._windowed(lambda c, s: self._comm.Irecv(c, source=s, tag=tag), [(header, src)], what, limit)
        expected = sum(a.nbytes for a in arrays)
        if int(header[0]) != expected:
            raise DistributedError(
                f"[distributed] {what}: rank {src} sent {int(header[0])} bytes, rank {self.rank} expected "
                f"{expected} (the ranks disagree on the arrays' shapes or dtypes)"
            )
        pieces = [(c, src) for a in arrays for c in _chunks(a)]
        self._windowed(lambda c, s: self._comm.Irecv(c, source=s, tag=tag), pieces, what, limit)

    def send(self, arrays: Sequence[np.ndarray], dst: int, what: str) -> None:
        self._check_peer(dst, "destination", what)
        self._send_to(_contiguous(arrays, what, writable=False), [dst], TAG_P2P, what)

    def recv(self, arrays: Sequence[np.ndarray], src: int, what: str) -> None:
        self._check_peer(src, "source", what)
        self._recv_from(_contiguous(arrays, what, writable=True), src, TAG_P2P, what, self.timeout)

    def broadcast(self, arrays: Sequence[np.ndarray], root: int, what: str) -> None:
        if self.size == 1:
            return
        if not 0 <= root < self.size:
            raise DistributedError(
                f"[distributed] {what}: root {root} is not a rank of this run of {self.size}"
            )
        if self.rank == root:
            others = [r for r in range(self.size) if r != root]
            self._send_to(_contiguous(arrays, what, writable=False), others, TAG_BCAST, what)
        else:
            self._recv_from(_contiguous(arrays, what, writable=True), root, TAG_BCAST, what, self.timeout)

    # -- small records through rank 0

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        if self.size == 1:
            return [bytes(data)]
        others = list(range(1, self.size))
        if self.rank == 0:
            lengths = [np.zeros(1, dtype=np.int64) for _ in others]
            self._wait(
                [self._comm.Irecv(n, source=r, tag=TAG_UP) for n, r in zip(lengths, others)],
                others,
                what,
                self.timeout + HUB_GRACE,
            )
            bufs = [np.zeros(int(n[0]), dtype=np.uint8) for n in lengths]
            self._wait(
                [self._comm.Irecv(b, source=r, tag=TAG_UP) for b, r in zip(bufs, others)],
                others,
                what,
                self.timeout + HUB_GRACE,
            )
            records = [bytes(data)] + [b.tobytes() for b in bufs]
            packed = _pack(records)
            self._send_to([packed], others, TAG_DOWN, what)
            return records
        mine = np.frombuffer(bytes(data), dtype=np.uint8).copy()
        self._wait(
            [self._comm.Isend(np.array([mine.size], dtype=np.int64), dest=0, tag=TAG_UP)],
            [0],
            what,
            self.timeout + LEAF_GRACE,
        )
        self._wait([self._comm.Isend(mine, dest=0, tag=TAG_UP)], [0], what, self.timeout + LEAF_GRACE)
        header = np.zeros(1, dtype=np.int64)
        self._wait([self._comm.Irecv(header, source=0, tag=TAG_DOWN)], [0], what, self.timeout + LEAF_GRACE)
        packed = np.zeros(int(header[0]), dtype=np.uint8)
        self._windowed(
            lambda c, s: self._comm.Irecv(c, source=s, tag=TAG_DOWN),
            [(c, 0) for c in _chunks(packed)],
            what,
            self.timeout + LEAF_GRACE,
        )
        return _unpack(packed.tobytes(), self.size, what)

    def all_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        return sum_over_ranks(array, lambda data: self.all_gather_bytes(data, what), self.rank, what)

    def barrier(self, what: str) -> None:
        self.all_gather_bytes(b"", what)

    # -- the end

    def abort(self, line: str, code: int = 1) -> NoReturn:
        try:
            print(line, file=sys.stderr, flush=True)
            sys.stdout.flush()
        finally:
            self._comm.Abort(code)
        raise SystemExit(code)  # not reached: MPI_Abort does not return

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._mpi.Is_finalized():
            self._mpi.Finalize()


def _pack(records: list[bytes]) -> np.ndarray:
    """Records as one byte array: their lengths (int64 each), then their bytes."""
    lengths = np.array([len(r) for r in records], dtype=np.int64).tobytes()
    return np.frombuffer(lengths + b"".join(records), dtype=np.uint8).copy()


def _unpack(packed: bytes, count: int, what: str) -> list[bytes]:
    head = 8 * count
    lengths = np.frombuffer(packed[:head], dtype=np.int64)
    if lengths.size != count or head + int(lengths.sum()) != len(packed):
        raise DistributedError(f"[distributed] {what}: rank 0 sent a gathered record of the wrong size")
    out, at = [], head
    for n in lengths:
        out.append(packed[at : at + int(n)])
        at += int(n)
    return out
