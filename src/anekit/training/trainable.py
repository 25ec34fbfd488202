"""What an optimizer step trains: the protocol the loop asks of it, and full training (every weight).

A trainable may also have ``apply_writing(state, tc, threads, write)``: the update, each changed tensor of
``params`` handed to ``write`` once updated, so the dynamic kernels keep the weights in their surfaces
without a pass of their own (``FullTrainable``)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from anekit.llama.params import Params
from anekit.llama.step import Gradients, unscale
from anekit.training.optimizer import WeightWriter, apply_adamw
from anekit.training.state import TrainConfig, TrainState


class Trainable(Protocol):
    """What an optimizer step changes: ``params`` (what the kernels and the CPU head read), the step's
    gradient container (``sink``), and the update (``apply``). Full training
    (``FullTrainable``) trains every weight, LoRA (``anekit.training.lora.LoraTrainable``) its adapters."""

    @property
    def params(self) -> Params:
        """The weights the kernels and the CPU head read."""
        ...

    def zero(self) -> None: ...

    def sink(self, kernels: Any) -> Any: ...

    def unscale(self, factor: float) -> bool: ...

    def apply(self, state: TrainState, tc: TrainConfig, threads: int = 1) -> None: ...


class FullTrainable:
    """What the training loop trains in a full run: every weight, with Adam moments in the state."""

    def __init__(self, state: TrainState) -> None:
        self.state = state
        self.params = state.params
        self.grads = state.params.zeros_like()
        self._fresh = False  # the total's contents are stale: the batch's first gradient is written over them

    def zero(self) -> None:
        """A new batch: its first sequence's gradients are written into the total, not added (``Gradients``'
        ``fresh``), so nothing is zeroed here."""
        self._fresh = True

    def sink(self, kernels: object) -> Gradients:
        fresh, self._fresh = self._fresh, False
        return Gradients(self.grads, kernels, fresh=fresh)  # type: ignore[arg-type]

    def worker_sink(self, kernels: object) -> Gradients:
        """A worker thread's buffer of one sequence's gradients (``Gradients``, accumulate False)."""
        return Gradients(self.params.zeros_like(), kernels, accumulate=False)  # type: ignore[arg-type]

    def add(self, sink: Gradients) -> None:
        fresh, self._fresh = self._fresh, False
        sink.add_to(self.grads, overwrite=fresh)

    def gradient_tensors(self) -> list[np.ndarray]:
        """The total's gradient tensors in ``Params.tensors`` order: what ranks exchange."""
        return [g for _, g in self.grads.tensors()]

    def add_tensor(self, sink: Gradients, index: int) -> None:
        """Tensor ``index`` of a worker's buffer added onto the total's (``add`` a tensor at a time)."""
        sink.add_tensor_to(self.grads, index)

    def unscale(self, factor: float) -> bool:
        return unscale(self.grads, factor)

    def apply(self, state: TrainState, tc: TrainConfig, threads: int = 1) -> None:
        apply_adamw(state, self.grads, tc, threads)

    def apply_writing(self, state: TrainState, tc: TrainConfig, threads: int, write: WeightWriter) -> None:
        """``apply``, each updated tensor handed to ``write`` as soon as it is updated (the dynamic kernels
        write it into their surfaces). A trainable without this method is applied with ``apply``, and
        the kernels stage its weights again before the next step."""
        apply_adamw(state, self.grads, tc, threads, write)
