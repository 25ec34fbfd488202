"""The identities of a run's inputs and state: sha256 of a file or of tokens, a file's version, paths.

A run records where each input was read from and a sha256 of what was read (``Source``); a resumed run
checks them. ``check_input_paths`` / ``check_record_path`` look at a path before it is opened (a FIFO or
a device never is: it would block or never end).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anekit.errors import AnekitError
from anekit.inputs import LIMITS, check_input, stat_input
from anekit.training.options import TrainOptions, opt

HASH_MAX_BYTES = 1 << 40  # 1 TiB: above any --init model; a bound on what is hashed
TOKENIZER_MAX_BYTES = 1 << 30  # 1 GiB: llama2.c's tokenizer.bin is 0.4 MB, sentencepiece models a few MB

FileIdentity = tuple[int, int, int, int]  # (device, inode, size, mtime in ns)


@dataclass(frozen=True)
class Source:
    """Identity of an input: where it was read from (absolute, or None for the built-in one) and a
    sha256 of what was read, which is what a resumed run checks."""

    path: str | None
    sha256: str

    def short(self) -> str:
        return f"{self.path or 'the built-in corpus'} (sha256 {self.sha256[:12]})"


def sha256_file(path: Path, max_bytes: int = HASH_MAX_BYTES) -> str:
    """sha256 of a regular file of at most ``max_bytes``: anything else (a FIFO, a device such as
    /dev/zero, a directory) is refused after a stat, never opened, so hashing always ends."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise AnekitError(f"[train] cannot read {path}: {e.strerror}") from e
    if not stat.S_ISREG(st.st_mode):
        raise AnekitError(f"[train] {path} is not a regular file")
    if st.st_size > max_bytes:
        raise AnekitError(f"[train] {path} holds {st.st_size} bytes, more than the {max_bytes} anekit reads")
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced between the stat and the open
                raise AnekitError(f"[train] {path} is not a regular file")
            left = st.st_size + 1  # read at most one byte past the size the stat gave
            while block := f.read(min(1 << 20, left)):
                h.update(block)
                left -= len(block)
                if left <= 0:
                    raise AnekitError(f"[train] {path} grew while it was read")
    except OSError as e:
        raise AnekitError(f"[train] cannot read {path}: {e.strerror}") from e
    return h.hexdigest()


def sha256_tokens(dataset: Any) -> str:
    """sha256 of the dataset's token streams (their lengths and uint16 values, not their file names), so
    the same tokens moved elsewhere are the same data, and the same text with another tokenizer is not."""
    h = hashlib.sha256()
    for _, part in dataset.parts:
        a = np.ascontiguousarray(part, dtype="<u2")  # (n,) a view for shards already little-endian
        h.update(len(a).to_bytes(8, "little"))
        h.update(a.data.cast("B"))
    return h.hexdigest()


def absolute(path: Path | None) -> str | None:
    """``path`` made absolute (None for None)."""
    return None if path is None else str(path.resolve())


def file_identity(path: Path) -> FileIdentity | None:
    """What tells one version of a file from the next (an atomic write renames a new inode in); None when
    it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def check_input_paths(options: TrainOptions) -> None:
    """--data (a regular file, or a directory of shards), --tokenizer and --init (regular files), checked
    without opening them: one line naming the path and what it is."""
    data = options.data
    if data is not None:
        st = stat_input(data, f"[train] {opt('data')} cannot read")
        if st is not None and not stat.S_ISDIR(st.st_mode):
            check_input(
                data, f"[train] {opt('data')} cannot read", expected="a text file or a directory of shards"
            )
    if options.tokenizer is not None:
        check_input(
            options.tokenizer,
            f"[train] {opt('tokenizer')} cannot read",
            LIMITS["tokenizer"],
            "a tokenizer file",
        )
    if options.init is not None:
        check_input(options.init, f"[train] {opt('init')} cannot read", expected="a model file")


def check_record_path(where: Path, field_name: str, path: str | None) -> Path | None:
    """A path a run record names (``data.path``, ``tokenizer.path``, ``base.path``), before a resume opens
    it: the checks its flag gets (``check_input_paths``), in one line naming the record's field. Returns
    the path (None for None)."""
    if path is None:
        return None
    what = f"[train] the run record of {where}: {field_name}"
    if field_name == "data.path":
        st = stat_input(path, what)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            check_input(path, what, expected="a text file or a directory of shards")
    elif field_name == "tokenizer.path":
        check_input(path, what, LIMITS["tokenizer"], "a tokenizer file")
    else:
        st = stat_input(path, what)
        if st is None or not stat.S_ISDIR(st.st_mode):
            check_input(path, what, expected="a model directory")  # names what it is
            raise AnekitError(f"{what} {path}: a file, not a model directory")
    return Path(path)
