"""The address space a process may use (its RLIMIT_AS, ``ulimit -v``) and refusals sized against it.

A command that is about to map or allocate something large asks ``check`` first: when what the process
already uses plus what the command needs would pass the soft RLIMIT_AS, it is refused in one line that
says both figures in words, before anything is mapped or allocated (the alternative is an ``ENOMEM``
from ``mmap`` or a ``MemoryError`` half way through). Without a limit (the default), or where the
platform has none (no ``resource`` module), nothing is refused here.
"""

from __future__ import annotations

import os

from anekit.errors import AnekitError

__all__ = ["AddressSpaceError", "check", "in_use", "limit", "words"]


class AddressSpaceError(AnekitError, MemoryError):
    """What a command needs does not fit the address space the process may use."""


def limit() -> int | None:
    """The soft RLIMIT_AS in bytes, or None when there is none (unlimited, or no such limit here)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def in_use() -> int:
    """The bytes of address space the process has mapped now (Linux's /proc/self/statm; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def words(n: int | float) -> str:
    """A byte count for a message: "27.0 GiB", "512.0 MiB", "64.0 KiB", "12 bytes"."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def check(need: int, where: str, what: str, parts: str = "") -> None:
    """Refuse, with AddressSpaceError, ``what`` (e.g. "sampling 7b.bin") needing ``need`` more bytes of
    address space than the process maps now, when the sum passes RLIMIT_AS. ``where`` tags the message
    (``"sample"``); ``parts`` says what ``need`` is made of ("a KV cache of 2.0 GiB, ...")."""
    cap = limit()
    if cap is None:
        return
    used = in_use()
    total = used + int(need)
    if total > cap:
        parts = f"{parts}, " if parts else f"{words(need)} for it, "
        raise AddressSpaceError(
            f"[{where}] {what} needs {words(total)} of address space ({parts}{words(used)} already in "
            f"use); this process may use {words(cap)} (its RLIMIT_AS, ulimit -v)"
        )
