"""``anekit run PROGRAM.mil --weights DIR_OR_FILE --input NAME=FILE.npy ... --output OUT.npz``; a CoreML
package (``MODEL.mlpackage``) runs the same way, its weights taken from the package."""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from anekit import mil, runtime
from anekit.cli import flags
from anekit.engine.evidence import check_route
from anekit.errors import AnekitError
from anekit.fileio import atomic_write
from anekit.mil import types as T
from anekit.mil.values import BlobRef
from anekit.outputs import check_file, writing

MODEL_PATH = "@model_path/"
REPEAT_MAX = 1_000_000


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="compile a MIL program and run it on numpy inputs")
    p.add_argument(
        "program",
        type=Path,
        metavar="PROGRAM.mil|MODEL.mlpackage",
        help="MIL text, or a CoreML package (its weights come from the package)",
    )
    p.add_argument(
        "--weights",
        type=Path,
        metavar="DIR_OR_FILE",
        help="a model directory (holding weights/...), a weights directory, or one weight file",
    )
    p.add_argument(
        "--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input tensor (repeatable)"
    )
    p.add_argument(
        "--random",
        type=flags.seed,
        metavar="SEED",
        help=f"fill inputs not given with N(0, 1) values from this seed, 0 .. {flags.SEED_MAX} "
        "(default: none, every input must be given)",
    )
    p.add_argument(
        "--output",
        type=Path,
        metavar="OUT.npz",
        help="save every output (a new file, or one to replace; its directory must exist)",
    )
    p.add_argument("--backend", choices=sorted(runtime.BACKENDS), help="default: the best available")
    p.add_argument(
        "--precision",
        choices=["ane", "fp32"],
        default="ane",
        help="simulator numerics (default: %(default)s)",
    )
    p.add_argument(
        "--no-strict",
        action="store_true",
        help="simulator: run even what the engine would refuse (default: refuse it, naming the rule)",
    )
    p.add_argument(
        "--repeat",
        type=flags.int_range(1, REPEAT_MAX),
        default=1,
        metavar="N",
        help=f"runs to time, the median is printed (1 .. {REPEAT_MAX}; default: %(default)s)",
    )
    p.add_argument("--function", help="the function to run (default: main, or the package's default)")
    p.add_argument(
        "--route",
        metavar="ROUTE",
        help="simulator: whose rules strict compiling applies — direct (the in-memory route anekit's backend "
        "drives; default for MIL files), e5rt (the Espresso / e5rt runtime) or coreml (default for packages)",
    )
    flags.add_numerics(p, "(one line per op: the counts and the largest offending value)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (backend, chip, outputs, sanitizer report) instead of the text lines",
    )
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
        if name in given:
            raise AnekitError(f"[run] --input {name} is given twice")
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


def nonfinite(value: np.ndarray) -> str:
    """ "" for an array of finite numbers, else how many of its values are NaN, +inf and -inf."""
    if not value.size or value.dtype.kind not in "fc":
        return ""
    counts = {
        "NaN": int(np.isnan(value).sum()),
        "+inf": int(np.isposinf(value).sum()),
        "-inf": int(np.isneginf(value).sum()),
    }
    return ", ".join(f"{n} {label}" for label, n in counts.items() if n)


def summary(name: str, value: np.ndarray) -> str:
    """One line: shape, dtype, range and mean of the finite values, and the count of the others."""
    line = f"{name}: {list(value.shape)} {value.dtype}"
    if value.size and value.dtype.kind == "f":
        finite = value[np.isfinite(value)]
        if finite.size:
            # float64 sums: a float16 mean of large finite values would itself overflow to inf
            mean = finite.astype(np.float64).mean()
            line += f"  min {finite.min():.4g}  max {finite.max():.4g}  mean {mean:.4g}"
    bad = nonfinite(value)
    if bad:
        line += f"  NOT FINITE: {bad} of {value.size}"
    return line


def run(args: argparse.Namespace) -> int:
    if args.output is not None:
        check_file(args.output, "[run] --output")
    options: dict[str, object] = flags.numerics_options(args)
    runtime.check_numerics_options(args.backend, options)
    if args.route is not None:
        check_route(args.route, "run")
        if (args.backend or "sim") != "sim" and args.route != "direct":
            raise AnekitError(f"[run] backend '{args.backend}' takes the direct route, not '{args.route}'")
    prog, weights, function = _load(args)
    if (args.backend or "sim") == "sim":
        options.update(precision=args.precision, **({"strict": False} if args.no_strict else {}))
        if args.route is not None:
            options["route"] = args.route
        elif _is_package(args):
            options["route"] = "coreml"  # a package's buffers are CoreML's: the surface rules do not hold
    backend = runtime.open(args.backend, **options)
    t0 = time.perf_counter()
    kernel = backend.compile(prog, weights, function=function)
    compile_ms = 1e3 * (time.perf_counter() - t0)
    fn = next(f for f in prog.functions.values() if f.name == kernel.name)
    feeds = _inputs(args, fn)
    times = []
    # Overflow to inf and NaN are results here, counted in the summary below: numpy's RuntimeWarnings
    # about them would only repeat that on stderr, without saying which tensor.
    with kernel, np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(args.repeat):
            t1 = time.perf_counter()
            outputs = kernel(**feeds)
            times.append(1e3 * (time.perf_counter() - t1))
        bad_inputs = {name: nonfinite(np.asarray(value)) for name, value in feeds.items()}
        lines = [f"  input {name}: NOT FINITE: {bad}" for name, bad in bad_inputs.items() if bad]
        lines += [f"  {summary(name, value)}" for name, value in outputs.items()]
    sanitizer = getattr(backend, "sanitizer", None)
    run_ms = statistics.median(times)
    if args.json:
        print(json.dumps(_report(args, backend, compile_ms, run_ms, feeds, outputs, sanitizer), indent=1))
    else:
        print(
            f"{args.program}: backend {backend.name}{_numerics_label(backend)}, compile {compile_ms:.2f} ms, "
            f"run {run_ms:.3f} ms (median of {len(times)})"
        )
        print("\n".join(lines))
        if sanitizer is not None:
            found = sanitizer.lines()
            print(
                f"sanitizer ({len(found)} ops departed from the ideal machine over {len(times)} runs)"
                + (":" if found else ": none")
            )
            print("\n".join(f"  {line}" for line in found)) if found else None
    bad_outputs = [name for name, value in outputs.items() if nonfinite(value)]
    if bad_outputs and not args.json:
        names = ", ".join(bad_outputs)
        print(f"warning: {len(bad_outputs)} of {len(outputs)} outputs hold NaN or inf: {names}")
    if args.output is not None:
        with writing(args.output, "[run] --output"), atomic_write(args.output) as f:
            np.savez(f, **outputs)
        if not args.json:
            print(f"wrote {args.output}")
    return 0


def _numerics_label(backend: runtime.Backend) -> str:
    """ ", chip m1 numerics engine" for the simulator, "" for the engine itself."""
    numerics = getattr(backend, "numerics", None)
    return "" if numerics is None else f" (chip {backend.chip}, numerics {numerics})"  # type: ignore[attr-defined]


def _report(
    args: argparse.Namespace,
    backend: runtime.Backend,
    compile_ms: float,
    run_ms: float,
    feeds: dict[str, np.ndarray],
    outputs: dict[str, np.ndarray],
    sanitizer: object,
) -> dict[str, object]:
    """The run as one JSON-ready dict."""

    def describe(value: np.ndarray) -> dict[str, object]:
        v = np.asarray(value)
        finite = v[np.isfinite(v)] if v.dtype.kind == "f" else v
        out: dict[str, object] = {"shape": list(v.shape), "dtype": str(v.dtype)}
        if finite.size:
            out.update(
                min=float(finite.min()), max=float(finite.max()), mean=float(finite.astype(np.float64).mean())
            )
        bad = nonfinite(v)
        if bad:
            out["not_finite"] = bad
        return out

    return {
        "program": str(args.program),
        "backend": backend.name,
        "chip": getattr(backend, "chip", None),
        "numerics": getattr(backend, "numerics", None),
        "compile_ms": compile_ms,
        "run_ms": run_ms,
        "repeat": args.repeat,
        "inputs": {name: describe(np.asarray(v)) for name, v in feeds.items()},
        "outputs": {name: describe(v) for name, v in outputs.items()},
        "sanitizer": None if sanitizer is None else sanitizer.records(),  # type: ignore[attr-defined]
    }
