"""The fuse job: LoRA adapters merged into a Hugging Face model, written as a new model directory.

The model is a Hugging Face model directory (``anekit.tools.model``), the adapters a directory in PEFT's
format (adapter_config.json and adapter_model.safetensors: what ``anekit train --lora`` writes to
OUT/adapters, or what PEFT saves). Each adapted matrix becomes W + (alpha / r) B A; OUT is the model's
directory with those weights, every tensor in the checkpoint's own dtype (or ``dtype``), its config and
tokenizer files copied (``anekit.hf.model.write_model``), so transformers, mlx-lm and every anekit command
read it as the fine-tuned model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from anekit.errors import AnekitError
from anekit.fileio import DirLock, terminate_unwinds
from anekit.outputs import check_apart, check_dir, looks_like, writing
from anekit.tools.model import check_finite, is_hf_dir, open_model

HF_MARKERS = ("model.safetensors", "model.safetensors.index.json")  # what makes OUT a previous fuse


@dataclass(frozen=True)
class FuseResult:
    """What a fuse wrote: the files, and the adapters' count, rank and scale."""

    out: Path
    written: tuple[Path, ...]
    matrices: int  # adapted matrices merged
    rank: int
    scale: float


def check_out(model: Path, adapters: Path, out: Path, force: bool = False) -> None:
    """Refuse an OUT that cannot be written, or that exists and is not a model directory ``force`` may
    replace."""
    what = "[fuse] OUT"
    check_apart(out, what, (("MODEL", model), ("ADAPTERS", adapters)))  # even with --force
    check_dir(out, what)  # a file in its place, a missing parent, a path too long: one line
    if out.exists() and not (force and looks_like(out, *HF_MARKERS)):
        raise AnekitError(
            f"{what} {out} exists"
            + (" (use --force to replace it)" if looks_like(out, *HF_MARKERS) else " and is not a model")
        )


def fuse_model(
    model: Path, adapters: Path, out: Path, dtype: str | None = None, force: bool = False
) -> FuseResult:
    """Merge the adapters at ``adapters`` into the model at ``model`` and write the result at ``out``."""
    from anekit.hf.adapters import fuse, read_adapters
    from anekit.hf.model import write_model

    if not is_hf_dir(model):
        raise AnekitError(f"[fuse] MODEL {model} is not a Hugging Face model directory (no config.json)")
    check_out(model, adapters, out, force)
    source = open_model(model, where="[fuse]").hf
    assert source is not None  # a Hugging Face directory opens as its model
    read = read_adapters(adapters, source.cfg)
    fused = check_finite(fuse(source.params, read), adapters, "fuse")
    with writing(out, "[fuse]"), terminate_unwinds("[fuse]"), DirLock.beside(out, "anekit fuse"):
        check_out(model, adapters, out, force)  # again under the lock: a fuse that finished meanwhile
        written = write_model(fused, out, source=source, dtype=dtype)
    spec = read.spec
    return FuseResult(out, tuple(Path(p) for p in written), len(read.matrices()), spec.rank, spec.scale)
