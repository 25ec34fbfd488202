"""The engine's multiply-accumulate unit, modelled: fp16 rounding with either tie rule, the 4-lane first
stage, the output port's ceiling and the interior partials that reach it.

Used by ``runtime.sim.numerics`` for the MAC ops (matmul, linear, einsum, conv, conv_transpose); the
behaviours and their evidence are ``anekit.engine.numerics``' "mac.*" records.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anekit import jit
from anekit.engine.numerics import FP16_MIN_NORMAL

MAC_OPS = frozenset({"matmul", "linear", "einsum", "conv", "conv_transpose"})
# A MAC op with at most this many products runs the exact 4-lane first-stage model under numerics "exact":
# every matmul and conv of the stories15M training kernels (the largest, 768 x 288 x 256, has 56.6M).
# Larger ones (stories110M's projections and FFN, the classifier) accumulate in float32 (BLAS), within a few
# fp16 ulps of the model. The cost (benchmarks/bench_first_stage.py, compiled, 2 threads): all stories15M
# kernels together run 4.5-6x longer than with BLAS beyond 8192 products (about 0.6-0.8 s -> 3.5-3.9 s; a
# matmul-heavy kernel 15-80x); the default training run (``anekit train``, dim 64) 4x longer whole.
# stories110M's layer kernels under a 2^29 budget would run 40x longer (0.22 s -> 8.9 s): left on float32.
EXACT_MAC_PRODUCTS = 1 << 26
# Under numerics "engine" (the default) the exact model runs for MAC ops of at most this many products:
# every published probe (the sweep, 5116, the 8192 partial) is one, and the training kernels keep BLAS's
# speed. Beyond it the products accumulate in float32.
ENGINE_MAC_PRODUCTS = 1 << 14
_GUARD_BITS = 11  # fp16's 10 fraction bits and one guard bit below them, inside a first-stage tile
_FP16_MIN_EXPONENT = -14  # the grid below fp16's smallest normal stays that of 2^-14


def round16(v: np.ndarray, ties: str = "even") -> np.ndarray:
    """``v`` rounded to fp16 values (held in float64); ``ties`` "even" (IEEE) or "away" from zero."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(all="ignore"):
        h = v.astype(np.float16).astype(np.float64)
        if ties == "away":
            a, ha = np.abs(v), np.abs(h)
            up = np.nextafter(ha.astype(np.float16), np.float16(np.inf)).astype(np.float64)
            tie_down = (ha < a) & (a - ha == up - a)
            if tie_down.any():
                h = np.where(tie_down, np.copysign(up, v), h)
    return h


def flush16(v: np.ndarray) -> np.ndarray:
    """Subnormal fp16 values (|v| < 2^-14) to +0."""
    return np.where(np.abs(v) < FP16_MIN_NORMAL, 0.0, v)


def mac_operands(op_type: str, values: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The op as a batched product a (..., M, K) @ b (..., K, N) of its input values, where it is one
    (matmul, linear, a 1x1 stride-1 unpadded single-group conv), else None."""
    if op_type == "matmul":
        x, y = np.asarray(values["x"]), np.asarray(values["y"])
        if x.ndim < 2 or y.ndim < 2:
            return None
        if is_true(values.get("transpose_x")):
            x = np.swapaxes(x, -1, -2)
        if is_true(values.get("transpose_y")):
            y = np.swapaxes(y, -1, -2)
        return x, y
    if op_type == "linear":
        x, w = np.asarray(values["x"]), np.asarray(values["weight"])
        if x.ndim < 2 or values.get("bias") is not None:
            return None
        return x, w.T
    if op_type == "conv":
        x, w = np.asarray(values["x"]), np.asarray(values["weight"])
        if x.ndim != 4 or w.ndim != 4 or w.shape[2:] != (1, 1) or values.get("bias") is not None:
            return None
        if int(np.asarray(values.get("groups", 1))) != 1 or str(values.get("pad_type", "valid")) not in (
            "valid",
            "same",
            "same_lower",
        ):
            return None
        for key in ("strides", "dilations"):
            if key in values and values[key] is not None and np.any(np.asarray(values[key]) != 1):
                return None
        n, c, h, wd = x.shape
        return w[:, :, 0, 0], x.reshape(n, c, h * wd)
    return None


def is_true(v: Any) -> bool:
    return bool(np.asarray(v)) if v is not None else False


def accumulation_terms(op_type: str, values: dict[str, Any]) -> int:
    """How many products each output of a MAC op accumulates (a conv: input channels / groups x taps)."""
    if op_type in ("conv", "conv_transpose"):
        w = np.asarray(values["weight"])
        return int(np.prod(w.shape[1:])) if op_type == "conv" else int(np.prod(w.shape[2:])) * w.shape[0]
    ops = mac_operands(op_type, values)
    return 2 if ops is None else int(ops[0].shape[-1])


def guard_add(acc: np.ndarray, term: np.ndarray) -> np.ndarray:
    """One step of the first stage's in-tile adder: ``acc + term`` rounded (ties to even) to one bit below
    fp16's spacing at the larger operand's exponent (``mac.first-stage``). The grid is the operands', not
    the sum's: 1 - 4096 keeps the grid of 4096 (2), so the one is a tie and goes (-4096), while 1 + 3000
    keeps it (3001). float64 in and out; both operands fp16 values or such partials (exact sums)."""
    with np.errstate(all="ignore"):
        exponent = np.maximum(_exponent(acc), _exponent(term))
        return np.ldexp(np.rint(np.ldexp(acc + term, _GUARD_BITS - exponent)), exponent - _GUARD_BITS)


def _exponent(v: np.ndarray) -> np.ndarray:
    """floor(log2 |v|), no lower than fp16's smallest normal exponent (-14; a zero's too)."""
    _, e = np.frexp(v)
    return np.where(v == 0, _FP16_MIN_EXPONENT, np.maximum(e - 1, _FP16_MIN_EXPONENT))


def tiled_product(
    a: np.ndarray, b: np.ndarray, ceiling: float, flush: bool, tile_rounding: str, ties: str
) -> tuple[np.ndarray, np.ndarray]:
    """The 4-lane first-stage model of a @ b (``mac.first-stage``): products rounded to fp16; within each
    tile of 4 consecutive lanes the products added in lane order by ``guard_add`` (fp16 plus one guard bit
    at the larger operand's exponent); the tile leaving the stage rounded to fp16 (``tile_rounding``:
    "truncate" drops the guard bit, "even" or "away" round it); tiles accumulated wide (float64) in
    order, the output rounded to fp16 (``ties``).

    Returns (the output before the port's ceiling, True where the tile or running partial reached
    ``ceiling``; those outputs are already +/-inf with the sign of the partial).
    """
    compiled = _compiled(a, b, ceiling, flush, tile_rounding, ties)
    if compiled is not None:
        return compiled
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    k = a64.shape[-1]
    shape = (*np.broadcast_shapes(a64.shape[:-2], b64.shape[:-2]), a64.shape[-2], b64.shape[-1])
    acc = np.zeros(shape)
    over = np.zeros(shape, dtype=bool)
    sign = np.zeros(shape)
    with np.errstate(all="ignore"):
        for t in range(0, k, 4):
            partial = np.zeros(shape)
            for j in range(t, min(t + 4, k)):
                p = round16(a64[..., :, j : j + 1] * b64[..., j : j + 1, :])
                partial = guard_add(partial, flush16(p) if flush else p)
            tile = truncate16(partial) if tile_rounding == "truncate" else round16(partial, tile_rounding)
            if flush:
                tile = flush16(tile)
            acc = acc + tile
            for value in (tile, acc):
                hit = (np.abs(value) >= ceiling) & ~over
                sign = np.where(hit, np.sign(value), sign)
                over |= hit
    out = round16(acc, ties)
    if flush:
        out = flush16(out)
    out = np.where(over, np.copysign(np.inf, sign), out)
    return out, over


def _compiled(
    a: np.ndarray, b: np.ndarray, ceiling: float, flush: bool, tile_rounding: str, ties: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """``tiled_product`` by the compiled loop (``jit.tiled_matmul``), batch by batch; None without it."""
    if not jit.available() or a.dtype.kind != "f" or b.dtype.kind != "f" or a.size == 0 or b.size == 0:
        return None
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a_b = np.broadcast_to(a, (*batch, *a.shape[-2:])).reshape(-1, *a.shape[-2:])
    b_b = np.broadcast_to(b, (*batch, *b.shape[-2:])).reshape(-1, *b.shape[-2:])
    outs, overs = [], []
    for x, y in zip(a_b, b_b):
        found = jit.tiled_matmul(x, y, ceiling, flush, tile_rounding, ties)
        if found is None:
            return None
        outs.append(found[0])
        overs.append(found[1])
    shape = (*batch, a.shape[-2], b.shape[-1])
    return np.stack(outs).reshape(shape), np.stack(overs).reshape(shape)


def truncate16(v: np.ndarray) -> np.ndarray:
    """``v`` rounded toward zero to fp16 values (float64 in and out)."""
    h = round16(v)
    a, ha = np.abs(v), np.abs(h)
    down = np.nextafter(ha.astype(np.float16), np.float16(0)).astype(np.float64)
    return np.where(ha > a, np.copysign(down, v), h)


def partial_overflow(a: np.ndarray, b: np.ndarray, ceiling: float) -> np.ndarray | None:
    """Outputs of a @ b where a 4-lane tile or the running sum of tiles (in index order) reaches ``ceiling``,
    though the output may not: a boolean mask, or None when the bound max|a| max|b| K shows none can."""
    k = a.shape[-1]
    if a.size == 0 or b.size == 0:
        return None
    with np.errstate(all="ignore"):
        if float(np.max(np.abs(a))) * float(np.max(np.abs(b))) * k < ceiling:
            return None
        bound = np.matmul(np.abs(a).astype(np.float32), np.abs(b).astype(np.float32))
    suspects = np.argwhere(bound >= ceiling)
    shape = bound.shape
    mask = np.zeros(shape, dtype=bool)
    a_b = np.broadcast_to(a, shape[:-2] + a.shape[-2:])
    b_b = np.broadcast_to(b, shape[:-2] + b.shape[-2:])
    for idx in suspects:
        *batch, m, n = (int(i) for i in idx)
        row: tuple[Any, ...] = (*batch, m)  # a's row m, b's column n, in that batch
        column: tuple[Any, ...] = (*batch, slice(None), n)
        prods = a_b[row].astype(np.float64) * b_b[column].astype(np.float64)
        tiles = np.pad(prods, (0, -k % 4)).reshape(-1, 4).sum(axis=1)  # the first stage's 4-lane tiles
        worst = max(float(np.max(np.abs(tiles))), float(np.max(np.abs(np.cumsum(tiles)))))
        mask[tuple(idx)] = worst >= ceiling
    return mask


def products(a: np.ndarray, b: np.ndarray) -> int:
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return int(np.prod(batch)) * a.shape[-2] * a.shape[-1] * b.shape[-1]
