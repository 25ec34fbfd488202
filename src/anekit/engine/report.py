"""A Mac's first-contact report (``anekit doctor --smoke --report FILE``) read back as measured evidence.

The doctor's smoke ladder compiles, loads and runs small programs, each tagged with the constructs it
exercises (the construct ids of ``anekit.engine.constructs``), and numeric probes, each reading one
behaviour of ``anekit.engine.numerics``. ``--report FILE`` writes what it found as one JSON document;
``load_report`` reads it back and ``Report.evidence()`` turns it into the engine layer's ``Evidence``, so
a user's report moves a construct from "reported" to "measured" on that chip and macOS without a code
change (drop the file in ``anekit/engine/reports/``: ``shipped_evidence()`` reads every one there).

Schema, version 1 (every field required, no other field allowed; JSON object keys in this order)::

    {
      "schema": "anekit-doctor-report",
      "version": 1,
      "anekit": "0.1.0",                      # the anekit version that wrote it
      "when": "2026-12-02T03:40:00Z",         # UTC, ISO 8601, seconds
      "chip": {"device": "m1-pro",            # anekit.engine.chips device name, or null (both null:
               "generation": "m1"},           # its generation (m1 ... m5)   a chip anekit does not know)
      "macos": {"version": "26.3",            # the macOS version, "" off a Mac
                "major": "26"},               # its first number, "" off a Mac
      "backend": "ane",                       # "ane" (the Neural Engine) or "sim" (the simulator)
      "rungs": [                              # the smoke ladder, in order
        {"name": "matmul_activations",
         "constructs": ["matmul.activations"],          # the construct ids it exercises (may be empty)
         "compile": {"outcome": "ok", "error": null, "ms": 1.5},    # outcome: "ok", "failed", "not run"
         "load":    {"outcome": "ok", "error": null, "ms": 0.2},    # error: the error line, or null
         "run":     {"outcome": "ok", "error": null, "ms": 0.1},    # ms: milliseconds, or null
         "compare": {"outcome": "ok", "error": null, "ms": null}}   # against the simulator's numbers
      ],
      "probes": [                             # the numeric probes
        {"name": "mac_ceiling",
         "id": "mac.output-ceiling",          # the behaviour id of anekit.engine.numerics
         "inputs": {"x": {"shape": [1, 64, 1, 32],
                          "nonzero": [[0, 0, "6000"], ...]}},   # [channel, position, fp16 bits as hex]
         "read": [[0, 0], [0, 1]],            # the (channel, position) of each output element read
         "got": ["7c00", "77ff"],             # the bits read (fp16 as 4 hex digits), or null
         "error": null,                       # why nothing was read, or null
         "expected": {"m1": ["7c00", "77ff"], ...}}   # the bits each chip profile of anekit predicts
      ],
      "route": {"id": "conv-host-attention",  # the training route anekit.engine.training_routes chose,
                "why": "...",                 # or the string "unknown" (no such module, no chip)
                "evidence": ["maderix/ANE ...", ...]}
    }

A stage that was not reached is ``"not run"`` (an earlier stage failed). Construct ids, behaviour ids
and chip names are checked against the engine layer's tables; every malformed document gives one
``ReportError`` naming the file, the field path (``rungs[3].compile.outcome``) and what was expected. A
file over ``MAX_BYTES`` is refused before it is read.

Evidence (``Report.evidence()``), from a report of backend "ane" only (the simulator is not hardware:
a "sim" report gives none):

- a rung whose compile, load, run and comparison all went "ok": measured support for each of its
  constructs (chips = the report's generation, routes = ("direct",): the doctor drives the in-memory
  route, macos = the report's major);
- a rung that failed at a stage (compile, load, run, or numbers outside the simulator's tolerance):
  measured refutation (``refutes=True``) of the constructs it exercises that no rung of the same report
  ran — a failure is laid on what it tried that did not run elsewhere. When every construct of a failed
  rung ran in another rung, the failure is the combination's and counts against none of them (it stays
  in the report).

The source of each record is ``anekit doctor report <device> macOS <version> (<file name>)``.
``Report.numerics()`` gives the bits a Mac read per behaviour id (hardware reports only).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from anekit.engine.chips import GENERATIONS, UnknownChip, device
from anekit.engine.constructs import CONSTRUCTS
from anekit.engine.evidence import DIRECT, Evidence
from anekit.engine.numerics import BEHAVIOURS, CHIPS
from anekit.errors import AnekitError
from anekit.fileio import atomic_write
from anekit.inputs import read_bytes
from anekit.jsonio import loads

SCHEMA = "anekit-doctor-report"
VERSION = 1
MAX_BYTES = 4 << 20  # a report is tens of kB; refused above this before it is read
BACKENDS = ("ane", "sim")
OUTCOMES = ("ok", "failed", "not run")
STAGES = ("compile", "load", "run", "compare")
TOP_FIELDS = ("schema", "version", "anekit", "when", "chip", "macos", "backend", "rungs", "probes", "route")
HEX = re.compile(r"^[0-9a-f]{4}$")
WHEN = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
MACOS = re.compile(r"^\d{1,3}(\.\d{1,3}){0,2}$")
SHIPPED = Path(__file__).resolve().parent / "reports"  # the reports shipped with anekit (package data)
# The construct ids of the engine layer when schema version 1 was written (anekit.engine.constructs holds
# them, and any added since: a report may name every id that module knows).
VOCABULARY = (
    "conv.baked",
    "matmul.activations",
    "matmul.dynamic-weights",
    "softmax.scores",
    "rmsnorm.fused-before-matmuls",
    "rmsnorm.plain",
    "rmsnorm.peak-normalised",
    "rmsnorm.scale-repeated",
    "rope.swap-conv",
    "rope.slice-concat",
    "gate.silu",
    "gelu.tanh",
)


class ReportError(AnekitError, ValueError):
    """A doctor report that is not a version-1 report: the file, the field and what was expected."""

    def __str__(self) -> str:
        return str(self.args[0])


def construct_ids() -> tuple[str, ...]:
    """The construct ids a report may name: those of ``anekit.engine.constructs``."""
    return tuple(CONSTRUCTS)


# -- the records -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One stage of a rung: its outcome ("ok", "failed", "not run"), the error line, milliseconds."""

    outcome: str = "not run"
    error: str | None = None
    ms: float | None = None


@dataclass(frozen=True)
class Rung:
    """One program of the smoke ladder: the constructs it exercises and how each stage went."""

    name: str
    constructs: tuple[str, ...]
    compile: Stage = Stage()
    load: Stage = Stage()
    run: Stage = Stage()
    compare: Stage = Stage()

    @property
    def stages(self) -> tuple[tuple[str, Stage], ...]:
        return tuple((s, getattr(self, s)) for s in STAGES)

    @property
    def ran(self) -> bool:
        """Compiled, loaded, ran and matched the simulator."""
        return all(s.outcome == "ok" for _, s in self.stages)

    @property
    def failure(self) -> tuple[str, Stage] | None:
        """The first stage that failed, or None."""
        return next(((n, s) for n, s in self.stages if s.outcome == "failed"), None)


@dataclass(frozen=True)
class Tensor:
    """A probe's input: its shape and its nonzero elements as (channel, position, fp16 bits)."""

    shape: tuple[int, ...]
    nonzero: tuple[tuple[int, int, str], ...]


@dataclass(frozen=True)
class Probe:
    """One numeric probe: the behaviour it reads, its inputs, the bits read and what each profile says."""

    name: str
    id: str  # behaviour id of anekit.engine.numerics
    inputs: Mapping[str, Tensor]
    read: tuple[tuple[int, int], ...]
    got: tuple[str, ...] | None
    expected: Mapping[str, tuple[str, ...]]
    error: str | None = None

    def matches(self) -> tuple[str, ...]:
        """The chip profiles that predict the bits read."""
        return tuple(c for c, bits in self.expected.items() if self.got is not None and bits == self.got)


@dataclass(frozen=True)
class Route:
    """The training route the engine layer chose for the report's chip and macOS."""

    id: str
    why: str
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    """One first-contact report (the module docstring gives the schema)."""

    anekit: str
    when: str
    device: str | None
    generation: str | None
    macos: str
    macos_major: str
    backend: str
    rungs: tuple[Rung, ...]
    probes: tuple[Probe, ...]
    route: Route | None  # None: "unknown"
    file: str = field(default="", compare=False)  # the file name it was read from ("" when built)

    @property
    def hardware(self) -> bool:
        """Whether it was measured on the Neural Engine (backend "ane")."""
        return self.backend == "ane"

    def source(self) -> str:
        """``anekit doctor report m1-pro macOS 26.3 (report.json)``: the source of its evidence."""
        where = f" ({self.file})" if self.file else ""
        return f"anekit doctor report {self.device} macOS {self.macos}{where}"

    def evidence(self) -> dict[str, tuple[Evidence, ...]]:
        """Measured support and refutation per construct id (the module docstring); {} unless hardware."""
        if not self.hardware or self.generation is None:
            return {}
        ran = {c for r in self.rungs if r.ran for c in r.constructs}
        found: dict[str, list[Evidence]] = {}
        for rung in self.rungs:
            failure = rung.failure
            if rung.ran:
                ms = sum(s.ms or 0.0 for _, s in rung.stages)
                said = f"smoke rung '{rung.name}' compiled, loaded and ran as the simulator computes"
                said += f" ({ms:.3g} ms)"
                for c in rung.constructs:
                    found.setdefault(c, []).append(self._evidence(said, refutes=False))
            elif failure is not None:
                stage, s = failure
                said = f"smoke rung '{rung.name}' failed at {stage}: {s.error or 'no error line'}"
                for c in rung.constructs:
                    if c not in ran:
                        found.setdefault(c, []).append(self._evidence(said, refutes=True))
        return {c: tuple(e) for c, e in found.items()}

    def _evidence(self, observed: str, refutes: bool) -> Evidence:
        assert self.generation is not None
        return Evidence(
            self.source(), "measured", observed, (self.generation,), DIRECT, self.macos_major, refutes
        )

    def numerics(self) -> dict[str, tuple[Probe, ...]]:
        """The probes that read bits on the Neural Engine, per behaviour id; {} unless hardware."""
        if not self.hardware:
            return {}
        found: dict[str, list[Probe]] = {}
        for p in self.probes:
            if p.got is not None:
                found.setdefault(p.id, []).append(p)
        return {k: tuple(v) for k, v in found.items()}

    def to_json(self) -> dict[str, Any]:
        """The version-1 document (the module docstring)."""
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "anekit": self.anekit,
            "when": self.when,
            "chip": {"device": self.device, "generation": self.generation},
            "macos": {"version": self.macos, "major": self.macos_major},
            "backend": self.backend,
            "rungs": [
                {"name": r.name, "constructs": list(r.constructs), **{n: _stage_json(s) for n, s in r.stages}}
                for r in self.rungs
            ],
            "probes": [_probe_json(p) for p in self.probes],
            "route": "unknown"
            if self.route is None
            else {"id": self.route.id, "why": self.route.why, "evidence": list(self.route.evidence)},
        }


def _stage_json(s: Stage) -> dict[str, Any]:
    return {"outcome": s.outcome, "error": s.error, "ms": s.ms}


def _probe_json(p: Probe) -> dict[str, Any]:
    return {
        "name": p.name,
        "id": p.id,
        "inputs": {
            k: {"shape": list(t.shape), "nonzero": [list(e) for e in t.nonzero]} for k, t in p.inputs.items()
        },
        "read": [list(e) for e in p.read],
        "got": None if p.got is None else list(p.got),
        "error": p.error,
        "expected": {c: list(b) for c, b in p.expected.items()},
    }


# -- writing and reading -----------------------------------------------------------------------------------


def dumps(report: Report) -> bytes:
    """The report as the UTF-8 JSON text ``write_report`` writes."""
    return (json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n").encode("utf-8")


def write_report(path: str | Path, report: Report) -> None:
    """Write ``report`` to ``path`` atomically (the caller has refused paths it must not write)."""
    data = dumps(report)
    with atomic_write(path) as f:
        f.write(data)


def load_report(path: str | Path) -> Report:
    """The report in the file ``path``; ``ReportError`` (or the input checks' ``InputError``: not a
    regular file, over ``MAX_BYTES``) naming the file and the field otherwise."""
    what = f"[report] {path}"
    data = read_bytes(path, what, MAX_BYTES, "a doctor report (a JSON file)")
    doc = loads(data, what, max_bytes=MAX_BYTES)
    return from_json(doc, what, Path(path).name)


def from_json(doc: Any, what: str = "[report]", file: str = "") -> Report:
    """The report of the JSON value ``doc`` (``what`` prefixes every message, ``file`` names the file)."""
    r = _Reader(what)
    top = r.obj(doc, "", TOP_FIELDS)
    if top["schema"] != SCHEMA:
        r.fail("schema", f"'{SCHEMA}'", top["schema"])
    version = top["version"]
    if type(version) is not int or version != VERSION:
        r.fail("version", f"{VERSION} (the only version this anekit reads)", version)
    backend = r.choice(top["backend"], "backend", BACKENDS)
    chip = r.obj(top["chip"], "chip", ("device", "generation"))
    dev, gen = _chip(r, chip, backend)
    macos = r.obj(top["macos"], "macos", ("version", "major"))
    version_s, major = r.text(macos["version"], "macos.version"), r.text(macos["major"], "macos.major")
    if backend == "ane" or version_s or major:
        if not MACOS.match(version_s):
            r.fail("macos.version", "a macOS version such as '26.3'", version_s)
        if major != version_s.split(".")[0]:
            r.fail("macos.major", f"'{version_s.split('.')[0]}' (the first number of macos.version)", major)
    when = r.text(top["when"], "when")
    if not WHEN.match(when):
        r.fail("when", "a UTC time such as '2026-12-02T03:40:00Z'", when)
    known = construct_ids()
    rungs = tuple(_rung(r, x, f"rungs[{i}]", known) for i, x in enumerate(r.array(top["rungs"], "rungs")))
    probes = tuple(_probe(r, x, f"probes[{i}]") for i, x in enumerate(r.array(top["probes"], "probes")))
    return Report(
        anekit=r.text(top["anekit"], "anekit", empty=False),
        when=when,
        device=dev,
        generation=gen,
        macos=version_s,
        macos_major=major,
        backend=backend,
        rungs=rungs,
        probes=probes,
        route=_route(r, top["route"]),
        file=file,
    )


def _chip(r: _Reader, chip: dict[str, Any], backend: str) -> tuple[str | None, str | None]:
    dev, gen = chip["device"], chip["generation"]
    if dev is None and gen is None:  # a chip anekit does not know (or the simulator's "any"): no evidence
        return None, None
    dev = r.text(dev, "chip.device", empty=False)
    try:
        known = device(dev)
    except UnknownChip:
        r.fail("chip.device", "a device anekit.engine.chips knows (m1, m1-pro ... m5-max)", dev)
    if known.name != dev:
        r.fail("chip.device", f"its canonical name '{known.name}'", dev)
    gen = r.choice(gen, "chip.generation", GENERATIONS)
    if gen != known.generation:
        r.fail("chip.generation", f"'{known.generation}' (the generation of {dev})", gen)
    return dev, gen


def _rung(r: _Reader, x: Any, at: str, known: tuple[str, ...]) -> Rung:
    d = r.obj(x, at, ("name", "constructs", *STAGES))
    constructs = []
    for i, c in enumerate(r.array(d["constructs"], f"{at}.constructs")):
        constructs.append(r.choice(c, f"{at}.constructs[{i}]", known, "a construct id of anekit.engine"))
    stages = {s: _stage(r, d[s], f"{at}.{s}") for s in STAGES}
    seen_failure = False
    for s in STAGES:  # a stage after a failed or skipped one is not run; an "ok" one follows an "ok" one
        if seen_failure and stages[s].outcome != "not run":
            r.fail(f"{at}.{s}.outcome", "'not run' (an earlier stage did not go ok)", stages[s].outcome)
        seen_failure = seen_failure or stages[s].outcome != "ok"
    return Rung(r.text(d["name"], f"{at}.name", empty=False), tuple(constructs), **stages)


def _stage(r: _Reader, x: Any, at: str) -> Stage:
    d = r.obj(x, at, ("outcome", "error", "ms"))
    outcome = r.choice(d["outcome"], f"{at}.outcome", OUTCOMES)
    error = d["error"]
    if error is not None:
        error = r.text(error, f"{at}.error")
    if outcome == "failed" and error is None:
        r.fail(f"{at}.error", "the error line of the failed stage", None)
    ms = d["ms"]
    if ms is not None and (type(ms) not in (int, float) or not 0 <= ms < 1e9):
        r.fail(f"{at}.ms", "null or milliseconds (a number from 0)", ms)
    return Stage(outcome, error, None if ms is None else float(ms))


def _probe(r: _Reader, x: Any, at: str) -> Probe:
    d = r.obj(x, at, ("name", "id", "inputs", "read", "got", "error", "expected"))
    bid = r.choice(d["id"], f"{at}.id", tuple(BEHAVIOURS), "a behaviour id of anekit.engine.numerics")
    inputs = {}
    for name, t in r.obj(d["inputs"], f"{at}.inputs", None).items():
        inputs[name] = _tensor(r, t, f"{at}.inputs.{name}")
    read = tuple(_pair(r, e, f"{at}.read[{i}]") for i, e in enumerate(r.array(d["read"], f"{at}.read")))
    got = None if d["got"] is None else _bits(r, d["got"], f"{at}.got", len(read))
    error = None if d["error"] is None else r.text(d["error"], f"{at}.error")
    if got is None and error is None:
        r.fail(f"{at}.error", "why nothing was read (got is null)", None)
    expected = {}
    for chip, bits in r.obj(d["expected"], f"{at}.expected", None).items():
        r.choice(chip, f"{at}.expected key", CHIPS)
        expected[chip] = _bits(r, bits, f"{at}.expected.{chip}", len(read))
    return Probe(r.text(d["name"], f"{at}.name", empty=False), bid, inputs, read, got, expected, error)


def _tensor(r: _Reader, x: Any, at: str) -> Tensor:
    d = r.obj(x, at, ("shape", "nonzero"))
    shape = tuple(
        r.count(v, f"{at}.shape[{i}]", 1 << 20) for i, v in enumerate(r.array(d["shape"], f"{at}.shape"))
    )
    if len(shape) != 4:
        r.fail(f"{at}.shape", "4 dimensions [1, C, 1, S]", list(shape))
    nonzero = []
    for i, e in enumerate(r.array(d["nonzero"], f"{at}.nonzero")):
        e = r.array(e, f"{at}.nonzero[{i}]")
        if len(e) != 3:
            r.fail(f"{at}.nonzero[{i}]", "[channel, position, fp16 bits]", e)
        c, s = _pair(r, e[:2], f"{at}.nonzero[{i}]")
        if c >= shape[1] or s >= shape[3]:
            r.fail(f"{at}.nonzero[{i}]", f"a channel under {shape[1]} and a position under {shape[3]}", e)
        nonzero.append((c, s, _hex(r, e[2], f"{at}.nonzero[{i}][2]")))
    return Tensor(shape, tuple(nonzero))


def _pair(r: _Reader, x: Any, at: str) -> tuple[int, int]:
    e = r.array(x, at)
    if len(e) != 2:
        r.fail(at, "[channel, position]", e)
    return r.count(e[0], f"{at}[0]", 1 << 20), r.count(e[1], f"{at}[1]", 1 << 20)


def _bits(r: _Reader, x: Any, at: str, n: int) -> tuple[str, ...]:
    bits = tuple(_hex(r, b, f"{at}[{i}]") for i, b in enumerate(r.array(x, at)))
    if len(bits) != n:
        r.fail(at, f"{n} values (one per element read)", len(bits))
    return bits


def _hex(r: _Reader, x: Any, at: str) -> str:
    if not isinstance(x, str) or not HEX.match(x):
        r.fail(at, "fp16 bits as 4 lower-case hex digits ('3c00')", x)
    return str(x)


def _route(r: _Reader, x: Any) -> Route | None:
    if x == "unknown":
        return None
    if not isinstance(x, dict):
        r.fail("route", "'unknown' or an object {id, why, evidence}", x)
    d = r.obj(x, "route", ("id", "why", "evidence"))
    evidence = tuple(
        r.text(e, f"route.evidence[{i}]", empty=False)
        for i, e in enumerate(r.array(d["evidence"], "route.evidence"))
    )
    return Route(r.text(d["id"], "route.id", empty=False), r.text(d["why"], "route.why"), evidence)


class _Reader:
    """The field checks, each raising one ReportError naming the field and what was expected."""

    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, at: str, expected: str, got: Any) -> NoReturn:
        shown = repr(got)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        field_ = f"field '{at}'" if at else "the document"
        raise ReportError(f"{self.what}: {field_}: expected {expected}, got {shown}")

    def obj(self, x: Any, at: str, keys: tuple[str, ...] | None) -> dict[str, Any]:
        """``x`` as an object; with ``keys``, exactly those keys."""
        if not isinstance(x, dict):
            self.fail(at, "an object", _kind(x))
        if keys is not None:
            missing = [k for k in keys if k not in x]
            if missing:
                self.fail(_join(at, missing[0]), "a value (the field is required)", "nothing")
            extra = [k for k in x if k not in keys]
            if extra:
                self.fail(_join(at, str(extra[0])), f"no such field (known: {', '.join(keys)})", x[extra[0]])
        return x

    def array(self, x: Any, at: str) -> list[Any]:
        if not isinstance(x, list):
            self.fail(at, "an array", _kind(x))
        return x

    def text(self, x: Any, at: str, empty: bool = True) -> str:
        if not isinstance(x, str) or (not empty and not x.strip()):
            self.fail(at, "a string" if empty else "a non-empty string", x)
        if len(x) > 4096:
            self.fail(at, "at most 4096 characters", f"{len(x)} characters")
        return str(x)

    def count(self, x: Any, at: str, limit: int) -> int:
        if type(x) is not int or not 0 <= x < limit:
            self.fail(at, f"an integer from 0 to {limit - 1}", x)
        return int(x)

    def choice(self, x: Any, at: str, choices: tuple[str, ...], what: str = "") -> str:
        if not isinstance(x, str) or x not in choices:
            said = what or "one of"
            self.fail(at, f"{said} ({', '.join(choices)})" if what else f"one of {', '.join(choices)}", x)
        return str(x)


def _join(at: str, key: str) -> str:
    return f"{at}.{key}" if at else key


def _kind(x: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(x), "null" if x is None else f"a {type(x).__name__}"
    )


# -- the shipped reports -----------------------------------------------------------------------------------


def shipped_reports(folder: Path = SHIPPED) -> tuple[Report, ...]:
    """Every report shipped with anekit (``anekit/engine/reports/*.json``), by file name."""
    if not folder.is_dir():
        return ()
    return tuple(load_report(p) for p in sorted(folder.glob("*.json")))


def merge(reports: Iterable[Report]) -> dict[str, tuple[Evidence, ...]]:
    """The evidence of several reports per construct id, in the reports' order."""
    found: dict[str, list[Evidence]] = {}
    for rep in reports:
        for c, items in rep.evidence().items():
            found.setdefault(c, []).extend(items)
    return {c: tuple(e) for c, e in found.items()}


def shipped_evidence(folder: Path = SHIPPED) -> dict[str, tuple[Evidence, ...]]:
    """The evidence of every shipped report, merged per construct id ({} while none is shipped): what
    ``anekit.engine.training_routes.training_route(..., extra=...)`` takes."""
    return merge(shipped_reports(folder))
