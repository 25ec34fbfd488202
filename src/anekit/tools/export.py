"""The export job: a model (``anekit.tools.model``) as CoreML package(s), llama2.c files or a Hugging Face
model directory, with the model's tokenizer beside it.

``mlpackage`` writes the ``prefill`` / ``decode`` program with KV-cache states (``anekit.coreml.export``),
optionally int8 (``quantize``) and sharded (``shard_mb``); ``llama2c`` writes run.c's model file and
``tokenizer.bin`` beside it (refusing, in one line, what run.c cannot represent); ``safetensors`` writes a
Hugging Face directory (config.json, model.safetensors or shards with an index, the tokenizer files) that
transformers loads. Every check that can refuse runs before anything is written: the options, OUT (never
an input, nor a directory --force may not replace), the model's finite weights and the range of the
dtype it is stored in, the tokenizer's vocabulary.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from anekit.errors import AnekitError
from anekit.fileio import DirLock, terminate_unwinds
from anekit.kernels.config import preset
from anekit.outputs import OutputError, check_apart, check_dir, check_file, looks_like, writing
from anekit.tools.model import TOKENIZER_FILES, check_finite, is_hf_dir, open_model

if TYPE_CHECKING:
    from anekit.llama.params import Params
    from anekit.tokenizer_files import TokenizerFiles

Target = Literal["mlpackage", "llama2c", "safetensors"]
TARGETS: tuple[Target, ...] = ("mlpackage", "llama2c", "safetensors")
EXPORT_MARKERS = ("Manifest.json", "shards.json")  # what makes a directory a previous export
HF_MARKERS = ("model.safetensors", "model.safetensors.index.json")  # ... a previous safetensors export
HF_DTYPES = ("float32", "float16", "bfloat16")

# The smallest magnitude each narrow dtype rounds to inf (round to nearest even: its largest finite value
# plus half an ulp of it, IEEE 754-2019 section 7.4), and that largest finite value.
OVERFLOW_AT = {
    "float16": ((2 - 2**-11) * 2.0**15, (2 - 2**-10) * 2.0**15),  # 65520, 65504
    "bfloat16": ((2 - 2**-8) * 2.0**127, (2 - 2**-7) * 2.0**127),
}


@dataclass(frozen=True)
class ExportRequest:
    """One export: the model at ``model`` written as ``to`` at ``out`` (the command line's flags)."""

    model: Path
    to: Target
    out: Path
    dtype: str | None = None  # safetensors: every tensor's dtype (None: the source's own, float32 else)
    quantize: str = "none"  # mlpackage: none (fp16), int8, int4-block
    shard_mb: float | None = None  # mlpackage / safetensors: shards under this many MB of weights
    force: bool = False  # replace OUT if it is a previous export
    tokenizer: Path | None = None  # the tokenizer to write beside the export (None: the model's own)
    config: str | None = None  # the preset of a BLZT checkpoint without a run record
    check_residency: bool = False  # mlpackage, macOS: check every conv is on the engine afterwards


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote and has to say: ``warnings`` (stderr), ``lines`` (stdout), the packages."""

    lines: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    packages: tuple[Path, ...] = ()  # mlpackage: each package written (``residency`` checks them)


def check_request(req: ExportRequest) -> None:
    """Refuse flags that do not go together, before anything is read."""
    from anekit.coreml.quantize import QUANT_MODES

    if req.config is not None:
        preset(req.config)  # an unknown name is refused even when MODEL's own header makes it unneeded
    if req.quantize not in QUANT_MODES:
        raise AnekitError(f"[export] unknown --quantize {req.quantize!r} (known: {', '.join(QUANT_MODES)})")
    if req.to == "llama2c" and (req.quantize != "none" or req.shard_mb is not None):
        raise AnekitError("[export] --quantize and --shard-mb apply to --to mlpackage only")
    if req.to == "safetensors" and req.quantize != "none":
        raise AnekitError("[export] --quantize applies to --to mlpackage only")
    if req.dtype is not None and req.to != "safetensors":
        raise AnekitError("[export] --dtype applies to --to safetensors only")
    if req.check_residency and sys.platform != "darwin":  # refused before anything is written
        raise AnekitError(
            f"[export] --check-residency needs CoreML's MLComputePlan, which only macOS has (this is "
            f"{sys.platform}); export without it here and check on a Mac"
        )


def check_out(req: ExportRequest) -> None:
    """Refuse, before the model is read, an OUT that cannot be written or must not be replaced."""
    what = "[export] OUT"
    tokenizer = req.tokenizer
    with contextlib.suppress(OSError, ValueError):  # a MODEL the OS cannot look up is refused when read
        tokenizer = tokenizer_file(req)
    check_apart(  # an output is never an input, nor inside or around one, --force or not
        req.out, what, (("MODEL", req.model), ("--tokenizer" if req.tokenizer else "tokenizer", tokenizer))
    )
    if req.to == "safetensors":
        check_dir(req.out, what)  # a file in its place, a missing parent, a path too long: one line
        if req.out.exists() and not req.force:
            raise OutputError(f"{what} {req.out}: exists (use --force to replace a previous export)")
        if req.force and req.out.exists() and not looks_like(req.out, *HF_MARKERS):
            raise OutputError(
                f"{what} {req.out}: not a previous safetensors export (no {' or '.join(HF_MARKERS)} in "
                "it); --force replaces only those: remove it yourself or choose another OUT"
            )
        return
    if req.to == "llama2c":
        check_file(req.out, what)
        if req.tokenizer is not None or any((req.model.parent / n).is_file() for n in TOKENIZER_FILES):
            check_file(req.out.parent / "tokenizer.bin", what)
        return
    if os.path.isdir(req.out):  # a previous package or shard directory (a name too long: check_file says)
        check_dir(req.out, what)
    else:
        check_file(req.out, what)
    if req.force and req.out.exists() and not looks_like(req.out, *EXPORT_MARKERS):
        raise OutputError(
            f"{what} {req.out}: not a previous export (no {' or '.join(EXPORT_MARKERS)} in it); "
            "--force replaces only those: remove it yourself or choose another OUT"
        )


def export(req: ExportRequest) -> ExportResult:
    """Run the export ``req`` names (see the module docstring); every refusal comes before any write."""
    check_request(req)
    check_out(req)
    if req.to == "safetensors":
        return _export_safetensors(req)
    params = _read_model(req)
    from anekit.coreml.model_export import check_feasible

    check_feasible(params, req.to, req.quantize, req.shard_mb)  # before the weights are read to check them
    check_finite(params, req.model, "export")
    if req.to == "llama2c":
        return _export_llama2c(req, params)
    return _export_mlpackage(req, params)


def residency(packages: tuple[Path, ...]) -> Iterator[str]:
    """macOS: MLComputePlan's word on each package's convs (every one should prefer the engine, law 6)."""
    from anekit.coreml import check_residency

    for path in packages:
        yield from check_residency(path)


def _export_llama2c(req: ExportRequest, params: Params) -> ExportResult:
    from anekit.coreml.model_export import export_llama2c
    from anekit.hf.tokenizer_kinds import load_tokenizer_at

    # the tokenizer.bin written beside the model must be the model's: the package path's check
    found = tokenizer_to_copy(req, params.cfg.vocab_size, tokenizer_file(req))  # before any write
    if not isinstance(found, str) and found.kind == "hf":
        raise AnekitError(
            f"[export] --tokenizer {found.source}: a Hugging Face tokenizer.json has no llama2.c form "
            "(run.c reads sentencepiece-style vocabularies: give a tokenizer.model or tokenizer.bin)"
        )
    tok = None if isinstance(found, str) else load_tokenizer_at(found.source, found.kind)
    source = None if isinstance(found, str) else found.source
    with writing(req.out, "[export]"), terminate_unwinds("[export]"), _lock(req):
        written = export_llama2c(params, req.out, tok, force=req.force, source=source)
    lines = [f"wrote {path}" for path in written]
    if isinstance(found, str) and tokenizer_file(req) is not None:
        lines.append(found)
    elif isinstance(found, str) and (req.model / "tokenizer.json").is_file():
        lines.append(
            "no tokenizer.bin: the model's tokenizer.json (byte-level BPE) has no llama2.c form; run.c "
            "reads sentencepiece-style vocabularies (a tokenizer.model converts)"
        )
    return ExportResult(tuple(lines))


def _export_mlpackage(req: ExportRequest, params: Params) -> ExportResult:
    from anekit.coreml.model_export import export_mlpackage
    from anekit.coreml.quantize import QuantizationWarning

    tokenizer = tokenizer_to_copy(req, params.cfg.vocab_size, tokenizer_source(req))  # before any write
    if req.quantize == "none":  # the package stores every weight fp16 (coreml.export, Law 1)
        check_dtype_range(params, "float16", "the package's fp16 weights")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", QuantizationWarning)
        # a SIGTERM leaves no temporary; a second export to OUT is refused while this one writes
        with writing(req.out, "[export]"), terminate_unwinds("[export]"), _lock(req):
            report = export_mlpackage(
                params,
                req.out,
                quant=req.quantize,
                shard_mb=req.shard_mb,
                force=req.force,
                tokenizer=None if isinstance(tokenizer, str) else tokenizer,
            )
    lines = []
    for q in report.quantized:
        scale = float(q.scale.ravel()[0])
        lines.append(
            f"{q.dtype} {q.name}: scale {scale:.4g}, max |error| {q.max_abs_error:.4g}, "
            f"relative rms error {q.rel_rms_error:.3%}"
        )
    for path, size in zip(report.packages, report.weight_bytes):
        lines.append(f"wrote {path} ({size / 1e6:.1f} MB of weights)")
    if report.sharded:
        lines.append(f"wrote {req.out / 'shards.json'}")
    lines.extend([tokenizer] if isinstance(tokenizer, str) else report.tokenizer)
    return ExportResult(
        tuple(lines), tuple(str(w.message) for w in caught), tuple(Path(p) for p in report.packages)
    )


def check_dtype_range(params: Params, dtype: str | None, stored: str = "") -> None:
    """``dtype`` float16 / bfloat16 (or ``stored``, what else stores ``dtype``) of a tensor holding values
    that round to inf there is refused, naming the tensor and its largest |value|, before anything is
    written."""
    if dtype not in OVERFLOW_AT:
        return
    import numpy as np

    from anekit.hf.model import hf_names

    at, largest = OVERFLOW_AT[dtype]
    for name, key, layer in hf_names(params.cfg, params.wcls is None):
        if layer is None:
            a = {"embed": params.embed, "rms_final": params.rms_final}.get(key, params.wcls)
        else:
            a = getattr(params.layers[layer], key)
        if a is None:  # hf_names names the tensors the config has: one the params lack has no values
            continue
        peak = float(np.max(np.abs(a))) if np.size(a) else 0.0
        if peak >= at:
            what = stored or f"--dtype {dtype}"
            raise AnekitError(
                f"[export] {what}: tensor {name} holds values up to |x| = {peak:.6g}, "
                f"past {dtype}'s largest finite {largest:.8g}: they would be written as inf "
                f"({'use --quantize int8 or int4' if stored else 'use --dtype float32'})"
            )


def _export_safetensors(req: ExportRequest) -> ExportResult:
    """A Hugging Face directory; an imported model keeps its config, dtypes and tokenizer files, another
    gets a LlamaForCausalLM config and its sentencepiece tokenizer.model."""
    from anekit.hf.model import write_model

    source, extra = None, {}
    if is_hf_dir(req.model):
        if req.tokenizer is not None or req.config is not None:
            flag = "--tokenizer" if req.tokenizer is not None else "--config"
            raise AnekitError(f"[export] {flag} does not apply to a Hugging Face directory: it names its own")
        source = open_model(req.model, where="[export]").hf
        assert source is not None  # a Hugging Face directory opens as its model
        params = source.params
    else:
        params = _read_model(req)
        tok = tokenizer_file(req)
        if tok is not None and tok.suffix == ".model":  # transformers reads sentencepiece models
            found = tokenizer_to_copy(req, params.cfg.vocab_size, tok)
            if not isinstance(found, str):
                extra["tokenizer.model"] = found.source
    check_finite(params, req.model, "export")
    check_dtype_range(params, req.dtype)
    shard = None if req.shard_mb is None else int(req.shard_mb * 1e6)
    with writing(req.out, "[export]"), terminate_unwinds("[export]"), _lock(req):
        written = write_model(
            params, req.out, source=source, dtype=req.dtype, max_shard_bytes=shard, extra_files=extra
        )
    lines = [f"wrote {path}" for path in written]
    if source is None and not extra:
        lines.append("no sentencepiece tokenizer.model beside MODEL: the directory has no tokenizer")
    return ExportResult(tuple(lines))


@contextlib.contextmanager
def _lock(req: ExportRequest) -> Iterator[None]:
    """One export to OUT at a time (built aside and renamed in, so the lock is beside it); OUT is checked
    again once the lock is held, since an export that finished meanwhile may have written it."""
    with DirLock.beside(req.out, "anekit export"):
        check_out(req)
        yield


def _read_model(req: ExportRequest) -> Params:
    """The model's parameters, read as ``anekit sample`` reads them (an export is no model to export)."""
    params = open_model(req.model, req.config, where="[export]").params
    assert params is not None  # only an export (not opened here) has none
    return params


def tokenizer_file(req: ExportRequest) -> Path | None:
    """The tokenizer file that goes with the export: the one named, else one beside the model."""
    if req.tokenizer is not None:
        return req.tokenizer
    folder = req.model if req.model.is_dir() else req.model.parent  # a model directory holds its own
    return next((folder / n for n in TOKENIZER_FILES if (folder / n).is_file()), None)


def tokenizer_source(req: ExportRequest) -> Path | None:
    """What a package export carries: the tokenizer named, else a Hugging Face directory's own tokenizer
    files, else a tokenizer file beside the model."""
    from anekit.tokenizer_files import SENTENCEPIECE, TOKENIZER_JSON

    own = req.model.is_dir() and any((req.model / n).is_file() for n in (TOKENIZER_JSON, SENTENCEPIECE))
    if req.tokenizer is None and own:
        return req.model
    return tokenizer_file(req)


def tokenizer_to_copy(req: ExportRequest, vocab_size: int, source: Path | None) -> TokenizerFiles | str:
    """The model's tokenizer files at ``source``, read and checked, to carry with the export; else the
    line to print. A tokenizer whose vocabulary is not the model's (more ids than the model, or for one
    that is not Hugging Face's, another count) is not carried (an error when it was named)."""
    from anekit.hf.tokenizer_kinds import load_tokenizer_at
    from anekit.tokenizer_files import from_path

    if source is None:
        return "no tokenizer beside MODEL: give `anekit sample` the model's tokenizer with --tokenizer"
    what = "[export] --tokenizer" if req.tokenizer is not None else "[export] tokenizer"
    carried = from_path(source, what)
    size = load_tokenizer_at(carried.source, carried.kind).vocab_size
    if size > vocab_size or (size != vocab_size and carried.kind != "hf"):
        said = f"the tokenizer {source} has {size} tokens, the model {vocab_size}"
        if req.tokenizer is not None:
            raise AnekitError(f"[export] --tokenizer: {said}")
        return f"{said}: not copied (give `anekit sample` the model's tokenizer with --tokenizer)"
    return carried
