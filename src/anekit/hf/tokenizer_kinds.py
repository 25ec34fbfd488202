"""A tokenizer of any of the kinds ``anekit.tokenizer_files`` names, loaded: a Hugging Face one through
``anekit.hf.tokenizer``, a sentencepiece model or llama2.c's tokenizer.bin through
``anekit.llama.tokenizer``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anekit.hf.tokenizer import load_hf_tokenizer
from anekit.llama.tokenizer import SentencePieceTokenizer, load_tokenizer


def load_tokenizer_at(path: Path, kind: str) -> Any:
    """The tokenizer object of ``path`` of ``kind`` (``tokenizer_files.KINDS``): anekit.hf's for a Hugging
    Face one, else anekit.llama.tokenizer's."""
    if kind == "hf":
        return load_hf_tokenizer(path)
    if kind == "sentencepiece" and path.suffix != ".model":
        return SentencePieceTokenizer(path)
    return load_tokenizer(path)
