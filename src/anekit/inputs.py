"""Input paths opened one way: regular files only, read with a size limit suited to the kind of file.

Every command that reads an input goes through ``check_input`` (and ``read_bytes`` / ``read_text`` /
``load_npy``), so a bad input is one ``InputError`` line naming the path and what it is, never a hang
or an endless read:

- ``os.stat`` first, never ``open``: a FIFO (which would block on open until a writer comes), a
  character or block device (``/dev/zero`` never ends), a socket or a directory where a file is expected
  is refused by its kind before anything is opened;
- the size is compared with the limit for the kind of file (``LIMITS``) before any byte is read, and
  the read itself stops one byte past the limit, so a file that grows meanwhile is refused too;
- a path the OS cannot look up (too long, a part of it a file, no permission) is one line with the
  path shortened to ``SHOWN`` characters.

A ``.npy`` input (``load_npy``) has its header read first: its dtype must fit the input's declared
kind, its shape's byte count must match the file, and it must hold at least one element, before the
array is loaded. Complex, string, structured and object arrays are refused everywhere. A float input
takes float arrays only: an integer or bool array is refused, since a silent cast of an int64 index or a
bool mask to fp16 changes its meaning (integers above 2048 are not exact in fp16) — convert it
explicitly (``x.astype(np.float16)``) when that is what is meant. An integer input (token ids) takes
integer arrays whose values all lie in its range; a bool input takes bool arrays.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import numpy as np

from anekit.errors import AnekitError

# The most bytes read from an input of each kind: far above any real input, far below what would
# exhaust memory. MIL text of the largest models is a few MB; a .npy input feeds one tensor.
LIMITS = {
    "mil": 256 << 20,  # MIL text
    "npy": 4 << 30,  # a --input array
    "json": 64 << 20,  # run records, manifests, shards.json
    "tokenizer": 256 << 20,  # tokenizer.bin / .model
    "python": 16 << 20,  # a linted script
}
SHOWN = 80  # characters of a path shown in a message; the middle of a longer one is elided

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


class InputError(AnekitError):
    """An input path that is not a regular file of a size anekit reads, or cannot be read."""


def shown(path: str | os.PathLike[str]) -> str:
    """``path`` as a message shows it: a path longer than ``SHOWN`` characters keeps its two ends."""
    text = os.fspath(path)
    if len(text) <= SHOWN:
        return text
    half = (SHOWN - 3) // 2
    return f"{text[:half]}...{text[-half:]} ({len(text)} characters)"


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO (named pipe)", "a directory", "a regular file")."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _os_reason(e: OSError) -> str:
    if e.errno == errno.ENAMETOOLONG:
        return "file name too long"
    if e.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a directory"
    return e.strerror or type(e).__name__


def stat_input(path: str | os.PathLike[str], what: str) -> os.stat_result | None:
    """``os.stat`` of ``path``, None when nothing is there; any other failure is one ``InputError``."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        why = _os_reason(e) if isinstance(e, OSError) else "not a valid path"
        raise InputError(f"{what} {shown(path)}: {why}") from e


def check_input(
    path: str | os.PathLike[str], what: str, limit: int | None = None, expected: str = "a regular file"
) -> os.stat_result:
    """Refuse, without opening it, an input that is not a regular file (or is over ``limit`` bytes).

    Messages read ``{what} {path}: {why}``: ``what`` says what failed ("[mil] cannot read"), ``expected``
    what the path should have been ("a MIL text file")."""
    st = stat_input(path, what)
    if st is None:
        raise InputError(f"{what} {shown(path)}: no such file or directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {shown(path)}: {kind_of(st.st_mode)}, not {expected}")
    if limit is not None and st.st_size > limit:
        raise InputError(
            f"{what} {shown(path)}: {st.st_size} bytes, over the {limit}-byte limit for this input"
        )
    return st


def read_bytes(
    path: str | os.PathLike[str], what: str, limit: int, expected: str = "a regular file"
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (``check_input`` first). The read
    asks for the file's size plus one byte, not for ``limit``: a read buffer is allocated at the size asked,
    and a generous limit must not cost its bytes of memory (a file that grew since is still cut at the
    limit)."""
    st = check_input(path, what, limit, expected)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(min(limit, st.st_size) + 1)
            while st.st_size < len(data) <= limit:  # it grew since: the rest, a MiB at a time
                more = f.read(min(1 << 20, limit + 1 - len(data)))
                if not more:
                    break
                data += more
    except OSError as e:
        raise InputError(f"{what} {shown(path)}: {_os_reason(e)}") from e
    if len(data) > limit:
        raise InputError(f"{what} {shown(path)}: over the {limit}-byte limit for this input")
    return data


def read_text(path: str | os.PathLike[str], what: str, limit: int, expected: str = "a regular file") -> str:
    """The UTF-8 text of the regular file ``path`` (``read_bytes``); not UTF-8 is one line saying where."""
    data = read_bytes(path, what, limit, expected)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{what} {shown(path)}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from e


def load_npy(
    path: str | os.PathLike[str],
    what: str,
    expect: tuple[int, ...] | None = None,
    limit: int = LIMITS["npy"],
    kind: str = "float",
    int_range: tuple[int, int] | None = None,
) -> np.ndarray:
    """A real-valued array from the .npy file ``path``, its header checked before any allocation: the
    dtype (fitting the input's ``kind``, "float", "int", "uint" or "bool": see the module docstring), at
    least one element, the shape ``expect`` when given, and a byte count that the file holds; the values
    of an integer array within ``int_range`` when given. A .npz or pickle is refused."""
    check_input(path, what, limit, "a .npy file")
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy version {version[0]}.{version[1]}")
            start = f.tell()
            size = os.fstat(f.fileno()).st_size
            problem = _npy_problem(shape, dtype, kind)
            if problem:
                raise InputError(f"{what} {shown(path)}: {problem}")
            if expect is not None and tuple(shape) != tuple(expect):
                raise InputError(f"{what} {shown(path)}: has shape {list(shape)}, expected {list(expect)}")
            count = 1
            for d in shape:
                count *= int(d)
            need = count * dtype.itemsize
            if need != size - start:
                raise InputError(
                    f"{what} {shown(path)}: its header says shape {list(shape)} of {dtype} ({need} bytes), "
                    f"but the file holds {size - start} bytes of data"
                )
            array = np.empty(count, dtype=dtype)
            if f.readinto(array.data.cast("B")) != need:
                raise InputError(f"{what} {shown(path)}: the file shrank while it was read")
    except OSError as e:
        raise InputError(f"{what} {shown(path)}: {_os_reason(e)}") from e
    except ValueError as e:  # numpy's words for a bad magic or header
        raise InputError(f"{what} {shown(path)}: not a .npy array: {str(e).splitlines()[0]}") from e
    if int_range is not None and dtype.kind in "iu":
        lo, hi = int_range
        low, high = int(array.min()), int(array.max())
        if low < lo or high > hi:
            raise InputError(f"{what} {shown(path)}: holds {low} .. {high}, outside the input's {lo} .. {hi}")
    return array.reshape(shape, order="F" if fortran else "C")


def _npy_problem(shape: tuple[int, ...], dtype: np.dtype, kind: str) -> str | None:
    """Why a .npy header of ``shape`` and ``dtype`` cannot be an input of ``kind``, or None."""
    if dtype.hasobject:
        return "holds Python objects (allow_pickle is off: anekit never unpickles an input)"
    if dtype.fields is not None or dtype.subdtype is not None:
        return f"holds a structured array ({dtype}): give a plain array of numbers"
    if dtype.kind == "c":
        return f"holds complex numbers ({dtype}): the engine computes with real numbers"
    if dtype.kind in "US":
        return f"holds strings ({dtype}): give an array of numbers"
    name = "bool" if dtype.kind == "b" else str(dtype)
    if kind == "float" and dtype.kind in "biu":
        return f"holds {name} values for a float input: convert it to float explicitly (no cast to fp16)"
    if kind in ("int", "uint") and dtype.kind not in "iu":
        return f"holds {name} values for an integer input: give an integer array"
    if kind == "bool" and dtype.kind != "b":
        return f"holds {name} values for a bool input: give a bool array"
    if dtype.kind not in "fiub":
        return f"holds {dtype} values: give an array of numbers"
    if any(int(d) == 0 for d in shape):
        return f"is empty (shape {list(shape)})"
    return None


def is_fifo_like(path: Path) -> str | None:
    """What ``path`` is when it is neither a regular file nor a directory (a FIFO, a device, a socket),
    else None; a path that cannot be looked up counts as None (the reader says why)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return kind_of(mode)
