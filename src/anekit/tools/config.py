"""A model named on the command line: a preset's name, or a Hugging Face model directory (recognised as
``anekit.tools.model`` recognises it; only its config is read), as the ``ModelConfig`` its kernels are
built for."""

from __future__ import annotations

from anekit.kernels.config import ModelConfig
from anekit.kernels.config import preset as find_preset
from anekit.tools.model import is_hf_dir

HF_SEQ = 256  # the window a Hugging Face model's kernels are generated for (anekit train --seq's default)


def is_preset(value: str) -> bool:
    """Whether ``value`` names a model directory (False) rather than a preset (True)."""
    return not is_hf_dir(value)


def model_config(value: str, seq: int | None = None) -> ModelConfig:
    """The ModelConfig ``value`` names: the preset's, or the Hugging Face model's with windows of ``seq``
    tokens (default ``HF_SEQ``, at most its context). A Hugging Face config gets the checks every command
    makes of it (``anekit.hf.model.check_weights_fit``): the same sizes are refused everywhere."""
    from anekit.hf.config import read_config
    from anekit.hf.model import check_weights_fit

    if is_hf_dir(value):
        hc = read_config(value)
        check_weights_fit(value, hc)
        return hc.cfg.with_(seq_len=min(seq or HF_SEQ, hc.max_position_embeddings))
    return find_preset(value)
