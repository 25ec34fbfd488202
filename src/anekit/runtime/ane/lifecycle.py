"""One compiled ``_ANEInMemoryModel``: compile, load (building its request), evaluate, unload, release.

Lifecycle (all calls at QoS 21 with an empty options dictionary, as public working code does)::

    compile  +[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]
                 MIL text as NSData (mechramc/Orion docs/ane_constraints.md §9, rule
                 descriptor.mil-text-nsdata); weights always a dictionary, empty when there are none
                 (Orion §11, rule descriptor.empty-weights-dict), each file named by its bytes
                 (``anekit.runtime.ane.weights``, rule descriptor.hex-id-weights)
             +[_ANEInMemoryModel inMemoryModelWithDescriptor:]
             -[_ANEInMemoryModel hexStringIdentifier]; model.mil and every weight file are written to
                 NSTemporaryDirectory()/<hexStringIdentifier>/ first (maderix/ANE training/ane_runtime.h)
             -[_ANEInMemoryModel compileWithQoS:options:error:], no sooner than 15 s after the process's
                 last failed compile (``anekit.runtime.ane.pacing``, rule process.failed-compile-pause)
    load     room under the process's loaded-program ceiling (``anekit.runtime.ane.residency``: the least
             recently used model is unloaded first), -[_ANEInMemoryModel loadWithQoS:options:error:]
             (retried once after 0.1 s), then the request is built (``anekit.runtime.ane.request``;
             maderix/ANE training/ane_runtime.h builds it after load)
    run      reload first if the residency unloaded the model, or unload + load once the process's
             evaluations have completed another refresh interval (rule process.dual-die-throughput);
             then the backend's real-time variant (``anekit.runtime.ane.realtime``: the in-memory model
             handed to -[_ANEClient evaluateRealTimeWithModel:options:request:error:], or its ``model``
             property after beginRealTimeTask + loadRealTimeModel:options:qos:error:), else
             -[_ANEInMemoryModel evaluateWithQoS:options:request:error:]
    unload   real-time (model property) only: unloadRealTimeModel:options:qos:error: and endRealTimeTask;
             the request is released; -[_ANEInMemoryModel unloadWithQoS:error:]. Idempotent.
    close    unload if loaded, release every retained object, remove the temporary directory

Identical programs (the same text and the same weight bytes) get the same hexStringIdentifier and so
share one temporary directory; it is reference counted and removed when its last model is released. A
directory in use is never rewritten with other content (``TempDirs``).

Reloading after changing weight files changes nothing (maderix/ANE training/test_weight_reload.m,
training/m5result.md; rule weights.baked): new weights mean a new compile. What a load reads is the
compiled program the compiler left in the directory (net.plist and data: mechramc/Orion core/ane_runtime.m
``orion_program_patch_weights`` loads from them without compiling), which is why two programs must never
share a directory unless they are the same program.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import PurePosixPath

from anekit.errors import (
    AneRuntimeError,
    CompilationFailed,
    DescriptorCreationFailed,
    EvalFailed,
    LoadFailed,
    ModelCreationFailed,
    UnloadFailed,
)
from anekit.fileio import write_bytes_atomic
from anekit.runtime.ane import pacing, residency
from anekit.runtime.ane.api import (
    CLIENT_BEGIN_REALTIME,
    CLIENT_END_REALTIME,
    CLIENT_EVALUATE_REALTIME,
    CLIENT_LOAD_REALTIME,
    CLIENT_UNLOAD_REALTIME,
    DESCRIPTOR_WITH_MIL,
    MODEL_ANE_MODEL,
    MODEL_COMPILE,
    MODEL_EVALUATE,
    MODEL_HEX_ID,
    MODEL_LOAD,
    MODEL_PATH,
    MODEL_UNLOAD,
    MODEL_WITH_DESCRIPTOR,
    nil_check,
)
from anekit.runtime.ane.objc import Id, Message, ObjCRuntime
from anekit.runtime.ane.realtime import IN_MEMORY_MODEL, STANDARD, RealtimePaths
from anekit.runtime.ane.request import build_request
from anekit.runtime.ane.surfaces import AneSurface

LOAD_ATTEMPTS = 2
LOAD_RETRY_DELAY = 0.1  # seconds between load attempts


class TempDirs:
    """Reference counts of model directories: identical programs share one hexStringIdentifier.

    Each directory also records the digest of the content (MIL text and weight files) its users
    compiled; a program with other content that gets the same identifier would rewrite a live kernel's
    compiled files, so ``acquire`` refuses it (rule descriptor.hex-id-weights; ``check_content``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[str, int] = {}
        self._content: dict[str, str] = {}
        self.check_content = True

    def acquire(self, path: str, content: str = "", what: str = "[ane]") -> str:
        with self._lock:
            held = self._content.get(path)
            if self.check_content and self._users.get(path) and held is not None and held != content:
                raise CompilationFailed(
                    f"{what}: {path} is the directory of a loaded program with other weights or text (rule "
                    "descriptor.hex-id-weights: the identifier follows the MIL text and the weight names); "
                    "compiling here would make that program run these weights on its next load"
                )
            self._users[path] = self._users.get(path, 0) + 1
            self._content[path] = content
        return path

    def release(self, path: str) -> None:
        with self._lock:
            left = self._users.get(path, 0) - 1
            if left > 0:
                self._users[path] = left
                return
            self._users.pop(path, None)
            self._content.pop(path, None)
        shutil.rmtree(path, ignore_errors=True)


def content_digest(mil_text: str, files: dict[str, bytes]) -> str:
    """The sha256 of a program's MIL text and weight files (names and bytes)."""
    digest = hashlib.sha256(mil_text.encode("utf-8"))
    for rel, blob in sorted(files.items()):
        digest.update(b"\0" + rel.encode() + b"\0" + len(blob).to_bytes(8, "little") + blob)
    return digest.hexdigest()


TEMP_DIRS = TempDirs()


class EngineModel:
    """A compiled _ANEInMemoryModel, its request while loaded, and its temporary directory.

    Holds one reference to every object it retains and none to its kernel, so the kernel's finalizer
    can close it. ``lock`` is its kernel's lock (re-entrant): everything that loads, runs or unloads the
    model holds it, the residency included when it unloads the model to make room.

    ``paths``: the backend's real-time variants when real-time evaluation was asked for
    (``anekit.runtime.ane.realtime``), with ``client`` the _ANEClient; ``realtime`` is True while the
    real-time model of the ``model-property`` variant is loaded, ``realtime_failure`` says why this model
    stays on the standard call. ``loaded_epoch``: the residency's refresh epoch at the last load.
    """

    def __init__(
        self,
        rt: ObjCRuntime,
        name: str,
        qos: int,
        client: Id | None = None,
        paths: RealtimePaths | None = None,
    ) -> None:
        self.rt = rt
        self.name = name
        self.qos = qos
        self.client = client
        self.paths = paths if client is not None else None
        self.lock = threading.RLock()
        self.model: Id | None = None
        self.ane_model: Id | None = None  # -[_ANEInMemoryModel model], for the model-property variant
        self.options: Id | None = None
        self.request: Id | None = None
        self.tmpdir: str | None = None
        self.inputs: list[AneSurface] = []  # in binding order
        self.outputs: list[AneSurface] = []
        # Further input sets (``Kernel.input_set``), each in binding order, with the request each load builds
        # for it beside the model's own (maderix/ANE training_dynamic/train.m: one request per layer).
        self.input_sets: list[list[AneSurface]] = []
        self.set_requests: list[Id | None] = []
        self._evaluating: int | None = None  # the input set of the evaluation in progress (None: inputs)
        self.loaded = False
        self.loaded_epoch = 0
        self.realtime = False
        self.realtime_failure: str | None = None
        self.realtime_variant: str | None = None  # the variant this model last evaluated with
        self.closed = False

    def _what(self, message: Message | str) -> str:
        return f"[ane] kernel '{self.name}': {message}"

    # -- compile -----------------------------------------------------------------------------------

    def compile(self, mil_text: str, files: dict[str, bytes]) -> None:
        rt = self.rt
        with rt.autorelease_pool():
            mil = rt.data(mil_text.encode("utf-8"))  # NSData, never NSString (Orion §9)
            weights = rt.dictionary(  # a dictionary even when empty, never nil (Orion §11)
                {MODEL_PATH + rel: {"offset": 0, "data": blob} for rel, blob in files.items()}
            )
            desc = rt.send(DESCRIPTOR_WITH_MIL, mil, weights, None)
            nil_check(desc, DescriptorCreationFailed, self._what(DESCRIPTOR_WITH_MIL))
            model = rt.send(MODEL_WITH_DESCRIPTOR, desc)
            self.model = rt.retain(nil_check(model, ModelCreationFailed, self._what(MODEL_WITH_DESCRIPTOR)))
            self.options = rt.retain(rt.dictionary({}))
            hex_id = rt.to_str(rt.send(MODEL_HEX_ID, to=self.model))
            if not hex_id or "/" in hex_id or hex_id.startswith("."):
                raise ModelCreationFailed(f"{self._what(MODEL_HEX_ID)} returned {hex_id!r}")
            self.tmpdir = TEMP_DIRS.acquire(
                os.path.join(rt.temporary_directory(), hex_id),
                content_digest(mil_text, files),
                self._what(MODEL_HEX_ID),
            )
            os.makedirs(os.path.join(self.tmpdir, "weights"), exist_ok=True)
            write_bytes_atomic(os.path.join(self.tmpdir, "model.mil"), mil_text.encode("utf-8"))
            for rel, blob in files.items():
                write_bytes_atomic(os.path.join(self.tmpdir, *PurePosixPath(rel).parts), blob)
            pacing.PACER.before_compile()  # after a failed compile, the service restarts first
            try:
                rt.send_checked(
                    MODEL_COMPILE,
                    self.qos,
                    self.options,
                    to=self.model,
                    fails=CompilationFailed,
                    what=self._what(MODEL_COMPILE),
                )
            except CompilationFailed:
                pacing.PACER.failed()  # rule process.failed-compile-pause
                raise

    def bind(self, inputs: Sequence[AneSurface], outputs: Sequence[AneSurface]) -> None:
        """The surfaces every request of this model binds, in binding order."""
        self.inputs, self.outputs = list(inputs), list(outputs)

    def bind_set(self, inputs: Sequence[AneSurface]) -> int:
        """A further input set (binding order) evaluated with the model's outputs: its index for
        ``evaluate``. Its request is built by every load, as the model's own is (rule
        process.request-per-load); now too, if the model is loaded."""
        with self.lock:
            self.input_sets.append(list(inputs))
            self.set_requests.append(None)
            index = len(self.input_sets) - 1
            if self.loaded:
                self.set_requests[index] = self._build_set_request(index)
            return index

    def _build_set_request(self, index: int) -> Id:
        what = self._what(f"request of input set {index}")
        return build_request(self.rt, self.input_sets[index], self.outputs, what)

    def _release_set_requests(self) -> None:
        for i, request in enumerate(self.set_requests):
            self.set_requests[i] = None
            self.rt.release(request)

    @property
    def active_request(self) -> Id | None:
        """The request of the evaluation in progress: the model's, or its input set's."""
        return self.request if self._evaluating is None else self.set_requests[self._evaluating]

    # -- load / unload -----------------------------------------------------------------------------

    def load(self) -> None:
        """Make room under the process's loaded-program ceiling, load, and build this load's request."""
        with self.lock:
            residency.RESIDENCY.make_room(self)
            for attempt in range(LOAD_ATTEMPTS):
                try:
                    with self.rt.autorelease_pool():
                        self.rt.send_checked(
                            MODEL_LOAD,
                            self.qos,
                            self.options,
                            to=self.model,
                            fails=LoadFailed,
                            what=self._what(MODEL_LOAD),
                        )
                    self.loaded = True
                    break
                except LoadFailed:
                    if attempt + 1 == LOAD_ATTEMPTS:
                        raise
                    time.sleep(LOAD_RETRY_DELAY)
            residency.RESIDENCY.entered(self)
            self.loaded_epoch = residency.RESIDENCY.epoch
            try:
                self.request = build_request(self.rt, self.inputs, self.outputs, self._what("request"))
                for index in range(len(self.input_sets)):
                    self.set_requests[index] = self._build_set_request(index)
            except BaseException:
                self.unload()
                raise

    def unload(self) -> None:
        """Real-time unload and end of task, release the request, unload. Idempotent."""
        with self.lock:
            if not self.loaded:
                return
            try:
                if self.realtime:
                    self._unload_realtime()
            finally:
                request, self.request = self.request, None
                self.rt.release(request)
                self._release_set_requests()
                residency.RESIDENCY.left(self)
                with self.rt.autorelease_pool():
                    self.rt.send_checked(
                        MODEL_UNLOAD,
                        self.qos,
                        to=self.model,
                        fails=UnloadFailed,
                        what=self._what(MODEL_UNLOAD),
                    )
                self.loaded = False

    def evict(self) -> None:
        """Unloaded to make room for another program (its kernel reloads it before its next run)."""
        self.unload()

    def ready(self) -> None:
        """Before an evaluation: reload after an eviction, and refresh (unload + load) once the process's
        evaluations have completed another refresh interval since this model's last load."""
        if not self.loaded:
            self.load()
        elif self.loaded_epoch < residency.RESIDENCY.epoch:
            self.unload()
            self.load()
            residency.RESIDENCY.refreshes += 1

    # -- evaluate ----------------------------------------------------------------------------------

    def evaluate(self, input_set: int | None = None) -> None:
        """One evaluation (on input set ``input_set``, from ``bind_set``; None: the model's own inputs): the
        real-time variant of the backend when one works, else the standard call."""
        with self.lock:
            self.ready()
            failed: list[str] = []
            self._evaluating = input_set
            try:
                if not self._evaluate_realtime(failed):
                    self._evaluate_standard()
                    if failed and self.paths is not None:
                        self.paths.standard_worked()
            except EvalFailed:
                if failed and self.paths is not None:  # the program fails every way: not the variants' fault
                    self.paths.forgive(failed)
                raise
            finally:
                self._evaluating = None
                residency.RESIDENCY.evaluated(self)

    def _evaluate_standard(self) -> None:
        with self.rt.autorelease_pool():
            self.rt.send_checked(
                MODEL_EVALUATE,
                self.qos,
                self.options,
                self.active_request,
                to=self.model,
                fails=EvalFailed,
                what=self._what(MODEL_EVALUATE),
            )
        self.realtime_variant = STANDARD

    def _evaluate_realtime(self, failed: list[str]) -> bool:
        """Evaluate with the backend's current real-time variant, falling to the next on failure (each
        appended to ``failed``); False when this evaluation is left to the standard call."""
        paths = self.paths
        while paths is not None and self.realtime_failure is None:
            variant = paths.current()
            if variant == STANDARD:
                return False
            try:
                if variant == IN_MEMORY_MODEL:
                    self._send_realtime(self.model)
                else:
                    if not self.realtime:
                        self._load_realtime()
                    self._send_realtime(self.ane_model)
            except (EvalFailed, LoadFailed) as e:
                if paths.chosen == variant:  # it works for the process: only this model gives it up
                    self.realtime_failure = str(e)
                    return False
                paths.failed(variant, str(e).splitlines()[0])
                failed.append(variant)
                continue
            paths.worked(variant)
            self.realtime_variant = variant
            return True
        return False

    def _send_realtime(self, model: Id | None) -> None:
        with self.rt.autorelease_pool():
            self.rt.send_checked(
                CLIENT_EVALUATE_REALTIME,
                model,
                self.options,
                self.active_request,
                to=self.client,
                fails=EvalFailed,
                what=self._what(CLIENT_EVALUATE_REALTIME),
            )

    def _load_realtime(self) -> None:
        """The model-property variant's load: beginRealTimeTask + loadRealTimeModel: with the model's
        ``model`` property; on failure (an NSError, or NO without one) endRealTimeTask and LoadFailed."""
        rt, client = self.rt, self.client
        with rt.autorelease_pool():
            if self.ane_model is None:
                ane_model = rt.send(MODEL_ANE_MODEL, to=self.model)
                if not ane_model:
                    raise LoadFailed(f"{self._what(MODEL_ANE_MODEL)} returned nil")
                self.ane_model = rt.retain(ane_model)
            rt.send(CLIENT_BEGIN_REALTIME, to=client)  # its NO is no failure (maderix/ANE 99ba013)
            try:
                rt.send_checked(
                    CLIENT_LOAD_REALTIME,
                    self.ane_model,
                    self.options,
                    self.qos,
                    to=client,
                    fails=LoadFailed,
                    what=self._what(CLIENT_LOAD_REALTIME),
                )
            except LoadFailed:
                rt.send(CLIENT_END_REALTIME, to=client)
                raise
        self.realtime = True

    def _unload_realtime(self) -> None:
        rt, client = self.rt, self.client
        self.realtime = False
        with rt.autorelease_pool():
            try:
                rt.send_checked(
                    CLIENT_UNLOAD_REALTIME,
                    self.ane_model,
                    self.options,
                    self.qos,
                    to=client,
                    fails=UnloadFailed,
                    what=self._what(CLIENT_UNLOAD_REALTIME),
                )
            finally:
                rt.send(CLIENT_END_REALTIME, to=client)

    # -- release -----------------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.loaded:
                try:
                    self.unload()
                except AneRuntimeError:
                    self.loaded = False  # released below either way; nothing else can be done
        finally:
            self._release_set_requests()
            for obj in (self.request, self.ane_model, self.options, self.model):
                self.rt.release(obj)
            self.request = self.ane_model = self.options = self.model = None
            self.inputs, self.outputs, self.input_sets, self.set_requests = [], [], [], []
            if self.tmpdir is not None:
                TEMP_DIRS.release(self.tmpdir)
                self.tmpdir = None
