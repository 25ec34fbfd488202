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
import time
import warnings
from pathlib import Path

import numpy as np

from anekit import jit, mil, runtime
from anekit.cli import flags
from anekit.errors import AnekitError, MilSyntaxError
from anekit.fileio import atomic_write
from anekit.outputs import check_apart, check_file, writing
from anekit.tools.loader import PYTHON_SUFFIXES, Loaded, is_package, open_program
from anekit.tools.run import Timing, fill_inputs, load_input, nonfinite, report, summary, timed_runs
from anekit.words import plural

REPEAT_MAX = 1_000_000


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
        given[name] = load_input(fn, name, file)
    return fill_inputs(fn, given, args.random, hint="; give --input or --random")


def _load(args: argparse.Namespace) -> tuple[Loaded, str]:
    """The program PROGRAM names, with its weight files, and the function to run."""
    if args.weights is not None and is_package(args.program):
        raise AnekitError("[run] a CoreML package carries its own weights: drop --weights")
    try:
        loaded = open_program(
            args.program, args.weights, where="[run]", hint=": give --weights DIR_OR_FILE", label="--weights"
        )
    except MilSyntaxError:
        if args.program.suffix in PYTHON_SUFFIXES:
            raise AnekitError(
                f"[run] {args.program} is a Python file: run takes MIL text (.mil), a CoreML package "
                "(.mlpackage) or a compiled .mlmodelc; to check the programs a Python file defines, use "
                f"`anekit lint {args.program}`"
            ) from None
        raise
    return loaded, _function(args.function, loaded.program, loaded.function)


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
    loaded, function = _load(args)
    prog = loaded.program
    if (args.backend or "sim") == "sim":
        options.update(precision=args.precision, **({"strict": False} if args.no_strict else {}))
        if args.route or loaded.route:
            options["route"] = args.route or loaded.route
    backend = runtime.open(args.backend, **options)
    sanitizer = getattr(backend, "sanitizer", None)
    with Session(prog, dict(loaded.weights), backend, states=args.state_in) as session:
        jit.loops()  # the process's one-time set-up (importing the compiled loops) is not the compile's
        t0 = time.perf_counter()
        kernel = session.kernel(function)
        compile_ms = 1e3 * (time.perf_counter() - t0)
        feeds = _inputs(args, prog.functions[kernel.name])
        # Overflow to inf and NaN are results here, counted in the summary below: numpy's RuntimeWarnings
        # about them would only repeat that on stderr, without saying which tensor.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            outputs, times = timed_runs(session, kernel, feeds, args.repeat, sanitizer)
            bad_inputs = {name: nonfinite(np.asarray(value)) for name, value in feeds.items()}
            lines = [f"  input {name}: NOT FINITE: {bad}" for name, bad in bad_inputs.items() if bad]
            lines += [f"  {summary(name, value)}" for name, value in outputs.items()]
        if args.state_out is not None:
            with writing(args.state_out, "[run] --state-out"):
                session.save_states(args.state_out)
    timing = Timing.of(compile_ms, times)
    if args.json:
        doc = report(str(args.program), backend, timing, feeds, outputs, session.states, sanitizer)
        print(json.dumps(doc, indent=1))
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
            np.savez(f, **outputs)  # type: ignore[arg-type]  # numpy's stubs type **kwds as allow_pickle
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


def _numerics_label(backend: runtime.Backend) -> str:
    """ ", chip m1 numerics engine" for the simulator, "" for the engine itself."""
    numerics = getattr(backend, "numerics", None)
    return "" if numerics is None else f" (chip {backend.chip}, numerics {numerics})"
