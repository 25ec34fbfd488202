"""llama2.c's model .bin (legacy and ak42 v1) and tokenizer.bin, against the real files and hand layouts."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from anekit.errors import AnekitError, FormatError
from anekit.kernels.config import PRESETS, ModelConfig
from anekit.llama.llama2c import (
    Tokenizer,
    TokenizerError,
    build_llama2c,
    build_tokenizer_bin,
    parse_llama2c,
    read_llama2c,
    read_tokenizer_bin,
    rope_tables,
    write_llama2c,
)
from anekit.llama.params import Params
from tests.conftest import corpus_path

SMALL = ModelConfig(dim=16, hidden_dim=40, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=24, seq_len=8)


def _f32(data: bytes, offset: int, count: int) -> np.ndarray:
    return np.frombuffer(data, "<f4", count=count, offset=offset)


def _legacy_by_hand(p: Params, cos: np.ndarray, sin: np.ndarray) -> bytes:
    """export.py's legacy_export, written out: header, embed, then each per-layer tensor for all layers."""
    c = p.cfg
    vocab = c.vocab_size if p.wcls is None else -c.vocab_size
    out = [struct.pack("<7i", c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, vocab, c.seq_len)]
    out.append(p.embed.astype("<f4").tobytes())
    for key in ("rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3"):
        out += [getattr(lp, key).astype("<f4").tobytes() for lp in p.layers]
    out += [p.rms_final.astype("<f4").tobytes(), cos.astype("<f4").tobytes(), sin.astype("<f4").tobytes()]
    if p.wcls is not None:
        out.append(p.wcls.astype("<f4").tobytes())
    return b"".join(out)


def _v1_by_hand(p: Params) -> bytes:
    """export.py's version1_export: 256-byte ak42 header, norms first, then embed and the matrices."""
    c = p.cfg
    head = struct.pack(
        "<Ii7iB", 0x616B3432, 1, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
        c.seq_len, int(p.wcls is None),
    )  # fmt: skip
    out = [head + b"\0" * (256 - len(head))]
    out += [lp.rms_att.tobytes() for lp in p.layers] + [lp.rms_ffn.tobytes() for lp in p.layers]
    out += [p.rms_final.tobytes(), p.embed.tobytes()]
    for key in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
        out += [getattr(lp, key).tobytes() for lp in p.layers]
    if p.wcls is not None:
        out.append(p.wcls.tobytes())
    return b"".join(out)


def _rope_f64(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    hd = cfg.head_dim
    ang = np.array([[pos * 10000.0 ** (-i / hd) for i in range(0, hd, 2)] for pos in range(cfg.seq_len)])
    return np.cos(ang), np.sin(ang)


def _same_params(a: Params, b: Params) -> None:
    assert [n for n, _ in a.tensors()] == [n for n, _ in b.tensors()]
    for (name, x), (_, y) in zip(a.tensors(), b.tensors()):
        np.testing.assert_array_equal(x, y, err_msg=name)


# ---------------------------------------------------------------------------------------------------
# the real stories260K.bin
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stories260k() -> bytes:
    return corpus_path("llama2c", "stories260K.bin").read_bytes()


def test_stories260k_loads_with_its_header_and_values(stories260k):
    cfg, p = read_llama2c(corpus_path("llama2c", "stories260K.bin"))
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = struct.unpack_from("<7i", stories260k, 0)
    assert (dim, hidden, n_layers, n_heads, n_kv, vocab, seq) == (64, 172, 5, 8, 4, 512, 512)
    assert cfg == PRESETS["stories260K"] and cfg.name == "stories260K" and cfg.rope
    assert p.wcls is None  # positive vocab_size: the classifier is the embedding

    kv, hd = n_kv * dim // n_heads, dim // n_heads
    at = 28
    np.testing.assert_array_equal(p.embed, _f32(stories260k, at, vocab * dim).reshape(vocab, dim))
    at += 4 * vocab * dim
    np.testing.assert_array_equal(p.layers[3].rms_att, _f32(stories260k, at + 4 * 3 * dim, dim))
    at += 4 * n_layers * dim
    wq3 = _f32(stories260k, at + 4 * 3 * dim * dim, dim * dim).reshape(dim, dim)
    np.testing.assert_array_equal(p.layers[3].wq, wq3)
    at += 4 * n_layers * dim * dim
    wk1 = _f32(stories260k, at + 4 * 1 * kv * dim, kv * dim).reshape(kv, dim)
    np.testing.assert_array_equal(p.layers[1].wk, wk1)
    at += 4 * n_layers * kv * dim * 2 + 4 * n_layers * dim * dim  # wk, wv, wo
    at += 4 * n_layers * dim  # rms_ffn
    at += 4 * n_layers * hidden * dim  # w1
    w2_4 = _f32(stories260k, at + 4 * 4 * dim * hidden, dim * hidden).reshape(dim, hidden)
    np.testing.assert_array_equal(p.layers[4].w2, w2_4)
    at += 4 * n_layers * hidden * dim * 2  # w2, w3
    np.testing.assert_array_equal(p.rms_final, _f32(stories260k, at, dim))
    at += 4 * dim + 4 * seq * hd  # the two RoPE tables
    assert at == len(stories260k)


def test_stories260k_rope_tables_match_computed_ones(stories260k):
    model = parse_llama2c(stories260k)
    cos64, sin64 = _rope_f64(model.cfg)
    angle_rounding = 512 * 2.0**-24  # the file's angles are float32 products pos * freq, pos < 512
    np.testing.assert_allclose(model.freq_cis_real, cos64, atol=angle_rounding, rtol=0)
    np.testing.assert_allclose(model.freq_cis_imag, sin64, atol=angle_rounding, rtol=0)
    cos, sin = rope_tables(model.cfg)
    assert cos.dtype == np.float32 and cos.shape == (512, 4)
    np.testing.assert_allclose(cos, model.freq_cis_real, atol=1.2e-7, rtol=0)  # within one float32 ulp
    np.testing.assert_allclose(sin, model.freq_cis_imag, atol=1.2e-7, rtol=0)


def test_stories260k_round_trips_byte_for_byte(stories260k, tmp_path):
    model = parse_llama2c(stories260k)
    assert build_llama2c(model) == stories260k
    write_llama2c(tmp_path / "copy.bin", model)
    assert (tmp_path / "copy.bin").read_bytes() == stories260k
    # From bare Params the RoPE tables are recomputed: every other byte is unchanged.
    _, params = read_llama2c(stories260k)
    again = build_llama2c(params)
    assert len(again) == len(stories260k)
    rope_at = len(stories260k) - 4 * 512 * 8
    assert again[:rope_at] == stories260k[:rope_at]


# ---------------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_write_matches_the_hand_layout_and_round_trips(tmp_path, tied):
    params = Params.init(SMALL, seed=4, tied=tied)
    path = tmp_path / "m.bin"
    write_llama2c(path, params)
    data = path.read_bytes()
    cos, sin = _rope_f64(SMALL)
    expect = _legacy_by_hand(params, cos.astype(np.float32), sin.astype(np.float32))
    assert len(data) == len(expect)
    (vocab,) = struct.unpack_from("<i", data, 20)
    assert vocab == (24 if tied else -24)
    rope = 4 * SMALL.seq_len * SMALL.head_dim  # both tables
    tail = 4 * 24 * 16 if not tied else 0
    rope_at = len(data) - tail - rope
    assert data[:rope_at] == expect[:rope_at] and data[len(data) - tail :] == expect[len(expect) - tail :]
    np.testing.assert_allclose(_f32(data, rope_at, rope // 4), _f32(expect, rope_at, rope // 4), atol=1.2e-7)

    cfg, back = read_llama2c(path)
    assert cfg == SMALL and cfg.name == "m"
    assert (back.wcls is None) == tied
    _same_params(params, back)
    write_llama2c(tmp_path / "again.bin", back)
    assert (tmp_path / "again.bin").read_bytes() == data


def test_failed_write_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "m.bin"
    write_llama2c(path, Params.init(SMALL, seed=1))
    before = path.read_bytes()

    def no_sync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("os.fsync", no_sync)
    with pytest.raises(AnekitError, match="cannot write model file"):
        write_llama2c(path, Params.init(SMALL, seed=2))
    assert path.read_bytes() == before
    assert [x.name for x in tmp_path.iterdir()] == ["m.bin"]


def test_write_rejects_wrong_shapes(tmp_path):
    params = Params.init(SMALL)
    params.layers[1].w2 = np.zeros((3, 4), np.float32)
    with pytest.raises(AnekitError, match=r"layers\.1\.w2"):
        write_llama2c(tmp_path / "bad.bin", params)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------------
# ak42 versioned files
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_ak42_version1_reads_and_writes(tmp_path, tied):
    params = Params.init(SMALL, seed=6, tied=tied)
    data = _v1_by_hand(params)
    model = parse_llama2c(data)
    assert model.version == 1 and model.freq_cis_real is None and model.cfg == SMALL
    _same_params(params, model.params)
    assert build_llama2c(model) == data
    write_llama2c(tmp_path / "v1.bin", params, version=1)
    assert (tmp_path / "v1.bin").read_bytes() == data
    write_llama2c(tmp_path / "v0.bin", model, version=0)  # convert to the legacy file run.c reads
    _same_params(params, read_llama2c(tmp_path / "v0.bin")[1])


def test_ak42_version2_is_refused_with_its_version():
    head = struct.pack("<Ii7iBi", 0x616B3432, 2, 16, 40, 2, 4, 2, 24, 8, 1, 64)
    with pytest.raises(FormatError) as e:
        parse_llama2c(head + bytes(256 - len(head)) + bytes(4096))
    assert e.value.field == "version" and e.value.offset == 4 and e.value.actual == 2
    assert "version 2" in str(e.value) and "int8" in str(e.value) and "group size 64" in str(e.value)


def test_ak42_unknown_version():
    with pytest.raises(FormatError, match="unknown ak42 version") as e:
        parse_llama2c(struct.pack("<Ii", 0x616B3432, 7) + bytes(300))
    assert e.value.actual == 7


# ---------------------------------------------------------------------------------------------------
# bad model files
# ---------------------------------------------------------------------------------------------------


def _small_file() -> bytes:
    return build_llama2c(Params.init(SMALL, seed=2))


@pytest.mark.parametrize(
    "index, value, field",
    [(0, 0, "dim"), (1, -40, "hidden_dim"), (2, 0, "n_layers"), (3, 0, "n_heads"), (3, 3, "n_heads"),
     (4, 3, "n_kv_heads"), (5, 0, "vocab_size"), (6, -1, "seq_len"), (3, 16, "n_heads")],
)  # fmt: skip
def test_bad_header_dims_are_named(index, value, field):
    data = bytearray(_small_file())
    struct.pack_into("<i", data, 4 * index, value)
    with pytest.raises(FormatError) as e:
        parse_llama2c(bytes(data))
    assert e.value.field == field and str(e.value).startswith("[llama2c] " + field)
    assert e.value.offset == 4 * index and e.value.actual == value


def test_truncated_file_names_the_tensor():
    data = _small_file()
    embed_end = 28 + 4 * 24 * 16
    wq_at = embed_end + 4 * 2 * 16  # after rms_att of both layers
    with pytest.raises(FormatError) as e:
        parse_llama2c(data[: wq_at + 4 * 16 * 16 + 8])  # 8 bytes into layer 1's wq
    assert e.value.field == "layers.1.wq" and e.value.expected == len(data)
    assert f"{wq_at + 4 * 16 * 16:#x}" in str(e.value)
    with pytest.raises(FormatError, match="header"):
        parse_llama2c(data[:20])


def test_sizes_that_disagree_with_the_header():
    data = _small_file()
    with pytest.raises(FormatError) as e:
        parse_llama2c(data + bytes(8))
    assert e.value.field == "file size" and e.value.actual == len(data) + 8
    flipped = bytearray(data)
    struct.pack_into("<i", flipped, 20, -24)  # claims an unshared classifier that is not there
    with pytest.raises(FormatError) as e:
        parse_llama2c(bytes(flipped))
    assert e.value.field == "wcls"


def test_missing_file_is_an_anekit_error(tmp_path):
    with pytest.raises(AnekitError, match="cannot read"):
        read_llama2c(tmp_path / "nope.bin")


# ---------------------------------------------------------------------------------------------------
# tokenizer.bin
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return read_tokenizer_bin(corpus_path("llama2c", "tokenizer.bin"))


@pytest.fixture(scope="module")
def sp():
    spm = pytest.importorskip("sentencepiece")
    return spm.SentencePieceProcessor(model_file=str(corpus_path("llama2c", "tokenizer.model")))


TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the park with her dog Max!",
    "Hello world",
    "  two  spaces\nnewline\ttab",
    "héllo wörld — 你好 🙂 ꙮ",
    'He said: "3.14159 is pi", 42 times.',
    "a",
]


def test_tokenizer_file_parses_like_an_independent_reading(tok):
    data = corpus_path("llama2c", "tokenizer.bin").read_bytes()
    (max_len,) = struct.unpack_from("<I", data, 0)
    records, off = [], 4
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        records.append((score, data[off + 8 : off + 8 + n]))
        off += 8 + n
    assert tok.vocab_size == len(records) == 32000 and tok.max_token_length == max_len == 27
    for i in (0, 1, 2, 3, 13, 259, 9038, 31999):
        assert tok.vocab[i] == records[i][1] and float(tok.scores[i]) == records[i][0]
    assert build_tokenizer_bin(tok) == data


def test_encode_and_decode_hand_checked_ids(tok):
    ids = tok.encode("Once upon a time, there was a little girl named Lily.")
    assert ids == [1, 9038, 2501, 263, 931, 29892, 727, 471, 263, 2217, 7826, 4257, 365, 2354, 29889]
    assert tok.encode("héllo 🙂", bos=False, eos=True) == [298, 3610, 417, 29871, 243, 162, 156, 133, 2]
    assert tok.encode("") == [1] and tok.encode("", bos=False) == []
    assert tok.decode(ids) == "Once upon a time, there was a little girl named Lily."
    assert tok.decode([9038, 2501]) == " Once upon"  # the space is only dropped right after BOS
    assert tok.decode([1, 298, 3610, 417, 29871, 243, 162, 156, 133, 2]) == "héllo 🙂"
    assert tok.decode([1, 13, 3 + 0x41]) == "\nA"  # <0x0A>, <0x41>: raw bytes
    assert tok.piece(1, 9038) == b"Once" and tok.piece(None, 9038) == b" Once" and tok.piece(5, 13) == b"\n"
    assert tok.decode([243, 162]) == "\ufffd"  # an unfinished UTF-8 sequence


def test_encode_matches_sentencepiece(tok, sp):
    for text in TEXTS:
        assert tok.encode(text, bos=False) == sp.encode(text), text
        ids = tok.encode(text, bos=True, eos=True)
        assert ids[0] == 1 and ids[-1] == 2
        assert tok.decode(ids) == sp.decode(ids) == text


def _run_c_merge(tok: Tokenizer, ids: list[int]) -> list[int]:
    """run.c's merge loop literally: rescan every pair, take the strictly best score (leftmost)."""
    lookup: dict[bytes, int] = {}
    for i, piece in enumerate(tok.vocab):
        lookup.setdefault(piece, i)
    ids = list(ids)
    while True:
        best, best_id, best_i = -1e10, -1, -1
        for i in range(len(ids) - 1):
            j = lookup.get(tok.vocab[ids[i]] + tok.vocab[ids[i + 1]], -1)
            if j != -1 and float(tok.scores[j]) > best:
                best, best_id, best_i = float(tok.scores[j]), j, i
        if best_i == -1:
            return ids
        ids[best_i : best_i + 2] = [best_id]


def test_merge_order_equals_run_c_loop_with_ties():
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(256)]
    merges = {b" ": 0, b"a": -1, b"b": -1, b"c": -1, b"ab": -5, b"ba": -5, b"aa": -5, b"bc": -3,
              b"abc": -2, b"aab": -4, b" a": -6, b"cab": -5, b"bab": -1, b"abab": -5}  # fmt: skip
    tok = Tokenizer(pieces + list(merges), [0.0] * len(pieces) + list(merges.values()))
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("abc ") for _ in range(rng.randrange(1, 25)))
        singles = [tok.vocab.index(b" ")] + [tok.vocab.index(ch.encode()) for ch in text]
        assert tok.encode(text, bos=False) == _run_c_merge(tok, singles), text


def test_byte_fallback_for_characters_not_in_the_vocabulary(tok):
    ids = tok.encode("🙂", bos=False)
    assert ids == [29871] + [3 + b for b in "🙂".encode()]


def test_tokenizer_errors(tok):
    data = build_tokenizer_bin(tok)
    with pytest.raises(FormatError) as e:
        read_tokenizer_bin(data[:-3])
    assert e.value.field == "token[31999].bytes"
    with pytest.raises(FormatError) as e:
        read_tokenizer_bin(data[:2])
    assert e.value.field == "max_token_length"
    bad = bytearray(data)
    struct.pack_into("<i", bad, 4 + 4, 1000)  # token 0's length beyond max_token_length
    with pytest.raises(FormatError) as e:
        read_tokenizer_bin(bytes(bad))
    assert e.value.field == "token[0].len" and e.value.offset == 8 and e.value.actual == 1000
    with pytest.raises(TokenizerError, match="token id 32000 at position 1"):
        tok.decode([1, 32000])
    with pytest.raises(TokenizerError):
        tok.decode([-1])
    with pytest.raises(AnekitError, match="cannot read"):
        read_tokenizer_bin("/nonexistent/tokenizer.bin")
