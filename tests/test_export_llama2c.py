"""``anekit export --to llama2c``: run.c's model file and tokenizer.bin, read back by code written here.

The model file is parsed with struct / numpy from run.c's layout (not anekit's reader) and run through a
float64 forward like run.c's; the tokenizer.bin is parsed and decoded like run.c's decode().
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.coreml.model_export import export_llama2c
from anekit.kernels.config import ModelConfig
from anekit.llama.params import Params

CFG = ModelConfig(32, 48, 2, 4, 2, 512, 16, name="tiny")  # 512: the default tokenizer's vocabulary


def parse_run_c(data: bytes) -> dict:
    """run.c's checkpoint: 7 int32, then the weights in its order (shared classifier when vocab > 0)."""
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = struct.unpack_from("<7i", data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    hd, kv_dim = dim // n_heads, n_kv * (dim // n_heads)
    floats = np.frombuffer(data, dtype="<f4", offset=28).astype(np.float64)
    at = 0

    def take(*shape: int) -> np.ndarray:
        nonlocal at
        n = math.prod(shape)
        out = floats[at : at + n].reshape(shape)
        at += n
        return out

    w = {"dim": dim, "n_heads": n_heads, "n_kv": n_kv, "seq": seq, "vocab": vocab}
    w["embed"] = take(vocab, dim)
    w["rms_att"] = take(n_layers, dim)
    w["wq"], w["wk"], w["wv"] = (
        take(n_layers, dim, dim),
        take(n_layers, kv_dim, dim),
        take(n_layers, kv_dim, dim),
    )
    w["wo"], w["rms_ffn"] = take(n_layers, dim, dim), take(n_layers, dim)
    w["w1"], w["w2"], w["w3"] = (
        take(n_layers, hidden, dim),
        take(n_layers, dim, hidden),
        take(n_layers, hidden, dim),
    )
    w["rms_final"] = take(dim)
    take(seq, hd // 2)
    take(seq, hd // 2)  # freq_cis_real / imag: skipped by run.c
    w["wcls"] = w["embed"] if shared else take(vocab, dim)
    assert at == floats.size, "the file has bytes run.c would not read"
    return w


def run_c_logits(w: dict, tokens: list[int]) -> np.ndarray:
    dim, nh, nkv = w["dim"], w["n_heads"], w["n_kv"]
    hd, n_layers = dim // nh, w["wq"].shape[0]
    keys = np.zeros((n_layers, len(tokens), nkv * hd))
    vals = np.zeros_like(keys)
    rms = lambda x, g: g * x / math.sqrt(float(np.mean(x * x)) + 1e-5)  # noqa: E731

    def rope(v: np.ndarray, pos: int) -> np.ndarray:
        out = v.copy()
        for i in range(0, v.size, 2):
            f = pos / 10000.0 ** ((i % hd) / hd)
            out[i], out[i + 1] = (
                v[i] * math.cos(f) - v[i + 1] * math.sin(f),
                v[i] * math.sin(f) + v[i + 1] * math.cos(f),
            )
        return out

    for pos, tok in enumerate(tokens):
        x = w["embed"][tok].copy()
        for li in range(n_layers):
            xb = rms(x, w["rms_att"][li])
            q = rope(w["wq"][li] @ xb, pos)
            keys[li, pos], vals[li, pos] = rope(w["wk"][li] @ xb, pos), w["wv"][li] @ xb
            att = np.zeros(dim)
            for h in range(nh):
                g = h // (nh // nkv)
                sc = keys[li, : pos + 1, g * hd : (g + 1) * hd] @ q[h * hd : (h + 1) * hd] / math.sqrt(hd)
                e = np.exp(sc - sc.max())
                att[h * hd : (h + 1) * hd] = (e / e.sum()) @ vals[li, : pos + 1, g * hd : (g + 1) * hd]
            x = x + w["wo"][li] @ att
            xb = rms(x, w["rms_ffn"][li])
            h1 = w["w1"][li] @ xb
            x = x + w["w2"][li] @ (h1 / (1 + np.exp(-h1)) * (w["w3"][li] @ xb))
    return w["wcls"] @ rms(x, w["rms_final"])


def parse_tokenizer(data: bytes) -> tuple[list[bytes], list[float]]:
    (max_len,) = struct.unpack_from("<i", data, 0)
    off, vocab, scores = 4, [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        assert 0 <= n <= max_len
        vocab.append(data[off + 8 : off + 8 + n])
        scores.append(score)
        off += 8 + n
    return vocab, scores


def run_c_decode(vocab: list[bytes], ids: list[int]) -> str:
    out, prev = b"", 1
    for tok in ids:
        piece = vocab[tok]
        if prev == 1 and piece.startswith(b" "):
            piece = piece[1:]
        if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            piece = bytes([int(piece[3:5], 16)])
        out += piece
        prev = tok
    return out.decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def tokenizer() -> object:
    pytest.importorskip("sentencepiece")
    from anekit.llama.tokenizer import default_tokenizer

    return default_tokenizer(vocab_size=CFG.vocab_size)


@pytest.mark.parametrize("tied", [True, False])
def test_exported_model_runs_in_an_independent_run_c_forward(
    tmp_path: Path, tied: bool, tokenizer: object
) -> None:
    params = Params.init(CFG, seed=5, tied=tied)
    out = tmp_path / "model.bin"
    written = export_llama2c(params, out, tokenizer)
    assert written == [out, tmp_path / "tokenizer.bin"]
    w = parse_run_c(out.read_bytes())
    tokens = [1, 45, 7, 200, 3]
    from anekit.llama.sample import CpuDecoder

    want = CpuDecoder(params).forward_all(tokens, 0)[:, -1]  # the source model, float32
    np.testing.assert_allclose(run_c_logits(w, tokens), want, rtol=1e-4, atol=1e-4)


def test_exported_tokenizer_decodes_like_sentencepiece(tmp_path: Path, tokenizer: object) -> None:
    export_llama2c(Params.init(CFG, seed=1), tmp_path / "model.bin", tokenizer)
    vocab, scores = parse_tokenizer((tmp_path / "tokenizer.bin").read_bytes())
    assert len(vocab) == CFG.vocab_size
    sp = tokenizer.sp  # type: ignore[attr-defined]
    assert scores[100] == pytest.approx(sp.GetScore(100))
    text = "Once upon a time, a little girl saw a big dog."
    ids = tokenizer.encode(text, True, False)  # type: ignore[attr-defined]
    assert run_c_decode(vocab, ids[1:]) == tokenizer.decode(ids[1:])  # type: ignore[attr-defined]


def test_cli_llama2c_export_refuses_an_existing_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from anekit.llama.llama2c import write_llama2c

    src = tmp_path / "src" / "m.bin"
    src.parent.mkdir()
    write_llama2c(src, Params.init(CFG, seed=2))
    out = tmp_path / "o.bin"
    assert main(["export", str(src), "--to", "llama2c", str(out)]) == 0
    assert main(["export", str(src), "--to", "llama2c", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["export", str(src), "--to", "llama2c", str(out), "--force"]) == 0
    assert out.read_bytes() == src.read_bytes()


def test_the_export_samples_the_text_the_source_samples(
    tmp_path: Path, tokenizer: object, capsys: pytest.CaptureFixture
) -> None:
    """run.c drops the leading space of the piece right after BOS (``if (prev_token == 1 && piece[0] ==
    ' ') piece++;``): the exported tokenizer.bin's pieces keep sentencepiece's "▁" as a space, so the
    sampler must show BOS to the decoder. The source (with its sentencepiece tokenizer.model) and the
    export (with its tokenizer.bin) print the same text for the same seed, beginning as the prompt."""
    source = tmp_path / "src" / "ckpt.bin"
    source.parent.mkdir()
    from anekit.llama.llama2c import write_llama2c

    write_llama2c(source, Params.init(CFG, seed=4))
    (source.parent / "tokenizer.model").write_bytes(tokenizer.sp.serialized_model_proto())  # type: ignore[attr-defined]
    out = tmp_path / "out" / "model.bin"
    out.parent.mkdir()
    assert main(["export", str(source), "--to", "llama2c", str(out)]) == 0
    capsys.readouterr()
    texts = []
    for model, prompt in [(m, p) for p in ("Once upon a time", "") for m in (source, out)]:
        assert main(["sample", str(model), "--prompt", prompt, "--steps", "12", "--seed", "9"]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("Once upon a time"), texts
    assert texts[2] == texts[3] and not texts[2].startswith(" "), texts
    vocab, _ = parse_tokenizer((tmp_path / "out" / "tokenizer.bin").read_bytes())
    ids = tokenizer.encode("Once upon a time", True, False)  # type: ignore[attr-defined]
    assert run_c_decode(vocab, ids[1:]) == "Once upon a time"  # what run.c prints of the prompt
