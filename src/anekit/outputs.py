"""Output paths checked before any work, and write failures turned into one anekit error naming the path.

Every command that writes goes through the same three steps, so a bad output location costs the user no
work and leaves nothing behind:

1. ``check_file`` / ``check_dir`` (``check_cache`` for a cache, whose directories may be created) before
   the work starts: the output must not be a directory where a file is wanted (or a file where a
   directory is), its parent directory must exist (anekit does not create missing parents: a typo in a
   path should not grow a tree), no part of the path may be a file, and the parent must be writable.
2. The write itself goes through an atomic writer (``anekit.fileio.atomic_write``, ``BlobWriter``, or a
   temporary directory renamed into place), so an interrupted or failed write leaves only the previous
   content.
3. ``writing`` wraps the write: an ``OSError`` (a full disk, a quota, a file size limit, a permission
   that changed) becomes one ``OutputError`` line: "[cmd] --flag PATH: no space left on the device".
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from anekit.errors import AnekitError
from anekit.inputs import shown

# What an OSError's errno means for an output, in the words the user needs (the strerror text of some
# platforms, e.g. "File too large", does not say that a limit was hit).
REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the file system or the process's file size limit",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EISDIR: "is a directory",
    errno.ENOENT: "no such file or directory",
    errno.ENAMETOOLONG: "file name too long",
}


class OutputError(AnekitError):
    """An output location that cannot be written, found before the work or when writing."""


def reason(e: OSError) -> str:
    """A short explanation of a failed write (the errno's meaning, else the OS's own text)."""
    return REASONS.get(e.errno or 0) or e.strerror or type(e).__name__


def _parent_problem(path: Path) -> str | None:
    """Why ``path``'s parent cannot hold a new entry, or None when it can."""
    parent = path.parent
    if parent.is_dir():
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"not writable (directory {parent})"
        return None
    for up in (parent, *parent.parents):  # the nearest part of the path that exists
        if up.exists() or up.is_symlink():
            if not up.is_dir():
                return f"{up} is a file, not a directory"
            break
    return f"directory {parent} does not exist"


@contextlib.contextmanager
def _looking(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """An ``OSError`` raised while looking at ``path`` (a name too long for the OS, a loop of links)
    becomes one ``OutputError`` line naming the path, shortened."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"{what} {shown(path)}: {reason(e)}") from e
    except ValueError as e:  # a NUL byte in the path
        raise OutputError(f"{what} {shown(path)}: not a valid path") from e


def check_file(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, an output file ``path`` that cannot be written (``_check_file``)."""
    with _looking(path, what):
        return _check_file(path, what)


def check_dir(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, an output directory ``path`` that cannot be created (``_check_dir``)."""
    with _looking(path, what):
        return _check_dir(path, what)


def check_cache(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse a cache file ``path`` that cannot be created (``_check_cache``)."""
    with _looking(path, what):
        return _check_cache(path, what)


def _check_file(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, an output file ``path`` that cannot be written; ``what`` names the output
    in the message ("[run] --output"). An existing file is fine (it is replaced atomically)."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise OutputError(f"{what} {path}: names a directory, not a file")
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a directory, not a file")
    problem = _parent_problem(path)
    if problem:
        raise OutputError(f"{what} {path}: {problem}")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"{what} {path}: the existing file is not writable")
    return path


def _check_dir(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, an output directory ``path`` that cannot be created (or replaced): a file
    in its place, a missing or read-only parent. Whether an existing directory may be replaced is the
    command's decision (see ``looks_like``)."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise OutputError(f"{what} {path}: give the name of a new directory")
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path}: is a file, not a directory")
    problem = _parent_problem(path)
    if problem:
        raise OutputError(f"{what} {path}: {problem}")
    return path


def _check_cache(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse a cache file ``path`` that cannot be created: its directories may be missing (a cache makes
    them), but the nearest existing one must be a writable directory, and ``path`` must not be one."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a directory, not a file")
    for up in path.parents:
        if up.exists() or up.is_symlink():
            if not up.is_dir():
                raise OutputError(f"{what} {path}: {up} is a file, not a directory")
            if not os.access(up, os.W_OK | os.X_OK):
                raise OutputError(f"{what} {path}: not writable (directory {up})")
            break
    return path


def looks_like(path: Path, *markers: str) -> bool:
    """True when the directory ``path`` holds one of the ``markers`` files: the sign that anekit wrote it
    (``kernels.json`` of a kernels dump, ``Manifest.json`` of a package, ``shards.json`` of shards), so
    ``--force`` may replace it. A directory without one is never deleted."""
    try:
        return path.is_dir() and not path.is_symlink() and any((path / m).is_file() for m in markers)
    except (OSError, ValueError):  # a path the OS cannot look up holds no marker
        return False


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Turn an ``OSError`` raised while writing ``path`` into one ``OutputError`` line."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"{what} {path}: cannot write: {reason(e)}") from e
