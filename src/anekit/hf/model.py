"""A Hugging Face model directory in and out: config.json + safetensors weights <-> anekit's ``Params``.

Hugging Face's Llama / Qwen attention rotates the two halves of each head (``rotate_half``: channel j
pairs with j + head_dim / 2); anekit's kernels and llama2.c's run.c rotate adjacent pairs (2j, 2j + 1).
Import therefore permutes the rows of q_proj and k_proj within each head, and with them the q / k biases
(Qwen 2) and the q / k norm weights (Qwen 3), so that interleaved pair j holds the channels the
checkpoint pairs; export applies the inverse. Both pair j's at frequency theta^(-2j / head_dim), so the
model computes the same function (llama2.c's export.py permutes the other way, for the same reason).

Names (transformers' modeling code): ``model.embed_tokens.weight`` -> embed; per layer
``input_layernorm`` -> rms_att, ``self_attn.{q,k,v,o}_proj`` -> wq / wk / wv / wo (+ ``.bias`` -> bq / bk
/ bv), ``self_attn.{q,k}_norm`` -> q_norm / k_norm, ``post_attention_layernorm`` -> rms_ffn,
``mlp.gate_proj`` / ``up_proj`` / ``down_proj`` -> w1 / w3 / w2; ``model.norm.weight`` -> rms_final;
``lm_head.weight`` -> wcls, absent when the embeddings are tied (an export of a tied model adds none).
A tensor the config does not call for, a missing one, or a shape that disagrees is one error naming it.

Weights become float32 (bf16 and fp16 widen exactly); export writes each tensor back in the checkpoint's
own dtype, so an unchanged bf16 weight keeps its bits.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anekit.errors import AnekitError
from anekit.fileio import remove_stale_temporaries, replace_path, temporary_dir
from anekit.hf.config import CONFIG_FILE, HFConfig, read_config
from anekit.hf.safetensors_io import (
    INDEX_NAME,
    SINGLE_NAME,
    TensorRef,
    float32_to_bf16_bits,
    open_checkpoint,
    write_checkpoint,
)
from anekit.kernels.config import ModelConfig
from anekit.llama.params import EXTRA_FIELDS, LAYER_FIELDS, LayerParams, Params, layer_shapes
from anekit.models import LLAMA, QWEN, family_of
from anekit.models.family import EMBED, LM_HEAD

LAYER_NAMES = {**LLAMA.layer_names, **QWEN.layer_names}  # Llama's and Qwen's (Gemma 3's: models.gemma3)
ROTATED = LLAMA.rotated
# Tokenizer and generation files an export copies beside the weights.
SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)
DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@dataclass
class HFModel:
    """A model read from a Hugging Face directory: its parameters and what export needs to write it back."""

    params: Params
    config: HFConfig
    directory: Path
    dtypes: dict[str, str] = field(default_factory=dict)  # Hugging Face name -> safetensors dtype read

    @property
    def cfg(self) -> ModelConfig:
        return self.params.cfg


def interleave_permutation(head_dim: int) -> np.ndarray:
    """Row order taking one head from rotate-half to adjacent pairs: new row 2j is old row j, new row
    2j + 1 is old row j + head_dim / 2."""
    half = head_dim // 2
    perm = np.empty(head_dim, np.intp)
    perm[0::2] = np.arange(half)
    perm[1::2] = np.arange(half) + half
    return perm


def _per_head(a: np.ndarray, head_dim: int, order: np.ndarray) -> np.ndarray:
    """``a`` with the rows of each head (head_dim consecutive rows of axis 0) taken in ``order``."""
    rows = a.shape[0]
    heads = a.reshape(rows // head_dim, head_dim, *a.shape[1:])
    return np.ascontiguousarray(heads[:, order]).reshape(a.shape)


def to_interleaved(a: np.ndarray, head_dim: int) -> np.ndarray:
    return _per_head(a, head_dim, interleave_permutation(head_dim))


def to_rotate_half(a: np.ndarray, head_dim: int) -> np.ndarray:
    return _per_head(a, head_dim, np.argsort(interleave_permutation(head_dim)))


def hf_names(cfg: ModelConfig, tied: bool) -> Iterator[tuple[str, str, int | None]]:
    """(Hugging Face name, anekit field, layer or None) of every tensor a checkpoint of ``cfg`` holds, in
    the naming of ``cfg``'s model family."""
    return family_of(cfg).checkpoint_names(cfg, tied)


def _shape(cfg: ModelConfig, key: str) -> tuple[int, ...]:
    if key in ("embed", "wcls"):
        return (cfg.vocab_size, cfg.dim)
    if key == "rms_final":
        return (cfg.dim,)
    return layer_shapes(cfg)[key]


LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")
MIN_ITEMSIZE = 2  # the narrowest float weight anekit reads (F16, BF16): bytes per parameter at the least
# The most parameters a config may describe (2^40, about 1.1 trillion: past every published checkpoint, whose
# largest are under 10^12). A shape past it is refused by every command from config.json alone, weights or
# none: `cost --config` of a directory holding only config.json included.
MAX_PARAMETERS = 1 << 40


def parameter_count(cfg: ModelConfig, tied: bool) -> int:
    """The parameters a checkpoint of ``cfg`` holds, counted from the shape alone (Python integers, so a
    hostile shape costs nothing to count)."""
    per_layer = sum(math.prod(shape) for shape in layer_shapes(cfg).values())
    tables = (1 if tied else 2) * cfg.vocab_size * cfg.dim
    return tables + cfg.n_layers * per_layer + cfg.dim


def check_parameter_count(hc: HFConfig) -> None:
    """The config's shape describes at most ``MAX_PARAMETERS`` parameters (counted in Python integers)."""
    cfg = hc.cfg
    count = parameter_count(cfg, hc.tied)
    if count > MAX_PARAMETERS:
        fields = (f"num_hidden_layers {cfg.n_layers}, hidden_size {cfg.dim}, intermediate_size "
                  f"{cfg.hidden_dim}, vocab_size {cfg.vocab_size}")  # fmt: skip
        raise AnekitError(
            f"[hf] {CONFIG_FILE}: {fields} describe {count} parameters, over the {MAX_PARAMETERS} "
            "(2^40) any checkpoint holds"
        )


def check_weights_fit(directory: str | Path, hc: HFConfig) -> None:
    """What every command checks of a Hugging Face directory's config before it builds anything: the
    parameter count, then, when the directory holds weights, the config's shape against their headers
    (``check_shape_fits``) and every tensor name it calls for. A directory of config.json alone passes
    on its parameter count (a cost prediction needs no weights)."""
    check_parameter_count(hc)
    directory = Path(directory)
    if not any((directory / name).exists() for name in (SINGLE_NAME, INDEX_NAME)):
        return
    refs = hc.family.sanitize(open_checkpoint(directory))
    check_shape_fits(refs, hc)
    _check_names(refs, hc)


def check_shape_fits(refs: dict[str, TensorRef], hc: HFConfig) -> None:
    """The config's shape against what the weights can hold, before any name is built: the layers the
    tensor names number (model.layers.{i}.*) against num_hidden_layers, then the bytes the config implies
    (at least ``MIN_ITEMSIZE`` per parameter) against the bytes the files hold."""
    cfg = hc.cfg
    layers = {int(m.group(1)) for m in map(LAYER_INDEX.match, refs) if m}
    held = max(layers) + 1 if layers else 0
    if cfg.n_layers != held:
        raise AnekitError(
            f"[hf] {CONFIG_FILE}: num_hidden_layers {cfg.n_layers}: the weights hold {held} layer"
            f"{'' if held == 1 else 's'}"
        )
    need = parameter_count(cfg, hc.tied) * MIN_ITEMSIZE
    have = sum(ref.nbytes for ref in refs.values())
    if need > have:
        fields = (f"hidden_size {cfg.dim}, intermediate_size {cfg.hidden_dim}, vocab_size {cfg.vocab_size}, "
                  f"num_attention_heads {cfg.n_heads}, num_key_value_heads {cfg.n_kv_heads}")  # fmt: skip
        raise AnekitError(
            f"[hf] {CONFIG_FILE}: {fields} need at least {need} bytes of weights ({MIN_ITEMSIZE} per "
            f"parameter); the weights hold {have}"
        )


def _check_names(refs: dict[str, TensorRef], hc: HFConfig) -> None:
    """Every tensor the config calls for is there, nothing else is (a tied model's lm_head aside)."""
    wanted = {name for name, _, _ in hf_names(hc.cfg, hc.tied)}
    missing = sorted(wanted - set(refs), key=_natural)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise AnekitError(f"[hf] the checkpoint lacks {missing[0]}{more}, which {hc.architecture} needs")
    extra = sorted((n for n in refs if n not in wanted), key=_natural)
    if hc.tied and LM_HEAD in extra:
        extra.remove(LM_HEAD)  # checked against the embedding once read
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise AnekitError(
            f"[hf] the checkpoint holds {extra[0]}{more}, which {hc.architecture} with this config.json "
            "does not have"
        )


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _read(ref: TensorRef, shape: tuple[int, ...]) -> np.ndarray:
    if tuple(ref.shape) != shape:
        raise AnekitError(f"[hf] {ref.name}: shape {list(ref.shape)}, the config says {list(shape)}")
    if ref.dtype not in DTYPES.values():
        raise AnekitError(
            f"[hf] {ref.name}: dtype {ref.dtype} is not a float weight anekit reads (F32, F16 or BF16)"
        )
    return ref.to_float32()


MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


def load_model(
    directory: str | Path, *, seq_len: int | None = None, matrix_dtype: type = np.float32
) -> HFModel:
    """The model in a Hugging Face directory (config.json and safetensors weights). Every array is a new
    one of its own (the file's map is not kept): float32, except the layers' matrices when
    ``matrix_dtype`` is float16 (a LoRA run's frozen base), converted one tensor at a time so the model
    is never held in float32 whole."""
    directory = Path(directory)
    hc = read_config(directory, seq_len=seq_len)
    cfg = hc.cfg
    check_parameter_count(hc)
    refs = hc.family.sanitize(open_checkpoint(directory))
    check_shape_fits(refs, hc)
    _check_names(refs, hc)
    hd, rotated = cfg.head_dim, hc.family.rotated
    arrays: dict[tuple[str, int | None], np.ndarray] = {}
    for name, key, layer in hf_names(cfg, hc.tied):
        a = _read(refs[name], _shape(cfg, key))
        a = to_interleaved(a, hd) if key in rotated else a
        arrays[key, layer] = a.astype(matrix_dtype) if key in MATRIX_FIELDS else a
    if hc.tied and LM_HEAD in refs:
        head = _read(refs[LM_HEAD], (cfg.vocab_size, cfg.dim))
        if not np.array_equal(head, arrays["embed", None]):
            raise AnekitError(
                f"[hf] {CONFIG_FILE} says tie_word_embeddings but {LM_HEAD} differs from {EMBED}"
            )
    layers = [
        LayerParams(**{k: arrays[k, i] for k in LAYER_FIELDS + EXTRA_FIELDS if (k, i) in arrays})
        for i in range(cfg.n_layers)
    ]
    wcls = None if hc.tied else arrays["wcls", None]
    params = Params(cfg, arrays["embed", None], layers, arrays["rms_final", None], wcls)
    return HFModel(params, hc, directory, {name: ref.dtype for name, ref in refs.items()})


# -- export ---------------------------------------------------------------------------------------------


def config_json(params: Params, base: dict[str, Any] | None = None, dtype: str = "float32") -> dict[str, Any]:
    """The config.json of ``params``: ``base`` (the imported model's own) with the shape fields set from
    the model, or, for a model that came from elsewhere (llama2.c), a LlamaForCausalLM config."""
    cfg = params.cfg
    out: dict[str, Any] = (
        dict(base)
        if base is not None
        else {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "initializer_range": 0.02,
        }
    )
    if base is None:
        if cfg.qkv_bias or cfg.qk_norm:
            raise AnekitError("[hf] a model with biases or a q / k norm needs its own config.json to export")
        out["max_position_embeddings"] = cfg.seq_len
        out["rope_theta"] = cfg.rope_theta
        if cfg.attn_head_dim:
            out["head_dim"] = cfg.head_dim
    out.update(
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        vocab_size=cfg.vocab_size,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=params.wcls is None,
        torch_dtype=dtype,
    )
    return out


def _tensors_to_write(
    params: Params, dtypes: dict[str, str], default: str
) -> dict[str, tuple[str, np.ndarray]]:
    """Every tensor in Hugging Face's naming and layout, each in its own dtype's storage."""
    cfg = params.cfg
    hd, family = cfg.head_dim, family_of(cfg)
    out = {}
    for name, key, layer in family.checkpoint_names(cfg, params.wcls is None):
        if layer is None:
            a = params.embed if key == "embed" else params.rms_final if key == "rms_final" else params.wcls
        else:
            a = getattr(params.layers[layer], key)
        a = np.asarray(a, np.float32)
        if key in family.rotated:
            a = to_rotate_half(a, hd)
        dtype = dtypes.get(name, default)
        if dtype == "BF16":
            stored = float32_to_bf16_bits(a)
        elif dtype == "F16":
            stored = a.astype(np.float16)
        else:
            dtype, stored = "F32", a
        out[name] = (dtype, np.ascontiguousarray(stored))
    return out


def write_model(
    params: Params,
    out: str | Path,
    *,
    source: HFModel | None = None,
    dtype: str | None = None,
    max_shard_bytes: int | None = None,
    extra_files: dict[str, Path] | None = None,
) -> list[Path]:
    """Write ``params`` as a Hugging Face model directory ``out`` (built aside, renamed into place).

    ``source`` is the model it was imported from: its config.json is kept (shape fields updated), its
    tensors keep their dtypes and its tokenizer and generation files are copied. ``dtype`` ("float32",
    "float16", "bfloat16") overrides every tensor's. ``extra_files`` maps a file name to a file to copy in
    (a tokenizer for a model with no source). Returns the files written, in ``out``."""
    out = Path(out)
    if dtype is not None and dtype not in DTYPES:
        raise AnekitError(f"[hf] dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    base_dtype = dtype or (source.config.dtype if source is not None else "float32")
    dtypes = {} if source is None or dtype is not None else source.dtypes
    tensors = _tensors_to_write(params, dtypes, DTYPES[base_dtype])
    config = config_json(params, source.config.raw if source is not None else None, base_dtype)
    copies = {} if source is None else {n: source.directory / n for n in SIDE_FILES}
    copies.update(extra_files or {})
    remove_stale_temporaries(out.parent, "hf")
    tmp = temporary_dir(out, "hf")
    try:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_checkpoint(tmp, tensors, max_shard_bytes=max_shard_bytes)
        for name, path in copies.items():
            if path.is_file():
                shutil.copyfile(path, tmp / name)
        written = sorted(p.name for p in tmp.iterdir())
        replace_path(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / name for name in written]
