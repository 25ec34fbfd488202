"""``anekit inspect FILE [--json]``: recognise a binary artifact by its content and describe it."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anekit import blob
from anekit.errors import AnekitError, FormatError

_SNIFF_BYTES = 128


@dataclass(frozen=True)
class Kind:
    """A file kind ``inspect`` knows: a content test on the first bytes, a describer and a text printer."""

    name: str
    signature: str  # how it is recognised, for the "not recognised" message
    sniff: Callable[[bytes], bool]
    describe: Callable[[Path], dict[str, Any]]
    render: Callable[[dict[str, Any]], list[str]]


# -- MILBlob v2 ------------------------------------------------------------------------------------------


def _sniff_milblob(head: bytes) -> bool:
    """Version 2 in the header, or a metadata sentinel right after it (then the reader names the fault)."""
    if len(head) < blob.HEADER_SIZE:
        return False
    version = int.from_bytes(head[4:8], "little")
    sentinel = int.from_bytes(head[64:68], "little") if len(head) >= 68 else None
    return version == blob.VERSION or sentinel == blob.SENTINEL


def _describe_milblob(path: Path) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", blob.BlobWarning)
        with blob.BlobFile(path) as f:
            header_count, size = f.header_count, f.size
            entries = blob.describe(f)
    return {
        "file": str(path),
        "format": "milblob",
        "version": blob.VERSION,
        "file_size": size,
        "header_count": header_count,
        "entries": entries,
        "data_bytes": sum(e["size_in_bytes"] for e in entries),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, blob.BlobWarning)],
    }


def _render_milblob(info: dict[str, Any]) -> list[str]:
    lines = [f"{'metadata':>10}  {'data':>10}  {'dtype':<8}  {'bytes':>12}  {'pad':>3}  crc32"]
    for e in info["entries"]:
        lines.append(
            f"{e['metadata_offset']:>#10x}  {e['data_offset']:>#10x}  {e['dtype']:<8}  "
            f"{e['size_in_bytes']:>12}  {e['padding_bits']:>3}  {e['crc32']:08x}"
        )
    n = len(info["entries"])
    lines.append(
        f"{info['file']}: MILBlob v{info['version']}, {n} blob{'s' * (n != 1)}, {info['data_bytes']} "
        f"data bytes, file {info['file_size']} bytes, header count {info['header_count']}"
    )
    lines.extend(f"warning: {w}" for w in info["warnings"])
    return lines


KINDS: tuple[Kind, ...] = (
    Kind(
        "milblob",
        "MILBlob v2 weights (u32 version 2 at byte 4, metadata sentinel 0xDEADBEEF at byte 64)",
        _sniff_milblob,
        _describe_milblob,
        _render_milblob,
    ),
)
"""Known kinds, tried in order; add a row to teach ``inspect`` a new format."""


def identify(path: Path) -> Kind:
    """The kind of the file at ``path``, judged by its first bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as e:
        raise AnekitError(f"[inspect] cannot read {path}: {e.strerror or e}") from e
    for kind in KINDS:
        if kind.sniff(head):
            return kind
    known = "; ".join(k.signature for k in KINDS)
    raise FormatError("inspect", str(path), f"not a file kind anekit can inspect (knows: {known})")


def inspect_file(path: Path) -> tuple[Kind, dict[str, Any]]:
    """Identify and describe one file."""
    kind = identify(path)
    try:
        return kind, kind.describe(path)
    except OSError as e:
        raise AnekitError(f"[inspect] cannot read {path}: {e.strerror or e}") from e


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe a binary artifact (MILBlob v2 weight files)")
    p.add_argument("file", type=Path, metavar="FILE")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    kind, info = inspect_file(args.file)
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(kind.render(info)) + "\n")
    return 0
