"""The Hugging Face oracle (tests/hf_reference.py) and fixtures (tests/hf_fixtures.py) against independent facts:
RoPE as complex rotation, Llama 3 band edges, causality, GQA = repeated MHA, Qwen3 q/k norm, bf16 rounding,
safetensors files readable by the safetensors package, sharded indexes, tokenizers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from tests import hf_fixtures as fx
from tests import hf_reference as ref

# ---------------------------------------------------------------------------------------------------
# RoPE


def test_rope_rotate_half_is_complex_rotation_of_half_pairs() -> None:
    """Pair (x_i, x_{i+hd/2}) read as x_i + 1j x_{i+hd/2} is multiplied by exp(1j * pos * inv_freq[i])."""
    rng = np.random.default_rng(0)
    hd, T = 16, 7
    x = rng.standard_normal((3, T, hd))
    positions = np.arange(T) + 5
    inv_freq = ref.default_inv_freq(10000.0, hd)
    got = ref.apply_rope(x, positions, inv_freq)
    z = (x[..., : hd // 2] + 1j * x[..., hd // 2 :]) * np.exp(1j * np.outer(positions, inv_freq))
    np.testing.assert_allclose(got, np.concatenate([z.real, z.imag], axis=-1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(ref.apply_rope(x, np.zeros(T), inv_freq), x, rtol=0, atol=0)


def test_default_inv_freq_is_theta_to_the_minus_2i_over_hd() -> None:
    inv = ref.default_inv_freq(500000.0, 64)
    assert inv.shape == (32,)
    np.testing.assert_allclose(inv, [500000.0 ** (-2 * i / 64) for i in range(32)], rtol=1e-14)


def test_rotate_half_matches_llama2c_interleaved_rope_after_the_hf_permutation() -> None:
    """transformers' convert_llama_weights_to_hf permutes q/k rows (view(h, hd/2, 2, in).transpose(1, 2));
    attention scores with interleaved RoPE on the original rows equal rotate-half on the permuted rows."""
    rng = np.random.default_rng(1)
    heads, hd, dim, T = 2, 8, 16, 6
    wq, wk = rng.standard_normal((heads * hd, dim)), rng.standard_normal((heads * hd, dim))
    x = rng.standard_normal((T, dim))
    inv_freq = ref.default_inv_freq(10000.0, hd)
    angles = np.outer(np.arange(T), inv_freq)  # (T, hd/2)

    def interleaved(w: np.ndarray) -> np.ndarray:  # llama2.c: pair (2i, 2i+1) turns by angle i
        y = (x @ w.T).reshape(T, heads, hd // 2, 2)
        z = (y[..., 0] + 1j * y[..., 1]) * np.exp(1j * angles)[:, None, :]
        return np.stack([z.real, z.imag], axis=-1).reshape(T, heads, hd).transpose(1, 0, 2)

    def permute(w: np.ndarray) -> np.ndarray:
        return w.reshape(heads, hd // 2, 2, dim).transpose(0, 2, 1, 3).reshape(heads * hd, dim)

    def rotate_half(w: np.ndarray) -> np.ndarray:
        return ref.apply_rope((x @ w.T).reshape(T, heads, hd).transpose(1, 0, 2), np.arange(T), inv_freq)

    want = interleaved(wq) @ interleaved(wk).transpose(0, 2, 1)
    got = rotate_half(permute(wq)) @ rotate_half(permute(wk)).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


LLAMA3 = fx.SHAPES["llama3"]["rope_scaling"]


def test_llama3_scaling_bands_on_the_real_frequencies() -> None:
    config = fx.small("llama3")
    base = ref.default_inv_freq(config["rope_theta"], ref.head_dim(config))
    scaled = ref.rope_inv_freq(config)
    wavelen = 2 * math.pi / base
    old = LLAMA3["original_max_position_embeddings"]
    high = wavelen < old / LLAMA3["high_freq_factor"]
    low = wavelen > old / LLAMA3["low_freq_factor"]
    assert high.any() and low.any() and (~high & ~low).any()  # all three bands occur at head_dim 64
    np.testing.assert_array_equal(scaled[high], base[high])
    np.testing.assert_allclose(scaled[low], base[low] / LLAMA3["factor"], rtol=1e-15)
    medium = ~high & ~low
    ratio = scaled[medium] / base[medium]
    assert np.all((ratio > 1 / LLAMA3["factor"]) & (ratio < 1))


def test_llama3_scaling_is_continuous_at_the_band_edges() -> None:
    factor, lo_f, hi_f, old = (
        LLAMA3[k]
        for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    )
    for edge, ratio_at_edge in ((old / hi_f, 1.0), (old / lo_f, 1 / factor)):
        wavelen = edge * (1 + np.array([-1e-9, 0.0, 1e-9]))
        inv = 2 * math.pi / wavelen
        ratio = ref.llama3_inv_freq(inv, factor, lo_f, hi_f, old) / inv
        np.testing.assert_allclose(ratio, ratio_at_edge, rtol=1e-7)
    wavelen = np.geomspace(old / hi_f / 2, old / lo_f * 2, 20001)  # the whole medium band and beyond
    ratio = ref.llama3_inv_freq(2 * math.pi / wavelen, factor, lo_f, hi_f, old) * wavelen / (2 * math.pi)
    assert np.max(np.abs(np.diff(ratio))) < 1e-3  # no jump anywhere
    assert np.all(np.diff(ratio) <= 1e-15)  # longer waves are never scaled less


def test_rope_settings_from_every_config_spelling() -> None:
    config = fx.small("llama3")
    want = ref.rope_inv_freq(config)
    old_key = dict(config, rope_scaling={("type" if k == "rope_type" else k): v for k, v in LLAMA3.items()})
    v5 = {k: v for k, v in config.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = dict(LLAMA3, rope_theta=config["rope_theta"])
    for other in (old_key, v5):
        np.testing.assert_array_equal(ref.rope_inv_freq(other), want)
    assert not np.array_equal(ref.rope_inv_freq(dict(config, rope_scaling=None)), want)
    with pytest.raises(NotImplementedError, match="yarn"):
        ref.rope_inv_freq(dict(config, rope_scaling={"rope_type": "yarn", "factor": 4.0}))


# ---------------------------------------------------------------------------------------------------
# Attention and norms


@pytest.fixture(scope="module")
def llama3_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, np.ndarray]]:
    directory = tmp_path_factory.mktemp("llama3")
    fx.make_checkpoint(directory, fx.small("llama3"), seed=3, std=0.1)
    return ref.load(directory)


def test_attention_is_causal(llama3_model: tuple[dict, dict[str, np.ndarray]]) -> None:
    config, tensors = llama3_model
    ids = [5, 17, 300, 42, 9, 640, 77, 3]
    a = ref.forward(config, tensors, ids)
    b = ref.forward(config, tensors, [*ids[:-1], 901])
    assert a.shape == (len(ids), config["vocab_size"])
    np.testing.assert_allclose(a[:-1], b[:-1], rtol=1e-12, atol=1e-12)
    assert np.max(np.abs(a[-1] - b[-1])) > 1e-3


def test_gqa_equals_mha_with_repeated_kv_heads(llama3_model: tuple[dict, dict[str, np.ndarray]]) -> None:
    """heads 4 / kv 2: head h reads kv head h // 2; copying k/v rows that way into an MHA model changes nothing."""
    config, tensors = llama3_model
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], ref.head_dim(config)
    assert kv < heads
    mha = dict(tensors)
    for i in range(config["num_hidden_layers"]):
        for w in ("k", "v"):
            name = f"model.layers.{i}.self_attn.{w}_proj.weight"
            mha[name] = np.repeat(tensors[name].reshape(kv, hd, -1), heads // kv, axis=0).reshape(
                heads * hd, -1
            )
    ids = [1, 2, 3, 400, 5, 6]
    np.testing.assert_allclose(
        ref.forward(dict(config, num_key_value_heads=heads), mha, ids),
        ref.forward(config, tensors, ids),
        rtol=1e-12,
        atol=1e-12,
    )


def test_attention_with_kv_equal_heads_is_plain_mha() -> None:
    rng = np.random.default_rng(2)
    H, T, hd = 3, 5, 8
    q, k, v = (rng.standard_normal((H, T, hd)) for _ in range(3))
    want = np.zeros((T, H * hd))
    for h in range(H):
        for t in range(T):
            s = np.array([q[h, t] @ k[h, u] / math.sqrt(hd) for u in range(t + 1)])
            p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            want[t, h * hd : (h + 1) * hd] = p @ v[h, : t + 1]
    np.testing.assert_allclose(ref.attention(q, k, v), want, rtol=1e-12, atol=1e-12)


def test_qwen3_qk_norm_with_unit_weights_gives_rms_one_heads(tmp_path: Path) -> None:
    config = fx.small("qwen3", vocab_size=300, num_hidden_layers=1)
    fx.make_checkpoint(tmp_path, config, seed=4)
    config, tensors = ref.load(tmp_path)
    hd = ref.head_dim(config)
    assert hd == 128 != config["hidden_size"] // config["num_attention_heads"]
    tensors["model.layers.0.self_attn.q_norm.weight"] = np.ones(hd)
    tensors["model.layers.0.self_attn.k_norm.weight"] = np.ones(hd)
    xn = ref.rms_norm(
        tensors["model.embed_tokens.weight"][[3, 50, 299]],
        tensors["model.layers.0.input_layernorm.weight"],
        1e-6,
    )
    q, k, v = ref.qkv(config, tensors, 0, xn)
    assert q.shape == (16, 3, hd) and k.shape == v.shape == (8, 3, hd)
    for a in (q, k):
        np.testing.assert_allclose(np.sqrt(np.mean(a * a, axis=-1)), 1.0, rtol=1e-4)
    assert np.all(np.abs(np.sqrt(np.mean(v * v, axis=-1)) - 1) > 1e-2)  # v is not normed


def test_head_dim_rules() -> None:
    assert ref.head_dim(fx.small("smollm2")) == 64 and ref.head_dim(fx.small("qwen3")) == 128
    no_key = {k: v for k, v in fx.small("qwen3").items() if k != "head_dim"}
    assert ref.head_dim(no_key) == 128 == fx.head_dim(no_key)  # Qwen3Config's default, not 1024 // 16
    assert ref.head_dim(dict(fx.small("llama3"), head_dim=None)) == 64


def test_greedy_picks_the_forward_argmax(llama3_model: tuple[dict, dict[str, np.ndarray]]) -> None:
    config, tensors = llama3_model
    prompt = [7, 8, 9]
    new = ref.greedy(config, tensors, prompt, 4)
    logits = ref.forward(config, tensors, prompt + new[:-1])
    assert new == [int(i) for i in np.argmax(logits[len(prompt) - 1 :], axis=-1)]


# ---------------------------------------------------------------------------------------------------
# bfloat16 rounding


def test_bf16_rounds_to_nearest_even_exhaustively() -> None:
    """Every finite bf16 pattern b with low halves below, at and above the midpoint: the result is the
    nearer of |b| and |b|+1 (in float64), the even pattern on ties; 0x7F7F + half rounds to inf."""
    b = np.arange(0x10000, dtype=np.uint32)
    b = b[(b & 0x7F80) != 0x7F80]  # finite patterns only
    lows = np.array([0x0000, 0x0001, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF], dtype=np.uint32)
    bb, ll = np.meshgrid(b, lows, indexing="ij")
    values = ((bb << 16) | ll).view(np.float32)  # (patterns, lows)
    mag, sign = bb & 0x7FFF, bb & 0x8000
    lo = (mag << 16).view(np.float32).astype(np.float64)
    hi = np.where(mag + 1 == 0x7F80, 2.0**128, ((mag + 1) << 16).view(np.float32).astype(np.float64))
    v = np.abs(values.astype(np.float64))
    below, above = v - lo, hi - v
    up = (above < below) | ((above == below) & ((mag & 1) == 1))
    want = (sign | np.where(up, mag + 1, mag)).astype(np.uint16)
    np.testing.assert_array_equal(fx.bf16_bits(values), want)
    tie_past_max = np.array([0x7F7F8000, 0xFF7F8000], dtype=np.uint32).view(np.float32)  # max bf16 + half ulp
    assert fx.bf16_bits(tie_past_max).tolist() == [0x7F80, 0xFF80]  # -> +-inf
    special = np.array([np.inf, -np.inf, np.nan], dtype=np.float32)
    out = fx.bf16_to_f32(fx.bf16_bits(special))
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


# ---------------------------------------------------------------------------------------------------
# Checkpoint files


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_checkpoint_loads_through_the_safetensors_package(tmp_path: Path, dtype: str) -> None:
    config = fx.small("qwen3", vocab_size=400, num_hidden_layers=1)
    stored = fx.make_checkpoint(tmp_path, config, dtype=dtype, seed=5)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["config.json", "generation_config.json", "model.safetensors"]
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert set(loaded) == set(stored) == ref.expected_names(config)
    hidden, heads, kv, hd, inter = 1024, 16, 8, 128, 3072
    shapes = {
        "model.embed_tokens.weight": (400, hidden),
        "model.layers.0.self_attn.q_proj.weight": (heads * hd, hidden),
        "model.layers.0.self_attn.k_proj.weight": (kv * hd, hidden),
        "model.layers.0.self_attn.v_proj.weight": (kv * hd, hidden),
        "model.layers.0.self_attn.o_proj.weight": (hidden, heads * hd),
        "model.layers.0.self_attn.q_norm.weight": (hd,),
        "model.layers.0.self_attn.k_norm.weight": (hd,),
        "model.layers.0.mlp.gate_proj.weight": (inter, hidden),
        "model.layers.0.mlp.up_proj.weight": (inter, hidden),
        "model.layers.0.mlp.down_proj.weight": (hidden, inter),
        "model.layers.0.input_layernorm.weight": (hidden,),
        "model.layers.0.post_attention_layernorm.weight": (hidden,),
        "model.norm.weight": (hidden,),
    }
    assert {n: a.shape for n, a in loaded.items()} == shapes  # tied: no lm_head.weight
    for name, array in loaded.items():
        assert array.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(array.astype(np.float32), stored[name])
    norm = stored["model.norm.weight"]
    assert 0.5 < norm.mean() < 1.5 and norm.std() > 0.05  # norms around 1, not all 1
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        assert f.metadata() == {"format": "pt"}
    config_back, tensors = ref.load(tmp_path)
    assert config_back["torch_dtype"] == dtype
    for name in stored:
        np.testing.assert_array_equal(tensors[name], stored[name].astype(np.float64))


def test_qwen2_has_qkv_biases_and_untied_llama_has_lm_head(tmp_path: Path) -> None:
    qwen2 = fx.make_checkpoint(tmp_path / "q", fx.small("qwen2", vocab_size=300, num_hidden_layers=1))
    assert {n for n in qwen2 if n.endswith(".bias")} == {
        f"model.layers.0.self_attn.{w}_proj.bias" for w in "qkv"
    }
    assert qwen2["model.layers.0.self_attn.k_proj.bias"].shape == (2 * 64,)
    llama = fx.make_checkpoint(tmp_path / "l", fx.small("tiny_llama2c"))
    assert llama["lm_head.weight"].shape == (512, 64) and not any(n.endswith(".bias") for n in llama)


def test_sharded_checkpoint_index_lists_every_tensor(tmp_path: Path) -> None:
    config = fx.small("smollm2", vocab_size=300, num_hidden_layers=2)
    stored = fx.make_checkpoint(tmp_path, config, dtype="float16", shards=3)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert sorted(set(index["weight_map"].values())) == files
    assert set(index["weight_map"]) == set(stored)
    assert index["metadata"]["total_size"] == sum(2 * a.size for a in stored.values())
    for file in files:
        assert set(load_file(str(tmp_path / file))) == {
            n for n, f in index["weight_map"].items() if f == file
        }
    assert not (tmp_path / "model.safetensors").exists()
    _, tensors = ref.load(tmp_path)
    assert set(tensors) == set(stored)


def test_bf16_checkpoint_header_is_accepted_and_values_are_the_rounded_ones(tmp_path: Path) -> None:
    config = fx.small("tiny_llama2c")
    stored = fx.make_checkpoint(tmp_path, config, dtype="bfloat16", shards=2)
    for file in sorted(tmp_path.glob("*.safetensors")):
        raw = file.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        assert (8 + n) % 8 == 0
        with safe_open(str(file), "np") as f:  # the Rust parser validates the header and offsets
            assert f.metadata() == {"format": "pt"}
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118
    for value in stored.values():  # every stored value is exactly a bf16 number
        assert np.all((value.view(np.uint32) & 0xFFFF) == 0)
    unrounded = fx.make_checkpoint(tmp_path / "f32", config, dtype="float32")
    name = "model.layers.0.mlp.up_proj.weight"
    assert (
        np.max(np.abs(stored[name] - unrounded[name]) / np.abs(unrounded[name])) <= 2.0**-8
    )  # bf16 keeps 8 significant bits
    config_back, tensors = ref.load(tmp_path)
    for name in stored:
        np.testing.assert_array_equal(tensors[name], stored[name].astype(np.float64))
    ids = [1, 2, 3]
    assert ref.forward(config_back, tensors, ids).shape == (3, 512)


def test_load_refuses_a_missing_tensor(tmp_path: Path) -> None:
    fx.make_checkpoint(tmp_path, fx.small("tiny_llama2c"))
    config, tensors = ref.load(tmp_path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]"):
        ref.check_names(config, tensors)


def test_small_moves_token_ids_into_a_shrunk_vocab() -> None:
    config = fx.small("qwen3", vocab_size=500)
    assert (config["bos_token_id"], config["eos_token_id"]) == (498, 499)
    assert fx.small("qwen3", vocab_size=500, eos_token_id=7)["eos_token_id"] == 7
    assert fx.small("smollm2", num_hidden_layers=1)["bos_token_id"] == 1
    assert fx.SHAPES["qwen3"]["vocab_size"] == 151936  # small() copies


# ---------------------------------------------------------------------------------------------------
# Tokenizers


def test_llama3_style_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    info = fx.make_tokenizer(tmp_path, 1000, "llama3")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert info.size == tok.get_vocab_size() <= 1000 and info.size < 400
    assert (
        tok.token_to_id("<|begin_of_text|>") == info.bos_id
        and tok.token_to_id("<|end_of_text|>") == info.eos_id
    )
    ids = tok.encode("Once upon a time").ids
    assert ids[0] == info.bos_id and tok.decode(ids) == "Once upon a time"
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"]) == ("<|begin_of_text|>", "<|end_of_text|>")
    assert "<|im_start|>" in config["chat_template"]


def test_qwen_style_tokenizer_has_its_specials_last(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    info = fx.make_tokenizer(tmp_path, 151936, "qwen")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert info.size == tok.get_vocab_size() < 400
    assert [info.specials[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == list(
        range(info.size - 3, info.size)
    )
    assert info.bos_id is None and info.eos_id == info.size - 1 and info.pad_id == info.size - 3
    ids = tok.encode("<|im_start|>user\nHello world<|im_end|>").ids
    assert ids[0] == info.specials["<|im_start|>"] and ids[-1] == info.eos_id  # no BOS added
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["bos_token"] is None and config["eos_token"] == "<|im_end|>"
