"""The training-step oracle (tests/llama_reference.py) checked on its own.

Gradients against central finite differences of its own forward (every tensor, random directions and
single elements, tied and untied classifier, RoPE on and off, grouped-query attention); the forward
against a token-by-token KV-cache forward written the way llama2.c's run.c loops; and the real
stories260K checkpoint (parsed here with np.frombuffer from llama2.c's byte layout) giving a loss below
ln(vocab) on text it writes itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit.kernels.config import ModelConfig
from anekit.llama.params import LAYER_FIELDS, LayerParams, Params
from tests.conftest import corpus_path
from tests.llama_reference import forward, loss, loss_and_grads

TINY = ModelConfig(dim=16, hidden_dim=24, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=11, seq_len=8)
TOKENS = np.array([3, 7, 1, 7, 10, 0])  # token 7 twice: the embedding scatter-add must sum both rows
TARGETS = np.array([7, 1, 7, 10, 0, 4])
STEP = 1e-4  # five-point central difference: truncation error ~STEP^4, float64 round-off ~1e-16 / STEP
RTOL = 1e-6


def _tensor(p: Params, name: str) -> np.ndarray:
    """The array called ``name`` in Params.tensors() naming (embed, layers.i.key, rms_final, wcls)."""
    if name.startswith("layers."):
        _, i, key = name.split(".")
        return getattr(p.layers[int(i)], key)
    return getattr(p, name)


def _random_params(cfg: ModelConfig, seed: int, tied: bool) -> Params:
    """Float64 weights large enough that every nonlinearity matters (attention not uniform, silu not
    linear) and RMSNorm scales away from one so their gradients are not degenerate."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, std: float = 0.4) -> np.ndarray:
        return rng.standard_normal(shape) * std

    def scale() -> np.ndarray:
        return 1.0 + 0.3 * rng.standard_normal(cfg.dim)

    d, kv, h = cfg.dim, cfg.kv_dim, cfg.hidden_dim
    shapes = {
        "wq": (d, d),
        "wk": (kv, d),
        "wv": (kv, d),
        "wo": (d, d),
        "w1": (h, d),
        "w2": (d, h),
        "w3": (h, d),
    }
    layers = [
        LayerParams(
            rms_att=scale(),
            rms_ffn=scale(),
            **{key: w(*shape, std=0.3 if key in ("wo", "w2") else 0.4) for key, shape in shapes.items()},
        )
        for _ in range(cfg.n_layers)
    ]
    return Params(cfg, w(cfg.vocab_size, d, std=1.0), layers, scale(), None if tied else w(cfg.vocab_size, d))


def _shifted(p: Params, name: str, delta: np.ndarray) -> Params:
    q = p.copy()
    _tensor(q, name)[...] += delta
    return q


def _fd(p: Params, name: str, direction: np.ndarray) -> float:
    """d loss / d(tensor) along direction, by the fourth-order central stencil
    (8 (f(h) - f(-h)) - (f(2h) - f(-2h))) / 12h (the plain two-point one is only ~1e-5 accurate here:
    the weights are large enough for big third derivatives)."""

    def f(t: float) -> float:
        return loss(_shifted(p, name, t * direction), TOKENS, TARGETS)

    h = STEP
    return (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)


def _assert_close(numeric: float, analytic: float, what: str) -> None:
    scale = max(abs(numeric), abs(analytic))
    assert scale > 1e-8, f"{what}: gradient is ~0, the check would be vacuous"
    assert abs(numeric - analytic) <= RTOL * scale, f"{what}: finite difference {numeric} vs {analytic}"


@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_every_gradient_matches_finite_differences(tied: bool, rope: bool) -> None:
    p = _random_params(TINY.with_(rope=rope), seed=1 + 2 * tied + rope, tied=tied)
    value, grads = loss_and_grads(p, TOKENS, TARGETS)
    assert value == pytest.approx(loss(p, TOKENS, TARGETS), rel=1e-14)
    names = [name for name, _ in p.tensors()]
    assert [name for name, _ in grads.tensors()] == names
    expected = 1 + 9 * TINY.n_layers + 1 + (not tied)
    assert len(names) == expected
    rng = np.random.default_rng(42)
    for name in names:
        weight, grad = _tensor(p, name), _tensor(grads, name)
        assert grad.shape == weight.shape and grad.dtype == np.float64, name
        direction = rng.standard_normal(weight.shape)
        _assert_close(_fd(p, name, direction), float(np.sum(grad * direction)), f"{name} direction")
        # Two single elements; for the embedding, rows of tokens in the sequence (rows of other tokens
        # only get the tied classifier's gradient, exercised by the random direction).
        for _ in range(2):
            if name == "embed":
                index = (int(rng.choice(TOKENS)), int(rng.integers(TINY.dim)))
            else:
                index = tuple(int(rng.integers(n)) for n in weight.shape)
            unit = np.zeros(weight.shape)
            unit[index] = 1.0
            _assert_close(_fd(p, name, unit), float(grad[index]), f"{name}{list(index)}")


@pytest.mark.parametrize("n_kv_heads", [1, 4], ids=["mqa", "mha"])
def test_gradients_for_other_head_groupings(n_kv_heads: int) -> None:
    p = _random_params(TINY.with_(n_kv_heads=n_kv_heads), seed=7, tied=True)
    _, grads = loss_and_grads(p, TOKENS, TARGETS)
    rng = np.random.default_rng(3)
    for name in ("layers.0.wq", "layers.0.wk", "layers.1.wv", "layers.0.rms_att", "embed"):
        direction = rng.standard_normal(_tensor(p, name).shape)
        _assert_close(_fd(p, name, direction), float(np.sum(_tensor(grads, name) * direction)), name)


def test_tied_embedding_gradient_is_lookup_plus_classifier() -> None:
    tied = _random_params(TINY, seed=11, tied=True)
    untied = tied.copy()
    untied.wcls = tied.embed.copy()  # same function, classifier as a separate tensor
    value_t, g_t = loss_and_grads(tied, TOKENS, TARGETS)
    value_u, g_u = loss_and_grads(untied, TOKENS, TARGETS)
    assert value_t == pytest.approx(value_u, rel=1e-14)
    assert g_t.wcls is None and g_u.wcls is not None
    np.testing.assert_allclose(g_t.embed, g_u.embed + g_u.wcls, rtol=1e-12, atol=1e-15)
    unused = np.setdiff1d(np.arange(TINY.vocab_size), TOKENS)
    assert not g_u.embed[unused].any()  # untied: only looked-up rows get the lookup's gradient


def test_float32_params_give_float64_gradients_and_loss_matches_definition() -> None:
    p64 = _random_params(TINY, seed=5, tied=False)
    p32 = Params(TINY, p64.embed.astype(np.float32),
                 [LayerParams(**{k: v.astype(np.float32) for k, v in lp.as_dict().items()}) for lp in p64.layers],
                 p64.rms_final.astype(np.float32), p64.wcls.astype(np.float32))  # fmt: skip
    value, grads = loss_and_grads(p32, TOKENS, TARGETS)
    assert all(g.dtype == np.float64 for _, g in grads.tensors())
    logits = forward(p32, TOKENS)  # (T, vocab)
    logp = logits - np.log(np.sum(np.exp(logits), axis=1, keepdims=True))
    assert value == pytest.approx(-np.mean(logp[np.arange(len(TARGETS)), TARGETS]), rel=1e-13)


@pytest.mark.parametrize(
    ("tokens", "targets"),
    [
        (np.array([[1, 2]]), np.array([2, 3])),
        (np.array([1, 11]), np.array([2, 3])),
        (np.array([1, 2]), np.array([2, -1])),
        (np.array([1, 2]), np.array([2, 3, 4])),
        (np.array([1.0, 2.0]), np.array([2, 3])),
    ],
)
def test_bad_tokens_are_rejected(tokens: np.ndarray, targets: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"\[llama_reference\]"):
        loss_and_grads(_random_params(TINY, seed=0, tied=True), tokens, targets)


# ---------------------------------------------------------------------------------------------------
# The forward against a token-at-a-time forward shaped like llama2.c's run.c


class RunC:
    """run.c's transformer(): one token per call, keys and values cached per layer, RoPE in a loop over
    channel pairs using the (pos, head_dim / 2) cos / sin tables given (llama2.c's legacy .bin holds
    them), query head h reading kv head h // kv_mul. Float64."""

    def __init__(self, p: Params, cos_table: np.ndarray | None, sin_table: np.ndarray | None) -> None:
        self.p, self.cos, self.sin, self.pos = p, cos_table, sin_table, 0
        cfg = p.cfg
        self.key_cache = np.zeros((cfg.n_layers, cfg.seq_len, cfg.kv_dim))
        self.value_cache = np.zeros((cfg.n_layers, cfg.seq_len, cfg.kv_dim))

    def _rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        ss = np.dot(x, x) / x.size + self.p.cfg.norm_eps
        return np.asarray(weight, np.float64) * (x / np.sqrt(ss))

    def step(self, token: int) -> np.ndarray:
        p, cfg, pos = self.p, self.p.cfg, self.pos
        dim, hs, kv_dim, kv_mul = cfg.dim, cfg.head_dim, cfg.kv_dim, cfg.n_heads // cfg.n_kv_heads
        x = np.array(p.embed[token], dtype=np.float64)
        for li, lw in enumerate(p.layers):
            w = {k: np.asarray(v, np.float64) for k, v in lw.as_dict().items()}
            xb = self._rmsnorm(x, w["rms_att"])
            q, k, v = w["wq"] @ xb, w["wk"] @ xb, w["wv"] @ xb
            for i in range(0, dim, 2) if cfg.rope else ():
                if self.cos is None:
                    freq = 1.0 / cfg.rope_theta ** ((i % hs) / hs)
                    fcr, fci = math.cos(pos * freq), math.sin(pos * freq)
                else:
                    fcr, fci = float(self.cos[pos, (i % hs) // 2]), float(self.sin[pos, (i % hs) // 2])
                for vec in (q, k) if i < kv_dim else (q,):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
            self.key_cache[li, pos], self.value_cache[li, pos] = k, v
            xb = np.zeros(dim)
            for h in range(cfg.n_heads):
                kvh = h // kv_mul
                qh = q[h * hs : (h + 1) * hs]
                att = np.array(
                    [qh @ self.key_cache[li, t, kvh * hs : (kvh + 1) * hs] for t in range(pos + 1)]
                )
                att = np.exp(att / math.sqrt(hs) - np.max(att / math.sqrt(hs)))
                att /= att.sum()
                for t in range(pos + 1):
                    xb[h * hs : (h + 1) * hs] += att[t] * self.value_cache[li, t, kvh * hs : (kvh + 1) * hs]
            x = x + w["wo"] @ xb
            xb = self._rmsnorm(x, w["rms_ffn"])
            hb, hb2 = w["w1"] @ xb, w["w3"] @ xb
            x = x + w["w2"] @ (hb * (1.0 / (1.0 + np.exp(-hb))) * hb2)
        self.pos += 1
        return np.asarray(p.classifier, np.float64) @ self._rmsnorm(x, p.rms_final)  # (vocab,)


@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_forward_equals_token_by_token_runc(tied: bool, rope: bool) -> None:
    p = _random_params(TINY.with_(rope=rope), seed=21, tied=tied)
    runc = RunC(p, None, None)
    expected = np.stack([runc.step(int(t)) for t in TOKENS])  # (T, vocab)
    np.testing.assert_allclose(forward(p, TOKENS), expected, rtol=1e-11, atol=1e-11)


# ---------------------------------------------------------------------------------------------------
# The real stories260K checkpoint


def _load_llama2c(data: bytes) -> tuple[Params, np.ndarray, np.ndarray]:
    """llama2.c's legacy model .bin: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
    vocab_size (negative: separate classifier), seq_len), then float32 embed (vocab, dim); rms_att
    (L, dim); wq (L, dim, dim); wk, wv (L, kv_dim, dim); wo (L, dim, dim); rms_ffn (L, dim); w1
    (L, hidden, dim); w2 (L, dim, hidden); w3 (L, hidden, dim); rms_final (dim,); RoPE cos and sin
    (seq_len, head_dim / 2); then wcls (vocab, dim) if separate. Returns params and the two tables."""
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = (int(v) for v in np.frombuffer(data, "<i4", 7))
    cfg = ModelConfig(dim, hidden, n_layers, n_heads, n_kv, abs(vocab), seq, name="stories260K")
    offset = 28

    def take(*shape: int) -> np.ndarray:
        nonlocal offset
        count = math.prod(shape)
        out = np.frombuffer(data, "<f4", count, offset).reshape(shape)
        offset += 4 * count
        return out

    embed = take(cfg.vocab_size, dim)
    kv = cfg.kv_dim
    shapes = {"rms_att": (dim,), "wq": (dim, dim), "wk": (kv, dim), "wv": (kv, dim), "wo": (dim, dim),
              "rms_ffn": (dim,), "w1": (hidden, dim), "w2": (dim, hidden), "w3": (hidden, dim)}  # fmt: skip
    stacked = {key: take(n_layers, *shapes[key]) for key in LAYER_FIELDS}
    rms_final = take(dim)
    cos, sin = take(seq, cfg.head_dim // 2), take(seq, cfg.head_dim // 2)
    wcls = take(cfg.vocab_size, dim) if vocab < 0 else None
    assert offset == len(data), f"{offset} bytes parsed of {len(data)}"
    layers = [LayerParams(**{key: stacked[key][i] for key in LAYER_FIELDS}) for i in range(n_layers)]
    return Params(cfg, embed, layers, rms_final, wcls), cos, sin


@pytest.fixture(scope="module")
def stories260k() -> tuple[Params, np.ndarray, np.ndarray]:
    return _load_llama2c(corpus_path("llama2c", "stories260K.bin").read_bytes())


def test_stories260k_rope_tables_follow_the_frequency_rule(stories260k: tuple) -> None:
    p, cos, sin = stories260k
    hd = p.cfg.head_dim
    angle = np.arange(p.cfg.seq_len)[:, None] * 10000.0 ** (-np.arange(0, hd, 2) / hd)  # (seq, hd/2)
    # The file's tables were computed in float32: angles up to ~511 rad carry ~3e-5 rounding.
    np.testing.assert_allclose(cos, np.cos(angle), atol=1e-4)
    np.testing.assert_allclose(sin, np.sin(angle), atol=1e-4)
    np.testing.assert_allclose(cos[:32], np.cos(angle[:32]), atol=2e-6)


def test_stories260k_loss_on_its_own_story_is_below_uniform(stories260k: tuple) -> None:
    p, cos, sin = stories260k
    assert p.cfg.vocab_size == 512 and p.wcls is None  # positive vocab_size: classifier tied to embed
    # Greedy continuation of BOS (token 1) by the token-at-a-time forward using the file's RoPE tables.
    runc, sequence, logits = RunC(p, cos, sin), [1], []
    for _ in range(16):
        logits.append(runc.step(sequence[-1]))
        sequence.append(int(np.argmax(logits[-1])))
    tokens, targets = np.array(sequence[:-1]), np.array(sequence[1:])
    assert len(set(sequence)) > 5, f"degenerate continuation {sequence}"
    np.testing.assert_allclose(forward(p, tokens), np.stack(logits), rtol=1e-6, atol=1e-5)
    value, grads = loss_and_grads(p, tokens, targets)
    assert math.isfinite(value) and value < math.log(p.cfg.vocab_size), (value, sequence)
    assert all(np.isfinite(g).all() for _, g in grads.tensors())
    # A shuffled sequence of the same tokens reads as noise to the model: higher loss.
    shuffled = np.random.default_rng(0).permutation(sequence)
    assert loss(p, shuffled[:-1], shuffled[1:]) > value
