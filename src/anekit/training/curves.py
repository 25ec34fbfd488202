"""A run's loss curves: loss.csv (with a val_loss column when validated) and loss.png, staged aside.

They are made aside and put in place only once the checkpoint holding their losses is written
(``StagedCurves.commit``), so the curve is never ahead of the checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from anekit.fileio import temporary_name, write_bytes_atomic
from anekit.outputs import writing


def curves_csv(losses: list[float], val_losses: dict[int, float] | None = None) -> bytes:
    """loss.csv's bytes: ``step,loss``, with a ``val_loss`` column (empty where not evaluated) when
    ``val_losses`` is given."""
    if val_losses is None:
        rows = "".join(f"{i + 1},{loss:.6f}\n" for i, loss in enumerate(losses))
        return ("step,loss\n" + rows).encode()
    at = {int(k): v for k, v in val_losses.items()}
    rows = "".join(
        f"{i},{'' if i == 0 else f'{losses[i - 1]:.6f}'},{f'{at[i]:.6f}' if i in at else ''}\n"
        for i in range(len(losses) + 1)
        if i > 0 or 0 in at
    )
    return ("step,loss,val_loss\n" + rows).encode()


class StagedCurves:
    """loss.csv and loss.png of some losses, made aside (the picture drawn into a temporary beside
    loss.png, through ``painter`` when given) and put in place only by ``commit``: a run commits them once
    the checkpoint holding those losses is written, so the curve is never ahead of the checkpoint.
    ``no_png`` is the one line saying why there is no picture (matplotlib missing), else None."""

    def __init__(self, out: Path, losses: list[float], title: str, marks: list[tuple[int, str]],
                 draw: bool = True, val_losses: dict[int, float] | None = None,
                 painter: Any = None) -> None:  # fmt: skip
        from anekit.llama.plot import PlotUnavailable, write_loss_png

        self.out, self.csv = out, curves_csv(losses, val_losses)
        self.no_png: str | None = None
        self.picture: Path | None = None
        if not draw or not losses:
            return
        tmp = temporary_name(out / "loss.png")
        try:
            with writing(out / "loss.png", "[train]"):
                (write_loss_png if painter is None else painter.draw)(tmp, losses, title, marks)
        except PlotUnavailable as e:
            self.no_png = str(e).removeprefix("[plot] ")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        else:
            self.picture = tmp

    def commit(self) -> None:
        """loss.png, then loss.csv: a loss.csv that matches the checkpoint says both are in place."""
        if self.picture is not None:
            with writing(self.out / "loss.png", "[train]"):
                os.replace(self.picture, self.out / "loss.png")
            self.picture = None
        with writing(self.out / "loss.csv", "[train]"):
            write_bytes_atomic(self.out / "loss.csv", self.csv)

    def discard(self) -> None:
        if self.picture is not None:
            self.picture.unlink(missing_ok=True)
            self.picture = None


def write_curves(out: Path, losses: list[float], title: str, marks: list[tuple[int, str]], draw: bool = True,
                 val_losses: dict[int, float] | None = None, painter: Any = None) -> str | None:  # fmt: skip
    """loss.csv always, loss.png when ``draw`` (``StagedCurves``, committed at once). Returns the one line
    saying why there is no picture, or None when it was drawn (or not asked for)."""
    staged = StagedCurves(out, losses, title, marks, draw, val_losses, painter)
    try:
        staged.commit()
    finally:
        staged.discard()
    return staged.no_png
