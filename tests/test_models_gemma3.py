"""Gemma 3 (gemma3_text) end to end on the CPU: a tiny random checkpoint imported through its family file,
its logits and greedy tokens against the float64 forward of tests/gemma3_reference.py (written from
transformers' modeling_gemma3.py), sampled by ``anekit sample``, written back to safetensors bit for bit."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anekit.hf.model import load_model, write_model
from anekit.llama.sample import CpuDecoder, forward_logits
from tests import gemma3_reference
from tests.hf_fixtures import bf16_bits, bf16_to_f32, write_bf16_safetensors

# Four layers, sliding ones on both sides of a full one; a window far shorter than the sequences run;
# heads x head_dim (64) != hidden_size (32); query_pre_attn_scalar != head_dim; two RoPE bases.
CONFIG: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 300,
    "max_position_embeddings": 64,
    "query_pre_attn_scalar": 24,
    "sliding_window": 5,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rms_norm_eps": 1e-06,
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 2,
    "eos_token_id": 1,
}
SEQ = 20  # > 3 windows


def _shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    d, h, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "post_attention_layernorm.weight": (d,),
            p + "pre_feedforward_layernorm.weight": (d,),
            p + "post_feedforward_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (h, d),
            p + "mlp.up_proj.weight": (h, d),
            p + "mlp.down_proj.weight": (d, h),
        })  # fmt: skip
    out["model.norm.weight"] = (d,)
    return out


def make_gemma3(directory: Path, config: dict[str, Any] = CONFIG, seed: int = 3) -> dict[str, np.ndarray]:
    """A random bf16 Gemma 3 checkpoint in ``directory``; the float32 values as stored. Norm weights are
    0.3 N(0, 1) (Gemma's norms scale by 1 + w, so w = 0 is the identity), the rest 0.15 N(0, 1)."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    for name, shape in _shapes(config).items():
        std = 0.3 if "norm" in name else 0.15
        tensors[name] = bf16_to_f32(bf16_bits(np.float32(std) * rng.standard_normal(shape, dtype=np.float32)))
    write_bf16_safetensors(directory / "model.safetensors", tensors, {"format": "pt"})
    return tensors


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("gemma3") / "tiny-gemma3"
    make_gemma3(directory)
    return directory


def test_logits_match_the_float64_reference(gemma: Path) -> None:
    config, tensors = gemma3_reference.load(gemma)
    ids = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], SEQ)
    want = gemma3_reference.forward(config, tensors, ids)  # (T, V) float64
    model = load_model(gemma, seq_len=32)
    assert model.cfg.layer_types == ("sliding", "sliding", "full", "sliding")
    got = forward_logits(model.params, ids).T  # (T, V) float32
    scale = float(np.abs(want).max())
    assert scale > 1.0  # the logits are not all near zero: a wrong norm or scale shows
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * scale)


def test_the_reference_is_sensitive_to_what_gemma_changes(gemma: Path) -> None:
    """Each of Gemma's differences from Llama moves the reference's logits by far more than the tolerance
    above, so the comparison guards all of them."""
    config, tensors = gemma3_reference.load(gemma)
    ids = np.arange(SEQ) * 7 % CONFIG["vocab_size"]
    base = gemma3_reference.forward(config, tensors, ids)
    tol = 2e-4 * float(np.abs(base).max())
    for change in (
        {"sliding_window": 64},
        {"query_pre_attn_scalar": 16},
        {"rope_local_base_freq": 1000000.0},
        {"layer_types": ["full_attention"] * 4},
    ):
        moved = gemma3_reference.forward(config | change, tensors, ids)
        assert float(np.abs(moved - base).max()) > 20 * tol, change


def test_greedy_decode_with_the_cache_matches_the_reference(gemma: Path) -> None:
    config, tensors = gemma3_reference.load(gemma)
    prompt = [2, 17, 250, 3, 99, 42]
    want = gemma3_reference.greedy(config, tensors, prompt, SEQ - len(prompt))
    model = load_model(gemma, seq_len=32)
    decoder = CpuDecoder(model.params)
    logits = decoder.forward_all(prompt, 0, all_logits=False)[:, 0]  # the prefill
    got: list[int] = []
    for pos in range(len(prompt), SEQ):
        token = int(np.argmax(logits))
        got.append(token)
        logits = decoder.forward([token], pos)  # one decode step
    assert got == want


def test_safetensors_round_trip_is_bit_for_bit(gemma: Path, tmp_path: Path) -> None:
    model = load_model(gemma, seq_len=32)
    out = tmp_path / "again"
    write_model(model.params, out, source=model)
    _, before = gemma3_reference.load(gemma)
    config, after = gemma3_reference.load(out)
    assert sorted(after) == sorted(before)  # tied: no lm_head written
    for name, a in before.items():
        assert np.array_equal(after[name].view(np.uint64), a.view(np.uint64)), name
    header = json.loads((out / "model.safetensors").read_bytes()[8:][: int.from_bytes(
        (out / "model.safetensors").read_bytes()[:8], "little")])  # fmt: skip
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert config["layer_types"] == CONFIG["layer_types"] and config["model_type"] == "gemma3_text"


def test_a_multimodal_checkpoints_text_model_reads_as_the_text_model(tmp_path: Path) -> None:
    """sanitize: tensors saved under ``language_model.`` (Gemma 3's multimodal class) are the text model's."""
    plain = tmp_path / "plain"
    tensors = make_gemma3(plain)
    prefixed = tmp_path / "prefixed"
    prefixed.mkdir()
    (prefixed / "config.json").write_text((plain / "config.json").read_text())
    write_bf16_safetensors(
        prefixed / "model.safetensors", {"language_model." + k: v for k, v in tensors.items()}, {}
    )
    ids = [2, 5, 9]
    a = forward_logits(load_model(plain, seq_len=8).params, ids)
    b = forward_logits(load_model(prefixed, seq_len=8).params, ids)
    assert np.array_equal(a, b)


def test_embedding_scale_and_unscaled_classifier(gemma: Path) -> None:
    """The embedding is scaled by sqrt(hidden_size) going in; the tied classifier reads it unscaled."""
    model = load_model(gemma, seq_len=8)
    assert model.cfg.embed_scale == math.sqrt(32)
    assert model.params.wcls is None and model.params.classifier is model.params.embed


def test_sample_cli_prints_the_reference_greedy_text(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer

    from anekit.cli.main import main
    from tests.hf_fixtures import make_tokenizer

    directory = tmp_path / "gemma-tok"
    info = make_tokenizer(directory, CONFIG["vocab_size"], "llama3")
    make_gemma3(directory, CONFIG | {"bos_token_id": info.bos_id, "eos_token_id": info.eos_id}, seed=5)
    lib = Tokenizer.from_file(str(directory / "tokenizer.json"))
    prompt = "the little cat"
    ids = [info.bos_id, *lib.encode(prompt, add_special_tokens=False).ids]
    steps = 18
    config, tensors = gemma3_reference.load(directory)
    want: list[int] = []
    for _ in range(steps - len(ids) + 1):
        token = int(np.argmax(gemma3_reference.forward(config, tensors, ids + want)[-1, : info.size]))
        if token == info.eos_id:
            break
        want.append(token)
    code = main(["sample", str(directory), "--prompt", prompt, "--temperature", "0", "--steps", str(steps)])
    assert code == 0
    printed = capsys.readouterr().out.replace("\ufffd", "")
    assert printed == lib.decode(ids[1:] + want, skip_special_tokens=True).replace("\ufffd", "") + "\n"


def test_export_cli_writes_the_safetensors_back_bit_for_bit(gemma: Path, tmp_path: Path) -> None:
    from anekit.cli.main import main

    out = tmp_path / "exported"
    assert main(["export", str(gemma), "--to", "safetensors", str(out)]) == 0
    _, before = gemma3_reference.load(gemma)
    _, after = gemma3_reference.load(out)
    assert sorted(after) == sorted(before)
    for name, a in before.items():
        assert np.array_equal(after[name].view(np.uint64), a.view(np.uint64)), name
