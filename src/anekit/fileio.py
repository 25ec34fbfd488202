"""Atomic file writes: a temporary file beside the target, fsync'd, renamed over it; never half-written.

A fault-injection hook (``fault_hook``) lets tests stop a write at every point a kill could land
(after the temporary file is created, before each write, before the fsync, before and after the
rename); ``SimulatedCrash`` raised from it stands for the process dying there, so the writer does no
cleanup and leaves exactly what a killed process would. ``remove_stale_temporaries`` removes such
leftovers on the next run.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

# The points of an atomic write a fault hook is called at, in order ("write" once per write call).
FAULT_POINTS = ("open", "write", "fsync", "rename", "renamed")

# Called as fault_hook(point, path) at each point of every atomic write when set (tests only).
fault_hook: Callable[[str, Path], None] | None = None

_TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{8}\.tmp$")  # what atomic_write names its temporary files


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


def temporary_name(path: Path) -> Path:
    """A fresh temporary name beside ``path``: ``.name.<8 hex>.tmp``."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def is_temporary(path: Path) -> bool:
    """Whether ``path`` is named as ``atomic_write`` names its temporary files."""
    return bool(_TEMP_NAME.match(path.name))


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path`` for writing; on a clean exit fsync it and rename it over
    ``path``. On an exception the temporary file is removed and ``path`` is left as it was; a process
    killed mid-write leaves at most a hidden ``.name.xxxxxxxx.tmp`` file, never a half-written ``path``."""
    path = Path(path)
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
            yield _HookedFile(f, path) if fault_hook is not None else f  # type: ignore[misc]
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


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Remove the temporary files interrupted atomic writes left in ``directory`` (not recursive);
    return what was removed. Only names of ``atomic_write``'s own pattern are touched."""
    removed = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for p in entries:
        if is_temporary(p) and p.is_file() and not p.is_symlink():
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def replace_path(new: str | os.PathLike, out: str | os.PathLike) -> None:
    """Move the finished file or directory ``new`` to ``out`` (same file system). A previous ``out`` is
    moved aside first and removed only once ``new`` is in place; if that fails it is put back."""
    new, out = Path(new), Path(out)
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
