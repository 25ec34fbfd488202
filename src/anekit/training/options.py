"""What a run is asked to do (``TrainOptions``: ``anekit train``'s flags) and how messages name it.

Messages name the options as the Python parameters (``resume=True``, ``steps=5``) by default, and as
``anekit train``'s flags (``--resume``, ``--steps 5``) while the command holds ``flag_names``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anekit.errors import AnekitError

INT32_MAX = 2**31 - 1  # the checkpoints' step counters are int32
DISTRIBUTED = ("mpi", "mlx")  # the transports a run can spread over (``anekit.training.distributed.open``)
WIRES = ("fp32", "fp16", "bf16")  # the gradient buckets' dtypes between ranks


@dataclass
class TrainOptions:
    """What a run is asked to do: ``anekit train``'s flags (None: the default, or the stored run's)."""

    out: Path = Path("out")
    config: str | None = None  # a preset name (default: "default")
    data: Path | None = None  # a directory of uint16 shards or a text file (default: the built-in corpus)
    tokenizer: Path | None = None  # sentencepiece .model or llama2.c tokenizer.bin (default: built in)
    steps: int | None = None
    accum: int | None = None
    lr: float | None = None
    seed: int | None = None
    weights: str | None = None  # "dynamic" (default) or "baked"
    backend: str | None = None  # default: the best available
    init: Path | None = None  # start from a llama2.c model, an anekit checkpoint or a Hugging Face model dir
    resume: bool = False
    force: bool = False
    checkpoint_every: int | None = None
    compile_budget: int | None = None
    numerics: dict[str, Any] = field(default_factory=dict)  # the simulator's chip / numerics / sanitize
    restarted: bool = False  # a re-executed process continuing after a compile-budget restart
    threads: int | None = None  # sequences run at once (default: every core, simulator and dynamic weights)
    route: str | None = None  # a training route's id (anekit.kernels.route.ROUTES; default: the chip's)
    # Data parallelism over processes (``anekit.training.distributed``): "mpi" or "mlx" (None: one process).
    # Under it ``accum`` counts this rank's sequences: the step's global batch is accum x world size.
    distributed: str | None = None
    peer_timeout: float | None = None  # seconds an exchange waits for a rank beyond its own work (default 60)
    wire: str = "fp32"  # the gradient buckets' dtype between ranks: "fp16" / "bf16" are not bit-exact


# How messages name the options: as the Python parameters (``resume=True``, ``steps=5``) by default, as
# ``anekit train``'s flags (``--resume``, ``--steps 5``) while the command runs (``flag_names``).
_FLAG_NAMES: contextvars.ContextVar[bool] = contextvars.ContextVar("anekit_train_flag_names", default=False)
SWITCHES = ("resume", "force")  # options that are on or off: a flag without a value
_UNSET: Any = object()


@contextlib.contextmanager
def flag_names() -> Iterator[None]:
    """While it is held, messages name the options as ``anekit train``'s flags (the command holds it)."""
    token = _FLAG_NAMES.set(True)
    try:
        yield
    finally:
        _FLAG_NAMES.reset(token)


def opt(name: str, value: Any = _UNSET) -> str:
    """An option as its caller wrote it: ``opt("steps", 5)`` is "steps=5" from Python and "--steps 5" from
    the command line; ``opt("resume")`` "resume=True" / "--resume"; ``opt("lora_alpha")`` "lora_alpha" /
    "--lora-alpha"."""
    if _FLAG_NAMES.get():
        flag = "--" + name.replace("_", "-")
        return flag if value is _UNSET else f"{flag} {value}"
    if value is _UNSET:
        return f"{name}=True" if name in SWITCHES else name
    return f"{name}={value}"


def check_distributed(options: TrainOptions) -> None:
    """The distributed options' values, before anything is opened: one line naming the option."""
    o = options
    if o.distributed is not None and o.distributed not in DISTRIBUTED:
        raise AnekitError(
            f"[train] {opt('distributed', o.distributed)}: expected one of {', '.join(DISTRIBUTED)}"
        )
    if o.wire not in WIRES:
        raise AnekitError(f"[train] {opt('wire', o.wire)}: expected one of {', '.join(WIRES)}")
    timeout = o.peer_timeout
    if timeout is None:
        pass
    elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
        raise AnekitError(f"[train] {opt('peer_timeout', timeout)}: expected seconds in (0, 86400]")
    if o.distributed is None and o.wire != "fp32":
        raise AnekitError(f"[train] {opt('wire', o.wire)} applies to a run over several processes "
                          f"({opt('distributed', 'mpi')} or mlx)")  # fmt: skip


def raise_contradiction(name: str, value: Any, kept: Any, where: Path) -> None:
    """A resume given an option that contradicts the stored run: one line naming it both ways."""
    raise AnekitError(
        f"[train] {opt('resume')}: {opt(name, value)} contradicts the run in {where} ({opt(name, kept)}); "
        f"drop it to continue that run, or start a new one with {opt('force')}"
    )
