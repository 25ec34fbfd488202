"""Chaining kernels (empirical law 7, ``_ANEChainingRequest``): opt-in, with a sequential fallback.

``AneBackend(chaining=True)`` and ``backend.chain(kernels)``. Public reports say chaining fails on
current systems: in-memory models do not implement ``-getUUID``, which ``prepareChainingWithModel:``
calls (an Objective-C exception, so anekit checks first and never sends it), and otherwise
``prepareChainingWithModel:`` answers "ANEProgramChainingPrepare() Failed" (code 15), which reports put
down to a private entitlement or to models not built for chaining. Nothing past that point has been
seen to work. Every failure is detected, recorded in ``chain.failure``, and the chain runs its kernels
sequentially (copying linked outputs to inputs). If preparation ever succeeds, the first chained run
is checked against a sequential run of the same inputs and used only if the outputs are identical.
The chaining buffers list surfaces in binding order (alphabetical by MIL name), like the request.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from anekit.errors import AneRuntimeError, EvalFailed, LoadFailed
from anekit.runtime.ane.api import (
    BUFFER,
    CHAINING,
    CHAINING_REQUEST,
    CHAINING_VALIDATE,
    CLIENT_BUFFERS_READY,
    CLIENT_ENQUEUE_SETS,
    CLIENT_PREPARE_CHAINING,
    CLIENT_SHARED,
    INPUT_BUFFERS_READY,
    MODEL_UUID,
    OUTPUT_SET_ENQUEUE,
    OUTPUT_SETS,
    SURFACE_OBJECT,
    first_missing,
    nil_check,
)
from anekit.runtime.ane.kernel import AneKernel
from anekit.runtime.ane.objc import Id, ObjCRuntime
from anekit.runtime.ane.surfaces import AneSurface, copy_surface
from anekit.runtime.base import Kernel, Surface

STATS_SURFACE_BYTES = 64  # the statistics surface a chaining output set needs (reported sufficient)


class ChainingBackend(Protocol):
    """What a chain needs of its backend (``AneBackend``): the objc runtime, and whether chaining was asked
    for."""

    runtime: ObjCRuntime
    chaining: bool


class ChainState:
    """The native objects a prepared chain keeps: retained requests and statistics surfaces."""

    def __init__(self, rt: ObjCRuntime) -> None:
        self.rt = rt
        self.objects: list[Id] = []
        self.surfaces: list[int] = []

    def keep(self, obj: Id) -> Id:
        self.objects.append(self.rt.retain(obj))
        return obj

    def close(self) -> None:
        objects, self.objects = self.objects, []
        surfaces, self.surfaces = self.surfaces, []
        for obj in objects:
            self.rt.release(obj)
        for ref in surfaces:
            self.rt.cf_release(ref)


class Chain:
    """Kernels run one after another; each link (output surface, later input surface) carries data.

    ``links`` defaults to: output j of each kernel feeds input j of the next (as many as both have).
    ``run()`` runs every stage. Sequentially (the default, and the fallback) each stage runs and its
    linked outputs are copied into the later inputs. With ``AneBackend(chaining=True)`` the first run
    tries to prepare an ``_ANEChainingRequest`` per stage, in which a linked input is the source
    surface itself; ``chained`` says whether the engine runs the chain, ``failure`` why not. In chained
    mode a linked input surface of a later kernel is not written: the engine reads the source.
    """

    def __init__(
        self,
        backend: ChainingBackend,
        kernels: Sequence[Kernel],
        links: Sequence[tuple[Surface, Surface]] | None,
    ) -> None:
        if not kernels:
            raise AneRuntimeError("[chain] a chain needs at least one kernel")
        self.backend = backend
        self.kernels = list(kernels)
        self.links = self._resolve(links)
        self.chained = False
        self.failure: str | None = None if backend.chaining else "chaining was not requested"
        self._attempted = not backend.chaining
        self._verified = False
        self._client: Id | None = None
        self._state = ChainState(backend.runtime)
        self._finalizer = weakref.finalize(self, ChainState.close, self._state)

    def _stage_of(self, surface: Surface, kind: str) -> int:
        for i, k in enumerate(self.kernels):
            if any(s is surface for s in (k.outputs if kind == "output" else k.inputs)):
                return i
        raise AneRuntimeError(f"[chain] {surface!r} is not an {kind} of a kernel in the chain")

    def _resolve(
        self, links: Sequence[tuple[Surface, Surface]] | None
    ) -> list[tuple[int, Surface, int, Surface]]:
        if links is None:
            links = [
                (a.outputs[j], b.inputs[j])
                for a, b in zip(self.kernels, self.kernels[1:])
                for j in range(min(len(a.outputs), len(b.inputs)))
            ]
        resolved = []
        for src, dst in links:
            s, d = self._stage_of(src, "output"), self._stage_of(dst, "input")
            if d <= s:
                raise AneRuntimeError(f"[chain] {src.name} -> {dst.name}: a link must go to a later kernel")
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise AneRuntimeError(
                    f"[chain] {src.name} ({src.dtype.name} {list(src.shape)}) cannot feed {dst.name} "
                    f"({dst.dtype.name} {list(dst.shape)})"
                )
            resolved.append((s, src, d, dst))
        return resolved

    def run(self) -> None:
        for k in self.kernels:
            if not k.is_loaded:
                raise LoadFailed(f"[chain] kernel '{k.name}' is not loaded")
        if not self._attempted:
            self._attempted = True
            self._attempt()
        if self.chained:
            try:
                if self._verified:
                    self._run_chained()
                else:
                    self._run_and_verify()
                return
            except AneRuntimeError as e:
                self._give_up(f"the chained run failed: {e}")
        self._run_sequential()

    def close(self) -> None:
        self._finalizer()

    # -- sequential -------------------------------------------------------------------------------

    def _run_sequential(self) -> None:
        for stage, k in enumerate(self.kernels):
            k.run()
            for s, src, _, dst in self.links:
                if s == stage:
                    copy_surface(src, dst)

    # -- chained ----------------------------------------------------------------------------------

    def _give_up(self, reason: str) -> None:
        self.chained = False
        self.failure = reason
        self._state.close()

    def _attempt(self) -> None:
        rt = self.backend.runtime
        if not all(isinstance(k, AneKernel) for k in self.kernels):
            return self._give_up("only kernels of the ane backend can be chained")
        missing = first_missing(rt, CHAINING)
        if missing is not None:
            return self._give_up(f"{missing} is not available ({rt.os_version})")
        if rt.missing(MODEL_UUID) is not None:
            return self._give_up(
                f"{MODEL_UUID} is not implemented ({rt.os_version}): {CLIENT_PREPARE_CHAINING} calls it "
                "and would raise an Objective-C exception, so in-memory models cannot be chained"
            )
        try:
            with rt.autorelease_pool():
                self._client = nil_check(rt.send(CLIENT_SHARED), EvalFailed, f"[chain] {CLIENT_SHARED}")
                for stage in range(len(self.kernels)):
                    self._prepare(stage)
        except AneRuntimeError as e:
            return self._give_up(str(e))
        self.chained = True

    def _feeding(self, stage: int, surface: Surface) -> Surface:
        for _, src, d, dst in self.links:
            if d == stage and dst is surface:
                return src
        return surface

    def _prepare(self, stage: int) -> None:
        rt, k = self.backend.runtime, self.kernels[stage]
        assert isinstance(k, AneKernel)
        what = f"[chain] stage {stage} ('{k.name}')"

        def buffer(surface: Surface, index: int, source: int) -> Id:
            assert isinstance(surface, AneSurface)
            obj = nil_check(rt.send(SURFACE_OBJECT, surface.ref), EvalFailed, f"{what}: {SURFACE_OBJECT}")
            return nil_check(rt.send(BUFFER, obj, rt.number(index), source), EvalFailed, f"{what}: {BUFFER}")

        ins = [buffer(self._feeding(stage, s), i, 0) for i, s in enumerate(k.engine_inputs)]
        outs = [buffer(s, j, 1) for j, s in enumerate(k.engine_outputs)]
        stats = rt.iosurface_create(STATS_SURFACE_BYTES)
        self._state.surfaces.append(stats)
        out_set = nil_check(rt.send(OUTPUT_SETS, stats, rt.array(outs)), EvalFailed, f"{what}: {OUTPUT_SETS}")
        zero = rt.number(0)
        request = rt.send(
            CHAINING_REQUEST,
            rt.array(ins),
            rt.array([out_set]),
            None,
            None,
            None,
            rt.array([]),
            zero,
            zero,
            zero,
        )
        self._state.keep(nil_check(request, EvalFailed, f"{what}: {CHAINING_REQUEST}"))
        if not rt.send(CHAINING_VALIDATE, to=request):
            raise EvalFailed(f"{what}: {CHAINING_VALIDATE} returned NO")
        engine = k._engine
        rt.send_checked(
            CLIENT_PREPARE_CHAINING,
            engine.model,
            engine.options,
            request,
            engine.qos,
            to=self._client,
            fails=EvalFailed,
            what=f"{what}: {CLIENT_PREPARE_CHAINING}",
        )

    def _run_chained(self) -> None:
        rt = self.backend.runtime
        with rt.autorelease_pool():
            for stage, k in enumerate(self.kernels):
                assert isinstance(k, AneKernel)
                engine, what = k._engine, f"[chain] stage {stage} ('{k.name}')"
                n = len(k.inputs)
                out_set = rt.send(OUTPUT_SET_ENQUEUE, 0, 0, 1, True, False)
                rt.send_checked(
                    CLIENT_ENQUEUE_SETS,
                    engine.model,
                    nil_check(out_set, EvalFailed, f"{what}: {OUTPUT_SET_ENQUEUE}"),
                    engine.options,
                    engine.qos,
                    to=self._client,
                    fails=EvalFailed,
                    what=f"{what}: {CLIENT_ENQUEUE_SETS}",
                )
                ready = rt.send(INPUT_BUFFERS_READY, 0, rt.array(list(range(n))), rt.array([0] * n), 0)
                rt.send_checked(
                    CLIENT_BUFFERS_READY,
                    engine.model,
                    nil_check(ready, EvalFailed, f"{what}: {INPUT_BUFFERS_READY}"),
                    engine.options,
                    engine.qos,
                    to=self._client,
                    fails=EvalFailed,
                    what=f"{what}: {CLIENT_BUFFERS_READY}",
                )
                k.host_copies()

    def _run_and_verify(self) -> None:
        """The first chained run, checked against a sequential run of the same inputs."""
        inputs = [s for k in self.kernels for s in k.inputs]
        outputs = [s for k in self.kernels for s in k.outputs]
        saved = [_snapshot(s) for s in inputs]
        self._run_chained()
        chained = [_snapshot(s) for s in outputs]
        for s, data in zip(inputs, saved):
            with s.view() as buf:
                buf[...] = data
        self._run_sequential()
        if any(a.tobytes() != _snapshot(s).tobytes() for a, s in zip(chained, outputs)):
            self._give_up("the chained run's outputs differ from a sequential run's; running sequentially")
        else:
            self._verified = True


def _snapshot(surface: Surface) -> np.ndarray:
    with surface.view() as buf:
        return buf.copy()
