"""A thin ctypes bridge to the Objective-C runtime, Foundation, CoreFoundation and IOSurface on macOS.

Nothing here knows about the Neural Engine; the backend declares its own messages with the same tools.

Where symbols come from
    A ``Libraries`` object hands out the address of a C symbol for a given prototype. The real one,
    ``NativeLibraries``, opens libobjc and the frameworks by path with ``ctypes.CDLL`` on first use
    (never at import, so this module imports on any platform); tests pass a fake that answers with
    ctypes callbacks and records every call.

Typed calls
    ``objc_msgSend`` is never called through a variadic or default prototype: on arm64 the calling
    convention of a variadic call differs from a fixed one, so every message is declared once as a
    ``Message`` with Objective-C type codes and called through ``CFUNCTYPE(restype, id, SEL, *args)``
    built for exactly that signature. Type codes::

        @  id (object)        #  Class          :  SEL            v  void
        B  BOOL (C bool on arm64)                i / I  int32 / uint32
        q  int64 (NSInteger)  Q  uint64 (NSUInteger, size_t)      d  double
        *  const char *       ^v any C pointer (IOSurfaceRef, CFTypeRef, void *)
        ^@ id * (an NSError ** out-parameter, or a C array of ids)

Lookups
    Classes and selectors are looked up once and cached. Before a message is first sent, ``bind``
    checks that its class exists and implements the selector (an unrecognised selector raises an
    Objective-C exception, which would abort the process), and raises ClassNotFound naming the
    missing class or ``+[Class selector]`` and the running macOS version.

Ownership
    Objects returned by convenience constructors are autoreleased: every call that creates them runs
    inside ``autorelease_pool()``. Whatever outlives the pool is ``retain``-ed by its owner and
    ``release``-d exactly once; IOSurfaces follow the CoreFoundation create rule (``CFRelease``).

Errors
    ``nserror_exception`` is the one place where a native failure (a NO / nil result and its
    ``NSError **``) becomes an anekit exception. It reads the error once into an ``NSErrorInfo``
    (domain, code, localized description, ``userInfo`` rendered by ``-description``, and the error
    under ``NSUnderlyingErrorKey``, recursively) and sets it on the exception as ``nserror``, with
    ``domain``, ``code``, ``description``, ``user_info`` and ``underlying`` as shortcuts; the message
    holds all of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import platform
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from anekit.errors import AneRuntimeError, ClassNotFound, SurfaceCreationFailed

# -- type codes ---------------------------------------------------------------------------------------

_ARG_TYPES: dict[str, Any] = {
    "@": ctypes.c_void_p,
    "#": ctypes.c_void_p,
    ":": ctypes.c_void_p,
    "B": ctypes.c_bool,
    "i": ctypes.c_int32,
    "I": ctypes.c_uint32,
    "q": ctypes.c_int64,
    "Q": ctypes.c_uint64,
    "d": ctypes.c_double,
    "*": ctypes.c_char_p,
    "^v": ctypes.c_void_p,
    "^@": ctypes.POINTER(ctypes.c_void_p),
}
# A returned C string is read with string_at (it belongs to the callee); void has no ctypes type.
_RETURN_TYPES: dict[str, Any] = {**_ARG_TYPES, "*": ctypes.c_void_p, "v": None}
_OBJECT_CODES = frozenset("@#")


def _check_codes(what: str, returns: str, args: Sequence[str]) -> None:
    if returns not in _RETURN_TYPES:
        raise ValueError(f"[objc] {what}: unknown return type code {returns!r}")
    for code in args:
        if code not in _ARG_TYPES:
            raise ValueError(f"[objc] {what}: unknown argument type code {code!r}")


def prototype(returns: str, args: Sequence[str], *, receiver: bool = False) -> Any:
    """The ctypes function type for a C signature (``receiver``: prepend ``id self, SEL _cmd``)."""
    head = (ctypes.c_void_p, ctypes.c_void_p) if receiver else ()
    return ctypes.CFUNCTYPE(_RETURN_TYPES[returns], *head, *(_ARG_TYPES[c] for c in args))


class Id(int):
    """An Objective-C object pointer (``id``). A plain ``int`` given to the bridge means a number."""

    def __repr__(self) -> str:
        return f"Id({int(self):#x})"


# -- declarations -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One Objective-C message, ``+[Class selector]`` or ``-[Class selector]``, and its C signature."""

    cls: str
    selector: str
    returns: str = "@"
    args: tuple[str, ...] = ()
    class_method: bool = False

    def __post_init__(self) -> None:
        if self.selector.count(":") != len(self.args):
            raise ValueError(f"[objc] {self}: the selector takes {self.selector.count(':')} arguments")
        _check_codes(str(self), self.returns, self.args)

    def __str__(self) -> str:
        return f"{'+' if self.class_method else '-'}[{self.cls} {self.selector}]"


def msg(spec: str, types: str) -> Message:
    """A message from ``"+[NSString stringWithUTF8String:]"`` and its codes ``"@ *"`` (return first)."""
    kind, _, rest = spec.partition("[")
    cls, _, selector = rest.rstrip("]").partition(" ")
    if kind not in ("+", "-") or not cls or not selector:
        raise ValueError(f"[objc] malformed message spec {spec!r}")
    returns, *args = types.split()
    return Message(cls, selector, returns, tuple(args), kind == "+")


@dataclass(frozen=True)
class CFunction:
    """A C function of one of the libraries, with its signature in type codes."""

    library: str
    name: str
    returns: str
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_codes(self.name, self.returns, self.args)


LIBRARY_PATHS = {
    "objc": "/usr/lib/libobjc.A.dylib",
    "Foundation": "/System/Library/Frameworks/Foundation.framework/Foundation",
    "CoreFoundation": "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation",
    "IOSurface": "/System/Library/Frameworks/IOSurface.framework/IOSurface",
}

C_FUNCTIONS = {
    f.name: f
    for f in (
        CFunction("objc", "objc_getClass", "#", ("*",)),
        CFunction("objc", "sel_registerName", ":", ("*",)),
        CFunction("objc", "class_getClassMethod", "^v", ("#", ":")),
        CFunction("objc", "class_getInstanceMethod", "^v", ("#", ":")),
        CFunction("objc", "objc_retain", "@", ("@",)),
        CFunction("objc", "objc_release", "v", ("@",)),
        CFunction("objc", "objc_autoreleasePoolPush", "^v"),
        CFunction("objc", "objc_autoreleasePoolPop", "v", ("^v",)),
        CFunction("CoreFoundation", "CFRelease", "v", ("^v",)),
        CFunction("Foundation", "NSTemporaryDirectory", "@"),
        CFunction("IOSurface", "IOSurfaceCreate", "^v", ("@",)),  # CFDictionaryRef is an NSDictionary
        CFunction("IOSurface", "IOSurfaceLock", "i", ("^v", "I", "^v")),  # kern_return_t; seed* NULL
        CFunction("IOSurface", "IOSurfaceUnlock", "i", ("^v", "I", "^v")),
        CFunction("IOSurface", "IOSurfaceGetBaseAddress", "^v", ("^v",)),
        CFunction("IOSurface", "IOSurfaceGetAllocSize", "Q", ("^v",)),
        CFunction("IOSurface", "IOSurfaceGetID", "I", ("^v",)),
    )
}

NSSTRING_WITH_UTF8 = msg("+[NSString stringWithUTF8String:]", "@ *")
NSSTRING_UTF8 = msg("-[NSString UTF8String]", "*")
NSDATA_WITH_BYTES = msg("+[NSData dataWithBytes:length:]", "@ ^v Q")
NSNUMBER_WITH_LONGLONG = msg("+[NSNumber numberWithLongLong:]", "@ q")
NSNUMBER_WITH_DOUBLE = msg("+[NSNumber numberWithDouble:]", "@ d")
NSARRAY_WITH_OBJECTS = msg("+[NSArray arrayWithObjects:count:]", "@ ^@ Q")
NSDICTIONARY_WITH_OBJECTS = msg("+[NSDictionary dictionaryWithObjects:forKeys:count:]", "@ ^@ ^@ Q")
NSERROR_DOMAIN = msg("-[NSError domain]", "@")
NSERROR_CODE = msg("-[NSError code]", "q")
NSERROR_DESCRIPTION = msg("-[NSError localizedDescription]", "@")
NSERROR_USER_INFO = msg("-[NSError userInfo]", "@")
NSDICTIONARY_OBJECT_FOR_KEY = msg("-[NSDictionary objectForKey:]", "@ @")
NSDICTIONARY_DESCRIPTION = msg("-[NSDictionary description]", "@")
NSUNDERLYING_ERROR_KEY = "NSUnderlyingError"  # the value of Foundation's NSUnderlyingErrorKey
MAX_UNDERLYING_DEPTH = 4  # NSUnderlyingErrorKey chains followed at most this deep

IOSURFACE_LOCK_READ_ONLY = 1  # kIOSurfaceLockReadOnly
# The IOSurface property keys (kIOSurfaceWidth, ...) are CFSTR constants whose values are these names.
IOSURFACE_KEYS = (
    "IOSurfaceWidth",
    "IOSurfaceHeight",
    "IOSurfaceBytesPerElement",
    "IOSurfaceBytesPerRow",
    "IOSurfaceAllocSize",
    "IOSurfacePixelFormat",
)


@dataclass(frozen=True)
class NSErrorInfo:
    """What an NSError said: read once, when the failure is turned into an anekit exception."""

    domain: str
    code: int
    description: str
    user_info: str = ""  # -[NSDictionary description] of userInfo ("" when it has none)
    underlying: NSErrorInfo | None = None  # the NSError under NSUnderlyingErrorKey

    def details(self) -> str:
        """``NSError domain D, code C[; userInfo {...}][; underlying: ...]`` on one line."""
        text = f"NSError domain {self.domain}, code {self.code}"
        if self.user_info:
            text += f"; userInfo {' '.join(self.user_info.split())}"
        if self.underlying is not None:
            text += f"; underlying: {self.underlying}"
        return text

    def __str__(self) -> str:
        return f"{self.description} ({self.details()})"


# -- where symbols come from ----------------------------------------------------------------------------


class Libraries(Protocol):
    """Loads libraries and hands out symbol addresses (the real dylibs, or a test double)."""

    def load(self, path: str) -> None: ...

    def address(self, library: str, name: str, proto: Any) -> int: ...


class NativeLibraries:
    """The system libraries, opened by path with ctypes.CDLL when the first symbol is needed.

    All of ``paths`` are opened together, so Foundation's classes are registered before any class is
    looked up, whatever is asked for first.
    """

    def __init__(self, paths: Mapping[str, str] = LIBRARY_PATHS) -> None:
        self.paths = dict(paths)
        self._open: dict[str, ctypes.CDLL] = {}

    def _dll(self, path: str) -> ctypes.CDLL:
        dll = self._open.get(path)
        if dll is None:
            dll = self._open[path] = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return dll

    def _base(self, library: str) -> ctypes.CDLL:
        for path in self.paths.values():
            self._dll(path)
        return self._dll(self.paths[library])

    def load(self, path: str) -> None:
        self._base("objc")
        self._dll(path)  # loading a framework registers its classes with the runtime

    def address(self, library: str, name: str, proto: Any) -> int:
        symbol = getattr(self._base(library), name)  # AttributeError when missing
        return int(ctypes.cast(symbol, ctypes.c_void_p).value or 0)


def macos_version() -> str:
    """``macOS 15.1``, or what the machine runs when it is not a Mac."""
    release = platform.mac_ver()[0]
    return f"macOS {release}" if release else f"not macOS: {platform.system()} {platform.release()}"


def macos_release(os_version: str) -> str:
    """The release number of a ``macos_version()`` string ("macOS 26.3 (25D...)" -> "26.3"); "" when it
    names no macOS release."""
    found = re.match(r"macOS (\d+(?:\.\d+)*)", os_version or "")
    return found.group(1) if found else ""


# -- the runtime ----------------------------------------------------------------------------------------


class ObjCRuntime:
    """Typed access to the Objective-C runtime and the Foundation / IOSurface functions it needs."""

    def __init__(
        self,
        libraries: Libraries | None = None,
        *,
        os_version: str | None = None,
        chip_brand: str | None = None,
    ) -> None:
        self.libraries: Libraries = libraries if libraries is not None else NativeLibraries()
        self.os_version = os_version or macos_version()
        # The CPU brand string ("Apple M4 Max") when the libraries know it; None: ask the system (sysctl).
        self.chip_brand = chip_brand
        self._functions: dict[str, Callable[..., Any]] = {}
        self._senders: dict[tuple[str, tuple[str, ...]], Callable[..., Any]] = {}
        self._classes: dict[str, int] = {}
        self._selectors: dict[str, int] = {}
        self._bound: dict[Message, tuple[int, int]] = {}

    # -- symbols and lookups --------------------------------------------------------------------------

    def load_framework(self, path: str) -> None:
        """Load a framework so its classes register; ClassNotFound when it does not load."""
        try:
            self.libraries.load(path)
        except OSError as e:
            raise ClassNotFound(f"[objc] cannot load {path} ({self.os_version}): {e}") from e

    def function(self, name: str) -> Callable[..., Any]:
        """The typed C function ``name`` (declared in C_FUNCTIONS), resolved once."""
        fn = self._functions.get(name)
        if fn is None:
            decl = C_FUNCTIONS[name]
            proto = prototype(decl.returns, decl.args)
            try:
                address = self.libraries.address(decl.library, name, proto)
            except (AttributeError, OSError, KeyError) as e:
                raise ClassNotFound(
                    f"[objc] function {name} not found in {decl.library} ({self.os_version})"
                ) from e
            fn = self._functions[name] = proto(address)
        return fn

    def call(self, name: str, *args: Any) -> Any:
        return self.function(name)(*args)

    def lookup_class(self, name: str) -> int:
        """The class pointer, or 0 when no such class is registered (cached once found)."""
        ptr = self._classes.get(name)
        if ptr is None:
            ptr = int(self.call("objc_getClass", name.encode()) or 0)
            if ptr:
                self._classes[name] = ptr
        return ptr

    def cls(self, name: str) -> Id:
        ptr = self.lookup_class(name)
        if not ptr:
            raise ClassNotFound(f"[objc] class {name} not found ({self.os_version})")
        return Id(ptr)

    def sel(self, name: str) -> int:
        ptr = self._selectors.get(name)
        if ptr is None:
            ptr = self._selectors[name] = int(self.call("sel_registerName", name.encode()) or 0)
        return ptr

    def missing(self, message: Message) -> str | None:
        """What is missing for ``message`` (``class X`` or ``+[X sel]``), or None when it can be sent."""
        if message in self._bound:
            return None
        cls = self.lookup_class(message.cls)
        if not cls:
            return f"class {message.cls}"
        lookup = "class_getClassMethod" if message.class_method else "class_getInstanceMethod"
        sel = self.sel(message.selector)
        if not self.call(lookup, cls, sel):
            return str(message)
        self._bound[message] = (cls, sel)
        return None

    def bind(self, message: Message) -> tuple[int, int]:
        """(class, selector) for ``message``; ClassNotFound naming what is missing and the macOS version."""
        missing = self.missing(message)
        if missing is not None:
            what = "is not registered" if missing.startswith("class ") else "is not implemented"
            raise ClassNotFound(
                f"[objc] {missing} {what} ({self.os_version}); needed for {message} — the framework "
                "differs on this version"
            )
        return self._bound[message]

    # -- messages -------------------------------------------------------------------------------------

    def _sender(self, message: Message) -> Callable[..., Any]:
        key = (message.returns, message.args)
        fn = self._senders.get(key)
        if fn is None:
            proto = prototype(message.returns, message.args, receiver=True)
            fn = self._senders[key] = proto(self.libraries.address("objc", "objc_msgSend", proto))
        return fn

    def send(self, message: Message, *args: Any, to: int | None = None) -> Any:
        """Send ``message`` to ``to`` (default: its class, for a class method); objects come back as Id."""
        cls, sel = self.bind(message)
        if message.class_method and to is None:
            to = cls
        if not to:
            raise AneRuntimeError(f"[objc] {message} sent to nil")
        result = self._sender(message)(to, sel, *args)
        if message.returns in _OBJECT_CODES:
            return Id(result) if result else None
        return result

    def send_checked(
        self, message: Message, *args: Any, to: int | None = None, fails: type[AneRuntimeError], what: str
    ) -> Any:
        """Send a message whose last argument is ``NSError **``; a NO / nil result raises ``fails``."""
        error = ctypes.c_void_p()
        result = self.send(message, *args, ctypes.byref(error), to=to)
        if not result:
            raise self.nserror_exception(error.value, fails, what)
        return result

    def nserror_info(self, error: int, depth: int = 0) -> NSErrorInfo:
        """Everything an NSError says: domain, code, description, userInfo and its underlying error."""
        domain = self.to_str(self.send(NSERROR_DOMAIN, to=error))
        code = int(self.send(NSERROR_CODE, to=error))
        description = self.to_str(self.send(NSERROR_DESCRIPTION, to=error))
        user_info, underlying = "", None
        info = self.send(NSERROR_USER_INFO, to=error)
        if info:
            user_info = self.to_str(self.send(NSDICTIONARY_DESCRIPTION, to=info))
            if depth < MAX_UNDERLYING_DEPTH:
                with self.autorelease_pool():
                    key = self.string(NSUNDERLYING_ERROR_KEY)
                    under = self.send(NSDICTIONARY_OBJECT_FOR_KEY, key, to=info)
                    if under:
                        underlying = self.nserror_info(under, depth + 1)
        return NSErrorInfo(domain, code, description, user_info, underlying)

    def nserror_exception(
        self, error: int | None, fails: type[AneRuntimeError], what: str
    ) -> AneRuntimeError:
        """The anekit exception for a failed call and its NSError (None: the call gave no error)."""
        info = self.nserror_info(error) if error else None
        if info is not None:
            exc = fails(f"{what} failed: {info.description} ({info.details()}; {self.os_version})")
        else:
            exc = fails(f"{what} failed without an NSError ({self.os_version})")
        exc.nserror = info  # type: ignore[attr-defined]
        exc.domain = info.domain if info else None
        exc.code = info.code if info else None
        exc.description = info.description if info else None
        exc.user_info = info.user_info if info else None  # type: ignore[attr-defined]
        exc.underlying = info.underlying if info else None  # type: ignore[attr-defined]
        return exc

    # -- ownership ------------------------------------------------------------------------------------

    def retain(self, obj: int) -> Id:
        return Id(self.call("objc_retain", obj))

    def release(self, obj: int | None) -> None:
        if obj:
            self.call("objc_release", obj)

    @contextlib.contextmanager
    def autorelease_pool(self) -> Iterator[None]:
        """Autoreleased objects created inside are released when the block ends."""
        pool = self.call("objc_autoreleasePoolPush")
        try:
            yield
        finally:
            self.call("objc_autoreleasePoolPop", pool)

    # -- Foundation bridging (results are autoreleased: call inside a pool) ---------------------------

    def string(self, text: str) -> Id:
        return self.send(NSSTRING_WITH_UTF8, text.encode("utf-8"))

    def to_str(self, obj: int | None) -> str:
        if not obj:
            return ""
        ptr = self.send(NSSTRING_UTF8, to=obj)
        return ctypes.string_at(ptr).decode("utf-8", "replace") if ptr else ""

    def data(self, blob: bytes | bytearray | memoryview) -> Id:
        raw = blob if isinstance(blob, bytes) else bytes(blob)
        return self.send(NSDATA_WITH_BYTES, raw, len(raw))

    def number(self, value: float) -> Id:
        if isinstance(value, float):
            return self.send(NSNUMBER_WITH_DOUBLE, value)
        return self.send(NSNUMBER_WITH_LONGLONG, int(value))

    def array(self, items: Sequence[Any]) -> Id:
        objs = [self.bridge(v) for v in items]
        return self.send(NSARRAY_WITH_OBJECTS, (ctypes.c_void_p * len(objs))(*objs), len(objs))

    def dictionary(self, mapping: Mapping[str, Any]) -> Id:
        keys = [self.bridge(k) for k in mapping]
        values = [self.bridge(v) for v in mapping.values()]
        n = len(keys)
        return self.send(
            NSDICTIONARY_WITH_OBJECTS, (ctypes.c_void_p * n)(*values), (ctypes.c_void_p * n)(*keys), n
        )

    def bridge(self, value: Any) -> Id:
        """A Foundation object for a Python value: str, bytes, int / float, dict, list / tuple, or an Id."""
        if isinstance(value, Id):
            return value
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self.data(value)
        if isinstance(value, (int, float)):
            return self.number(value)
        if isinstance(value, Mapping):
            return self.dictionary(value)
        if isinstance(value, (list, tuple)):
            return self.array(value)
        raise TypeError(f"[objc] cannot bridge {type(value).__name__} to a Foundation object")

    def temporary_directory(self) -> str:
        """``NSTemporaryDirectory()``: the per-user temporary directory."""
        with self.autorelease_pool():
            return self.to_str(self.call("NSTemporaryDirectory"))

    # -- IOSurface ------------------------------------------------------------------------------------

    def iosurface_create(self, nbytes: int) -> int:
        """A one-row surface of ``nbytes`` bytes (width = bytes-per-row = alloc size, pixel format 0)."""
        with self.autorelease_pool():
            values = (nbytes, 1, 1, nbytes, nbytes, 0)
            ref = self.call("IOSurfaceCreate", self.dictionary(dict(zip(IOSURFACE_KEYS, values))))
        if not ref:
            raise SurfaceCreationFailed(
                f"[objc] IOSurfaceCreate of {nbytes} bytes failed ({self.os_version})"
            )
        return int(ref)

    def iosurface_lock(self, ref: int, read_only: bool) -> None:
        options = IOSURFACE_LOCK_READ_ONLY if read_only else 0
        status = self.call("IOSurfaceLock", ref, options, None)
        if status:
            raise SurfaceCreationFailed(f"[objc] IOSurfaceLock failed with kern_return {status:#x}")

    def iosurface_unlock(self, ref: int, read_only: bool) -> None:
        options = IOSURFACE_LOCK_READ_ONLY if read_only else 0
        status = self.call("IOSurfaceUnlock", ref, options, None)
        if status:
            raise SurfaceCreationFailed(f"[objc] IOSurfaceUnlock failed with kern_return {status:#x}")

    def cf_release(self, ref: int) -> None:
        if ref:
            self.call("CFRelease", ref)
