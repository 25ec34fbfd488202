"""Training data: the embedded story corpus, the BPE tokenizer and its per-user cache, token datasets.

References are independent of the code under test: shards are written and read back with
``np.frombuffer`` / ``struct`` here, text datasets use a character tokenizer defined in this file, and
the sentencepiece wrapper is checked against llama2.c's tokenizer.bin parsed by hand.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from anekit import fileio
from anekit.errors import AnekitError, FormatError
from anekit.llama import corpus, tokenizer
from anekit.llama.corpus import generate_corpus
from anekit.llama.data import ShardDataset, TextDataset, default_dataset, write_shard
from anekit.llama.tokenizer import SentencePieceTokenizer, Tokenizer, default_tokenizer, train_bpe
from tests.conftest import PROJECT_ROOT, corpus_path

pytest.importorskip("sentencepiece")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own ANEKIT_CACHE: nothing is read from or written to the user's cache."""
    cache = tmp_path_factory.mktemp("anekit-cache")
    monkeypatch.setenv("ANEKIT_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def small_text() -> str:
    return generate_corpus(300, seed=7)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory, small_text: str) -> Path:
    return train_bpe(small_text, 512, tmp_path_factory.mktemp("tok") / "small")


class CharTokenizer:
    """A test tokenizer: BOS 1, EOS 2, every character its code point + 3 (ASCII text only)."""

    def __init__(self, vocab_size: int = 131) -> None:
        self.vocab_size, self.bos_id, self.eos_id = vocab_size, 1, 2

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        return [1] * bos + [ord(c) + 3 for c in text] + [2] * eos

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i - 3) for i in ids if i > 2)


# --- the corpus --------------------------------------------------------------------------------------


def test_corpus_is_deterministic_and_seeded():
    a, b = generate_corpus(200, seed=3), generate_corpus(200, seed=3)
    assert a == b
    assert generate_corpus(200, seed=4) != a
    # one random stream: fewer stories are a prefix of more
    assert generate_corpus(500, seed=3).startswith(a.rstrip("\n") + "\n\n")


def test_corpus_text_is_pinned_to_its_version():
    # Cached tokenizers are keyed on CORPUS_VERSION: a grammar change must bump it (and this digest),
    # or users keep a tokenizer trained on the old text. Same digest on Python 3.10 - 3.13.
    digest = hashlib.sha256(generate_corpus(200, 0).encode()).hexdigest()
    assert (corpus.CORPUS_VERSION, digest) == (
        1,
        "f53ad3149f6d2d712484a35bde62ba687d0dc8c58830bc199bb66c79ddc42654",
    )


def test_corpus_does_not_depend_on_hash_seed():
    code = "import hashlib, anekit.llama.corpus as c; print(hashlib.sha256(c.generate_corpus(300, 5).encode()).hexdigest())"
    env = dict(os.environ, PYTHONPATH=f"{PROJECT_ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "PYTHONHASHSEED": hs},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for hs in ("0", "12345")
    }
    assert digests == {hashlib.sha256(generate_corpus(300, 5).encode()).hexdigest()}


def test_corpus_layout_one_story_per_line_blank_line_between():
    text = generate_corpus(50, seed=1)
    assert text.endswith("\n") and not text.endswith("\n\n")
    stories = text.rstrip("\n").split("\n\n")
    assert len(stories) == 50
    for s in stories:
        assert s and "\n" not in s and s == s.strip()
        assert s[-1] in '.!"'
    with pytest.raises(AnekitError, match="n_stories"):
        generate_corpus(0)


def test_default_corpus_size_speed_and_variety():
    t0 = time.perf_counter()
    text = generate_corpus()
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0
    assert 1_000_000 <= len(text.encode()) <= 2_000_000
    stories = text.rstrip("\n").split("\n\n")
    assert len(stories) == corpus.DEFAULT_STORIES
    assert len(set(stories)) == len(stories)  # no story repeats
    words = Counter(re.findall(r"[A-Za-z']+", text))
    assert 250 <= len(words) <= 1500  # a small, learnable vocabulary ...
    sentences = Counter(re.findall(r"[A-Z][^.!?]*[.!?]", text))
    assert len(sentences) > 3000  # ... in many different sentences
    assert max(sentences.values()) < 0.3 * len(stories)  # no sentence is in most stories
    openings = Counter(s.split(".")[0].split(" named ")[0] for s in stories)
    assert len(openings) > 50
    # every plot appears, each in a fair share of the stories
    for marker in (
        "was gone!",
        "got stuck",
        "Can I play with your",
        "scare you",
        "ready.",
        "came to visit",
        "found",
    ):
        assert sum(marker in s for s in stories) > len(stories) // 20, marker


def test_corpus_grammar_agrees():
    text = generate_corpus(1000, seed=2)
    assert not re.search(r"\b[Aa] [aeiouAEIOU]", text)  # "a apple"
    assert not re.search(r"\b[Aa]n [^aeiouAEIOU]", text)  # "an ball"
    assert not re.search(r"\b(cookies|pancakes|muffins) was\b", text)
    assert not re.search(r"\b(cake|pie|soup) were\b", text)
    for story in text.rstrip("\n").split("\n\n"):
        first, second = re.split(r"(?<=[.!?]) ", story)[:2]
        noun = re.search(r"\b(girl|boy)\b", first)
        pronoun = second.split()[0]
        if noun and pronoun in ("He", "She"):
            assert pronoun == {"girl": "She", "boy": "He"}[noun.group(1)], story


# --- the tokenizer -----------------------------------------------------------------------------------


def test_train_bpe_writes_a_llama2c_style_model(small_model: Path, small_text: str):
    assert small_model.name == "small.model" and small_model.is_file()
    tok = SentencePieceTokenizer(small_model)
    assert isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (512, 1, 2)
    assert [tok.piece(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]
    assert [tok.piece(3 + b) for b in (0, 10, 255)] == ["<0x00>", "<0x0A>", "<0xFF>"]  # byte fallback
    # split_digits: every digit is its own piece, even in "10" (frequent in the corpus's ages);
    # a character the corpus lacks falls back to its UTF-8 bytes
    assert "10 years old" in small_text
    assert [tok.piece(i) for i in tok.encode("2024 10", bos=False)] == [
        "▁",
        "2",
        "0",
        "2",
        "4",
        "▁",
        "1",
        "0",
    ]
    assert [tok.piece(i) for i in tok.encode("✓", bos=False)][-3:] == ["<0xE2>", "<0x9C>", "<0x93>"]
    story = small_text.split("\n\n")[0]
    ids = tok.encode(story, bos=True, eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and 1 not in ids[1:-1]
    assert len(ids) < len(story) / 2  # BPE merges: well under one token per character
    assert tok.decode(ids) == story


def test_tokenizer_round_trips_text(small_model: Path):
    tok = SentencePieceTokenizer(small_model)
    for text in (
        "Once upon a time, there was a little girl named Lily.",
        'Zoë said: "3 + 4 = 7", and then — 你好!',
        "tabs\tand\nnewlines",
    ):
        assert tok.decode(tok.encode(text, bos=False)) == text
        assert tok.decode(tok.encode(text, bos=True, eos=True)) == text


def test_train_bpe_is_reproducible(tmp_path: Path, small_model: Path, small_text: str):
    again = train_bpe(small_text, 512, tmp_path / "again")
    assert again.read_bytes() == small_model.read_bytes()


def test_train_bpe_bad_input(tmp_path: Path, small_text: str):
    with pytest.raises(AnekitError, match="Vocabulary size too high"):
        train_bpe(small_text, 60000, tmp_path / "big")
    with pytest.raises(AnekitError, match="vocab_size must be"):
        train_bpe(small_text, 0, tmp_path / "zero")
    with pytest.raises(AnekitError, match="empty text"):
        train_bpe("\n \n", 300, tmp_path / "empty")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_sentencepiece_bad_files(tmp_path: Path, small_model: Path):
    with pytest.raises(AnekitError, match=r"cannot read sentencepiece model .*missing\.model"):
        SentencePieceTokenizer(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"\xff\xfe not a protobuf " * 8)
    with pytest.raises(FormatError, match=r"\[sentencepiece\] .*junk.model"):
        SentencePieceTokenizer(tmp_path / "junk.model")
    (tmp_path / "empty.model").write_bytes(b"")
    with pytest.raises(FormatError, match=r"\[sentencepiece\] .*empty\.model: not a sentencepiece model"):
        SentencePieceTokenizer(tmp_path / "empty.model")
    tok = SentencePieceTokenizer(small_model)
    with pytest.raises(AnekitError, match="id 512 at position 1 is outside the vocabulary"):
        tok.decode([5, 512])


def test_missing_sentencepiece_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, small_model: Path):
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import now raises ImportError
    with pytest.raises(AnekitError, match=r"pip install 'sentencepiece>=0.2'"):
        SentencePieceTokenizer(small_model)
    with pytest.raises(AnekitError, match="sentencepiece package"):
        train_bpe("some text", 300, small_model.parent / "never")


def test_real_llama_tokenizer_matches_its_tokenizer_bin():
    model = SentencePieceTokenizer(corpus_path("llama2c", "tokenizer.model"))
    raw = corpus_path("llama2c", "tokenizer.bin").read_bytes()
    # llama2.c's tokenizer.bin, parsed here: i32 max_token_length, then per token f32 score, i32 len, bytes
    pieces, off = [], 4
    while off < len(raw):
        _, n = struct.unpack_from("<fi", raw, off)
        pieces.append(raw[off + 8 : off + 8 + n])
        off += 8 + n
    assert model.vocab_size == len(pieces) == 32000
    assert (model.bos_id, model.eos_id) == (1, 2)
    text = "Once upon a time, Lily found 12 shiny stones."
    ids = model.encode(text, bos=True)
    assert ids[0] == 1
    assert b"".join(pieces[i] for i in ids[1:]).decode() == " " + text  # sentencepiece's dummy prefix
    assert model.decode(ids) == text


def test_load_tokenizer_dispatches_on_file_kind(
    monkeypatch: pytest.MonkeyPatch, small_model: Path, tmp_path: Path
):
    assert isinstance(tokenizer.load_tokenizer(small_model), SentencePieceTokenizer)
    seen = []

    class FakeLlama2c:
        @staticmethod
        def read_tokenizer_bin(path: Path) -> CharTokenizer:
            seen.append(Path(path))
            return CharTokenizer()

    monkeypatch.setitem(sys.modules, "anekit.llama.llama2c", FakeLlama2c)
    tok = tokenizer.load_tokenizer(tmp_path / "tokenizer.bin")
    assert isinstance(tok, CharTokenizer) and seen == [tmp_path / "tokenizer.bin"]


# --- the default tokenizer and its cache -------------------------------------------------------------


def test_default_tokenizer_trains_once_then_loads_from_cache(
    _private_cache: Path, monkeypatch: pytest.MonkeyPatch
):
    tok = default_tokenizer(vocab_size=512)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (512, 1, 2)
    files = list((_private_cache / "tokenizers").iterdir())
    assert [f.suffix for f in files] == [".model"]  # no temporary file left behind
    (model,) = files
    stamp = model.stat().st_mtime_ns

    def no_training(*args: object, **kwargs: object) -> Path:
        raise AssertionError("the cached tokenizer should have been used")

    monkeypatch.setattr(tokenizer, "train_bpe", no_training)
    again = default_tokenizer(vocab_size=512)
    assert model.stat().st_mtime_ns == stamp
    story = generate_corpus(1, seed=99).strip()
    assert again.encode(story) == tok.encode(story)
    assert again.decode(again.encode(story)) == story
    # another vocabulary size is another model
    with pytest.raises(AssertionError, match="cached tokenizer"):
        default_tokenizer(vocab_size=384)


def test_default_tokenizer_cache_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    tok = default_tokenizer(vocab_size=384, cache_dir=tmp_path / "explicit")
    assert Path(tok.name).parent == tmp_path / "explicit" / "tokenizers"
    assert tokenizer.user_cache_dir() == Path(os.environ["ANEKIT_CACHE"])
    monkeypatch.delenv("ANEKIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tokenizer.user_cache_dir() == tmp_path / "xdg" / "anekit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tokenizer.user_cache_dir() == tmp_path / "home" / ".cache" / "anekit"


def test_damaged_cache_entry_is_retrained(_private_cache: Path):
    path = tokenizer.default_tokenizer_path(384)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"half a file")
    tok = default_tokenizer(vocab_size=384)
    assert tok.vocab_size == 384 and path.stat().st_size > 1000


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    target = tmp_path / "x.model"
    target.write_bytes(b"old")

    def crash(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        fileio.write_bytes_atomic(target, b"new contents")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.model"]


def test_concurrent_processes_share_the_cache(_private_cache: Path):
    code = "from anekit.llama.tokenizer import default_tokenizer as d; print(d(vocab_size=384).vocab_size)"
    env = dict(os.environ, PYTHONPATH=f"{PROJECT_ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert [o[0].strip() for o in outs] == ["384"] * 3
    assert all(o[1] == "" for o in outs)  # training is quiet
    (model,) = (_private_cache / "tokenizers").iterdir()
    assert SentencePieceTokenizer(model).vocab_size == 384


# --- shards ------------------------------------------------------------------------------------------


def _shard(path: Path, tokens: list[int]) -> np.ndarray:
    path.write_bytes(struct.pack(f"<{len(tokens)}H", *tokens))
    return np.frombuffer(path.read_bytes(), dtype="<u2")


def test_shards_read_like_frombuffer(tmp_path: Path):
    rng = np.random.default_rng(1)
    expected = {}
    for name, n in (("b.bin", 300), ("a.bin", 1000), ("c.bin", 0)):
        expected[str(tmp_path / name)] = _shard(tmp_path / name, rng.integers(0, 65536, n).tolist())
    (tmp_path / "notes.txt").write_text("not a shard")
    ds = ShardDataset(tmp_path)
    assert [name for name, _ in ds.parts] == sorted(expected)  # *.bin only, sorted like llama2.c
    for name, tokens in ds.parts:
        np.testing.assert_array_equal(tokens, expected[name])
    assert ds.n_tokens == len(ds) == 1300
    single = ShardDataset(tmp_path / "a.bin")
    np.testing.assert_array_equal(single.parts[0][1], expected[str(tmp_path / "a.bin")])


def test_windows_are_uniform_and_never_cross_shards(tmp_path: Path):
    a = _shard(tmp_path / "0.bin", [10, 11, 12, 13, 14])
    b = _shard(tmp_path / "1.bin", [20, 21, 22, 23, 24, 25, 26, 27, 28])
    _shard(tmp_path / "2.bin", [30, 31, 32])  # too short for a window of 4
    windows = {tuple(s[i : i + 4]) for s in (a, b) for i in range(len(s) - 3)}
    assert len(windows) == 8
    ds = ShardDataset(tmp_path)
    rng = np.random.default_rng(0)
    counts: Counter[tuple[int, ...]] = Counter()
    for _ in range(4000):
        x, y = ds.batch(rng, 3)
        assert x.shape == y.shape == (3,) and x.dtype == y.dtype == np.uint16
        np.testing.assert_array_equal(x[1:], y[:-1])
        counts[(*x.tolist(), int(y[-1]))] += 1
    assert set(counts) == windows
    assert all(400 < c < 600 for c in counts.values()), counts  # 500 expected each


def test_batches_are_deterministic_for_an_rng(tmp_path: Path):
    tokens = _shard(tmp_path / "s.bin", list(range(5000)))
    ds = ShardDataset(tmp_path)

    def draw(seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [np.concatenate(ds.batch(rng, 64)) for _ in range(5)]

    first, again, other = draw(1), draw(1), draw(2)
    assert all(np.array_equal(p, q) for p, q in zip(first, again))
    assert not all(np.array_equal(p, q) for p, q in zip(first, other))
    for seed in range(20):
        x, y = ds.batch(np.random.default_rng([seed, 3]), 64)
        start = int(x[0])  # token i sits at index i
        np.testing.assert_array_equal(x, tokens[start : start + 64])
        np.testing.assert_array_equal(y, tokens[start + 1 : start + 65])


def test_bad_shards(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no shards here")
    with pytest.raises(AnekitError, match=r"\[data\] .*empty: no token shards"):
        ShardDataset(tmp_path / "empty")
    with pytest.raises(AnekitError, match="nowhere: no such file or directory"):
        ShardDataset(tmp_path / "nowhere")
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "fine.bin").write_bytes(b"\x01\x00\x02\x00")
    (odd / "broken.bin").write_bytes(b"\x01\x00\x02")
    with pytest.raises(FormatError, match=r"\[llama2c.shard\] .*broken.bin: odd byte length.*got 3"):
        ShardDataset(odd)
    big = tmp_path / "big"
    big.mkdir()
    _shard(big / "0.bin", [1, 5, 7, 511])
    _shard(big / "1.bin", [1, 2, 3, 512, 9, 600])
    ds = ShardDataset(big)
    ds.vocab_check(1000)
    with pytest.raises(FormatError, match=r"1.bin token\[3\] at byte 0x6: token id 512 is not below .* 512"):
        ds.vocab_check(512)
    with pytest.raises(AnekitError, match=r"no shard holds the seq_len \+ 1 = 8 tokens .*1.bin, has 6"):
        ds.batch(np.random.default_rng(0), 7)
    with pytest.raises(AnekitError, match="seq_len must be a positive integer"):
        ds.batch(np.random.default_rng(0), 0)


def test_write_shard_is_a_llama2c_shard(tmp_path: Path):
    tokens = np.array([1, 300, 65535, 0], dtype=np.int64)
    write_shard(tmp_path / "out.bin", tokens)
    raw = (tmp_path / "out.bin").read_bytes()
    assert raw == struct.pack("<4H", 1, 300, 65535, 0)
    with pytest.raises(AnekitError, match=r"must be in 0 \.\. 65535"):
        write_shard(tmp_path / "bad.bin", np.array([65536]))
    assert not (tmp_path / "bad.bin").exists()


# --- text --------------------------------------------------------------------------------------------


def test_text_dataset_tokenizes_stories_with_bos(tmp_path: Path):
    path = tmp_path / "stories.txt"
    path.write_bytes(b"  First story.\nStill first.\r\n\r\nSecond.\n \t \n\n\nThird!\n")
    ds = TextDataset(path, CharTokenizer())
    expected = [1] + [ord(c) + 3 for c in "First story.\nStill first."]
    expected += [1] + [ord(c) + 3 for c in "Second."] + [1] + [ord(c) + 3 for c in "Third!"]
    ((name, tokens),) = ds.parts
    assert name == str(path) and tokens.dtype == np.uint16
    assert tokens.tolist() == expected
    x, y = ds.batch(np.random.default_rng(5), len(expected) - 1)  # the only window
    assert x.tolist() == expected[:-1] and y.tolist() == expected[1:]


def test_bad_text(tmp_path: Path):
    with pytest.raises(AnekitError, match=r"cannot read text file .*gone\.txt"):
        TextDataset(tmp_path / "gone.txt", CharTokenizer())
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(FormatError, match=r"\[text\] .*latin1.txt at byte 0x3: not UTF-8"):
        TextDataset(tmp_path / "latin1.txt", CharTokenizer())
    (tmp_path / "short.txt").write_text("Hi.\n")
    ds = TextDataset(tmp_path / "short.txt", CharTokenizer())
    with pytest.raises(AnekitError, match=r"short.txt: 4 tokens, fewer than the seq_len \+ 1 = 5"):
        ds.batch(np.random.default_rng(0), 4)
    with pytest.raises(FormatError, match=r"short.txt token\[1\]: token id 75 is not below .* 64"):
        ds.vocab_check(64)  # 'H' + 3
    with pytest.raises(AnekitError, match="70000 tokens does not fit uint16"):
        TextDataset(tmp_path / "short.txt", CharTokenizer(70000))


def test_default_dataset_over_the_embedded_corpus():
    tok = default_tokenizer()
    ds = default_dataset(tok, seed=0)
    ((_, tokens),) = ds.parts
    assert tokens[0] == tok.bos_id
    assert int((tokens == tok.bos_id).sum()) == corpus.DEFAULT_STORIES
    assert 300_000 < ds.n_tokens < 1_000_000
    ds.vocab_check(512)
    x, y = ds.batch(np.random.default_rng(0), 256)
    assert x.shape == y.shape == (256,) and int(x.max()) < 512
    other = default_dataset(tok, seed=1, n_stories=100)
    assert int((other.parts[0][1] == tok.bos_id).sum()) == 100
    assert not np.array_equal(other.parts[0][1][:1000], tokens[:1000])
    assert "embedded corpus" in ds.source
    assert (
        tok.decode(tokens[: int(np.argmax(tokens[1:] == tok.bos_id)) + 1].tolist())
        == generate_corpus(1).strip()
    )
