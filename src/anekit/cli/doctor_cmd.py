"""``anekit doctor [--json]``: what this machine offers anekit, and which backend ``open()`` will use.

Reports the OS (release, machine; on macOS the version and the chip), whether the private
AppleNeuralEngine framework is there and loads, which of its classes and selectors resolve, the
compile budget, the numpy / Python versions, each backend and why it is unavailable, and the backend
``anekit.runtime.open()`` returns (honouring ``ANEKIT_BACKEND``). Exits 1 when ``open()`` would fail.
``--json`` prints the report as JSON; ``--json OUT`` writes it to OUT (atomically).

``--smoke`` then compiles, loads and runs the ladder of ``anekit.cli.smoke`` on that backend (the
engine on a Mac, the simulator elsewhere, which the output says), one line per rung and a summary;
with ``--json OUT`` the whole report (this machine, the backend, every rung) goes to OUT. Exits 0 when
every rung passes, 1 otherwise.

The framework facts come from ``anekit.runtime.ane.probe()``, which declares the classes and
selectors the backend uses and only looks them up (it sends no message). The ane module is imported
lazily: when it does not import, the report says so and everything else is still reported. Off
macOS on Apple silicon nothing native is loaded.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any

import anekit
from anekit import runtime
from anekit.cli import flags
from anekit.fileio import atomic_write
from anekit.outputs import OutputError, check_file, writing

ENV = "ANEKIT_BACKEND"
ANE_MODULE = "anekit.runtime.ane"
FRAMEWORK_BINARY = "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine"
# The classes reported even when nothing could be checked (the four the backend needs, and the client).
CLASSES = (
    "_ANEInMemoryModelDescriptor",
    "_ANEInMemoryModel",
    "_ANERequest",
    "_ANEIOSurfaceObject",
    "_ANEClient",
)
DEFAULT_ANE_REASON = "ane needs macOS on Apple silicon with the AppleNeuralEngine framework"


@dataclass(frozen=True)
class Host:
    """The machine as the ``platform`` module sees it; ``macos`` is the macOS version on a Mac."""

    system: str
    release: str
    machine: str
    macos: str | None = None


def host() -> Host:
    system = platform.system()
    macos = (platform.mac_ver()[0] or None) if system == "Darwin" else None
    return Host(system, platform.release(), platform.machine(), macos)


def _ane() -> tuple[Any, str | None]:
    """The ane backend module, or None and why it does not import."""
    try:
        return importlib.import_module(ANE_MODULE), None
    except Exception as e:  # an import failure is exactly what the doctor must report
        return None, f"{type(e).__name__}: {e}"


def _call(fn: Any, *args: Any) -> tuple[Any, str | None]:
    """``fn(*args)`` and None, or None and what it raised: a probe that fails is a finding, not a crash."""
    try:
        return fn(*args), None
    except Exception as e:
        return None, f"{getattr(fn, '__name__', 'probe')}() raised {type(e).__name__}: {e}"


def engine(objc_runtime: Any = None) -> dict[str, Any]:
    """The ane module and what its probe found: chip, framework, classes, selectors (None: not checked).

    ``objc_runtime`` is handed to ``ane.probe`` (tests pass an ObjCRuntime over fake libraries).
    """
    ane, error = _ane()
    binary = getattr(ane, "ANE_FRAMEWORK", FRAMEWORK_BINARY)
    info: dict[str, Any] = {
        "module": {"imports": ane is not None, "error": error, "available": False, "reason": None},
        "chip": None,
        "framework": {
            "path": str(PurePosixPath(binary).parent),
            "exists": os.path.isdir(PurePosixPath(binary).parent),
            "loaded": False,
            "status": f"not checked: {ANE_MODULE} does not import" if ane is None else "not checked",
        },
        "classes": dict.fromkeys(CLASSES),
        "selectors": {},
        "engine_ready": False,
    }
    if ane is None:
        return info
    module = info["module"]
    module["available"], module["error"] = _call(getattr(ane, "is_available", lambda: True))
    explain = getattr(ane, "unavailable_reason", None)
    if callable(explain) and module["available"] is False:
        reason, _ = _call(explain)
        module["reason"] = None if reason is None else str(reason)
    probe = getattr(ane, "probe", None)
    if not callable(probe):
        info["framework"]["status"] = f"not checked: {ANE_MODULE} has no probe()"
        return info
    found, failed = _call(probe, objc_runtime)
    if found is None:
        info["framework"]["status"] = failed
        return info
    info["chip"] = found.chip
    info["framework"]["status"] = found.framework
    info["framework"]["loaded"] = bool(found.classes)  # classes are looked up once the framework loads
    if found.classes:
        info["classes"] = {**dict.fromkeys(CLASSES, False), **found.classes}
        info["selectors"] = dict(found.messages)
    info["engine_ready"] = bool(found.available)
    return info


def backends() -> dict[str, dict[str, Any]]:
    """Each known backend: available here or not, and why not."""
    here = runtime.available()
    out = {}
    for name in runtime.BACKENDS:
        out[name] = {"available": name in here, "reason": None if name in here else _unavailable_reason(name)}
    return out


def _unavailable_reason(name: str) -> str:
    default = DEFAULT_ANE_REASON if name == "ane" else f"backend '{name}' is not available on this machine"
    try:
        module = importlib.import_module(runtime.BACKENDS[name][0])
    except Exception as e:
        return f"{default} (its module does not import: {e})"
    explain = getattr(module, "unavailable_reason", None)
    reason, _ = _call(explain) if callable(explain) else (None, None)
    return str(reason) if reason else default


def chosen_backend(env: Mapping[str, str]) -> dict[str, Any]:
    """What ``runtime.open()`` does here: the backend it returns, or the error it raises."""
    forced = env.get(ENV) or None
    info: dict[str, Any] = {"forced_by": ENV if forced else None, "backend": forced, "ok": False}
    info.update({"class": None, "compile_budget": None, "error": None})
    try:
        b = runtime.open()
    except Exception as e:  # open() failing is the finding, whatever it raises
        info["error"] = str(e) if isinstance(e, anekit.AnekitError) else f"{type(e).__name__}: {e}"
        return info
    info.update(
        {"backend": b.name, "ok": True, "class": type(b).__name__, "compile_budget": b.compile_budget}
    )
    return info


def collect(env: Mapping[str, str] | None = None, objc_runtime: Any = None) -> dict[str, Any]:
    """Everything the doctor reports, as a JSON-ready dict."""
    import numpy as np

    env = os.environ if env is None else env
    found = engine(objc_runtime)
    return {
        "anekit": anekit.__version__,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "numpy": np.__version__,
        "os": {**asdict(host()), "chip": found["chip"]},
        "framework": found["framework"],
        "classes": found["classes"],
        "selectors": found["selectors"],
        "engine_ready": found["engine_ready"],
        "ane_module": found["module"],
        "backends": backends(),
        "env": {ENV: env.get(ENV) or None},
        "compile_budget": {"default": runtime.DEFAULT_COMPILE_BUDGET},
        "open": chosen_backend(env),
        "trials": trials(found["chip"], host().macos),
    }


def trials(chip_brand: str | None, macos: str | None) -> dict[str, Any]:
    """What the macOS backend settles by trying (``anekit.engine.trials``): the order it tries each
    trial's options in on this chip and macOS, and the outcomes it remembered (every machine's entries
    in the memory file; ``here`` marks this one's)."""
    from anekit.engine.trials import TRIALS
    from anekit.runtime.ane.availability import chip_name
    from anekit.runtime.ane.memory import Memory

    chip = chip_name(chip_brand or "")
    memory = Memory()
    outcomes = [
        {**asdict(o), "here": o.chip == chip and o.macos == (macos or ""), "line": o.line()}
        for o in memory.entries()
    ]
    return {
        "chip": chip,
        "macos": macos,
        "order": {t.id: list(t.order(chip, macos or "")) for t in TRIALS.values()},
        "memory": str(memory.path),
        "problem": memory.problem,
        "outcomes": outcomes,
    }


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
    add(("framework", f"{fw['path']} ({'present' if fw['exists'] else 'not found'})"))
    add(("framework loads", "yes" if fw["loaded"] else f"no: {fw['status']}"))
    if fw["loaded"]:
        required = CLASSES[:4]
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
    add((ENV, r["env"][ENV] or "not set"))
    add(("compile budget", f"{r['compile_budget']['default']} compiles per process (default)"))
    tr = r["trials"]
    for trial_id, order in tr["order"].items():
        add((f"trial {trial_id}", f"tries {', '.join(order)} on {tr['chip']} (macOS {tr['macos'] or '-'})"))
    for o in tr["outcomes"]:
        add(("remembered", o["line"] + (" (this machine)" if o["here"] else "")))
    if tr["problem"]:
        add(("remembered", tr["problem"]))
    if op["ok"]:
        forced = f", forced by {ENV}" if op["forced_by"] else ""
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
    if getattr(args, "smoke", False):
        return run_smoke(args)
    report = collect()
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
    from anekit.cli import smoke
    from anekit.kernels import preset

    cfg = preset(args.config)  # an unknown preset is an AnekitError before anything runs
    report = collect()
    backend = runtime.open()
    chip = report["os"]["chip"]
    if args.dialect != "auto":
        dialect = args.dialect
    else:
        # On the engine: the dialect the backend compiles in first (what it remembered, else the trial's
        # order for this chip and macOS); the simulator reads either.
        first = getattr(backend, "preferred_dialect", None)
        dialect = first() if backend.name == "ane" and callable(first) else "ios18"
    out = sys.stderr if args.json == "-" else sys.stdout  # JSON on stdout: the lines go to stderr
    where = backend_note(backend.name, report)
    print(f"smoke ladder on {backend.name} ({type(backend).__name__}): {where}", file=out)
    print(f"MIL dialect {dialect}; kernels of {cfg.name}; seed {args.seed}", file=out)
    print(f"pass: max |backend - simulator| <= {smoke.ATOL} + {smoke.RTOL} * max |simulator|", file=out)

    def show(index: int, result: smoke.RungResult) -> None:
        print(smoke.format_result(index, result), file=out, flush=True)

    results = smoke.run_ladder(backend, smoke.ladder(cfg, dialect, args.seed), on_result=show)
    failed = [r.name for r in results if r.status != "pass"]
    summary = f"{len(results) - len(failed)}/{len(results)} rungs pass on {backend.name}"
    print(summary + (f"; failed: {', '.join(failed)}" if failed else ""), file=out)
    numerics = _numeric_rungs(backend, chip, dialect, out)
    if backend.name == "sim":
        print(where, file=out)
    full = {
        "doctor": report,
        "backend": {"name": backend.name, "class": type(backend).__name__, "note": where},
        "chip": chip,
        "dialect": dialect,
        "config": cfg.name,
        "seed": args.seed,
        "tolerance": {"atol": smoke.ATOL, "rtol": smoke.RTOL},
        "rungs": [r.to_json() for r in results],
        "summary": {"rungs": len(results), "passed": len(results) - len(failed), "failed": failed},
        "numerics": numerics,
        "ok": not failed,
    }
    if args.json == "-":
        sys.stdout.write(json.dumps(full, indent=2) + "\n")
    elif args.json:
        write_json(args.json, full)
        print(f"wrote {args.json}", file=out)
    return 0 if not failed else 1


def _numeric_rungs(backend: Any, chip: str | None, dialect: str, out: Any) -> dict[str, Any]:
    """The numeric rungs (``anekit.cli.smoke_numerics``): which chip profiles the machine matches, and
    where it departs from the one anekit assumed for it (the simulator's own chip, or this Mac's)."""
    from anekit.cli import smoke_numerics
    from anekit.runtime.ane.availability import chip_name

    assumed = getattr(backend, "chip", None) or (chip_name(chip) if chip else "any")
    print(f"numeric rungs (which chip profile the machine computes like; assumed: {assumed}):", file=out)
    found = smoke_numerics.run(backend, dialect)
    for r in found:
        print(smoke_numerics.format_result(r), file=out)
    matched = smoke_numerics.profiles_matched(found)
    differs = smoke_numerics.differences(found, assumed)
    print(f"numerics match the profiles of: {', '.join(matched) or 'none'}", file=out)
    for line in differs:
        print(f"  differs from the assumed profile: {line}", file=out)
    return {
        "assumed": assumed,
        "rungs": [r.to_json() for r in found],
        "matches": matched,
        "differs": differs,
    }


def backend_note(name: str, report: dict[str, Any]) -> str:
    """Where the ladder ran, in words: on the engine, or in the simulator and why."""
    if name != "sim":
        return f"on the Neural Engine ({report['os']['chip'] or 'unknown chip'})"
    if report["env"][ENV] == "sim" and report["backends"].get("ane", {}).get("available"):
        return f"the ladder ran in the simulator ({ENV}=sim; this machine has the Neural Engine)"
    return "no Neural Engine here: the ladder ran in the simulator"
