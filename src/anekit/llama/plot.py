"""The loss-curve picture of a training run, drawn with matplotlib (the optional ``anekit[plot]`` extra).

Without matplotlib there is no picture: ``write_loss_png`` raises ``PlotUnavailable`` saying why, and
``anekit train`` prints that one line and keeps the CSV, which always holds the whole curve. (anekit
once drew the PNG itself with numpy; that writer had no axis names, title or legend and was dropped
rather than kept as a second, lesser fallback.)
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from anekit.errors import AnekitError, install_hint
from anekit.fileio import write_bytes_atomic

INSTALL_HINT = install_hint("plot")

# How each kind of restart is drawn: (legend label, line colour, line style).
MARK_STYLES = {
    "budget": ("compile-budget restart (fresh process)", "tab:orange", "--"),
    "resume": ("resumed (--resume after a stop)", "tab:red", ":"),
}


class PlotUnavailable(AnekitError):
    """No picture can be drawn here (matplotlib is missing); the message says why, in one line."""


def _matplotlib() -> tuple[Any, Any]:
    """(Figure, FigureCanvasAgg): the object API, no pyplot and no global backend switch."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotUnavailable(f"[plot] no loss.png: matplotlib is not installed ({INSTALL_HINT})") from e
    return Figure, FigureCanvasAgg


def preload() -> None:
    """Import what drawing needs, ahead of the drawing (``anekit.llama.plot_helper``); PlotUnavailable
    without matplotlib."""
    _matplotlib()


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each point (fewer at the start): (n,) -> (n,)."""
    csum = np.cumsum(np.concatenate([[0.0], values]))  # (n + 1,)
    idx = np.arange(1, len(values) + 1)  # (n,)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)


def loss_figure(losses: Sequence[float], title: str, marks: Sequence[tuple[int, str]] = ()) -> Any:
    """The figure: the loss of every optimizer step (x: step 1..n), its 10-step moving average, and a
    vertical line after each step at which the run restarted (``marks``: (step, kind), kind one of
    ``MARK_STYLES``). Returns a matplotlib ``Figure`` (for tests to look at); raises PlotUnavailable."""
    Figure, FigureCanvasAgg = _matplotlib()
    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    y = np.asarray(losses, dtype=np.float64)  # (n,)
    x = np.arange(1, len(y) + 1)  # (n,) optimizer steps
    ax.plot(x, y, color="tab:blue", linewidth=0.8, alpha=0.45, label="loss of the step")
    if len(y) >= 10:
        ax.plot(x, moving_average(y, 10), color="tab:blue", linewidth=1.8, label="mean of the last 10 steps")
    seen: set[str] = set()
    for step, kind in marks:
        label, colour, style = MARK_STYLES.get(kind, (kind, "tab:gray", "-."))
        ax.axvline(
            step + 0.5, color=colour, linestyle=style, linewidth=1.2, label=None if kind in seen else label
        )
        seen.add(kind)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (cross-entropy, nats per token)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if len(y):
        ax.set_xlim(0.5, max(len(y), 1) + 0.5)
    ax.legend(loc="upper right", fontsize="small")
    return fig


def write_loss_png(
    path: str | os.PathLike[str], losses: Sequence[float], title: str, marks: Sequence[tuple[int, str]] = ()
) -> None:
    """Draw ``loss_figure`` and write it as a PNG, atomically; PlotUnavailable without matplotlib."""
    fig = loss_figure(losses, title, marks)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_bytes_atomic(path, buf.getvalue())
