"""``anekit run PROGRAM.mil --input NAME=FILE.npy ... --output OUT.npz``: compile a program, run it, report.

PROGRAM is MIL text (its BLOBFILE weights found beside it, as ``anekit lint`` finds them, or given with
``--weights``), a CoreML package (``MODEL.mlpackage``, its weights inside) or a compiled ``.mlmodelc``
(its ``model.mil`` and weights). A stateful function's states start at zero or from ``--state-in``, and
``--state-out`` saves them after the call, so an exported model runs prefill, then decode, one call per
command (``anekit.runtime.session``). Compile, the first run (which includes one-time setup) and the
median of ``--repeat`` warm runs are timed separately; every timed run starts from the same states.
"""

from __future__ import annotations

import argparse
import json
import stat
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from anekit import jit, mil, runtime
from anekit.cli import flags
from anekit.errors import AnekitError, MilSyntaxError
from anekit.fileio import atomic_write
from anekit.inputs import LIMITS, load_npy, read_text, stat_input
from anekit.mil import types as T
from anekit.mil.values import BlobRef
from anekit.outputs import check_apart, check_file, writing
from anekit.words import plural

if TYPE_CHECKING:
    from anekit.runtime.session import Session

MODEL_PATH = "@model_path/"
COMPILED_MIL = "model.mil"  # the program inside a compiled CoreML model (.mlmodelc)
REPEAT_MAX = 1_000_000
PYTHON_SUFFIXES = (".py", ".pyw")  # `anekit lint` takes these, `run` does not


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="compile a MIL program and run it on numpy inputs")
    p.add_argument(
        "program",
        type=Path,
        metavar="PROGRAM.mil|MODEL.mlpackage|MODEL.mlmodelc",
        help="MIL text, a CoreML package or a compiled .mlmodelc (their weights come with them)",
    )
    p.add_argument(
        "--weights",
        type=Path,
        metavar="DIR_OR_FILE",
        help="a model directory (holding weights/...), a weights directory, or one weight file "
        "(default: the files BLOBFILE names, found beside PROGRAM.mil)",
    )
    p.add_argument(
        "--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input tensor (repeatable)"
    )
    p.add_argument(
        "--random",
        type=flags.seed,
        metavar="SEED",
        help=f"fill inputs not given with N(0, 1) values from this seed, 0 .. {flags.SEED_MAX} "
        "(default: none, every input must be given; states start at zero or from --state-in)",
    )
    p.add_argument(
        "--state-in",
        type=Path,
        metavar="STATE.npz",
        help="start a stateful function from these states (one array per state, as --state-out writes)",
    )
    p.add_argument(
        "--state-out",
        type=Path,
        metavar="STATE.npz",
        help="save the states after the call (e.g. prefill's KV caches, for the decode that follows)",
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
        help=f"warm runs to time after the first, the median is printed (1 .. {REPEAT_MAX}; "
        "default: %(default)s)",
    )
    p.add_argument("--function", help="the function to run (default: main, or the package's default)")
    p.add_argument(
        "--route",
        type=flags.route,
        metavar="ROUTE",
        help="simulator: whose rules strict compiling applies — direct (the in-memory route anekit's backend "
        "drives; default for MIL files), e5rt (the Espresso / e5rt runtime) or coreml (default for packages "
        "and .mlmodelc)",
    )
    flags.add_numerics(p, "(one line per op: the counts and the largest offending value)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (backend, chip, outputs, sanitizer report) instead of the text lines",
    )
    p.set_defaults(run=run)


def blobfile_paths(prog: mil.Program) -> dict[str, str]:
    """Every weight file a program's BLOBFILE values refer to, with the first const that refers to it."""
    paths: dict[str, str] = {}
    for fn in prog.functions.values():
        for op in fn.ops:
            values = list(op.attributes.values()) + [
                a for a in op.inputs.values() if isinstance(a, mil.Literal)
            ]
            for v in values:
                if isinstance(v, mil.Literal) and isinstance(v.value, BlobRef):
                    paths.setdefault(v.value.path, op.outputs[0].name if op.outputs else op.op_type)
    return paths


def weight_map(source: Path | None, prog: mil.Program, beside: Path | None = None) -> dict[str, Path]:
    """``{"@model_path/weights/x.bin": path}`` for the weight files the program needs: from ``source``
    (--weights), else each ``@model_path/...`` file under ``beside`` (the program's folder, as ``anekit
    lint`` resolves them); a file that is not there is refused, naming the const and --weights."""
    needed = blobfile_paths(prog)
    if source is None:
        if beside is None:
            return {}
        found = {p: beside / p.removeprefix(MODEL_PATH) for p in needed if p.startswith(MODEL_PATH)}
        for path, file in sorted(found.items()):
            if not file.is_file():
                raise AnekitError(
                    f"[run] const '{needed[path]}' refers to weight file '{path}', which is not beside the "
                    f"program ({file} does not exist): give --weights DIR_OR_FILE"
                )
        return found
    if stat_input(source, "[run] --weights") is None:  # a name too long for the OS: one line too
        raise AnekitError(f"[run] weights '{source}' do not exist")
    if source.is_file():
        matches = {p: source for p in needed if Path(p).name == source.name}
        if not matches and len(needed) == 1:
            matches = {next(iter(needed)): source}
        return matches
    found = {}
    for f in sorted(source.rglob("*")):
        if f.is_file():
            rel = f.relative_to(source).as_posix()
            found[MODEL_PATH + rel] = f
            found.setdefault(MODEL_PATH + "weights/" + rel, f)
    return found


def _inputs(args: argparse.Namespace, fn: mil.Function) -> dict[str, np.ndarray]:
    """The tensor inputs of ``fn``: --input files, the rest from --random. States are not inputs: they
    start at zero or from --state-in."""
    given: dict[str, np.ndarray] = {}
    for item in args.input:
        name, sep, file = item.partition("=")
        if not sep:
            raise AnekitError(f"[run] --input takes NAME=FILE.npy, got '{item}'")
        if name in given:
            raise AnekitError(f"[run] --input {name} is given twice")
        # The declared type decides before loading: the shape, and the dtypes taken (anekit.inputs: an
        # integer or bool array for a float input is refused, never cast to fp16 without a word).
        var = next((v for v in fn.inputs if v.name == name), None)
        shape = getattr(var.type, "shape", None) if var is not None else None
        dt = getattr(var.type, "dtype", None) if var is not None else None
        expect = tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None
        kind = dt.kind if dt is not None and dt.kind in ("int", "uint", "bool") else "float"
        limits = dt.int_range() if kind in ("int", "uint") else None
        given[name] = load_npy(
            file, f"[run] cannot load input '{name}' from", expect, kind=kind, int_range=limits
        )
    rng = np.random.default_rng(args.random)
    tensors = [v for v in fn.inputs if not isinstance(v.type, T.StateType)]
    for v in tensors:
        if v.name not in given:
            if args.random is None or not isinstance(v.type, (T.TensorType, T.TensorBufferType)):
                need = ", ".join(f"{x.name}: {x.type}" for x in tensors)
                raise AnekitError(
                    f"[run] no value for input '{v.name}' (inputs: {need}); give --input or --random"
                )
            given[v.name] = rng.standard_normal([int(d) for d in v.type.shape]).astype(np.float32)
    return given


def _kind(path: Path) -> str:
    """What PROGRAM is: "package" (.mlpackage / .mlmodel), "compiled" (a directory holding model.mil,
    as an .mlmodelc) or "mil" (text)."""
    if path.suffix in (".mlpackage", ".mlmodel"):
        return "package"
    st = stat_input(path, "[run] cannot read")
    if st is not None and stat.S_ISDIR(st.st_mode):
        if not (path / COMPILED_MIL).is_file():
            raise AnekitError(
                f"[run] cannot read {path}: a directory without a {COMPILED_MIL} "
                "(give a .mil file, a .mlpackage or a compiled .mlmodelc)"
            )
        return "compiled"
    return "mil"


def _load(args: argparse.Namespace) -> tuple[mil.Program, dict[str, Path], str, str | None]:
    """The program, its weight files, the function to run and the route it takes (None: the program's
    own, "direct" for MIL text), from MIL text, a CoreML package or a compiled .mlmodelc."""
    kind = _kind(args.program)
    if kind == "package":
        from anekit.coreml import load_mlpackage

        if args.weights is not None:
            raise AnekitError("[run] a CoreML package carries its own weights: drop --weights")
        pkg = load_mlpackage(args.program)  # its program carries the route: coreml
        function = _function(args.function, pkg.program, pkg.default_function)
        return pkg.program, dict(pkg.weights), function, None
    path = args.program / COMPILED_MIL if kind == "compiled" else args.program
    text = read_text(path, "[run] cannot read", LIMITS["mil"], "a MIL text file")
    try:
        prog = mil.parse(text, str(path))
    except MilSyntaxError:
        if path.suffix in PYTHON_SUFFIXES:
            raise AnekitError(
                f"[run] {path} is a Python file: run takes MIL text (.mil), a CoreML package (.mlpackage) or "
                f"a compiled .mlmodelc; to check the programs a Python file defines, use `anekit lint {path}`"
            ) from None
        raise
    # A compiled CoreML model's buffers are CoreML's, as a package's: its I/O need not be engine surfaces.
    route = "coreml" if kind == "compiled" else None
    return prog, weight_map(args.weights, prog, path.parent), _function(args.function, prog, "main"), route


def _function(given: str | None, prog: mil.Program, default: str) -> str:
    """The function --function names (default: ``default``); an empty name or one the program lacks is
    refused, naming the functions it has."""
    if given is None:
        return default
    if given.strip() and given in prog.functions:
        return given
    have = ", ".join(prog.functions) or "none"
    if not given.strip():
        raise AnekitError(f"[run] --function is empty: name one of the program's functions (it has: {have})")
    raise AnekitError(f"[run] --function {given}: the program has no function '{given}' (it has: {have})")


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
    from anekit.runtime.session import Session

    for path, what in ((args.output, "--output"), (args.state_out, "--state-out")):
        if path is not None:
            check_apart(path, f"[run] {what}", _input_paths(args, states=what == "--output"))
            check_file(path, f"[run] {what}")
    options: dict[str, object] = flags.numerics_options(args)
    runtime.check_numerics_options(args.backend, options)
    if args.route not in (None, "direct") and (args.backend or "sim") != "sim":
        raise AnekitError(f"[run] backend '{args.backend}' takes the direct route, not '{args.route}'")
    prog, weights, function, route = _load(args)
    if (args.backend or "sim") == "sim":
        options.update(precision=args.precision, **({"strict": False} if args.no_strict else {}))
        if args.route or route:
            options["route"] = args.route or route
    backend = runtime.open(args.backend, **options)
    sanitizer = getattr(backend, "sanitizer", None)
    with Session(prog, weights, backend, states=args.state_in) as session:
        jit.loops()  # the process's one-time set-up (importing the compiled loops) is not the compile's
        t0 = time.perf_counter()
        kernel = session.kernel(function)
        compile_ms = 1e3 * (time.perf_counter() - t0)
        feeds = _inputs(args, prog.functions[kernel.name])
        # Overflow to inf and NaN are results here, counted in the summary below: numpy's RuntimeWarnings
        # about them would only repeat that on stderr, without saying which tensor.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            outputs, times = _timed_runs(session, kernel, feeds, args.repeat, sanitizer)
            bad_inputs = {name: nonfinite(np.asarray(value)) for name, value in feeds.items()}
            lines = [f"  input {name}: NOT FINITE: {bad}" for name, bad in bad_inputs.items() if bad]
            lines += [f"  {summary(name, value)}" for name, value in outputs.items()]
        if args.state_out is not None:
            with writing(args.state_out, "[run] --state-out"):
                session.save_states(args.state_out)
    timing = Timing(compile_ms, times[0], statistics.median(times[1:]), len(times) - 1)
    if args.json:
        print(json.dumps(_report(args, backend, timing, feeds, outputs, session.states, sanitizer), indent=1))
    else:
        print(
            f"{args.program}: backend {backend.name}{_numerics_label(backend)}, compile "
            f"{timing.compile_ms:.2f} ms, first run {timing.first_run_ms:.3f} ms, warm run "
            f"{timing.run_ms:.3f} ms (median of {timing.repeat})"
        )
        print("\n".join(lines))
        if sanitizer is not None:
            found = sanitizer.lines()
            print(
                f"sanitizer ({plural(len(found), 'op')} departed from the ideal machine over "
                f"{plural(timing.repeat, 'run')})" + (":" if found else ": none")
            )
            print("\n".join(f"  {line}" for line in found)) if found else None
    bad_outputs = [name for name, value in outputs.items() if nonfinite(value)]
    if bad_outputs and not args.json:
        names = ", ".join(bad_outputs)
        print(f"warning: {len(bad_outputs)} of {len(outputs)} outputs hold NaN or inf: {names}")
    if args.state_out is not None and not args.json:
        print(f"wrote {args.state_out} ({plural(len(session.states), 'state')})")
    if args.output is not None:
        with writing(args.output, "[run] --output"), atomic_write(args.output) as f:
            np.savez(f, **outputs)
        if not args.json:
            print(f"wrote {args.output}")
    return 0


def _input_paths(args: argparse.Namespace, states: bool) -> list[tuple[str, Path | None]]:
    """The paths ``run`` reads, named by their flags, that an output must stay apart from. ``--state-out``
    may be ``--state-in`` (``states`` False): the states are read when the session opens and written,
    atomically, after the call, so the state file is advanced in place, as the README shows."""
    paths: list[tuple[str, Path | None]] = [("PROGRAM", args.program), ("--weights", args.weights)]
    if states:
        paths.append(("--state-in", args.state_in))
    for item in args.input:
        name, sep, file = item.partition("=")
        if sep:
            paths.append((f"--input {name}=", Path(file)))
    return paths


def _timed_runs(
    session: Session, kernel: runtime.Kernel, feeds: dict[str, np.ndarray], repeat: int, sanitizer: Any
) -> tuple[dict[str, np.ndarray], list[float]]:
    """The outputs, and the times in ms of the first run (one-time setup included) and ``repeat`` warm
    runs; every run starts from the states the session had, so the states left are those of one call.
    The sanitizer counts the warm runs (the first computes the same values)."""
    start = {name: buf.copy() for name, buf in session.states.items()}
    times = []
    for i in range(1 + repeat):
        if i:
            session.load_states(start)
        if i == 1 and sanitizer is not None:
            sanitizer.clear()
        t0 = time.perf_counter()
        outputs = kernel(**feeds)
        times.append(1e3 * (time.perf_counter() - t0))
    return outputs, times


@dataclass(frozen=True)
class Timing:
    """What a run took: compiling, the first run (one-time setup included) and the median warm run."""

    compile_ms: float
    first_run_ms: float
    run_ms: float
    repeat: int  # warm runs timed


def _numerics_label(backend: runtime.Backend) -> str:
    """ ", chip m1 numerics engine" for the simulator, "" for the engine itself."""
    numerics = getattr(backend, "numerics", None)
    return "" if numerics is None else f" (chip {backend.chip}, numerics {numerics})"  # type: ignore[attr-defined]


def _report(
    args: argparse.Namespace,
    backend: runtime.Backend,
    timing: Timing,
    feeds: dict[str, np.ndarray],
    outputs: dict[str, np.ndarray],
    states: dict[str, np.ndarray],
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
        "compile_ms": timing.compile_ms,
        "first_run_ms": timing.first_run_ms,
        "run_ms": timing.run_ms,
        "repeat": timing.repeat,
        "inputs": {name: describe(np.asarray(v)) for name, v in feeds.items()},
        "outputs": {name: describe(v) for name, v in outputs.items()},
        "states": {name: describe(v) for name, v in states.items()},
        "sanitizer": None if sanitizer is None else sanitizer.records(),  # type: ignore[attr-defined]
    }
