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

Inputs are sacred: ``check_apart`` refuses an output that is, holds or lies inside one of the command's
inputs, compared by identity (``st_dev`` / ``st_ino``, so a symlink, a hard link or a bind mount of an input
is the input), whatever ``--force`` says: ``--force`` replaces what OUT holds, never an input. A device, a
FIFO or a socket is never replaced: ``check_file`` refuses one, except where a command writes its one text
output straight into it (``devices=True``: ``doctor --json /dev/stdout``), and the writers of
``anekit.fileio`` never rename over anything but a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from anekit.errors import AnekitError
from anekit.inputs import kind_of, shown

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
    errno.ENXIO: "a FIFO that no process reads",
}

# The bytes a temporary or lock name beside an output adds to the output's own name
# (".NAME.<kind>-<pid>.<8 hex>.tmp", ".NAME.anekit.lock", ".NAME.<8 chars>.old"): a name within this of
# the file system's limit would fail only when written, after the work.
TEMP_NAME_EXTRA = 32
NAME_MAX_DEFAULT = 255  # a name's bytes where the file system does not say (POSIX systems' usual limit)
HARD_LINK_SCAN = 4096  # entries of a directory compared for hard links; a model directory holds a few


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


def _stat(path: Path) -> os.stat_result | None:
    """``os.stat`` of ``path`` (links followed), None when nothing is there or a link dangles; a path the
    OS cannot look up raises (``looking`` turns it into one line)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # a part of the path a file: _parent_problem says it
        return None


def _name_problem(path: Path) -> str | None:
    """Why ``path``'s name cannot be written through a temporary name beside it, or None: the temporary
    (``TEMP_NAME_EXTRA`` bytes longer) must fit the file system's limit on a name."""
    try:
        limit = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = NAME_MAX_DEFAULT
    size = len(os.fsencode(path.name))
    if size + TEMP_NAME_EXTRA <= limit:
        return None
    return (
        f"file name too long: {size} bytes, and its temporary name beside it {TEMP_NAME_EXTRA} more, over "
        f"the file system's {limit}-byte limit (at most {limit - TEMP_NAME_EXTRA} bytes here)"
    )


@contextlib.contextmanager
def looking(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """An ``OSError`` raised while looking at ``path`` (a name too long for the OS, a loop of links)
    becomes one ``OutputError`` line naming the path, shortened."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"{what} {shown(path)}: {reason(e)}") from e
    except ValueError as e:  # a NUL byte in the path
        raise OutputError(f"{what} {shown(path)}: not a valid path") from e


def check_file(path: str | os.PathLike[str], what: str, *, devices: bool = False) -> Path:
    """Refuse, before any work, an output file ``path`` that cannot be written (``_check_file``)."""
    with looking(path, what):
        return _check_file(path, what, devices)


def check_dir(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, an output directory ``path`` that cannot be created (``_check_dir``)."""
    with looking(path, what):
        return _check_dir(path, what)


def check_cache(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse a cache file ``path`` that cannot be created (``_check_cache``)."""
    with looking(path, what):
        return _check_cache(path, what)


def _check_file(path: str | os.PathLike[str], what: str, devices: bool = False) -> Path:
    """Refuse, before any work, an output file ``path`` that cannot be written; ``what`` names the output
    in the message ("[run] --output"). An existing file is fine (it is replaced atomically); a device, FIFO
    or socket is refused, except a character device or FIFO when ``devices`` (written into, not replaced)."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise OutputError(f"{what} {path}: names a directory, not a file")
    st = _stat(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{what} {path}: is a directory, not a file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if devices and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            if not os.access(path, os.W_OK):
                raise OutputError(f"{what} {path}: {kind_of(st.st_mode)} that is not writable")
            return path  # written into as it is, never replaced (anekit.fileio.atomic_write)
        raise OutputError(
            f"{what} {path}: {kind_of(st.st_mode)}, not a regular file; anekit writes an output only "
            "as a regular file and never replaces a device, FIFO or socket: choose a file name"
        )
    problem = _parent_problem(path)
    if problem:
        raise OutputError(f"{what} {path}: {problem}")
    problem = _name_problem(path)
    if problem:
        raise OutputError(f"{what} {shown(path)}: {problem}")
    if st is not None and not os.access(path, os.W_OK):
        raise OutputError(f"{what} {path}: the existing file is not writable")
    return path


def _check_dir(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, an output directory ``path`` that cannot be created (or replaced): a file
    in its place, a missing or read-only parent. Whether an existing directory may be replaced is the
    command's decision (see ``looks_like``)."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise OutputError(f"{what} {path}: give the name of a new directory")
    st = _stat(path)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
        raise OutputError(f"{what} {path}: is {kind}, not a directory")
    problem = _parent_problem(path)
    if problem:
        raise OutputError(f"{what} {path}: {problem}")
    problem = _name_problem(path)
    if problem:
        raise OutputError(f"{what} {shown(path)}: {problem}")
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


# --------------------------------------------------------------------------------------------------------
# inputs are sacred

Identity = tuple[int, int]  # (st_dev, st_ino): one file or directory, whatever names lead to it


def _identity(path: str | os.PathLike[str]) -> Identity | None:
    """The file ``path`` leads to (links followed), None when there is none or the OS cannot look it up."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _above(path: str | os.PathLike[str]) -> set[Identity]:
    """The directories above ``path`` once its links are resolved, by identity (a bind mount of one is it)."""
    real = Path(os.path.realpath(path))
    return {ident for ident in map(_identity, real.parents) if ident is not None}


def _files(path: str | os.PathLike[str]) -> dict[Identity, Path]:
    """The regular files ``path`` is or directly holds (at most ``HARD_LINK_SCAN`` entries), by identity."""
    found: dict[Identity, Path] = {}
    try:
        if not os.path.isdir(path):
            st = os.stat(path)
            return {(st.st_dev, st.st_ino): Path(path)} if stat.S_ISREG(st.st_mode) else {}
        with os.scandir(path) as entries:
            for _, entry in zip(range(HARD_LINK_SCAN), entries):
                st = entry.stat()
                if stat.S_ISREG(st.st_mode):
                    found[(st.st_dev, st.st_ino)] = Path(entry.path)
    except (OSError, ValueError):
        pass
    return found


def _relation(out: Path, inp: Path) -> str | None:
    """How the output ``out`` meets the existing input ``inp`` ("is the input {input}" with ``{input}`` to
    fill in), or None when they are apart."""
    out_id, in_id = _identity(out), _identity(inp)
    if in_id is None:
        return None  # a missing input: its own check says so
    if out_id == in_id:
        same = os.path.abspath(out) == os.path.abspath(inp)
        return "is the input {input}" + ("" if same else " (the same one, by a link or another name)")
    if in_id in _above(out):
        return "is inside the input {input}"
    if out_id is not None and out_id in _above(inp):
        return "holds the input {input}"
    if out_id is not None and os.path.isdir(out):
        held = _files(out)
        shared = set(held) & set(_files(inp))
        if shared:
            return f"holds {shown(held[min(shared)].name)}, a hard link of a file of the input {{input}}"
    return None


def check_apart(
    out: str | os.PathLike[str], what: str, inputs: Iterable[tuple[str, str | os.PathLike[str] | None]]
) -> None:
    """Refuse an output ``out`` that is, holds or lies inside one of ``inputs`` (``(flag, path)`` pairs; a
    None path is skipped), by identity: a symlink, a hard link or a bind mount of an input is refused as
    the input is. ``--force`` does not change it: it replaces a previous output, never an input."""
    out = Path(out)
    with looking(out, what):
        _stat(out)  # a name the OS cannot look up: one line, as the other checks give
    for flag, inp in inputs:
        if inp is None:
            continue
        relation = _relation(out, Path(inp))
        if relation is not None:
            said = relation.format(input=f"{flag} {shown(inp)}")
            raise OutputError(
                f"{what} {shown(out)}: {said}; choose another output (an input is never written over or "
                "into, --force or not)"
            )
