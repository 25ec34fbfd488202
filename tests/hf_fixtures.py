"""Hugging Face checkpoint fixtures for tests: config shapes, random safetensors checkpoints, tiny tokenizers.

Written from the published file layouts, not from ``anekit.hf``, so that tests can use these files
(and ``tests/hf_reference.py``) as an independent oracle for the importer.

What a checkpoint directory holds, as ``transformers``' ``save_pretrained`` writes it:

    config.json                      the model config (``SHAPES`` below, or ``small(...)``)
    generation_config.json           bos / eos ids
    model.safetensors                one file, or, with shards = N > 1:
    model-0000K-of-0000N.safetensors + model.safetensors.index.json
                                     {"metadata": {"total_size": <tensor bytes>}, "weight_map": {name: file}}

A safetensors file (https://github.com/huggingface/safetensors, README "Format"):

    offset 0   u64 little-endian N: the header's length in bytes
    offset 8   N bytes of JSON: {name: {"dtype": "F32"|"F16"|"BF16", "shape": [...],
                                        "data_offsets": [begin, end]}, "__metadata__": {...}}
               padded with spaces so that the data starts on an 8-byte boundary
    offset 8+N the data buffer; data_offsets are relative to it, tensors are row-major little-endian

F32 / F16 files are written by ``safetensors.numpy.save_file``; numpy has no bfloat16, so BF16 files are
written here by ``write_bf16_safetensors`` (rounding float32 to bfloat16 to nearest, ties to even, as
``torch.Tensor.to(torch.bfloat16)`` does).
"""

from __future__ import annotations

import copy
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------------
# Config shapes: the real models' heads, widths and RoPE settings; 2 layers (small() shrinks further)

# The fields every Llama-family config.json of these models carries with the same values.
LLAMA_STYLE: dict[str, Any] = {
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "pretraining_tp": 1,
    "use_cache": True,
}

SHAPES: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-135M: 9 heads of 64 sharing 3 kv heads, tied embeddings.
    "smollm2": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 2,
        "vocab_size": 49152,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        **LLAMA_STYLE,
    },
    # Qwen/Qwen3-0.6B: head_dim 128 named in the config (16 x 128 = 2048 != hidden 1024), q/k norms.
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 2,
        "vocab_size": 151936,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "initializer_range": 0.02,
        "use_cache": True,
    },
    # Qwen/Qwen2.5-0.5B: 14 heads of 64 sharing 2 kv heads; q / k / v projections carry biases.
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 151936,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "max_window_layers": 24,
        "initializer_range": 0.02,
        "use_cache": True,
    },
    # Llama 3.2's RoPE scaling on a small body; untied classifier.
    "llama3": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
        "bos_token_id": 998,
        "eos_token_id": 999,
        "torch_dtype": "bfloat16",
        **LLAMA_STYLE,
    },
    # A llama2.c stories-sized model exported to Hugging Face form (head_dim 16, untied).
    "tiny_llama2c": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "max_position_embeddings": 128,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        **LLAMA_STYLE,
    },
}

TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def small(shape_name: str, **overrides: Any) -> dict[str, Any]:
    """A copy of ``SHAPES[shape_name]`` with ``overrides`` applied (e.g. vocab_size=512, num_hidden_layers=1).

    When vocab_size shrinks and a token id no longer fits (Qwen's 151643 in a 512 vocab), that id moves
    to the end of the new vocab (eos: vocab - 1, bos: vocab - 2, pad: vocab - 3) unless it is overridden.
    """
    if shape_name not in SHAPES:
        raise KeyError(f"[hf_fixtures] unknown shape {shape_name!r}; known: {sorted(SHAPES)}")
    config = copy.deepcopy(SHAPES[shape_name])
    config.update(copy.deepcopy(overrides))
    vocab = config["vocab_size"]
    for back, key in ((1, "eos_token_id"), (2, "bos_token_id"), (3, "pad_token_id")):
        value = config.get(key)
        if key not in overrides and isinstance(value, int) and value >= vocab:
            config[key] = vocab - back
    return config


# ---------------------------------------------------------------------------------------------------
# Tensor names and shapes, in the order transformers' state_dict() lists them


def head_dim(config: dict[str, Any]) -> int:
    """config["head_dim"] when named (Qwen 3); 128 for a qwen3 config without the key (Qwen3Config's
    default); else hidden_size // num_attention_heads."""
    if config.get("head_dim"):
        return int(config["head_dim"])
    if config["model_type"] == "qwen3" and "head_dim" not in config:
        return 128
    return config["hidden_size"] // config["num_attention_heads"]


def tied(config: dict[str, Any]) -> bool:
    """tie_word_embeddings; LlamaConfig / Qwen2Config / Qwen3Config all default it to False."""
    return bool(config.get("tie_word_embeddings", False))


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, name -> shape, in state_dict order. Linear weights are (out, in)."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], head_dim(config)
    model_type = config["model_type"]
    qkv_bias = model_type == "qwen2" or bool(config.get("attention_bias", False))
    o_bias = model_type != "qwen2" and bool(config.get("attention_bias", False))  # Qwen2's o_proj: never
    mlp_bias = bool(config.get("mlp_bias", False))
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, out in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (out, hidden)
            if qkv_bias:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (out,)
        shapes[f"{p}self_attn.o_proj.weight"] = (hidden, heads * hd)
        if o_bias:
            shapes[f"{p}self_attn.o_proj.bias"] = (hidden,)
        if model_type == "qwen3":
            shapes[f"{p}self_attn.q_norm.weight"] = (hd,)
            shapes[f"{p}self_attn.k_norm.weight"] = (hd,)
        for name, out, inp in (("gate", inter, hidden), ("up", inter, hidden), ("down", hidden, inter)):
            shapes[f"{p}mlp.{name}_proj.weight"] = (out, inp)
            if mlp_bias:
                shapes[f"{p}mlp.{name}_proj.bias"] = (out,)
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    if not tied(config):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


# ---------------------------------------------------------------------------------------------------
# bfloat16: rounding and the file writer

BF16_DTYPE = "BF16"
HEADER_ALIGN = 8  # the data buffer starts on an 8-byte boundary; the header is padded with spaces
HEADER_LEN = struct.Struct("<Q")  # u64 little-endian header length


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even; NaN stays a (quiet) NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # (...)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def write_bf16_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Write float32 tensors to a safetensors file as BF16 (rounded to nearest even), in the given order."""
    header: dict[str, Any] = {"__metadata__": metadata}
    chunks: list[bytes] = []
    offset = 0
    for name, value in tensors.items():
        data = bf16_bits(value).astype("<u2").tobytes()
        header[name] = {
            "dtype": BF16_DTYPE,
            "shape": list(value.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % HEADER_ALIGN)
    with open(path, "wb") as f:
        f.write(HEADER_LEN.pack(len(text)))
        f.write(text)
        for chunk in chunks:
            f.write(chunk)


# ---------------------------------------------------------------------------------------------------
# Checkpoints

DTYPES = {"float32": (np.float32, 4), "float16": (np.float16, 2), "bfloat16": (None, 2)}


def _random_tensors(config: dict[str, Any], seed: int, std: float) -> dict[str, np.ndarray]:
    """float32 values: linear / embedding weights N(0, std); norm weights 1 + 0.1 N(0, 1) and biases
    0.1 N(0, 1), so that both visibly change the output."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in tensor_shapes(config).items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if "norm" in name:
            out[name] = np.float32(1.0) + np.float32(0.1) * noise
        elif name.endswith(".bias"):
            out[name] = np.float32(0.1) * noise
        else:
            out[name] = np.float32(std) * noise
    return out


def _stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 values a correct reader sees after storing ``values`` as ``dtype``."""
    if dtype == "bfloat16":
        return bf16_to_f32(bf16_bits(values))
    return values.astype(DTYPES[dtype][0]).astype(np.float32)


def _shard_names(names: list[str], shards: int) -> list[list[str]]:
    """Contiguous groups of tensor names, one per shard, in state_dict order (none empty)."""
    if not 1 <= shards <= len(names):
        raise ValueError(f"[hf_fixtures] shards must be in 1..{len(names)} (number of tensors), got {shards}")
    return [list(group) for group in np.array_split(np.array(names, dtype=object), shards)]


def make_checkpoint(
    directory: str | Path,
    config: dict[str, Any],
    *,
    dtype: str = "float32",
    seed: int = 0,
    shards: int = 1,
    std: float = 0.02,
) -> dict[str, np.ndarray]:
    """Write a random Hugging Face checkpoint of ``config`` into ``directory``; return name -> float32
    array of the values as stored (after rounding to ``dtype``), i.e. what a correct reader must see."""
    if dtype not in DTYPES:
        raise ValueError(f"[hf_fixtures] dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(config, torch_dtype=dtype)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"_from_model_config": True, "transformers_version": "4.46.0"}
    generation.update({k: config[k] for k in TOKEN_ID_KEYS if config.get(k) is not None})
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")

    stored = {name: _stored(value, dtype) for name, value in _random_tensors(config, seed, std).items()}
    groups = _shard_names(list(stored), shards)
    files = (
        ["model.safetensors"]
        if shards == 1
        else [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
    )
    metadata = {"format": "pt"}
    for file, names in zip(files, groups):
        if dtype == "bfloat16":
            write_bf16_safetensors(directory / file, {n: stored[n] for n in names}, metadata)
        else:
            np_dtype = DTYPES[dtype][0]
            save_file(
                {n: stored[n].astype(np_dtype) for n in names}, str(directory / file), metadata=metadata
            )
    if shards > 1:
        itemsize = DTYPES[dtype][1]
        index = {
            "metadata": {"total_size": sum(v.size * itemsize for v in stored.values())},
            "weight_map": {n: file for file, names in zip(files, groups) for n in names},
        }
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return stored


# ---------------------------------------------------------------------------------------------------
# Tokenizers

SENTENCES = [
    "Once upon a time there was a little girl who lived in a village near the forest.",
    "Whenever she went out, the little girl wore a red riding cloak, so everyone called her Red Riding Hood.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
    "One morning her mother said: take this basket of bread and butter to your grandmother.",
    "The sun was shining, the birds were singing, and the flowers were blooming in the garden.",
    "Hello world! This is a small test of the tokenizer, with numbers like 12, 345 and 6789.",
    "Tom and Lily liked to play with their ball in the park after school every day.",
    "What is the capital of France? The capital of France is Paris.",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Special tokens of each style, in id order after the BPE vocabulary
STYLES: dict[str, list[str]] = {
    # Llama 3 puts <|begin_of_text|> / <|end_of_text|> right after its BPE vocab (128000, 128001);
    # ChatML markers follow so that the chat template tokenizes to single ids here too.
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"],
    # Qwen: <|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645 — here the last three ids.
    "qwen": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}
BPE_SIZE = 320  # the trained vocabulary: 256 byte symbols + merges


@dataclass(frozen=True)
class TokenizerInfo:
    """What make_tokenizer wrote: the tokenizer's own size (<= the model's vocab_size) and its special ids."""

    size: int
    bos_id: int | None  # None: no BOS (Qwen)
    eos_id: int
    pad_id: int | None
    specials: dict[str, int] = field(default_factory=dict)  # content -> id of every special token


def make_tokenizer(directory: str | Path, vocab_size: int, style: str = "llama3") -> TokenizerInfo:
    """Train a byte-level BPE on SENTENCES and write tokenizer.json + tokenizer_config.json.

    The tokenizer has at most ``vocab_size`` tokens (a few hundred whatever the model's vocab is; ids
    past it exist only in the embedding). llama3 style: bos "<|begin_of_text|>", added by a
    TemplateProcessing post-processor, eos "<|end_of_text|>". qwen style: no bos, eos "<|im_end|>",
    pad "<|endoftext|>", the three specials being the tokenizer's last ids. Both get a ChatML template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if style not in STYLES:
        raise ValueError(f"[hf_fixtures] tokenizer style must be one of {sorted(STYLES)}, got {style!r}")
    specials = STYLES[style]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(specials):
        raise ValueError(
            f"[hf_fixtures] vocab_size {vocab_size} < {len(alphabet) + len(specials)}: "
            "a byte-level tokenizer needs 256 byte symbols plus its specials"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(BPE_SIZE, vocab_size - len(specials)), initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(SENTENCES, trainer=trainer)
    tokenizer.add_special_tokens(specials)
    ids = {token: tokenizer.token_to_id(token) for token in specials}
    if style == "llama3":
        bos, eos, pad = "<|begin_of_text|>", "<|end_of_text|>", None
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids[bos])]
        )
    else:
        bos, eos, pad = None, "<|im_end|>", "<|endoftext|>"
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    assert size <= vocab_size, (size, vocab_size)

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast" if style == "llama3" else "Qwen2Tokenizer",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHATML_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for t, i in ids.items()
        },
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return TokenizerInfo(
        size=size,
        bos_id=None if bos is None else ids[bos],
        eos_id=ids[eos],
        pad_id=None if pad is None else ids[pad],
        specials=ids,
    )
