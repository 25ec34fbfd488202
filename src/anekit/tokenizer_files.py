"""The tokenizer files that go with a model: named by --tokenizer, found with the model, carried beside an
export, and found again by ``anekit sample``.

A tokenizer is one of three kinds, by what names it:

    hf              a Hugging Face tokenizer: a directory holding tokenizer.json or tokenizer.model, or a
                    tokenizer.json file; the files of ``HF_FILES`` beside it go with it (the chat
                    template, BOS / EOS, generation_config's end ids)
    sentencepiece   a ``.model`` file, carried as tokenizer.model
    llama2c         any other file: llama2.c's tokenizer.bin

An export writes its tokenizer's files into its folder (a shard directory, or the one holding a single
package) and records their names and sha256 in the export (``RECORD_KEY``: shards.json's field, a
package's metadata), so that ``sample`` reads exactly the files the export carried. A file of the same name
already in the folder is kept when it holds the same bytes; a different one is refused unless --force,
which replaces it (and removes the Hugging Face files the carried tokenizer does not have, which the
loader would read with it).

This module knows the files only: loading a tokenizer of a kind is ``anekit.hf.tokenizer_kinds``' job,
reading the record back from a package or shards.json ``anekit.coreml.tokenizer_record``'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anekit.errors import AnekitError
from anekit.fileio import write_bytes_atomic
from anekit.inputs import LIMITS, read_bytes, stat_input
from anekit.outputs import writing

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE = "tokenizer.model"
LLAMA2C = "tokenizer.bin"
HF_FILES = (
    TOKENIZER_JSON,
    SENTENCEPIECE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)
ALL_FILES = (*HF_FILES, LLAMA2C)
KINDS = ("hf", "sentencepiece", "llama2c")
RECORD_KEY = "anekit.tokenizer"  # shards.json's field, a package's userDefined metadata key


@dataclass(frozen=True)
class TokenizerFiles:
    """A tokenizer as files to write: ``files`` maps each name in the export's folder to its bytes;
    ``source`` is where it was read (a directory or a file), what ``load`` reads."""

    kind: str
    files: dict[str, bytes]
    source: Path

    def record(self) -> dict[str, Any]:
        """What the export records: the kind and each file's sha256."""
        return {"kind": self.kind, "files": {n: hashlib.sha256(d).hexdigest() for n, d in self.files.items()}}


def kind_of(path: Path) -> str:
    """The kind of tokenizer ``path`` names (see the module docstring)."""
    if path.is_dir() or path.suffix == ".json":
        return "hf"
    return "sentencepiece" if path.suffix == ".model" else "llama2c"


def _read(path: Path, what: str) -> bytes:
    limit = LIMITS["tokenizer"] if path.name in (TOKENIZER_JSON, SENTENCEPIECE, LLAMA2C) else LIMITS["json"]
    return read_bytes(path, f"{what} cannot read", limit, "a tokenizer file")


def from_path(path: Path, what: str) -> TokenizerFiles:
    """The tokenizer files ``path`` names (a Hugging Face directory, a tokenizer.json, a .model, a
    tokenizer.bin), read; ``what`` starts each message ("[export] --tokenizer")."""
    kind = kind_of(path)
    if kind == "sentencepiece":
        return TokenizerFiles(kind, {SENTENCEPIECE: _read(path, what)}, path)
    if kind == "llama2c":
        return TokenizerFiles(kind, {LLAMA2C: _read(path, what)}, path)
    folder = path if path.is_dir() else path.parent
    files: dict[str, bytes] = {}
    if not path.is_dir():
        files[TOKENIZER_JSON] = _read(path, what)  # a tokenizer.json named itself, the configs beside it
    for name in HF_FILES:
        if name not in files and (path.is_dir() or name != SENTENCEPIECE) and stat_input(folder / name, what):
            files[name] = _read(folder / name, what)
    if TOKENIZER_JSON not in files and SENTENCEPIECE not in files:
        looked = f"looked for {TOKENIZER_JSON} and {SENTENCEPIECE}"
        raise AnekitError(f"{what} {path}: no tokenizer in it ({looked})")
    return TokenizerFiles(kind, files, path)


# -- beside an export ------------------------------------------------------------------------------------


def read_along(kind: str, names: Collection[str]) -> tuple[str, ...]:
    """The files the Hugging Face loader would read with a tokenizer of ``names`` though they are not among
    them (the configs; tokenizer.model only without a tokenizer.json); none for the other kinds."""
    if kind != "hf":
        return ()
    return tuple(
        n for n in HF_FILES if n not in names and not (n == SENTENCEPIECE and TOKENIZER_JSON in names)
    )


def conflicts(folder: Path, carried: TokenizerFiles) -> list[Path]:
    """The files in ``folder`` that writing ``carried`` would have to replace: a file of a carried name
    with other bytes, and for a Hugging Face tokenizer, a Hugging Face file it does not carry."""
    found = []
    for name in ALL_FILES:
        path = folder / name
        if stat_input(path, "[export] cannot read") is None:
            continue
        if name in carried.files:
            if _bytes_or_none(path) != carried.files[name]:
                found.append(path)
        elif name in read_along(carried.kind, carried.files):
            found.append(path)
    return found


def _bytes_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def refuse_conflicts(folder: Path, carried: TokenizerFiles, force: bool) -> None:
    """One line naming the tokenizer files in ``folder`` that differ from ``carried``, unless ``force``."""
    found = conflicts(folder, carried)
    if found and not force:
        names = ", ".join(str(p) for p in found)
        raise AnekitError(
            f"[export] {names}: a different tokenizer is there (--force replaces it with the model's, "
            f"{carried.source})"
        )


def write_beside(folder: Path, carried: TokenizerFiles) -> list[str]:
    """Write ``carried`` into ``folder`` (after ``refuse_conflicts``): each file atomically, those already
    holding the bytes left alone, the Hugging Face files it does not carry removed. Lines saying what was
    done."""
    lines = []
    for path in conflicts(folder, carried):
        if path.name not in carried.files:
            with writing(path, "[export]"):
                path.unlink()
            lines.append(f"removed {path} (not part of the model's tokenizer)")
    for name, data in carried.files.items():
        target = folder / name
        if _bytes_or_none(target) == data:
            lines.append(f"{target} is already the tokenizer's")
            continue
        with writing(target, "[export]"):
            write_bytes_atomic(target, data)
        lines.append(f"wrote {target}")
    return lines


# -- found again by sample -------------------------------------------------------------------------------


def checked_record(value: Any, where: Path) -> dict[str, Any] | None:
    """``value``, an export's tokenizer record read from ``where``, checked (None stays None)."""
    if value is None:
        return None
    files = value.get("files") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or value.get("kind") not in KINDS
        or not isinstance(files, dict)
        or not files
        or not all(n in ALL_FILES and isinstance(h, str) for n, h in files.items())
    ):
        raise AnekitError(
            f'[sample] {where}: {RECORD_KEY} must be {{"kind": one of {", ".join(KINDS)}, "files": '
            "{tokenizer file name: sha256}}"
        )
    return value


def carried_path(folder: Path, record: dict[str, Any]) -> Path:
    """What to load for the recorded tokenizer in ``folder``, each recorded file checked by its sha256."""
    for name, digest in record["files"].items():
        path = folder / name
        data = _read(path, "[sample] the tokenizer the export carried:")
        if hashlib.sha256(data).hexdigest() != digest:
            raise AnekitError(
                f"[sample] {path} is not the tokenizer file the export carried (its sha256 differs): "
                "export again, or pass the model's tokenizer with --tokenizer"
            )
    kind = record["kind"]
    for name in read_along(kind, record["files"]):
        if stat_input(folder / name, "[sample] cannot read") is not None:
            raise AnekitError(
                f"[sample] {folder / name} is not one of the tokenizer files the export carried, and the "
                "Hugging Face loader would read it with them: remove it, or pass --tokenizer"
            )
    return folder if kind == "hf" else folder / (SENTENCEPIECE if kind == "sentencepiece" else LLAMA2C)
