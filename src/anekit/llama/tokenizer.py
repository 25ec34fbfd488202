"""Tokenizers for training and sampling: the protocol, sentencepiece models, and BPE trained on the corpus.

``Tokenizer`` is what the trainer and the sampler use: ``encode(text, bos, eos) -> ids``,
``decode(ids) -> text``, ``vocab_size``, ``bos_id``, ``eos_id``. ``SentencePieceTokenizer`` wraps a
sentencepiece ``.model`` file (llama2.c's own tokenizers are sentencepiece BPE models: unk = 0,
bos = 1, eos = 2). ``train_bpe`` trains one with the options llama2.c's ``tinystories.py train_vocab``
uses (byte fallback, split digits, identity normalisation, full character coverage), and
``default_tokenizer`` trains one on the embedded corpus once and caches it per user:

    $ANEKIT_CACHE/tokenizers/   (else $XDG_CACHE_HOME/anekit/..., else ~/.cache/anekit/...)
        corpus1-bpe512-<key>.model     key: hash of the corpus version and every training option

sentencepiece is imported only when used; without it these functions raise a clear ``AnekitError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from anekit.errors import AnekitError, FormatError
from anekit.fileio import CACHE_ENV, user_cache_dir, write_bytes_atomic
from anekit.llama import corpus

DEFAULT_VOCAB = 512  # llama2.c's stories260K uses a 512-token vocabulary
MAX_VOCAB = 1 << 16  # token ids are stored as uint16 in shards and batches

# Training options of llama2.c's train_vocab, less self_test_sample_size (0 is the default, and recent
# sentencepiece versions warn that the flag is deprecated). num_threads is 1, not the CPU count:
# sentencepiece's BPE result depends on the thread count, and one thread keeps training reproducible
# (about 0.1 s on the embedded corpus).
TRAINER_OPTIONS: dict[str, Any] = {
    "model_type": "bpe",
    "character_coverage": 1.0,
    "split_digits": True,
    "allow_whitespace_only_pieces": True,
    "byte_fallback": True,  # any byte sequence encodes: unknown characters become <0xNN> pieces
    "unk_surface": r" \342\201\207 ",  # " ⁇ ", as llama2.c
    "normalization_rule_name": "identity",  # keep the text as written (no NFKC)
    "num_threads": 1,
}


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids, as training and sampling use them."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """The ids of ``text``, with BOS before and / or EOS after when asked."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (BOS / EOS and other control ids produce nothing)."""
        ...


def _sentencepiece() -> ModuleType:
    try:
        import sentencepiece
    except ImportError as e:
        raise AnekitError(
            "[tokenizer] the sentencepiece package is needed for .model tokenizers and for training "
            "the default tokenizer: pip install 'sentencepiece>=0.2'"
        ) from e
    return sentencepiece


class SentencePieceTokenizer:
    """A sentencepiece model (a ``.model`` file, or its bytes through ``from_bytes``)."""

    def __init__(self, model_path: str | os.PathLike[str]) -> None:
        path = Path(model_path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise AnekitError(f"[tokenizer] cannot read sentencepiece model {path}: {e.strerror}") from e
        self._init(data, str(path))

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bytes>") -> SentencePieceTokenizer:
        """A tokenizer from the bytes of a ``.model`` file; ``name`` is used in error messages."""
        self = cls.__new__(cls)
        self._init(bytes(data), name)
        return self

    def _init(self, data: bytes, name: str) -> None:
        spm = _sentencepiece()
        self.name = name
        self.sha256 = hashlib.sha256(data).hexdigest()  # the model's identity (what the data cache keys on)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(data)
        except RuntimeError as e:
            raise FormatError("sentencepiece", name, f"not a sentencepiece model ({e})") from e

    @property
    def vocab_size(self) -> int:
        return int(self.sp.GetPieceSize())

    @property
    def bos_id(self) -> int:
        return int(self.sp.bos_id())

    @property
    def eos_id(self) -> int:
        return int(self.sp.eos_id())

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        ids = [int(i) for i in self.sp.EncodeAsIds(text)]
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        for i, t in enumerate(ids):
            if not 0 <= t < self.vocab_size:
                raise AnekitError(
                    f"[tokenizer] {self.name}: id {t} at position {i} is outside the vocabulary "
                    f"(0 .. {self.vocab_size - 1})"
                )
        return str(self.sp.DecodeIds(ids))

    def piece(self, token: int) -> str:
        """The piece of one id as sentencepiece writes it ("▁the", "<0x0A>", "<s>")."""
        return str(self.sp.IdToPiece(int(token)))

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({self.name!r}, vocab_size={self.vocab_size})"


def train_bpe(text: str, vocab_size: int, out_prefix: str | os.PathLike[str]) -> Path:
    """Train a sentencepiece BPE model on ``text`` (one sentence per line; blank lines are skipped)
    with llama2.c's options, quietly; write ``<out_prefix>.model`` atomically and return its path."""
    if not 0 < vocab_size <= MAX_VOCAB:
        raise AnekitError(f"[tokenizer] vocab_size must be in 1 .. {MAX_VOCAB}, got {vocab_size}")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise AnekitError("[tokenizer] cannot train a tokenizer on empty text")
    spm = _sentencepiece()
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.Train(
            sentence_iterator=iter(lines),
            model_writer=model,
            vocab_size=vocab_size,
            minloglevel=2,  # errors only: no training log on stderr
            **TRAINER_OPTIONS,
        )
    except RuntimeError as e:
        # e.g. "Vocabulary size too high (4096). Please set it to a value <= 1986." for a small text
        raise AnekitError(f"[tokenizer] sentencepiece could not train a {vocab_size}-token BPE: {e}") from e
    path = Path(f"{os.fspath(out_prefix)}.model")
    write_bytes_atomic(path, model.getvalue())
    return path


def default_tokenizer_path(
    vocab_size: int = DEFAULT_VOCAB, cache: str | os.PathLike[str] | None = None
) -> Path:
    """Where ``default_tokenizer`` keeps its model: keyed on the corpus and every training option, so a
    change to either trains a new model instead of reusing a stale one."""
    recipe = {
        "corpus": [corpus.CORPUS_VERSION, corpus.DEFAULT_STORIES, corpus.DEFAULT_SEED],
        "vocab_size": vocab_size,
        "options": TRAINER_OPTIONS,
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache) if cache is not None else user_cache_dir()
    return root / "tokenizers" / f"corpus{corpus.CORPUS_VERSION}-bpe{vocab_size}-{key}.model"


def default_tokenizer(
    vocab_size: int = DEFAULT_VOCAB, cache_dir: str | os.PathLike[str] | None = None
) -> SentencePieceTokenizer:
    """The BPE tokenizer of the embedded corpus: trained on first use (about 0.1 s), then loaded from
    the per-user cache. A cached file that does not load is retrained and replaced."""
    from anekit.outputs import OutputError, check_cache, writing

    path = default_tokenizer_path(vocab_size, cache_dir)
    if path.is_file():
        try:
            return SentencePieceTokenizer(path)
        except FormatError:
            pass  # a damaged cache entry: train again and replace it
    missing = [d for d in path.parents if not d.exists()]  # made by the write; removed if it fails
    try:
        check_cache(path, "[tokenizer] cache")
        text = corpus.generate_corpus(corpus.DEFAULT_STORIES, corpus.DEFAULT_SEED)
        with writing(path, "[tokenizer] cache"):
            return SentencePieceTokenizer(train_bpe(text, vocab_size, path.with_suffix("")))
    except OutputError as e:
        for d in missing:  # deepest first; only the empty ones this call created
            with contextlib.suppress(OSError):
                d.rmdir()
        raise OutputError(f"{e} (set {CACHE_ENV} to a writable directory)") from e


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """A tokenizer from a file: a sentencepiece ``.model``, or else a llama2.c ``tokenizer.bin``."""
    path = Path(path)
    if path.suffix == ".model":
        return SentencePieceTokenizer(path)
    try:
        from anekit.llama.llama2c import read_tokenizer_bin
    except ImportError as e:
        raise AnekitError(
            f"[tokenizer] {path}: reading llama2.c tokenizer.bin files is not available ({e})"
        ) from e
    tok: Tokenizer = read_tokenizer_bin(path)
    return tok
