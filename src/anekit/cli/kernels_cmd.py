"""``anekit kernels dump --config NAME OUT_DIR``: every kernel of one layer and the head, as files;
``--chip C [--macos V]``: the kernels of that chip's training route instead; ``--generate [--chip C] [--macos
V]``: the decode and prefill kernels of the model's generation plan on that chip's generation route."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

from anekit.cli import flags
from anekit.errors import AnekitError
from anekit.fileio import (
    DirLock,
    remove_stale_temporaries,
    replace_path,
    temporary_dir,
    terminate_unwinds,
)
from anekit.kernels.config import ModelConfig
from anekit.outputs import OutputError, check_apart, check_dir, looks_like, writing
from anekit.tools.config import is_preset, model_config
from anekit.tools.dump import INDEX, DumpedKernel, kernels_of, route_kernels, write_kernels
from anekit.tools.gen_dump import DumpedGenKernel, generation_kernels, write_generation
from anekit.words import plural

TEMP_KIND = "kernels"  # the kind in the names of a dump's temporary directories (fileio.temporary_name)


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
        "--generate",
        action="store_true",
        help="the decode and prefill kernels of the model's generation plan instead (with --chip: on that "
        "chip's generation route; default: the simulator's, chip any), with the model's whole weights",
    )
    dump.add_argument(
        "--chip",
        type=flags.chip,
        help="the kernels of this chip's training route (any, m1 .. m5), as its training step compiles them; "
        "with --generate: of its generation route",
    )
    dump.add_argument(
        "--macos",
        metavar="VERSION",
        help="with --chip: the route under this macOS version (15, 26, 15.3 ...); default: the route that "
        "runs under every macOS version anekit has evidence for",
    )
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


def _line(k: DumpedKernel, width: int = 18) -> str:
    shape_in = f"[1, {k.input.channels}, 1, {k.input.spatial}]"
    shape_out = f"[1, {k.output.channels}, 1, {k.output.spatial}]"
    return f"{k.name:>{width}}: {k.ops:4d} ops, in {shape_in} -> out {shape_out}"


def _gen_line(k: DumpedGenKernel, width: int) -> str:
    shapes = " + ".join(f"{n} [1, {s.channels}, 1, {s.spatial}]" for n, s in k.inputs.items())
    out = f"[1, {k.output.channels}, 1, {k.output.spatial}]"
    return f"{k.name:>{width}}: {k.ops:4d} ops, {'+'.join(k.phases):<14} in {shapes} -> out {out}"


def _write(out: Path, model: str | None, force: bool, write: Callable[[Path], list[str]]) -> list[str]:
    """``write(tmp)`` into a temporary sibling of ``out`` renamed onto it, so a failure leaves nothing
    half-written; its lines are printed once the dump is in place (a closed stdout, ``| head``, cannot cut
    it short)."""
    with (
        writing(out, "[kernels] OUT_DIR"),
        terminate_unwinds("[kernels] dump"),
        DirLock.beside(out, "anekit kernels dump"),  # a second dump to OUT_DIR is refused
    ):
        check_out(out, force, model)  # again under the lock: a dump finished meanwhile is there
        remove_stale_temporaries(out.parent, TEMP_KIND)  # what killed dumps left; never a live one's
        tmp = temporary_dir(out, TEMP_KIND)
        try:
            lines = write(tmp)
            replace_path(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return lines


def run_generate(args: argparse.Namespace, cfg: ModelConfig, model: str | None) -> int:
    if args.dynamic:
        raise AnekitError("[kernels] --dynamic does not apply with --generate: the generation route decides")
    if args.macos is not None and args.chip is None:
        raise AnekitError("[kernels] --macos applies with --chip only")
    dump = generation_kernels(args.config, cfg, args.chip or "any", args.macos or "", args.seed)
    width = max(18, *(len(n) for n in dump.names))

    def write(tmp: Path) -> list[str]:
        return [_gen_line(k, width) for k in write_generation(tmp, dump)]

    lines = _write(args.out, model, args.force, write)
    print("\n".join(lines))
    route, plan = dump.route, dump.plan
    where = f"macOS {route.macos}" if route.macos else "every macOS"
    print(f"generation route of {route.chip} under {where}: {route.id} ({route.why})")
    if route.attention == "host":  # the conv route's kernels read no cache: it lives in host memory
        widths = f"decode width {plan.decode_width}, prefill width {plan.prefill_width} (cache on the host)"
    else:
        widths = (
            f"decode width {plan.decode_width} (cache {plan.capacity} slots), prefill width "
            f"{plan.prefill_width} (cache {plan.prefill_capacity} slots)"
        )
    groups = f"{plural(len(plan.groups), 'layer group')}, {plural(len(plan.tiles), 'vocabulary tile')}"
    print(f"{widths}; {groups}")
    print(f"wrote {plural(len(dump.names), 'kernel')} of {cfg.name} to {args.out}")
    return 0


def run_dump(args: argparse.Namespace) -> int:
    cfg = model_config(args.config)
    model = None if is_preset(args.config) else args.config  # a preset names no directory
    check_out(args.out, args.force, model)
    if args.generate:
        return run_generate(args, cfg, model)
    route, specs, weights = None, None, dict[str, object]()
    if args.chip is not None:
        if args.dynamic:
            raise AnekitError("[kernels] --dynamic does not apply with --chip: the chip's route decides")
        route, specs = route_kernels(args.config, cfg, args.chip, args.macos or "", args.seed)
        names = list(specs)
    else:
        if args.macos is not None:
            raise AnekitError("[kernels] --macos applies with --chip only")
        names, weights = kernels_of(args.config, cfg, args.seed, args.dynamic)
    width = max(18, *(len(n) for n in names))  # a sliding kind's names are longer

    def write(tmp: Path) -> list[str]:
        return [_line(k, width) for k in write_kernels(tmp, names, cfg, weights, specs, route)]

    print("\n".join(_write(args.out, model, args.force, write)))
    if route is not None:
        where = f"macOS {route.macos}" if route.macos else "every macOS"
        print(f"training route of {route.chip} under {where}: {route.id} ({route.why})")
    print(f"wrote {plural(len(names), 'kernel')} of {cfg.name} to {args.out}")
    return 0
