"""Open "a model at this path": an anekit (BLZT) checkpoint, a llama2.c model .bin, a Hugging Face model
directory, or an ``anekit export`` package / shard directory; what was found, as one typed record.

A file is recognised by its first four bytes (little-endian int32): the BLZT magic is an anekit checkpoint;
anything else (llama2.c's "ak42" versioned formats, or the legacy 7-int header) goes to the llama2.c reader,
which explains what it refuses. Either is read through a read-only map of the file, so a model larger than
RAM opens with little private memory. A Hugging Face directory is read by ``anekit.hf`` (its weights
widened to float32); an export is opened as the decoder that runs its package(s) in the simulator.

Every refusal is an ``AnekitError`` naming the path and what was expected there; ``where`` is the
"[command]" a message starts with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from anekit.errors import AnekitError
from anekit.inputs import check_input
from anekit.kernels.config import preset

if TYPE_CHECKING:
    from anekit.hf.model import HFModel
    from anekit.llama.params import Params
    from anekit.llama.sample import Decoder, DecoderShape

Kind = Literal["blzt", "llama2c", "hf", "export"]

BLZT_MAGIC = 0x424C5A54  # anekit (and the ANE training reference) checkpoint
AK42_MAGIC = 0x616B3432  # llama2.c's versioned export formats
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.bin")  # a tokenizer looked for in / beside a model
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")  # a Hugging Face directory's own
FINITE_BLOCK = 1 << 22  # floats counted at a time when a tensor is not finite (a 16 MB piece of a map)


class ModelPathError(AnekitError):
    """A path that holds no model of the kinds expected there (too short a file, one that cannot be read)."""


@dataclass(frozen=True)
class OpenedModel:
    """A model opened from a path: its kind, its parameters (or an export's decoder), the run record of an
    anekit checkpoint, a Hugging Face directory's model, and the tokenizer files found in or beside it."""

    path: Path
    kind: Kind
    params: Params | None  # None for an export: its decoder holds the weights
    decoder: Decoder | None = None  # an export's (the simulator's PackageDecoder, or CoreML's)
    run: dict[str, Any] | None = None  # a BLZT checkpoint's run record, when it has one
    hf: HFModel | None = None  # a Hugging Face directory's model (its config, dtypes, files)
    tokenizer_files: tuple[Path, ...] = ()

    @property
    def cfg(self) -> DecoderShape:
        """The model's shape: its ModelConfig, or an export's vocabulary and context."""
        if self.decoder is not None:
            return self.decoder.cfg
        assert self.params is not None  # every kind but an export has parameters
        return self.params.cfg

    @property
    def notes(self) -> tuple[str, ...]:
        """What reading a Hugging Face config noticed (said once, as notes)."""
        return tuple(self.hf.config.notes) if self.hf is not None else ()


def is_export(path: Path) -> bool:
    """An ``anekit export`` output: an .mlpackage, a shard directory or its shards.json."""
    return path.suffix == ".mlpackage" or path.name == "shards.json" or (path / "shards.json").is_file()


def is_hf_dir(path: str | Path) -> bool:
    """Whether ``path`` is a Hugging Face model directory (a directory holding a config.json); nothing else
    is read, so a command may take its config alone (``anekit.tools.config``)."""
    from anekit.hf.config import is_model_dir

    return is_model_dir(path)


def tokenizer_places(model: Path) -> list[Path]:
    """Where a tokenizer is looked for beside a model: inside an export's directory (a shard directory
    holds the tokenizer `anekit export` wrote), then beside the model."""
    folders = [model] if model.is_dir() and model.suffix != ".mlpackage" else []
    folders.append(model.parent)
    return [folder / name for folder in folders for name in TOKENIZER_FILES]


def _tokenizers_found(path: Path, kind: Kind) -> tuple[Path, ...]:
    if kind == "hf":
        return tuple(path / n for n in HF_TOKENIZER_FILES if (path / n).is_file())
    return tuple(p for p in tokenizer_places(path) if p.is_file())


def _magic(path: Path, where: str) -> int:
    check_input(path, f"{where} cannot read", expected="a model file")  # a FIFO would block the open
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ModelPathError(f"{where} cannot read {path}: {e}") from e
    if len(head) < 4:
        raise ModelPathError(f"{where} {path} is {len(head)} bytes long: not a model file")
    return int.from_bytes(head, "little", signed=True)


def open_model(
    path: Path,
    config: str | None = None,
    where: str = "[sample]",
    exports: bool = False,
    package_backend: str = "sim",
) -> OpenedModel:
    """The model at ``path``, dispatched on what it is (see the module docstring).

    ``config`` names the preset of a BLZT checkpoint without a run record (its header has no n_kv_heads).
    ``exports``: an ``anekit export`` output opens as its decoder, run by ``package_backend`` (``sim``: the
    simulator, ``coreml``: CoreML itself, ``anekit.generate.backends``); without it, it is read as a model
    file (and refused as one)."""
    from anekit.hf.config import check_model_dir

    path = Path(path)
    if is_hf_dir(path):
        from anekit.hf.model import load_model as load_hf

        hf = load_hf(path)
        return OpenedModel(path, "hf", hf.params, hf=hf, tokenizer_files=_tokenizers_found(path, "hf"))
    if exports and is_export(path):  # run the exported package(s), KV caches as states
        from anekit.generate.backends import package_decoder  # here: commands that only read a config
        # (``anekit train --config``) need none of the generation and CoreML code

        decoder = package_decoder(path, package_backend)
        return OpenedModel(path, "export", None, decoder, tokenizer_files=_tokenizers_found(path, "export"))
    check_model_dir(path, f"{where} cannot read")  # a directory whose config.json is missing or no file
    if _magic(path, where) == BLZT_MAGIC:
        from anekit.llama.checkpoint import open_checkpoint

        ck = open_checkpoint(path, preset(config) if config else None)
        return OpenedModel(
            path, "blzt", ck.params, run=ck.run, tokenizer_files=_tokenizers_found(path, "blzt")
        )
    # AK42_MAGIC and the legacy header both go to the llama2.c reader, which explains what it refuses.
    from anekit.llama.llama2c import open_llama2c

    params = open_llama2c(path).params
    return OpenedModel(path, "llama2c", params, tokenizer_files=_tokenizers_found(path, "llama2c"))


def check_finite(params: Params, path: Path, command: str) -> Params:
    """Refuse a model whose weights hold NaN or inf: whatever it generated would be noise.

    Each tensor is summed in float64, which no float32 values can overflow, so the sum is finite exactly
    when every value is; only a tensor that fails is counted, block by block. Nothing the size of a
    tensor is allocated, so a mapped model is read once, a page at a time."""
    for name, value in params.tensors():
        with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf: the NaN is the answer
            if np.isfinite(np.sum(value, dtype=np.float64)):
                continue
        flat = value.reshape(-1)
        bad = sum(
            int(np.count_nonzero(~np.isfinite(flat[i : i + FINITE_BLOCK])))
            for i in range(0, flat.size, FINITE_BLOCK)
        )
        raise AnekitError(
            f"[{command}] {path}: weight {name} holds {bad} NaN or inf values of {value.size}: the model "
            "is broken (a diverged training run?)"
        )
    return params
