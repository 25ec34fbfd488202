"""What more Macs buy: the time of a distributed run's fixed-order gradient exchange over a link, and the
speed-up of data parallelism it leaves (a model, not a measurement).

The exchange is the one ``anekit train --distributed`` makes once per optimizer step, after every rank has
run its k sequences (N ranks, global batch N*k):

* the chain sum: rank 0 sends its partial total to rank 1, which adds its own k sequences' gradients and
  sends on, ... to rank N-1; per bucket (the trainable's gradient tensors, in their fixed order), so bucket
  j + 1 leaves rank 0 while bucket j is further down the chain. A transfer of b bytes takes
  ``latency + b / rate`` and holds both ends until it is done (a blocking send of a large message, MPI's
  rendezvous: a rank receives, adds, then sends, one bucket after another); a rank's adds take
  ``3 k b / memory rate`` (each add reads the total and one buffer and writes the total; the order of
  the sum forbids folding a rank's own buffers before the partial total arrives). The recurrence is
  ``chain_s``'s: for N = 2, per bucket one transfer, then rank 1's adds; a middle rank alternates
  receiving and sending, so past 2 ranks the chain runs at half the link's rate, and a transfer waits for
  its receiver's adds of the bucket before. ``overlap`` prices the loop that wins both back: the next
  bucket's receive posted before this one's adds, sends that do not wait for the receiver's adds;
* the broadcast: the last rank sends the whole total (every bucket, back to back, in one call) to all the
  others after the chain, in the shape of the link's transport (``Link.engine``): MPI's
  (``anekit.training.distributed.mpi``) is a star, the root sending to each rank in turn over its one
  link, ``latency + (N - 1) b / rate``; mlx's ring (``mlx_ring``) a relay, each rank passing every
  16 MiB piece on as it comes,
  ``(N - 1) latency + b / rate + (N - 2) min(b, 16 MiB) / rate``. (MPI_Bcast's large-message broadcast,
  scatter then a ring all-gather, would move 2 (N - 1) / N b: R. Thakur, R. Rabenseifner, W. Gropp,
  "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005.)

Not priced: contention between the chain and the broadcast (they are not concurrent here), and ranks that
are not equal (the exchange starts when the slowest rank has run its sequences).

A step on N ranks takes ``k * sequence + update + exchange``; one Mac running the same global batch takes
``N * k * sequence + update`` (the same weights, bit for bit: the run's order does not depend on N). The
speed-up is their ratio; the exchange is hidden when it is at most ``HIDDEN`` of the step. The time of one
sequence is a measurement where one exists, or ``sequence_s``'s prediction: the engine part alone (the CPU's
share is not timed by ``anekit.cost``), so a prediction understates the step, and overstates the
accumulation the exchange needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from anekit.cost.fitting import fitted
from anekit.cost.generation import host_figures
from anekit.cost.links import Link
from anekit.cost.model import predict
from anekit.cost.step import step_kernels
from anekit.engine.performance import Figure, performance
from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.llama.params import LAYER_FIELDS, layer_shapes

HIDDEN = 0.10  # the exchange is "hidden" when it is at most this share of a step
WIRE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}  # bytes per gradient element on the wire (--wire)
LORA_FIELDS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w1", "up": "w3", "down": "w2"}


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise AnekitError(f"[cost] {what}")


def wire_bytes(wire: str) -> int:
    _check(wire in WIRE_BYTES, f"wire '{wire}' is not one of {', '.join(WIRE_BYTES)}")
    return WIRE_BYTES[wire]


# -- what travels: the trainable's gradient tensors, in their fixed order --


def full_buckets(cfg: ModelConfig, tied: bool = True, wire: str = "fp32") -> tuple[int, ...]:
    """Bytes of every gradient tensor of full training, in the parameters' file order (the embedding, each
    layer field over every layer, the final norm, the classifier when it is not tied)."""
    size = wire_bytes(wire)
    shapes = layer_shapes(cfg)
    out = [cfg.vocab_size * cfg.dim * size]
    for key in (k for k in LAYER_FIELDS if k in shapes):
        out += [math.prod(shapes[key]) * size] * cfg.n_layers
    for key in (k for k in shapes if k not in LAYER_FIELDS):
        out += [math.prod(shapes[key]) * size] * cfg.n_layers
    out.append(cfg.dim * size)
    if not tied:
        out.append(cfg.vocab_size * cfg.dim * size)
    return tuple(out)


def lora_buckets(
    cfg: ModelConfig, rank: int, targets: Sequence[str] = ("q", "v"), wire: str = "fp32"
) -> tuple[int, ...]:
    """Bytes of every adapter gradient of a LoRA run: A (rank, in) then B (out, rank) of each adapted
    matrix, layer by layer, targets in anekit's order (default q and v, PEFT's for Llama models)."""
    _check(isinstance(rank, int) and rank > 0, f"LoRA rank must be a positive integer, not {rank!r}")
    unknown = [t for t in targets if t not in LORA_FIELDS]
    _check(not unknown and len(targets) > 0, f"LoRA targets {list(targets)}: known {', '.join(LORA_FIELDS)}")
    size = wire_bytes(wire)
    shapes = layer_shapes(cfg)
    ordered = [t for t in LORA_FIELDS if t in targets]
    out = []
    for _ in range(cfg.n_layers):
        for target in ordered:
            rows, cols = shapes[LORA_FIELDS[target]]  # (out, in)
            out += [rank * cols * size, rows * rank * size]
    return tuple(out)


def pack(buckets: Sequence[int], bucket_bytes: int) -> tuple[int, ...]:
    """Consecutive tensors grouped into buckets of at least ``bucket_bytes`` (the last may be smaller), in
    order; a tensor is never split. What grouping the small tensors (norm scales, LoRA factors) saves is
    their per-message latency."""
    _check(
        isinstance(bucket_bytes, int) and bucket_bytes > 0,
        f"bucket size must be > 0 bytes, not {bucket_bytes!r}",
    )
    out: list[int] = []
    open_bytes = 0
    for nbytes in buckets:
        open_bytes += nbytes
        if open_bytes >= bucket_bytes:
            out.append(open_bytes)
            open_bytes = 0
    if open_bytes:
        out.append(open_bytes)
    return tuple(out)


def split(buckets: Sequence[int], bucket_bytes: int) -> tuple[int, ...]:
    """Every tensor larger than ``bucket_bytes`` cut into pieces of ``bucket_bytes`` (the last smaller), in
    order: what a large tensor (the embedding) costs the pipeline is a long first and last hop."""
    _check(
        isinstance(bucket_bytes, int) and bucket_bytes > 0,
        f"bucket size must be > 0 bytes, not {bucket_bytes!r}",
    )
    out: list[int] = []
    for nbytes in buckets:
        whole, rest = divmod(nbytes, bucket_bytes)
        out += [bucket_bytes] * whole + ([rest] if rest else [])
    return tuple(out)


def rebucket(buckets: Sequence[int], bucket_bytes: int) -> tuple[int, ...]:
    """Buckets of about ``bucket_bytes``: large tensors split, then small ones grouped."""
    return pack(split(buckets, bucket_bytes), bucket_bytes)


# -- the exchange --


def hop_s(nbytes: float, link: Link) -> float:
    """One message of ``nbytes`` from one rank to the next."""
    return link.latency_s + nbytes / link.bytes_per_s


def chain_s(
    buckets: Sequence[float],
    ranks: int,
    link: Link,
    adds: int = 0,
    memory_rate: float | None = None,
    overlap: bool = False,
) -> float:
    """When the last rank holds the total of the last bucket, counted from the moment rank 0 starts
    sending: every bucket's N - 1 transfers and ``adds`` buffers added per bucket on every rank past 0 at
    ``memory_rate`` bytes/s (None: adds not priced).

    Blocking (``overlap`` False, the loop a rank runs: receive, add, send, next bucket): a transfer holds
    its two ranks. Overlapped: a rank's link in, its link out and its adds are three things at once (the
    next bucket's receive posted before this one's adds, sends that do not wait for the receiver's adds):
    a bucket moves on as soon as it is added and the links it needs are free."""
    free = [0.0] * ranks  # blocking: when each rank is next free
    link_in, link_out, cpu = [0.0] * ranks, [0.0] * ranks, [0.0] * ranks  # overlapped
    last = 0.0
    for nbytes in buckets:
        add = 3 * adds * nbytes / memory_rate if memory_rate else 0.0
        ready = 0.0  # rank 0 holds every bucket's partial total when the exchange starts
        for r in range(1, ranks):
            if overlap:
                done = max(ready, link_out[r - 1], link_in[r]) + hop_s(nbytes, link)  # rank r - 1 -> r
                link_out[r - 1] = link_in[r] = done
                ready = cpu[r] = max(done, cpu[r]) + add
            else:
                done = max(free[r - 1], free[r]) + hop_s(nbytes, link)
                free[r - 1] = done
                ready = free[r] = done + add
        last = max(last, ready)
    return last


RELAY_PIECE = 16 << 20  # bytes a relaying rank passes on at once (the mlx transport's CHUNK_BYTES)


def broadcast_s(nbytes: float, ranks: int, link: Link) -> float:
    """``nbytes`` from the last rank to every other, as the link's transport sends them: a star (MPI) or a
    relay along the ring (mlx)."""
    if ranks == 1:
        return 0.0
    if link.engine == "mlx":
        piece = min(nbytes, RELAY_PIECE)
        return (ranks - 1) * link.latency_s + (nbytes + (ranks - 2) * piece) / link.bytes_per_s
    return link.latency_s + (ranks - 1) * nbytes / link.bytes_per_s


@dataclass(frozen=True)
class Exchange:
    """The time of one step's gradient exchange over ``ranks`` ranks."""

    ranks: int
    link: str
    nbytes: int  # gradient bytes on the wire
    buckets: int
    chain_s: float
    broadcast_s: float

    @property
    def total_s(self) -> float:
        return self.chain_s + self.broadcast_s


def exchange(
    buckets: Sequence[int],
    ranks: int,
    link: Link,
    adds: int = 0,
    memory_rate: float | None = None,
    overlap: bool = False,
) -> Exchange:
    """The chain sum and the broadcast of ``buckets`` (bytes each) over ``ranks`` ranks on ``link``, each
    rank past 0 adding ``adds`` buffers per bucket at ``memory_rate`` bytes/s (``chain_s``)."""
    _check(isinstance(ranks, int) and ranks >= 1, f"ranks must be an integer >= 1, not {ranks!r}")
    _check(len(buckets) > 0 and all(b > 0 for b in buckets), "buckets must be a non-empty list of sizes > 0")
    return Exchange(
        ranks,
        link.name,
        int(sum(buckets)),
        len(buckets),
        chain_s(buckets, ranks, link, adds, memory_rate, overlap),
        broadcast_s(sum(buckets), ranks, link),
    )


# -- the step and the speed-up --


@dataclass(frozen=True)
class Scaling:
    """A step of N ranks x accumulation k against one Mac running the same global batch."""

    ranks: int
    accum: int  # sequences per rank per step
    sequence_s: float  # one sequence's forward and backward
    update_s: float  # the optimizer update, the same on every rank
    exchange: Exchange

    @property
    def step_s(self) -> float:
        return self.accum * self.sequence_s + self.update_s + self.exchange.total_s

    @property
    def one_mac_s(self) -> float:
        return self.ranks * self.accum * self.sequence_s + self.update_s

    @property
    def speedup(self) -> float:
        return self.one_mac_s / self.step_s

    @property
    def exchange_share(self) -> float:
        return self.exchange.total_s / self.step_s


def _check_times(sequence_s: float, update_s: float) -> None:
    _check(math.isfinite(sequence_s) and sequence_s > 0, f"sequence time must be > 0 s, not {sequence_s!r}")
    _check(math.isfinite(update_s) and update_s >= 0, f"update time must be >= 0 s, not {update_s!r}")


def scaling(
    ranks: int,
    accum: int,
    sequence_s: float,
    buckets: Sequence[int],
    link: Link,
    update_s: float = 0.0,
    memory_rate: float | None = None,
    overlap: bool = False,
) -> Scaling:
    """The step of ``ranks`` ranks, each running ``accum`` sequences of ``sequence_s`` seconds and adding
    its ``accum`` gradient buffers into the received total at ``memory_rate`` bytes/s (None: not priced)."""
    _check(isinstance(accum, int) and accum >= 1, f"accumulation must be an integer >= 1, not {accum!r}")
    _check_times(sequence_s, update_s)
    _check(memory_rate is None or memory_rate > 0, f"memory rate must be > 0 bytes/s, not {memory_rate!r}")
    x = exchange(buckets, ranks, link, accum, memory_rate, overlap)
    return Scaling(ranks, accum, sequence_s, update_s, x)


MAX_ACCUM = 1 << 20  # the largest accumulation per rank accum_to_hide looks at


def accum_to_hide(
    ranks: int,
    sequence_s: float,
    buckets: Sequence[int],
    link: Link,
    update_s: float = 0.0,
    memory_rate: float | None = None,
    share: float = HIDDEN,
    overlap: bool = False,
) -> int | None:
    """The least accumulation per rank k whose exchange is at most ``share`` of the step,
    X(k) <= share (k t + u + X(k)); None when no k up to ``MAX_ACCUM`` does (the adds a rank makes per
    sequence cost more than ``share`` of a sequence)."""
    _check(0 < share < 1, f"share must be between 0 and 1, not {share!r}")

    def hidden(k: int) -> bool:
        s = scaling(ranks, k, sequence_s, buckets, link, update_s, memory_rate, overlap)
        return s.exchange.total_s <= share * s.step_s

    if hidden(1):
        return 1
    if not hidden(MAX_ACCUM):
        return None
    low, high = 1, MAX_ACCUM  # hidden(low) is false, hidden(high) true: the share falls as k grows
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if hidden(mid) else (mid, high)
    return high


def sequence_s(cfg: ModelConfig, chip: str, weights: str = "baked") -> float:
    """The predicted engine time of one sequence's forward and backward of ``cfg`` on ``chip`` (seconds;
    the engine part only, ``anekit.cost.step``)."""
    perf = performance(chip)
    params = fitted()
    return sum(k.calls * predict(k.work, perf, params).ms for k in step_kernels(cfg, weights)) / 1e3


def memory_rate(chip: str) -> float:
    """The rate the host CPU of ``chip`` streams fp32 operands at (bytes/s: ``anekit.cost.generation``'s
    host figure, measured on the M4 Max, a stand-in elsewhere, at most the device's DRAM bandwidth)."""
    return host_figures(performance(chip)).stream.value * 1e9


@dataclass(frozen=True)
class Row:
    """One line of ``plan``: N Macs on one link, the accumulation that hides the exchange, and the
    speed-up there (and at a chosen accumulation)."""

    ranks: int
    link: Link
    exchange: Exchange  # at the accumulation that hides it (or at ``accum`` when none does)
    hide: int | None  # the least accumulation per rank that hides the exchange
    at_hide: Scaling | None
    at_accum: Scaling | None  # at the accumulation asked for


def plan(
    buckets: Sequence[int],
    sequence_time: float,
    ranks: Sequence[int],
    links: Sequence[Link],
    *,
    memory: float | None = None,
    update_s: float = 0.0,
    accum: int | None = None,
    overlap: bool = False,
) -> list[Row]:
    """For every link and number of Macs: the exchange, the accumulation per rank that hides it and the
    speed-up there, and the speed-up at ``accum`` sequences per rank when it is given."""
    rows = []
    for ln in links:
        for n in ranks:

            def at(k: int, n: int = n, ln: Link = ln) -> Scaling:
                return scaling(n, k, sequence_time, buckets, ln, update_s, memory, overlap)

            hide = accum_to_hide(n, sequence_time, buckets, ln, update_s, memory, overlap=overlap)
            at_hide = None if hide is None else at(hide)
            at_accum = None if accum is None else at(accum)
            shown = at_hide or at_accum or at(1)
            rows.append(Row(n, ln, shown.exchange, hide, at_hide, at_accum))
    return rows


def plan_doc(rows: Sequence[Row], buckets: Sequence[int], sequence_time: float, memory: float | None) -> dict:
    """``plan``'s rows as JSON-ready data (``anekit cost --distributed --json``), each link with its
    sources."""

    def figure(f: Figure) -> dict:
        return {"value": f.value, "unit": f.unit, "status": f.status, "source": f.source,
                "observed": f.evidence.observed}  # fmt: skip

    links = {r.link.name: r.link for r in rows}
    return {
        "gradient_bytes": int(sum(buckets)),
        "buckets": len(buckets),
        "sequence_ms": sequence_time * 1e3,
        "memory_gb_per_s": None if memory is None else memory / 1e9,
        "hidden_share": HIDDEN,
        "rows": [
            {
                "link": r.link.name,
                "macs": r.ranks,
                "exchange_ms": r.exchange.total_s * 1e3,
                "chain_ms": r.exchange.chain_s * 1e3,
                "broadcast_ms": r.exchange.broadcast_s * 1e3,
                "accum_to_hide": r.hide,
                "speedup_at_hide": None if r.at_hide is None else r.at_hide.speedup,
                "accum": None if r.at_accum is None else r.at_accum.accum,
                "speedup_at_accum": None if r.at_accum is None else r.at_accum.speedup,
            }
            for r in rows
        ],
        "links": {
            name: {
                "label": ln.label,
                "engine": ln.engine,
                "rate": figure(ln.rate),
                "latency": figure(ln.latency),
            }
            for name, ln in links.items()
        },
    }
