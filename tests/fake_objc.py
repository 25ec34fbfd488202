"""A fake Objective-C runtime: ctypes callbacks standing in for libobjc, Foundation, IOSurface and the engine.

``FakeObjC`` is a ``Libraries`` object for ``anekit.runtime.ane.objc.ObjCRuntime``: it answers every symbol
lookup with a ctypes callback built for the exact prototype asked for, so calls go through real C
marshalling (typed arguments, ``NSError **`` written through its pointer, IOSurface memory at a real
address). It checks each prototype against the true signature (written here independently, as
Objective-C type codes), records every call — class, selector, argument types and values — and keeps
Cocoa's reference counting rules: convenience constructors return autoreleased objects, containers
retain their elements, ``IOSurfaceCreate`` follows the create rule. ``live_objects()`` lists what was
never released; ``errors`` what would have crashed or leaked on a real system (an unrecognised
selector, a message to a freed object, an over-release, an autorelease with no pool, a mismatched
lock).

The engine classes behave like the framework as far as tests need: compiling checks that model.mil
and the weight files were written to ``NSTemporaryDirectory()/<hexStringIdentifier>/`` and writes the
compiled program there (net.plist and data); loading builds a simulator plan from that directory's
compiled files; evaluating runs that plan on the IOSurfaces bound in the request. ``chip`` and ``macos``
name the Mac it stands for (``FakeObjC(tmp, chip="m1", macos="26.3")``). ``fail`` / ``return_nil`` / ``script`` queue results per selector (or
C function); ``defaults`` set the standing behaviour (``prepareChainingWithModel:`` fails with code 15
by default, as reported publicly; ``-[_ANEInMemoryModel getUUID]`` is absent).

The engine rules it enforces are the ones hardware-run projects MEASURED, written here from their
published descriptions and not from anekit's code (so a backend that breaks one fails its tests):

* binding — the k-th input surface of a request binds to the k-th function input in ALPHABETICAL
  order of the MIL names, and the k-th output surface receives the k-th output variable by name
  (mechramc/Orion docs/ane_constraints.md §3, §13): a backend binding in declaration order computes
  wrong numbers, silently, as the engine does;
* packed data — a tensor is read from / written to the first C*S values of its surface, whatever
  the surface's size (Orion §14);
* uniform sizes — input surfaces of one evaluation with different allocation sizes, or output
  surfaces with different sizes, fail with "ANEProgramProcessRequestDirect() Failed with
  status=0x1d : Program Inference error" (Orion §12, §2);
* short rows — a bound tensor whose rows (last dimension) are under 64 bytes fails the same way
  (rule surface.min-row-bytes: Orion §4 saw 0x1d on M4 Max, Espresso statusType 0x9 on M3 Max, m0at
  silent zeros on M5);
* descriptor — milText given as an NSString crashes (Orion §9), a nil weights dictionary crashes
  (Orion §11): recorded in ``errors`` (the process would be dead) and nil is returned;
* requests — a request built before the model's latest load fails to evaluate (maderix/ANE
  training/ane_runtime.h builds it after load; nothing public reuses one across an unload/reload);
* real-time — ``evaluateRealTimeWithModel:`` takes the _ANEInMemoryModel itself (maderix/ANE commit
  99ba013 measured it on an M4 Max, ``beginRealTimeTask`` answering NO there), or an ``_ANEModel`` (the
  ``model`` property) once ``loadRealTimeModel:`` loaded it; ``loadRealTimeModel:`` returns NO without
  an NSError on an M3 (christopherkarani/Espresso AGENTS.md, M3 Max); ``beginRealTimeTask`` /
  ``endRealTimeTask`` must balance (``realtime_tasks``);
* directory identity — the hexStringIdentifier follows the MIL text and the weight dictionary's keys,
  not the weight bytes, and a load reads the directory's compiled files, so a model whose directory
  another program recompiled runs that program's weights (mechramc/Orion core/ane_runtime.m
  ``orion_program_patch_weights``);
* state — a program with a ``state<>`` input or a state op (read_state, coreml_update_state) fails to
  compile: on the unentitled path "the backend rejects them during the conversion to the engine program,
  because the read-state has no state object to bind to" (sbryngelson/ane-guide
  part-4-workloads/14-llm-case-study.md, "Two residency mechanisms"), so a direct-route decoder keeps its
  cache in a plain input surface;
* chips — on an M1 / M2 under macOS 26 a program with matmul or scaled_dot_product_attention fails to
  compile (maderix/ANE commit 709b602, M1 Pro, macOS 26.3); under macOS 15 it compiles
  (benchmarks/community_results.json);
* processes — a load past ``max_loaded`` (near 128, sbryngelson/ane-guide
  part-4-workloads/14-llm-case-study.md) fails with "GetANEFModel: must re-compile"; an evaluation
  more than ``degrade_after`` (100K, ncdrone/rustane pull request #9) process evaluations after its
  program's last load counts as ``degraded``.

Rules that are only reported, or contradicted by working code (a 49 KB minimum surface, 128-byte
alignment, size-ordered surfaces), are not enforced.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anekit.errors import AnekitError
from anekit.mil.parser import parse_program
from anekit.mil.types import StateType
from anekit.mil.verify import verify
from anekit.rules.checks import MIN_ROW_BYTES  # rule surface.min-row-bytes
from anekit.runtime.ane.objc import ObjCRuntime
from anekit.runtime.sim import Plan
from anekit.runtime.sim.chip import bind
from anekit.runtime.sim.numerics import EngineNumerics

ANE_FRAMEWORK = "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine"
ANE_DOMAIN = "com.apple.appleneuralengine"
# The engine's answer to a request it cannot run (mechramc/Orion docs/ane_constraints.md §2, §4, §12). Only
# the text is published; the NSError code that carries it is not, so the fake picks one.
STATUS_0X1D = "ANEProgramProcessRequestDirect() Failed with status=0x1d : Program Inference error"
PROGRAM_INFERENCE_ERROR_CODE = 0x1D
MATMUL_OPS = frozenset({"matmul", "scaled_dot_product_attention"})  # refused on M1 / M2 under macOS 26
STATE_OPS = frozenset({"read_state", "write_state", "coreml_update_state"})  # refused on the direct route

_KIND = {
    "@": "ptr",
    "#": "ptr",
    ":": "ptr",
    "^v": "ptr",
    "*": "ptr",
    "^@": "ptr",
    "B": "bool",
    "i": "i4",
    "I": "u4",
    "q": "i8",
    "Q": "u8",
    "d": "f8",
    "v": "void",
}


def ctypes_kind(t: Any) -> str:
    """The C-level kind of a ctypes type (ptr, bool, i4, u8, f8, void)."""
    if t is None:
        return "void"
    code = getattr(t, "_type_", None)
    if not isinstance(code, str) or code in "PzZ":
        return "ptr"
    if code == "?":
        return "bool"
    if code in "dfg":
        return f"f{ctypes.sizeof(t)}"
    return f"{'u' if code.isupper() else 'i'}{ctypes.sizeof(t)}"


@dataclass(eq=False)
class Obj:
    id: int
    cls: str
    value: Any = None
    rc: int = 1
    children: list[int] = field(default_factory=list)
    immortal: bool = False
    alive: bool = True
    keep: Any = None  # C buffers the object hands out (UTF8String, IOSurface memory)


@dataclass(frozen=True)
class Call:
    kind: str  # "msg" or "c"
    name: str  # "+[Class selector]" / "-[Class selector]" or the C function's name
    cls: str | None
    selector: str | None
    types: tuple[str, ...]  # the prototype's argument kinds (after self and _cmd for messages)
    args: tuple[Any, ...]  # raw C values
    values: tuple[Any, ...]  # Python renderings of the arguments at call time


@dataclass
class FakeSurface:
    props: dict[str, Any]
    memory: Any
    surface_id: int
    locks: list[int] = field(default_factory=list)

    @property
    def alloc_size(self) -> int:
        return len(self.memory)

    def array(self, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        return np.frombuffer(self.memory, dtype=dtype, count=count).reshape(shape)


class VirtualClock:
    """A clock for ``anekit.runtime.ane.pacing.CompilePacer`` that never sleeps: ``sleep`` moves it on."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


DATA_MAGIC = b"FAKEDATA"


def pack_data(files: dict[str, bytes]) -> bytes:
    """The fake compiler's data file: every weight file it compiled, by dictionary key."""
    out = [DATA_MAGIC]
    for key, blob in sorted(files.items()):
        name = key.encode()
        out += [len(name).to_bytes(4, "little"), name, len(blob).to_bytes(8, "little"), blob]
    return b"".join(out)


def unpack_data(data: bytes) -> dict[str, bytes]:
    """The weight files of a ``pack_data`` file, keyed as the plan wants them (relative paths)."""
    assert data.startswith(DATA_MAGIC), "not a fake data file"
    files, at = {}, len(DATA_MAGIC)
    while at < len(data):
        n = int.from_bytes(data[at : at + 4], "little")
        name = data[at + 4 : at + 4 + n].decode()
        at += 4 + n
        size = int.from_bytes(data[at : at + 8], "little")
        files[name.removeprefix("@model_path/")] = data[at + 8 : at + 8 + size]
        at += 8 + size
    return files


Outcome = tuple  # ("ok",) ("fail", domain, code, description) ("fail-no-error",) ("nil",) ("skip",)


class FakeObjC:
    """Stands in for libobjc, Foundation, CoreFoundation, IOSurface and AppleNeuralEngine."""

    def __init__(
        self,
        tmpdir: str | os.PathLike,
        *,
        framework_loads: bool = True,
        os_version: str = "macOS 15.1 (fake)",
        refuses_program: tuple[str, ...] = (),
        chip: str | None = None,
        macos: str | None = None,
        max_loaded: int = 128,
        degrade_after: int = 100_000,
        eval_latency: float = 0.0,
    ) -> None:
        self.tmpdir = str(tmpdir)
        # Seconds every evaluation takes beyond computing its plan, slept for real with the GIL released:
        # the engine computing while the host is free (the host's work beside the engine's is measured on
        # it, benchmarks/bench_host_overlap.py). 0: evaluations take only their plan's time.
        self.eval_latency = eval_latency
        # Loaded programs the process may hold: sbryngelson/ane-guide part-4-workloads/14-llm-case-study.md,
        # "near 128 programs per process: the next load fails with `GetANEFModel: must re-compile`".
        self.max_loaded = max_loaded
        # Evaluations after which a loaded program runs degraded until it is loaded again: ncdrone/rustane
        # pull request #9 (M3 Ultra), "throughput degrades after ~100K cumulative" evaluations, reset by a
        # refresh. Slowness has no numbers to show, so the fake counts such evaluations in ``degraded``.
        self.degrade_after = degrade_after
        self.evaluations = 0
        self.degraded = 0
        # The Mac the fake stands for: its chip ("m1".."m5"; None: unnamed, the conservative numerics) and
        # macOS release ("26.3"; it sets os_version). Both decide what the compiler refuses (below).
        self.chip = chip
        self.macos = macos
        if macos is not None:
            os_version = f"macOS {macos} (fake)"
        # MIL program versions the compiler refuses: maderix/ANE pull request #6 (M1 Pro, macOS 26) saw
        # program(1.3) / <ios18> fail to compile where program(1.0) / <ios16> ran.
        self.refuses_program = refuses_program
        self.framework_loads = framework_loads
        self.framework_loaded = False
        self.os_version = os_version
        self.calls: list[Call] = []
        self.errors: list[str] = []
        self.objects: dict[int, Obj] = {}
        self.surfaces: dict[int, Obj] = {}
        self.refusals: list[str] = []  # every evaluation the engine rules refused, and why
        self.realtime_tasks = 0  # beginRealTimeTask minus endRealTimeTask
        self._clock = 0  # orders request creation against model loads
        self.outcomes: dict[str, list[Outcome]] = {}
        self.defaults: dict[str, Outcome] = {
            "prepareChainingWithModel:options:chainingReq:qos:error:": (
                "fail",
                ANE_DOMAIN,
                15,
                "ANEProgramChainingPrepare() Failed: Program chaining prepare error",
            )
        }
        self.removed_classes: set[str] = set()
        self.removed_methods: set[tuple[str, str, str]] = {("_ANEInMemoryModel", "-", "getUUID")}
        self._next_id = 0x1_0000_0000
        self._next_surface_id = 100
        self._callbacks: dict[Any, Any] = {}
        self._classes: dict[str, int] = {}
        self._class_names: dict[int, str] = {}
        self._selectors: dict[str, int] = {}
        self._selector_names: dict[int, str] = {}
        self._pools: list[tuple[int, list[int]]] = []
        self._methods: dict[tuple[str, str, str], tuple[str, tuple[str, ...], Callable[..., Any]]] = {}
        self._cfuncs: dict[str, tuple[str, str, tuple[str, ...], Callable[..., Any]]] = {}
        self._client: Obj | None = None
        self._install()

    # -- the Libraries protocol -------------------------------------------------------------------------

    def runtime(self) -> ObjCRuntime:
        brand = f"Apple {self.chip.upper()} Pro (fake)" if self.chip else None
        return ObjCRuntime(self, os_version=self.os_version, chip_brand=brand)

    def load(self, path: str) -> None:
        if path != ANE_FRAMEWORK:
            raise OSError(f"dlopen({path}): image not found")
        if not self.framework_loads:
            raise OSError(f"dlopen({path}): image not found (fake)")
        self.framework_loaded = True

    def address(self, library: str, name: str, proto: Any) -> int:
        key = (name, proto)
        if key not in self._callbacks:
            if name == "objc_msgSend":
                assert library == "objc", f"objc_msgSend looked up in {library}"
                handler = self._callback(proto, lambda *a: self._dispatch(proto, *a))
            else:
                if name not in self._cfuncs:
                    raise AttributeError(f"dlsym({library}, {name}): symbol not found")
                lib, returns, args, fn = self._cfuncs[name]
                assert library == lib, f"{name} looked up in {library}, it lives in {lib}"
                self._check_prototype(name, proto, returns, args, receiver=False)
                handler = self._callback(proto, lambda *a: self._c_call(name, args, fn, a))
            self._callbacks[key] = handler
        return ctypes.cast(self._callbacks[key], ctypes.c_void_p).value or 0

    def _callback(self, proto: Any, fn: Callable[..., Any]) -> Any:
        default = {"void": None, "bool": False, "ptr": None}.get(ctypes_kind(proto._restype_), 0)

        def guarded(*args: Any) -> Any:
            try:
                result = fn(*args)
            except Exception as e:  # an exception cannot cross C; keep it for the test to see
                self.errors.append(f"{type(e).__name__}: {e}")
                return default
            return default if result is None else result

        return proto(guarded)

    def _check_prototype(
        self, name: str, proto: Any, returns: str, args: tuple[str, ...], receiver: bool
    ) -> None:
        got = (ctypes_kind(proto._restype_), *(ctypes_kind(t) for t in proto._argtypes_))
        want = (_KIND[returns], *(["ptr", "ptr"] if receiver else []), *(_KIND[c] for c in args))
        if got != want:
            raise AssertionError(f"{name}: called through prototype {got}, its signature is {want}")

    # -- scripting --------------------------------------------------------------------------------------

    def script(self, name: str, *outcomes: Outcome) -> None:
        """Queue results for a selector (without class) or a C function name."""
        self.outcomes.setdefault(name, []).extend(outcomes)

    def fail(
        self,
        name: str,
        *,
        code: int = 5,
        description: str = "fake failure",
        domain: str = ANE_DOMAIN,
        underlying: tuple[str, int, str] | None = None,
    ) -> None:
        """Queue a failure with an NSError (``underlying``: (domain, code, description) under
        NSUnderlyingErrorKey)."""
        self.script(name, ("fail", domain, code, description, underlying))

    def return_nil(self, name: str) -> None:
        self.script(name, ("nil",))

    def _outcome(self, name: str) -> Outcome:
        queue = self.outcomes.get(name)
        if queue:
            return queue.pop(0)
        return self.defaults.get(name, ("ok",))

    def remove_class(self, name: str) -> None:
        self.removed_classes.add(name)

    def remove_method(self, cls: str, kind: str, selector: str) -> None:
        self.removed_methods.add((cls, kind, selector))

    def restore_method(self, cls: str, kind: str, selector: str) -> None:
        self.removed_methods.discard((cls, kind, selector))

    # -- inspection -------------------------------------------------------------------------------------

    def sent(self, prefix: str = "_ANE") -> list[str]:
        """The messages sent to classes / objects whose class starts with ``prefix``, in order."""
        return [c.name for c in self.calls if c.kind == "msg" and (c.cls or "").startswith(prefix)]

    def called(self, prefix: str) -> list[str]:
        return [c.name for c in self.calls if c.kind == "c" and c.name.startswith(prefix)]

    def find(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name or c.selector == name]

    def live_objects(self) -> list[Obj]:
        return [o for o in self.objects.values() if o.alive and not o.immortal]

    def of_class(self, cls: str) -> list[Obj]:
        return [o for o in self.objects.values() if o.cls == cls]

    def render(self, ref: int | None) -> Any:
        """A Python rendering of an object: str, int, bytes, list, dict, or "<Class>"."""
        if not ref:
            return None
        if ref in self._class_names:
            return f"<class {self._class_names[ref]}>"
        o = self.objects.get(ref)
        if o is None:
            return f"<unknown {ref:#x}>"
        if o.cls in ("NSString", "NSNumber", "NSData"):
            return o.value
        if o.cls == "NSArray":
            return [self.render(i) for i in o.value]
        if o.cls == "NSDictionary":
            return {self.render(k): self.render(v) for k, v in o.value}
        return f"<{o.cls}>"

    # -- objects and ownership --------------------------------------------------------------------------

    def _new(
        self, cls: str, value: Any = None, children: list[int] | None = None, *, autorelease: bool = True
    ) -> int:
        self._next_id += 0x40
        obj = Obj(self._next_id, cls, value, children=[])
        self.objects[obj.id] = obj
        for child in children or []:
            if child:
                self._retain(child)
                obj.children.append(child)
        if autorelease:
            if not self._pools:
                self.errors.append(f"a {cls} was autoreleased with no pool in place (leaked)")
            else:
                self._pools[-1][1].append(obj.id)
        return obj.id

    def _obj(self, ref: int | None, what: str = "object") -> Obj:
        o = self.objects.get(ref or 0)
        if o is None:
            raise ValueError(f"{what} {ref!r} is not an object")
        if not o.alive:
            raise ValueError(f"{what} {ref:#x} ({o.cls}) was already deallocated")
        return o

    def _retain(self, ref: int) -> int:
        o = self._obj(ref, "retain of")
        o.rc += 1
        return ref

    def _release(self, ref: int) -> None:
        o = self.objects.get(ref)
        if o is None or not o.alive:
            self.errors.append(f"release of a dead or unknown object {ref:#x}")
            return
        if o.immortal:
            return
        o.rc -= 1
        if o.rc == 0:
            o.alive = False
            for child in o.children:
                self._release(child)

    def _error(
        self,
        err_ptr: Any,
        domain: str,
        code: int,
        description: str,
        underlying: tuple[str, int, str] | None = None,
    ) -> None:
        if err_ptr:
            err_ptr[0] = self._nserror(domain, code, description, underlying)

    def _nserror(
        self, domain: str, code: int, description: str, underlying: tuple[str, int, str] | None = None
    ) -> int:
        """An autoreleased NSError whose userInfo holds its description (and an underlying error)."""
        info = {"NSLocalizedDescription": self._new("NSString", description)}
        if underlying is not None:
            info["NSUnderlyingError"] = self._nserror(*underlying)
        pairs = [(self._new("NSString", k), v) for k, v in info.items()]
        user_info = self._new("NSDictionary", pairs, [r for p in pairs for r in p])
        value = {"domain": domain, "code": code, "description": description, "user_info": user_info}
        return self._new("NSError", value, [user_info])

    def _bool_outcome(self, selector: str, err_ptr: Any) -> bool | None:
        """None when the call should go ahead; False (with the NSError written) when scripted to fail."""
        outcome = self._outcome(selector)
        if outcome[0] == "fail":
            self._error(err_ptr, *outcome[1:])
            return False
        if outcome[0] in ("fail-no-error", "nil"):
            return False
        return None

    # -- C functions ------------------------------------------------------------------------------------

    def _c_call(
        self, name: str, codes: tuple[str, ...], fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> Any:
        values = tuple(self.render(a) if c == "@" else a for c, a in zip(codes, args))
        self.calls.append(Call("c", name, None, None, tuple(_KIND[c] for c in codes), args, values))
        return fn(*args)

    def _install(self) -> None:
        c = self._cfuncs
        c["objc_getClass"] = ("objc", "#", ("*",), self._get_class)
        c["sel_registerName"] = ("objc", ":", ("*",), self._sel)
        c["class_getClassMethod"] = ("objc", "^v", ("#", ":"), lambda k, s: self._has_method(k, s, "+"))
        c["class_getInstanceMethod"] = ("objc", "^v", ("#", ":"), lambda k, s: self._has_method(k, s, "-"))
        c["objc_retain"] = ("objc", "@", ("@",), self._retain)
        c["objc_release"] = ("objc", "v", ("@",), self._release)
        c["objc_autoreleasePoolPush"] = ("objc", "^v", (), self._pool_push)
        c["objc_autoreleasePoolPop"] = ("objc", "v", ("^v",), self._pool_pop)
        c["CFRelease"] = ("CoreFoundation", "v", ("^v",), self._release)
        c["NSTemporaryDirectory"] = ("Foundation", "@", (), lambda: self._new("NSString", self.tmpdir + "/"))
        c["IOSurfaceCreate"] = ("IOSurface", "^v", ("@",), self._surface_create)
        c["IOSurfaceLock"] = ("IOSurface", "i", ("^v", "I", "^v"), self._surface_lock)
        c["IOSurfaceUnlock"] = ("IOSurface", "i", ("^v", "I", "^v"), self._surface_unlock)
        c["IOSurfaceGetBaseAddress"] = ("IOSurface", "^v", ("^v",), self._surface_base)
        c["IOSurfaceGetAllocSize"] = ("IOSurface", "Q", ("^v",), lambda s: self._surface(s).alloc_size)
        c["IOSurfaceGetID"] = ("IOSurface", "I", ("^v",), lambda s: self._surface(s).surface_id)

        m = self._method
        m("NSString", "+", "stringWithUTF8String:", "@ *", lambda r, s: self._new("NSString", s.decode()))
        m("NSString", "-", "UTF8String", "*", self._utf8)
        m("NSData", "+", "dataWithBytes:length:", "@ ^v Q", self._data)
        m("NSNumber", "+", "numberWithLongLong:", "@ q", lambda r, n: self._new("NSNumber", n))
        m("NSNumber", "+", "numberWithDouble:", "@ d", lambda r, x: self._new("NSNumber", x))
        m("NSArray", "+", "arrayWithObjects:count:", "@ ^@ Q", self._array)
        m("NSDictionary", "+", "dictionaryWithObjects:forKeys:count:", "@ ^@ ^@ Q", self._dictionary)
        m("NSError", "-", "domain", "@", lambda r: self._new("NSString", r.value["domain"]))
        m("NSError", "-", "code", "q", lambda r: r.value["code"])
        m(
            "NSError",
            "-",
            "localizedDescription",
            "@",
            lambda r: self._new("NSString", r.value["description"]),
        )
        m("NSError", "-", "userInfo", "@", lambda r: r.value["user_info"])  # +0, owned by the error
        m("NSDictionary", "-", "objectForKey:", "@ @", self._object_for_key)
        m("NSDictionary", "-", "description", "@", lambda r: self._new("NSString", self._describe(r.id)))

        m(
            "_ANEInMemoryModelDescriptor",
            "+",
            "modelWithMILText:weights:optionsPlist:",
            "@ @ @ @",
            self._descriptor,
        )
        m("_ANEInMemoryModel", "+", "inMemoryModelWithDescriptor:", "@ @", self._model)
        m(
            "_ANEInMemoryModel",
            "-",
            "hexStringIdentifier",
            "@",
            lambda r: self._new("NSString", r.value["hex"]),
        )
        m("_ANEInMemoryModel", "-", "compileWithQoS:options:error:", "B I @ ^@", self._compile)
        m("_ANEInMemoryModel", "-", "loadWithQoS:options:error:", "B I @ ^@", self._load)
        m("_ANEInMemoryModel", "-", "evaluateWithQoS:options:request:error:", "B I @ @ ^@", self._evaluate)
        m("_ANEInMemoryModel", "-", "unloadWithQoS:error:", "B I ^@", self._unload)
        m("_ANEInMemoryModel", "-", "getUUID", "@", lambda r: self._new("NSString", "uuid"))
        m("_ANEInMemoryModel", "-", "model", "@", self._ane_model)
        m("_ANEIOSurfaceObject", "+", "objectWithIOSurface:", "@ ^v", self._surface_object)
        m(
            "_ANERequest",
            "+",
            "requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:",
            "@ @ @ @ @ @ @ @",
            self._request,
        )
        m("_ANEClient", "+", "sharedConnection", "@", self._shared_connection)
        m(
            "_ANEClient",
            "-",
            "evaluateRealTimeWithModel:options:request:error:",
            "B @ @ @ ^@",
            self._evaluate_rt,
        )
        m("_ANEClient", "-", "beginRealTimeTask", "B", self._begin_rt)
        m("_ANEClient", "-", "endRealTimeTask", "B", self._end_rt)
        m("_ANEClient", "-", "loadRealTimeModel:options:qos:error:", "B @ @ I ^@", self._load_rt)
        m("_ANEClient", "-", "unloadRealTimeModel:options:qos:error:", "B @ @ I ^@", self._unload_rt)
        m("_ANEBuffer", "+", "bufferWithIOSurfaceObject:symbolIndex:source:", "@ @ @ q", self._buffer)
        m("_ANEIOSurfaceOutputSets", "+", "objectWithstatsSurRef:outputBuffer:", "@ ^v @", self._output_sets)
        m(
            "_ANEChainingRequest",
            "+",
            "chainingRequestWithInputs:outputSets:lbInputSymbolId:lbOutputSymbolId:procedureIndex:"
            "signalEvents:transactionHandle:fwEnqueueDelay:memoryPoolId:",
            "@ @ @ @ @ @ @ @ @ @",
            self._chaining_request,
        )
        m("_ANEChainingRequest", "-", "validate", "B", self._validate)
        m(
            "_ANEClient",
            "-",
            "prepareChainingWithModel:options:chainingReq:qos:error:",
            "B @ @ @ I ^@",
            self._prepare_chaining,
        )
        m(
            "_ANEOutputSetEnqueue",
            "+",
            "outputSetWithProcedureIndex:setIndex:signalValue:signalNotRequired:isOpenLoop:",
            "@ I I Q B B",
            lambda r, *a: self._new("_ANEOutputSetEnqueue", a),
        )
        m(
            "_ANEInputBuffersReady",
            "+",
            "inputBuffersWithProcedureIndex:inputBufferInfoIndex:inputFreeValue:executionDelay:",
            "@ I @ @ Q",
            lambda r, p, i, f, d: self._new("_ANEInputBuffersReady", (p, i, f, d), [i, f]),
        )
        m(
            "_ANEClient",
            "-",
            "enqueueSetsWithModel:outputSet:options:qos:error:",
            "B @ @ @ I ^@",
            self._enqueue,
        )
        m(
            "_ANEClient",
            "-",
            "buffersReadyWithModel:inputBuffers:options:qos:error:",
            "B @ @ @ I ^@",
            self._buffers_ready,
        )

    def _method(self, cls: str, kind: str, selector: str, types: str, fn: Callable[..., Any]) -> None:
        returns, *args = types.split()
        assert selector.count(":") == len(args), selector
        self._methods[(cls, kind, selector)] = (returns, tuple(args), fn)

    _ANE_CLASSES = frozenset(
        (
            "_ANEInMemoryModelDescriptor",
            "_ANEInMemoryModel",
            "_ANEModel",
            "_ANERequest",
            "_ANEIOSurfaceObject",
            "_ANEClient",
            "_ANEBuffer",
            "_ANEIOSurfaceOutputSets",
            "_ANEChainingRequest",
            "_ANEOutputSetEnqueue",
            "_ANEInputBuffersReady",
        )
    )

    def _get_class(self, name: bytes) -> int | None:
        cls = name.decode()
        known = any(k[0] == cls for k in self._methods)
        if (
            not known
            or cls in self.removed_classes
            or (cls in self._ANE_CLASSES and not self.framework_loaded)
        ):
            return None
        if cls not in self._classes:
            self._next_id += 0x40
            self._classes[cls] = self._next_id
            self._class_names[self._next_id] = cls
        return self._classes[cls]

    def _sel(self, name: bytes) -> int:
        sel = name.decode()
        if sel not in self._selectors:
            self._next_id += 0x40
            self._selectors[sel] = self._next_id
            self._selector_names[self._next_id] = sel
        return self._selectors[sel]

    def _has_method(self, cls_ptr: int, sel_ptr: int, kind: str) -> int | None:
        key = (self._class_names[cls_ptr], kind, self._selector_names[sel_ptr])
        return 1 if key in self._methods and key not in self.removed_methods else None

    def _pool_push(self) -> int:
        self._next_id += 0x40
        self._pools.append((self._next_id, []))
        return self._next_id

    def _pool_pop(self, token: int) -> None:
        if not self._pools or self._pools[-1][0] != token:
            self.errors.append("autorelease pools popped out of order")
            return
        _, objs = self._pools.pop()
        for ref in reversed(objs):
            self._release(ref)

    # -- objc_msgSend -----------------------------------------------------------------------------------

    def _dispatch(self, proto: Any, receiver: int | None, sel_ptr: int | None, *args: Any) -> Any:
        selector = self._selector_names.get(sel_ptr or 0, f"<unregistered selector {sel_ptr}>")
        if receiver in self._class_names:
            cls, kind, target = self._class_names[receiver], "+", None
        else:
            target = self._obj(receiver, f"receiver of {selector}")
            cls, kind = target.cls, "-"
        name = f"{kind}[{cls} {selector}]"
        key = (cls, kind, selector)
        if key not in self._methods or key in self.removed_methods:
            raise RuntimeError(
                f"unrecognized selector sent: {name} (an Objective-C exception: the process dies)"
            )
        returns, codes, fn = self._methods[key]
        self._check_prototype(name, proto, returns, codes, receiver=True)
        values = tuple(self.render(a) if c == "@" else a for c, a in zip(codes, args))
        self.calls.append(Call("msg", name, cls, selector, tuple(_KIND[c] for c in codes), args, values))
        for c, a in zip(codes, args):
            if c == "@" and a:
                self._obj(a, f"argument of {name}")
        return fn(target, *args)

    # -- Foundation -------------------------------------------------------------------------------------

    def _utf8(self, s: Obj) -> int:
        buf = ctypes.create_string_buffer(s.value.encode())
        s.keep = buf
        return ctypes.addressof(buf)

    def _data(self, _: Any, ptr: int | None, length: int) -> int:
        return self._new("NSData", ctypes.string_at(ptr, length) if length else b"")

    def _array(self, _: Any, items: Any, count: int) -> int:
        refs = [items[i] for i in range(count)]
        for ref in refs:
            self._obj(ref, "array element")
        return self._new("NSArray", refs, refs)

    def _dictionary(self, _: Any, values: Any, keys: Any, count: int) -> int:
        pairs = [(keys[i], values[i]) for i in range(count)]
        for k, v in pairs:
            self._obj(k, "dictionary key")
            self._obj(v, "dictionary value")
        return self._new("NSDictionary", pairs, [r for p in pairs for r in p])

    def _object_for_key(self, d: Obj, key: int) -> int | None:
        wanted = self.render(key)
        for k, v in d.value:
            if self.render(k) == wanted:
                return v
        return None

    def _describe(self, ref: int) -> str:
        """Cocoa's ``{ key = value; }`` rendering, enough for messages."""
        o = self.objects[ref]
        if o.cls == "NSDictionary":
            inner = " ".join(f"{self.render(k)} = {self._describe(v)};" for k, v in o.value)
            return "{ " + inner + " }"
        if o.cls == "NSError":
            return f'Error Domain={o.value["domain"]} Code={o.value["code"]} "{o.value["description"]}"'
        return str(self.render(ref))

    # -- IOSurface --------------------------------------------------------------------------------------

    def _surface(self, ref: int) -> FakeSurface:
        o = self._obj(ref, "IOSurfaceRef")
        assert o.cls == "IOSurface", f"{o.cls} used as an IOSurfaceRef"
        return o.value

    def _surface_create(self, props_ref: int) -> int | None:
        if self._outcome("IOSurfaceCreate")[0] == "nil":
            return None
        props = self.render(props_ref)
        memory = (ctypes.c_char * int(props["IOSurfaceAllocSize"]))()
        self._next_surface_id += 1
        ref = self._new("IOSurface", FakeSurface(props, memory, self._next_surface_id), autorelease=False)
        self.surfaces[ref] = self.objects[ref]
        return ref

    def _surface_lock(self, ref: int, options: int, seed: int | None) -> int:
        self._surface(ref).locks.append(options)
        return 0

    def _surface_unlock(self, ref: int, options: int, seed: int | None) -> int:
        s = self._surface(ref)
        if not s.locks or s.locks[-1] != options:
            self.errors.append(f"IOSurfaceUnlock({options}) does not match the lock {s.locks}")
            return 0xE00002C2  # kIOReturnBadArgument
        s.locks.pop()
        return 0

    def _surface_base(self, ref: int) -> int:
        s = self._surface(ref)
        if not s.locks:
            self.errors.append("IOSurfaceGetBaseAddress on an unlocked surface")
        return ctypes.addressof(s.memory)

    # -- the engine -------------------------------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _descriptor(self, _: Any, mil: int, weights: int | None, options: int | None) -> int | None:
        if self._outcome("modelWithMILText:weights:optionsPlist:")[0] == "nil":
            return None
        text = self._obj(mil)
        if text.cls != "NSData":  # mechramc/Orion docs/ane_constraints.md §9
            self.errors.append(f"modelWithMILText: given an {text.cls}, not NSData: the process crashes")
            return None
        if not weights:  # mechramc/Orion docs/ane_constraints.md §11
            self.errors.append("modelWithMILText: given a nil weights dictionary: the process crashes")
            return None
        files = {}
        for key, entry in self.render(weights).items():
            files[key] = (entry["offset"], entry["data"])
        value = {"mil": text.value.decode(), "weights": files}
        return self._new("_ANEInMemoryModelDescriptor", value, [mil, weights])

    def _model(self, _: Any, desc: int) -> int | None:
        if self._outcome("inMemoryModelWithDescriptor:")[0] == "nil":
            return None
        d = self._obj(desc).value
        # The identifier follows the MIL text and the weight dictionary's KEYS, not the weight bytes
        # (mechramc/Orion core/ane_runtime.m orion_program_patch_weights: "Same hexId as donor (same MIL
        # text + weight dict keys)").
        digest = hashlib.sha256(d["mil"].encode())
        for key in sorted(d["weights"]):
            digest.update(b"\0" + key.encode())
        value = {
            **d,
            "hex": digest.hexdigest()[:40],
            "compiled": False,
            "loaded": False,
            "loaded_at": 0,
            "plan": None,
            "ane_model": None,
        }
        return self._new("_ANEInMemoryModel", value, [desc])

    def _ane_model(self, model: Obj) -> int:
        """The ``model`` property: the model's _ANEModel, owned by it (returned at +0)."""
        if model.value["ane_model"] is None:
            ref = self._new("_ANEModel", {"in_memory": model.id}, autorelease=False)
            model.children.append(ref)
            model.value["ane_model"] = ref
        return model.value["ane_model"]

    def _compile(self, model: Obj, qos: int, options: int, err: Any) -> bool:
        if (failed := self._bool_outcome("compileWithQoS:options:error:", err)) is not None:
            return failed
        v = model.value
        folder = Path(self.tmpdir) / v["hex"]
        written = (folder / "model.mil").read_text() if (folder / "model.mil").is_file() else None
        if written != v["mil"]:
            self.errors.append(f"compile: {folder}/model.mil is missing or differs from the MIL text")
        for key, (_, blob) in v["weights"].items():
            path = folder / key.removeprefix("@model_path/")
            if not path.is_file() or path.read_bytes() != blob:
                self.errors.append(f"compile: weight file {path} is missing or differs")
        version = v["mil"].split("(", 1)[1].split(")", 1)[0] if v["mil"].startswith("program(") else ""
        if version in self.refuses_program:
            self._error(err, ANE_DOMAIN, 1, f"InvalidMILProgram: program({version}) is not supported")
            return False
        stateful = self._state_ops(v["mil"])
        if stateful:
            why = f"{', '.join(stateful)}: no state object to bind (the operand is a plain input)"
            self._error(err, ANE_DOMAIN, 1, f"ANECCompile() FAILED: {why} (fake {self.chip})")
            return False
        refused = self._refused_ops(v["mil"])
        if refused:
            self._error(err, ANE_DOMAIN, 1, f"ANECCompile() FAILED: {', '.join(refused)} (fake {self.chip})")
            return False
        try:
            v["fn"] = verify(parse_program(v["mil"], "<fake ANE>")).functions["main"]
            numerics = self._numerics()
            blobs = {k: blob for k, (_, blob) in v["weights"].items()}
            Plan(v["fn"], blobs, "ane", numerics)
        except AnekitError as e:  # the engine answers a program it cannot compile with an NSError
            self._error(err, ANE_DOMAIN, 1, f"InvalidMILProgram: {e}")
            return False
        # The compiled program lands in the model's directory: net.plist and data, which the compiler
        # writes there and a later load reads back (Orion orion_program_patch_weights loads a model from
        # those two files without compiling: "The compiled ANE data file IS the BLOBFILE"). The fake's
        # data file is its own container of the weight files it compiled from the directory.
        compiled = {key: (folder / key.removeprefix("@model_path/")).read_bytes() for key in v["weights"]}
        (folder / "net.plist").write_text(v["mil"])
        (folder / "data").write_bytes(pack_data(compiled))
        v["compiled"] = True
        return True

    def _numerics(self) -> EngineNumerics:
        """The engine computes with its chip's numerics; an unnamed chip takes the conservative profile
        ("any"), as the simulator does off a Mac."""
        return EngineNumerics(bind(self.chip or "any"))

    def _refused_ops(self, mil: str) -> list[str]:
        """The ops of ``mil`` this chip's compiler refuses under this macOS: matmul and
        scaled_dot_product_attention on M1 / M2 under macOS 26 (maderix/ANE commit 709b602, M1 Pro,
        macOS 26.3: "matmul and scaled_dot_product_attention ops still fail on M1/M2 — these are M4+ ANE
        ops"). Under macOS 15 they compile (maderix/ANE benchmarks/community_results.json: M1 Pro / Max
        trained with training/stories_mil.h, whose attention is matmul)."""
        major = (self.macos or "").split(".")[0]
        if self.chip not in ("m1", "m2") or major != "26":
            return []
        fn = parse_program(mil, "<fake ANE>").functions["main"]
        return sorted({op.op_type for op in fn.ops if op.op_type in MATMUL_OPS})

    def _state_ops(self, mil: str) -> list[str]:
        """What makes ``mil`` stateful: its ``state<>`` inputs and state ops, which the direct route's compiler
        rejects (sbryngelson/ane-guide part-4-workloads/14-llm-case-study.md, "Two residency mechanisms":
        the state type "parses but does not reach the engine")."""
        fn = parse_program(mil, "<fake ANE>").functions["main"]
        found = [f"state input '{v.name}'" for v in fn.inputs if isinstance(v.type, StateType)]
        return found + sorted({op.op_type for op in fn.ops if op.op_type in STATE_OPS})

    def _load_plan(self, model: Obj, err: Any) -> bool:
        """Build the program a load puts on the engine from the directory's compiled files (net.plist and
        data), whichever model compiled them last: a model whose directory another program rewrote runs
        that program's weights."""
        v = model.value
        folder = Path(self.tmpdir) / v["hex"]
        try:
            text = (folder / "net.plist").read_text()
            compiled = unpack_data((folder / "data").read_bytes())
        except OSError:
            self._error(err, ANE_DOMAIN, 1, f"program load failure: {folder} has no compiled program")
            return False
        fn = v["fn"] if text == v["mil"] else verify(parse_program(text, "<fake ANE>")).functions["main"]
        numerics = self._numerics()
        v["plan"] = Plan(fn, compiled, "ane", numerics)  # the simulator's sums
        return True

    def _load(self, model: Obj, qos: int, options: int, err: Any) -> bool:
        if (failed := self._bool_outcome("loadWithQoS:options:error:", err)) is not None:
            return failed
        assert model.value["compiled"], "load before compile"
        loaded = sum(1 for o in self.of_class("_ANEInMemoryModel") if o.alive and o.value["loaded"])
        if loaded >= self.max_loaded:
            self._error(err, ANE_DOMAIN, 1, f"GetANEFModel: must re-compile ({loaded} programs loaded)")
            return False
        if not self._load_plan(model, err):
            return False
        model.value["loaded"] = True
        model.value["evaluations_at_load"] = self.evaluations
        model.value["loaded_at"] = self._tick()
        return True

    def _unload(self, model: Obj, qos: int, err: Any) -> bool:
        if (failed := self._bool_outcome("unloadWithQoS:error:", err)) is not None:
            return failed
        assert model.value["loaded"], "unload of a model that is not loaded"
        model.value["loaded"] = False
        return True

    def _run_request(self, model: Obj, request: int, err: Any) -> bool:
        """Evaluate ``request`` on ``model``: False with the engine's NSError when a rule refuses it."""
        r = self._obj(request).value
        if r["made_at"] < model.value["loaded_at"]:  # maderix/ANE training/ane_runtime.h: built after load
            self._refuse(err, "the request was built before the model's latest load", code=5)
            return False
        return self._execute(model, r["inputs"], r["in_idx"], r["outputs"], r["out_idx"], err)

    def _evaluate(self, model: Obj, qos: int, options: int, request: int, err: Any) -> bool:
        if (failed := self._bool_outcome("evaluateWithQoS:options:request:error:", err)) is not None:
            return failed
        return self._run_request(model, request, err)

    def _shared_connection(self, _: Any) -> int | None:
        if self._outcome("sharedConnection")[0] == "nil":
            return None
        if self._client is None:
            ref = self._new("_ANEClient", {}, autorelease=False)
            self._client = self.objects[ref]
            self._client.immortal = True
        return self._client.id

    def _in_memory_of(self, model: int, err: Any, selector: str) -> Obj | None:
        """The in-memory model behind an _ANEModel; None (and an NSError) for any other object."""
        o = self._obj(model)
        if o.cls != "_ANEModel":  # bridge code passes -[_ANEInMemoryModel model]
            self._error(err, ANE_DOMAIN, 3, f"{selector}: {o.cls} is not an _ANEModel")
            return None
        return self._obj(o.value["in_memory"])

    def _begin_rt(self, client: Obj) -> bool:
        """Counts the task; NO on an M4 (maderix/ANE 99ba013 docs/ANE_CHAINING_RESEARCH.md, M4 Max:
        "beginRealTimeTask: NO (possibly needs entitlement)", the real-time evaluation working anyway)."""
        self.realtime_tasks += 1
        return self._outcome("beginRealTimeTask")[0] == "ok" and self.chip != "m4"

    def _end_rt(self, client: Obj) -> bool:
        self.realtime_tasks -= 1
        if self.realtime_tasks < 0:
            self.errors.append("endRealTimeTask without a beginRealTimeTask")
        return True

    def _load_rt(self, client: Obj, model: int, options: int, qos: int, err: Any) -> bool:
        if (failed := self._bool_outcome("loadRealTimeModel:options:qos:error:", err)) is not None:
            return failed
        if self.chip == "m3":  # christopherkarani/Espresso AGENTS.md (M3 Max, macOS 15): "returns NO with
            return False  # no error. Silent entitlement gate."
        m = self._in_memory_of(model, err, "loadRealTimeModel")
        if m is None:
            return False
        if self.realtime_tasks <= 0:
            self._error(err, ANE_DOMAIN, 3, "loadRealTimeModel: no real-time task (beginRealTimeTask)")
            return False
        m.value["realtime"] = True
        return True

    def _unload_rt(self, client: Obj, model: int, options: int, qos: int, err: Any) -> bool:
        if (failed := self._bool_outcome("unloadRealTimeModel:options:qos:error:", err)) is not None:
            return failed
        m = self._in_memory_of(model, err, "unloadRealTimeModel")
        if m is None:
            return False
        m.value["realtime"] = False
        return True

    def _evaluate_rt(self, client: Obj, model: int, options: int, request: int, err: Any) -> bool:
        selector = "evaluateRealTimeWithModel:options:request:error:"
        if (failed := self._bool_outcome(selector, err)) is not None:
            return failed
        o = self._obj(model)
        if o.cls == "_ANEInMemoryModel":  # maderix/ANE 99ba013 ane_eval_rt: the in-memory model itself
            return self._run_request(o, request, err)
        m = self._in_memory_of(model, err, "evaluateRealTimeWithModel")
        if m is not None and not m.value.get("realtime"):
            self._error(
                err, ANE_DOMAIN, 3, "evaluateRealTimeWithModel: the _ANEModel is not loaded for real time"
            )
            return False
        return m is not None and self._run_request(m, request, err)

    def _surface_object(self, _: Any, surface: int | None) -> int | None:
        if self._outcome("objectWithIOSurface:")[0] == "nil" or not surface:
            return None
        self._surface(surface)
        return self._new("_ANEIOSurfaceObject", surface, [surface])

    def _request(self, _: Any, ins: int, in_idx: int, outs: int, out_idx: int, *rest: Any) -> int | None:
        selector = (
            "requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:"
        )
        if self._outcome(selector)[0] == "nil":
            return None
        value = {
            "inputs": [self._obj(o).value for o in self._obj(ins).value],
            "in_idx": self.render(in_idx),
            "outputs": [self._obj(o).value for o in self._obj(outs).value],
            "out_idx": self.render(out_idx),
            "rest": tuple(self.render(a) for a in rest),
            "made_at": self._tick(),
        }
        return self._new("_ANERequest", value, [ins, in_idx, outs, out_idx, *rest])

    def _refuse(self, err: Any, why: str, code: int = PROGRAM_INFERENCE_ERROR_CODE) -> None:
        self.refusals.append(why)
        self._error(err, ANE_DOMAIN, code, STATUS_0X1D if code == PROGRAM_INFERENCE_ERROR_CODE else why)

    def _execute(
        self, model: Obj, ins: list[int], in_idx: list[int], outs: list[int], out_idx: list[int], err: Any
    ) -> bool:
        """Run the model's plan on the surfaces as the engine binds them, or refuse (False + NSError).

        Symbol index k is the k-th function input / output in ALPHABETICAL order of the MIL names
        (mechramc/Orion docs/ane_constraints.md §3, §13), whatever order the function declares them in.
        """
        v = model.value
        if not v["loaded"]:
            raise RuntimeError("evaluate of a model that is not loaded")
        fn = v["fn"]
        params = sorted(fn.inputs, key=lambda var: var.name)
        results_by_name = sorted(range(len(fn.outputs)), key=lambda j: fn.outputs[j].name)
        if sorted(in_idx) != list(range(len(params))) or sorted(out_idx) != list(range(len(fn.outputs))):
            self._refuse(
                err, f"indices {in_idx} / {out_idx} for {len(params)} inputs, {len(fn.outputs)} outputs"
            )
            return False
        for label, refs in (("input", ins), ("output", outs)):  # Orion §12 (inputs), §2 (outputs)
            sizes = sorted({self._surface(r).alloc_size for r in refs})
            if len(sizes) > 1:
                self._refuse(err, f"{label} surfaces of different allocation sizes {sizes}")
                return False
        bound = [(params[k], ref) for ref, k in zip(ins, in_idx)]
        bound += [(fn.outputs[results_by_name[k]], ref) for ref, k in zip(outs, out_idx)]
        for var, ref in bound:
            t = var.type
            row_bytes = int(t.shape[-1]) * t.dtype.np.itemsize if t.shape else t.dtype.np.itemsize
            if row_bytes < MIN_ROW_BYTES:  # rule surface.min-row-bytes
                self._refuse(err, f"'{var.name}' has rows of {row_bytes} bytes")
                return False
            if self._surface(ref).alloc_size < row_bytes * (int(np.prod(t.shape)) // int(t.shape[-1])):
                self._refuse(err, f"the surface bound to '{var.name}' is smaller than its tensor")
                return False
        by_name = {}
        for ref, k in zip(ins, in_idx):
            var = params[k]
            by_name[var.name] = self._surface(ref).array(var.type.dtype.np, tuple(var.type.shape)).copy()
        results = v["plan"].run([by_name[var.name] for var in fn.inputs])
        if self.eval_latency > 0:
            time.sleep(self.eval_latency)
        if self.evaluations - v.get("evaluations_at_load", 0) >= self.degrade_after:
            self.degraded += 1
        self.evaluations += 1
        for ref, k in zip(outs, out_idx):
            j = results_by_name[k]
            t = fn.outputs[j].type
            target = self._surface(ref).array(t.dtype.np, tuple(t.shape))  # packed at the start (Orion §14)
            target[...] = np.asarray(results[j]).reshape(target.shape).astype(t.dtype.np)
        return True

    # -- chaining ---------------------------------------------------------------------------------------

    def _buffer(self, _: Any, surface_object: int, symbol: int, source: int) -> int:
        value = {"surface": self._obj(surface_object).value, "symbol": self.render(symbol), "source": source}
        return self._new("_ANEBuffer", value, [surface_object, symbol])

    def _output_sets(self, _: Any, stats: int | None, buffers: int) -> int | None:
        if not stats:
            return None  # reported: nil without a statistics surface
        return self._new("_ANEIOSurfaceOutputSets", {"stats": stats, "buffers": buffers}, [stats, buffers])

    def _chaining_request(self, _: Any, inputs: int, output_sets: int, *rest: Any) -> int:
        value = {"inputs": inputs, "output_sets": output_sets, "rest": tuple(self.render(a) for a in rest)}
        return self._new("_ANEChainingRequest", value, [inputs, output_sets, *rest])

    def _validate(self, request: Obj) -> bool:
        return self._outcome("validate")[0] == "ok"

    def _prepare_chaining(
        self, client: Obj, model: int, options: int, request: int, qos: int, err: Any
    ) -> bool:
        selector = "prepareChainingWithModel:options:chainingReq:qos:error:"
        if (failed := self._bool_outcome(selector, err)) is not None:
            return failed
        self._obj(model).value["chain"] = request
        return True

    def _enqueue(self, client: Obj, model: int, output_set: int, options: int, qos: int, err: Any) -> bool:
        failed = self._bool_outcome("enqueueSetsWithModel:outputSet:options:qos:error:", err)
        return True if failed is None else failed

    def _buffers_ready(self, client: Obj, model: int, ready: int, options: int, qos: int, err: Any) -> bool:
        outcome = self._outcome("buffersReadyWithModel:inputBuffers:options:qos:error:")
        if outcome[0] == "fail":
            self._error(err, *outcome[1:])
            return False
        if outcome[0] == "skip":  # accepted, but nothing has run by the time it returns
            return True
        m = self._obj(model)
        request = self._obj(m.value["chain"]).value
        ins = [self._obj(b).value for b in self._obj(request["inputs"]).value]
        (out_set,) = self._obj(request["output_sets"]).value
        outs = [self._obj(b).value for b in self._obj(self._obj(out_set).value["buffers"]).value]
        in_refs, in_idx = [b["surface"] for b in ins], [b["symbol"] for b in ins]
        return self._execute(
            m, in_refs, in_idx, [b["surface"] for b in outs], [b["symbol"] for b in outs], err
        )
