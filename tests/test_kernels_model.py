"""The whole stories260K checkpoint through the kernels equals llama2.c's own token-by-token forward.

The oracle is written the way run.c computes: one token at a time with a key/value cache, RoPE on
each pair in a loop, each query head reading kv head h // (n_heads / n_kv_heads). The kernels instead
process the whole sequence at once with a causal mask, grouped-query matmuls and baked RoPE tables.
Agreement of the two means causality, RoPE, GQA and the tap wiring are what the model was trained with.
"""

from __future__ import annotations

import numpy as np

from anekit import runtime
from anekit.kernels import ModelConfig, forward
from tests.kernel_weights import fp16_exact, stories260k_layer

TOKENS = 32


def _runc_forward(cfg: ModelConfig, layers: list[dict[str, np.ndarray]], tokens: list[int]) -> np.ndarray:
    """Logits (vocab, T) computed token by token, as llama2.c's run.c does, in float64."""
    d, hs, kv_dim = cfg.dim, cfg.head_dim, cfg.kv_dim
    kv_mul = cfg.n_heads // cfg.n_kv_heads
    head = layers[0]
    key_cache = np.zeros((len(layers), len(tokens), kv_dim))
    value_cache = np.zeros((len(layers), len(tokens), kv_dim))
    logits = []

    def rmsnorm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return w * (x / np.sqrt(np.mean(x * x) + 1e-5))

    for pos, token in enumerate(tokens):
        x = head["embed"][token].copy()
        for li, w in enumerate(layers):
            xb = rmsnorm(x, w["rms_att"])
            q, k, v = w["wq"] @ xb, w["wk"] @ xb, w["wv"] @ xb
            for i in range(0, d, 2):
                freq = 1.0 / 10000.0 ** ((i % hs) / hs)
                fcr, fci = np.cos(pos * freq), np.sin(pos * freq)
                for vec in (q, k) if i < kv_dim else (q,):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * fcr - v1 * fci, v0 * fci + v1 * fcr
            key_cache[li, pos], value_cache[li, pos] = k, v
            out = np.zeros(d)
            for h in range(cfg.n_heads):
                kvh = h // kv_mul
                qh = q[h * hs : (h + 1) * hs]
                keys = key_cache[li, : pos + 1, kvh * hs : (kvh + 1) * hs]
                att = keys @ qh / np.sqrt(hs)
                att = np.exp(att - att.max())
                att /= att.sum()
                out[h * hs : (h + 1) * hs] = att @ value_cache[li, : pos + 1, kvh * hs : (kvh + 1) * hs]
            x = x + w["wo"] @ out
            xb = rmsnorm(x, w["rms_ffn"])
            h1, h3 = w["w1"] @ xb, w["w3"] @ xb
            x = x + w["w2"] @ (h1 / (1 + np.exp(-h1)) * h3)
        logits.append(head["embed"] @ rmsnorm(x, head["rms_final"]))
    return np.stack(logits, axis=1)


def test_stories260k_through_the_kernels_equals_run_c():
    cfg, _ = stories260k_layer(0)
    cfg = cfg.with_(seq_len=TOKENS)  # the first TOKENS positions of the model's 512
    layers = [{k: fp16_exact(v) for k, v in stories260k_layer(i)[1].items()} for i in range(cfg.n_layers)]
    tokens = [1, *np.random.default_rng(0).integers(3, cfg.vocab_size, TOKENS - 1).tolist()]

    backend = runtime.open("sim")
    x = fp16_exact(layers[0]["embed"][tokens].T)  # (dim, T)
    for w in layers:
        x = x + forward.sdpa_fwd(cfg, w).run(backend, x=x)["o_out"]  # residual on the host
        x = x + forward.ffn_fwd(cfg, w).run(backend, x=x)["ffn_out"]
    xn = forward.final_rmsnorm(cfg, layers[0]).run(backend, x=x)["xnorm"]
    got = forward.classifier_fwd(cfg, layers[0]).run(backend, x=xn)["logits"]  # (vocab, T)

    want = _runc_forward(cfg, layers, tokens)
    rel = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert rel < 3e-2, rel
    # The model's next-token choice agrees at (nearly) every position.
    assert np.mean(got.argmax(axis=0) == want.argmax(axis=0)) >= 0.9
