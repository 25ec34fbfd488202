"""The generation kernels (a chunk of tokens over a KV cache in a surface, and the vocabulary tiles of the
head) in the simulator against a float64 transformer written here: the residual stream, the chunk's keys
and values, and the logits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from anekit import runtime
from anekit.kernels import ModelConfig
from anekit.kernels.config import preset
from anekit.kernels.generation import (
    DECODE_WIDTH,
    GenerationError,
    attention_kernel,
    cache_mask,
    capacity_for,
    head_kernel,
    head_tile_limit,
    host_attention_kernels,
    kernel_set,
    layers_kernel,
    max_fused_layers,
    mlp_kernel,
    pack_weights,
    rope_columns,
)
from anekit.kernels.route import KernelRoute
from anekit.mil.printer import print_program
from anekit.rules.lint import lint_program

LEGACY_LIKE = KernelRoute("baked", "engine", "engine", "conv")
LLAMA = ModelConfig(64, 96, 2, 4, 2, 80, 64, name="gen-llama")

# -- the float64 reference ----------------------------------------------------------------------------


def _norm(x: np.ndarray, w: np.ndarray, eps: float, offset: float) -> np.ndarray:
    """RMSNorm over channels of x (C, T): x / sqrt(mean(x^2) + eps) * (offset + w)."""
    return x / np.sqrt(np.mean(x * x, axis=0, keepdims=True) + eps) * (offset + w[:, None])


def _rotate(x: np.ndarray, positions: np.ndarray, hd: int, theta: float) -> np.ndarray:
    """RoPE of x (n * hd, T) on adjacent pairs (2j, 2j + 1) of each head by position * theta^(-2j / hd)."""
    n = x.shape[0] // hd
    freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)  # (hd / 2,)
    ang = freq[:, None] * positions[None, :]  # (hd / 2, T)
    c, s = np.cos(ang), np.sin(ang)
    h = x.reshape(n, hd // 2, 2, -1)
    a, b = h[:, :, 0], h[:, :, 1]
    return np.stack([a * c - b * s, a * s + b * c], axis=2).reshape(x.shape)


def _act(cfg: ModelConfig, a: np.ndarray) -> np.ndarray:
    if cfg.mlp_act == "gelu_tanh":
        return 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
    return a / (1 + np.exp(-a))


def reference(cfg: ModelConfig, layers: list[dict], x: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    """The residual stream after every layer of x (dim, T) at positions 0..T-1, and each layer's keys (after
    the q / k norm and RoPE) and values (kv_dim, T), in float64."""
    hd, eps, off = cfg.head_dim, cfg.norm_eps, cfg.norm_offset
    t = x.shape[1]
    pos = np.arange(t, dtype=np.float64)
    kvs = []
    x = x.astype(np.float64)
    for i, w in enumerate(layers):
        w = {k: np.asarray(v, np.float64) for k, v in w.items()}
        sliding = cfg.layer_type(i) == "sliding"
        theta = (cfg.rope_local_theta or cfg.rope_theta) if sliding else cfg.rope_theta
        window = cfg.sliding_window if sliding else 0
        n = _norm(x, w["rms_att"], eps, off)
        q, k, v = w["wq"] @ n, w["wk"] @ n, w["wv"] @ n
        if cfg.qkv_bias:
            q, k, v = q + w["bq"][:, None], k + w["bk"][:, None], v + w["bv"][:, None]
        if cfg.qk_norm:
            q = _norm(q.reshape(-1, hd, t).transpose(1, 0, 2).reshape(hd, -1), w["q_norm"], eps, off)
            q = q.reshape(hd, -1, t).transpose(1, 0, 2).reshape(-1, t)
            k = _norm(k.reshape(-1, hd, t).transpose(1, 0, 2).reshape(hd, -1), w["k_norm"], eps, off)
            k = k.reshape(hd, -1, t).transpose(1, 0, 2).reshape(-1, t)
        q, k = _rotate(q, pos, hd, theta), _rotate(k, pos, hd, theta)
        kvs.append((k, v))
        att = np.zeros_like(q)
        group = cfg.n_heads // cfg.n_kv_heads
        i_, j_ = np.arange(t)[:, None], np.arange(t)[None, :]
        visible = (j_ <= i_) & ((i_ - j_ < window) if window else True)
        for h in range(cfg.n_heads):
            kh = k[(h // group) * hd : (h // group + 1) * hd]
            vh = v[(h // group) * hd : (h // group + 1) * hd]
            s = (q[h * hd : (h + 1) * hd].T @ kh) * cfg.scores_scale  # (T, T)
            s = np.where(visible, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att[h * hd : (h + 1) * hd] = vh @ p.T
        o = w["wo"] @ att
        if cfg.post_norms:
            o = _norm(o, w["post_att_norm"], eps, off)
        x = x + o
        m = _norm(x, w["rms_ffn"], eps, off)
        f = w["w2"] @ (_act(cfg, w["w1"] @ m) * (w["w3"] @ m))
        if cfg.post_norms:
            f = _norm(f, w["post_ffn_norm"], eps, off)
        x = x + f
    return x, kvs


def random_layers(cfg: ModelConfig, seed: int) -> list[dict]:
    """Random weights for every layer, in llama2.c's (out, in) layout; norm scales near 1 (- offset)."""
    rng = np.random.default_rng(seed)
    d, q, kv, h, hd = cfg.dim, cfg.q_dim, cfg.kv_dim, cfg.hidden_dim, cfg.head_dim
    out = []
    for _ in range(cfg.n_layers):
        w = {
            "rms_att": 1 + 0.1 * rng.standard_normal(d) - cfg.norm_offset,
            "wq": rng.standard_normal((q, d)) / math.sqrt(d),
            "wk": rng.standard_normal((kv, d)) / math.sqrt(d),
            "wv": rng.standard_normal((kv, d)) / math.sqrt(d),
            "wo": rng.standard_normal((d, q)) / math.sqrt(q),
            "rms_ffn": 1 + 0.1 * rng.standard_normal(d) - cfg.norm_offset,
            "w1": rng.standard_normal((h, d)) / math.sqrt(d),
            "w3": rng.standard_normal((h, d)) / math.sqrt(d),
            "w2": rng.standard_normal((d, h)) / math.sqrt(h),
        }
        if cfg.qkv_bias:
            w.update(
                bq=0.1 * rng.standard_normal(q),
                bk=0.1 * rng.standard_normal(kv),
                bv=0.1 * rng.standard_normal(kv),
            )
        if cfg.qk_norm:
            w.update(q_norm=1 + 0.1 * rng.standard_normal(hd) - cfg.norm_offset)
            w.update(k_norm=1 + 0.1 * rng.standard_normal(hd) - cfg.norm_offset)
        if cfg.post_norms:
            w.update(post_att_norm=1 + 0.1 * rng.standard_normal(d) - cfg.norm_offset)
            w.update(post_ffn_norm=1 + 0.1 * rng.standard_normal(d) - cfg.norm_offset)
        out.append({k: v.astype(np.float32) for k, v in w.items()})
    return out


# -- the harness ----------------------------------------------------------------------------------------


def _inputs(
    cfg: ModelConfig, kernel, pos: int, n: int, x: np.ndarray, kvs: list, first: int, last: int, at=None
):
    """The activation parts (C_act, W) and "cache" of a kernel for a chunk of n tokens at ``pos`` whose
    layer-``first`` input is x[:, pos:pos+n] (x[:, at:at+n] when ``at`` is given), the cache filled with the
    reference's keys / values of positions < pos."""
    width, capacity = kernel.act.spatial, kernel.cache.spatial
    chunk = np.zeros((cfg.dim, width), np.float32)
    start = pos if at is None else at
    chunk[:, :n] = x[:, start : start + n]
    positions = np.arange(pos, pos + width)
    parts = {"x": chunk}
    names = set(kernel.act.names)
    parts["cos"], parts["sin"] = rope_columns(cfg, positions, "full")
    if "cos_local" in names:
        parts["cos_local"], parts["sin_local"] = rope_columns(cfg, positions, "sliding")
    parts["mask"] = cache_mask(capacity, pos, n, width)
    if "mask_local" in names:
        parts["mask_local"] = cache_mask(capacity, pos, n, width, cfg.sliding_window)
    cache = np.zeros((kernel.cache.channels, capacity), np.float32)
    cache[:] = 7.0  # slots >= pos hold garbage the kernel must not read
    for i in range(first, last):
        k, v = kvs[i]
        for name, a in ((f"k{i}", k), (f"v{i}", v)):
            off, c = kernel.cache.range(name)
            cache[off : off + c, :pos] = a[:, :pos]
    return kernel.act.pack(parts).reshape(kernel.act.channels, width), cache


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def _check_layers(cfg, route, chip="any", pos=37, n=5, width=DECODE_WIDTH, seed=0, tol=1e-2):
    layers = random_layers(cfg, seed)
    x = np.random.default_rng(seed + 1).standard_normal((cfg.dim, pos + n)).astype(np.float32)
    want_x, kvs = reference(cfg, layers, x)
    capacity = capacity_for(cfg.seq_len, width)
    weights = dict(enumerate(layers))
    kernel = layers_kernel(cfg, 0, cfg.n_layers, width=width, capacity=capacity, route=route, weights=weights)
    xin, cache = _inputs(cfg, kernel, pos, n, x, kvs, 0, cfg.n_layers)
    xin = kernel.pack_x(kernel.act.split(xin))
    out = kernel.run(runtime.open("sim", chip=chip), xin, cache)
    errors = {"x": _rel(out["x"][:, :n], want_x[:, pos:])}
    for i in range(cfg.n_layers):
        errors[f"k{i}"] = _rel(out[f"k{i}"][:, :n], kvs[i][0][:, pos:])
        errors[f"v{i}"] = _rel(out[f"v{i}"][:, :n], kvs[i][1][:, pos:])
    assert max(errors.values()) < tol, errors
    return errors


# -- tests ----------------------------------------------------------------------------------------------


def test_capacity_makes_the_softmax_axis_a_power_of_two():
    assert capacity_for(64, 32) == 96  # 128 - 32
    assert capacity_for(96, 32) == 96  # 128 exactly
    assert capacity_for(97, 32) == 224  # 256 - 32
    assert capacity_for(256, 128) == 384
    with pytest.raises(GenerationError):
        capacity_for(0, 32)


def test_the_cache_mask_hides_slots_at_and_after_the_chunk_and_outside_the_window():
    m = cache_mask(8, 3, 2, 4)
    assert m.shape == (8, 4)
    assert (m[:3] == 0).all() and (m[3:] < -1e4).all()
    banded = cache_mask(8, 3, 2, 4, window=2)  # query i at position 3 + i sees j > 3 + i - 2
    assert (banded[2, 0] == 0) and (banded[1, 0] < 0) and (banded[2, 1] < 0)
    with pytest.raises(GenerationError):
        cache_mask(8, 3, 5, 4)


def test_rope_columns_turn_each_pair_by_its_frequency():
    cos, sin = rope_columns(LLAMA, np.array([0, 1, 5]))
    hd = LLAMA.head_dim
    freq = 10000.0 ** (-np.arange(0, hd, 2) / hd)
    np.testing.assert_allclose(cos[::2], np.cos(freq[:, None] * [0, 1, 5]), atol=1e-6)
    np.testing.assert_allclose(sin[1::2], np.sin(freq[:, None] * [0, 1, 5]), atol=1e-6)


ROPE_ROUTES = {
    "conv": LEGACY_LIKE,
    "slice": KernelRoute("baked", "engine", "engine", "slice"),
    "matmul": KernelRoute("baked", "engine", "engine", "matmul"),
}


@pytest.mark.parametrize("chip", ["any", "m1", "m5"])
@pytest.mark.parametrize("rope", ROPE_ROUTES)
def test_two_llama_layers_over_a_cache_match_the_float64_model(rope, chip):
    """The largest relative error of x, k and v, measured: 1.24e-3 (fp16, every profile and RoPE form)."""
    _check_layers(LLAMA, ROPE_ROUTES[rope], chip=chip, tol=5e-3)


def test_a_full_chunk_at_position_zero_needs_no_cache():
    _check_layers(LLAMA, LEGACY_LIKE, pos=0, n=DECODE_WIDTH)


def test_a_prefill_width_chunk():
    _check_layers(LLAMA, LEGACY_LIKE, pos=20, n=50, width=64)


DYNAMIC = KernelRoute("dynamic", "engine", "host", "slice")


def _check_blocks(cfg, route, chip="any", pos=37, n=5, width=DECODE_WIDTH, seed=0, tol=1e-2):
    """Layer by layer through the one-block kernels (the norms on the host, in float64 here) against the
    float64 model: the residual stream after the last layer and every layer's k / v."""
    layers = random_layers(cfg, seed)
    x = np.random.default_rng(seed + 1).standard_normal((cfg.dim, pos + n)).astype(np.float32)
    want_x, kvs = reference(cfg, layers, x)
    capacity = capacity_for(cfg.seq_len, width)
    weights = dict(enumerate(layers))
    given = None if route.weights == "dynamic" else weights
    backend = runtime.open("sim", chip=chip)
    eps, off = cfg.norm_eps, cfg.norm_offset
    h = np.zeros((cfg.dim, width))
    h[:, :n] = x[:, pos:]
    errors = {}
    for i in range(cfg.n_layers):
        w = layers[i]
        attn = attention_kernel(cfg, i, width=width, capacity=capacity, route=route, weights=given)
        mlp = mlp_kernel(cfg, i, width=width, route=route, weights=given)
        assert (attn.name, mlp.name) == (f"gen_attn_{i}_w{width}", f"gen_mlp_{i}_w{width}")
        xin, cache = _inputs(cfg, attn, pos, n, _norm(h, w["rms_att"], eps, off), kvs, i, i + 1, at=0)
        if attn.columns is not None:
            xin = attn.pack_x(_act_parts(attn, xin), into=pack_weights(attn, weights))
        out = attn.run(backend, xin, cache)
        o = out["x"].astype(np.float64)
        if cfg.post_norms:
            o = _norm(o, w["post_att_norm"], eps, off)
        h = h + o
        errors[f"k{i}"] = _rel(out[f"k{i}"][:, :n], kvs[i][0][:, pos:])
        errors[f"v{i}"] = _rel(out[f"v{i}"][:, :n], kvs[i][1][:, pos:])
        m = {"x": _norm(h, w["rms_ffn"], eps, off)}
        buf = pack_weights(mlp, weights) if mlp.columns is not None else None
        f = mlp.run(backend, mlp.pack_x(m, into=buf))["x"].astype(np.float64)
        if cfg.post_norms:
            f = _norm(f, w["post_ffn_norm"], eps, off)
        h = h + f
    errors["x"] = _rel(h[:, :n], want_x[:, pos:])
    assert max(errors.values()) < tol, errors
    return errors


def _act_parts(kernel, packed: np.ndarray) -> dict:
    """The activation parts of a packed (baked-layout) "x" (C_act, W)."""
    return kernel.act.split(packed[: kernel.act.channels, : kernel.act.spatial])


@pytest.mark.parametrize("chip", ["any", "m3"])
@pytest.mark.parametrize("weights", ["dynamic", "baked"])
def test_one_block_kernels_with_the_norms_on_the_host_match_the_float64_model(weights, chip):
    """measured: at most 7.8e-4 (every profile, either weight source)."""
    route = KernelRoute(weights, "engine", "host", "slice")
    _check_blocks(LLAMA, route, chip=chip, tol=5e-3)


def test_pack_weights_writes_the_weight_columns_and_leaves_the_activations_zero():
    layers = random_layers(LLAMA, 0)
    attn = attention_kernel(LLAMA, 1, width=32, capacity=96, route=DYNAMIC)
    buf = pack_weights(attn, dict(enumerate(layers)))
    start, _ = attn.columns.range("wq_t")
    np.testing.assert_array_equal(buf[: LLAMA.dim, start : start + LLAMA.q_dim], layers[1]["wq"].T)
    assert not buf[:, :32].any()
    with pytest.raises(GenerationError, match="layer 1"):
        pack_weights(attn, {0: layers[0]})


# -- the families -----------------------------------------------------------------------------------------

FAMILIES = {
    # Qwen 2: biases on q / k / v
    "qwen2": LLAMA.with_(qkv_bias=True, rope_theta=1e6, name="gen-qwen2"),
    # Qwen 3: the per-head q / k norm before RoPE, q_dim 128 wider than dim 64
    "qwen3": LLAMA.with_(qk_norm=True, attn_head_dim=32, rope_theta=1e6, norm_eps=1e-6, name="gen-qwen3"),
    # Gemma 3: norms scale by 1 + w, post-norms, GeGLU, the first layer sliding (window 8) with its own
    # RoPE base, a query scale of its own; the embedding scale is the host's (no kernel sees it)
    "gemma3": LLAMA.with_(
        attn_head_dim=16,
        qk_norm=True,
        norm_offset=1.0,
        post_norms=True,
        mlp_act="gelu_tanh",
        embed_scale=8.0,
        attn_scale=24**-0.5,
        sliding_window=8,
        layer_types=("sliding", "full"),
        rope_theta=1e6,
        rope_local_theta=1e4,
        norm_eps=1e-6,
        name="gen-gemma3",
    ),
}
CHUNKS = {"decode": dict(pos=37, n=5, width=DECODE_WIDTH), "prefill": dict(pos=20, n=50, width=64)}


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_fused_matches_the_float64_model(family, chunk):
    """measured: at most 2.13e-3 (Gemma 3, prefill)."""
    _check_layers(FAMILIES[family], ROPE_ROUTES["slice"], tol=5e-3, **CHUNKS[chunk])


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_in_one_block_kernels_matches_the_float64_model(family, chunk):
    """measured: at most 1.68e-3 (Qwen 3, prefill)."""
    _check_blocks(FAMILIES[family], DYNAMIC, tol=5e-3, **CHUNKS[chunk])


def test_gemma3_kernels_carry_the_local_rope_and_the_banded_mask():
    cfg = FAMILIES["gemma3"]
    kernel = layers_kernel(cfg, 0, 2, width=32, capacity=96, route=LEGACY_LIKE)
    assert kernel.act.names == ["x", "cos", "sin", "cos_local", "sin_local", "mask", "mask_local"]
    assert sorted(p for p in kernel.spec.shared_files if "gen_mask" in p) == [
        "@model_path/weights/gen_mask_w32.bin",
        "@model_path/weights/gen_mask_w32_window8.bin",
    ]


# -- conv-host-attention ----------------------------------------------------------------------------------


def _host_heads_norm(x: np.ndarray, w: np.ndarray, hd: int, eps: float, off: float) -> np.ndarray:
    t = x.shape[1]
    y = _norm(x.reshape(-1, hd, t).transpose(1, 0, 2).reshape(hd, -1), w, eps, off)
    return y.reshape(hd, -1, t).transpose(1, 0, 2).reshape(-1, t)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3"])
def test_the_host_attention_kernels_with_attention_on_the_host_match_the_float64_model(family):
    """The conv route's projections and FFN at the decode width, everything else done here in float64 over
    a host cache of the reference's keys / values. measured: at most 8.7e-4."""
    cfg = LLAMA if family == "llama" else FAMILIES[family]
    pos, n, width = 37, 5, DECODE_WIDTH
    layers = random_layers(cfg, 0)
    x = np.random.default_rng(1).standard_normal((cfg.dim, pos + n)).astype(np.float32)
    want_x, kvs = reference(cfg, layers, x)
    embed = np.random.default_rng(2).standard_normal((cfg.vocab_size, cfg.dim)).astype(np.float32)
    kernels = host_attention_kernels(cfg, width, dict(enumerate(layers)) | {"embed": embed})
    names = [f"gen_{p}_{i}_w{width}" for i in range(cfg.n_layers) for p in ("qkv", "wo", "ffn")]
    assert list(kernels) == [*names, f"gen_head_0_{cfg.vocab_size}_w{width}"]
    backend = runtime.open("sim", chip="m1")
    eps, off, hd = cfg.norm_eps, cfg.norm_offset, cfg.head_dim
    h = np.zeros((cfg.dim, width))
    h[:, :n] = x[:, pos:]
    positions = np.arange(pos, pos + width, dtype=np.float64)
    group = cfg.n_heads // cfg.n_kv_heads
    for i, w in enumerate(layers):
        run = {p: kernels[f"gen_{p}_{i}_w{width}"] for p in ("qkv", "wo", "ffn")}
        qkv = run["qkv"].run(backend, _norm(h, w["rms_att"], eps, off))
        q, k, v = (qkv[t].astype(np.float64) for t in ("q", "k", "v"))
        if cfg.qk_norm:
            q, k = (
                _host_heads_norm(q, w["q_norm"], hd, eps, off),
                _host_heads_norm(k, w["k_norm"], hd, eps, off),
            )
        sliding = cfg.layer_type(i) == "sliding"
        theta = (cfg.rope_local_theta or cfg.rope_theta) if sliding else cfg.rope_theta
        q, k = _rotate(q, positions, hd, theta), _rotate(k, positions, hd, theta)
        assert _rel(k[:, :n], kvs[i][0][:, pos:]) < 5e-3 and _rel(v[:, :n], kvs[i][1][:, pos:]) < 5e-3
        keys = np.concatenate([kvs[i][0][:, :pos], k[:, :n]], axis=1)  # (kv, pos + n)
        values = np.concatenate([kvs[i][1][:, :pos], v[:, :n]], axis=1)
        att = np.zeros((cfg.q_dim, width))
        window = cfg.sliding_window if sliding else 0
        for a in range(n):
            seen = np.arange(pos + a + 1)
            if window:
                seen = seen[seen > pos + a - window]
            for head in range(cfg.n_heads):
                kv = slice((head // group) * hd, (head // group + 1) * hd)
                sc = q[head * hd : (head + 1) * hd, a] @ keys[kv, seen] * cfg.scores_scale
                p = np.exp(sc - sc.max())
                att[head * hd : (head + 1) * hd, a] = values[kv, seen] @ (p / p.sum())
        o = run["wo"].run(backend, att)["o"].astype(np.float64)
        h = h + (_norm(o, w["post_att_norm"], eps, off) if cfg.post_norms else o)
        f = run["ffn"].run(backend, _norm(h, w["rms_ffn"], eps, off))["ffn_out"].astype(np.float64)
        h = h + (_norm(f, w["post_ffn_norm"], eps, off) if cfg.post_norms else f)
    assert _rel(h[:, :n], want_x[:, pos:]) < 5e-3


def _logits_ref(x: np.ndarray, rms: np.ndarray, cls: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return cls.astype(np.float64) @ _norm(
        x.astype(np.float64), rms.astype(np.float64), cfg.norm_eps, cfg.norm_offset
    )


def test_the_head_kernel_gives_the_logits_and_two_tiles_give_one():
    cfg = LLAMA
    rng = np.random.default_rng(5)
    x = rng.standard_normal((cfg.dim, DECODE_WIDTH)).astype(np.float32)
    w = {
        "embed": (rng.standard_normal((cfg.vocab_size, cfg.dim)) / 8).astype(np.float32),
        "rms_final": (1 + 0.1 * rng.standard_normal(cfg.dim)).astype(np.float32),
        "wcls": None,
    }
    want = _logits_ref(x, w["rms_final"], w["embed"], cfg)
    backend = runtime.open("sim")
    whole = head_kernel(cfg, 0, cfg.vocab_size, width=DECODE_WIDTH, route=LEGACY_LIKE, weights=w)
    got = whole.run(backend, whole.pack_x({"x": x}))["logits"]
    assert _rel(got, want) < 5e-3
    half = cfg.vocab_size // 2
    tiles = [
        head_kernel(cfg, a, b, width=DECODE_WIDTH, route=LEGACY_LIKE, weights=w)
        for a, b in ((0, half), (half, cfg.vocab_size))
    ]
    joined = np.concatenate([t.run(backend, t.pack_x({"x": x}))["logits"] for t in tiles])
    # The same logits but for a float32 sum's last bit landing on an fp16 rounding edge: OpenBLAS's kernel
    # for half the rows may sum in another order on some CPUs (1 of 2560 logits, 0.7 fp16 ulp, on an AMD
    # EPYC), so one fp16 ulp is allowed.
    np.testing.assert_allclose(joined, got, rtol=2**-10, atol=2**-24)


@pytest.mark.parametrize("norm", ["engine", "host"])
def test_a_dynamic_head_tile_gives_the_logits(norm):
    cfg = LLAMA
    rng = np.random.default_rng(6)
    x = rng.standard_normal((cfg.dim, DECODE_WIDTH)).astype(np.float32)
    w = {
        "embed": (rng.standard_normal((cfg.vocab_size, cfg.dim)) / 8).astype(np.float32),
        "rms_final": (1 + 0.1 * rng.standard_normal(cfg.dim)).astype(np.float32),
        "wcls": (rng.standard_normal((cfg.vocab_size, cfg.dim)) / 8).astype(np.float32),
    }
    route = KernelRoute("dynamic", "engine", norm, "slice")
    if norm == "host":  # the host normalised the stream
        x = _norm(x.astype(np.float64), w["rms_final"], cfg.norm_eps, 0.0).astype(np.float32)
    want = (
        _logits_ref(x, w["rms_final"], w["wcls"], cfg)[16:64] if norm == "engine" else (w["wcls"] @ x)[16:64]
    )
    tile = head_kernel(cfg, 16, 64, width=DECODE_WIDTH, route=route)
    got = tile.run(runtime.open("sim"), tile.pack_x({"x": x}, into=pack_weights(tile, w)))["logits"]
    assert _rel(got, want) < 5e-3


KERNEL_SETS = {
    "legacy": (LEGACY_LIKE, ["gen_layers_0_1_w32", "gen_layers_1_2_w32"]),
    "dynamic-engine-attention": (
        DYNAMIC,
        ["gen_attn_0_w32", "gen_mlp_0_w32", "gen_attn_1_w32", "gen_mlp_1_w32"],
    ),
    "conv-host-attention": (
        KernelRoute("baked", "host", "host", "host"),
        [f"gen_{p}_{i}_w32" for i in range(2) for p in ("qkv", "wo", "ffn")],
    ),
}


@pytest.mark.parametrize("route_id", KERNEL_SETS)
def test_a_kernel_set_holds_every_layer_and_the_tiles_in_step_order(route_id):
    route, layers = KERNEL_SETS[route_id]
    tiles = ((0, 40), (40, 80))
    got = kernel_set(LLAMA, route, width=32, capacity=96, groups=((0, 1), (1, 2)), tiles=tiles)
    assert list(got) == [*layers, "gen_head_0_40_w32", "gen_head_40_80_w32"]


def test_weight_bytes_count_the_fp16_weights_from_shapes_alone():
    d, q, kv, h = LLAMA.dim, LLAMA.q_dim, LLAMA.kv_dim, LLAMA.hidden_dim
    attn = attention_kernel(LLAMA, 0, width=32, capacity=96, route=DYNAMIC)
    assert attn.weight_bytes == 2 * (d * q + 2 * d * kv + q * d)
    mlp = mlp_kernel(LLAMA, 0, width=32, route=DYNAMIC)
    assert mlp.weight_bytes == 2 * 3 * d * h
    fused = layers_kernel(LLAMA, 0, 2, width=32, capacity=96, route=ROPE_ROUTES["slice"])
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * h + 2 * d
    assert 2 * 2 * per_layer < fused.weight_bytes < 2 * 2 * per_layer + 4096  # + the chunk mask's blob


def test_a_layers_kernel_takes_as_many_layers_as_its_output_channels_allow():
    cfg = LLAMA.with_(n_layers=40, dim=1024, n_heads=16, n_kv_heads=16, attn_head_dim=64, name="gen-deep")
    assert max_fused_layers(cfg) == (65536 - 1024) // 2048 == 31
    layers_kernel(cfg, 0, 31, width=32, capacity=96, route=LEGACY_LIKE)
    with pytest.raises(GenerationError, match="65536"):
        layers_kernel(cfg, 0, 32, width=32, capacity=96, route=LEGACY_LIKE)


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(GenerationError, match="layers"):
        layers_kernel(LLAMA, 1, 1, width=32, capacity=96, route=LEGACY_LIKE)
    with pytest.raises(GenerationError, match="capacity"):
        layers_kernel(LLAMA, 0, 1, width=32, capacity=100, route=LEGACY_LIKE)
    with pytest.raises(GenerationError, match="tile"):
        head_kernel(LLAMA, 0, 81, width=32, route=LEGACY_LIKE)


# -- the rule book's verdict ----------------------------------------------------------------------------

# The chips (and macOS major) each route is chosen for; an engine-sized model (stories15M's shape).
LINT_ROUTES = {
    "legacy": (LEGACY_LIKE, ("any",), ""),
    "baked-fused": (KernelRoute("baked", "engine", "engine", "slice"), ("m4", "m5"), ""),
    "baked-fused-rope-matmul": (KernelRoute("baked", "engine", "engine", "matmul"), ("m3",), "26"),
    "dynamic-engine-attention": (DYNAMIC, ("m3",), "15"),
    "conv-host-attention": (KernelRoute("baked", "host", "host", "host"), ("m1", "m2"), ""),
}


# Engine-sized shapes of each family (channels multiples of 64).
LINT_CONFIGS = {
    "stories15M": preset("stories15M"),
    "qwen3-shaped": FAMILIES["qwen3"].with_(dim=128, hidden_dim=256, attn_head_dim=64, seq_len=256),
    "gemma3-shaped": FAMILIES["gemma3"].with_(
        dim=128, hidden_dim=256, attn_head_dim=64, seq_len=256, sliding_window=64
    ),
    # Two layers of the real shapes: Qwen3-0.6B (W2 reads 3072 channels, a 151936-token vocabulary) and
    # Gemma 3 1B (a 6912-wide MLP, 256-wide heads, a 262144-token vocabulary)
    "qwen3-0.6B-shaped": FAMILIES["qwen3"].with_(
        dim=1024, hidden_dim=3072, n_heads=16, n_kv_heads=8, attn_head_dim=128, vocab_size=151936, seq_len=512
    ),
    "gemma3-1B-shaped": FAMILIES["gemma3"].with_(
        dim=1152,
        hidden_dim=6912,
        n_heads=4,
        n_kv_heads=1,
        attn_head_dim=256,
        vocab_size=262144,
        seq_len=512,
        attn_scale=256**-0.5,
        sliding_window=512,
    ),
}


@pytest.mark.parametrize("config", LINT_CONFIGS)
@pytest.mark.parametrize("route_id", LINT_ROUTES)
@pytest.mark.parametrize("width", [DECODE_WIDTH, 128])
def test_the_kernels_lint_clean_for_the_chips_of_their_route(route_id, width, config):
    """No error and no warning of a rule that hardware-run evidence disputes (a contested rule)."""
    cfg = LINT_CONFIGS[config]
    route, chips, macos = LINT_ROUTES[route_id]
    capacity = capacity_for(cfg.seq_len, width)
    if route.attention == "host":
        kernels = list(host_attention_kernels(cfg, width).values())
    elif route.norm == "host":
        kernels = [
            attention_kernel(cfg, 0, width=width, capacity=capacity, route=route),
            mlp_kernel(cfg, 0, width=width, route=route),
            head_kernel(
                cfg, 0, min(cfg.vocab_size, head_tile_limit(cfg, width, route)), width=width, route=route
            ),
        ]
    else:
        kernels = [
            layers_kernel(cfg, 0, 2, width=width, capacity=capacity, route=route),
            head_kernel(
                cfg, 0, min(cfg.vocab_size, head_tile_limit(cfg, width, route)), width=width, route=route
            ),
        ]
    for kernel in kernels:
        for chip in chips:
            result = lint_program(kernel.program, kernel.name, chip, macos=macos)
            bad = [str(f) for f in result.findings if f.is_error or f.rule.conflicted]
            assert not bad, (chip, kernel.name, bad)


@pytest.mark.parametrize("rope", ROPE_ROUTES)
@pytest.mark.parametrize("family", ["llama", *FAMILIES])
def test_every_op_feeds_another_or_the_output(family, rope):
    """No dead op (a value computed and never read): the compilers prune or refuse them, and they cost."""
    cfg = LLAMA if family == "llama" else FAMILIES[family]
    kernels = [
        layers_kernel(cfg, 0, 2, width=32, capacity=96, route=ROPE_ROUTES[rope]),
        attention_kernel(cfg, 1, width=32, capacity=96, route=DYNAMIC),
        mlp_kernel(cfg, 1, width=32, route=DYNAMIC),
        head_kernel(cfg, 0, 80, width=32, route=DYNAMIC),
    ]
    for kernel in kernels:
        fn = kernel.program.functions["main"]
        read = {id(v) for op in fn.block.ops for v in op.inputs.values() if hasattr(v, "name")}
        read |= {id(v) for op in fn.block.ops for v in op.inputs.values() if isinstance(v, tuple) for v in v}
        read |= {id(v) for v in fn.block.outputs}
        dead = [
            op.outputs[0].name
            for op in fn.block.ops
            if op.op_type != "const" and id(op.outputs[0]) not in read
        ]
        assert not dead, (kernel.name, dead)


# -- the fake engine ------------------------------------------------------------------------------------


@pytest.mark.parametrize("route_id", ["legacy", "dynamic-engine-attention"])
def test_the_fake_engine_runs_a_generation_kernel_as_the_simulator_does(fake, monkeypatch, route_id):
    """Through the macOS backend over the objc fake (tests/fake_objc.py: Orion's binding rules, each
    kernel its own surfaces, inputs bound alphabetically ("cache" before "x") and padded to one size),
    a kernel with a cache input gives the simulator's output bit for bit."""
    from anekit.runtime.ane import AneBackend, lifecycle

    monkeypatch.setattr(lifecycle, "LOAD_RETRY_DELAY", 0.0)
    backend = AneBackend(runtime=fake.runtime(), dialect="ios18")
    layers = random_layers(LLAMA, 0)
    weights = dict(enumerate(layers))
    x = np.random.default_rng(1).standard_normal((LLAMA.dim, 42)).astype(np.float32)
    _, kvs = reference(LLAMA, layers, x)
    if route_id == "legacy":
        kernel = layers_kernel(LLAMA, 0, 2, width=32, capacity=96, route=LEGACY_LIKE, weights=weights)
        xin, cache = _inputs(LLAMA, kernel, 37, 5, x, kvs, 0, 2)
    else:
        kernel = attention_kernel(LLAMA, 1, width=32, capacity=96, route=DYNAMIC)
        act, cache = _inputs(LLAMA, kernel, 37, 5, x, kvs, 1, 2)
        xin = kernel.pack_x(kernel.act.split(act), into=pack_weights(kernel, weights))
    want = kernel.run(runtime.open("sim"), xin, cache)
    compiled = kernel.compile(backend)
    got = kernel.run(compiled, xin, cache)
    compiled.close()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert fake.refusals == []


# -- wide matrices ----------------------------------------------------------------------------------------

WIDE = LLAMA.with_(hidden_dim=2112, name="gen-wide")  # W2 reads 2112 channels: more than one conv may


def _conv_inputs(kernel) -> list[int]:
    ops = kernel.program.functions["main"].block.ops
    return [op.inputs["x"].type.shape[1] for op in ops if op.op_type == "conv"]


def test_a_down_projection_wider_than_a_conv_reads_is_split_and_still_matches():
    """Qwen3-0.6B's W2 reads 3072 channels, Gemma 3 1B's 6912; no hardware-run conv reads more than 2048
    (kernels.blocks.MAX_CONV_INPUT_CHANNELS): W2 is two convs over channel slices, summed."""
    _check_layers(WIDE, ROPE_ROUTES["slice"], tol=5e-3)
    fused = layers_kernel(WIDE, 0, 2, width=32, capacity=96, route=LEGACY_LIKE)
    conv_route = host_attention_kernels(WIDE, 32)["gen_ffn_0_w32"]
    for kernel in (fused, conv_route):
        widths = _conv_inputs(kernel)
        assert max(widths) <= 2048 and widths.count(1088) + widths.count(1024) >= 2, (kernel.name, widths)


def test_an_mlp_too_wide_for_side_by_side_segments_stacks_its_matrices_and_still_matches():
    """Gemma 3 1B's 6912-wide MLP takes 3 x 6912 columns side by side: more than the 16384 the M1 to M3
    address. Stacked along rows it takes 6912, and computes the same."""
    cfg = LLAMA.with_(hidden_dim=5504, name="gen-wide-mlp")
    mlp = mlp_kernel(cfg, 0, width=32, route=DYNAMIC)
    assert mlp.columns.names == ["act", "w132"] and mlp.x_shape == (3 * cfg.dim, 64 + 5504)
    narrow = mlp_kernel(LLAMA, 0, width=32, route=DYNAMIC)
    assert narrow.columns.names == ["act", "w1_t", "w3_t", "w2"]  # kernels.dynamic's own layout
    _check_blocks(cfg, DYNAMIC, tol=5e-3)


# -- prefill then decode, the kernels' own keys and values fed back ----------------------------------------


def test_prefill_then_decode_with_the_kernels_own_cache_matches_the_float64_model():
    """A 20-token prompt in one prefill chunk (width 64), then 6 decode steps (width 32, the token in
    column 0), every kernel's new k / v columns written into the next call's cache: the residual stream of
    every decoded position against the float64 model over the whole sequence."""
    cfg = FAMILIES["gemma3"]  # sliding and full layers, local RoPE: every part of the input
    layers = random_layers(cfg, 3)
    weights = dict(enumerate(layers))
    total, prompt = 26, 20
    x = np.random.default_rng(4).standard_normal((cfg.dim, total)).astype(np.float32)
    want, _ = reference(cfg, layers, x)
    backend = runtime.open("sim")
    kernels = {}
    for width in (64, DECODE_WIDTH):
        capacity = capacity_for(cfg.seq_len, width)
        k = layers_kernel(
            cfg, 0, 2, width=width, capacity=capacity, route=ROPE_ROUTES["slice"], weights=weights
        )
        kernels[width] = (k, k.compile(backend), np.zeros((k.cache.channels, capacity), np.float32))

    def step(width: int, pos: int, n: int) -> np.ndarray:
        kernel, compiled, cache = kernels[width]
        capacity = kernel.cache.spatial
        chunk = np.zeros((cfg.dim, width), np.float32)
        chunk[:, :n] = x[:, pos : pos + n]
        parts = {"x": chunk}
        positions = np.arange(pos, pos + width)
        parts["cos"], parts["sin"] = rope_columns(cfg, positions, "full")
        parts["cos_local"], parts["sin_local"] = rope_columns(cfg, positions, "sliding")
        parts["mask"] = cache_mask(capacity, pos, n, width)
        parts["mask_local"] = cache_mask(capacity, pos, n, width, cfg.sliding_window)
        out = kernel.run(compiled, kernel.pack_x(parts), cache)
        for name in kernel.cache.names:  # the chunk's own columns, in place
            off, c = kernel.cache.range(name)
            cache[off : off + c, pos : pos + n] = out[name][:, :n]
        return out["x"][:, :n]

    got = step(64, 0, prompt)
    assert _rel(got, want[:, :prompt]) < 5e-3
    kernels[DECODE_WIDTH][2][:, :prompt] = kernels[64][2][:, :prompt]  # prefill -> decode: copied once
    for pos in range(prompt, total):
        got = step(DECODE_WIDTH, pos, 1)
        assert _rel(got, want[:, pos : pos + 1]) < 5e-3, pos


@pytest.mark.parametrize("route_id", KERNEL_SETS)
def test_a_kernel_built_from_shapes_is_the_program_built_with_weights(route_id):
    """What lint and cost read from shapes alone is the program that runs."""
    route, _ = KERNEL_SETS[route_id]
    layers = random_layers(LLAMA, 0)
    weights = dict(enumerate(layers)) | {"embed": np.ones((80, 64), np.float32), "rms_final": np.ones(64)}
    args = dict(width=32, capacity=96, groups=((0, 2),), tiles=((0, 80),))
    shapes = kernel_set(LLAMA, route, **args)
    built = kernel_set(LLAMA, route, **args, weights=weights)
    assert list(shapes) == list(built)
    for name in shapes:
        assert print_program(shapes[name].program) == print_program(built[name].program), name
        assert shapes[name].weight_bytes == built[name].weight_bytes, name


def test_a_dynamic_copy_reads_the_kernels_own_input_or_is_refused() -> None:
    """A dynamic kernel's copy for n tokens takes the kernel's "x" as it is: same shape, every weight
    segment where the kernel has it (a width-repeated norm scale's first n columns); a layout that moves a
    weight is refused naming the segment, and a copy as wide as the kernel is refused."""
    from anekit.kernels.composable import Segment, SpatialLayout
    from anekit.kernels.generation import GenerationError, attention_columns, same_weight_columns

    cfg = preset("stories15M")
    dynamic = KernelRoute("dynamic", "engine", "host", "matmul")
    for n in (1, 5, 31):
        same_weight_columns(attention_columns(cfg, 32, 480), attention_columns(cfg, n, 480))
        copy = head_kernel(cfg, 0, 1000, width=32, route=dynamic, columns=n)
        assert (
            copy.columns is not None
            and copy.columns.columns == head_kernel(cfg, 0, 1000, width=32, route=dynamic).columns.columns
        )
    full = SpatialLayout.of(8, [Segment("act", 8, 32), Segment("w", 8, 16, (("w", 8, True),))], align=64)
    moved = SpatialLayout.of(8, [Segment("act", 8, 1), Segment("w", 8, 16, (("w", 8, True),))], align=1)
    with pytest.raises(GenerationError, match="x is 8 x 17"):
        same_weight_columns(full, moved)
    shifted = SpatialLayout.of(  # the same 128 columns, the weight at column 112, not 64
        8, [Segment("act", 8, 1), Segment("pad", 8, 111), Segment("w", 8, 16, (("w", 8, True),))], align=1
    )
    with pytest.raises(GenerationError, match="weight segment 'w'"):
        same_weight_columns(full, shifted)
    with pytest.raises(GenerationError, match="a copy of 32 columns of width 32"):
        head_kernel(cfg, 0, 1000, width=32, route=dynamic, columns=32)
