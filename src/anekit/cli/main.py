"""Entry point of the ``anekit`` command: parses the subcommand and reports anekit errors cleanly.

Two kinds of error, each with its own form, and the ways a process is stopped:

- **Usage errors** (exit status 2, argparse's form: the usage, then ``anekit CMD: error: ...``): what
  the command line alone shows to be wrong — an unknown flag or command, a missing argument, a value
  that does not parse as its type, lies outside its range (the message names the range), is not one of
  a flag's fixed choices or names nothing in the table it is looked up in (``--config`` presets,
  ``--chip``, ``--route``: the message lists the known names; see ``anekit.cli.flags``). Nothing is
  read or written.
- **anekit errors** (exit status 1, one line on stderr: ``anekit: [where] what``): everything found
  after that — input files (``anekit.inputs``), output locations (``anekit.outputs``), flags that
  contradict each other or the input, the program or model itself. Outputs are left as they were.
- **the end of the process itself**, one line on stderr too: Ctrl-C at any moment, imports included
  (``anekit: interrupted``, exit status 130); a closed stdout (exit status 141, as SIGPIPE); a stdout that
  cannot be written, as on a full device (exit status 1). ``train`` handles its own signals first (it
  saves a checkpoint), then ends the same way.

Every command's ``--help`` opens with a description: its own, or else its one-line summary.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from typing import Any

from anekit import __version__
from anekit.errors import AnekitError

EXIT_INTERRUPTED = 128 + 2  # as a shell reports a process killed by SIGINT
EXIT_PIPE = 128 + 13  # as a shell reports a process killed by SIGPIPE (a closed stdout)


class _Subcommands(argparse._SubParsersAction):
    """Subcommands whose ``--help`` opens with their one-line summary when they have no description."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        summary = kwargs.get("help")
        if kwargs.get("description") is None and summary:
            kwargs["description"] = summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else ".")
        return super().add_parser(name, **kwargs)


class _Parser(argparse.ArgumentParser):
    """anekit's parsers: their subcommands (and theirs, which are ``_Parser`` too) are ``_Subcommands``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)


# Commands whose parser is built alone when the command line names them (``build_parser(only=...)``):
# ``anekit train`` then imports its own module, not every command's (cost_cmd and the tables it loads).
ALONE = ("train",)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``anekit`` parser; with ``only`` one of ``ALONE``, holding that subcommand alone (what its
    command line parses to, its errors and its --help are the same: argparse's subparsers are separate)."""
    # The commands (numpy and the rest) load here, not at import, so that a Ctrl-C while they load is
    # inside main's handler: one line and exit 130, never a traceback.
    if only in ALONE:
        from anekit.cli import train_cmd

        parser = _top_parser()
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        sub.required = True
        train_cmd.add_parser(sub)
        return parser
    from anekit.cli import (
        cost_cmd,
        demo,
        doctor_cmd,
        export_cmd,
        fuse_cmd,
        inspect_cmd,
        kernels_cmd,
        launch_cmd,
        lint_cmd,
        mil_cmd,
        run_cmd,
        sample_cmd,
        train_cmd,
    )

    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    train_cmd.add_parser(sub)
    launch_cmd.add_parser(sub)
    sample_cmd.add_parser(sub)
    mil_cmd.add_parser(sub)
    run_cmd.add_parser(sub)
    inspect_cmd.add_parser(sub)
    kernels_cmd.add_parser(sub)
    lint_cmd.add_parser(sub)
    export_cmd.add_parser(sub)
    fuse_cmd.add_parser(sub)
    cost_cmd.add_parser(sub)
    doctor_cmd.add_parser(sub)
    demo.add_parser(sub)
    return parser


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="anekit", description="Program the Apple Neural Engine directly.")
    parser.add_argument("--version", action="version", version=f"anekit {__version__}")
    return parser


# Commands whose BLAS work is sized by the model they run (anekit.threads): they choose BLAS's thread
# count themselves; the others' host-side matrices are small and run on one BLAS thread.
SIZED_BY_MODEL = ("train", "sample")


def _run(args: argparse.Namespace) -> int | None:
    from anekit.threads import blas_threads

    if args.command in SIZED_BY_MODEL:
        return args.run(args)
    with blas_threads(1):
        return args.run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every way it can end is one line on stderr and an exit status (module docstring):
    an anekit error 1, Ctrl-C 130 (``anekit: interrupted``), a closed stdout 141, a stdout that cannot be
    written (a full disk) 1. stdout is flushed here, inside the handlers, not at interpreter exit."""
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        _start_loading(words)
        parser = build_parser(only=words[0] if words else None)
        args = parser.parse_args(words)
        status = int(_run(args) or 0)
        sys.stdout.flush()
        return status
    except AnekitError as e:
        return _say(e.one_line(), 1)
    except KeyboardInterrupt:
        return _say("interrupted", EXIT_INTERRUPTED)
    except OSError as e:
        if e.errno == errno.EPIPE:
            _silence_stdout()
            return _say("standard output was closed", EXIT_PIPE)
        # Files are written through anekit.outputs.writing (an OutputError): a write failure that
        # reaches here unconverted is stdout's.
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            from anekit.outputs import reason

            _silence_stdout()
            return _say(f"cannot write to standard output: {reason(e)}", 1)
        raise


def _start_loading(words: list[str]) -> None:
    """A training run needs the compiled loops before its first step (``anekit.jit.preload``: numba's
    import and cache, about 0.45 s of one core): their thread starts here, before the command's own
    imports (about 0.35 s), rather than after them; and the C allocator is told to keep the memory the
    steps free (``anekit.pages.keep_freed_memory``) before anything large is made. Only for ``train``
    without ``--help``; neither decides anything, so a command line that turns out wrong loses nothing."""
    if words[:1] == ["train"] and not any(w in ("-h", "--help") for w in words):
        from anekit import jit, pages

        pages.keep_freed_memory()
        jit.preload_in_background()


def _say(message: str, status: int) -> int:
    with contextlib.suppress(OSError):  # stderr itself closed: the status still says it
        print(f"anekit: {message}", file=sys.stderr)
    return status


def _silence_stdout() -> None:
    """Point the real stdout at /dev/null, so the interpreter's own flush at exit does not fail again
    (with its "Exception ignored" text); a captured stdout (tests) is left alone."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass


def cli() -> None:
    """The ``anekit`` command: ``main``, then the process ends at once (``os._exit``). The interpreter's
    teardown (freeing a model's arrays, the compiled loops' and BLAS's state) costs about 0.3 s and does
    nothing anekit needs: every file anekit writes is complete (written aside, fsync'd, renamed) before
    ``main`` returns, and the streams are flushed here."""
    status = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stdout was main's to report
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    cli()
