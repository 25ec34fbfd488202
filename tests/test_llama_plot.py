"""The loss curve: a matplotlib figure with labelled axes, a title and the restarts marked; without
matplotlib no picture, one line saying why, and the CSV still written."""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

from anekit.cli.main import main
from anekit.llama.plot import PlotUnavailable, loss_figure, moving_average, write_loss_png


def test_moving_average_is_the_mean_of_the_last_values():
    values = np.array([4.0, 2.0, 6.0, 0.0])
    assert moving_average(values, 2).tolist() == [4.0, 3.0, 4.0, 3.0]
    assert moving_average(values, 10).tolist() == [4.0, 3.0, 4.0, 3.0]


def test_the_figure_has_labelled_axes_a_title_and_the_restarts(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (pip install 'anekit[plot]') is not installed")
    losses = list(np.linspace(6.0, 2.0, 30))
    fig = loss_figure(losses, "anekit train run 'out': default model", [(10, "budget"), (20, "resume")])
    (ax,) = fig.axes
    assert ax.get_xlabel() == "optimizer step" and "loss" in ax.get_ylabel()
    assert ax.get_title() == "anekit train run 'out': default model"
    marks = [line for line in ax.get_lines() if line.get_xdata()[0] in (10.5, 20.5)]
    assert len(marks) == 2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("compile-budget restart" in t for t in labels) and any("resumed" in t for t in labels)
    write_loss_png(tmp_path / "loss.png", losses, "t", [(10, "budget")])
    png = (tmp_path / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and struct.unpack(">II", png[16:24]) == (800, 450)


def test_without_matplotlib_there_is_one_line_and_the_csv(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` now fails
    with pytest.raises(PlotUnavailable, match=r"pip install -e '\.\[plot\]' in anekit's checkout"):
        write_loss_png(tmp_path / "x.png", [1.0], "t")
    monkeypatch.setenv("ANEKIT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "2", "--accum", "1", "--sample-steps", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "loss.png" in line] == [
        "no loss.png: matplotlib is not installed (pip install -e '.[plot]' in anekit's checkout)"
    ]
    assert (out / "loss.csv").read_text().count("\n") == 3 and not (out / "loss.png").exists()
