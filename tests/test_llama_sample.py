"""CPU generation: the KV-cached forward against a float64 token-by-token forward written here in run.c's
loops (on the real stories260K weights, read here from llama2.c's byte layout), and the samplers
against run.c's rules and the distributions they should draw from."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from anekit.errors import AnekitError
from anekit.kernels.config import ModelConfig
from anekit.llama.params import LayerParams, Params
from anekit.llama.sample import (
    CpuDecoder,
    Sampler,
    TextStream,
    XorShiftRng,
    forward_logits,
    make_decoder,
    sample_mult,
    sample_topp,
)
from tests.conftest import corpus_path

# -- fixtures: the real model and a tokenizer stand-in ----------------------------------------------------


class FakeTokenizer:
    """Prompts are space-separated token ids; id i decodes to "<i>". BOS is 1, as in llama2.c."""

    bos_id = 1

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str, bos: bool, eos: bool) -> list[int]:
        return ([1] if bos else []) + [int(t) for t in text.split()] + ([2] if eos else [])

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


def ids_of(text: str) -> list[int]:
    return [int(t) for t in text.replace("<", " ").replace(">", " ").split()]


def read_llama2c_bin(path: Path) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """llama2.c's legacy model file: 7 int32 (dim, hidden, layers, heads, kv_heads, vocab, seq_len), then
    float32 embed, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3 (each for all layers), rms_final, the
    two RoPE tables (seq_len * head_dim / 2 each), then wcls when vocab is negative."""
    raw = path.read_bytes()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = (int(v) for v in np.frombuffer(raw, "<i4", 7))
    floats = np.frombuffer(raw, "<f4", offset=28)
    hd = dim // n_heads
    kv = n_kv * hd
    v = abs(vocab)
    shapes = [
        ("embed", (v, dim)),
        ("rms_att", (n_layers, dim)),
        ("wq", (n_layers, dim, dim)),
        ("wk", (n_layers, kv, dim)),
        ("wv", (n_layers, kv, dim)),
        ("wo", (n_layers, dim, dim)),
        ("rms_ffn", (n_layers, dim)),
        ("w1", (n_layers, hidden, dim)),
        ("w2", (n_layers, dim, hidden)),
        ("w3", (n_layers, hidden, dim)),
        ("rms_final", (dim,)),
        ("freq_real", (seq, hd // 2)),
        ("freq_imag", (seq, hd // 2)),
    ]
    if vocab < 0:
        shapes.append(("wcls", (v, dim)))
    w: dict[str, np.ndarray] = {}
    at = 0
    for name, shape in shapes:
        n = math.prod(shape)
        w[name] = floats[at : at + n].reshape(shape)
        at += n
    assert at == floats.size, "the file holds exactly these arrays"
    cfg = ModelConfig(dim, hidden, n_layers, n_heads, n_kv, v, seq, name=path.stem)
    return cfg, w


@pytest.fixture(scope="module")
def stories() -> tuple[Params, dict[str, np.ndarray]]:
    cfg, w = read_llama2c_bin(corpus_path("llama2c", "stories260K.bin"))
    keys = ("rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3")
    layers = [LayerParams(**{k: w[k][i].copy() for k in keys}) for i in range(cfg.n_layers)]
    params = Params(cfg, w["embed"].copy(), layers, w["rms_final"].copy(), w.get("wcls"))
    return params, w


# -- the float64 reference: run.c's forward() as loops ----------------------------------------------------


class RunC64:
    """run.c's transformer() in float64: one token at a time, a KV cache, heads and timesteps as loops."""

    def __init__(self, cfg: ModelConfig, w: dict[str, np.ndarray]) -> None:
        self.cfg = cfg
        self.w = {k: a.astype(np.float64) for k, a in w.items()}
        self.key_cache = np.zeros((cfg.n_layers, cfg.seq_len, cfg.kv_dim))
        self.value_cache = np.zeros((cfg.n_layers, cfg.seq_len, cfg.kv_dim))

    @staticmethod
    def rmsnorm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        ss = np.dot(x, x) / x.size + 1e-5
        return weight * (x / np.sqrt(ss))

    @staticmethod
    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max())
        return e / e.sum()

    def forward(self, token: int, pos: int) -> np.ndarray:
        p, w = self.cfg, self.w
        dim, hs, kv_dim = p.dim, p.head_dim, p.kv_dim
        kv_mul = p.n_heads // p.n_kv_heads
        x = w["embed"][token].copy()
        for layer in range(p.n_layers):
            xb = self.rmsnorm(x, w["rms_att"][layer])
            q = w["wq"][layer] @ xb
            k = w["wk"][layer] @ xb
            v = w["wv"][layer] @ xb
            for i in range(0, dim, 2):
                freq = 1.0 / 10000.0 ** ((i % hs) / hs)
                fcr, fci = math.cos(pos * freq), math.sin(pos * freq)
                vecs = (q, k) if i < kv_dim else (q,)
                for vec in vecs:
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
            self.key_cache[layer, pos] = k
            self.value_cache[layer, pos] = v
            xb = np.zeros(dim)
            for h in range(p.n_heads):
                qh = q[h * hs : (h + 1) * hs]
                kvh = (h // kv_mul) * hs
                att = np.array(
                    [qh @ self.key_cache[layer, t, kvh : kvh + hs] / math.sqrt(hs) for t in range(pos + 1)]
                )
                att = self.softmax(att)
                for t in range(pos + 1):
                    xb[h * hs : (h + 1) * hs] += att[t] * self.value_cache[layer, t, kvh : kvh + hs]
            x = x + w["wo"][layer] @ xb
            xb = self.rmsnorm(x, w["rms_ffn"][layer])
            hb = w["w1"][layer] @ xb
            hb2 = w["w3"][layer] @ xb
            hb = hb * (1.0 / (1.0 + np.exp(-hb))) * hb2
            x = x + w["w2"][layer] @ hb
        x = self.rmsnorm(x, w["rms_final"])
        return w.get("wcls", w["embed"]) @ x


def greedy64(cfg: ModelConfig, w: dict[str, np.ndarray], prompt: list[int], steps: int) -> list[int]:
    """run.c's generate loop at temperature 0: force the prompt, then argmax, stop at BOS."""
    ref = RunC64(cfg, w)
    out: list[int] = []
    token = prompt[0]
    for pos in range(steps):
        logits = ref.forward(token, pos)
        nxt = prompt[pos + 1] if pos < len(prompt) - 1 else int(np.argmax(logits))
        if nxt == 1:
            break
        out.append(nxt)
        token = nxt
    return out


# -- the forward -------------------------------------------------------------------------------------------


def test_forward_logits_match_runc_float64(stories) -> None:
    params, w = stories
    tokens = [1, 403, 407, 261, 378, 63, 5, 287, 302, 17, 260, 271]
    logits = forward_logits(params, tokens)
    assert logits.shape == (params.cfg.vocab_size, len(tokens)) and logits.dtype == np.float32
    ref = RunC64(params.cfg, w)
    expected = np.stack([ref.forward(t, pos) for pos, t in enumerate(tokens)], axis=1)  # (vocab, T)
    np.testing.assert_allclose(logits, expected, rtol=0, atol=2e-4 * np.abs(expected).max())


def test_kv_cache_steps_equal_forward_over_the_prefix(stories) -> None:
    params, _ = stories
    tokens = np.random.default_rng(0).integers(0, params.cfg.vocab_size, 20)
    full = forward_logits(params, tokens)  # (vocab, 20)
    dec = CpuDecoder(params)
    # a 7-token prefill, then one cached step per token
    np.testing.assert_allclose(dec.forward(tokens[:7], 0), full[:, 6], rtol=1e-4, atol=1e-4)
    for pos in range(7, 20):
        step = dec.forward(tokens[pos : pos + 1], pos)
        np.testing.assert_allclose(step, full[:, pos], rtol=1e-4, atol=1e-4)
        prefix = forward_logits(params, tokens[: pos + 1])[:, -1]
        np.testing.assert_allclose(step, prefix, rtol=1e-4, atol=1e-4)


def test_untied_classifier_is_used(stories) -> None:
    params, _ = stories
    order = np.random.default_rng(1).permutation(params.cfg.vocab_size)
    wcls = 2 * params.embed[order]  # (vocab, dim): rows shuffled and doubled
    untied = Params(params.cfg, params.embed, params.layers, params.rms_final, wcls)
    tokens = [1, 50, 60]
    tied = forward_logits(params, tokens)  # (vocab, T)
    np.testing.assert_allclose(forward_logits(untied, tokens), 2 * tied[order], rtol=1e-5, atol=1e-5)


def test_decoder_rejects_positions_past_the_context(stories) -> None:
    params, _ = stories
    dec = CpuDecoder(params)
    with pytest.raises(AnekitError, match=r"\[sample\] cannot run 1 token\(s\) at position 512"):
        dec.forward([5], params.cfg.seq_len)
    with pytest.raises(AnekitError, match="precision 'fp16' is not available"):
        make_decoder(params, "fp16")


# -- generation on stories260K ------------------------------------------------------------------------------


def test_greedy_generation_equals_runc_float64(stories) -> None:
    params, w = stories
    sampler = Sampler(params, FakeTokenizer(512))
    text = "".join(sampler.generate("", 48, temperature=0.0))
    expected = greedy64(params.cfg, w, [1], 48)
    assert ids_of(text) == expected
    assert len(expected) == 48
    assert sampler.stats.generated_tokens == 48 and sampler.stats.positions == 48


def test_greedy_with_a_prompt_forces_it_then_continues(stories) -> None:
    params, w = stories
    prompt = [403, 407, 261, 378]
    sampler = Sampler(params, FakeTokenizer(512))
    ids = list(sampler.generate_ids([1, *prompt], 15, temperature=0.0))
    assert ids == greedy64(params.cfg, w, [1, *prompt], 15)
    assert ids[:4] == prompt and len(ids) == 15  # 4 forced + 11 sampled: steps count positions
    quiet = "".join(sampler.generate(" ".join(map(str, prompt)), 15, temperature=0.0, echo_prompt=False))
    assert ids_of(quiet) == ids[4:]
    assert list(sampler.generate_ids([1, *prompt], 3, temperature=0.0)) == prompt[:3]  # ends in the prompt


def test_small_top_p_equals_greedy(stories) -> None:
    params, _ = stories
    sampler = Sampler(params, FakeTokenizer(512))
    greedy = list(sampler.generate_ids([1], 40, temperature=0.0))
    for seed in (1, 2, 3):
        assert list(sampler.generate_ids([1], 40, temperature=1.0, top_p=0.01, seed=seed)) == greedy


def test_sampling_is_deterministic_per_seed(stories) -> None:
    params, _ = stories
    sampler = Sampler(params, FakeTokenizer(512))
    runs = {
        seed: list(sampler.generate_ids([1], 40, temperature=1.0, top_p=0.9, seed=seed)) for seed in (5, 6)
    }
    assert list(sampler.generate_ids([1], 40, temperature=1.0, top_p=0.9, seed=5)) == runs[5]
    assert runs[5] != runs[6]
    plain = list(sampler.generate_ids([1], 40, temperature=0.8, top_p=1.0, seed=0))
    assert list(sampler.generate_ids([1], 40, temperature=0.8, top_p=1.0, seed=0)) == plain


def test_sampler_rejects_bad_arguments(stories) -> None:
    params, _ = stories
    sampler = Sampler(params, FakeTokenizer(512))
    with pytest.raises(AnekitError, match="temperature must be a finite number >= 0"):
        list(sampler.generate_ids([1], 5, temperature=-1.0))
    with pytest.raises(AnekitError, match="seed must be an integer >= 0"):
        list(sampler.generate_ids([1], 5, seed=-3))
    with pytest.raises(AnekitError, match="prompt token 600 is outside the model's vocab of 512"):
        list(sampler.generate("600", 5))
    with pytest.raises(AnekitError, match="longer than the model's context of 512"):
        list(sampler.generate(" ".join(["5"] * 600), 5))
    with pytest.raises(AnekitError, match="the tokenizer has 32000 tokens but the model's vocab_size is 512"):
        Sampler(params, FakeTokenizer(32000))


def test_ids_past_a_smaller_tokenizer_are_never_sampled(stories) -> None:
    params, _ = stories
    wide = list(Sampler(params, FakeTokenizer(512)).generate_ids([1], 60, temperature=1.0, top_p=1.0, seed=9))
    assert max(wide) >= 300  # unrestricted, this model does use ids past 300
    narrow = Sampler(params, FakeTokenizer(300))
    assert max(narrow.generate_ids([1], 60, temperature=1.0, top_p=1.0, seed=9)) < 300


# -- sampling rules on a tiny model ---------------------------------------------------------------------------


def tiny_model() -> tuple[Params, dict[str, np.ndarray]]:
    cfg = ModelConfig(8, 12, 1, 2, 1, 6, 8, name="tiny")
    params = Params.init(cfg, seed=3)
    params.embed *= 10  # sharper logits: a distribution far from uniform
    w = {"embed": params.embed, "rms_final": params.rms_final}
    for k, a in params.layers[0].as_dict().items():
        w[k] = a[None]
    return params, w


def test_temperature_sampling_follows_the_distribution() -> None:
    params, w = tiny_model()
    logits = RunC64(params.cfg, w).forward(1, 0)  # the distribution after BOS, in float64
    temperature = 1.5
    probs = np.exp((logits - logits.max()) / temperature)
    probs /= probs.sum()
    assert probs.max() < 0.9 and probs.min() > 0.01
    # The first token is never BOS (which would end generation before any text): it is drawn from the
    # distribution of the other tokens.
    probs[1] = 0.0
    probs /= probs.sum()
    sampler = Sampler(params, FakeTokenizer(6))
    n = 3000
    counts = np.zeros(6)
    for seed in range(1, n + 1):
        first = list(sampler.generate_ids([1], 2, temperature=temperature, top_p=1.0, seed=seed))
        counts[first[0]] += 1
    assert counts[1] == 0
    seen = probs > 0
    chi2 = float(np.sum((counts[seen] - n * probs[seen]) ** 2 / (n * probs[seen])))
    assert chi2 < 23.0, (counts, n * probs)  # 4 degrees of freedom: p ~ 1e-4


def test_rng_is_runc_xorshift_star() -> None:
    state = 42
    expected = []
    for _ in range(5):  # run.c's random_u32, written with explicit 64-bit wrap-around
        state ^= state >> 12
        state = (state ^ (state << 25)) % 2**64
        state ^= state >> 27
        expected.append((state * 0x2545F4914F6CDD1D % 2**64) >> 32)
    rng = XorShiftRng(42)
    assert [rng.u32() for _ in range(5)] == expected
    f = XorShiftRng(42).f32()
    assert f == (expected[0] >> 8) / 16777216.0 and 0.0 <= f < 1.0


def test_sample_mult_inverts_the_cdf() -> None:
    probs = np.array([0.1, 0.0, 0.6, 0.3], np.float32)
    coins = (np.arange(1000) + 0.5) / 1000
    got = np.bincount([sample_mult(probs, c) for c in coins], minlength=4)
    np.testing.assert_array_equal(got, [100, 0, 600, 300])
    assert sample_mult(np.array([0.5, 0.49], np.float32), 0.999) == 1  # rounding: the last index


def test_sample_topp_draws_from_the_renormalised_nucleus() -> None:
    probs = np.array([0.05, 0.3, 0.5, 0.15], np.float32)
    # sorted: 0.5, 0.3 (sum 0.8 > 0.7): the nucleus is {2, 1}, drawn as 0.625 / 0.375
    coins = (np.arange(800) + 0.5) / 800
    got = np.bincount([sample_topp(probs, 0.7, c) for c in coins], minlength=4)
    np.testing.assert_array_equal(got, [0, 300, 500, 0])
    # p above every partial sum but the last: all tokens, in proportion
    got = np.bincount([sample_topp(probs, 0.99, c) for c in coins], minlength=4)
    np.testing.assert_array_equal(got, [40, 240, 400, 120])
    # a near-uniform distribution with a tiny p keeps only the most probable token
    flat = np.array([0.2501, 0.25, 0.2499, 0.25], np.float32)
    assert {sample_topp(flat, 1e-3, c) for c in coins} == {0}


def _topp_by_sorting_tokens(probs: np.ndarray, topp: float, coin: float) -> int:
    """run.c's nucleus sampling written plainly: the candidate tokens sorted by probability (stable), their
    float32 running sum, the coin scaled to the nucleus's mass."""
    n = probs.shape[0]
    cand = np.flatnonzero(probs >= np.float32((1.0 - topp) / (n - 1)))
    if cand.size == 0:
        return int(np.argmax(probs))
    order = cand[np.argsort(-probs[cand].astype(np.float64), kind="stable")]
    cum = np.cumsum(probs[order], dtype=np.float32)
    over = np.flatnonzero(cum > np.float32(topp))
    last = int(over[0]) if over.size else order.shape[0] - 1
    r = np.float32(coin) * cum[last]
    return int(order[min(int(np.searchsorted(cum[: last + 1], r, side="right")), last)])


def test_sample_topp_draws_the_token_sorting_the_tokens_would() -> None:
    """Only the probabilities are sorted; the token is found among its ties afterwards: the same token for
    distributions full of ties, peaked ones and near-uniform ones over 32000 tokens, for every coin."""
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(2, 400)) if trial % 10 else 32000
        if trial % 3 == 0:  # many ties
            probs = rng.integers(1, 5, n).astype(np.float32)
        elif trial % 3 == 1:  # peaked: a few tokens hold the mass
            probs = np.exp(rng.standard_normal(n) * 4).astype(np.float32)
        else:  # near-uniform, as an untrained model's
            probs = (1 + rng.random(n) * 1e-3).astype(np.float32)
        probs /= probs.sum(dtype=np.float32)
        topp = float(rng.choice([0.1, 0.5, 0.9, 0.99]))
        for coin in rng.random(5, dtype=np.float32):
            assert sample_topp(probs, topp, float(coin)) == _topp_by_sorting_tokens(probs, topp, float(coin))


# -- text streaming ---------------------------------------------------------------------------------------


def test_text_stream_holds_back_unfinished_utf8() -> None:
    text = "héllo, 世界!"
    stream = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    pieces = [stream.push(b) for b in text.encode()]
    pieces.append(stream.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1] == "" and pieces[2] == "é"  # the two bytes of é come out together


def test_text_stream_follows_a_decoder_that_strips_the_first_space() -> None:
    pieces = {5: " Once", 6: " upon", 7: " a"}

    def decode(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids).lstrip(" ")

    stream = TextStream(decode)
    assert [stream.push(i) for i in (5, 6, 7)] == ["Once", " upon", " a"]


# -- the command --------------------------------------------------------------------------------------------


def run_sample_cmd(argv: list[str]) -> int:
    import argparse

    from anekit.cli import sample_cmd

    parser = argparse.ArgumentParser(prog="anekit")
    sample_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["sample", *argv])
    return int(args.run(args))


@pytest.fixture
def fake_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    from anekit.cli import sample_cmd

    monkeypatch.setattr(
        sample_cmd, "load_tokenizer", lambda args, cfg, run=None: FakeTokenizer(cfg.vocab_size)
    )


def test_cmd_samples_a_llama2c_model(stories, fake_tokenizer, capsys: pytest.CaptureFixture[str]) -> None:
    params, w = stories
    path = corpus_path("llama2c", "stories260K.bin")
    assert run_sample_cmd([str(path), "--prompt", "403 407", "--steps", "24", "--temperature", "0"]) == 0
    out, err = capsys.readouterr()
    assert ids_of(out) == greedy64(params.cfg, w, [1, 403, 407], 24)
    assert out.endswith("\n")
    assert "24 positions" in err and "tokens/s" in err


def test_cmd_samples_a_blzt_checkpoint(
    tmp_path: Path, fake_tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    from anekit.llama.checkpoint import CheckpointMeta, save_checkpoint

    cfg = ModelConfig(16, 24, 2, 2, 2, 7, 16, name="tinymha")  # n_kv_heads = n_heads: the header can say it
    for seed in range(50):  # a model whose greedy text is not one token repeated
        params = Params.init(cfg, seed=seed, tied=False)  # an untied classifier: the BLZT body holds wcls
        assert params.wcls is not None
        params.wcls *= 50
        w = {"embed": params.embed, "rms_final": params.rms_final, "wcls": params.wcls}
        for k in params.layers[0].as_dict():
            w[k] = np.stack([getattr(lp, k) for lp in params.layers])
        expected = greedy64(cfg, w, [1, 3], 12)
        if len(set(expected)) >= 3:
            break
    assert len(expected) == 12 and len(set(expected)) >= 3
    path = tmp_path / "ckpt.bin"
    save_checkpoint(path, params, params.zeros_like(), params.zeros_like(), CheckpointMeta())
    assert int.from_bytes(path.read_bytes()[:4], "little") == 0x424C5A54
    assert run_sample_cmd([str(path), "--prompt", "3", "--steps", "12", "--temperature", "0"]) == 0
    out, _ = capsys.readouterr()
    assert ids_of(out) == expected


def test_cmd_reports_a_mismatched_tokenizer_and_a_short_file(tmp_path: Path) -> None:
    model = corpus_path("llama2c", "stories260K.bin")
    tok = corpus_path("llama2c", "tokenizer.bin")  # llama2's 32000-token vocabulary, not stories260K's 512
    with pytest.raises(AnekitError, match="has 32000 tokens but the model's vocab_size is 512"):
        run_sample_cmd([str(model), "--tokenizer", str(tok), "--steps", "4"])
    short = tmp_path / "short.bin"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(AnekitError, match=r"\[sample\] .*short.bin is 2 bytes long"):
        run_sample_cmd([str(short)])


def test_the_norm_input_check_refuses_a_column_whose_squares_overflow_and_no_other():
    """The forward's guard before each RMSNorm: a column whose sum of squares passes float32's max is
    refused; columns that each fit pass even when their total (the one-pass fast path) overflows."""
    from anekit.llama.sample import _check_norm_input

    fmax = float(np.finfo(np.float32).max)
    v = np.float32(math.sqrt(fmax / 6))  # a column of 4: 4 v^2 = 2/3 of the max; 3 columns: twice the max
    x = np.full((4, 3), v, np.float32)
    with np.errstate(over="ignore"):
        _check_norm_input(x, "x", 0)  # each column fits: no refusal
        x[:, 1] *= np.float32(2)  # 4 (2v)^2 = 8/3 of the max: this column's mean square overflows
        with pytest.raises(AnekitError, match="x at position 0 is too large for float32"):
            _check_norm_input(x, "x", 0)
        with pytest.raises(AnekitError):
            _check_norm_input(np.float32([[1.0], [np.nan]]), "x", 0)
