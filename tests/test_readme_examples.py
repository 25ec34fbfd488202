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

- **each Python block on its own**: in a fresh ``python`` (after the Python blocks before it, whose names it
  uses, as one session following the README has them), in a copy of the folder the blocks wrote, twice:
  the second run meets the first one's outputs.
- **every Python call the prose shows** (``runtime.open(...)``, ``anekit.coreml.predict(...)``) names a
  callable; off macOS the macOS-only ``predict`` refuses in one anekit line.
- **every ``anekit`` command line** of the blocks and the prose: its command's ``--help`` works, each flag
  it uses is one of that command's, and the whole line parses.

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
from anekit.training import blzt as train_run

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
    from anekit.training import loop as trainer

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
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _no_reexec(example):
        try:
            status = main(argv[1:])
        except SystemExit as e:  # argparse's usage error
            status = e.code if isinstance(e.code, int) else 1
    return status, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _no_reexec(example: Example) -> Iterator[None]:
    """An in-process example must not re-execute itself (a training run out of compile budget does):
    ``os.execv`` would replace the test process, which then exits 0 with the rest of the suite unrun."""
    real = os.execv

    def refuse(*args: object) -> None:
        raise AssertionError(f"README line {example.line}: '{example.text}' re-executed itself (os.execv)")

    os.execv = refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        os.execv = real


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


# --- each Python block on its own, twice; every Python name shown; every command's flags ------------------

PYTHON_BLOCKS = [e for e in BLOCKS if e.kind == "python"]


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)), ids=[e.id for e in PYTHON_BLOCKS])
def test_a_python_block_runs_twice_in_a_fresh_process(index: int, ran: Path, tmp_path: Path) -> None:
    """The block, after the Python blocks before it (the names they define, as one Python session following
    the README has them), in a fresh ``python`` in a copy of the folder the sh blocks wrote, run twice: a
    second run finds the outputs of the first and must not fail on them."""
    if any("anekit.coreml" in e.text for e in PYTHON_BLOCKS[: index + 1]):
        pytest.importorskip("coremltools", reason="CoreML packages need the coreml extra")
    folder = tmp_path / "readme"
    shutil.copytree(ran, folder, symlinks=True)
    script = "\n\n".join(e.text for e in PYTHON_BLOCKS[: index + 1])
    env = {**os.environ, "ANEKIT_CACHE": str(ran.parent / "cache"), "PYTHONPATH": str(ROOT / "src")}
    for attempt in (1, 2):
        proc = subprocess.run(
            [sys.executable, "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=300
        )
        said = f"README.md:{PYTHON_BLOCKS[index].line}, run {attempt}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, said


# `name(` inside a backticked span of the prose: a Python call the README shows.
PY_CALL = re.compile(r"\b((?:anekit\.)?(?:mil|runtime|coreml|engine|rules|llama|hf)(?:\.\w+)+|anekit\.\w+)\(")


def _resolve(name: str) -> object:
    """The object a dotted README name means (``runtime.open`` is ``anekit.runtime.open``)."""
    import importlib

    obj: object = importlib.import_module("anekit")
    path = "anekit"
    for part in name.removeprefix("anekit.").split("."):
        path += "." + part
        obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(path)
    return obj


def _python_calls() -> list[str]:
    text = FENCE.sub("", README.read_text(encoding="utf-8"))
    names = {m.group(1) for span in INLINE.findall(text) for m in PY_CALL.finditer(span)}
    return sorted(names)


PY_CALLS = _python_calls()


def test_the_readme_shows_python_calls() -> None:
    assert {"runtime.open", "mil.to_text", "anekit.train", "anekit.coreml.predict"} <= set(PY_CALLS), PY_CALLS


@pytest.mark.parametrize("name", PY_CALLS)
def test_every_python_name_the_readme_calls_is_callable(name: str) -> None:
    if name == "anekit.coreml.predict":
        pytest.importorskip("coremltools", reason="CoreML packages need the coreml extra")
    assert callable(_resolve(name)), f"README shows {name}(...), which is {type(_resolve(name)).__name__}"


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS only: the call's one-line refusal")
def test_the_macos_only_predict_says_not_on_mac_in_one_line(tmp_path: Path) -> None:
    from anekit.errors import AnekitError

    pytest.importorskip("coremltools", reason="CoreML packages need the coreml extra")
    predict = _resolve("anekit.coreml.predict")
    with pytest.raises(AnekitError) as info:
        predict(tmp_path / "model.mlpackage", {}, compute_units="cpu_and_ne")  # type: ignore[operator]
    assert "\n" not in info.value.one_line()


def _anekit_commands() -> list[tuple[int, str]]:
    """(line, command) of every ``anekit`` statement of the sh blocks (pipes and comments cut) and of the
    whole command lines of the prose."""
    found = []
    for e in BLOCKS:
        if e.kind == "sh":
            for part in re.split(r"[|;&]", e.text.split(" #")[0].split("<<")[0]):
                if part.strip().startswith("anekit "):
                    found.append((e.line, part.strip()))
    return found + [(e.line, e.text.removesuffix(" | head -1")) for e in INLINE_EXAMPLES]


ANEKIT_COMMANDS = _anekit_commands()


def _subcommand(argv: list[str]) -> list[str]:
    """The command words of argv (``kernels dump``, ``mil check``: commands with their own subcommands)."""
    return argv[:2] if argv[0] in ("kernels", "mil") else argv[:1]


@pytest.mark.parametrize(
    ("line", "command"), ANEKIT_COMMANDS, ids=[f"L{n} {c[:60]}" for n, c in ANEKIT_COMMANDS]
)
def test_every_anekit_command_of_the_readme_parses_and_its_flags_exist(line: int, command: str) -> None:
    argv = shlex.split(command, comments=True)[1:]
    words = _subcommand(argv)
    with contextlib.redirect_stdout(io.StringIO()) as help_text, pytest.raises(SystemExit) as done:
        build_parser().parse_args([*words, "--help"])
    assert done.value.code == 0, f"README.md:{line}: anekit {' '.join(words)} --help"
    for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", help_text.getvalue()), (
            f"README.md:{line}: {flag} is not a flag of anekit {' '.join(words)}"
        )
    assert _parses(argv), f"README.md:{line}: {command} does not parse"


def test_the_quickstart_says_how_to_put_the_venv_on_the_path() -> None:
    """Every command after the two Quickstart ones runs with the venv's ``anekit`` and ``python``."""
    text = README.read_text(encoding="utf-8")
    quickstart = text[text.index("## Quickstart") : text.index("### Resuming a run")]
    assert "`. .venv/bin/activate`" in quickstart
    assert (ROOT / "Makefile").read_text().count("VENV ?= .venv") == 1  # the venv the sentence names
    assert "pip install anekit[" not in text  # anekit installs from its checkout: pip install -e '.[x]'
