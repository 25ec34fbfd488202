"""``anekit export MODEL --to mlpackage|llama2c|safetensors OUT``: a model as CoreML package(s), llama2.c
files or a Hugging Face model directory.

MODEL is an anekit checkpoint, a llama2.c model or a Hugging Face model directory. ``--to mlpackage``
writes the ``prefill`` / ``decode`` program with KV-cache states (``anekit.coreml.export``), optionally
int8 (``--quantize``) and sharded (``--shard-mb``); ``--to llama2c`` writes run.c's model file and
``tokenizer.bin`` beside it (refusing, in one line, what run.c cannot represent); ``--to safetensors``
writes a Hugging Face directory (config.json, model.safetensors or shards with an index, the tokenizer
files) that transformers loads. ``--check-residency`` (macOS) then checks with MLComputePlan that every
conv prefers the Neural Engine (law 6). The job is ``anekit.tools.export``; this module parses the
arguments and prints what it returns.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from anekit.cli import flags
from anekit.coreml.quantize import QUANT_MODES
from anekit.tools.export import HF_DTYPES, TARGETS, ExportRequest, export, residency


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


def request(args: argparse.Namespace) -> ExportRequest:
    """The export the command line asks for."""
    return ExportRequest(
        model=args.model,
        to=args.to,
        out=args.out,
        dtype=args.dtype,
        quantize=args.quantize,
        shard_mb=args.shard_mb,
        force=args.force,
        tokenizer=args.tokenizer,
        config=args.config,
        check_residency=args.check_residency,
    )


def run(args: argparse.Namespace) -> int:
    result = export(request(args))
    for message in result.warnings:
        print(f"anekit: warning: {message}", file=sys.stderr)
    for line in result.lines:
        print(line)
    if args.check_residency:
        for line in residency(result.packages):
            print(line)
    return 0
