"""What a run is given: a source (``RunSource``) says where the model, the data and the run's state come
from and go to; ``anekit.training.run.Run`` does the rest, the same for every source.

Two sources exist: ``anekit.training.blzt.BlztSource`` (a preset or an --init llama2.c model / anekit
checkpoint, corpus data, the run in a BLZT checkpoint) and ``anekit.hf.training.HFSource`` (a Hugging
Face model directory, examples in mlx-lm's formats, LoRA or full fine-tuning, the run in a safetensors
state file). A source reads and checks in ``prepare`` and writes nothing there; it writes only when the
run asks (``start_files``, ``write_checkpoint``, ``finish``).

A run over several ranks (``anekit.training.distributed.follow``) prepares its source on rank 0 alone; the
others are told what to read (``describe`` on rank 0, ``follower_options`` on theirs), prepare a fresh run
of it from their own inputs and receive rank 0's state (``state_arrays``, ``state_received``). A rank given
a source of another kind makes the described one (``source_of``: each kind registers its maker).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from anekit.kernels import ModelConfig
    from anekit.llama.params import Params
    from anekit.training.identity import FileIdentity
    from anekit.training.loop import Dataset
    from anekit.training.options import TrainOptions
    from anekit.training.state import TrainConfig, TrainState
    from anekit.training.trainable import Trainable

# A validation pass and how often it runs: (kernels, timer) -> loss, every N steps (and before the first,
# after the last; ``anekit.training.loop.train``).
Validation = tuple[Callable[[Any, Any], float], int]


class RunSource(Protocol):
    """Where a run's model, data and state come from and go to (see the module docstring)."""

    checkpoint_name: str  # the file in the output directory that holds the run (its state, its record)
    mode: str  # what is trained: "full" (every weight) or "lora" (adapters)
    kind: str  # the source's name in a run's description ("blzt", "hf")
    default_accum: int  # sequences a step (a rank's, in a run over several) when accum is not given

    # known once ``prepare`` returned:
    cfg: ModelConfig
    tc: TrainConfig
    state: TrainState
    tokenizer: Any  # encode / decode / vocab_size (the sampler's)
    resumed_wall: float  # wall seconds of the run before this process (a resume), else 0
    seen: FileIdentity | None  # the checkpoint's version when it was read (None: there was none)
    blas_threads: int | None  # BLAS threads per sequence, stored in the run record (None: not fixed yet)

    @property
    def dataset(self) -> Dataset:
        """The windows the loop trains on."""
        ...

    @property
    def marks(self) -> list[tuple[int, str]]:
        """(step, "budget" | "resume"): where the run restarted (drawn on its curve)."""
        ...

    @property
    def worlds(self) -> list[tuple[int, int]]:
        """(step, world size) of every start of the run, in the run record (appended to in place)."""
        ...

    @property
    def trainable(self) -> Trainable:
        """What the optimizer steps train."""
        ...

    def check_inputs(self, options: TrainOptions) -> None:
        """The options' paths and what does not apply to this source, before anything is opened."""

    def prepare(self, options: TrainOptions, out: Path, checkpoint: Path) -> None:
        """Read and check everything (the stored run when ``options.resume``); write nothing."""

    def title(self, out: Path) -> str:
        """The loss curve's title."""
        ...

    def start_files(self, out: Path) -> list[tuple[Path, bytes]]:
        """The files a new run writes beside its step-0 checkpoint (the tokenizer's)."""
        ...

    def write_checkpoint(self, path: Path, wall: float) -> list[Path]:
        """The run's state (and its record) in one atomic write to ``path``, ``wall`` its cumulative wall
        seconds, with the products kept current at every checkpoint; returns those it created."""
        ...

    def validation(self, log: Callable[[str], None] | None) -> Validation | None:
        """The validation the loop runs, or None."""
        ...

    def val_losses(self) -> dict[int, float] | None:
        """The validation losses for loss.csv's val_loss column (None: the run has none)."""
        ...

    def finish(self, out: Path, reason: str) -> None:
        """After the last checkpoint: write the run's product (``reason``: how the loop ended)."""

    def products(self, out: Path) -> list[Path]:
        """What the run made besides its checkpoint and curves (adapters, a model directory)."""
        ...

    def sample_weights(self) -> Params:
        """The weights to sample from after training (LoRA: the base with the adapters fused)."""
        ...

    def remove_new_out(self, out: Path) -> None:
        """Remove the output directory this run created, after a refusal before its first step."""

    # -- a run over several ranks -----------------------------------------------------------------------

    def identity(self) -> dict[str, str]:
        """What every rank must share besides the configs: the data's and tokenizer's sha256, the base
        model's, what is trained (the fingerprint's source fields)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Rank 0: what another rank needs to prepare this run from its own inputs (JSON)."""
        ...

    def follower_options(self, description: dict[str, Any], options: TrainOptions) -> TrainOptions:
        """A rank > 0: the options of a fresh run of rank 0's ``description``, this rank's own paths
        (``options``: its command line) first."""
        ...

    def state_arrays(self) -> list[np.ndarray]:
        """The tensors of the run's state (weights and moments of what is trained), in a fixed order."""
        ...

    def state_received(self) -> None:
        """After rank 0's ``state_arrays`` were received into this rank's (LoRA: the merged weights)."""


SourceMaker = Callable[[dict[str, Any]], RunSource]
_MAKERS: dict[str, SourceMaker] = {}


def register_source(kind: str, make: SourceMaker) -> None:
    """``make(description)`` gives a source of ``kind`` for a rank told to follow such a run."""
    _MAKERS[kind] = make


def source_of(description: dict[str, Any]) -> RunSource:
    """A fresh source of the kind rank 0's ``description`` names."""
    from anekit.training.distributed.transport import DistributedError

    kind = str(description.get("kind"))
    if kind not in _MAKERS:
        raise DistributedError(f"[train] rank 0 runs a {kind!r} run, which this rank cannot read (known: "
                               f"{', '.join(sorted(_MAKERS))})")  # fmt: skip
    return _MAKERS[kind](description)
