"""An in-process transport for tests: N ranks as threads of one process, exchanging through queues.

Every message is a copy (``send`` copies the arrays it is given, ``recv`` copies into the arrays it is
given), so no rank ever holds another's memory: what a rank changes after a send cannot reach the receiver,
as over a real link. A wait longer than ``timeout`` raises ``PeerLost`` naming the rank waited on, as the
real transports do. ``run_ranks`` runs a function on every rank and returns each rank's result, re-raising
the first rank's error (by rank) after all have ended, within a bounded time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from anekit.training.distributed.transport import DistributedError, PeerLost


class Hub:
    """The queues between ``size`` ranks: one per (kind of message, sender, receiver), first in first out."""

    def __init__(self, size: int, timeout: float = 60.0) -> None:
        self.size, self.timeout = size, timeout
        self._queues: dict[tuple[str, int, int], queue.Queue[Any]] = {}
        self._lock = threading.Lock()

    def channel(self, kind: str, src: int, dst: int) -> queue.Queue[Any]:
        with self._lock:
            return self._queues.setdefault((kind, src, dst), queue.Queue())

    def transports(self) -> list[ThreadTransport]:
        return [ThreadTransport(self, rank) for rank in range(self.size)]


class ThreadTransport:
    """Rank ``rank`` of a ``Hub``: the ``Transport`` protocol over queues."""

    name = "threads"

    def __init__(self, hub: Hub, rank: int) -> None:
        self.hub, self.rank, self.size = hub, rank, hub.size
        self.local_size = hub.size
        self.timeout = hub.timeout

    def _put(self, kind: str, dst: int, item: Any, what: str) -> None:
        self.hub.channel(kind, self.rank, dst).put(item)

    def _get(self, kind: str, src: int, what: str) -> Any:
        try:
            return self.hub.channel(kind, src, self.rank).get(timeout=self.timeout)
        except queue.Empty:
            raise PeerLost(
                src, what, f"[distributed] rank {src} did not answer within {self.timeout:g} s ({what})"
            ) from None

    @staticmethod
    def _into(arrays: Sequence[np.ndarray], got: list[np.ndarray], src: int, what: str) -> None:
        if len(got) != len(arrays):
            raise DistributedError(
                f"[distributed] {what}: rank {src} sent {len(got)} arrays, {len(arrays)} expected"
            )
        for a, b in zip(arrays, got):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise DistributedError(
                    f"[distributed] {what}: rank {src} sent {b.dtype}{list(b.shape)}, {a.dtype}{list(a.shape)} expected"
                )
            a[...] = b

    def send(self, arrays: Sequence[np.ndarray], dst: int, what: str) -> None:
        self._put("p2p", dst, [np.array(a, copy=True) for a in arrays], what)

    def recv(self, arrays: Sequence[np.ndarray], src: int, what: str) -> None:
        self._into(arrays, self._get("p2p", src, what), src, what)

    def broadcast(self, arrays: Sequence[np.ndarray], root: int, what: str) -> None:
        if self.rank == root:
            for dst in range(self.size):
                if dst != root:
                    self._put("bcast", dst, [np.array(a, copy=True) for a in arrays], what)
        else:
            self._into(arrays, self._get("bcast", root, what), root, what)

    def all_gather_bytes(self, data: bytes, what: str) -> list[bytes]:
        for dst in range(self.size):
            if dst != self.rank:
                self._put("gather", dst, bytes(data), what)
        return [
            bytes(data) if src == self.rank else self._get("gather", src, what) for src in range(self.size)
        ]

    def all_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        for dst in range(self.size):
            if dst != self.rank:
                self._put("sum", dst, np.array(array, copy=True), what)
        parts = [
            np.array(array, copy=True) if src == self.rank else self._get("sum", src, what)
            for src in range(self.size)
        ]
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total

    def barrier(self, what: str) -> None:
        self.all_gather_bytes(b"", what)

    def abort(self, line: str, code: int = 1) -> NoReturn:
        raise SystemExit(code)

    def close(self) -> None:
        return None


def run_ranks(
    size: int, work: Callable[[ThreadTransport], Any], timeout: float = 110.0, peer: float = 20.0
) -> list[Any]:
    """``work(transport)`` on ``size`` ranks at once (threads), each rank's result in rank order; the
    lowest rank's error is raised once every rank has ended (a rank that has not ended after ``timeout``
    seconds fails the test)."""
    hub = Hub(size, peer)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def run(transport: ThreadTransport) -> None:
        try:
            results[transport.rank] = work(transport)
        except BaseException as e:  # handed to the caller below
            errors[transport.rank] = e

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in hub.transports()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [rank for rank, t in enumerate(threads) if t.is_alive()]
    if stuck:
        raise AssertionError(f"ranks {stuck} had not ended after {timeout} s")
    for e in errors:
        if e is not None:
            raise e
    return results
