"""``anekit fuse MODEL ADAPTERS OUT``: merge LoRA adapters into a Hugging Face model, as a new directory.

MODEL is a Hugging Face model directory, ADAPTERS a directory in PEFT's format (adapter_config.json and
adapter_model.safetensors: what ``anekit train --lora`` writes to OUT/adapters, or what PEFT saves). Each
adapted matrix becomes W + (alpha / r) B A; OUT is MODEL's directory with those weights, every tensor in
the checkpoint's own dtype, its config and tokenizer files copied (``anekit.hf.model.write_model``), so
transformers, mlx-lm and every anekit command read it as the fine-tuned model. The job is
``anekit.tools.fuse``; this module parses and prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from anekit.tools.fuse import fuse_model


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fuse", help="merge LoRA adapters into a Hugging Face model (a new model directory)")
    p.add_argument("model", type=Path, metavar="MODEL", help="the Hugging Face model directory adapted")
    p.add_argument(
        "adapters", type=Path, metavar="ADAPTERS", help="PEFT adapter directory (anekit train --lora)"
    )
    p.add_argument(
        "out", type=Path, metavar="OUT", help="the fused model's directory (its parent must exist)"
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        default=None,
        help="every tensor's dtype (default: the model's own)",
    )
    p.add_argument("--force", action="store_true", help="replace OUT if it is a previous model directory")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    result = fuse_model(args.model, args.adapters, args.out, args.dtype, args.force)
    print(
        f"fused {result.matrices} adapted matrices (rank {result.rank}, scale {result.scale:g}) into "
        f"{result.out}"
    )
    for path in result.written:
        print(f"wrote {path}")
    return 0
