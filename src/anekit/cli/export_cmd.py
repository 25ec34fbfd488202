"""``anekit export MODEL --to mlpackage|llama2c|safetensors OUT``: a model as CoreML package(s), llama2.c
files or a Hugging Face model directory.

MODEL is an anekit checkpoint, a llama2.c model or a Hugging Face model directory. ``--to mlpackage``
writes the ``prefill`` / ``decode`` program with KV-cache states (``anekit.coreml.export``), optionally
int8 (``--quantize``) and sharded (``--shard-mb``); ``--to llama2c`` writes run.c's model file and
``tokenizer.bin`` beside it (refusing, in one line, what run.c cannot represent); ``--to safetensors``
writes a Hugging Face directory (config.json, model.safetensors or shards with an index, the tokenizer
files) that transformers loads. ``--check-residency`` (macOS) then checks with MLComputePlan that every
conv prefers the Neural Engine (law 6).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from anekit.cli import flags
from anekit.coreml.quantize import QUANT_MODES
from anekit.errors import AnekitError
from anekit.fileio import DirLock, terminate_unwinds
from anekit.kernels.config import preset
from anekit.outputs import OutputError, check_apart, check_dir, check_file, looks_like, writing

if TYPE_CHECKING:
    from anekit.llama.params import Params
    from anekit.tokenizer_files import TokenizerFiles

TARGETS = ("mlpackage", "llama2c", "safetensors")
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.bin")  # a tokenizer beside MODEL goes with a llama2c export
EXPORT_MARKERS = ("Manifest.json", "shards.json")  # what makes a directory a previous export
HF_MARKERS = ("model.safetensors", "model.safetensors.index.json")  # ... a previous safetensors export
HF_DTYPES = ("float32", "float16", "bfloat16")
SAMPLE_TAG = "[sample] "  # how the model reader shared with `anekit sample` tags its errors


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="export a model as a CoreML package (prefill / decode) or llama2.c files"
    )
    p.add_argument(
        "model",
        type=Path,
        metavar="MODEL",
        help="anekit BLZT checkpoint, llama2.c model .bin, or Hugging Face model directory (config.json, "
        "safetensors, tokenizer)",
    )
    p.add_argument("--to", choices=TARGETS, required=True, help="what to write")
    p.add_argument(
        "out",
        type=Path,
        metavar="OUT",
        help="OUT.mlpackage, a shard directory, OUT.bin, or a directory for safetensors (its parent "
        "directory must exist)",
    )
    p.add_argument(
        "--dtype",
        choices=HF_DTYPES,
        default=None,
        help="--to safetensors: every tensor's dtype (default: the source checkpoint's own, float32 for "
        "anekit and llama2.c models)",
    )
    p.add_argument(
        "--quantize",
        default="none",
        choices=QUANT_MODES,
        help="none (fp16, the default), int8 (per tensor), int4-block",
    )
    p.add_argument(
        "--shard-mb",
        type=flags.float_range(0, math.inf, lo_open=True),
        default=None,
        metavar="MB",
        help="split into packages under this many MB of weights, a number > 0 (default: one package, "
        "or 250 MB shards when the model is larger)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace OUT if it exists and is a previous export (a package, a shard directory or a file)",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        metavar="TOK",
        help="tokenizer to write beside the export: a .model, a tokenizer.bin, a Hugging Face tokenizer.json "
        "or model directory (default: a Hugging Face MODEL's own, else tokenizer.model / tokenizer.bin "
        "beside MODEL); a different one already beside OUT is refused unless --force",
    )
    p.add_argument("--check-residency", action="store_true", help="macOS: check every conv is on the engine")
    p.add_argument(
        "--config",
        type=flags.preset,
        metavar="NAME",
        help=flags.preset_help("model preset of a BLZT checkpoint (as anekit sample)"),
    )
    p.set_defaults(run=run)


def check_out(args: argparse.Namespace) -> None:
    """Refuse, before the model is read, an OUT that cannot be written or must not be replaced."""
    what = "[export] OUT"
    tokenizer = args.tokenizer
    with contextlib.suppress(OSError, ValueError):  # a MODEL the OS cannot look up is refused when read
        tokenizer = _tokenizer_file(args)
    check_apart(  # an output is never an input, nor inside or around one, --force or not
        args.out, what, (("MODEL", args.model), ("--tokenizer" if args.tokenizer else "tokenizer", tokenizer))
    )
    if args.to == "safetensors":
        check_dir(args.out, what)  # a file in its place, a missing parent, a path too long: one line
        if args.out.exists() and not args.force:
            raise OutputError(f"{what} {args.out}: exists (use --force to replace a previous export)")
        if args.force and args.out.exists() and not looks_like(args.out, *HF_MARKERS):
            raise OutputError(
                f"{what} {args.out}: not a previous safetensors export (no {' or '.join(HF_MARKERS)} in "
                "it); --force replaces only those: remove it yourself or choose another OUT"
            )
        return
    if args.to == "llama2c":
        check_file(args.out, what)
        if args.tokenizer is not None or any((args.model.parent / n).is_file() for n in TOKENIZER_FILES):
            check_file(args.out.parent / "tokenizer.bin", what)
        return
    if os.path.isdir(args.out):  # a previous package or shard directory (a name too long: check_file says)
        check_dir(args.out, what)
    else:
        check_file(args.out, what)
    if args.force and args.out.exists() and not looks_like(args.out, *EXPORT_MARKERS):
        raise OutputError(
            f"{what} {args.out}: not a previous export (no {' or '.join(EXPORT_MARKERS)} in it); "
            "--force replaces only those: remove it yourself or choose another OUT"
        )


def run(args: argparse.Namespace) -> int:
    from anekit.cli.sample_cmd import check_finite
    from anekit.coreml.quantize import QUANT_MODES, QuantizationWarning

    if args.config is not None:
        preset(args.config)  # an unknown name is refused even when MODEL's own header makes it unneeded
    if args.quantize not in QUANT_MODES:
        raise AnekitError(f"[export] unknown --quantize {args.quantize!r} (known: {', '.join(QUANT_MODES)})")
    shard_mb = args.shard_mb
    if args.to == "llama2c" and (args.quantize != "none" or shard_mb is not None):
        raise AnekitError("[export] --quantize and --shard-mb apply to --to mlpackage only")
    if args.to == "safetensors" and args.quantize != "none":
        raise AnekitError("[export] --quantize applies to --to mlpackage only")
    if args.dtype is not None and args.to != "safetensors":
        raise AnekitError("[export] --dtype applies to --to safetensors only")
    if args.check_residency and sys.platform != "darwin":  # refused before anything is written
        raise AnekitError(
            f"[export] --check-residency needs CoreML's MLComputePlan, which only macOS has (this is "
            f"{sys.platform}); export without it here and check on a Mac"
        )
    check_out(args)
    if args.to == "safetensors":
        return _export_safetensors(args, shard_mb)
    params = _read_model(args)
    from anekit.coreml.model_export import check_feasible

    check_feasible(params, args.to, args.quantize, shard_mb)  # before the weights are read to check them
    check_finite(params, args.model, "export")
    if args.to == "llama2c":
        from anekit.coreml.model_export import export_llama2c
        from anekit.hf.tokenizer_kinds import load_tokenizer_at

        # the tokenizer.bin written beside the model must be the model's: the package path's check
        found = _tokenizer_to_copy(args, params.cfg.vocab_size, _tokenizer_file(args))  # before any write
        if not isinstance(found, str) and found.kind == "hf":
            raise AnekitError(
                f"[export] --tokenizer {found.source}: a Hugging Face tokenizer.json has no llama2.c form "
                "(run.c reads sentencepiece-style vocabularies: give a tokenizer.model or tokenizer.bin)"
            )
        tok = None if isinstance(found, str) else load_tokenizer_at(found.source, found.kind)
        source = None if isinstance(found, str) else found.source
        with writing(args.out, "[export]"), terminate_unwinds("[export]"), _lock(args):
            written = export_llama2c(params, args.out, tok, force=args.force, source=source)
        for path in written:
            print(f"wrote {path}")
        if isinstance(found, str) and _tokenizer_file(args) is not None:
            print(found)
        elif isinstance(found, str) and (args.model / "tokenizer.json").is_file():
            print(
                "no tokenizer.bin: the model's tokenizer.json (byte-level BPE) has no llama2.c form; run.c "
                "reads sentencepiece-style vocabularies (a tokenizer.model converts)"
            )
        return 0
    from anekit.coreml.model_export import export_mlpackage

    tokenizer = _tokenizer_to_copy(args, params.cfg.vocab_size, _tokenizer_source(args))  # before any write
    if args.quantize == "none":  # the package stores every weight fp16 (coreml.export, Law 1)
        _check_dtype_range(params, "float16", "the package's fp16 weights")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", QuantizationWarning)
        # a SIGTERM leaves no temporary; a second export to OUT is refused while this one writes
        with writing(args.out, "[export]"), terminate_unwinds("[export]"), _lock(args):
            report = export_mlpackage(
                params,
                args.out,
                quant=args.quantize,
                shard_mb=shard_mb,
                force=args.force,
                tokenizer=None if isinstance(tokenizer, str) else tokenizer,
            )
    for w in caught:
        print(f"anekit: warning: {w.message}", file=sys.stderr)
    for q in report.quantized:
        scale = float(q.scale.ravel()[0])
        print(
            f"{q.dtype} {q.name}: scale {scale:.4g}, max |error| {q.max_abs_error:.4g}, "
            f"relative rms error {q.rel_rms_error:.3%}"
        )
    for path, size in zip(report.packages, report.weight_bytes):
        print(f"wrote {path} ({size / 1e6:.1f} MB of weights)")
    if report.sharded:
        print(f"wrote {args.out / 'shards.json'}")
    for line in [tokenizer] if isinstance(tokenizer, str) else report.tokenizer:
        print(line)
    if args.check_residency:
        from anekit.coreml import check_residency

        for path in report.packages:
            for line in check_residency(path):
                print(line)
    return 0


# The smallest magnitude each narrow dtype rounds to inf (round to nearest even: its largest finite value
# plus half an ulp of it, IEEE 754-2019 section 7.4), and that largest finite value.
OVERFLOW_AT = {
    "float16": ((2 - 2**-11) * 2.0**15, (2 - 2**-10) * 2.0**15),  # 65520, 65504
    "bfloat16": ((2 - 2**-8) * 2.0**127, (2 - 2**-7) * 2.0**127),
}


def _check_dtype_range(params: Params, dtype: str | None, stored: str = "") -> None:
    """--dtype float16 / bfloat16 (or ``stored``, what else stores ``dtype``) of a tensor holding values that
    round to inf there is refused, naming the tensor and its largest |value|, before anything is written."""
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
        peak = float(np.max(np.abs(a))) if np.size(a) else 0.0
        if peak >= at:
            what = stored or f"--dtype {dtype}"
            raise AnekitError(
                f"[export] {what}: tensor {name} holds values up to |x| = {peak:.6g}, "
                f"past {dtype}'s largest finite {largest:.8g}: they would be written as inf "
                f"({'use --quantize int8 or int4' if stored else 'use --dtype float32'})"
            )


def _export_safetensors(args: argparse.Namespace, shard_mb: float | None) -> int:
    """``--to safetensors``: a Hugging Face directory; an imported model keeps its config, dtypes and
    tokenizer files, another gets a LlamaForCausalLM config and its sentencepiece tokenizer.model."""
    from anekit.cli.sample_cmd import check_finite
    from anekit.hf.config import is_model_dir
    from anekit.hf.model import load_model, write_model

    source, extra = None, {}
    if is_model_dir(args.model):
        if args.tokenizer is not None or args.config is not None:
            flag = "--tokenizer" if args.tokenizer is not None else "--config"
            raise AnekitError(f"[export] {flag} does not apply to a Hugging Face directory: it names its own")
        source = load_model(args.model)
        params = source.params
    else:
        params = _read_model(args)
        tok = _tokenizer_file(args)
        if tok is not None and tok.suffix == ".model":  # transformers reads sentencepiece models
            found = _tokenizer_to_copy(args, params.cfg.vocab_size, tok)
            if not isinstance(found, str):
                extra["tokenizer.model"] = found.source
    check_finite(params, args.model, "export")
    _check_dtype_range(params, args.dtype)
    shard = None if shard_mb is None else int(shard_mb * 1e6)
    with writing(args.out, "[export]"), terminate_unwinds("[export]"), _lock(args):
        written = write_model(
            params, args.out, source=source, dtype=args.dtype, max_shard_bytes=shard, extra_files=extra
        )
    for path in written:
        print(f"wrote {path}")
    if source is None and not extra:
        print("no sentencepiece tokenizer.model beside MODEL: the directory has no tokenizer")
    return 0


@contextlib.contextmanager
def _lock(args: argparse.Namespace) -> Iterator[None]:
    """One export to OUT at a time (built aside and renamed in, so the lock is beside it); OUT is checked
    again once the lock is held, since an export that finished meanwhile may have written it."""
    with DirLock.beside(args.out, "anekit export"):
        check_out(args)
        yield


def _read_model(args: argparse.Namespace) -> Params:
    """MODEL's parameters, read as ``anekit sample`` reads them, its complaints tagged ``[export]``."""
    from anekit.cli.sample_cmd import load_model

    try:
        return load_model(args)
    except AnekitError as e:
        message = str(e)
        if not message.startswith(SAMPLE_TAG):
            raise  # a format's own error names the format ("[llama2c] ...")
        raise AnekitError(f"[export] {message.removeprefix(SAMPLE_TAG)}") from e


def _tokenizer_file(args: argparse.Namespace) -> Path | None:
    """The tokenizer file that goes with the export: --tokenizer, else one beside MODEL."""
    if args.tokenizer is not None:
        return args.tokenizer
    folder = args.model if args.model.is_dir() else args.model.parent  # a model directory holds its own
    return next((folder / n for n in TOKENIZER_FILES if (folder / n).is_file()), None)


def _tokenizer_source(args: argparse.Namespace) -> Path | None:
    """What a package export carries: --tokenizer, else a Hugging Face directory's own tokenizer files,
    else a tokenizer file beside MODEL."""
    from anekit.tokenizer_files import SENTENCEPIECE, TOKENIZER_JSON

    own = args.model.is_dir() and any((args.model / n).is_file() for n in (TOKENIZER_JSON, SENTENCEPIECE))
    if args.tokenizer is None and own:
        return args.model
    return _tokenizer_file(args)


def _tokenizer_to_copy(
    args: argparse.Namespace, vocab_size: int, source: Path | None
) -> TokenizerFiles | str:
    """The model's tokenizer files at ``source``, read and checked, to carry with the export; else the
    line to print. A tokenizer whose vocabulary is not the model's (more ids than the model, or for one
    that is not Hugging Face's, another count) is not carried (an error when --tokenizer named it)."""
    from anekit.hf.tokenizer_kinds import load_tokenizer_at
    from anekit.tokenizer_files import from_path

    if source is None:
        return "no tokenizer beside MODEL: give `anekit sample` the model's tokenizer with --tokenizer"
    what = "[export] --tokenizer" if args.tokenizer is not None else "[export] tokenizer"
    carried = from_path(source, what)
    size = load_tokenizer_at(carried.source, carried.kind).vocab_size
    if size > vocab_size or (size != vocab_size and carried.kind != "hf"):
        said = f"the tokenizer {source} has {size} tokens, the model {vocab_size}"
        if args.tokenizer is not None:
            raise AnekitError(f"[export] --tokenizer: {said}")
        return f"{said}: not copied (give `anekit sample` the model's tokenizer with --tokenizer)"
    return carried
