"""A kernel of the engine: its IOSurface-backed surfaces and engine model, loaded / run / unloaded.

Threads: each kernel has its own lock (``AneKernel.lock``, re-entrant, shared with its engine model so
the residency takes it to unload a kernel that makes room for another) held for the whole of
``load``, ``run``, ``unload``, ``close`` and ``kernel(**arrays)``, so one kernel can be shared
between threads: calls on it are serialised, and its request is never rebuilt or released while an
evaluation is using it. Different kernels run concurrently (each owns its surfaces and request).
Surface reads and writes take the surface's own lock; writing a kernel's inputs from one thread while
another runs it is a data race the lock does not prevent — use ``kernel(**arrays)``, which holds the
kernel lock from the writes to the reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anekit.mil.ir import Function
from anekit.runtime.ane.binding import Layout
from anekit.runtime.ane.lifecycle import EngineModel
from anekit.runtime.ane.surfaces import AneSurface, copy_surface
from anekit.runtime.base import Backend, Kernel


class AneKernel(Kernel):
    """A kernel compiled for the engine: IOSurface-backed surfaces, and a request built on every load.

    ``inputs`` / ``outputs`` are in the program's order; ``engine_inputs`` / ``engine_outputs`` in the
    order the engine binds them (alphabetical by MIL name, ``anekit.runtime.ane.binding``).
    ``realtime_failure`` says why the real-time path (if asked for) is not used.
    """

    def __init__(self, backend: Backend, fn: Function, layout: Layout, engine: EngineModel) -> None:
        super().__init__(backend, fn)
        self.layout = layout
        self.lock = engine.lock  # one lock for the kernel and its engine model (the residency takes it too)
        self._engine = engine
        self._owned.append(engine)  # first: unloaded and released before its surfaces
        try:
            rt = engine.rt  # the backend's runtime, which the engine model was made on
            self.inputs = [
                self._own(AneSurface(rt, s.shape, s.dtype.name, s.name, layout.input_alloc))
                for s in self.inputs
            ]
            self.outputs = [
                self._own(AneSurface(rt, s.shape, s.dtype.name, s.name, layout.output_alloc))
                for s in self.outputs
            ]
            engine.bind(self.engine_inputs, self.engine_outputs)
        except BaseException:
            self.close()
            raise

    def _own(self, surface: AneSurface) -> AneSurface:
        self._owned.append(surface)
        return surface

    @property
    def engine_inputs(self) -> list[AneSurface]:
        """The input surfaces in the order the engine binds them."""
        return [self.inputs[i] for i in self.layout.inputs]  # type: ignore[misc]

    @property
    def engine_outputs(self) -> list[AneSurface]:
        """The computed output surfaces in the order the engine binds them."""
        return [self.outputs[j] for j in self.layout.outputs]  # type: ignore[misc]

    @property
    def realtime_failure(self) -> str | None:
        return self._engine.realtime_failure

    @property
    def realtime_variant(self) -> str | None:
        """The evaluation variant of the last run ("in-memory-model", "model-property", "standard")."""
        return self._engine.realtime_variant

    # -- the kernel lock around the lifecycle -------------------------------------------------------

    def load(self) -> AneKernel:
        with self.lock:
            super().load()
        return self

    def unload(self) -> None:
        with self.lock:
            super().unload()

    def close(self) -> None:
        with self.lock:
            super().close()

    def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
        with self.lock:
            return super().__call__(**arrays)

    # -- backend hooks ------------------------------------------------------------------------------

    def _load(self) -> None:
        self._engine.load()

    def _unload(self) -> None:
        self._engine.unload()

    def _new_input(self, like: Any) -> AneSurface:
        """An input set's surface: IOSurface-backed, of the kernel's input allocation size (one size for
        every input of an evaluation, rule surface.uniform-allocation)."""
        return self._own(AneSurface(self._engine.rt, like.shape, like.dtype.name, like.name,
                                    self.layout.input_alloc))  # fmt: skip

    def _added_input_set(self, surfaces: list[Any]) -> None:
        with self.lock:  # the engine model's sets are the kernel's, in the same order
            self._engine.bind_set([surfaces[i] for i in self.layout.inputs])

    def _run(self) -> None:
        # the model's own inputs, or an input set's (reloads first if the residency unloaded it, or a
        # refresh is due; each load builds every set's request)
        which = None if self._run_inputs is None else self.input_set_index(self._run_inputs)
        self._engine.evaluate(which)
        self.host_copies()

    def run(self, inputs: list[Any] | None = None) -> None:
        with self.lock:
            super().run(inputs)

    def evaluate(self, inputs: list[Any] | None = None) -> dict[str, np.ndarray]:
        with self.lock:
            return super().evaluate(inputs)

    def host_copies(self) -> None:
        """Fill the outputs that repeat an input or another output (never sent to the engine)."""
        for kind, src, dst in self.layout.host_copies:
            copy_surface(self.run_inputs[src] if kind == "input" else self.outputs[src], self.outputs[dst])
