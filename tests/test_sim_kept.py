"""Kept steps (``runtime.sim.kept``): the moves of an input's unchanged weight columns are made once and
handed to later runs; every result is the bits of the plan run without them, whatever the host changes
between runs (the activations, the weights through a block, through ``view``, through ``write``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from anekit import jit, mil
from anekit.mil import tensor
from anekit.runtime.sim import SimBackend, SimKernel, kept, mirror
from anekit.runtime.sim.held import HeldSurface

pytestmark = pytest.mark.usefixtures("fp16_path")

C, W, N = 64, 32, 48  # channels, activation columns, the product's outputs
WEIGHTS_AT = 64  # the weight columns start here (the activations padded to 64 columns, as the kernels do)


def _program() -> Any:
    """x (1, C, 1, WEIGHTS_AT + N): activations in columns 0 .. W-1 and a (C, N) weight after them, moved
    into a matmul of the token rows as a dynamic kernel moves them (slice, reshape, transpose)."""
    b = mil.Builder()
    f = b.function("main")
    x = f.input("x", tensor("fp16", [1, C, 1, WEIGHTS_AT + N]))
    act = f.slice_by_size(x=x, begin=[0, 0, 0, 0], size=[1, C, 1, W])
    rows = f.transpose(x=f.reshape(x=act, shape=[1, 1, C, W]), perm=[0, 1, 3, 2])  # (1, 1, W, C)
    w = f.slice_by_size(x=x, begin=[0, 0, 0, WEIGHTS_AT], size=[1, C, 1, N])
    weight = f.reshape(x=w, shape=[1, 1, C, N])
    out = f.matmul(x=rows, y=weight)  # (1, 1, W, N)
    f.output(f.reshape(x=f.transpose(x=out, perm=[0, 1, 3, 2]), shape=[1, N, 1, W]))
    return b.build()


def _kernel(chip: str = "m4") -> SimKernel:
    kernel = SimBackend(chip=chip).compile(_program()).load()
    assert isinstance(kernel, SimKernel)
    return kernel


def _keeping(kernel: SimKernel, on: bool) -> None:
    """Switch the plan's kept steps off (the plain run: every step on every run) or leave them on."""
    if not on:
        kernel.plan.kept = None


def _runs(on: bool, changes: list[str], use_set: bool) -> tuple[list[bytes], list[bool]]:
    """The output bits of a run after each change of ``changes``, on a kernel's input set (held surface)
    or its own input (mirrored where the compiled loops are in use), and whether the plan held kept values
    after each."""
    rng = np.random.default_rng(5)
    kernel = _kernel()
    _keeping(kernel, on)
    (x,) = kernel.input_set() if use_set else kernel.inputs
    x.write(np.zeros(x.shape, np.float32))
    x.write_block(rng.standard_normal((C, N)).astype(np.float32), 0, WEIGHTS_AT)
    outs, kept_any = [], []
    for change in changes:
        x.write_block(rng.standard_normal((C, W)).astype(np.float32), 0, 0)  # the activations, every run
        if change == "block":
            x.write_block(rng.standard_normal((C, N)).astype(np.float32), 0, WEIGHTS_AT)
        elif change == "one":  # one weight element through a block
            x.write_block(np.full((1, 1), 3.0, np.float32), 7, WEIGHTS_AT + 5)
        elif change == "view":
            with x.view() as buf:
                buf.reshape(C, -1)[3, WEIGHTS_AT + 2] = np.float16(-2.5)
        elif change == "write":
            x.write(np.asarray(x.read()) * np.float32(0.5))
        kernel.run([x] if use_set else None)
        outs.append(kernel.outputs[0].read().tobytes())
        kept_any.append(kernel.plan.kept is not None and bool(kernel.plan.kept._kept))
    return outs, kept_any


CHANGES = ["none", "none", "none", "one", "none", "none", "block", "none", "none", "view", "none", "none"]
CHANGES += ["write", "none", "none", "none"]


@pytest.mark.parametrize("use_set", [True, False])
def test_every_run_gives_the_plain_runs_bits_whatever_the_host_changed(
    use_set: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror, "MIRROR_FROM", 1)  # the kernel's own input mirrored, however small
    want, _ = _runs(False, CHANGES, use_set)
    got, kept_any = _runs(True, CHANGES, use_set)
    assert got == want
    assert len(set(want)) == len(want)  # every run saw its new activations
    if use_set or jit.available():  # a held surface, or a mirror: the weight moves were kept
        assert kept_any[2] and kept_any[5] and not kept_any[3]  # and dropped when a weight changed


def test_the_weight_moves_are_made_once_and_the_activations_every_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counting the runs of each kept step: the weight's slice and reshape run on the first two runs (the
    second finds its columns unchanged and keeps them), then only after the weights change."""
    kernel = _kernel()
    plan = kernel.plan
    assert plan.kept is not None
    counts: dict[int, int] = {}
    for index in plan.kept.regions:
        runner = plan.runners[index]

        def counted(env: list[Any], index: int = index, runner: Any = runner) -> None:
            counts[index] = counts.get(index, 0) + 1
            runner(env)

        plan.runners[index] = counted
    (x,) = kernel.input_set()
    rng = np.random.default_rng(2)
    x.write_block(rng.standard_normal((C, N)).astype(np.float32), 0, WEIGHTS_AT)
    regions = plan.kept.regions
    weight_steps = [i for i, (_, first, _) in regions.items() if first == WEIGHTS_AT]
    act_steps = [i for i, (_, first, _) in regions.items() if first == 0]
    assert weight_steps and act_steps
    for _ in range(5):
        x.write_block(rng.standard_normal((C, W)).astype(np.float32), 0, 0)
        kernel.run([x])
    assert all(counts[i] == 2 for i in weight_steps)
    assert all(counts[i] == 5 for i in act_steps)
    x.write_block(rng.standard_normal((C, N)).astype(np.float32), 0, WEIGHTS_AT)
    for _ in range(3):
        x.write_block(rng.standard_normal((C, W)).astype(np.float32), 0, 0)
        kernel.run([x])
    assert all(counts[i] == 4 for i in weight_steps)  # made again, then kept again


def test_a_sanitizer_keeps_nothing() -> None:
    """A sanitizer counts each run's hazards: its plans run every step on every run."""
    kernel = SimBackend(chip="m4", sanitize=True).compile(_program()).load()
    assert isinstance(kernel, SimKernel) and kernel.plan.kept is None


def test_the_log_says_what_changed_since_a_version() -> None:
    log = kept.ColumnLog(400)
    log.changed(0, 400)  # the weights, once
    log.changed(0, 32)
    v = log.version
    assert not log.changed_since(v, 0, 32)
    log.changed(64, 80)
    assert log.changed_since(v, 70, 71) and log.changed_since(v, 0, 65)
    assert not log.changed_since(v, 0, 64) and not log.changed_since(v, 80, 200)
    for _ in range(1000):  # activation columns, rewritten before every run
        log.changed(0, 32)
    assert not log.changed_since(v, 100, 400)  # however many changes of other columns came since
    assert log.changed_since(v, 70, 71) and log.changed_since(v, 31, 33)
    assert not log.changed_since(log.version - 1, 32, 400)


def test_a_held_surface_logs_its_writes() -> None:
    s = HeldSurface((1, 4, 1, 96))
    v = s.changes.version
    s.write_block(np.ones((2, 3), np.float32), 1, 40)
    assert s.changes.changed_since(v, 42, 43) and not s.changes.changed_since(v, 43, 96)
    v = s.changes.version
    with s.view():
        pass
    assert s.changes.changed_since(v, 95, 96)  # through the bits: anywhere


def test_a_held_surface_written_a_column_at_a_time_keeps_its_counts() -> None:
    """A cache written one column per step: past ``held.MAX_BLOCKS`` blocks their counts are taken again
    as one, and the NaN count and peak stay those of the values."""
    from anekit.runtime.sim import held

    s = HeldSurface((1, 8, 1, 3 * held.MAX_BLOCKS))
    rng = np.random.default_rng(3)
    for col in range(3 * held.MAX_BLOCKS):
        block = rng.standard_normal((8, 1)).astype(np.float32)
        if col == 70:
            block[2, 0] = 1000.0
        s.write_block(block, 0, col)
        assert len(s._blocks) <= held.MAX_BLOCKS
    _, nans, peak = s.held()
    assert nans == 0 and peak == 1000.0
    s.write_block(np.full((1, 1), np.nan, np.float32), 5, 7)
    _, nans, _ = s.held()
    assert nans >= 1
