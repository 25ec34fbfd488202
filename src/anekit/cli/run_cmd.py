"""``anekit run PROGRAM.mil --weights DIR_OR_FILE --input NAME=FILE.npy ... --output OUT.npz``; a CoreML
package (``MODEL.mlpackage``) runs the same way, its weights taken from the package."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from anekit import mil, runtime
from anekit.errors import AnekitError
from anekit.mil import types as T
from anekit.mil.values import BlobRef

MODEL_PATH = "@model_path/"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="compile a MIL program and run it on numpy inputs")
    p.add_argument("program", type=Path, metavar="PROGRAM.mil|MODEL.mlpackage")
    p.add_argument(
        "--weights",
        type=Path,
        metavar="DIR_OR_FILE",
        help="a model directory (holding weights/...), a weights directory, or one weight file",
    )
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input tensor")
    p.add_argument("--random", type=int, metavar="SEED", help="fill inputs not given with N(0, 1) values")
    p.add_argument("--output", type=Path, metavar="OUT.npz", help="save every output")
    p.add_argument("--backend", choices=sorted(runtime.BACKENDS), help="default: the best available")
    p.add_argument("--precision", choices=["ane", "fp32"], default="ane", help="simulator numerics")
    p.add_argument(
        "--no-strict",
        action="store_true",
        help="simulator: run even what the engine would refuse (default: refuse it, naming the rule)",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs to time (the median is printed)")
    p.add_argument("--function", help="the function to run (default: main, or the package's default)")
    p.set_defaults(run=run)


def blobfile_paths(prog: mil.Program) -> set[str]:
    """Every weight file a program's BLOBFILE values refer to."""
    paths: set[str] = set()
    for fn in prog.functions.values():
        for op in fn.ops:
            values = list(op.attributes.values()) + [
                a for a in op.inputs.values() if isinstance(a, mil.Literal)
            ]
            paths.update(
                v.value.path for v in values if isinstance(v, mil.Literal) and isinstance(v.value, BlobRef)
            )
    return paths


def weight_map(source: Path | None, prog: mil.Program) -> dict[str, Path]:
    """``{"@model_path/weights/x.bin": path}`` for the weight files the program needs."""
    if source is None:
        return {}
    if not source.exists():
        raise AnekitError(f"[run] weights '{source}' do not exist")
    needed = blobfile_paths(prog)
    if source.is_file():
        matches = {p: source for p in needed if Path(p).name == source.name}
        if not matches and len(needed) == 1:
            matches = {next(iter(needed)): source}
        return matches
    found: dict[str, Path] = {}
    for f in sorted(source.rglob("*")):
        if f.is_file():
            rel = f.relative_to(source).as_posix()
            found[MODEL_PATH + rel] = f
            found.setdefault(MODEL_PATH + "weights/" + rel, f)
    return found


def _inputs(args: argparse.Namespace, fn: mil.Function) -> dict[str, np.ndarray]:
    given: dict[str, np.ndarray] = {}
    for item in args.input:
        name, sep, file = item.partition("=")
        if not sep:
            raise AnekitError(f"[run] --input takes NAME=FILE.npy, got '{item}'")
        try:
            given[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise AnekitError(f"[run] cannot load input '{name}' from {file}: {e}") from e
    rng = np.random.default_rng(args.random)
    for v in fn.inputs:
        if v.name not in given:
            if args.random is None or not isinstance(v.type, (T.TensorType, T.TensorBufferType)):
                need = ", ".join(f"{x.name}: {x.type}" for x in fn.inputs)
                raise AnekitError(
                    f"[run] no value for input '{v.name}' (inputs: {need}); give --input or --random"
                )
            given[v.name] = rng.standard_normal([int(d) for d in v.type.shape]).astype(np.float32)
    return given


def _is_package(args: argparse.Namespace) -> bool:
    return args.program.suffix in (".mlpackage", ".mlmodel")


def _load(args: argparse.Namespace) -> tuple[mil.Program, dict[str, Path], str]:
    """The program, its weight files and the function to run, from MIL text or a CoreML package."""
    if _is_package(args):
        from anekit.coreml import load_mlpackage

        if args.weights is not None:
            raise AnekitError("[run] a CoreML package carries its own weights: drop --weights")
        pkg = load_mlpackage(args.program)
        return pkg.program, dict(pkg.weights), args.function or pkg.default_function
    try:
        text = args.program.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AnekitError(f"[run] cannot read {args.program}: {e}") from e
    prog = mil.parse(text, str(args.program))
    return prog, weight_map(args.weights, prog), args.function or "main"


def run(args: argparse.Namespace) -> int:
    prog, weights, function = _load(args)
    options: dict[str, object] = {}
    if (args.backend or "sim") == "sim":
        options = {"precision": args.precision, **({"strict": False} if args.no_strict else {})}
        if _is_package(args):
            options["route"] = "coreml"  # a package's buffers are CoreML's: the surface rules do not hold
    backend = runtime.open(args.backend, **options)
    t0 = time.perf_counter()
    kernel = backend.compile(prog, weights, function=function)
    compile_ms = 1e3 * (time.perf_counter() - t0)
    fn = next(f for f in prog.functions.values() if f.name == kernel.name)
    feeds = _inputs(args, fn)
    times = []
    with kernel:
        for _ in range(max(1, args.repeat)):
            t1 = time.perf_counter()
            outputs = kernel(**feeds)
            times.append(1e3 * (time.perf_counter() - t1))
    print(
        f"{args.program}: backend {backend.name}, compile {compile_ms:.2f} ms, "
        f"run {statistics.median(times):.3f} ms (median of {len(times)})"
    )
    for name, value in outputs.items():
        stats = ""
        if value.size and value.dtype.kind == "f":
            finite = value[np.isfinite(value)]
            if finite.size:
                stats = f"  min {finite.min():.4g}  max {finite.max():.4g}  mean {finite.mean():.4g}"
        print(f"  {name}: {list(value.shape)} {value.dtype}{stats}")
    if args.output:
        tmp = args.output.with_name(args.output.name + ".tmp.npz")
        np.savez(tmp, **outputs)
        tmp.replace(args.output)
        print(f"wrote {args.output}")
    return 0
