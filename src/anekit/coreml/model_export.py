"""``anekit export``'s work: a model into one .mlpackage, into shards, or into llama2.c's files.

Nothing half-written is left: a package is written by ``save_mlpackage`` (atomic), its weight file is
streamed into a temporary directory beside the target first; a sharded export is assembled in a
temporary directory that is renamed into place at the end; llama2.c files go through ``atomic_write``.
An existing target is refused unless ``force``. The model's tokenizer files, when given, go into the
shard directory (before it is renamed into place) or beside the one package, and the export records them
(shards.json's ``anekit.tokenizer``, the package's metadata) for ``anekit sample``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from anekit.blob import BlobWriter
from anekit.coreml.export import WEIGHT_PATH, Stage, WeightSink, build_program, stage_weight_bytes
from anekit.coreml.quantize import Quantized, check_mode
from anekit.coreml.shards import DEFAULT_SHARD_MB, MB, SHARDS_FILE, package_name, plan_shards, shards_manifest
from anekit.errors import AnekitError
from anekit.fileio import remove_stale_temporaries, replace_path, temporary_dir
from anekit.llama.params import Params
from anekit.mil.ir import Program
from anekit.tokenizer_files import RECORD_KEY, TokenizerFiles, refuse_conflicts, write_beside


@dataclass
class ExportReport:
    """What an export wrote."""

    path: Path
    packages: list[Path] = field(default_factory=list)
    weight_bytes: list[int] = field(default_factory=list)
    quantized: list[Quantized] = field(default_factory=list)
    sharded: bool = False
    tokenizer: list[str] = field(default_factory=list)  # what was done with the tokenizer files


def _refuse_existing(out: Path, force: bool) -> None:
    if (out.exists() or out.is_symlink()) and not force:
        raise AnekitError(f"[export] {out} already exists (use --force to replace it)")


def _save(program: Program, path: Path, blob: Path, overwrite: bool, metadata: dict[str, str]) -> None:
    try:
        from anekit.coreml import save_mlpackage
    except ImportError as e:
        raise AnekitError(f"[export] writing .mlpackage files is not available here ({e})") from e
    save_mlpackage(
        program, path, weights={WEIGHT_PATH: blob}, default_function="decode", overwrite=overwrite,
        consume_weights=True,  # the stage's scratch weight file becomes the package's weight.bin
        metadata=metadata,
    )  # fmt: skip


def _write_stage(
    params: Params, stage: Stage, target: Path, scratch: Path, quant: str, overwrite: bool,
    on_quantized: Callable[[Quantized], None], metadata: dict[str, str] | None = None,
) -> int:  # fmt: skip
    """One stage's program and weights -> ``target`` (.mlpackage); returns the weight bytes written."""
    blob = scratch / f"{target.stem}.weight.bin"
    with BlobWriter(blob) as writer:
        sink = WeightSink(writer.append, quant, on_quantized)
        program = build_program(params, stage, sink)
    _save(program, target, blob, overwrite, metadata or {})
    blob.unlink(missing_ok=True)
    return sink.nbytes


def export_mlpackage(
    params: Params,
    out: str | os.PathLike[str],
    *,
    quant: str = "none",
    shard_mb: float | None = None,
    force: bool = False,
    tokenizer: TokenizerFiles | None = None,
) -> ExportReport:
    """Export ``params`` as one package ``out`` or, when ``shard_mb`` is given or the weights exceed the
    250 MB of law 4, as a directory ``out`` of shard packages and ``shards.json``; ``tokenizer``'s files
    go with it (checked beside a single package by the caller: ``tokenizer_files.refuse_conflicts``)."""
    out = Path(out)
    check_mode(quant)
    _refuse_existing(out, force)
    cfg = params.cfg
    tied = params.tied
    total = stage_weight_bytes(cfg, Stage.whole(cfg), quant, tied)
    if shard_mb is None and total > DEFAULT_SHARD_MB * MB:
        shard_mb = DEFAULT_SHARD_MB
    stages = plan_shards(cfg, shard_mb, quant, tied) if shard_mb is not None else [Stage.whole(cfg)]
    report = ExportReport(out, sharded=shard_mb is not None)
    if tokenizer is not None and not report.sharded:  # a shard directory is new: nothing to collide with
        refuse_conflicts(out.parent, tokenizer, force)

    def quantized(q: Quantized) -> None:  # a tied embedding is quantized in both its shards: report it once
        if all(seen.name != q.name for seen in report.quantized):
            report.quantized.append(q)

    remove_stale_temporaries(out.parent, "export")  # what a killed export left beside OUT
    tmp = temporary_dir(out, "export")  # named by kind and pid: a later export removes it if stale
    try:
        record = {} if tokenizer is None else {RECORD_KEY: json.dumps(tokenizer.record(), sort_keys=True)}
        if not report.sharded:
            report.weight_bytes.append(
                _write_stage(params, stages[0], out, tmp, quant, force, quantized, record)
            )
            report.packages.append(out)
            if tokenizer is not None:
                _tokenizer_beside(out, tokenizer, report)
            return report
        for i, stage in enumerate(stages):
            target = tmp / package_name(i, stage)
            report.weight_bytes.append(_write_stage(params, stage, target, tmp, quant, False, quantized))
            report.packages.append(out / target.name)
        manifest = shards_manifest(cfg, stages, report.weight_bytes, quant, shard_mb)  # type: ignore[arg-type]
        if tokenizer is not None:
            write_beside(tmp, tokenizer)
            manifest[RECORD_KEY] = tokenizer.record()
            report.tokenizer = [f"wrote {out / name}" for name in tokenizer.files]
        (tmp / SHARDS_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        replace_path(tmp, out)
        return report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tokenizer_beside(out: Path, tokenizer: TokenizerFiles, report: ExportReport) -> None:
    """The tokenizer's files beside the package just written; the package is removed when they cannot
    be written, so no export is left whose tokenizer is missing."""
    try:
        report.tokenizer = write_beside(out.parent, tokenizer)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise


def export_llama2c(
    params: Params,
    out: str | os.PathLike[str],
    tokenizer: object | None,
    *,
    force: bool = False,
    source: Path | None = None,
) -> list[Path]:
    """run.c's model file ``out`` and, beside it, ``tokenizer.bin`` (from ``tokenizer``, if given; read
    from ``source``, for messages). A tokenizer.bin already there with the same bytes is kept; another is
    refused unless ``force``, as a package export refuses one (``tokenizer_files.refuse_conflicts``)."""
    from anekit.llama.llama2c import build_tokenizer_bin, write_llama2c
    from anekit.tokenizer_files import LLAMA2C

    out = Path(out)
    written = [out]
    _refuse_existing(out, force)
    carried = None
    if tokenizer is not None:
        data = build_tokenizer_bin(to_llama2c_tokenizer(tokenizer))  # type: ignore[arg-type]
        carried = TokenizerFiles("llama2c", {LLAMA2C: data}, source or out.parent / LLAMA2C)
        refuse_conflicts(out.parent, carried, force)
        written.append(out.parent / LLAMA2C)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_llama2c(out, params)
    if carried is not None:
        write_beside(out.parent, carried)
    return written


def to_llama2c_tokenizer(tokenizer: object) -> object:
    """llama2.c's Tokenizer from anekit's (sentencepiece) one, as llama2.c's tokenizer.py converts:
    "▁" becomes a space, BOS / EOS become "\\n<s>\\n" / "\\n</s>\\n", each piece keeps its score."""
    from anekit.llama.llama2c import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    sp = getattr(tokenizer, "sp", None)
    if sp is None:
        raise AnekitError(f"[export] cannot convert a {type(tokenizer).__name__} to llama2.c's tokenizer.bin")
    bos, eos = int(sp.bos_id()), int(sp.eos_id())
    vocab, scores = [], []
    for i in range(int(sp.GetPieceSize())):
        piece = str(sp.IdToPiece(i))
        if i == bos:
            piece = "\n<s>\n"
        elif i == eos:
            piece = "\n</s>\n"
        vocab.append(piece.replace("\u2581", " ").encode("utf-8"))
        scores.append(float(sp.GetScore(i)))
    return Tokenizer(vocab, scores)


def check_feasible(params: Params, to: str, quant: str = "none", shard_mb: float | None = None) -> None:
    """Refuse, before any weight is read, an export the model's shapes already rule out: a package that
    cannot be sharded under ``shard_mb`` (``plan_shards``), or an export that cannot fit the address space
    the process may use (``anekit.addrspace``), said in words. Both exports stream one tensor at a time: a
    llama2.c file needs the tensor being written (a window of a mapped model); a package also its fp16 or
    quantized copy and the tables of a stage (RoPE swap matrix, causal mask)."""
    from anekit.addrspace import check, words

    cfg = params.cfg
    window = getattr(params, "largest_tensor_bytes", lambda: 0)()
    if to == "llama2c":
        need, parts = (
            window + 4 * 2 * cfg.seq_len * cfg.head_dim,
            f"{words(window)} for the largest tensor's window",
        )
    else:
        tied = params.tied
        if (
            shard_mb is None
            and stage_weight_bytes(cfg, Stage.whole(cfg), quant, tied) > DEFAULT_SHARD_MB * MB
        ):
            shard_mb = DEFAULT_SHARD_MB
        if shard_mb is not None:
            plan_shards(cfg, shard_mb, quant, tied)
        largest = 4 * max(cfg.vocab_size * cfg.dim, cfg.hidden_dim * cfg.dim, cfg.q_dim * cfg.dim)
        copies = largest // 2 if quant == "none" else 2 * largest  # fp16, or the quantizer's float32 work
        tables = 3 * 4 * cfg.seq_len**2 + 2 * 4 * cfg.q_dim**2 + 4 * 4 * cfg.q_dim * cfg.seq_len
        need = window + copies + tables
        parts = f"{words(window)} for the largest tensor's window, {words(copies + tables)} for its copy"
        parts += " and tables"
    check(need, "export", f"exporting {cfg.name} to {to}", parts)
