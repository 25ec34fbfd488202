"""Every example in README.md runs as written.

The examples are read from the README itself, so a new one is tested the day it is written:

- **blocks**: every ```sh statement and every ```python block, run in README order in one folder, as a
  reader following the README would (the export block reads the training block's ``out/``; the second
  Python block uses the first one's ``prog``). A plain block right after a sh block, introduced as what
  it prints, is compared with the last statement's output, timings masked.
- **inline examples**: every complete ``anekit ...`` command in the prose, each in a fresh folder holding
  the files the blocks wrote (``model.bin`` ...). A span with placeholders (``FILE``, ``[--json]``,
  ``...``) is a synopsis, not an example; a span that names a command or a flag without being a whole
  command line is listed in ``MENTIONS`` (and the test fails on one that is neither).

``anekit`` statements run in-process (``anekit.cli.main.main``) with the tokenizer cache in a temporary
folder; the rest (``cat <<EOF``, ``python -c``, pipes) run in bash with the venv's ``python`` and
``anekit`` first on PATH. The default training run is 400 steps (about 20 s): in-process, the default
model's run is shortened to ``STEPS`` steps; the command lines are the README's. The resume block's
Ctrl-C is sent as a real SIGINT at step ``STOP_AT``.

Not run: ``make run`` and ``make test`` (they create a virtual environment and install: ``make test`` is
what CI runs; ``make run``'s recipe is tests/test_cli_makefile.py, the ``anekit train`` it runs is the
inline example ``anekit train`` here).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from anekit.cli.main import build_parser, main
from anekit.llama import run as train_run

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent  # the venv's python and anekit, for the statements bash runs
STEPS = 6  # the default training run, in-process
STOP_AT = 3  # where the resume block's Ctrl-C stops it

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
# A synopsis, not an example: an upper-case placeholder (FILE, MODEL.mlpackage, NAME=FILE.npy), an optional
# part ([--json]), alternatives (a|b) or an ellipsis.
PLACEHOLDER = re.compile(r"(^|[\s=/])[A-Z][A-Z_]*\b|\[|\.\.\.|\w\|\w")
NOT_RUN = {  # statement -> why it is not run here
    "make run": "creates .venv and installs; its recipe: tests/test_cli_makefile.py, its run: `anekit train`",
    "make test": "creates .venv, installs, lints and runs the whole suite: what CI runs",
}
MENTIONS = {  # inline spans that name a command or a flag, not a whole command line
    "anekit",
    "anekit run",
    "anekit sample",
    "anekit kernels dump",
    "anekit run --chip m1",
    "anekit run --no-strict",
    "anekit run --chip m1 --route e5rt",
    "anekit export --check-residency",
    "anekit fuse",
}
STATUS = {"anekit train | head -1": 141}  # the README says so: a closed stdout stops the run, exit 141


@dataclass
class Example:
    """One example: a sh statement, a Python block or an inline command, and what must come of it."""

    line: int
    kind: str  # "sh", "python" or "inline"
    text: str
    status: int = 0
    interrupt: str = ""  # the README's message of a Ctrl-C after this statement (its "..." any text)
    prints: str = ""  # the output the README shows for it
    result: tuple[int, str, str] | None = field(default=None, repr=False)  # (status, stdout, stderr)

    @property
    def id(self) -> str:
        first = self.text.strip().splitlines()[0] if self.kind == "python" else self.text
        return f"L{self.line} {first[:70]}"


def _statements(body: str, line: int) -> Iterator[tuple[int, str, str]]:
    """(line, statement, the comment line after it) of a sh block: continuation lines joined, a heredoc
    kept whole with its command."""
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        start, text = i, lines[i]
        if not text.strip() or text.lstrip().startswith("#"):
            i += 1
            continue
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        heredoc = re.search(r"<<'?(\w+)'?", text)
        if heredoc:
            while i + 1 < len(lines) and lines[i].strip() != heredoc.group(1):
                i += 1
                text += "\n" + lines[i]
        i += 1
        after = lines[i].strip() if i < len(lines) and lines[i].lstrip().startswith("#") else ""
        yield line + start, text, after


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _parses(argv: list[str]) -> bool:
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit:
        return False
    return True


def read_examples() -> tuple[list[Example], list[Example], list[str], list[str]]:
    """(block examples in order, inline examples, synopses, spans that neither parse nor are MENTIONS)."""
    text = README.read_text(encoding="utf-8")
    blocks: list[Example] = []
    last_sh: Example | None = None  # the last sh statement, and where its block ends
    last_sh_end = 0
    for m in FENCE.finditer(text):
        lang, body, line = m.group(1), m.group(2), _line_of(text, m.start()) + 1
        if lang == "sh":
            for at, statement, after in _statements(body, line):
                if statement.split("#")[0].strip() in NOT_RUN:
                    continue
                example = Example(at, "sh", statement, status=STATUS.get(statement, 0))
                if "Ctrl-C" in after:
                    example.interrupt = after.split('"')[1]
                    example.status = 128 + signal.SIGINT
                blocks.append(example)
                last_sh = example
        elif lang == "python":
            blocks.append(Example(line, "python", body))
            last_sh = None
        elif lang == "" and last_sh is not None and "prints" in text[last_sh_end : m.start()]:
            last_sh.prints = body
        last_sh_end = m.end()
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    inline: dict[str, Example] = {}
    synopses, unknown = [], []
    for m in INLINE.finditer(prose):
        span = " ".join(m.group(1).split())
        if span.split(" ")[0] != "anekit":
            continue
        if PLACEHOLDER.search(span.removesuffix(" | head -1")):
            synopses.append(span)
        elif span in MENTIONS:
            continue
        elif span in STATUS or _parses(shlex.split(span)[1:]):
            inline.setdefault(span, Example(_line_of(prose, m.start()), "inline", span, STATUS.get(span, 0)))
        else:
            unknown.append(span)
    return blocks, list(inline.values()), synopses, unknown


BLOCKS, INLINE_EXAMPLES, SYNOPSES, UNKNOWN = read_examples()


def test_every_anekit_span_is_an_example_a_synopsis_or_a_mention() -> None:
    assert not UNKNOWN, (
        f"README spans that are neither a whole command line nor listed in MENTIONS: {UNKNOWN}"
    )
    assert len(BLOCKS) >= 8 and len(INLINE_EXAMPLES) >= 10 and len(SYNOPSES) >= 8


# --- running ----------------------------------------------------------------------------------------


def _shortened_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_run, "DEFAULT_STEPS", {"default": STEPS})


def _interrupting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next training run gets a real SIGINT after step STOP_AT, as a Ctrl-C would send it."""
    from anekit.llama import trainer

    real = trainer.train

    def train(*args, on_step=None, **kwargs):  # type: ignore[no-untyped-def]
        def step(report):  # type: ignore[no-untyped-def]
            on_step(report)
            if report.step == STOP_AT:
                signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(trainer, "train", real)
        return real(*args, on_step=step, **kwargs)

    monkeypatch.setattr(trainer, "train", train)


def _run(example: Example, folder: Path, namespace: dict) -> tuple[int, str, str]:
    """Run one example in ``folder``: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv = shlex.split(example.text, comments=True)
    in_process = argv[0] == "anekit" and not re.search(r"[|<>;&$]", example.text.split("#")[0])
    if example.kind == "python":
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(example.text, f"{README}:{example.line}", "exec"), namespace)
        return 0, out.getvalue(), err.getvalue()
    if not in_process:
        env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run(
            ["bash", "-o", "pipefail", "-c", example.text],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return proc.returncode, proc.stdout, proc.stderr
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv[1:])
        except SystemExit as e:  # argparse's usage error
            status = e.code if isinstance(e.code, int) else 1
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs every block example in README order in one folder (recording each result) and returns it."""
    folder = tmp_path_factory.mktemp("readme")
    cache = tmp_path_factory.mktemp("cache")
    namespace: dict = {"__name__": "__readme__"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANEKIT_CACHE", str(cache))
        mp.chdir(folder)
        _shortened_training(mp)
        for example in BLOCKS:
            if example.interrupt:
                _interrupting(mp)
            try:
                example.result = _run(example, folder, namespace)
            except Exception as e:  # a Python block that raises: its test says so
                example.result = (1, "", f"{type(e).__name__}: {e}")
    return folder


def _check(example: Example) -> None:
    assert example.result is not None
    status, out, err = example.result
    said = f"README.md:{example.line}: {example.text}\nexit {status}\nstdout: {out[-3000:]}\nstderr: {err[-3000:]}"
    assert "Traceback" not in err, said
    assert status == example.status, said
    if example.interrupt:
        pattern = ".*".join(re.escape(part) for part in re.split(r"\d+|\.\.\.", example.interrupt))
        assert re.fullmatch(pattern, err.strip()), said
    if example.prints:
        assert _masked(out) == _masked(example.prints), said


def _masked(text: str) -> str:
    """Output with its timings masked (they differ from run to run)."""
    return re.sub(r"[\d.]+ (ms|s)\b", r"N \1", text).strip()


@pytest.mark.parametrize("example", BLOCKS, ids=[e.id for e in BLOCKS])
def test_a_block_example_runs_as_written(example: Example, ran: Path) -> None:
    if example.kind == "python" and "anekit.coreml" in example.text:
        pytest.importorskip("coremltools", reason="CoreML packages need the coreml extra")
    _check(example)


@pytest.mark.parametrize("example", INLINE_EXAMPLES, ids=[e.id for e in INLINE_EXAMPLES])
def test_an_inline_example_runs_as_written(example: Example, ran: Path, tmp_path: Path, monkeypatch) -> None:
    for path in ran.iterdir():  # the files the blocks wrote; not their output folders
        if path.is_file():
            shutil.copy(path, tmp_path / path.name)
    monkeypatch.setenv("ANEKIT_CACHE", str(ran.parent / "cache"))
    monkeypatch.chdir(tmp_path)
    _shortened_training(monkeypatch)
    example.result = _run(example, tmp_path, {})
    _check(example)
