"""Hugging Face model directories in and out (``anekit.hf.model``), against the independent float64 forward
of tests/hf_reference.py (written from transformers' modeling semantics: rotate-half RoPE, Qwen 3's q / k
norm, Qwen 2's biases, Llama 3's rope scaling) on random checkpoints built by tests/hf_fixtures.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anekit.errors import AnekitError
from anekit.hf.model import load_model, to_rotate_half, write_model
from anekit.hf.safetensors_io import open_checkpoint
from anekit.llama.sample import Sampler, forward_logits
from tests import hf_reference
from tests.hf_fixtures import make_checkpoint, small

# Real head counts and head sizes; vocabularies trimmed so the float64 oracle stays quick.
SHAPES = {
    "smollm2": small("smollm2", vocab_size=2048),
    "qwen3": small("qwen3", vocab_size=2048),
    "qwen2": small("qwen2", vocab_size=2048),
    "llama3": small("llama3"),
    "tiny_llama2c": small("tiny_llama2c"),
}
PROMPT = [5, 17, 300, 42, 7, 1000, 3]


class _Ids:
    """A tokenizer stand-in for the sampler: ids in, no BOS, no end tokens."""

    bos_id = -1
    eos_ids = ()

    def __init__(self, vocab: int) -> None:
        self.vocab_size = vocab


def _checkpoint(tmp_path, name: str, dtype: str = "bfloat16", shards: int = 1):
    directory = tmp_path / name
    stored = make_checkpoint(directory, SHAPES[name], dtype=dtype, seed=3, shards=shards, std=0.05)
    return directory, stored


@pytest.mark.parametrize("name", list(SHAPES))
def test_logits_agree_with_the_float64_hugging_face_forward(tmp_path, name):
    directory, _ = _checkpoint(tmp_path, name)
    model = load_model(directory)
    config, tensors = hf_reference.load(directory)
    ids = [i % config["vocab_size"] for i in PROMPT]
    want = hf_reference.forward(config, tensors, ids)  # (T, vocab) float64
    got = forward_logits(model.params, np.array(ids)).T  # (T, vocab) float32
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * scale)


@pytest.mark.parametrize("name", ["smollm2", "qwen3", "qwen2", "llama3"])
def test_greedy_tokens_agree_with_the_float64_forward(tmp_path, name):
    directory, _ = _checkpoint(tmp_path, name, shards=2)
    model = load_model(directory)
    config, tensors = hf_reference.load(directory)
    ids = [i % config["vocab_size"] for i in PROMPT]
    want = hf_reference.greedy(config, tensors, ids, 12)
    sampler = Sampler(model.params, _Ids(model.cfg.vocab_size))
    got = list(sampler.generate_ids(ids, len(ids) + 11, temperature=0.0))  # positions, prompt included
    assert got[len(ids) - 1 :] == want


def test_smollm2_with_its_real_vocabulary_samples_like_the_float64_forward(tmp_path):
    directory = tmp_path / "smollm2"
    make_checkpoint(directory, small("smollm2", num_hidden_layers=1), dtype="bfloat16", seed=5, std=0.05)
    model = load_model(directory)
    assert model.cfg.vocab_size == 49152 and model.params.wcls is None
    config, tensors = hf_reference.load(directory)
    want = hf_reference.greedy(config, tensors, PROMPT, 6)
    got = list(Sampler(model.params, _Ids(49152)).generate_ids(PROMPT, len(PROMPT) + 5, 0.0))
    assert got[len(PROMPT) - 1 :] == want


def test_import_permutes_q_and_k_rows_to_adjacent_pairs_and_keeps_the_rest(tmp_path):
    directory, stored = _checkpoint(tmp_path, "qwen3", dtype="float32")
    p = load_model(directory).params
    hd = p.cfg.head_dim
    assert (p.cfg.q_dim, p.cfg.dim, hd) == (2048, 1024, 128)
    layer = p.layers[1]
    base = "model.layers.1.self_attn."
    np.testing.assert_array_equal(to_rotate_half(layer.wq, hd), stored[base + "q_proj.weight"])
    np.testing.assert_array_equal(to_rotate_half(layer.k_norm, hd), stored[base + "k_norm.weight"])
    np.testing.assert_array_equal(layer.wv, stored[base + "v_proj.weight"])  # v is not rotated
    np.testing.assert_array_equal(layer.wo, stored[base + "o_proj.weight"])
    # pair j of a head holds the checkpoint's channels j and j + hd/2
    np.testing.assert_array_equal(layer.wq[2], stored[base + "q_proj.weight"][1])
    np.testing.assert_array_equal(layer.wq[3], stored[base + "q_proj.weight"][1 + hd // 2])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_export_to_safetensors_gives_back_every_tensor_bit_for_bit(tmp_path, dtype):
    directory, _ = _checkpoint(tmp_path, "qwen2", dtype=dtype)
    model = load_model(directory)
    out = tmp_path / "out"
    write_model(model.params, out, source=model)
    before, after = open_checkpoint(directory), open_checkpoint(out)
    assert sorted(before) == sorted(after) and "lm_head.weight" not in after  # tied: none added
    for name, ref in before.items():
        assert after[name].dtype == ref.dtype and after[name].shape == ref.shape
        np.testing.assert_array_equal(after[name].raw(), ref.raw())
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads((directory / "config.json").read_text())
    again = load_model(out).params
    for (name, a), (_, b) in zip(model.params.tensors(), again.tensors()):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_export_shards_with_an_index_and_an_untied_head(tmp_path):
    directory, _ = _checkpoint(tmp_path, "llama3")
    model = load_model(directory)
    out = tmp_path / "out"
    written = write_model(model.params, out, source=model, max_shard_bytes=400_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted({p.name for p in written if p.name.startswith("model-")})
    assert len(shards) > 1 and sorted(set(index["weight_map"].values())) == shards
    assert "lm_head.weight" in index["weight_map"]
    np.testing.assert_array_equal(load_model(out).params.wcls, model.params.wcls)


def test_a_changed_bf16_weight_is_rounded_to_nearest_even_on_export(tmp_path):
    directory, _ = _checkpoint(tmp_path, "tiny_llama2c")
    model = load_model(directory)
    p = model.params.copy()
    p.rms_final[:] = np.float32(1 + 2**-8)  # a tie between two bf16 values: rounds to even (1.0)
    p.rms_final[0] = np.float32(1 + 3 * 2**-8)  # a tie that rounds up to 1 + 2**-6
    write_model(p, tmp_path / "out", source=model)
    got = load_model(tmp_path / "out").params.rms_final
    assert got[1] == 1.0 and got[0] == np.float32(1 + 2**-6)


def _write_config(tmp_path, **changes):
    directory, _ = _checkpoint(tmp_path, "tiny_llama2c", dtype="float32")
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type 'gpt2'"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "not a causal language model"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantized checkpoints (gptq)"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"hidden_size": "64"}, "hidden_size must be an integer"),
        ({"num_attention_heads": None}, "num_attention_heads is missing"),
        ({"num_key_value_heads": 3}, "not divisible by n_kv_heads"),
        ({"attention_bias": True}, "attention_bias true"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"torch_dtype": "int8"}, "torch_dtype 'int8'"),
        ({"rope_theta": -1}, "rope_theta must be"),
        ({"use_sliding_window": True, "sliding_window": 16}, "sliding_window 16"),
        ({"intermediate_size": 100}, "model.layers.0.mlp.gate_proj.weight: shape [172, 64]"),
        ({"tie_word_embeddings": True}, "lm_head.weight differs from model.embed_tokens.weight"),
    ],
)
def test_configs_and_checkpoints_anekit_cannot_import_are_one_line_naming_the_field(tmp_path, changes, says):
    directory = _write_config(tmp_path, **changes)
    with pytest.raises(AnekitError) as e:
        load_model(directory)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_missing_or_extra_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    directory, _ = _checkpoint(tmp_path, "tiny_llama2c", dtype="float32")
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AnekitError, match=r"lacks model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(directory)
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((172, 64), np.float32)
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AnekitError, match=r"holds model\.layers\.0\.self_attn\.q_proj\.bias"):
        load_model(directory)


def test_the_working_context_is_capped_and_the_cap_is_said(tmp_path):
    directory, _ = _checkpoint(tmp_path, "llama3")
    model = load_model(directory)
    assert model.cfg.seq_len == 4096 and model.config.max_position_embeddings == 131072
    assert "capped at 4096" in model.config.notes[0]
    assert load_model(directory, seq_len=256).cfg.seq_len == 256


def test_qwen3_with_its_real_vocabulary_samples_like_the_float64_forward(tmp_path):
    directory = tmp_path / "qwen3"
    make_checkpoint(directory, small("qwen3", num_hidden_layers=1), dtype="bfloat16", seed=6, std=0.05)
    model = load_model(directory)
    assert (model.cfg.vocab_size, model.cfg.n_heads, model.cfg.head_dim) == (151936, 16, 128)
    config, tensors = hf_reference.load(directory)
    want = hf_reference.greedy(config, tensors, PROMPT, 4)
    got = list(Sampler(model.params, _Ids(151936)).generate_ids(PROMPT, len(PROMPT) + 3, 0.0))
    assert got[len(PROMPT) - 1 :] == want


def test_transformers_5_rope_parameters_read_as_rope_scaling(tmp_path):
    directory, _ = _checkpoint(tmp_path, "llama3", dtype="float32")
    config = json.loads((directory / "config.json").read_text())
    before = load_model(directory).cfg
    config["rope_parameters"] = {"rope_theta": config.pop("rope_theta"), **config.pop("rope_scaling")}
    (directory / "config.json").write_text(json.dumps(config))
    after = load_model(directory).cfg
    assert after.rope_scaling == before.rope_scaling and after.rope_theta == before.rope_theta == 500000.0
    assert after.rope_scaling is not None and after.rope_scaling.factor == 32.0


def test_a_mistral_directory_imports_as_the_llama_it_is(tmp_path):
    directory, _ = _checkpoint(tmp_path, "tiny_llama2c", dtype="float32")
    llama = load_model(directory).params
    config = json.loads((directory / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None)
    (directory / "config.json").write_text(json.dumps(config))
    mistral = load_model(directory)
    assert mistral.config.model_type == "mistral"
    ids = np.array(PROMPT) % 512
    np.testing.assert_array_equal(forward_logits(mistral.params, ids), forward_logits(llama, ids))
