"""Atomic file writes: a temporary file beside the target, fsync'd, renamed over it; never half-written.

A fault-injection hook (``fault_hook``) lets tests stop a write at every point a kill could land
(after the temporary file is created, before each write, before the fsync, before and after the
rename); ``SimulatedCrash`` raised from it stands for the process dying there, so the writer does no
cleanup and leaves exactly what a killed process would. ``remove_stale_temporaries`` removes such
leftovers on the next run.

Temporary names carry their kind and their writer's pid (``.name.<kind>-<pid>.<8 hex>.tmp``), so a
starting run removes only leftovers of its own kind whose writer is dead, never another live process's
in-flight file. ``DirLock`` is one writer per output directory (``fcntl.flock`` on a lock file it creates and
removes).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

from anekit.errors import AnekitError
from anekit.inputs import kind_of, shown

# The points of an atomic write a fault hook is called at, in order ("write" once per write call).
FAULT_POINTS = ("open", "write", "fsync", "rename", "renamed")

# Called as fault_hook(point, path) at each point of every atomic write when set (tests only).
fault_hook: Callable[[str, Path], None] | None = None

# What temporary_name makes: ".name.<kind>-<pid>.<8 hex>.tmp"; older anekit wrote ".name.<8 hex>.tmp".
_TEMP_NAME = re.compile(r"^\..+?(?:\.(?P<kind>[a-z]+)-(?P<pid>[0-9]+))?\.[0-9a-f]{8}\.tmp$")
WRITE_KIND = "write"  # the kind of atomic_write's temporary files


class SimulatedCrash(BaseException):
    """Raised by a fault hook to stand for the process being killed at that point: ``atomic_write``
    lets it through without removing its temporary file, as a real kill would."""


def _fault(point: str, path: Path) -> None:
    if fault_hook is not None:
        fault_hook(point, path)


class _HookedFile:
    """A file whose every ``write`` first passes the fault hook (used only while a hook is set)."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self._f = f
        self._path = path

    def write(self, data: Any) -> int:
        _fault("write", self._path)
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def temporary_name(path: Path, kind: str = WRITE_KIND) -> Path:
    """A fresh temporary name beside ``path``: ``.name.<kind>-<pid>.<8 hex>.tmp``."""
    if not kind.isalpha() or not kind.islower():
        raise ValueError(f"a temporary's kind is lowercase letters, not {kind!r}")
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}.{secrets.token_hex(4)}.tmp")


def is_temporary(path: Path, kind: str | None = None) -> bool:
    """Whether ``path`` is named as ``temporary_name`` names temporaries (of ``kind``, when given; a name of
    older anekit, without kind and pid, counts as ``atomic_write``'s)."""
    m = _TEMP_NAME.match(path.name)
    return m is not None and (kind is None or (m["kind"] or WRITE_KIND) == kind)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process's own leftover (a write cut short before it re-executed itself)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's process, or a pid we cannot ask about: assume it lives
    return True


def is_stale(path: Path, kind: str) -> bool:
    """Whether ``path`` is a temporary of ``kind`` whose writer is no longer running (or of older anekit)."""
    m = _TEMP_NAME.match(path.name)
    if not m or (m["kind"] or WRITE_KIND) != kind:
        return False
    return m["pid"] is None or not _alive(int(m["pid"]))


class NotReplaceable(AnekitError):
    """An output path holding a device, FIFO or socket: anekit renames only over a regular file."""


def _special_kind(path: Path, follow: bool) -> tuple[str, int] | None:
    """What ``path`` is when it is neither a regular file nor a directory (nor, unless ``follow``, a
    symlink), with its mode; None when it is one of those or nothing is there."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return None  # nothing there, or a path the write itself will fail on with its own error
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
        return None
    return kind_of(st.st_mode), st.st_mode


def _refuse_special(path: Path, kind: str) -> NotReplaceable:
    return NotReplaceable(
        f"[write] {shown(path)}: {kind}, not a regular file; anekit never replaces a device, FIFO, socket or "
        "link: choose a file name"
    )


@contextlib.contextmanager
def _write_into(path: Path) -> Iterator[BinaryIO]:
    """Write into the character device or FIFO ``path`` as it is: no temporary, no rename, no fsync. A FIFO
    is opened without blocking: with no reader it fails at once (ENXIO) instead of waiting for one."""
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # writes block
        f = os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f
        f.flush()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, *, devices: bool = False) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path`` for writing; on a clean exit fsync it and rename it over
    ``path``. On an exception the temporary file is removed and ``path`` is left as it was; a process
    killed mid-write leaves at most a hidden ``.name.xxxxxxxx.tmp`` file, never a half-written ``path``.

    The rename is only ever done over a regular file (or nothing): a symlink is written through (its
    target is replaced, the link stays), a device, FIFO or socket is refused (``NotReplaceable``), except
    that with ``devices`` a character device or FIFO (``/dev/null``, a terminal, a pipe) is written into as
    it is."""
    path = Path(path)
    special = _special_kind(path, follow=True)
    if special is not None:
        if devices and (stat.S_ISCHR(special[1]) or stat.S_ISFIFO(special[1])):
            with _write_into(path) as f:
                yield f
            return
        raise _refuse_special(path, special[0])
    if path.is_symlink():  # /dev/stdout redirected to a file: that file is replaced, never the link
        path = Path(os.path.realpath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = temporary_name(path)
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    try:
        f = os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        with f:
            _fault("open", path)
            # the hooked file stands in for the file: it forwards everything but ``write`` to it
            yield cast(BinaryIO, _HookedFile(f, path)) if fault_hook is not None else f
            f.flush()
            _fault("fsync", path)
            os.fsync(f.fileno())
        _fault("rename", path)
        os.replace(tmp, path)
    except SimulatedCrash:
        raise  # the process is "dead": nothing runs after this point, the temporary file stays
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fault("renamed", path)
    with contextlib.suppress(OSError, AttributeError):  # make the rename durable (POSIX only)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (creating the parent directory)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        f.write(data)


def remove_stale_temporaries(directory: str | os.PathLike, kind: str = WRITE_KIND) -> list[Path]:
    """Remove the temporaries of ``kind`` that dead writers left in ``directory`` (not recursive; files,
    and directories for the kinds that write directories); return what was removed. A live process's
    temporary, or another kind's, is never touched."""
    removed: list[Path] = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for p in entries:
        if not is_stale(p, kind) or p.is_symlink():
            continue
        with contextlib.suppress(OSError):
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
    return removed


def temporary_dir(out: Path, kind: str) -> Path:
    """A new empty directory beside ``out`` named as ``temporary_name`` names ``kind``'s temporaries."""
    out.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = temporary_name(out, kind)
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def terminate_unwinds(what: str) -> Iterator[None]:
    """While a writer runs, SIGTERM unwinds the stack (one line, then exit 143) instead of killing the
    process where it stands, so the writer's own cleanup removes its temporaries; SIGKILL cannot be caught,
    and what it leaves the next writer of the kind removes (``remove_stale_temporaries``)."""
    import signal

    def handle(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(
                f"anekit: {what} stopped by SIGTERM; its partial output is removed",
                file=sys.stderr,
                flush=True,
            )
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handle)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


LOCK_FILE = ".anekit.lock"  # in an output directory: held (flock) by the one process writing it


class DirectoryBusy(AnekitError):
    """Another process holds the output directory's lock."""


class DirLock:
    """One writer per output directory: an exclusive ``flock`` on ``directory/.anekit.lock``.

    The lock file is this holder's own: ``acquire`` creates it (``O_EXCL``), writes the holder's pid,
    host, start time and command into it once (what the refusal of a second writer names), and
    ``release`` removes it, so no lock file is left after a run. A file found at the path is never
    written: a live holder's refuses this writer (naming that holder); one whose flock is free (left by a
    killed holder, or any file put there) is unlinked, its bytes untouched (a hard link to it keeps
    them), and a new one created. A symbolic link, FIFO or device at the path is refused, never opened
    for writing. Because a releasing holder (or a writer clearing a stale file) removes the file while
    holding its flock, ``acquire`` checks after its flock that the file it locked is still the one at the
    path, and starts again when it is not.

    ``beside(target)`` is the same lock for a writer that replaces ``target`` whole. A process that
    re-executes itself keeps the lock: ``inherit()`` marks the descriptor inheritable and names it in
    ``$ANEKIT_LOCK_FD``; the new program's ``acquire`` adopts it (same file, same open description)
    instead of contending with itself."""

    ENV = "ANEKIT_LOCK_FD"

    def __init__(self, directory: str | os.PathLike, what: str) -> None:
        self.path = Path(directory) / LOCK_FILE
        self.target = Path(directory)  # what the lock guards, as the refusal names it
        self.what = what  # e.g. "anekit train": who holds it, in the holder's line
        self.fd: int | None = None
        self._created = False  # whether the last ``_lock_once`` created the file it locked

    @classmethod
    def beside(cls, target: str | os.PathLike, what: str) -> DirLock:
        """The lock of a writer that replaces ``target`` whole (``export``, ``kernels dump``): the target
        is renamed into place at the end, so the lock cannot live inside it. It is the file
        ``.<name>.anekit.lock`` beside ``target`` (its directory created when missing)."""
        target = Path(target)
        lock = cls(target.parent, what)
        lock.path = target.parent / f".{target.name}{LOCK_FILE}"
        lock.target = target
        return lock

    def acquire(self) -> DirLock:
        adopted = self._adopt()
        if adopted is not None:
            self.fd = adopted
            return self
        if self.target != self.path.parent:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):  # a lock file removed between open and flock: open the one now there
            fd = self._lock_once()
            if not _same_file(fd, self.path):
                os.close(fd)
                continue
            if self._created:
                break
            self._remove_stale(fd)
        else:
            raise AnekitError(f"[lock] {self.path} keeps being replaced; is another anekit removing it?")
        self.fd = fd
        line = (
            f"{self.what}, pid {os.getpid()} on {socket.gethostname()}, since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime())}\n"
        )
        with contextlib.suppress(OSError):
            os.pwrite(fd, line.encode(), 0)  # the file is this holder's, created empty just now
        return self

    def _remove_stale(self, fd: int) -> None:
        """Unlink a lock file this writer found and locked (nobody holds it), then close it."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            os.close(fd)
            raise AnekitError(f"[lock] cannot remove the stale lock file {self.path}: {e.strerror}") from e
        os.close(fd)

    def _open(self) -> int:
        """The lock file's descriptor, created when absent (``_created`` says which); a path that is not
        a regular file is refused."""
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        flags |= getattr(os, "O_CLOEXEC", 0)
        while True:
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                self._created = True
                return fd
            except FileExistsError:
                pass
            except OSError as e:
                raise AnekitError(f"[lock] cannot create {self.path}: {e.strerror}") from e
            try:
                fd = os.open(self.path, flags)
            except FileNotFoundError:
                continue  # removed in between: create it
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise AnekitError(f"[lock] {self.path} is a symbolic link, not a lock file") from e
                raise AnekitError(f"[lock] cannot open {self.path}: {e.strerror}") from e
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise AnekitError(f"[lock] {self.path} is not a regular file (a lock file is)")
            self._created = False
            return fd

    def _lock_once(self) -> int:
        """Open the lock file and take its flock, or refuse naming the holder."""
        import fcntl

        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise DirectoryBusy(
                f"[lock] {self.target} is being written by another process ({holder}); wait for it "
                "to finish or use another output path"
            ) from None
        return fd

    def _adopt(self) -> int | None:
        """The lock descriptor a re-executed parent left this process, when it is this file's."""
        text = os.environ.pop(self.ENV, None)
        if text is None or not text.isdigit():
            return None
        fd = int(text)
        try:
            a, b = os.fstat(fd), os.stat(self.path)
        except OSError:
            return None
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
            return None
        os.set_inheritable(fd, False)
        return fd

    def inherit(self) -> None:
        """Keep the lock across an ``exec`` of this process (see the class docstring)."""
        if self.fd is not None:
            os.set_inheritable(self.fd, True)
            os.environ[self.ENV] = str(self.fd)

    def release(self) -> None:
        """Remove the lock file (while still holding it: a waiting writer's ``acquire`` sees it went)
        and drop the flock."""
        if self.fd is not None:
            if _same_file(self.fd, self.path):
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(self.fd)  # closing the only descriptor of the open description drops the flock
            self.fd = None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open ``fd`` is the file now at ``path``."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def replace_path(new: str | os.PathLike, out: str | os.PathLike) -> None:
    """Move the finished file or directory ``new`` to ``out`` (same file system). A previous ``out`` is
    moved aside first and removed only once ``new`` is in place; if that fails it is put back. A device,
    FIFO or socket at ``out`` is refused (``NotReplaceable``), never moved."""
    new, out = Path(new), Path(out)
    special = _special_kind(out, follow=False)
    if special is not None or out.is_symlink():  # moved aside and removed, a node or a link would be gone
        raise _refuse_special(out, special[0] if special is not None else "a symbolic link")
    aside: Path | None = None
    if out.exists() or out.is_symlink():
        aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.replace(out, aside / out.name)
    try:
        os.replace(new, out)
    except BaseException:
        if aside is not None:
            os.replace(aside / out.name, out)
            aside.rmdir()
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


CACHE_ENV = "ANEKIT_CACHE"  # the per-user cache directory


def user_cache_dir() -> Path:
    """The per-user anekit cache: $ANEKIT_CACHE, else $XDG_CACHE_HOME/anekit, else ~/.cache/anekit."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "anekit"
    return Path.home() / ".cache" / "anekit"
