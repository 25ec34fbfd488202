"""Behaviours of the rule book, the cost model, the writers and the sampler whose one-line breakage the rest
of the suite let through, each stated against its source (tests/test_planted_bugs.py has the numerics):

- the M4's conv kernel-width extent, at its limit and one over (sbryngelson/ane-guide part-3-performance/
  12-cross-chip.md: the fp16 kernel width goes from 13 to 15 at A16; appendices/a-op-device-matrix.md
  'Per-chip numeric limits': 32 in the default format from A14);
- the limit a finding names on chip ``any``: the smallest of the chips' (the README's extent rows);
- a spill's DRAM traffic in the cost model: written out and read back, at the slower of the engine's
  streaming rate and the DRAM bandwidth (``anekit.cost.model``'s formula, the figures' published values);
- the fit uses the ``fit`` rows only: held-out rows that disagree wildly do not move it;
- export and fuse check OUT again once their lock is held;
- top-p as llama2.c's run.c ``sample_topp``: the running sum must *exceed* topp (``cumulative_prob >
  topp``), so a sum exactly equal to topp takes one more token.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from anekit import mil
from anekit.cli.main import main
from anekit.cost import Params, chip, count, fit, predicted
from anekit.cost.calibration import FIT, PUBLISHED
from anekit.cost.model import terms
from anekit.cost.workloads import conv_program
from anekit.fileio import DirLock
from anekit.llama.sample import sample_topp
from anekit.mil import tensor
from anekit.rules import check_program

# -- 5, 6. the conv kernel-width extent on the M4, and the limit a finding names on "any" -----------------

# The published limits (the README's extent.conv-kernel-width and extent.spatial rows, with their sources):
FP16_KERNEL_WIDTH = {"m1": 13, "m2": 16, "m3": 16, "m4": 15, "m5": 15}  # M1, M5 measured; M4 predicted
KERNEL_WIDTH = {"m1": 29, "m2": 32, "m3": 32, "m4": 32, "m5": 32}  # the decompiled table (A13: 29)
SPATIAL = {"m1": 16384, "m2": 16384, "m3": 16384, "m4": 65536, "m5": 65536}


def _named_limit(message: str) -> int:
    """The limit a finding's message names: its "(> N)"."""
    found = re.findall(r"\(> (\d+)\)", message)
    assert len(found) == 1, message
    return int(found[0])


def _conv(width: int, dtype: str, chip_name: str):
    xt = tensor(dtype, [1, 64, 1, 64])
    w = np.zeros((16, 64, 1, width), np.float16 if dtype == "fp16" else np.float32)
    prog = mil.program(inputs={"x": xt})(lambda f, x: f.conv(x=x, weight=f.const(w)))
    return [f for f in check_program(prog, chip_name) if f.rule.id == "extent.conv-kernel-width"]


@pytest.mark.parametrize("dtype, limits", [("fp16", FP16_KERNEL_WIDTH), ("fp32", KERNEL_WIDTH)])
def test_m4_conv_kernel_width_passes_at_its_limit_and_is_refused_one_over(dtype, limits):
    """ane-guide chapter 12: the M4 takes the A16 limits, an fp16 kernel width of 15 (32 in the default
    format): the limit compiles, one more is an error on the M4."""
    at = limits["m4"]
    assert _conv(at, dtype, "m4") == []
    over = _conv(at + 1, dtype, "m4")
    assert [f.severity for f in over] == ["error"]
    assert f"kernel width {at + 1} (" in over[0].message and _named_limit(over[0].message) == at


@pytest.mark.parametrize("dtype, limits", [("fp16", FP16_KERNEL_WIDTH), ("fp32", KERNEL_WIDTH)])
def test_the_limit_named_on_any_is_the_smallest_of_the_chips(dtype, limits):
    """On ``any`` a finding names the conservative limit: the smallest of m1 ... m5 (13 for an fp16
    kernel, 29 in the default format), whichever chips the width breaks."""
    smallest = min(limits.values())
    for width in (smallest + 1, max(limits.values()) + 1):
        found = _conv(width, dtype, "any")
        assert len(found) == 1 and _named_limit(found[0].message) == smallest, found
    spatial = mil.program(inputs={"x": tensor("fp16", [1, 64, 1, 16385])})(lambda f, x: f.relu(x=x))
    found = [f for f in check_program(spatial, "any", route="e5rt") if f.rule.id == "extent.spatial"]
    assert found and all(_named_limit(f.message) == min(SPATIAL.values()) for f in found)
    for name, limit in SPATIAL.items():  # and each chip names its own
        on_chip = [f for f in check_program(spatial, name, route="e5rt") if f.rule.id == "extent.spatial"]
        assert all(_named_limit(f.message) == limit for f in on_chip) and bool(on_chip) == (limit < 16385)


# -- 7. a spill's DRAM passes --------------------------------------------------------------------------

# Published figures (anekit.engine.performance's sources): the M1's on-chip working set is 2 MB (ane-guide
# part-3-performance/09-roofline.md), its engine streams at 60.87 GB/s (Anemll's llama_lm_head bench) and
# its DRAM is 68 GB/s (Anemll's system memory figure); the M4's working set 32 MB (maderix/ANE PR #25).
M1_STREAM_GBS, M1_DRAM_GBS, M1_WORKING_SET = 60.87, 68.0, 2 * 2**20


def test_a_spilled_intermediate_is_written_out_and_read_back_at_the_slower_rate() -> None:
    """cost.model: an intermediate as large as the working set is written to DRAM and read back (two
    passes), at min(DRAM bandwidth, streaming rate): 2 x bytes / rate."""
    big = count(conv_program(512, 4096, 2))  # one [1, 512, 1, 4096] fp16 intermediate: 4 MiB
    spilled = 512 * 4096 * 2
    assert spilled >= M1_WORKING_SET
    want_ms = 2 * spilled / (min(M1_STREAM_GBS, M1_DRAM_GBS) * 1e9) * 1e3
    assert terms(big, chip("m1")).spills == pytest.approx(want_ms, rel=1e-12)
    exact = count(conv_program(512, 2048, 2))  # exactly 2 MiB: "at a batch where the activation is
    want_ms = 2 * M1_WORKING_SET / (M1_STREAM_GBS * 1e9) * 1e3  # exactly 2 MB ... moved DRAM" (09-roofline)
    assert terms(exact, chip("m1")).spills == pytest.approx(want_ms, rel=1e-12)
    assert terms(count(conv_program(512, 2047, 2)), chip("m1")).spills == 0  # under it: on chip
    assert terms(big, chip("m4")).spills == 0  # 4 MiB under the M4's 32 MB


# -- 8. the fit uses the fit rows only -----------------------------------------------------------------


def test_the_fit_ignores_held_out_rows_that_disagree() -> None:
    """Times made from known parameters on the ``fit`` rows (the minimum of the squared log error is then
    zero, at those parameters), and times 20 times slower on every other row: the fit must give back the
    known parameters. Relabelled as fit rows, the slow rows do move the fit (the test can tell)."""
    known = Params(0.7, 0.4, 0.6)

    def measured(m):
        return predicted(m, known) * (1.0 if m.role == FIT else 20.0)

    recovered = fit(measured=measured)
    for a, b in zip(dataclasses.astuple(recovered), dataclasses.astuple(known)):
        assert a == pytest.approx(b, rel=1e-3)
    everything = [dataclasses.replace(m, role=FIT) for m in PUBLISHED]
    moved = fit(everything, measured=lambda m: measured(next(p for p in PUBLISHED if p.id == m.id)))
    assert any(abs(a / b - 1) > 0.05 for a, b in zip(dataclasses.astuple(moved), dataclasses.astuple(known)))


# -- 9. export and fuse check OUT again once the lock is held -------------------------------------------


def _appears_under_the_lock(monkeypatch, out, files: dict[str, str]) -> None:
    """Make OUT appear, holding ``files``, just before this process gets the lock (another writer finished
    in between)."""
    real = DirLock.acquire

    def acquire(self):
        out.mkdir(exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
        return real(self)

    monkeypatch.setattr(DirLock, "acquire", acquire)


@pytest.fixture
def tiny_hf(tmp_path):
    from tests.hf_fixtures import make_checkpoint, make_tokenizer, small

    model = tmp_path / "hf"
    make_tokenizer(model, 512, "llama3")
    make_checkpoint(model, small("tiny_llama2c", num_hidden_layers=1), dtype="float32", seed=1)
    return model


@pytest.mark.parametrize("force", (False, True))
def test_export_checks_out_again_once_the_lock_is_held(tmp_path, capsys, monkeypatch, tiny_hf, force):
    """Without --force a previous export that appeared meanwhile is kept; with --force a directory that
    appeared meanwhile and is not an export (the user's) is kept: one line, exit 1, its bytes unchanged."""
    out = tmp_path / "st"
    files = {"config.json": "{}", "model.safetensors": "theirs"} if not force else {"notes.txt": "mine"}
    _appears_under_the_lock(monkeypatch, out, files)
    argv = ["export", str(tiny_hf), str(out), "--to", "safetensors"] + (["--force"] if force else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anekit: [export] OUT"), err
    assert ("exists (use --force" in err) if not force else ("not a previous safetensors export" in err)
    assert {p.name: p.read_text() for p in out.iterdir()} == files


@pytest.mark.parametrize("force", (False, True))
def test_package_export_checks_out_again_once_the_lock_is_held(tmp_path, capsys, monkeypatch, force):
    """The same for --to mlpackage: with --force, a directory that is not an export is never replaced."""
    from anekit.kernels.config import ModelConfig
    from anekit.llama.llama2c import write_llama2c
    from anekit.llama.params import Params as ModelParams

    model, out = tmp_path / "tiny.bin", tmp_path / "m.mlpackage"
    write_llama2c(model, ModelParams.init(ModelConfig(32, 48, 2, 4, 2, 512, 16, name="tiny"), seed=1))
    files = {"notes.txt": "mine"}
    _appears_under_the_lock(monkeypatch, out, files)
    argv = ["export", str(model), "--to", "mlpackage", str(out)] + (["--force"] if force else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anekit: [export] "), err
    assert ("exists (use --force" in err) if not force else ("not a previous export" in err), err
    assert {p.name: p.read_text() for p in out.iterdir()} == files


@pytest.mark.parametrize("force", (False, True))
def test_fuse_checks_out_again_once_the_lock_is_held(tmp_path, capsys, monkeypatch, tiny_hf, force):
    """A fused model that appeared meanwhile is kept without --force; a directory that is not a model is
    kept even with it: one line, exit 1, nothing written into OUT."""
    from anekit.hf.adapters import Adapters, LoraSpec, write_adapters
    from anekit.hf.model import load_model

    cfg = load_model(tiny_hf).cfg
    adapters = tmp_path / "ad"
    write_adapters(adapters, Adapters.init(LoraSpec(2, 4.0, ("q", "v")), cfg, np.random.default_rng(0)), cfg)
    out = tmp_path / "fused"
    files = {"config.json": "{}", "model.safetensors": "theirs"} if not force else {"notes.txt": "mine"}
    _appears_under_the_lock(monkeypatch, out, files)
    argv = ["fuse", str(tiny_hf), str(adapters), str(out)] + (["--force"] if force else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"anekit: [fuse] OUT {out} exists"), err
    assert ("use --force" in err) if not force else ("is not a model" in err)
    assert {p.name: p.read_text() for p in out.iterdir()} == files


# -- 10. top-p at a running sum exactly equal to p -------------------------------------------------------


def _run_c_sample_topp(probs: np.ndarray, topp: float, coin: float) -> int:
    """llama2.c run.c's sample_topp, line by line in float32 (ties kept in token order: run.c's qsort
    leaves their order unspecified, and the distributions below have none among the candidates)."""
    f32 = np.float32
    n = len(probs)
    cutoff = f32((f32(1.0) - f32(topp)) / f32(n - 1))
    cand = [(f32(p), i) for i, p in enumerate(probs) if f32(p) >= cutoff]
    cand.sort(key=lambda c: -c[0])
    cumulative = f32(0.0)
    last = len(cand) - 1
    for i, (p, _) in enumerate(cand):
        cumulative = f32(cumulative + p)
        if cumulative > f32(topp):  # "truncate the list where cumulative probability exceeds topp"
            last = i
            break
    r = f32(f32(coin) * cumulative)
    cdf = f32(0.0)
    for i in range(last + 1):
        cdf = f32(cdf + cand[i][0])
        if r < cdf:
            return cand[i][1]
    return cand[last][1]


@pytest.mark.parametrize(
    "probs, topp",
    [
        ([0.125, 0.5, 0.0625, 0.25, 0.0625], 0.75),  # 1/2 + 1/4 = 0.75 exactly: 1/8 joins the set
        ([0.125, 0.5, 0.0625, 0.25, 0.0625], 0.5),  # 1/2 = 0.5 exactly: 1/4 joins
        ([0.25, 0.5, 0.125, 0.0625, 0.03125, 0.03125], 0.875),  # 1/2 + 1/4 + 1/8 exactly
        ([0.5, 0.25, 0.125, 0.125], 0.9),  # no exact hit: the sum exceeds topp at 1/8
    ],
)
def test_topp_takes_one_more_token_when_the_running_sum_equals_p(probs, topp):
    """run.c breaks once ``cumulative_prob > topp`` after adding the token, so a sum exactly equal to topp
    does not end the set; the coin then scales to the set's mass. Every coin on a fine grid (and the edges
    of each token's share) draws the token run.c's algorithm draws."""
    p = np.asarray(probs, np.float32)
    coins = np.concatenate([np.linspace(0, 1, 1025, endpoint=False), 1 - 2.0**-24 * np.arange(1, 4)])
    got = [sample_topp(p, topp, float(c)) for c in coins]
    want = [_run_c_sample_topp(p, topp, float(c)) for c in coins]
    assert got == want
    nucleus = {int(t) for t in want}
    ordered = sorted(range(len(p)), key=lambda i: -p[i])
    sums = np.cumsum([float(p[i]) for i in ordered])  # the set run.c keeps: up to the first sum over topp
    size = int(np.flatnonzero(sums > topp)[0]) + 1
    assert nucleus == set(ordered[:size])
