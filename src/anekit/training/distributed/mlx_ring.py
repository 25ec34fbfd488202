"""The mlx transport: ranks started by ``mlx.launch``, talking through ``mlx.core.distributed``.

``mx.distributed.init`` reads what ``mlx.launch`` exports (``MLX_RANK``, ``MLX_HOSTFILE``, and for other
backends their own variables); the backend is ``ring`` (TCP) unless ``ANEKIT_MLX_BACKEND`` names another
(``jaccl`` for Thunderbolt 5 RDMA, as ``mlx.launch --backend`` does).

Arrays travel as their raw bytes (``uint8`` mlx arrays, so bit for bit whatever their dtype), in chunks of
at most ``CHUNK_BYTES``, after a header with the byte count (a mismatch is one line, never a garbled
array); mlx's ``all_sum`` never carries data. mlx's ring moves point-to-point messages between
neighbours only, so:

- ``send`` / ``recv`` take a neighbour in the ring (rank ± 1, modulo the size): the chain of a step's
  gradient sum (rank r to r + 1) is one;
- ``broadcast`` relays the root's chunks around the ring (root -> root + 1 -> ...), each rank forwarding
  what it received, one chunk behind;
- ``all_gather_bytes`` (and ``all_sum`` of integers, ``barrier``, built on it) pads every record to the
  longest and uses ``mx.distributed.all_gather``.

mlx's calls block, so each exchange runs on this transport's one worker thread (mlx streams belong to a
thread: init and every call run there) while the calling thread waits at most ``timeout`` seconds, then
raises ``PeerLost`` naming the rank waited on (for a gather of more than two ranks: ``a rank``, which mlx
does not tell; a gather
waits ``GATHER_GRACE`` longer, so that a rank waiting on the lost one directly speaks first). After
a timeout the worker is still blocked and the transport refuses further exchanges: the caller aborts.
A link that mlx sees fail (a peer that died) raises ``PeerLost`` at once.

``abort`` prints its line and ends this process with the code (``os._exit``): ``mlx.launch`` sees a rank
exit with a non-zero code and stops every other rank with SIGTERM (its own exit status is 0 whatever
the ranks did; ``anekit launch`` reads the ranks' codes from its report).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NoReturn, TypeVar

import numpy as np

from anekit.errors import install_hint
from anekit.training.distributed.transport import DEFAULT_TIMEOUT, DistributedError, PeerLost, sum_over_ranks

CHUNK_BYTES = 16 << 20  # the largest single message
GATHER_GRACE = 2.0  # seconds a gather waits beyond the timeout, so a point-to-point waiter speaks first
BACKEND_ENV = "ANEKIT_MLX_BACKEND"
T = TypeVar("T")


def load_mlx() -> Any:
    """``mlx.core``, or one line naming the extra to install."""
    try:
        import mlx.core as mx
    except ImportError as e:
        raise DistributedError(
            f"[distributed] the mlx transport needs mlx ({install_hint('mlx')}): {e}"
        ) from None
    return mx


def _byte_views(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each array's bytes as a flat uint8 view (no copy)."""
    return [a.reshape(-1).view(np.uint8) for a in arrays]


def _chunks(flat: np.ndarray) -> list[np.ndarray]:
    return [flat[i : i + CHUNK_BYTES] for i in range(0, flat.size, CHUNK_BYTES)]


class MlxTransport:
    """The ranks of ``mlx.launch -n N``; see the module docstring for how each exchange goes."""

    name = "mlx"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not timeout > 0:
            raise DistributedError(
                f"[distributed] timeout: expected a number of seconds > 0, got {timeout!r}"
            )
        self._mx = load_mlx()
        self.timeout = float(timeout)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anekit-mlx")
        self._stuck: str | None = None
        backend = os.environ.get(BACKEND_ENV, "ring")
        try:
            self._group = self._worker.submit(self._mx.distributed.init, strict=True, backend=backend).result(
                timeout=self.timeout
            )
        except FutureTimeout:
            raise DistributedError(
                f"[distributed] mlx.distributed ({backend}) did not connect the ranks within "
                f"{self.timeout:g} s"
            ) from None
        except RuntimeError as e:
            raise DistributedError(
                f"[distributed] mlx.distributed ({backend}) could not start (is this rank started by "
                f"mlx.launch?): {str(e).strip()}"
            ) from None
        self.rank: int = self._group.rank()
        self.size: int = self._group.size()
        self.local_size: int = self._local_size()

    def _local_size(self) -> int:
        """Ranks on this host: the hostnames gathered, this one counted."""
        import socket

        names = self.all_gather_bytes(socket.gethostname().encode(), "the ranks' hosts")
        return names.count(names[self.rank])

    # -- running mlx on the worker, waiting with the timeout

    def _run(self, job: Callable[[], T], peer: int | None, what: str, grace: float = 0.0) -> T:
        if self._stuck is not None:
            raise DistributedError(
                f"[distributed] {what}: the transport is unusable since {self._stuck} timed out"
            )
        future: Future[T] = self._worker.submit(job)
        try:
            return future.result(timeout=self.timeout + grace)
        except FutureTimeout:
            self._stuck = what
            raise self._lost(peer, what, f"did not answer within {self.timeout + grace:g} s") from None
        except RuntimeError as e:  # mlx reports a lost link as a RuntimeError
            raise self._lost(peer, what, f"lost its link ({str(e).strip()})") from None

    def _lost(self, peer: int | None, what: str, how: str) -> PeerLost:
        who = "a rank" if peer is None else f"rank {peer}"
        return PeerLost(
            -1 if peer is None else peer, what, f"{who} {how} ({what}): it died, hung or lost its link"
        )

    def _neighbours(self) -> tuple[int, int]:
        return (self.rank - 1) % self.size, (self.rank + 1) % self.size

    def _check_neighbour(self, peer: int, role: str, what: str) -> None:
        if not (0 <= peer < self.size) or peer == self.rank:
            raise DistributedError(
                f"[distributed] {what}: {role} {peer} is not another rank of this run "
                f"(rank {self.rank} of {self.size})"
            )
        if peer not in self._neighbours():
            left, right = self._neighbours()
            raise DistributedError(
                f"[distributed] {what}: the mlx ring carries messages between neighbours only; rank "
                f"{self.rank}'s are {left} and {right}, not {peer}"
            )

    # -- the raw moves, on the worker thread

    def _send_bytes(self, flats: list[np.ndarray], dst: int) -> None:
        mx = self._mx
        header = np.array([sum(f.size for f in flats)], dtype=np.int64).view(np.uint8)
        for piece in [header, *(c for f in flats for c in _chunks(f))]:
            mx.eval(mx.distributed.send(mx.array(piece), dst, group=self._group))

    def _recv_bytes(self, flats: list[np.ndarray], src: int, what: str, forward: int | None = None) -> None:
        """Into ``flats`` from ``src``; with ``forward``, each piece is passed on to that rank as it comes."""
        mx = self._mx
        header = self._recv_piece(8, src)
        expected = sum(f.size for f in flats)
        sent = int(header.view(np.int64)[0])
        if sent != expected:
            raise DistributedError(
                f"[distributed] {what}: rank {src} sent {sent} bytes, rank {self.rank} expected {expected} "
                "(the ranks disagree on the arrays' shapes or dtypes)"
            )
        if forward is not None:
            mx.eval(mx.distributed.send(mx.array(header), forward, group=self._group))
        for f in flats:
            for c in _chunks(f):
                c[...] = self._recv_piece(c.size, src)
                if forward is not None:
                    mx.eval(mx.distributed.send(mx.array(c), forward, group=self._group))

    def _recv_piece(self, size: int, src: int) -> np.ndarray:
        mx = self._mx
        got = mx.distributed.recv((size,), mx.uint8, src, group=self._group)
        mx.eval(got)
        return np.array(got, copy=True)

    # -- the interface

    def send(self, arrays: Sequence[np.ndarray], dst: int, what: str) -> None:
        self._check_neighbour(dst, "destination", what)
        flats = _byte_views([np.ascontiguousarray(a) for a in arrays])
        self._run(lambda: self._send_bytes(flats, dst), dst, what)

    def recv(self, arrays: Sequence[np.ndarray], src: int, what: str) -> None:
        self._check_neighbour(src, "source", what)
        flats = _byte_views(_writable(arrays, what))
        self._run(lambda: self._recv_bytes(flats, src, what), src, what)

    def broadcast(self, arrays: Sequence[np.ndarray], root: int, what: str) -> None:
        if self.size == 1:
            return
        if not 0 <= root < self.size:
            raise DistributedError(
                f"[distributed] {what}: root {root} is not a rank of this run of {self.size}"
            )
        left, right = self._neighbours()
        if self.rank == root:
            flats = _byte_views([np.ascontiguousarray(a) for a in arrays])
            self._run(lambda: self._send_bytes(flats, right), right, what)
            return
        flats = _byte_views(_writable(arrays, what))
        last = right == root  # the end of the relay
        self._run(lambda: self._recv_bytes(flats, left, what, None if last else right), left, what)

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        if self.size == 1:
            return [bytes(data)]
        mx = self._mx

        def gather(piece: np.ndarray) -> np.ndarray:
            out = mx.distributed.all_gather(mx.array(piece), group=self._group)
            mx.eval(out)
            return np.array(out, copy=True)

        def job() -> list[bytes]:
            lengths = gather(np.array([len(data)], dtype=np.int64).view(np.uint8)).view(np.int64)
            width = int(lengths.max())
            if width == 0:
                return [b""] * self.size
            mine = np.zeros(width, dtype=np.uint8)
            mine[: len(data)] = np.frombuffer(bytes(data), dtype=np.uint8)
            rows = gather(mine).reshape(self.size, width)
            return [rows[r, : int(lengths[r])].tobytes() for r in range(self.size)]

        other = 1 - self.rank if self.size == 2 else None  # of two ranks, the one waited on is known
        return self._run(job, other, what, GATHER_GRACE)

    def all_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        return sum_over_ranks(array, lambda data: self.all_gather_bytes(data, what), self.rank, what)

    def barrier(self, what: str) -> None:
        self.all_gather_bytes(b"", what)

    def abort(self, line: str, code: int = 1) -> NoReturn:
        try:
            print(line, file=sys.stderr, flush=True)
            sys.stdout.flush()
        finally:
            os._exit(code)

    def close(self) -> None:
        self._worker.shutdown(wait=self._stuck is None, cancel_futures=True)


def _writable(arrays: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
    for i, a in enumerate(arrays):
        if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.flags.writeable):
            raise DistributedError(
                f"[distributed] {what}: array {i} must be a C-contiguous, writable numpy array to receive "
                "in place"
            )
    return list(arrays)
