"""Shared test fixtures: the real-artifact corpus beside the project (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CORPUS = PROJECT_ROOT / ".." / "shared" / "corpus"


def corpus_path(*parts: str) -> Path:
    """A path inside the shared corpus; skips the test with a reason when the corpus is not there."""
    path = CORPUS.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"corpus file {'/'.join(parts)} not present (the corpus lives in ../shared/corpus)")
    return path


def corpus_files(folder: str, pattern: str) -> list[Path]:
    """Corpus files matching a glob, or [] when the corpus is absent (tests then skip)."""
    base = CORPUS / folder
    return sorted(base.glob(pattern)) if base.is_dir() else []
