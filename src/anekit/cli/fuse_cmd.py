"""``anekit fuse MODEL ADAPTERS OUT``: merge LoRA adapters into a Hugging Face model, as a new directory.

MODEL is a Hugging Face model directory, ADAPTERS a directory in PEFT's format (adapter_config.json and
adapter_model.safetensors: what ``anekit train --lora`` writes to OUT/adapters, or what PEFT saves). Each
adapted matrix becomes W + (alpha / r) B A; OUT is MODEL's directory with those weights, every tensor in
the checkpoint's own dtype, its config and tokenizer files copied (``anekit.hf.model.write_model``), so
transformers, mlx-lm and every anekit command read it as the fine-tuned model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from anekit.errors import AnekitError
from anekit.outputs import check_apart, check_dir, looks_like, writing

HF_MARKERS = ("model.safetensors", "model.safetensors.index.json")  # what makes OUT a previous fuse


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


def check_out(args: argparse.Namespace) -> None:
    """Refuse an OUT that cannot be written, or that exists and is not a model directory --force may
    replace."""
    what = "[fuse] OUT"
    check_apart(args.out, what, (("MODEL", args.model), ("ADAPTERS", args.adapters)))  # even with --force
    check_dir(args.out, what)  # a file in its place, a missing parent, a path too long: one line
    if args.out.exists() and not (args.force and looks_like(args.out, *HF_MARKERS)):
        raise AnekitError(
            f"{what} {args.out} exists"
            + (" (use --force to replace it)" if looks_like(args.out, *HF_MARKERS) else " and is not a model")
        )


def run(args: argparse.Namespace) -> int:
    from anekit.cli.sample_cmd import check_finite
    from anekit.fileio import DirLock, terminate_unwinds
    from anekit.hf.adapters import fuse, read_adapters
    from anekit.hf.config import is_model_dir
    from anekit.hf.model import load_model, write_model

    if not is_model_dir(args.model):
        raise AnekitError(f"[fuse] MODEL {args.model} is not a Hugging Face model directory (no config.json)")
    check_out(args)
    model = load_model(args.model)
    adapters = read_adapters(args.adapters, model.cfg)
    fused = check_finite(fuse(model.params, adapters), args.adapters, "fuse")
    with writing(args.out, "[fuse]"), terminate_unwinds("[fuse]"), DirLock.beside(args.out, "anekit fuse"):
        check_out(args)  # again under the lock: a fuse that finished meanwhile may have written OUT
        written = write_model(fused, args.out, source=model, dtype=args.dtype)
    spec = adapters.spec
    print(
        f"fused {len(adapters.matrices())} adapted matrices (rank {spec.rank}, scale {spec.scale:g}) into "
        f"{args.out}"
    )
    for path in written:
        print(f"wrote {path}")
    return 0
