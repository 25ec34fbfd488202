"""The doctor: what this machine offers anekit, and which backend ``anekit.runtime.open()`` will use; and
the smoke ladder run on that backend.

``diagnose()`` reports the OS (release, machine; on macOS the version and the chip), whether the private
AppleNeuralEngine framework is there and loads, which of its classes and selectors resolve, the compile
budget, the numpy / Python versions, each backend and why it is unavailable, the backend ``open()``
returns (honouring ``ANEKIT_BACKEND``) and the trials the macOS backend settles by trying. ``smoke()``
runs the ladder of ``anekit.tools.smoke`` and the numeric rungs of ``anekit.tools.smoke_numerics`` on a
backend. Both return typed reports; ``to_json()`` gives the JSON document ``anekit doctor --json``
prints. ``first_contact()`` turns a smoke report into the engine layer's first-contact report
(``anekit.engine.report``, what ``anekit doctor --smoke --report FILE`` writes): each rung's constructs
and stage outcomes, each numeric probe's bits, the chip, the macOS and the training route chosen.

The framework facts come from ``anekit.runtime.ane.probe()``, which declares the classes and selectors
the backend uses and only looks them up (it sends no message). The ane module is imported lazily: when
it does not import, the report says so and everything else is still reported. Off macOS on Apple
silicon nothing native is loaded.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

import anekit
from anekit import runtime
from anekit.engine import report as first
from anekit.engine.chips import GENERATIONS, UnknownChip
from anekit.engine.chips import device as chip_device
from anekit.engine.constructs import UnknownMacOS, macos_major
from anekit.engine.generation_routes import NoGenerationRoute, generation_route
from anekit.engine.training_routes import NoTrainingRoute, training_route
from anekit.kernels.config import ModelConfig
from anekit.runtime.base import Backend
from anekit.tools import smoke as ladder
from anekit.tools import smoke_numerics

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
REQUIRED_CLASSES = CLASSES[:4]
DEFAULT_ANE_REASON = "ane needs macOS on Apple silicon with the AppleNeuralEngine framework"


@dataclass(frozen=True)
class Host:
    """The machine as the ``platform`` module sees it; ``macos`` is the macOS version on a Mac."""

    system: str
    release: str
    machine: str
    macos: str | None = None


@dataclass(frozen=True)
class AneModule:
    """The ane backend module: whether it imports (and why not), and whether it says it is available."""

    imports: bool
    error: str | None = None
    available: bool | None = False  # None: is_available() failed
    reason: str | None = None  # why it is not available, in its own words


@dataclass(frozen=True)
class Framework:
    """The AppleNeuralEngine framework: its folder, whether it is there and loads, and the probe's word."""

    path: str
    exists: bool
    loaded: bool
    status: str


@dataclass(frozen=True)
class Engine:
    """What the ane module's probe found: the chip, the framework, its classes and selectors (None: not
    checked) and whether the required classes resolve."""

    module: AneModule
    chip: str | None
    framework: Framework
    classes: dict[str, bool | None]
    selectors: dict[str, bool]
    ready: bool


@dataclass(frozen=True)
class BackendStatus:
    """One known backend: available here, or why not."""

    available: bool
    reason: str | None = None


@dataclass(frozen=True)
class Opened:
    """What ``runtime.open()`` does here: the backend it returns, or the error it raises."""

    forced_by: str | None  # ENV when the environment names the backend
    backend: str | None
    ok: bool
    backend_class: str | None = None
    compile_budget: int | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "forced_by": self.forced_by,
            "backend": self.backend,
            "ok": self.ok,
            "class": self.backend_class,
            "compile_budget": self.compile_budget,
            "error": self.error,
        }


@dataclass(frozen=True)
class Trials:
    """What the macOS backend settles by trying (``anekit.engine.trials``): the order it tries each
    trial's options in on this chip and macOS, and the outcomes it remembered (every machine's entries
    in the memory file; ``here`` marks this one's)."""

    chip: str
    macos: str | None
    order: dict[str, list[str]]
    memory: str
    problem: str | None
    outcomes: list[dict[str, Any]]


@dataclass(frozen=True)
class Report:
    """Everything the doctor reports about this machine."""

    anekit: str
    python: dict[str, str]  # version, implementation, executable
    numpy: str
    host: Host
    engine: Engine
    backends: dict[str, BackendStatus]
    env: dict[str, str | None]  # ENV's value, None when not set
    compile_budget: int  # the default compiles per process
    opened: Opened
    trials: Trials

    @property
    def ok(self) -> bool:
        """Whether ``runtime.open()`` works here."""
        return self.opened.ok

    @property
    def chip(self) -> str | None:
        """The chip the probe found (None off a Mac)."""
        return self.engine.chip

    def to_json(self) -> dict[str, Any]:
        """The report as the JSON document ``anekit doctor --json`` prints."""
        e = self.engine
        return {
            "anekit": self.anekit,
            "python": dict(self.python),
            "numpy": self.numpy,
            "os": {**asdict(self.host), "chip": e.chip},
            "framework": asdict(e.framework),
            "classes": dict(e.classes),
            "selectors": dict(e.selectors),
            "engine_ready": e.ready,
            "ane_module": asdict(e.module),
            "backends": {name: asdict(b) for name, b in self.backends.items()},
            "env": dict(self.env),
            "compile_budget": {"default": self.compile_budget},
            "open": self.opened.to_json(),
            "trials": asdict(self.trials),
        }


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


def engine(objc_runtime: Any = None) -> Engine:
    """The ane module and what its probe found (``objc_runtime`` is handed to ``ane.probe``: tests pass
    an ObjCRuntime over fake libraries)."""
    ane, error = _ane()
    binary = getattr(ane, "ANE_FRAMEWORK", FRAMEWORK_BINARY)
    folder = PurePosixPath(binary).parent
    exists = os.path.isdir(folder)
    unchecked: dict[str, bool | None] = dict.fromkeys(CLASSES)
    if ane is None:
        status = f"not checked: {ANE_MODULE} does not import"
        return Engine(
            AneModule(False, error), None, Framework(str(folder), exists, False, status), unchecked, {}, False
        )
    available, error = _call(getattr(ane, "is_available", lambda: True))
    reason = None
    explain = getattr(ane, "unavailable_reason", None)
    if callable(explain) and available is False:
        said, _ = _call(explain)
        reason = None if said is None else str(said)
    module = AneModule(True, error, available, reason)
    probe = getattr(ane, "probe", None)
    if not callable(probe):
        status = f"not checked: {ANE_MODULE} has no probe()"
        return Engine(module, None, Framework(str(folder), exists, False, status), unchecked, {}, False)
    found, failed = _call(probe, objc_runtime)
    if found is None:
        return Engine(module, None, Framework(str(folder), exists, False, str(failed)), unchecked, {}, False)
    loaded = bool(found.classes)  # classes are looked up once the framework loads
    classes: dict[str, bool | None] = (
        {**dict.fromkeys(CLASSES, False), **found.classes} if loaded else unchecked
    )
    selectors = dict(found.messages) if loaded else {}
    framework = Framework(str(folder), exists, loaded, found.framework)
    return Engine(module, found.chip, framework, classes, selectors, bool(found.available))


def backends() -> dict[str, BackendStatus]:
    """Each known backend: available here or not, and why not."""
    here = runtime.available()
    return {
        name: BackendStatus(True) if name in here else BackendStatus(False, _unavailable_reason(name))
        for name in runtime.BACKENDS
    }


def _unavailable_reason(name: str) -> str:
    default = DEFAULT_ANE_REASON if name == "ane" else f"backend '{name}' is not available on this machine"
    try:
        module = importlib.import_module(runtime.BACKENDS[name][0])
    except Exception as e:
        return f"{default} (its module does not import: {e})"
    explain = getattr(module, "unavailable_reason", None)
    reason, _ = _call(explain) if callable(explain) else (None, None)
    return str(reason) if reason else default


def opened(env: Mapping[str, str]) -> Opened:
    """What ``runtime.open()`` does here: the backend it returns, or the error it raises."""
    forced = env.get(ENV) or None
    by = ENV if forced else None
    try:
        b = runtime.open()
    except Exception as e:  # open() failing is the finding, whatever it raises
        said = str(e) if isinstance(e, anekit.AnekitError) else f"{type(e).__name__}: {e}"
        return Opened(by, forced, False, error=said)
    return Opened(by, b.name, True, type(b).__name__, b.compile_budget)


def trials(chip_brand: str | None, macos: str | None) -> Trials:
    """The trials of the macOS backend on this chip and macOS, and what it remembered of them."""
    from anekit.engine.trials import TRIALS
    from anekit.runtime.ane.availability import chip_name
    from anekit.runtime.ane.memory import Memory

    chip = chip_name(chip_brand or "")
    memory = Memory()
    outcomes = [
        {**asdict(o), "here": o.chip == chip and o.macos == (macos or ""), "line": o.line()}
        for o in memory.entries()
    ]
    order = {t.id: list(t.order(chip, macos or "")) for t in TRIALS.values()}
    return Trials(chip, macos, order, str(memory.path), memory.problem, outcomes)


def _major(macos: str) -> tuple[str, str]:
    """The macOS major the engine layer knows ``macos`` by ("" for every major), and the note saying so
    when it has no evidence for it."""
    try:
        return macos_major(macos), ""
    except UnknownMacOS:
        return "", f"macOS {macos} has no evidence: the route for every macOS the engine layer knows; "


def generation_route_line(chip_brand: str | None, macos: str | None) -> str:
    """``<route id> (<why>)``: the generation route (``anekit.engine.generation_routes``) this Mac's chip
    and macOS decode on (what ``anekit sample --backend ane`` runs); off a Mac, what the simulator does."""
    from anekit.runtime.ane.availability import chip_name

    if macos is None:
        return "no chip detected (not a Mac): anekit sample --backend sim --chip C takes chip C's route"
    major, note = _major(macos)
    try:
        r = generation_route(chip_name(chip_brand or ""), major)
    except NoGenerationRoute as e:
        return f"none ({note}{e})"
    return f"{r.id} ({note}{r.why})"


def route_line(chip_brand: str | None, macos: str | None, chip: str | None = None) -> str:
    """``<route id> (<why>; evidence: <sources>)``: the training route of this Mac's chip and macOS
    (``anekit.engine.training_routes``), or of ``chip`` under every macOS when one is named off a Mac; off
    a Mac with no chip named, that none is detected and what the simulator does instead (no route has a
    precedent on every chip under every macOS)."""
    from anekit.runtime.ane.availability import chip_name

    if chip is None and macos is None:
        return (
            "no chip detected (not a Mac): the simulator trains with its own kernels; --chip C (m1 .. m5) "
            "takes chip C's route"
        )
    name = chip or chip_name(chip_brand or "")
    major, note = _major(macos or "")
    try:
        r = training_route(name, major)
    except NoTrainingRoute as e:
        return f"none ({note}{e})"
    return f"{r.id} ({note}{r.why}; evidence: {' · '.join(r.sources())})"


def diagnose(env: Mapping[str, str] | None = None, objc_runtime: Any = None) -> Report:
    """Everything the doctor reports about this machine (``env``: the environment, default os.environ)."""
    import numpy as np

    env = os.environ if env is None else env
    found = engine(objc_runtime)
    python = {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }
    return Report(
        anekit=anekit.__version__,
        python=python,
        numpy=np.__version__,
        host=host(),
        engine=found,
        backends=backends(),
        env={ENV: env.get(ENV) or None},
        compile_budget=runtime.DEFAULT_COMPILE_BUDGET,
        opened=opened(env),
        trials=trials(found.chip, host().macos),
    )


# -- the smoke ladder ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Numerics:
    """The numeric rungs: which chip profiles the machine matches, and where it departs from the one
    anekit assumed for it (the simulator's own chip, or this Mac's)."""

    assumed: str
    results: list[smoke_numerics.NumericResult]
    matches: list[str]
    differs: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "assumed": self.assumed,
            "rungs": [r.to_json() for r in self.results],
            "matches": self.matches,
            "differs": self.differs,
        }


@dataclass(frozen=True)
class SmokeReport:
    """The ladder on one backend: the machine's report, where it ran, every rung, the numeric rungs."""

    doctor: Report
    backend: str
    backend_class: str
    note: str  # where the ladder ran, in words (backend_note)
    dialect: str
    config: str
    seed: int
    rungs: list[ladder.RungResult]
    numerics: Numerics

    @property
    def failed(self) -> list[str]:
        """The rungs that did not pass, by name."""
        return [r.name for r in self.rungs if r.status != "pass"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        """The report as the JSON document ``anekit doctor --smoke --json`` writes."""
        return {
            "doctor": self.doctor.to_json(),
            "backend": {"name": self.backend, "class": self.backend_class, "note": self.note},
            "chip": self.doctor.chip,
            "dialect": self.dialect,
            "config": self.config,
            "seed": self.seed,
            "tolerance": {"atol": ladder.ATOL, "rtol": ladder.RTOL},
            "rungs": [r.to_json() for r in self.rungs],
            "summary": {
                "rungs": len(self.rungs),
                "passed": len(self.rungs) - len(self.failed),
                "failed": self.failed,
            },
            "numerics": self.numerics.to_json(),
            "ok": self.ok,
        }


def smoke_dialect(backend: Backend, asked: str = "auto") -> str:
    """The MIL dialect the ladder's programs are printed in: the one asked, else on the engine the one
    the backend compiles in first (what it remembered, else the trial's order for this chip and macOS);
    the simulator reads either, and gets ios18."""
    if asked != "auto":
        return asked
    first = getattr(backend, "preferred_dialect", None)
    return str(first()) if backend.name == "ane" and callable(first) else "ios18"


def backend_note(name: str, report: Report) -> str:
    """Where the ladder ran, in words: on the engine, or in the simulator and why."""
    if name != "sim":
        return f"on the Neural Engine ({report.chip or 'unknown chip'})"
    ane = report.backends.get("ane")
    if report.env[ENV] == "sim" and ane is not None and ane.available:
        return f"the ladder ran in the simulator ({ENV}=sim; this machine has the Neural Engine)"
    return "no Neural Engine here: the ladder ran in the simulator"


def assumed_profile(backend: Backend, chip: str | None) -> str:
    """The numeric profile anekit assumes for the machine: the simulator's own chip, else this Mac's."""
    from anekit.runtime.ane.availability import chip_name

    return getattr(backend, "chip", None) or (chip_name(chip) if chip else "any")


def numerics(backend: Backend, dialect: str, assumed: str) -> Numerics:
    """The numeric rungs on ``backend``, matched against every chip profile and the assumed one."""
    found = smoke_numerics.run(backend, dialect)
    return Numerics(
        assumed, found, smoke_numerics.profiles_matched(found), smoke_numerics.differences(found, assumed)
    )


def smoke(
    backend: Backend,
    cfg: ModelConfig,
    dialect: str = "auto",
    seed: int = 0,
    report: Report | None = None,
    on_result: Callable[[int, ladder.RungResult], None] | None = None,
) -> SmokeReport:
    """The smoke ladder (its first rungs, then every kernel of ``cfg``) and the numeric rungs on
    ``backend``, each rung compared with the simulator; ``on_result(index, result)`` is called as each
    ladder rung finishes. ``report``: this machine's (default: ``diagnose()``)."""
    report = diagnose() if report is None else report
    dialect = smoke_dialect(backend, dialect)
    results = ladder.run_ladder(backend, ladder.ladder(cfg, dialect, seed), on_result=on_result)
    found = numerics(backend, dialect, assumed_profile(backend, report.chip))
    note = backend_note(backend.name, report)
    return SmokeReport(
        report, backend.name, type(backend).__name__, note, dialect, cfg.name, seed, results, found
    )


# -- the first-contact report -------------------------------------------------------------------------------


def chip_of(backend: str, brand: str | None, simulated: str | None) -> tuple[str | None, str | None]:
    """(device, generation) as ``anekit.engine.chips`` names them: this Mac's from its brand string
    ("Apple M1 Pro" -> m1-pro, m1) on the engine, the simulated profile's chip in the simulator; (None,
    None) where neither is known."""
    if backend == "ane":
        name = (brand or "").removeprefix("Apple").strip()
        try:
            found = chip_device(name)
        except UnknownChip:
            return None, None
        return found.name, found.generation
    return (simulated, simulated) if simulated in GENERATIONS else (None, None)


def chosen_route(chip: str | None, macos: str) -> first.Route | None:
    """The training route ``anekit.engine.training_routes`` chooses for ``chip`` (None: any chip) under
    ``macos`` ("" off a Mac, or a major it has no evidence for: the route for every major it knows, which
    the why says); None when no route is found."""
    note = ""
    try:
        major = macos_major(macos)
    except UnknownMacOS:
        major, note = "", f"macOS {macos} has no evidence: the route for every macOS the engine layer knows; "
    try:
        chosen = training_route(chip or "any", major)
    except NoTrainingRoute:
        return None
    return first.Route(chosen.id, note + chosen.why, tuple(chosen.sources()))


def _stages(r: ladder.RungResult) -> dict[str, first.Stage]:
    """compile / load / run / compare of one rung: ok up to the failing stage, failed there, not run after."""
    failed = r.stage if r.status != "pass" else None
    if failed in ("reference", "generate"):  # the backend never saw it
        return {s: first.Stage() for s in first.STAGES}
    out, reached = {}, True
    for s in first.STAGES:
        ms = r.stage_ms.get(s)
        if not reached:
            out[s] = first.Stage()
        elif s == failed:
            out[s] = first.Stage("failed", (r.error or "").splitlines()[0] or "failed", ms)
            reached = False
        else:
            out[s] = first.Stage("ok", None, ms)
    return out


def _probe(r: smoke_numerics.NumericResult) -> first.Probe:
    inputs = {
        name: first.Tensor(tuple(int(d) for d in x.shape), tuple(smoke_numerics.nonzero(x)))
        for name, x in r.inputs.items()
    }
    got = None if r.got is None else tuple(smoke_numerics.bits(r.got))
    expected = {c: tuple(smoke_numerics.bits(v)) for c, v in r.expected.items()}
    error = None if got is not None else (r.error or "nothing was read")
    return first.Probe(r.name, r.behaviour, inputs, r.read, got, expected, error)


def first_contact(found: SmokeReport, when: datetime | None = None) -> first.Report:
    """The first-contact report of a smoke run (``anekit.engine.report``, schema version 1; ``when``: now
    unless given). In the simulator the chip is the profile it computed with (none for "any")."""
    doc = found.doctor
    backend = "ane" if found.backend == "ane" else "sim"
    dev, gen = chip_of(backend, doc.chip, found.numerics.assumed)
    macos = (doc.host.macos or "") if backend == "ane" else ""
    major = macos.split(".")[0] if macos else ""
    stamp = (when or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rungs = tuple(first.Rung(r.name, tuple(r.constructs), **_stages(r)) for r in found.rungs)
    return first.Report(
        anekit=anekit.__version__,
        when=stamp,
        device=dev,
        generation=gen,
        macos=macos,
        macos_major=major,
        backend=backend,
        rungs=rungs,
        probes=tuple(_probe(r) for r in found.numerics.results),
        route=chosen_route(gen, macos),
    )
