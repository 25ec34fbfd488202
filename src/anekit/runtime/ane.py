"""The macOS backend: kernels compile, load and run on the Neural Engine through AppleNeuralEngine.framework.

The private framework is driven through ``anekit.runtime.objc`` (ctypes, no pyobjc). Every class and
selector used is declared below once, as data, and checked before first use: a missing one raises
ClassNotFound naming it and the macOS version, because the framework changes between releases.

Lifecycle (all calls at QoS 21 with an empty options dictionary, as public working code does)::

    compile  +[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]
                 MIL text as NSData; weights {"@model_path/weights/x.bin": {"offset": 0, "data": NSData}}
             +[_ANEInMemoryModel inMemoryModelWithDescriptor:]
             -[_ANEInMemoryModel hexStringIdentifier]; model.mil and every weight file are written to
                 NSTemporaryDirectory()/<hexStringIdentifier>/ (model.mil, weights/x.bin) first
             -[_ANEInMemoryModel compileWithQoS:options:error:]
             surfaces: IOSurfaceCreate; the request, once per kernel:
             +[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:
                 procedureIndex:] with arrays of +[_ANEIOSurfaceObject objectWithIOSurface:] and of
                 NSNumber indices; nil, nil, @0 for the rest
    load     -[_ANEInMemoryModel loadWithQoS:options:error:]   (retried once after 0.1 s)
    run      -[_ANEInMemoryModel evaluateWithQoS:options:request:error:], or with ``realtime=True``
             -[_ANEClient evaluateRealTimeWithModel:options:request:error:] on +[_ANEClient
             sharedConnection]; a failed real-time call falls back to the standard one, and the
             kernel then stays on the standard call (``kernel.realtime_failure`` says why)
    unload   -[_ANEInMemoryModel unloadWithQoS:error:]; idempotent; also on close and at garbage
             collection, which release every retained object and remove the temporary directory

Identical programs get the same hexStringIdentifier and so share one temporary directory; it is
reference counted and removed when its last kernel is released.

Surfaces are IOSurfaces (width = bytes-per-row = alloc size, height 1, 1 byte per element, pixel
format 0) behind the ``Surface`` API: reads hold a read-only IOSurface lock, writes and ``view()``
a read-write one, and the numpy arrays are views of the surface memory (zero-copy). The tensor is
packed row-major ([1, C, 1, S]: channel c at byte c * S * itemsize) at the start of the surface.

Constraints reported by people running this API on hardware, handled here (none of them has been
observed by this project, which had no Mac):

* minimum size — surfaces smaller than 49152 bytes were reported not to work; every surface is
  allocated at least MIN_SURFACE_BYTES (``_allocations``);
* alignment — M5 was reported to need 128-byte aligned surfaces; allocations are rounded up to
  SURFACE_ALIGNMENT (``_allocations``);
* ordering — with several inputs / outputs, surfaces were reported to need strictly ascending sizes
  for inputs and strictly descending for outputs, silently giving zeros otherwise. With
  ``io_order="size"`` (the default) the function handed to the engine declares its inputs sorted by
  size ascending and its outputs by size descending (a permutation of the signature; the kernel's
  ``inputs`` / ``outputs`` keep the program's order), the request binds surfaces in that order, and
  allocation sizes are padded to be strictly monotonic. ``io_order="declared"`` keeps the program's
  order. Outputs that are a function input, or that repeat another output, are not sent to the
  engine: they are copied on the host after each run (``_Layout``).

Chaining (law 7 of the empirical laws, ``_ANEChainingRequest``) is opt-in: ``AneBackend(chaining=True)``
and ``backend.chain(kernels)``. Public reports say it fails on current systems: in-memory models do
not implement ``-getUUID``, which ``prepareChainingWithModel:`` calls (an Objective-C exception, so
anekit checks first and never sends it), and otherwise ``prepareChainingWithModel:`` answers
"ANEProgramChainingPrepare() Failed" (code 15), which reports put down to a private entitlement or to
models not built for chaining. Nothing past that point has been seen to work. Every failure is
detected, recorded in ``chain.failure``, and the chain runs its kernels sequentially (copying linked
outputs to inputs). If preparation ever succeeds, the first chained run is checked against a
sequential run of the same inputs and used only if the outputs are identical.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from anekit.errors import (
    AnekitError,
    AneRuntimeError,
    BlobFormatError,
    ClassNotFound,
    CompilationFailed,
    DescriptorCreationFailed,
    EvalFailed,
    LoadFailed,
    ModelCreationFailed,
    SurfaceCreationFailed,
    UnloadFailed,
)
from anekit.fileio import write_bytes_atomic
from anekit.mil import types as T
from anekit.mil.ir import Block, Function, Program, Var
from anekit.mil.printer import print_program
from anekit.mil.values import BlobRef, Literal
from anekit.runtime.base import DEFAULT_COMPILE_BUDGET, Backend, Kernel, Surface, WeightSource
from anekit.runtime.objc import Id, Message, ObjCRuntime, msg

ANE_FRAMEWORK = "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine"
QOS = 21  # the quality-of-service class public working code passes to every call
MIN_SURFACE_BYTES = 49152  # reported minimum IOSurface size for engine I/O
SURFACE_ALIGNMENT = 128  # reported alignment requirement (M5); harmless on earlier chips
STATS_SURFACE_BYTES = 64  # the statistics surface a chaining output set needs (reported sufficient)
LOAD_ATTEMPTS = 2
LOAD_RETRY_DELAY = 0.1  # seconds between load attempts
MODEL_PATH = "@model_path/"
IO_ORDERS = ("size", "declared")

# -- the private API, declared once ----------------------------------------------------------------------

CLASSES = ("_ANEInMemoryModelDescriptor", "_ANEInMemoryModel", "_ANERequest", "_ANEIOSurfaceObject")

DESCRIPTOR_WITH_MIL = msg("+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]", "@ @ @ @")
MODEL_WITH_DESCRIPTOR = msg("+[_ANEInMemoryModel inMemoryModelWithDescriptor:]", "@ @")
MODEL_HEX_ID = msg("-[_ANEInMemoryModel hexStringIdentifier]", "@")
MODEL_COMPILE = msg("-[_ANEInMemoryModel compileWithQoS:options:error:]", "B I @ ^@")
MODEL_LOAD = msg("-[_ANEInMemoryModel loadWithQoS:options:error:]", "B I @ ^@")
MODEL_EVALUATE = msg("-[_ANEInMemoryModel evaluateWithQoS:options:request:error:]", "B I @ @ ^@")
MODEL_UNLOAD = msg("-[_ANEInMemoryModel unloadWithQoS:error:]", "B I ^@")
SURFACE_OBJECT = msg("+[_ANEIOSurfaceObject objectWithIOSurface:]", "@ ^v")
REQUEST = msg(
    "+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:"
    "procedureIndex:]",
    "@ @ @ @ @ @ @ @",
)
REQUIRED = (
    DESCRIPTOR_WITH_MIL,
    MODEL_WITH_DESCRIPTOR,
    MODEL_HEX_ID,
    MODEL_COMPILE,
    MODEL_LOAD,
    MODEL_EVALUATE,
    MODEL_UNLOAD,
    SURFACE_OBJECT,
    REQUEST,
)

CLIENT_SHARED = msg("+[_ANEClient sharedConnection]", "@")
CLIENT_EVALUATE_REALTIME = msg("-[_ANEClient evaluateRealTimeWithModel:options:request:error:]", "B @ @ @ ^@")
REALTIME = (CLIENT_SHARED, CLIENT_EVALUATE_REALTIME)

BUFFER = msg("+[_ANEBuffer bufferWithIOSurfaceObject:symbolIndex:source:]", "@ @ @ q")
OUTPUT_SETS = msg("+[_ANEIOSurfaceOutputSets objectWithstatsSurRef:outputBuffer:]", "@ ^v @")
CHAINING_REQUEST = msg(
    "+[_ANEChainingRequest chainingRequestWithInputs:outputSets:lbInputSymbolId:lbOutputSymbolId:"
    "procedureIndex:signalEvents:transactionHandle:fwEnqueueDelay:memoryPoolId:]",
    "@ @ @ @ @ @ @ @ @ @",
)
CHAINING_VALIDATE = msg("-[_ANEChainingRequest validate]", "B")
CLIENT_PREPARE_CHAINING = msg(
    "-[_ANEClient prepareChainingWithModel:options:chainingReq:qos:error:]", "B @ @ @ I ^@"
)
OUTPUT_SET_ENQUEUE = msg(
    "+[_ANEOutputSetEnqueue outputSetWithProcedureIndex:setIndex:signalValue:signalNotRequired:isOpenLoop:]",
    "@ I I Q B B",
)
INPUT_BUFFERS_READY = msg(
    "+[_ANEInputBuffersReady inputBuffersWithProcedureIndex:inputBufferInfoIndex:inputFreeValue:"
    "executionDelay:]",
    "@ I @ @ Q",
)
CLIENT_ENQUEUE_SETS = msg("-[_ANEClient enqueueSetsWithModel:outputSet:options:qos:error:]", "B @ @ @ I ^@")
CLIENT_BUFFERS_READY = msg(
    "-[_ANEClient buffersReadyWithModel:inputBuffers:options:qos:error:]", "B @ @ @ I ^@"
)
MODEL_UUID = msg("-[_ANEInMemoryModel getUUID]", "@")  # checked, never sent
CHAINING = (
    CLIENT_SHARED,
    BUFFER,
    OUTPUT_SETS,
    CHAINING_REQUEST,
    CHAINING_VALIDATE,
    CLIENT_PREPARE_CHAINING,
    OUTPUT_SET_ENQUEUE,
    INPUT_BUFFERS_READY,
    CLIENT_ENQUEUE_SETS,
    CLIENT_BUFFERS_READY,
)


def _first_missing(rt: ObjCRuntime, messages: Sequence[Message]) -> str | None:
    for m in messages:
        missing = rt.missing(m)
        if missing is not None:
            return missing
    return None


def _nil_check(obj: Id | None, fails: type[AneRuntimeError], what: str) -> Id:
    if not obj:
        raise fails(f"{what} returned nil")
    return obj


# -- availability ---------------------------------------------------------------------------------------


def _platform_supported() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def _native_runtime() -> ObjCRuntime:
    if not _platform_supported():
        raise ClassNotFound(
            f"[ane] the Neural Engine backend needs macOS on Apple silicon; this is {platform.system()} "
            f"{platform.machine()} — use the simulator (ANEKIT_BACKEND=sim)"
        )
    return ObjCRuntime()


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why this backend cannot run here, or None when it can: Darwin arm64, the framework loads and
    its four classes resolve. Never raises."""
    if not _platform_supported():
        return f"ane needs macOS on Apple silicon; this is {platform.system()} {platform.machine()}"
    try:
        rt = ObjCRuntime()
        rt.load_framework(ANE_FRAMEWORK)
        missing = [name for name in CLASSES if not rt.lookup_class(name)]
    except Exception as e:  # anything at all means "not available"
        return f"ane: {e}"
    if missing:
        return f"ane: class {', '.join(missing)} not found ({rt.os_version})"
    return None


def is_available() -> bool:
    """True on Darwin arm64 when the framework loads and its four classes resolve (never raises)."""
    return unavailable_reason() is None


@dataclass(frozen=True)
class AneProbe:
    """What ``anekit doctor`` reports about the engine: platform, framework, classes and selectors."""

    system: str
    machine: str
    os_version: str
    chip: str
    framework: str
    classes: dict[str, bool] = field(default_factory=dict)
    messages: dict[str, bool] = field(default_factory=dict)
    available: bool = False

    def lines(self) -> list[str]:
        out = [
            f"os:        {self.system} {self.machine} ({self.os_version})",
            f"chip:      {self.chip}",
            f"framework: {self.framework}",
        ]
        out += [f"class      {'found  ' if ok else 'MISSING'} {name}" for name, ok in self.classes.items()]
        out += [f"selector   {'found  ' if ok else 'MISSING'} {name}" for name, ok in self.messages.items()]
        out.append(f"ane backend available: {'yes' if self.available else 'no'}")
        return out


def _chip() -> str:
    if platform.system() == "Darwin":
        try:
            done = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def probe(runtime: ObjCRuntime | None = None) -> AneProbe:
    """Look for the framework, its classes and selectors (loads nothing off Darwin arm64 unless given one)."""
    base = {"system": platform.system(), "machine": platform.machine(), "chip": _chip()}
    if runtime is None and not _platform_supported():
        os_version = platform.mac_ver()[0] or f"{platform.system()} {platform.release()}"
        return AneProbe(os_version=os_version, framework="not tried (needs macOS on Apple silicon)", **base)
    try:
        rt = runtime if runtime is not None else ObjCRuntime()
        rt.load_framework(ANE_FRAMEWORK)
    except Exception as e:
        version = runtime.os_version if runtime is not None else platform.mac_ver()[0]
        return AneProbe(os_version=version, framework=f"did not load: {e}", **base)
    every = (*REQUIRED, *REALTIME, *CHAINING, MODEL_UUID)
    class_names = dict.fromkeys((*CLASSES, *(m.cls for m in every)))
    classes = {name: bool(rt.lookup_class(name)) for name in class_names}
    messages = {str(m): rt.missing(m) is None for m in dict.fromkeys(every)}
    available = all(classes[name] for name in CLASSES)
    return AneProbe(
        os_version=rt.os_version,
        framework=f"loaded {ANE_FRAMEWORK}",
        classes=classes,
        messages=messages,
        available=available,
        **base,
    )


# -- surfaces ---------------------------------------------------------------------------------------------


def _align(n: int) -> int:
    return -(-n // SURFACE_ALIGNMENT) * SURFACE_ALIGNMENT


def _allocations(nbytes: Sequence[int], ascending: bool) -> list[int]:
    """Allocation sizes for surfaces bound in this order: each at least MIN_SURFACE_BYTES, a multiple of
    SURFACE_ALIGNMENT, and strictly ascending (inputs) or strictly descending (outputs)."""
    sizes = [max(MIN_SURFACE_BYTES, _align(n)) for n in nbytes]
    if ascending:
        for i in range(1, len(sizes)):
            sizes[i] = max(sizes[i], sizes[i - 1] + SURFACE_ALIGNMENT)
    else:
        for i in range(len(sizes) - 2, -1, -1):
            sizes[i] = max(sizes[i], sizes[i + 1] + SURFACE_ALIGNMENT)
    return sizes


class _SurfaceLock:
    """The surface's mutex plus IOSurfaceLock / IOSurfaceUnlock; maps the memory as ``surface._data``."""

    def __init__(self, surface: AneSurface, mutex: threading.Lock, read_only: bool) -> None:
        self.surface = surface
        self.mutex = mutex
        self.read_only = read_only

    def __enter__(self) -> None:
        self.mutex.acquire()
        try:
            self.surface._map(self.read_only)
        except BaseException:
            self.mutex.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.surface._unmap(self.read_only)
        finally:
            self.mutex.release()


class AneSurface(Surface):
    """A Surface whose memory is an IOSurface: same API, numpy views of the surface under its lock.

    ``ref`` is the IOSurfaceRef, ``id`` its IOSurfaceGetID, ``nbytes`` the tensor's bytes and
    ``alloc_size`` the (larger) allocation. ``close()`` releases it; it cannot be used afterwards.
    """

    def __init__(
        self, runtime: ObjCRuntime, shape: tuple[int, ...], dtype: str, name: str, alloc_bytes: int
    ) -> None:
        super().__init__(shape, dtype, name)  # validates; its zero buffer is replaced below
        count = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        self._count = count
        self._nbytes = count * self.dtype.np.itemsize
        self._rt = runtime
        self.ref = runtime.iosurface_create(max(alloc_bytes, self._nbytes))
        self.alloc_size = int(runtime.call("IOSurfaceGetAllocSize", self.ref))
        self.id = int(runtime.call("IOSurfaceGetID", self.ref))
        mutex = threading.Lock()
        self._lock = _SurfaceLock(self, mutex, read_only=False)  # type: ignore[assignment]
        self._read_lock = _SurfaceLock(self, mutex, read_only=True)
        self._data = None  # type: ignore[assignment]  # mapped only while locked

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def _map(self, read_only: bool) -> None:
        if not self.ref:
            raise SurfaceCreationFailed(f"[surface] {self.name}: the IOSurface was released (kernel closed)")
        self._rt.iosurface_lock(self.ref, read_only)
        try:
            base = self._rt.call("IOSurfaceGetBaseAddress", self.ref)
            if not base:
                raise SurfaceCreationFailed(f"[surface] {self.name}: IOSurfaceGetBaseAddress returned NULL")
            memory = (ctypes.c_char * self._nbytes).from_address(base)
            data = np.frombuffer(memory, dtype=self.dtype.np, count=self._count).reshape(self.shape)
            if read_only:
                data.flags.writeable = False
            self._data = data
        except BaseException:
            self._rt.iosurface_unlock(self.ref, read_only)
            raise

    def _unmap(self, read_only: bool) -> None:
        self._data = None  # type: ignore[assignment]
        self._rt.iosurface_unlock(self.ref, read_only)

    def read(self, ch_offset: int = 0, channels: int | None = None) -> np.ndarray:
        """As ``Surface.read``, under a read-only IOSurface lock."""
        lo, hi = self._span(ch_offset, channels)
        with self._read_lock:
            rows = self._rows()[lo:hi]
            return rows.astype(np.float32) if self.dtype.is_float else rows.copy()

    def close(self) -> None:
        ref, self.ref = self.ref, 0
        self._rt.cf_release(ref)

    def __repr__(self) -> str:
        return (
            f"AneSurface(#{self.id} {self.name}: {self.dtype.name} {list(self.shape)}, {self.alloc_size} B)"
        )


def _copy_surface(src: Surface, dst: Surface) -> None:
    with src.view() as a:
        data = a.copy()
    with dst.view() as b:
        b[...] = data.reshape(b.shape)


# -- what the engine compiles ---------------------------------------------------------------------------


def _io_nbytes(v: Var) -> int:
    t = v.type
    if not isinstance(t, (T.TensorType, T.TensorBufferType)):
        raise CompilationFailed(
            f"[compile] '{v.name}' has type {t}; kernel inputs and outputs must be tensors"
        )
    if not all(isinstance(d, int) for d in t.shape):
        raise CompilationFailed(
            f"[compile] '{v.name}' has the symbolic shape {t}; kernels need static shapes"
        )
    count = 1
    for d in t.shape:
        count *= int(d)
    return count * t.dtype.np.itemsize


@dataclass(frozen=True)
class _Layout:
    """The function the engine compiles and how its I/O maps back to the program's.

    ``inputs[k]`` / ``outputs[k]`` are the program's input / output indices the engine's k-th input /
    output binds; ``host_copies`` are (source kind "input" | "output", source index, output index) for
    outputs filled on the host after each run; ``*_alloc`` the allocation size of every surface.
    """

    fn: Function
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    host_copies: tuple[tuple[str, int, int], ...]
    input_alloc: tuple[int, ...]
    output_alloc: tuple[int, ...]

    @classmethod
    def of(cls, fn: Function, io_order: str) -> _Layout:
        in_bytes = [_io_nbytes(v) for v in fn.inputs]
        out_bytes = [_io_nbytes(v) for v in fn.outputs]
        input_index = {v.name: i for i, v in enumerate(fn.inputs)}
        computed: list[int] = []
        first: dict[str, int] = {}
        copies = []
        for j, v in enumerate(fn.outputs):
            if v.name in input_index:
                copies.append(("input", input_index[v.name], j))
            elif v.name in first:
                copies.append(("output", first[v.name], j))
            else:
                first[v.name] = j
                computed.append(j)
        if not computed:
            raise CompilationFailed(
                f"[compile] every output of '{fn.name}' is an input or a repeated output; the engine needs "
                "at least one computed output"
            )
        inputs = list(range(len(fn.inputs)))
        if io_order == "size":
            inputs.sort(key=lambda i: (in_bytes[i], i))
            computed.sort(key=lambda j: (-out_bytes[j], j))
        block = Block(list(fn.ops), [fn.outputs[j] for j in computed])
        engine_fn = Function("main", [fn.inputs[i] for i in inputs], block, fn.opset, dict(fn.attributes))
        in_alloc = dict(zip(inputs, _allocations([in_bytes[i] for i in inputs], ascending=True)))
        out_alloc = dict(zip(computed, _allocations([out_bytes[j] for j in computed], ascending=False)))
        return cls(
            engine_fn,
            tuple(inputs),
            tuple(computed),
            tuple(copies),
            tuple(in_alloc[i] for i in range(len(fn.inputs))),
            tuple(out_alloc.get(j, max(MIN_SURFACE_BYTES, _align(n))) for j, n in enumerate(out_bytes)),
        )


def _weight_files(weights: dict[str, WeightSource]) -> dict[str, bytes]:
    """{path relative to the model directory ("weights/x.bin"): bytes} for the weights given."""
    files: dict[str, bytes] = {}
    for key, source in weights.items():
        rel = key.removeprefix(MODEL_PATH)
        parts = PurePosixPath(rel).parts
        if not rel or rel.startswith("/") or "\\" in rel or ".." in parts or rel == "model.mil":
            raise CompilationFailed(
                f"[compile] weight name '{key}' must be a path inside the model directory, like "
                "'@model_path/weights/w.bin'"
            )
        if rel in files:
            raise CompilationFailed(f"[compile] weight file '{MODEL_PATH}{rel}' is given twice")
        if isinstance(source, (bytes, bytearray, memoryview)):
            files[rel] = bytes(source)
        elif not Path(source).is_file():
            raise CompilationFailed(f"[compile] weight file '{key}' -> {source} does not exist")
        else:
            try:
                files[rel] = Path(source).read_bytes()
            except OSError as e:
                raise CompilationFailed(f"[compile] weight '{key}': cannot read {source}: {e}") from e
    return files


def _blob_literals(fn: Function) -> Iterator[tuple[str, Literal]]:
    """(const name, literal) for every BLOBFILE value of the function."""
    for op in fn.ops:
        val = op.attributes.get("val") if op.op_type == "const" else None
        if isinstance(val, Literal) and isinstance(val.value, BlobRef):
            yield op.outputs[0].name, val
        for key, arg in op.inputs.items():
            for item in arg if isinstance(arg, tuple) else (arg,):
                if isinstance(item, Literal) and isinstance(item.value, BlobRef):
                    yield f"{op.name}.{key}", item


def _check_weights(fn: Function, files: dict[str, bytes]) -> None:
    """Every BLOBFILE const has its file, and its blob fits the const's type: checked on the host,
    so the error names the const (the engine's own error would not)."""
    from anekit.blob import BlobFile

    opened: dict[str, Any] = {}
    try:
        for name, lit in _blob_literals(fn):
            ref = lit.value
            assert isinstance(ref, BlobRef) and isinstance(lit.type, T.TensorType)
            rel = ref.path.removeprefix(MODEL_PATH)
            if rel not in files:
                known = ", ".join(MODEL_PATH + k for k in sorted(files)) or "none"
                raise CompilationFailed(
                    f"[compile] const '{name}' refers to weight file '{ref.path}', which was not given "
                    f"(weights given: {known})"
                )
            try:
                blob = opened.get(rel) or opened.setdefault(rel, BlobFile(files[rel]))
                blob.read(ref.offset, shape=tuple(int(d) for d in lit.type.shape), dtype=lit.type.dtype.name)
            except BlobFormatError as e:
                raise CompilationFailed(
                    f"[compile] const '{name}' ({lit.type}) at offset {ref.offset} of '{ref.path}': {e}"
                ) from e
            except (AnekitError, OSError) as e:
                raise CompilationFailed(f"[compile] const '{name}': cannot open '{ref.path}': {e}") from e
    finally:
        for blob in opened.values():
            blob.close()


class _TempDirs:
    """Reference counts of model directories: identical programs share one hexStringIdentifier."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[str, int] = {}

    def acquire(self, path: str) -> str:
        with self._lock:
            self._users[path] = self._users.get(path, 0) + 1
        return path

    def release(self, path: str) -> None:
        with self._lock:
            left = self._users.get(path, 0) - 1
            if left > 0:
                self._users[path] = left
                return
            self._users.pop(path, None)
        shutil.rmtree(path, ignore_errors=True)


_TEMP_DIRS = _TempDirs()


# -- the compiled model ---------------------------------------------------------------------------------


class _EngineModel:
    """A compiled _ANEInMemoryModel with its request and temporary directory.

    Holds one reference to every object it retains and none to its kernel, so the kernel's finalizer
    can close it: unload if loaded, release, remove the directory. ``close`` is idempotent.
    """

    def __init__(self, rt: ObjCRuntime, name: str, qos: int) -> None:
        self.rt = rt
        self.name = name
        self.qos = qos
        self.model: Id | None = None
        self.options: Id | None = None
        self.request: Id | None = None
        self.tmpdir: str | None = None
        self.loaded = False
        self.closed = False

    def _what(self, message: Message) -> str:
        return f"[ane] kernel '{self.name}': {message}"

    def compile(self, mil_text: str, files: dict[str, bytes]) -> None:
        rt = self.rt
        with rt.autorelease_pool():
            mil = rt.data(mil_text.encode("utf-8"))
            weights = rt.dictionary(
                {MODEL_PATH + rel: {"offset": 0, "data": blob} for rel, blob in files.items()}
            )
            desc = rt.send(DESCRIPTOR_WITH_MIL, mil, weights, None)
            _nil_check(desc, DescriptorCreationFailed, self._what(DESCRIPTOR_WITH_MIL))
            model = rt.send(MODEL_WITH_DESCRIPTOR, desc)
            self.model = rt.retain(_nil_check(model, ModelCreationFailed, self._what(MODEL_WITH_DESCRIPTOR)))
            self.options = rt.retain(rt.dictionary({}))
            hex_id = rt.to_str(rt.send(MODEL_HEX_ID, to=self.model))
            if not hex_id or "/" in hex_id or hex_id.startswith("."):
                raise ModelCreationFailed(f"{self._what(MODEL_HEX_ID)} returned {hex_id!r}")
            self.tmpdir = _TEMP_DIRS.acquire(os.path.join(rt.temporary_directory(), hex_id))
            os.makedirs(os.path.join(self.tmpdir, "weights"), exist_ok=True)
            write_bytes_atomic(os.path.join(self.tmpdir, "model.mil"), mil_text.encode("utf-8"))
            for rel, blob in files.items():
                write_bytes_atomic(os.path.join(self.tmpdir, *PurePosixPath(rel).parts), blob)
            rt.send_checked(
                MODEL_COMPILE,
                self.qos,
                self.options,
                to=self.model,
                fails=CompilationFailed,
                what=self._what(MODEL_COMPILE),
            )

    def build_request(self, inputs: Sequence[AneSurface], outputs: Sequence[AneSurface]) -> None:
        rt = self.rt
        with rt.autorelease_pool():

            def wrap(s: AneSurface) -> Id:
                return _nil_check(
                    rt.send(SURFACE_OBJECT, s.ref), SurfaceCreationFailed, self._what(SURFACE_OBJECT)
                )

            ins, outs = [wrap(s) for s in inputs], [wrap(s) for s in outputs]
            request = rt.send(
                REQUEST,
                rt.array(ins),
                rt.array(list(range(len(ins)))),
                rt.array(outs),
                rt.array(list(range(len(outs)))),
                None,
                None,
                rt.number(0),
            )
            self.request = rt.retain(_nil_check(request, SurfaceCreationFailed, self._what(REQUEST)))

    def load(self) -> None:
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
                return
            except LoadFailed:
                if attempt + 1 == LOAD_ATTEMPTS:
                    raise
                time.sleep(LOAD_RETRY_DELAY)

    def evaluate(self) -> None:
        with self.rt.autorelease_pool():
            self.rt.send_checked(
                MODEL_EVALUATE,
                self.qos,
                self.options,
                self.request,
                to=self.model,
                fails=EvalFailed,
                what=self._what(MODEL_EVALUATE),
            )

    def evaluate_realtime(self, client: Id) -> None:
        with self.rt.autorelease_pool():
            self.rt.send_checked(
                CLIENT_EVALUATE_REALTIME,
                self.model,
                self.options,
                self.request,
                to=client,
                fails=EvalFailed,
                what=self._what(CLIENT_EVALUATE_REALTIME),
            )

    def unload(self) -> None:
        if self.loaded:
            with self.rt.autorelease_pool():
                self.rt.send_checked(
                    MODEL_UNLOAD, self.qos, to=self.model, fails=UnloadFailed, what=self._what(MODEL_UNLOAD)
                )
            self.loaded = False

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
            for obj in (self.request, self.options, self.model):
                self.rt.release(obj)
            self.request = self.options = self.model = None
            if self.tmpdir is not None:
                _TEMP_DIRS.release(self.tmpdir)
                self.tmpdir = None


# -- kernel and backend ---------------------------------------------------------------------------------


class AneKernel(Kernel):
    """A kernel compiled for the engine: IOSurface-backed surfaces and one request, reused every run."""

    def __init__(self, backend: AneBackend, fn: Function, layout: _Layout, engine: _EngineModel) -> None:
        super().__init__(backend, fn)
        self.layout = layout
        self._engine = engine
        self._owned.append(engine)  # first: unloaded and released before its surfaces
        self.realtime_failure: str | None = None
        self._client = backend._client if backend.realtime else None
        try:
            rt = backend.runtime
            self.inputs = [
                self._own(AneSurface(rt, s.shape, s.dtype.name, s.name, alloc))
                for s, alloc in zip(self.inputs, layout.input_alloc)
            ]
            self.outputs = [
                self._own(AneSurface(rt, s.shape, s.dtype.name, s.name, alloc))
                for s, alloc in zip(self.outputs, layout.output_alloc)
            ]
            engine.build_request(self.engine_inputs, self.engine_outputs)
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
        return [self.outputs[j] for j in self.layout.outputs]  # type: ignore[misc]

    def _load(self) -> None:
        self._engine.load()

    def _unload(self) -> None:
        self._engine.unload()

    def _run(self) -> None:
        if self._client is not None:
            try:
                self._engine.evaluate_realtime(self._client)
            except EvalFailed as e:
                self.realtime_failure = str(e)
                self._client = None  # stay on the standard call from now on
                self._engine.evaluate()
        else:
            self._engine.evaluate()
        self._host_copies()

    def _host_copies(self) -> None:
        for kind, src, dst in self.layout.host_copies:
            _copy_surface(self.inputs[src] if kind == "input" else self.outputs[src], self.outputs[dst])


class AneBackend(Backend):
    """Compiles MIL for the Neural Engine and runs it there (macOS on Apple silicon).

    ``runtime``: the objc runtime to drive (default: the system's; tests pass a fake). ``realtime``:
    evaluate through ``_ANEClient``'s real-time call where it exists. ``chaining``: let ``chain()``
    try ``_ANEChainingRequest``. ``io_order``: "size" or "declared" (see the module docstring).
    """

    name = "ane"

    def __init__(
        self,
        compile_budget: int = DEFAULT_COMPILE_BUDGET,
        *,
        runtime: ObjCRuntime | None = None,
        qos: int = QOS,
        realtime: bool = False,
        chaining: bool = False,
        io_order: str = "size",
    ) -> None:
        if io_order not in IO_ORDERS:
            raise ValueError(f"io_order must be one of {IO_ORDERS}, not {io_order!r}")
        super().__init__(compile_budget)
        self.runtime = runtime if runtime is not None else _native_runtime()
        self.runtime.load_framework(ANE_FRAMEWORK)
        for message in REQUIRED:
            self.runtime.bind(message)
        self.qos = qos
        self.io_order = io_order
        self.chaining = chaining
        self.realtime = False
        self.realtime_unavailable: str | None = None
        self._client: Id | None = None
        if realtime:
            missing = _first_missing(self.runtime, REALTIME)
            if missing is not None:
                self.realtime_unavailable = f"{missing} is not available ({self.runtime.os_version})"
            else:
                with self.runtime.autorelease_pool():
                    self._client = self.runtime.send(CLIENT_SHARED)  # a process-wide singleton
                self.realtime = self._client is not None
                if not self.realtime:
                    self.realtime_unavailable = f"{CLIENT_SHARED} returned nil"

    def _compile(self, prog: Program, fn: Function, weights: dict[str, WeightSource]) -> Kernel:
        layout = _Layout.of(fn, self.io_order)
        files = _weight_files(weights)
        _check_weights(fn, files)
        text = print_program(Program({"main": layout.fn}, prog.version, dict(prog.attributes)))
        engine = _EngineModel(self.runtime, fn.name, self.qos)
        try:
            engine.compile(text, files)
            return AneKernel(self, fn, layout, engine)
        except BaseException:
            engine.close()
            raise

    def chain(
        self, kernels: Sequence[Kernel], links: Sequence[tuple[Surface, Surface]] | None = None
    ) -> Chain:
        """Kernels that run back to back, outputs feeding later inputs (see ``Chain``)."""
        return Chain(self, kernels, links)


# -- chaining -------------------------------------------------------------------------------------------


class _ChainState:
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
        self, backend: AneBackend, kernels: Sequence[Kernel], links: Sequence[tuple[Surface, Surface]] | None
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
        self._state = _ChainState(backend.runtime)
        self._finalizer = weakref.finalize(self, _ChainState.close, self._state)

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
                    _copy_surface(src, dst)

    # -- chained ----------------------------------------------------------------------------------

    def _give_up(self, reason: str) -> None:
        self.chained = False
        self.failure = reason
        self._state.close()

    def _attempt(self) -> None:
        rt = self.backend.runtime
        if not all(isinstance(k, AneKernel) for k in self.kernels):
            return self._give_up("only kernels of the ane backend can be chained")
        missing = _first_missing(rt, CHAINING)
        if missing is not None:
            return self._give_up(f"{missing} is not available ({rt.os_version})")
        if rt.missing(MODEL_UUID) is not None:
            return self._give_up(
                f"{MODEL_UUID} is not implemented ({rt.os_version}): {CLIENT_PREPARE_CHAINING} calls it "
                "and would raise an Objective-C exception, so in-memory models cannot be chained"
            )
        try:
            with rt.autorelease_pool():
                self._client = _nil_check(rt.send(CLIENT_SHARED), EvalFailed, f"[chain] {CLIENT_SHARED}")
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
            obj = _nil_check(rt.send(SURFACE_OBJECT, surface.ref), EvalFailed, f"{what}: {SURFACE_OBJECT}")
            return _nil_check(rt.send(BUFFER, obj, rt.number(index), source), EvalFailed, f"{what}: {BUFFER}")

        ins = [buffer(self._feeding(stage, s), i, 0) for i, s in enumerate(k.engine_inputs)]
        outs = [buffer(s, j, 1) for j, s in enumerate(k.engine_outputs)]
        stats = rt.iosurface_create(STATS_SURFACE_BYTES)
        self._state.surfaces.append(stats)
        out_set = _nil_check(
            rt.send(OUTPUT_SETS, stats, rt.array(outs)), EvalFailed, f"{what}: {OUTPUT_SETS}"
        )
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
        self._state.keep(_nil_check(request, EvalFailed, f"{what}: {CHAINING_REQUEST}"))
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
                    _nil_check(out_set, EvalFailed, f"{what}: {OUTPUT_SET_ENQUEUE}"),
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
                    _nil_check(ready, EvalFailed, f"{what}: {INPUT_BUFFERS_READY}"),
                    engine.options,
                    engine.qos,
                    to=self._client,
                    fails=EvalFailed,
                    what=f"{what}: {CLIENT_BUFFERS_READY}",
                )
                k._host_copies()

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
