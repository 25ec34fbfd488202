"""Drawing a run's loss.png in a helper process that imported matplotlib while the run trained.

Importing matplotlib costs about 0.3 to 0.5 s of one core, and drawing the figure another 0.1 s: for a short
run of a model such as stories15M that was a tenth of the whole command. A run's start-up (weights, kernel
compiles) is single-threaded, so the helper started beside it does that import on a core the run leaves
idle; at the end the run hands it the curve and writes its final checkpoint while the helper draws.

The helper is ``python -m anekit.llama.plot_helper``. It reads one JSON line on stdin
(``{"path", "losses", "title", "marks"}``), writes the PNG atomically through ``plot.write_loss_png`` and
answers one JSON line on stdout (``{"ok": true}``, or ``{"unavailable": reason}`` without matplotlib, or
``{"error": message}``). It ignores Ctrl-C (the run decides what a stop means) and leaves quietly when
stdin closes without a request: a run that stops early, or dies, never leaves it behind.

Whatever goes wrong with the helper itself (it could not start, died, answered nonsense or took longer
than ``ANSWER_SECONDS``), ``PlotHelper.draw`` draws in the run's own process instead: the picture never
depends on the helper, only its cost does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

ANSWER_SECONDS = 60.0  # far more than a drawing takes; past it the run draws the picture itself


class PlotHelper:
    """A started helper process; ``draw`` once, or ``close`` unused."""

    def __init__(self) -> None:
        import anekit

        # the helper imports this very anekit, wherever it was imported from (a checkout on sys.path too)
        root = str(Path(anekit.__file__).resolve().parents[1])
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=root if not path else root + os.pathsep + path)
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "anekit.llama.plot_helper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C goes to the run, which ends the helper itself
        )

    @classmethod
    def start(cls) -> PlotHelper | None:
        """A helper, or None where none can be started (the run then draws in its own process)."""
        try:
            return cls()
        except OSError:
            return None

    def draw(self, path: Path, losses: Sequence[float], title: str, marks: Sequence[tuple[int, str]]) -> None:
        """Write loss.png as ``plot.write_loss_png`` does (PlotUnavailable without matplotlib), through the
        helper when it answers, else in this process."""
        from anekit.llama.plot import PlotUnavailable, write_loss_png

        request = {"path": str(path), "losses": [float(x) for x in losses], "title": title,
                   "marks": [[int(step), str(kind)] for step, kind in marks]}  # fmt: skip
        answer = self._ask(json.dumps(request, allow_nan=True).encode() + b"\n")
        if answer is not None and answer.get("ok") is True:
            return
        if answer is not None and isinstance(answer.get("unavailable"), str):
            raise PlotUnavailable(answer["unavailable"])
        write_loss_png(path, losses, title, marks)  # the helper failed: the picture is drawn here

    def _ask(self, request: bytes) -> dict[str, Any] | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            out, _ = proc.communicate(request, timeout=ANSWER_SECONDS)
        except (OSError, subprocess.TimeoutExpired):
            _end(proc)
            return None
        try:
            answer = json.loads(out.decode("utf-8").strip().splitlines()[-1])
        except (UnicodeDecodeError, ValueError, IndexError):
            return None
        return answer if isinstance(answer, dict) else None

    def close(self) -> None:
        """End an unused helper (it leaves when its stdin closes)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """The helper's side: import, wait for the one request, draw, answer."""
    from anekit.errors import AnekitError
    from anekit.llama import plot

    with contextlib.suppress(plot.PlotUnavailable):  # said again, in the answer, if a picture is asked for
        plot.preload()
    line = stdin.readline()
    if not line.strip():
        return 0  # the run ended without asking
    try:
        req = json.loads(line)
        marks = [(int(step), str(kind)) for step, kind in req["marks"]]
        plot.write_loss_png(Path(req["path"]), [float(x) for x in req["losses"]], str(req["title"]), marks)
        answer: dict[str, Any] = {"ok": True}
    except plot.PlotUnavailable as e:
        answer = {"unavailable": str(e)}
    except (AnekitError, OSError, ValueError, KeyError, TypeError) as e:
        answer = {"error": str(e)}
    stdout.write(json.dumps(answer).encode() + b"\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(_serve(sys.stdin.buffer, sys.stdout.buffer))
