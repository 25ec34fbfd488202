"""``anekit kernels dump --config NAME OUT_DIR``: every kernel of one layer and the head, as files."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from anekit.cli import flags
from anekit.fileio import (
    DirLock,
    remove_stale_temporaries,
    replace_path,
    temporary_dir,
    terminate_unwinds,
)
from anekit.kernels import ModelConfig, catalog
from anekit.outputs import OutputError, check_apart, check_dir, looks_like, writing
from anekit.words import plural

TEMP_KIND = "kernels"  # the kind in the names of a dump's temporary directories (fileio.temporary_name)
INDEX = "kernels.json"  # the dump's index; a directory holding it is a previous dump --force may replace


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="generate the transformer kernels")
    ksub = p.add_subparsers(dest="kernels_command", metavar="ACTION")
    ksub.required = True
    dump = ksub.add_parser("dump", help="write every kernel of one layer and the head as .mil + weights/")
    dump.add_argument(
        "--config",
        type=flags.model,
        required=True,
        metavar="NAME",
        help=flags.preset_help("the model (a model directory's own weights of layer 0)", hf=True),
    )
    dump.add_argument(
        "out",
        type=Path,
        metavar="OUT_DIR",
        help="a new directory (its parent must exist), or a previous dump",
    )
    dump.add_argument(
        "--seed",
        type=flags.seed,
        default=0,
        help=f"seed of the random (llama2.c-style) weights, 0 .. {flags.SEED_MAX} (default: %(default)s)",
    )
    dump.add_argument("--dynamic", action="store_true", help="also the dynamic-weight variants")
    dump.add_argument(
        "--force",
        action="store_true",
        help=f"replace OUT_DIR if it is a previous dump (holds {INDEX}); any other directory is refused",
    )
    dump.set_defaults(run=run_dump)


def check_out(out: Path, force: bool, model: str | None = None) -> None:
    """Refuse, before any kernel is generated, an OUT_DIR that cannot be written or must not be replaced
    (``model``: the Hugging Face directory --config names, an input OUT_DIR must stay apart from)."""
    check_apart(out, "[kernels] OUT_DIR", (("--config", model),))
    check_dir(out, "[kernels] OUT_DIR")
    if not out.exists():
        return
    if not force:
        raise OutputError(f"[kernels] OUT_DIR {out}: exists (use --force to replace a previous dump)")
    if not looks_like(out, INDEX):
        raise OutputError(
            f"[kernels] OUT_DIR {out}: not a previous dump (no {INDEX} in it); --force replaces only "
            "those: remove it yourself or choose another OUT_DIR"
        )


def write_kernels(folder: Path, names: list[str], cfg: ModelConfig, weights: dict) -> list[str]:
    """Each kernel's model.mil and weights/ under ``folder``, and its index; returns a line per kernel."""
    index, lines = {}, []
    for name in names:
        spec = catalog.build(name, cfg, weights)
        (folder / name / "weights").mkdir(parents=True)
        (folder / name / "model.mil").write_text(spec.text(), encoding="utf-8")
        for path, data in spec.weight_files().items():
            (folder / name / path.removeprefix("@model_path/")).write_bytes(data)
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
        lines.append(f"{name:>18}: {index[name]['ops']:4d} ops, in {shape_in} -> out {shape_out}")
    (folder / INDEX).write_text(json.dumps({"config": cfg.name, "kernels": index}, indent=2) + "\n")
    return lines


def run_dump(args: argparse.Namespace) -> int:
    cfg = flags.model_config(args.config)
    model = None if cfg.name == args.config else args.config  # a preset names no directory
    check_out(args.out, args.force, model)
    if cfg.name == args.config:  # a preset: every kernel, random llama2.c-style weights
        names = [*catalog.LAYER_KERNELS, *catalog.HEAD_KERNELS]
        if args.dynamic:
            names += list(catalog.DYNAMIC_KERNELS)
        weights = catalog.random_weights(cfg, args.seed)
    else:  # a Hugging Face model: what its training runs (dynamic weights; the head is the CPU's)
        from anekit.hf.model import load_model

        names = [*catalog.DYNAMIC_KERNELS, *catalog.DYNAMIC_HELPERS, "sdpa_bwd2"]
        weights = load_model(args.config, seq_len=cfg.seq_len).params.kernel_weights(0)
    # Written into a temporary sibling directory and renamed, so a failure leaves nothing half-written.
    # The lines are printed once the dump is in place: a closed stdout (``| head``) cannot cut it short.
    with (
        writing(args.out, "[kernels] OUT_DIR"),
        terminate_unwinds("[kernels] dump"),
        DirLock.beside(args.out, "anekit kernels dump"),  # a second dump to OUT_DIR is refused
    ):
        check_out(args.out, args.force, model)  # again under the lock: a dump finished meanwhile is there
        remove_stale_temporaries(args.out.parent, TEMP_KIND)  # what killed dumps left; never a live one's
        tmp = temporary_dir(args.out, TEMP_KIND)
        try:
            lines = write_kernels(tmp, names, cfg, weights)
            replace_path(tmp, args.out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    print("\n".join(lines))
    print(f"wrote {plural(len(names), 'kernel')} of {cfg.name} to {args.out}")
    return 0
