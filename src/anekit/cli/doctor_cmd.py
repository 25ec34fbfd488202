"""``anekit doctor [--json]``: what this machine offers anekit, and which backend ``open()`` will use.

The report is ``anekit.tools.doctor.diagnose()``'s: the OS, the AppleNeuralEngine framework, its classes
and selectors, the compile budget, the numpy / Python versions, each backend and why it is unavailable,
and the backend ``anekit.runtime.open()`` returns (honouring ``ANEKIT_BACKEND``). Exits 1 when ``open()``
would fail. ``--json`` prints the report as JSON; ``--json OUT`` writes it to OUT (atomically).

``--smoke`` then runs the ladder (``anekit.tools.doctor.smoke``) on that backend (the engine on a Mac,
the simulator elsewhere, which the output says), one line per rung and a summary; with ``--json OUT``
the whole report (this machine, the backend, every rung) goes to OUT. Exits 0 when every rung passes,
1 otherwise. ``--report FILE`` (with ``--smoke``) also writes the first-contact report
(``anekit.engine.report``, schema version 1: the chip, the macOS, each rung's constructs and compile /
load / run outcome with its time, each numeric probe's bits, the training route chosen) to FILE,
atomically; FILE must be a regular file name: a symlink, a FIFO, a device, the ``--json`` output or an
input of the doctor (its trials memory) is refused before anything runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from anekit import runtime
from anekit.cli import flags
from anekit.engine.report import write_report
from anekit.fileio import atomic_write
from anekit.kernels import preset
from anekit.outputs import OutputError, check_apart, check_file, writing
from anekit.tools import doctor, smoke, smoke_numerics


def _mark(value: bool | None) -> str:
    return "-" if value is None else ("found" if value else "MISSING")


def format_report(r: dict[str, Any]) -> str:
    """The report as aligned ``label  value`` lines."""
    lines: list[tuple[str, str]] = []
    add = lines.append
    osr, fw, ane, op, py = r["os"], r["framework"], r["ane_module"], r["open"], r["python"]
    add(("anekit", r["anekit"]))
    add(("python", f"{py['version']} ({py['implementation']}) {py['executable']}"))
    add(("numpy", r["numpy"]))
    add(("os", f"{osr['system']} {osr['release']} {osr['machine']}"))
    add(("macOS", osr["macos"] or ("unknown" if osr["system"] == "Darwin" else "no (not macOS)")))
    add(("chip", osr["chip"] or "unknown"))
    add(("training route", doctor.route_line(osr["chip"], osr["macos"])))
    add(("generation route", doctor.generation_route_line(osr["chip"], osr["macos"])))
    add(("framework", f"{fw['path']} ({'present' if fw['exists'] else 'not found'})"))
    add(("framework loads", "yes" if fw["loaded"] else f"no: {fw['status']}"))
    if fw["loaded"]:
        required = doctor.REQUIRED_CLASSES
        for name, ok in r["classes"].items():
            add(("class", f"{_mark(ok):<8}{name}{' (required)' if name in required else ''}"))
        for name, ok in r["selectors"].items():
            add(("selector", f"{_mark(ok):<8}{name}"))
        add(
            (
                "engine",
                "the required classes resolve" if r["engine_ready"] else "required classes are MISSING",
            )
        )
    else:
        add(("classes", "not available (the framework is not loaded)"))
    if ane["imports"]:
        said = {True: "available", False: "not available", None: "is_available() failed"}[ane["available"]]
        detail = ane["reason"] or ane["error"]
        add(("ane module", f"imports; {said}" + (f": {detail}" if detail else "")))
    else:
        add(("ane module", f"not available: {ane['error']}"))
    for name, b in r["backends"].items():
        add((f"backend {name}", "available" if b["available"] else f"not available: {b['reason']}"))
    add((doctor.ENV, r["env"][doctor.ENV] or "not set"))
    add(("compile budget", f"{r['compile_budget']['default']} compiles per process (default)"))
    tr = r["trials"]
    for trial_id, order in tr["order"].items():
        add((f"trial {trial_id}", f"tries {', '.join(order)} on {tr['chip']} (macOS {tr['macos'] or '-'})"))
    for o in tr["outcomes"]:
        add(("remembered", o["line"] + (" (this machine)" if o["here"] else "")))
    if tr["problem"]:
        add(("remembered", tr["problem"]))
    if op["ok"]:
        forced = f", forced by {doctor.ENV}" if op["forced_by"] else ""
        add(("open()", f"{op['backend']} ({op['class']}, compile budget {op['compile_budget']}{forced})"))
    else:
        add(("open()", f"fails: {op['error']}"))
    width = max(len(label) for label, _ in lines) + 2
    return "\n".join(f"{label:<{width}}{value}" for label, value in lines) + "\n"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor", help="report the OS, the Neural Engine framework and the backend open() uses"
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="OUT",
        help="the report as JSON: printed, or written to OUT (with --smoke: the ladder's full report)",
    )
    p.add_argument(
        "--smoke", action="store_true", help="compile, load and run a ladder of programs and compare"
    )
    p.add_argument(
        "--report",
        metavar="FILE",
        help="--smoke: write the first-contact report (chip, macOS, each rung's outcome, the probes' bits, "
        "the training route) to FILE, to attach to an issue",
    )
    p.add_argument(
        "--config",
        default="stories260K",
        type=flags.preset,
        metavar="NAME",
        help=flags.preset_help("--smoke: the preset whose kernels run (default: %(default)s)"),
    )
    p.add_argument(
        "--seed",
        type=flags.seed,
        default=0,
        help=f"--smoke: seed of the random inputs and weights, 0 .. {flags.SEED_MAX} (default: %(default)s)",
    )
    p.add_argument(
        "--dialect",
        choices=["auto", "ios18", "ios16"],
        default="auto",
        help="--smoke: MIL dialect of the programs (default auto: the engine's first try, ios18 elsewhere)",
    )
    p.set_defaults(run=run)


def check_writable(path: str) -> None:
    """Refuse, before any work, a report path that cannot be written (AnekitError naming it)."""
    if not path:
        raise OutputError("[doctor] --json needs a file name")
    check_file(path, "[doctor] --json", devices=True)  # /dev/stdout, a pipe: written into, never replaced


def check_report(path: str, json_out: str | None) -> None:
    """Refuse, before any work, a ``--report`` path anekit must not write: not a regular file name (a
    symlink, a FIFO, a device, a directory), the ``--json`` output, or the doctor's input (the trials
    memory it reads)."""
    what = "[doctor] --report"
    if not path:
        raise OutputError(f"{what} needs a file name")
    with writing(path, what):
        if os.path.islink(path):
            raise OutputError(
                f"{what} {path}: is a symbolic link; the report is written only as a regular file: choose a "
                "file name"
            )
    check_file(path, what)
    if json_out not in (None, "-") and os.path.abspath(path) == os.path.abspath(str(json_out)):
        raise OutputError(f"{what} {path}: is the --json output too: choose another file")
    from anekit.runtime.ane.memory import Memory

    check_apart(path, what, (("(the trials memory)", Path(Memory().path)),))


def write_json(path: str, report: dict[str, Any]) -> None:
    """The report as JSON in ``path``, written atomically (never half-written); a character device or FIFO
    is written into as it is (never replaced by a file)."""
    data = (json.dumps(report, indent=2) + "\n").encode("utf-8")
    with writing(path, "[doctor] --json"), atomic_write(path, devices=True) as f:
        f.write(data)


def run(args: argparse.Namespace) -> int:
    to_file = args.json not in (None, "-")
    if to_file:
        check_writable(args.json)
    report_to = getattr(args, "report", None)
    if report_to is not None:
        if not getattr(args, "smoke", False):
            raise OutputError("[doctor] --report needs --smoke (the report is what the ladder found)")
        check_report(report_to, args.json)
    if getattr(args, "smoke", False):
        return run_smoke(args)
    report = doctor.diagnose().to_json()
    if to_file:
        write_json(args.json, report)
        sys.stdout.write(format_report(report))
    elif args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(format_report(report))
    return 0 if report["open"]["ok"] else 1


def run_smoke(args: argparse.Namespace) -> int:
    """``--smoke``: the ladder on the backend ``open()`` returns, a line per rung, a summary, the JSON."""
    cfg = preset(args.config)  # an unknown preset is an AnekitError before anything runs
    report = doctor.diagnose()
    backend = runtime.open()
    dialect = doctor.smoke_dialect(backend, args.dialect)
    out = sys.stderr if args.json == "-" else sys.stdout  # JSON on stdout: the lines go to stderr
    where = doctor.backend_note(backend.name, report)
    print(f"smoke ladder on {backend.name} ({type(backend).__name__}): {where}", file=out)
    print(f"MIL dialect {dialect}; kernels of {cfg.name}; seed {args.seed}", file=out)
    print(f"pass: max |backend - simulator| <= {smoke.ATOL} + {smoke.RTOL} * max |simulator|", file=out)

    def show(index: int, result: smoke.RungResult) -> None:
        print(smoke.format_result(index, result), file=out, flush=True)

    found = doctor.smoke(backend, cfg, dialect, args.seed, report, on_result=show)
    failed = found.failed
    summary = f"{len(found.rungs) - len(failed)}/{len(found.rungs)} rungs pass on {backend.name}"
    print(summary + (f"; failed: {', '.join(failed)}" if failed else ""), file=out)
    _print_numerics(found.numerics, out)
    if backend.name == "sim":
        print(where, file=out)
    if args.json == "-":
        sys.stdout.write(json.dumps(found.to_json(), indent=2) + "\n")
    elif args.json:
        write_json(args.json, found.to_json())
        print(f"wrote {args.json}", file=out)
    if getattr(args, "report", None):
        contact = doctor.first_contact(found)
        with writing(args.report, "[doctor] --report"):
            write_report(args.report, contact)
        kind = "measured on the Neural Engine" if contact.hardware else "from the simulator: no evidence"
        print(f"wrote the first-contact report {args.report} ({kind})", file=out)
    return 0 if not failed else 1


def _print_numerics(numerics: doctor.Numerics, out: Any) -> None:
    """The numeric rungs (``anekit.tools.smoke_numerics``): which chip profiles the machine matches, and
    where it departs from the one anekit assumed for it."""
    print(
        f"numeric rungs (which chip profile the machine computes like; assumed: {numerics.assumed}):",
        file=out,
    )
    for r in numerics.results:
        print(smoke_numerics.format_result(r), file=out)
    print(f"numerics match the profiles of: {', '.join(numerics.matches) or 'none'}", file=out)
    for line in numerics.differs:
        print(f"  differs from the assumed profile: {line}", file=out)
