"""anekit.hf.adapters: LoRA adapter directories in PEFT's format, checked against the ``safetensors`` package,
PEFT's key names and config fields written out here from huggingface/peft, a float64 fuse, and a RoPE row
permutation written independently of ``anekit.hf.model``; every bad input is one anekit error naming it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy as st_numpy
from safetensors import safe_open

from anekit.errors import AnekitError
from anekit.hf.adapters import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    Adapters,
    LoraSpec,
    fuse,
    parse_targets,
    read_adapters,
    write_adapters,
)
from anekit.kernels.config import ModelConfig
from anekit.llama.params import LayerParams, Params
from tests.fuzz_util import watchdog

SEED = 20250301
CFG = ModelConfig(dim=16, hidden_dim=24, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=32, seq_len=8)
ALL = ("q", "k", "v", "o", "gate", "up", "down")
# PEFT's module names (transformers' Llama) and the anekit field each adapts, written out independently
MODULES = {
    "q": ("self_attn.q_proj", "wq"),
    "k": ("self_attn.k_proj", "wk"),
    "v": ("self_attn.v_proj", "wv"),
    "o": ("self_attn.o_proj", "wo"),
    "gate": ("mlp.gate_proj", "w1"),
    "up": ("mlp.up_proj", "w3"),
    "down": ("mlp.down_proj", "w2"),
}


def _shape(cfg: ModelConfig, target: str) -> tuple[int, int]:
    """(out, in) of the Linear ``target`` adapts, from the model's widths."""
    hd = cfg.dim // cfg.n_heads
    q, kv, d, h = cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.dim, cfg.hidden_dim
    return {
        "q": (q, d),
        "k": (kv, d),
        "v": (kv, d),
        "o": (d, q),
        "gate": (h, d),
        "up": (h, d),
        "down": (d, h),
    }[target]


def _key(layer: int, target: str, which: str) -> str:
    return f"base_model.model.model.layers.{layer}.{MODULES[target][0]}.lora_{which}.weight"


def _hf_to_anekit_rows(w: np.ndarray, head_dim: int) -> np.ndarray:
    """Rows of each head from rotate-half order (channel j pairs with j + head_dim/2) to adjacent pairs
    (2j, 2j+1), written with loops: an oracle independent of anekit.hf.model."""
    out = np.empty_like(w)
    half = head_dim // 2
    for h in range(w.shape[0] // head_dim):
        base = h * head_dim
        for j in range(half):
            out[base + 2 * j] = w[base + j]
            out[base + 2 * j + 1] = w[base + j + half]
    return out


def _anekit_to_hf_rows(w: np.ndarray, head_dim: int) -> np.ndarray:
    out = np.empty_like(w)
    half = head_dim // 2
    for h in range(w.shape[0] // head_dim):
        base = h * head_dim
        for j in range(half):
            out[base + j] = w[base + 2 * j]
            out[base + j + half] = w[base + 2 * j + 1]
    return out


def _random_adapters(spec: LoraSpec, cfg: ModelConfig = CFG, seed: int = SEED) -> Adapters:
    rng = np.random.default_rng(seed)
    ad = Adapters(spec, cfg.n_layers)
    for layer in range(cfg.n_layers):
        for t in spec.targets:
            out, inp = _shape(cfg, t)
            ad.a[layer, MODULES[t][1]] = rng.standard_normal((spec.rank, inp)).astype(np.float32)
            ad.b[layer, MODULES[t][1]] = rng.standard_normal((out, spec.rank)).astype(np.float32)
    return ad


def _random_params(cfg: ModelConfig = CFG, seed: int = SEED + 1) -> Params:
    rng = np.random.default_rng(seed)

    def m(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    layers = []
    for _ in range(cfg.n_layers):
        w = {t: m(*_shape(cfg, t)) for t in ALL}
        layers.append(
            LayerParams(rms_att=m(cfg.dim), rms_ffn=m(cfg.dim), **{MODULES[t][1]: w[t] for t in ALL})
        )
    return Params(cfg, m(cfg.vocab_size, cfg.dim), layers, m(cfg.dim), None)


def _same(x: Adapters, y: Adapters) -> None:
    assert x.spec == y.spec and x.n_layers == y.n_layers
    assert set(x.a) == set(y.a) and set(x.b) == set(y.b)
    for k in x.a:
        assert x.a[k].dtype == y.a[k].dtype == np.float32
        np.testing.assert_array_equal(x.a[k], y.a[k])
        np.testing.assert_array_equal(x.b[k], y.b[k])


def _peft_dir(path: Path, tensors: dict[str, np.ndarray], **config: Any) -> Path:
    """An adapter directory as PEFT writes one: safetensors via the package, config as json."""
    path.mkdir(parents=True, exist_ok=True)
    st_numpy.save_file(tensors, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
    base = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": 2,
        "lora_alpha": 4,
        "lora_dropout": 0.05,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "use_dora": False,
        "modules_to_save": None,
    }
    base.update(config)
    (path / CONFIG_NAME).write_text(json.dumps({k: v for k, v in base.items() if v is not ...}))
    return path


def _peft_tensors(
    targets: tuple[str, ...] = ("q", "v"), r: int = 2, seed: int = SEED
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(CFG.n_layers):
        for t in targets:
            o, i = _shape(CFG, t)
            out[_key(layer, t, "A")] = rng.standard_normal((r, i)).astype(np.float32)
            out[_key(layer, t, "B")] = rng.standard_normal((o, r)).astype(np.float32)
    return out


# -- spec -----------------------------------------------------------------------------------------------


def test_spec_scale_and_targets() -> None:
    assert LoraSpec(8, 16, ("q", "v")).scale == 2.0
    assert LoraSpec(4, 8, ("q",), use_rslora=True).scale == 4.0
    assert LoraSpec(2, 1, ("v", "q")).targets == ("q", "v")  # kept in TARGETS order
    assert parse_targets("q,k,v,o") == ("q", "k", "v", "o")
    assert parse_targets(" down , gate,up ") == ("gate", "up", "down")


def test_parse_targets_names_the_unknown_one_and_lists_the_known() -> None:
    with pytest.raises(AnekitError, match=r"'qq'.*known: q, k, v, o, gate, up, down"):
        parse_targets("q,qq")
    with pytest.raises(AnekitError, match="more than once"):
        parse_targets("q,q")
    with pytest.raises(AnekitError, match="no targets"):
        parse_targets(" , ")


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"rank": 0}, "rank"),
        ({"rank": True}, "rank"),
        ({"rank": 2.0}, "rank"),
        ({"alpha": 0}, "alpha"),
        ({"alpha": math.inf}, "alpha"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"targets": ()}, "empty"),
        ({"targets": "q"}, "targets"),
        ({"targets": ("q", "x")}, "'x'"),
        ({"targets": ("q", "q")}, "more than once"),
        ({"use_rslora": 1}, "use_rslora"),
    ],
)
def test_bad_spec_is_one_error(kwargs: dict[str, Any], word: str) -> None:
    args: dict[str, Any] = {"rank": 2, "alpha": 4.0, "targets": ("q",), **kwargs}
    with pytest.raises(AnekitError, match=word):
        LoraSpec(**args)


# -- init, delta, fuse ----------------------------------------------------------------------------------


def test_init_is_peft_kaiming_uniform_a_and_zero_b() -> None:
    spec = LoraSpec(16, 32, ALL)
    ad = Adapters.init(spec, CFG, np.random.default_rng(SEED))
    assert set(ad.a) == set(ad.b) == {(i, MODULES[t][1]) for i in range(CFG.n_layers) for t in ALL}
    for layer in range(CFG.n_layers):
        for t in ALL:
            out, inp = _shape(CFG, t)
            a, b = ad.a[layer, MODULES[t][1]], ad.b[layer, MODULES[t][1]]
            assert a.shape == (16, inp) and b.shape == (out, 16)
            assert a.dtype == b.dtype == np.float32
            bound = 1 / math.sqrt(inp)
            assert np.abs(a).max() <= bound
            assert np.abs(a).max() > 0.8 * bound  # spread over the whole interval, not a narrower one
            assert not b.any()
    every = np.concatenate([a.ravel() * math.sqrt(a.shape[1]) for a in ad.a.values()])
    assert abs(every.mean()) < 0.05 and abs(every.var() - 1 / 3) < 0.03  # uniform(-1, 1) after rescaling
    params = _random_params()
    fused = fuse(params, ad)
    for x, y in zip(params.tensors(), fused.tensors()):
        np.testing.assert_array_equal(x[1], y[1])  # B = 0: the adapted model starts as the base


def test_fuse_matches_float64_and_leaves_the_input_alone() -> None:
    spec = LoraSpec(3, 5.0, ("q", "o", "down"), use_rslora=True)
    ad = _random_adapters(spec)
    params = _random_params()
    before = {name: a.copy() for name, a in params.tensors()}
    fused = fuse(params, ad)
    for name, a in params.tensors():
        np.testing.assert_array_equal(a, before[name])
    scale = 5.0 / math.sqrt(3)
    for layer in range(CFG.n_layers):
        for t in ALL:
            f = MODULES[t][1]
            w = getattr(params.layers[layer], f).astype(np.float64)
            if t in spec.targets:
                w = w + scale * (ad.b[layer, f].astype(np.float64) @ ad.a[layer, f].astype(np.float64))
            got = getattr(fused.layers[layer], f)
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(fused.embed, params.embed)
    assert fused.embed is not params.embed


def test_fuse_refuses_adapters_of_another_shape() -> None:
    ad = _random_adapters(LoraSpec(2, 4, ("q",)))
    ad.b[1, "wq"] = ad.b[1, "wq"][:, :1].copy()
    with pytest.raises(AnekitError, match=r"B of layer 1 wq: shape \[16, 1\], expected \[16, 2\]"):
        fuse(_random_params(), ad)
    ad = _random_adapters(LoraSpec(2, 4, ("q",)))
    del ad.a[0, "wq"]
    with pytest.raises(AnekitError, match="A of layer 0 wq is missing"):
        fuse(_random_params(), ad)


# -- write ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [LoraSpec(2, 4, ("q", "v")), LoraSpec(3, 7.5, ALL, dropout=0.1, use_rslora=True)],
    ids=["qv", "all-rslora"],
)
def test_write_read_round_trip_is_exact(tmp_path: Path, spec: LoraSpec) -> None:
    ad = _random_adapters(spec)
    written = write_adapters(tmp_path / "ad", ad, CFG, "meta-llama/Tiny")
    assert sorted(p.name for p in written) == sorted([CONFIG_NAME, WEIGHTS_NAME])
    _same(read_adapters(tmp_path / "ad", CFG), ad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ad"]  # no temporary left beside it


def test_written_file_has_peft_names_shapes_and_config(tmp_path: Path) -> None:
    spec = LoraSpec(4, 8, ALL, dropout=0.05)
    ad = _random_adapters(spec)
    write_adapters(tmp_path / "ad", ad, CFG, "org/base")
    tensors = st_numpy.load_file(str(tmp_path / "ad" / WEIGHTS_NAME))
    expected = {}
    for layer in range(2):
        for t in ALL:
            out, inp = _shape(CFG, t)
            expected[_key(layer, t, "A")] = (4, inp)
            expected[_key(layer, t, "B")] = (out, 4)
    assert {k: v.shape for k, v in tensors.items()} == expected
    assert all(v.dtype == np.float32 for v in tensors.values())
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in tensors  # literally
    with safe_open(str(tmp_path / "ad" / WEIGHTS_NAME), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
    hd = CFG.dim // CFG.n_heads
    for layer in range(2):
        for t in ALL:
            f = MODULES[t][1]
            np.testing.assert_array_equal(tensors[_key(layer, t, "A")], ad.a[layer, f])
            b = _anekit_to_hf_rows(ad.b[layer, f], hd) if t in ("q", "k") else ad.b[layer, f]
            np.testing.assert_array_equal(tensors[_key(layer, t, "B")], b)
    text = (tmp_path / "ad" / CONFIG_NAME).read_text()
    config = json.loads(text)
    assert list(config) == sorted(config)  # PeftConfig.save_pretrained: sort_keys=True
    want = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.05,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "base_model_name_or_path": "org/base",
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": None,
    }
    assert {k: config[k] for k in want} == want
    assert sorted(config["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


def test_fusing_in_either_layout_agrees(tmp_path: Path) -> None:
    """HF base + scale * B_saved @ A_saved == to HF layout of (anekit base + delta): the q / k rows of
    lora_B are permuted as the base's rows are, and nothing else is."""
    hd = CFG.dim // CFG.n_heads
    rng = np.random.default_rng(SEED + 7)
    hf_base = {(i, t): rng.standard_normal(_shape(CFG, t)).astype(np.float32) for i in range(2) for t in ALL}
    ones = np.ones(CFG.dim, np.float32)
    layers = []
    for i in range(2):
        w = {t: _hf_to_anekit_rows(hf_base[i, t], hd) if t in ("q", "k") else hf_base[i, t] for t in ALL}
        layers.append(LayerParams(rms_att=ones, rms_ffn=ones, **{MODULES[t][1]: w[t] for t in ALL}))
    params = Params(
        CFG, np.zeros((CFG.vocab_size, CFG.dim), np.float32), layers, np.ones(CFG.dim, np.float32)
    )
    spec = LoraSpec(3, 6, ALL)
    ad = _random_adapters(spec, seed=SEED + 8)
    fused = fuse(params, ad)
    write_adapters(tmp_path / "ad", ad, CFG)
    saved = st_numpy.load_file(str(tmp_path / "ad" / WEIGHTS_NAME))
    for i in range(2):
        for t in ALL:
            peft = hf_base[i, t].astype(np.float64) + 2.0 * (
                saved[_key(i, t, "B")].astype(np.float64) @ saved[_key(i, t, "A")].astype(np.float64)
            )
            ours = getattr(fused.layers[i], MODULES[t][1])
            ours_hf = _anekit_to_hf_rows(ours, hd) if t in ("q", "k") else ours
            np.testing.assert_allclose(ours_hf, peft, rtol=1e-5, atol=1e-5)


def test_reading_a_peft_directory_permutes_q_and_k_back(tmp_path: Path) -> None:
    """A directory written by the safetensors package, as PEFT does: delta in anekit layout is the HF delta
    with its q / k rows interleaved."""
    tensors = _peft_tensors(("q", "k", "v", "o"))
    _peft_dir(tmp_path / "ad", tensors, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    ad = read_adapters(tmp_path / "ad", CFG)
    assert ad.spec == LoraSpec(2, 4, ("q", "k", "v", "o"), dropout=0.05)
    hd = CFG.dim // CFG.n_heads
    for i in range(2):
        for t in ("q", "k", "v", "o"):
            hf_delta = 2.0 * (tensors[_key(i, t, "B")] @ tensors[_key(i, t, "A")])
            want = _hf_to_anekit_rows(hf_delta, hd) if t in ("q", "k") else hf_delta
            np.testing.assert_allclose(ad.delta(i, MODULES[t][1]), want, rtol=1e-6, atol=1e-6)


def test_reading_tolerates_adapter_name_no_prefix_f16_and_all_linear(tmp_path: Path) -> None:
    tensors = _peft_tensors(ALL)
    renamed = {}
    for n, (k, v) in enumerate(tensors.items()):
        if n % 3 == 0:
            k = k.replace(".weight", "").replace("lora_A", "lora_A.default.weight")
            k = k.replace("lora_B", "lora_B.default.weight")
        if n % 2 == 0:
            k = k.removeprefix("base_model.model.")
        renamed[k] = v.astype(np.float16) if n % 5 == 0 else v
    _peft_dir(tmp_path / "ad", renamed, target_modules="all-linear")
    ad = read_adapters(tmp_path / "ad", CFG)
    assert ad.spec.targets == ALL
    _peft_dir(tmp_path / "plain", _peft_tensors(ALL), target_modules="all-linear")
    plain = read_adapters(tmp_path / "plain", CFG)
    for k in plain.a:
        np.testing.assert_allclose(ad.a[k], plain.a[k], rtol=1e-3)
        np.testing.assert_allclose(ad.b[k], plain.b[k], rtol=1e-3)


def test_write_refuses_an_existing_directory_unless_forced_over_an_adapter(tmp_path: Path) -> None:
    ad = _random_adapters(LoraSpec(2, 4, ("q",)))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    with pytest.raises(AnekitError, match="exists"):
        write_adapters(tmp_path / "other", ad, CFG)
    with pytest.raises(AnekitError, match=f"holds no {CONFIG_NAME}"):
        write_adapters(tmp_path / "other", ad, CFG, force=True)
    assert (tmp_path / "other" / "keep.txt").read_text() == "x"
    (tmp_path / "file").write_text("x")
    with pytest.raises(AnekitError, match="not a directory"):
        write_adapters(tmp_path / "file", ad, CFG, force=True)
    write_adapters(tmp_path / "ad", ad, CFG)
    ad2 = _random_adapters(LoraSpec(2, 4, ("v",)), seed=3)
    write_adapters(tmp_path / "ad", ad2, CFG, force=True)
    _same(read_adapters(tmp_path / "ad", CFG), ad2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ad", "file", "other"]


def test_write_refuses_adapters_that_do_not_fit_the_model(tmp_path: Path) -> None:
    ad = _random_adapters(LoraSpec(2, 4, ("q",)))
    ad.a[0, "wk"] = np.zeros((2, 16), np.float32)
    with pytest.raises(AnekitError, match="layer 0 wk is not a target"):
        write_adapters(tmp_path / "ad", ad, CFG)
    ad = _random_adapters(LoraSpec(2, 4, ("q",)))
    ad.a[1, "wq"] = ad.a[1, "wq"].astype(np.float64)
    with pytest.raises(AnekitError, match="A of layer 1 wq: a float32 array is needed, not float64"):
        write_adapters(tmp_path / "ad", ad, CFG)
    assert not (tmp_path / "ad").exists()


# -- bad inputs -----------------------------------------------------------------------------------------


def _read_error(path: Path) -> str:
    with watchdog(10), pytest.raises(AnekitError) as info:
        read_adapters(path, CFG)
    assert "\n" not in info.value.one_line()
    return str(info.value)


def test_missing_extra_and_misshapen_keys_are_named(tmp_path: Path) -> None:
    tensors = _peft_tensors()
    missing = dict(tensors)
    del missing[_key(1, "v", "B")]
    msg = _read_error(_peft_dir(tmp_path / "missing", missing))
    assert _key(1, "v", "B") in msg and "missing" in msg
    extra = {**tensors, _key(0, "k", "A"): np.zeros((2, 16), np.float32)}
    assert _key(0, "k", "A") in _read_error(_peft_dir(tmp_path / "extra", extra))
    deep = {**tensors, _key(2, "q", "A"): np.zeros((2, 16), np.float32)}
    assert "2-layer model" in _read_error(_peft_dir(tmp_path / "deep", deep))
    bias = {**tensors, _key(0, "q", "B").replace(".weight", ".bias"): np.zeros(16, np.float32)}
    assert "lora_B.bias" in _read_error(_peft_dir(tmp_path / "bias", bias))
    shape = {**tensors, _key(0, "v", "A"): np.zeros((3, 16), np.float32)}
    msg = _read_error(_peft_dir(tmp_path / "shape", shape))
    assert _key(0, "v", "A") in msg and "[3, 16], expected [2, 16]" in msg
    ints = {**tensors, _key(0, "v", "A"): np.zeros((2, 16), np.int32)}
    assert "dtype I32" in _read_error(_peft_dir(tmp_path / "ints", ints))
    twice = {
        **tensors,
        _key(0, "q", "A").replace("lora_A.weight", "lora_A.default.weight"): tensors[_key(0, "q", "A")],
    }
    assert "name the same factor" in _read_error(_peft_dir(tmp_path / "twice", twice))


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"peft_type": "IA3"}, "peft_type"),
        ({"peft_type": ...}, "peft_type: missing"),
        ({"r": ...}, "r: missing"),
        ({"r": 0}, "r:"),
        ({"r": "2"}, "r:"),
        ({"r": True}, "r:"),
        ({"lora_alpha": -1}, "lora_alpha"),
        ({"lora_alpha": ...}, "lora_alpha: missing"),
        ({"lora_dropout": 1.5}, "lora_dropout"),
        ({"use_rslora": "yes"}, "use_rslora"),
        ({"target_modules": ["q_proj", "lm_head"]}, "target_modules: 'lm_head'"),
        ({"target_modules": ["attn.q_proj"]}, "target_modules: 'attn.q_proj'"),
        ({"target_modules": r".*\.q_proj"}, "target_modules"),
        ({"target_modules": []}, "target_modules"),
        ({"target_modules": ...}, "target_modules: missing"),
        ({"use_dora": True}, "use_dora"),
        ({"bias": "all"}, "bias"),
        ({"lora_bias": True}, "lora_bias"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"layers_to_transform": [0]}, "layers_to_transform"),
        ({"fan_in_fan_out": True}, "fan_in_fan_out"),
        ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
        ({"alpha_pattern": {"q_proj": 4}}, "alpha_pattern"),
        ({"init_lora_weights": "pissa"}, "init_lora_weights"),
        ({"trainable_token_indices": [1]}, "trainable_token_indices"),
    ],
)
def test_bad_config_fields_are_one_error_naming_the_field(
    tmp_path: Path, config: dict[str, Any], field: str
) -> None:
    msg = _read_error(_peft_dir(tmp_path / "ad", _peft_tensors(), **config))
    assert field in msg and CONFIG_NAME in msg


def test_config_that_is_not_a_json_object(tmp_path: Path) -> None:
    path = _peft_dir(tmp_path / "ad", _peft_tensors())
    (path / CONFIG_NAME).write_text("[1, 2]")
    assert "not an object" in _read_error(path)
    (path / CONFIG_NAME).write_text("{nope")
    assert "not JSON" in _read_error(path)


def test_missing_files_and_fifos_are_one_line(tmp_path: Path) -> None:
    assert "no such directory" in _read_error(tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    assert "not a directory" in _read_error(tmp_path / "file")
    path = _peft_dir(tmp_path / "ad", _peft_tensors())
    (path / WEIGHTS_NAME).unlink()
    msg = _read_error(path)
    assert WEIGHTS_NAME in msg and "no such file" in msg
    (path / "adapter_model.bin").write_bytes(b"pickle")
    assert "adapter_model.bin" in _read_error(path)
    os.mkfifo(path / WEIGHTS_NAME)
    msg = _read_error(path)
    assert "FIFO" in msg and WEIGHTS_NAME in msg
    (path / CONFIG_NAME).unlink()
    assert CONFIG_NAME in _read_error(path)
    os.mkfifo(path / CONFIG_NAME)
    msg = _read_error(path)
    assert "FIFO" in msg and CONFIG_NAME in msg


def test_a_truncated_weights_file_is_one_error(tmp_path: Path) -> None:
    path = _peft_dir(tmp_path / "ad", _peft_tensors())
    data = (path / WEIGHTS_NAME).read_bytes()
    (path / WEIGHTS_NAME).write_bytes(data[:-5])
    assert "safetensors" in _read_error(path)


def test_the_oracle_permutation_is_the_importers() -> None:
    """The loops above and anekit.hf.model permute base weights alike, so adapters fit imported models."""
    from anekit.hf.model import to_interleaved, to_rotate_half

    w = np.arange(32 * 3, dtype=np.float32).reshape(32, 3)
    np.testing.assert_array_equal(_hf_to_anekit_rows(w, 8), to_interleaved(w, 8))
    np.testing.assert_array_equal(_anekit_to_hf_rows(w, 8), to_rotate_half(w, 8))
