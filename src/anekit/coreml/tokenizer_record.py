"""The tokenizer record an export keeps (``tokenizer_files.RECORD_KEY``), read back for ``anekit sample``:
shards.json's field in a shard directory, a package's userDefined metadata for one package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anekit.coreml.load import _read_spec
from anekit.coreml.manifest import model_file
from anekit.coreml.manifest import read_manifest as read_package
from anekit.coreml.shards import SHARDS_FILE, read_manifest
from anekit.tokenizer_files import RECORD_KEY, checked_record


def export_record(path: Path) -> dict[str, Any] | None:
    """The tokenizer record of an export (a package, a shard directory or its shards.json), None when it
    records none (an older export, or one whose model had no tokenizer at hand)."""
    manifest = path / SHARDS_FILE if path.is_dir() and (path / SHARDS_FILE).is_file() else path
    if manifest.name == SHARDS_FILE:
        return checked_record(read_manifest(manifest).get(RECORD_KEY), manifest)
    root, _ = read_package(path)
    raw = _read_spec(model_file(path, root)).description.metadata.userDefined.get(RECORD_KEY)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return checked_record(value, path)
