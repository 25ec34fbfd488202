"""What the macOS backend learned by trying: the option of each trial that compiled, per chip and macOS.

A trial (``anekit.engine.trials``) is a question the public record answers both ways — which MIL dialect
the in-memory compiler takes on an M1 is the first. The backend tries the options in the evidence's
order, falls back on ``CompilationFailed``, and records here the option that compiled and every attempt
before it, keyed by trial, chip and macOS version, so later processes start with what worked.
``anekit doctor`` reports the entries for this machine.

The memory is one JSON file in the per-user cache (``$ANEKIT_CACHE/trials.json``, see
``anekit.fileio.user_cache_dir``), written atomically. A file that cannot be read or is not the
expected JSON is ignored (the trial runs again, and rewrites it); ``ANEKIT_TRIALS=0`` turns the memory
off (every process tries afresh).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from anekit import jsonio
from anekit.errors import AnekitError
from anekit.fileio import user_cache_dir, write_bytes_atomic

FILE_NAME = "trials.json"
VERSION = 1
ENV = "ANEKIT_TRIALS"
MAX_BYTES = 1 << 20  # a memory file this large is not ours: ignored


@dataclass(frozen=True)
class Attempt:
    """One option tried, and why it failed ("" when it compiled)."""

    value: str
    error: str = ""


@dataclass(frozen=True)
class Outcome:
    """The option of ``trial`` that compiled on ``chip`` under ``macos``, and the attempts before it."""

    trial: str
    chip: str
    macos: str
    value: str
    attempts: tuple[Attempt, ...] = field(default_factory=tuple)
    when: float = 0.0

    @property
    def key(self) -> str:
        return key(self.trial, self.chip, self.macos)

    def line(self) -> str:
        failed = [f"{a.value} failed ({a.error})" for a in self.attempts if a.error]
        tried = f" after {'; '.join(failed)}" if failed else " (first try)"
        return f"{self.trial} on {self.chip} ({self.macos}): {self.value}{tried}"


def key(trial: str, chip: str, macos: str) -> str:
    return f"{trial}|{chip}|{macos}"


def default_path() -> Path:
    """The memory file: ``trials.json`` in the per-user cache."""
    return user_cache_dir() / FILE_NAME


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() not in ("0", "off", "no", "false")


class Memory:
    """The outcomes file; every method tolerates a missing or foreign file."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.problem: str | None = None  # why the file was ignored, for the doctor

    def _read(self) -> dict[str, Outcome]:
        self.problem = None
        try:
            if self.path.stat().st_size > MAX_BYTES:
                self.problem = f"{self.path}: larger than {MAX_BYTES} bytes, ignored"
                return {}
            doc = jsonio.loads(self.path.read_bytes(), str(self.path), max_bytes=MAX_BYTES)
        except FileNotFoundError:
            return {}
        except (OSError, AnekitError) as e:
            self.problem = f"{self.path}: unreadable ({type(e).__name__}), ignored"
            return {}
        try:
            if doc.get("version") != VERSION:
                raise TypeError(f"version {doc.get('version')!r}")
            out = {}
            for entry in doc["outcomes"]:
                attempts = tuple(Attempt(str(a["value"]), str(a.get("error", ""))) for a in entry["attempts"])
                o = Outcome(
                    str(entry["trial"]),
                    str(entry["chip"]),
                    str(entry["macos"]),
                    str(entry["value"]),
                    attempts,
                    float(entry.get("when", 0.0)),
                )
                out[o.key] = o
            return out
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            self.problem = f"{self.path}: not an anekit trials file ({e}), ignored"
            return {}

    def recall(self, trial: str, chip: str, macos: str) -> Outcome | None:
        """What compiled last time on this chip and macOS, or None."""
        if not enabled():
            return None
        return self._read().get(key(trial, chip, macos))

    def remember(self, outcome: Outcome) -> None:
        """Record ``outcome`` (replacing the one for its key); a file that cannot be written is skipped —
        the memory saves a compile, it is never worth failing a run for."""
        if not enabled():
            return
        outcomes = self._read()
        outcomes[outcome.key] = outcome
        doc = {"version": VERSION, "outcomes": [asdict(o) for o in outcomes.values()]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(self.path, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))
        except OSError as e:
            self.problem = f"{self.path}: not written ({e.strerror or type(e).__name__})"

    def entries(self) -> Iterator[Outcome]:
        yield from self._read().values()


def now() -> float:
    return time.time()
