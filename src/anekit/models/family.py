"""What a model family file provides, as one record: its config reader, its layer, its checkpoint names.

A family module (``llama``, ``qwen``, ``gemma3``) ends with ``FAMILY = Family(...)``; the registry
(``anekit.models``) finds it by ``model_type``. Nothing here knows a family.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from anekit.models.config import ModelConfig

T = TypeVar("T")

EMBED, FINAL_NORM, LM_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
# Fields whose rows (or entries) a Hugging Face checkpoint holds in rotate-half order per head (channel j
# pairs with j + head_dim / 2); anekit rotates adjacent pairs, so they are permuted on import / export.
ROTATED = ("wq", "wk", "bq", "bk", "q_norm", "k_norm")
# Buffers some older checkpoints saved beside the weights; they are recomputed, never read.
IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


def plain_name(name: str) -> str | None:
    """The name anekit reads a checkpoint's tensor by: itself, or None for a buffer it recomputes."""
    return None if IGNORED.match(name) else name


class Args(Protocol):
    """A family's config.json read in Hugging Face's own field names."""

    @property
    def model_type(self) -> str: ...
    @property
    def architecture(self) -> str: ...
    @property
    def max_position_embeddings(self) -> int: ...
    @property
    def tie_word_embeddings(self) -> bool: ...
    @property
    def torch_dtype(self) -> str: ...

    def to_model_config(self, *, seq_len: int, name: str = "hf") -> ModelConfig:
        """The shape anekit runs, ``seq_len`` the working context; refuses what the family cannot run."""
        ...


@dataclass(frozen=True)
class Family:
    """One model family: found by ``model_type``, read from config.json, written once over blocks."""

    name: str
    architectures: Mapping[str, tuple[str, ...]]  # model_type -> the architectures accepted for it
    from_config: Callable[
        [dict[str, Any]], Args
    ]  # config.json's contents -> Args, refusing what it cannot run
    model: Callable[[ModelConfig], Any]  # the layer, written over blocks (e.g. ``llama.Llama``)
    layer_names: Mapping[str, str]  # anekit field -> the Hugging Face name after "model.layers.{i}."
    owns: Callable[[ModelConfig], bool]  # whether a ModelConfig (from any file format) is of this family
    rotated: tuple[str, ...] = ROTATED
    rename: Callable[[str], str | None] = (
        plain_name  # a checkpoint's quirks: name -> anekit's reading, None: drop
    )

    def sanitize(self, tensors: Mapping[str, T]) -> dict[str, T]:
        """A checkpoint's tensors under the names ``checkpoint_names`` gives (``rename`` applied: buffers
        recomputed dropped, a family's own quirks undone)."""
        out = {}
        for name, t in tensors.items():
            if (new := self.rename(name)) is not None:
                out[new] = t
        return out

    def checkpoint_names(self, cfg: ModelConfig, tied: bool) -> Iterator[tuple[str, str, int | None]]:
        """(Hugging Face name, anekit field, layer or None) of every tensor a checkpoint of ``cfg`` holds:
        the embedding, each layer's fields (``layer_fields``), the final norm, the classifier unless tied."""
        keys = layer_fields(cfg)
        yield EMBED, "embed", None
        for i in range(cfg.n_layers):
            for key in keys:
                yield f"model.layers.{i}.{self.layer_names[key]}", key, i
        yield FINAL_NORM, "rms_final", None
        if not tied:
            yield LM_HEAD, "wcls", None


LLAMA_FIELDS = ("rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3")


def layer_fields(cfg: ModelConfig) -> tuple[str, ...]:
    """The weights one layer of ``cfg`` has, in anekit's order (``llama.params.layer_shapes``): llama2.c's
    nine, then q / k / v biases, the q / k norm and the post-norms where the config has them."""
    extra = (
        (("bq", "bk", "bv") if cfg.qkv_bias else ())
        + (("q_norm", "k_norm") if cfg.qk_norm else ())
        + (("post_att_norm", "post_ffn_norm") if cfg.post_norms else ())
    )
    return LLAMA_FIELDS + extra
