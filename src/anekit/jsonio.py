"""JSON read with limits: every JSON document anekit reads (run records, package metadata, manifests, shard
lists, reports) goes through ``loads`` so that a hostile file gets one error naming it, never a
RecursionError, a MemoryError or a raw ``json.JSONDecodeError``.

Limits: the text's size (``max_bytes``, checked before parsing) and its nesting depth (``MAX_DEPTH``,
checked by a scan that skips strings, before ``json.loads`` recurses into it).
"""

from __future__ import annotations

import json
from typing import Any

from anekit.errors import AnekitError

MAX_DEPTH = 64  # deeper than any document anekit writes (run records nest 4 levels)
MAX_BYTES = 64 << 20  # 64 MiB: far above any document anekit writes


class JsonError(AnekitError, ValueError):
    """A JSON document that is too large, too deep, or not JSON."""


def depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings skipped; the text need not be valid)."""
    deepest = level = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
    return deepest


def loads(text: str | bytes, what: str, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value of ``text``; JsonError naming ``what`` (e.g. "[checkpoint] run record") when it is
    larger than ``max_bytes``, nested deeper than ``max_depth``, not UTF-8 or not JSON."""
    if len(text) > max_bytes:
        raise JsonError(f"{what}: {len(text)} bytes of JSON, more than the {max_bytes} allowed")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JsonError(f"{what}: not UTF-8 JSON (byte {e.start})") from None
    found = depth(text)
    if found > max_depth:
        raise JsonError(f"{what}: JSON nested {found} deep, more than the {max_depth} allowed")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # ValueError: JSONDecodeError, or an integer of 4300+ digits
        raise JsonError(f"{what}: not JSON ({e})") from None
