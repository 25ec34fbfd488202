"""Token streams for training: llama2.c's pretokenized shards, a plain text file, the embedded corpus.

Every dataset is one or more 1-D token arrays ("parts") and answers ``batch(rng, seq_len)``: a window
of seq_len + 1 consecutive tokens drawn uniformly from all the windows that fit inside one part, split
into inputs = window[:-1] and targets = window[1:] (both (seq_len,) uint16, the token type of the
shards and of the reference's C code). The draw is one ``rng.integers`` call, so a generator seeded
the same way gives the same windows.

A llama2.c shard (``tinystories.py pretokenize``) is raw little-endian uint16 token ids, nothing else:

    offset 0      u16 token[0]          each story is BOS (1) followed by its tokens;
    offset 2      u16 token[1]          stories follow each other with no separator
    ...
    offset 2n-2   u16 token[n-1]        file size = 2 n bytes

A shard directory holds any number of ``*.bin`` files (llama2.c keeps its first shard for validation;
here every shard is training data). Shards are memory-mapped, never read whole.
A text file is split into stories on blank lines; each story is encoded with BOS before it, as
llama2.c's pretokenizer does, once, when the dataset is made.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path

import numpy as np

from anekit.errors import AnekitError, FormatError
from anekit.fileio import write_bytes_atomic
from anekit.llama import corpus
from anekit.llama.tokenizer import MAX_VOCAB, Tokenizer

SHARD_DTYPE = np.dtype("<u2")  # little-endian uint16, whatever the host's byte order
SHARD_FORMAT = "llama2c.shard"
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")  # a story ends at a line that is empty or only spaces


class TokenDataset:
    """Token arrays and their names; the sampling and the checks every dataset shares."""

    fmt = "data"

    def __init__(self, source: str, parts: list[tuple[str, np.ndarray]]) -> None:
        self.source = source  # the directory or file, for messages
        self.parts = parts  # (name, (n,) uint16 tokens)

    @property
    def n_tokens(self) -> int:
        return sum(len(a) for _, a in self.parts)

    def __len__(self) -> int:
        return self.n_tokens

    def batch(self, rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """A random window of seq_len + 1 tokens as (inputs, targets), each (seq_len,) uint16."""
        if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
            raise AnekitError(f"[data] seq_len must be a positive integer, got {seq_len!r}")
        need = int(seq_len) + 1
        starts = np.array([max(0, len(a) - need + 1) for _, a in self.parts], dtype=np.int64)  # (parts,)
        total = int(starts.sum())
        if total == 0:
            raise AnekitError(self._too_short(need))
        k = int(rng.integers(total))  # one draw over every window of every part
        ends = np.cumsum(starts)  # (parts,)
        part = int(np.searchsorted(ends, k, side="right"))
        start = k - int(ends[part] - starts[part])
        window = np.array(self.parts[part][1][start : start + need], dtype=np.uint16)  # (seq_len + 1,)
        return window[:-1].copy(), window[1:].copy()  # inputs, targets: separate (seq_len,) arrays

    def check_windows(self, seq_len: int) -> None:
        """AnekitError unless some part holds one window of seq_len + 1 tokens (a run checks this before
        it writes anything)."""
        need = int(seq_len) + 1
        if not any(len(a) >= need for _, a in self.parts):
            raise AnekitError(self._too_short(need))

    def _too_short(self, need: int) -> str:
        if len(self.parts) == 1:
            name, a = self.parts[0]
            return f"[data] {name}: {len(a)} tokens, fewer than the seq_len + 1 = {need} of one window"
        name, a = max(self.parts, key=lambda p: len(p[1]))
        return (
            f"[data] {self.source}: no shard holds the seq_len + 1 = {need} tokens of one window "
            f"(the longest, {name}, has {len(a)})"
        )

    def vocab_check(self, vocab_size: int) -> None:
        """Raise a FormatError naming the file, position and id of the first token >= vocab_size."""
        for name, a in self.parts:
            if len(a) == 0 or int(a.max()) < vocab_size:
                continue
            i = int(np.argmax(a >= vocab_size))
            raise FormatError(
                self.fmt,
                f"{name} token[{i}]",
                f"token id {int(a[i])} is not below the model's vocab_size {vocab_size}",
                offset=2 * i if self.fmt == SHARD_FORMAT else None,
            )


class ShardDataset(TokenDataset):
    """llama2.c's pretokenized uint16 shards: a directory of ``*.bin`` files (or one such file)."""

    fmt = SHARD_FORMAT

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        if path.is_dir():
            files = sorted(p for p in path.glob("*.bin") if p.is_file())
            if not files:
                raise AnekitError(
                    f"[data] {path}: no token shards (*.bin files of uint16 tokens) in this directory"
                )
        elif path.is_file():
            files = [path]
        else:
            raise AnekitError(f"[data] {path}: no such file or directory")
        super().__init__(str(path), [(str(f), self._map(f)) for f in files])

    @staticmethod
    def _map(path: Path) -> np.ndarray:
        try:
            size = path.stat().st_size
        except OSError as e:
            raise AnekitError(f"[data] cannot read shard {path}: {e.strerror}") from e
        if size % 2:
            raise FormatError(
                SHARD_FORMAT,
                str(path),
                "odd byte length: a shard is whole little-endian uint16 tokens",
                expected="an even size",
                actual=size,
            )
        if size == 0:
            return np.zeros(0, dtype=SHARD_DTYPE)  # an empty file cannot be memory-mapped
        try:
            return np.memmap(path, dtype=SHARD_DTYPE, mode="r")  # (size // 2,)
        except OSError as e:
            raise AnekitError(f"[data] cannot read shard {path}: {e.strerror}") from e


class TextDataset(TokenDataset):
    """A plain UTF-8 text file, stories separated by blank lines, tokenized once with BOS before each."""

    def __init__(self, path: str | os.PathLike[str], tokenizer: Tokenizer, text: str | None = None) -> None:
        """Read ``path``; or, given ``text``, use it instead and let ``path`` only name it in messages."""
        name = str(path)
        if text is None:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as e:
                raise AnekitError(f"[data] cannot read text file {name}: {e.strerror}") from e
            except UnicodeDecodeError as e:
                raise FormatError("text", name, f"not UTF-8 text ({e.reason})", offset=e.start) from e
        super().__init__(name, [(name, tokenize_stories(text, tokenizer, name))])


def split_stories(text: str) -> list[str]:
    """The stories of a text: its blank-line-separated blocks, stripped, empty ones dropped."""
    return [s.strip() for s in _BLANK_LINE.split(text.replace("\r\n", "\n")) if s.strip()]


def tokenize_stories(text: str, tokenizer: Tokenizer, name: str = "<text>") -> np.ndarray:
    """All stories of ``text`` encoded with BOS before each, concatenated: (n,) uint16."""
    if tokenizer.vocab_size > MAX_VOCAB:
        raise AnekitError(
            f"[data] {name}: a tokenizer of {tokenizer.vocab_size} tokens does not fit uint16 token ids"
        )
    ids: list[int] = []
    for story in split_stories(text):
        ids += tokenizer.encode(story, bos=True, eos=False)
    return np.array(ids, dtype=np.uint16)  # (n,)


def default_dataset(
    tokenizer: Tokenizer, seed: int = corpus.DEFAULT_SEED, n_stories: int = corpus.DEFAULT_STORIES
) -> TokenDataset:
    """The embedded corpus (``corpus.generate_corpus(n_stories, seed)``) tokenized with ``tokenizer``.

    Generating and tokenizing it takes about 0.4 s, so the tokens are kept in the user cache
    (``corpus_cache_path``), keyed on the corpus's version and settings and on the sha256 of the
    tokenizer's model: a second run starts from them in a few milliseconds (a tokenizer without a
    ``sha256``, or a cache that cannot be written, is simply not cached)."""
    name = f"<embedded corpus, {n_stories} stories, seed {seed}>"
    path = corpus_cache_path(tokenizer, seed, n_stories)
    if path is not None:
        with contextlib.suppress(OSError, ValueError):
            tokens = np.fromfile(path, dtype=SHARD_DTYPE)
            if tokens.size:
                return TokenDataset(name, [(name, tokens)])
    dataset = TextDataset(name, tokenizer, text=corpus.generate_corpus(n_stories, seed))
    if path is not None:
        with contextlib.suppress(OSError, AnekitError):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_shard(path, dataset.parts[0][1])
    return dataset


def corpus_cache_path(tokenizer: Tokenizer, seed: int, n_stories: int) -> Path | None:
    """Where ``default_dataset`` keeps the corpus's tokens for ``tokenizer`` (None: it has no identity)."""
    digest = getattr(tokenizer, "sha256", None)
    if not isinstance(digest, str):
        return None
    from anekit.fileio import user_cache_dir

    key = hashlib.sha256(f"{corpus.CORPUS_VERSION}/{n_stories}/{seed}/{digest}".encode()).hexdigest()[:16]
    return user_cache_dir() / "corpus" / f"corpus{corpus.CORPUS_VERSION}-{key}.tokens"


def write_shard(path: str | os.PathLike[str], tokens: np.ndarray) -> None:
    """Write tokens as a llama2.c shard (raw little-endian uint16), atomically."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= MAX_VOCAB):
        raise AnekitError(f"[data] {path}: token ids must be in 0 .. {MAX_VOCAB - 1} to fit a uint16 shard")
    write_bytes_atomic(path, tokens.astype(SHARD_DTYPE).tobytes())
