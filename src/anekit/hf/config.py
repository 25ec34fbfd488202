"""A Hugging Face ``config.json`` read into anekit's ``ModelConfig`` by its model family (``anekit.models``:
the Llama family, Qwen 2 / 3, Gemma 3), everything else refused with one line naming the field.

What each field means, and what each family refuses, is stated in the family's file
(``anekit.models.llama``, ``qwen``, ``gemma3``). The working sequence length (``seq_len``: the longest
context sampling and training use) is ``max_position_embeddings`` capped at ``MAX_WORKING_SEQ`` unless
asked for; the cap is reported in ``HFConfig.notes`` so the command line can say so.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anekit import models
from anekit.errors import AnekitError
from anekit.inputs import LIMITS, kind_of, read_text, shown, stat_input
from anekit.jsonio import loads
from anekit.kernels.config import ModelConfig
from anekit.models import ARCHITECTURES, Family
from anekit.models.args import CONFIG_FILE, MAX_ROPE_THETA, MAX_WORKING_SEQ, HFConfigError, working_context

__all__ = [
    "ARCHITECTURES",
    "CONFIG_FILE",
    "MAX_ROPE_THETA",
    "MAX_WORKING_SEQ",
    "HFConfig",
    "HFConfigError",
    "check_model_dir",
    "is_model_dir",
    "parse_config",
    "read_config",
]


@dataclass(frozen=True)
class HFConfig:
    """What anekit takes from a model directory's config.json."""

    model_type: str  # llama, mistral, qwen2, qwen3, gemma3_text
    architecture: str  # e.g. Qwen3ForCausalLM
    cfg: ModelConfig  # the shape anekit runs, seq_len the working context
    tied: bool  # the classifier is the embedding (no lm_head.weight)
    dtype: str  # the checkpoint's torch dtype name ("bfloat16", "float16", "float32")
    max_position_embeddings: int
    raw: dict[str, Any] = field(repr=False, compare=False)  # config.json as read, for export
    notes: tuple[str, ...] = ()  # what the reader chose that a user should hear (the context cap)

    @property
    def family(self) -> Family:
        """The model family (``anekit.models``) of this config's model_type."""
        return models.family(self.model_type)


def parse_config(raw: Any, *, name: str = "hf", seq_len: int | None = None) -> HFConfig:
    """The ``HFConfig`` of a config.json's contents; ``seq_len`` overrides the working context."""
    args = models.read_args(raw)
    context = working_context(args.max_position_embeddings, seq_len)
    cfg = args.to_model_config(seq_len=context.seq_len, name=name)
    return HFConfig(
        args.model_type,
        args.architecture,
        cfg,
        args.tie_word_embeddings,
        args.torch_dtype,
        args.max_position_embeddings,
        raw,
        context.notes,
    )


def read_config(directory: str | Path, *, seq_len: int | None = None) -> HFConfig:
    """The ``HFConfig`` of ``directory/config.json``."""
    directory = Path(directory)
    path = directory / CONFIG_FILE
    text = read_text(path, "[hf] config", LIMITS["json"], "a config.json file")
    return parse_config(loads(text, f"[hf] {path}"), name=directory.name or "hf", seq_len=seq_len)


def check_model_dir(path: str | Path, what: str) -> None:
    """Refuse, in words that say why, a directory that is not a Hugging Face model directory (no
    config.json, or a config.json that is a directory, a FIFO, a device or a symbolic link loop); a path
    that is not a directory is left to the caller. ``what`` starts the message ("[sample] cannot read")."""
    st = stat_input(path, what)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return
    config = Path(path) / CONFIG_FILE
    found = stat_input(config, what)  # a symbolic link loop: one line saying so
    if found is None:
        raise AnekitError(
            f"{what} {shown(path)}: a directory without {CONFIG_FILE}, so not a Hugging Face model directory"
        )
    if not stat.S_ISREG(found.st_mode):
        raise AnekitError(f"{what} {shown(config)}: {kind_of(found.st_mode)}, not a {CONFIG_FILE} file")


def is_model_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a config.json (a Hugging Face model directory)."""
    try:
        return Path(path).is_dir() and (Path(path) / CONFIG_FILE).is_file()
    except OSError:
        return False
