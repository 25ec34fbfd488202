"""``anekit kernels dump --config NAME OUT_DIR``: every kernel of one layer and the head, as files."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from anekit.errors import AnekitError
from anekit.kernels import catalog, preset


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="generate the transformer kernels")
    ksub = p.add_subparsers(dest="kernels_command", metavar="ACTION")
    ksub.required = True
    dump = ksub.add_parser("dump", help="write every kernel of one layer and the head as .mil + weights/")
    dump.add_argument(
        "--config", required=True, metavar="NAME", help="a preset: stories260K, stories15M, ..."
    )
    dump.add_argument("out", type=Path, metavar="OUT_DIR")
    dump.add_argument("--seed", type=int, default=0, help="seed of the random (llama2.c-style) weights")
    dump.add_argument("--dynamic", action="store_true", help="also the dynamic-weight variants")
    dump.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    dump.set_defaults(run=run_dump)


def run_dump(args: argparse.Namespace) -> int:
    cfg = preset(args.config)
    if args.out.exists() and not args.force:
        raise AnekitError(f"[kernels] {args.out} exists (use --force to replace it)")
    names = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS]
    if args.dynamic:
        names += list(catalog.DYNAMIC_KERNELS)
    weights = catalog.random_weights(cfg, args.seed)
    # Written into a temporary sibling directory and renamed, so a failure leaves nothing half-written.
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{args.out.name}.", dir=args.out.parent))
    try:
        index = {}
        for name in names:
            spec = catalog.build(name, cfg, weights)
            folder = tmp / name
            (folder / "weights").mkdir(parents=True)
            (folder / "model.mil").write_text(spec.text(), encoding="utf-8")
            for path, data in spec.weight_files().items():
                (folder / path.removeprefix("@model_path/")).write_bytes(data)
            index[name] = {
                "ops": spec.program.op_count(),
                "input": {
                    "channels": spec.inputs.channels,
                    "spatial": spec.inputs.spatial,
                    "parts": spec.inputs.parts,
                },
                "output": {
                    "channels": spec.outputs.channels,
                    "spatial": spec.outputs.spatial,
                    "parts": spec.outputs.parts,
                },
            }
            shape_in = f"[1, {spec.inputs.channels}, 1, {spec.inputs.spatial}]"
            shape_out = f"[1, {spec.outputs.channels}, 1, {spec.outputs.spatial}]"
            print(f"{name:>18}: {index[name]['ops']:4d} ops, in {shape_in} -> out {shape_out}")
        (tmp / "kernels.json").write_text(json.dumps({"config": cfg.name, "kernels": index}, indent=2) + "\n")
        if args.out.exists():
            shutil.rmtree(args.out)
        os.replace(tmp, args.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {len(names)} kernels of {cfg.name} to {args.out}")
    return 0
