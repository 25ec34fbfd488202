"""Simulator cases for the tensor data-movement ops and the dtype / quantization / constexpr ops.

Data movement only copies fp16 values, so those cases compare exactly (rtol = atol = 0). Quantized
constexpr data with a sub-byte dtype (int4 / uint4 / uint1 / uint2 / ...) is given as a typed
``tensor_literal``; the expectations close over the plain integer arrays the literals were made from.
"""

from __future__ import annotations

import numpy as np

from anekit.mil.values import tensor_literal
from tests.sim_cases import SimCase, rng

EXACT = {"rtol": 0.0, "atol": 0.0}
# A value computed in float64 from exact operands, then stored once as fp16: half an ulp of fp16.
FP16_ONCE = {"rtol": 1e-3, "atol": 0.0}
# The same for an fp32 output.
FP32_ONCE = {"rtol": 1e-6, "atol": 0.0}


def _x(label: str, *shape: int, scale: float = 1.0) -> np.ndarray:
    return rng(label).standard_normal(shape) * scale


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _bools(*v: int) -> np.ndarray:
    return np.array([bool(b) for b in v])


# -- helpers for the expectations (written independently of the ops' references) --------------------


def _along(x: np.ndarray, axis: int, src: list[int]) -> np.ndarray:
    """The slices ``x[..., src[k], ...]`` along ``axis``, in order (plain fancy indexing)."""
    index = [slice(None)] * x.ndim
    index[axis] = np.array(src, dtype=np.int64)
    return x[tuple(index)]


def _pad_expected(x: np.ndarray, pads: list[int], mode: str, value: float = 0.0) -> np.ndarray:
    """Pad the last len(pads)//2 dims: each output position maps to a source index (or the constant)."""
    out = x
    n = len(pads) // 2
    for k in range(n):
        axis = x.ndim - n + k
        before, after = pads[2 * k], pads[2 * k + 1]
        d = out.shape[axis]
        positions = range(-before, d + after)
        if mode == "replicate":
            out = _along(out, axis, [min(max(p, 0), d - 1) for p in positions])
        elif mode == "reflect":
            out = _along(out, axis, [-p if p < 0 else (2 * (d - 1) - p if p >= d else p) for p in positions])
        else:
            taken = _along(out, axis, [min(max(p, 0), d - 1) for p in positions])
            keep = np.array([0 <= p < d for p in positions])
            shape = [1] * out.ndim
            shape[axis] = len(keep)
            out = np.where(keep.reshape(shape), taken, value)
    return out


def _shuffle(x: np.ndarray, out_shape: tuple[int, ...], src_of) -> np.ndarray:
    """out[idx] = x[src_of(idx)] for every output index (element-by-element gather)."""
    out = np.empty(out_shape)
    for idx in np.ndindex(*out_shape):
        out[idx] = x[src_of(*idx)]
    return out


def _depth_to_space(x: np.ndarray, b: int) -> np.ndarray:
    n, c, h, w = x.shape
    oc = c // (b * b)
    return _shuffle(
        x, (n, oc, h * b, w * b), lambda n_, c_, y, z: (n_, ((y % b) * b + z % b) * oc + c_, y // b, z // b)
    )


def _space_to_depth(x: np.ndarray, b: int) -> np.ndarray:
    n, c, h, w = x.shape

    def src(n_, oc, y, z):
        blk, c_ = divmod(oc, c)
        i, j = divmod(blk, b)
        return n_, c_, y * b + i, z * b + j

    return _shuffle(x, (n, c * b * b, h // b, w // b), src)


def _pixel_shuffle(x: np.ndarray, f: int) -> np.ndarray:
    n, c, h, w = x.shape
    return _shuffle(
        x,
        (n, c // (f * f), h * f, w * f),
        lambda n_, c_, y, z: (n_, c_ * f * f + (y % f) * f + z % f, y // f, z // f),
    )


def _pixel_unshuffle(x: np.ndarray, f: int) -> np.ndarray:
    n, c, h, w = x.shape

    def src(n_, oc, y, z):
        c_, r = divmod(oc, f * f)
        i, j = divmod(r, f)
        return n_, c_, y * f + i, z * f + j

    return _shuffle(x, (n, c * f * f, h // f, w // f), src)


def _gather_along(x: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    out = np.empty(idx.shape)
    for pos in np.ndindex(*idx.shape):
        src = list(pos)
        i = int(idx[pos])
        src[axis] = i + x.shape[axis] if i < 0 else i
        out[pos] = x[tuple(src)]
    return out


def _cast_int(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Truncate toward zero, NaN -> 0, saturate to [lo, hi]."""
    out = np.zeros(x.shape, dtype=np.int64)
    for pos in np.ndindex(*x.shape):
        v = x[pos]
        if np.isnan(v):
            out[pos] = 0
        elif v >= hi:
            out[pos] = hi
        elif v <= lo:
            out[pos] = lo
        else:
            out[pos] = int(v)  # int() truncates toward zero
    return out


def _quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Round half to even (np.rint), add the zero point, saturate; NaN -> zero point. Broadcast params."""
    scale, zp = np.broadcast_to(scale, x.shape), np.broadcast_to(zp, x.shape)
    out = np.zeros(x.shape, dtype=np.int64)
    for pos in np.ndindex(*x.shape):
        v = x[pos] / scale[pos]
        q = zp[pos] if np.isnan(v) else np.rint(v) + zp[pos]
        out[pos] = int(min(max(q, lo), hi))
    return out


def _pack_lsb(values: np.ndarray, nbits: int) -> np.ndarray:
    """Unsigned ``nbits``-bit values packed into bytes least significant bit first."""
    stream = 0
    for p, v in enumerate(np.asarray(values).ravel()):
        stream |= int(v) << (p * nbits)
    nbytes = (values.size * nbits + 7) // 8
    return np.array([(stream >> (8 * k)) & 0xFF for k in range(nbytes)], dtype=np.uint8)


def _blocks(dense: tuple[int, ...], per_block: np.ndarray) -> np.ndarray:
    """Repeat a per-block parameter of shape ``s`` up to ``dense`` (block_k = dense_k // s_k)."""
    out = np.empty(dense)
    for pos in np.ndindex(*dense):
        out[pos] = per_block[tuple(p // (d // s) for p, d, s in zip(pos, dense, per_block.shape))]
    return out


def _lut18(idx: np.ndarray, lut: np.ndarray, vector_axis: int | None = None) -> np.ndarray:
    """iOS18 palettization: table of index position p is lut[p // block], value(s) lut[..., idx[p], :]."""
    k = idx.ndim
    vsize = lut.shape[-1]
    out_shape = list(idx.shape)
    va = None if vector_axis is None else vector_axis % k
    if va is not None:
        out_shape[va] *= vsize
    out = np.empty(out_shape)
    for pos in np.ndindex(*idx.shape):
        table = tuple(p // (d // t) for p, d, t in zip(pos, idx.shape, lut.shape[:k]))
        vec = lut[(*table, int(idx[pos]))]
        for v in range(vsize):
            dst = list(pos)
            if va is not None:
                dst[va] = pos[va] * vsize + v
            out[tuple(dst)] = vec[v]
    return out


def _scatter(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Dense tensor: values in row-major order at the set positions of mask, zero elsewhere."""
    out = np.zeros(mask.shape)
    it = iter(np.asarray(values, dtype=np.float64).ravel())
    for pos in np.ndindex(*mask.shape):
        if mask[pos]:
            out[pos] = next(it)
    assert next(it, None) is None
    return out


def _nonzero_in_order(dense: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.array([dense[pos] for pos in np.ndindex(*mask.shape) if mask[pos]])


# -- inputs ---------------------------------------------------------------------------------------------

_x4 = _x("x4", 1, 8, 1, 6)  # the main ANE-shaped activation [1, C, 1, S]
_img = _x("img", 1, 3, 4, 5)  # [1, C, H, W]
_taps = [_x(f"tap{k}", 1, 4, 1, 5) for k in range(3)]
_gaa_idx = rng("gaa1").integers(0, 8, size=(1, 3, 1, 6)).astype(np.uint8)
_cast_src = _x("ccast", 4, 3, 1, 1).astype(np.float16)
_ints = rng("ints").integers(-1000, 1000, size=(1, 4, 1, 6))
_mask_bits = rng("mask").integers(0, 2, size=(1, 4, 1, 6)).astype(bool)

# cast: fp16 inputs with halves, saturating values, +-inf and NaN.
_cast_x = np.array(
    [
        [-2.75, -0.5, 0.5, 2.75, 7.0, 127.5, -128.75, 300.0],
        [255.5, 256.0, -5.0, 40000.0, -40000.0, 65504.0, np.inf, -np.inf],
        [np.nan, 0.0, -0.0, 1e-3, 32767.5, -32768.5, 60000.0, 1.0],
    ]
).reshape(1, 3, 1, 8)

# quantize: multiples of 1/16 so that many x / scale land exactly on .5 ties (half-to-even matters).
_q_x = (rng("qx").integers(-200, 200, size=(1, 4, 1, 8)) / 16.0).astype(np.float64)
_q_x[0, 0, 0, :4] = [np.nan, np.inf, -np.inf, 1000.0]
_q_scale_axis = np.array([0.125, 0.25, 0.375, 0.0625])  # exact in fp16
_q_zp_axis = np.array([128, 0, 250, 3], dtype=np.uint8)

_dq_int8 = rng("dq8").integers(-128, 128, size=(1, 4, 1, 6)).astype(np.int8)
_dq_uint8 = rng("dqu8").integers(0, 256, size=(1, 4, 1, 6)).astype(np.uint8)
_dq_scale_axis = np.array([0.5, 0.03125, 2.0, 0.1], dtype=np.float32)
_dq_zp_axis = np.array([128, 0, 255, 7], dtype=np.uint8)

# constexpr weights: conv-like [C_out, C_in, 1, 1] and matmul-like [C_out, C_in].
_w_q = rng("wq").integers(0, 256, size=(8, 4, 1, 1)).astype(np.uint8)
_w_zp = rng("wzp").integers(0, 256, size=8).astype(np.uint8)
_w_scale16 = (rng("wsc").uniform(0.01, 0.1, size=8)).astype(np.float16)
_w_qi8 = rng("wqi8").integers(-128, 128, size=(6, 4)).astype(np.int8)

_bw_int4 = rng("bw4").integers(-8, 8, size=(8, 6))
_bw_int4_off = rng("bw4o").integers(-8, 8, size=(4, 2))
_bw_scale32 = rng("bw4s").uniform(0.05, 0.5, size=(4, 2)).astype(np.float32)
_bw_uint4 = rng("bwu4").integers(0, 16, size=(4, 8, 1, 1))
_bw_uint4_off = rng("bwu4o").integers(0, 16, size=(4, 2, 1, 1))
_bw_uint4_scale16 = rng("bwu4s").uniform(0.05, 0.5, size=(4, 2, 1, 1)).astype(np.float16)
_bw_uint8 = rng("bwu8").integers(0, 256, size=(6, 8)).astype(np.uint8)
_bw_uint8_scale = rng("bwu8s").uniform(0.01, 0.02, size=(3, 2)).astype(np.float32)
_bw_uint8_off = np.array([[127.5, 128.0], [100.25, 0.0], [255.0, 31.75]], dtype=np.float32)
_bw_int8 = rng("bwi8").integers(-128, 128, size=(8, 4)).astype(np.int8)
_bw_int8_scale16 = rng("bwi8s").uniform(0.001, 0.01, size=(8, 1)).astype(np.float16)

_lut16_vals = {n: rng(f"lut16v{n}").integers(0, 2**n, size=(8, 3, 1, 1)) for n in (1, 4, 6)}
_lut16_tables = {n: rng(f"lut16t{n}").standard_normal(2**n).astype(np.float16) for n in (1, 4, 6)}

_l18_u4 = rng("l18u4").integers(0, 16, size=(8, 4, 1, 1))
_l18_u4_lut = rng("l18u4l").standard_normal((2, 1, 1, 1, 16, 1)).astype(np.float16)  # per 4-row group
_l18_u2 = rng("l18u2").integers(0, 4, size=(4, 6))
_l18_u2_lut = rng("l18u2l").standard_normal((1, 3, 4, 2)).astype(np.float32)  # 3 column groups, V = 2
_l18_u1 = rng("l18u1").integers(0, 2, size=(2, 3, 4))
_l18_u1_lut = rng("l18u1l").integers(-128, 128, size=(2, 1, 1, 2, 1)).astype(np.int8)
_l18_u3 = rng("l18u3").integers(0, 8, size=(4, 4))
_l18_u3_lut = rng("l18u3l").standard_normal((2, 2, 8, 3)).astype(np.float16)
_l18_u6 = rng("l18u6").integers(0, 64, size=(4, 2))
_l18_u6_lut = rng("l18u6l").standard_normal((1, 1, 64, 1)).astype(np.float32)
_l18_u8 = rng("l18u8").integers(0, 256, size=(6, 4)).astype(np.uint8)
_l18_u8_lut = rng("l18u8l").integers(0, 256, size=(1, 2, 256, 1)).astype(np.uint8)

_sp_bits16 = rng("sp16").integers(0, 2, size=(6, 4, 1, 1))
_sp_data16 = rng("sp16d").standard_normal(int(_sp_bits16.sum())).astype(np.float16)
_sp_bits18 = rng("sp18").integers(0, 2, size=(4, 6))
_sp_data18 = rng("sp18d").standard_normal(int(_sp_bits18.sum())).astype(np.float16)
_sp_bits18b = rng("sp18b").integers(0, 2, size=(3, 5))
_sp_int4 = rng("sp18i4").integers(-8, 8, size=int(_sp_bits18b.sum()))
_sp_bits_u8 = rng("sp18u8").integers(0, 2, size=(2, 2, 3))
_sp_data_u8 = rng("sp18u8d").integers(1, 256, size=int(_sp_bits_u8.sum())).astype(np.uint8)

_ls_mask = rng("lsm").integers(0, 2, size=(4, 6))
_ls_idx = rng("lsi").integers(0, 4, size=int(_ls_mask.sum()))
_ls_lut = rng("lsl").standard_normal((2, 1, 4, 1)).astype(np.float16)  # two row groups of 2
_ls_mask_v = rng("lsmv").integers(0, 2, size=(2, 3, 4))
_ls_idx_v = rng("lsiv").integers(0, 2, size=int(_ls_mask_v.sum()))
_ls_lut_v = rng("lslv").standard_normal((1, 1, 2, 2, 3)).astype(np.float32)  # V = 3 along axis 1

_sbs_mask = rng("sbsm").integers(0, 2, size=(4, 8))
_sbs_data = rng("sbsd").integers(-128, 128, size=int(_sbs_mask.sum())).astype(np.int8)
_sbs_scale = rng("sbss").uniform(0.01, 0.1, size=(2, 2)).astype(np.float16)
_sbs_off = rng("sbso").integers(-8, 8, size=(2, 2)).astype(np.int8)
_sbs_mask4 = rng("sbsm4").integers(0, 2, size=(2, 3, 4))
_sbs_data4 = rng("sbsd4").integers(0, 16, size=int(_sbs_mask4.sum()))
_sbs_scale4 = rng("sbss4").uniform(0.1, 1.0, size=(2, 1, 2)).astype(np.float32)


def _lut16_case(nbits: int) -> SimCase:
    vals, table = _lut16_vals[nbits], _lut16_tables[nbits]
    return SimCase(
        "constexpr_lut_to_dense",
        {},
        lambda **_: table.astype(np.float64)[vals],
        params={
            "indices": _pack_lsb(vals, nbits),
            "lut": table,
            "shape": np.array(vals.shape, dtype=np.uint32),
        },
        label=f"ios16-{nbits}bit",
        opset="ios16",  # the iOS16 form (packed indices and a shape): its parameters are attributes
        **EXACT,
    )


# -- cases ----------------------------------------------------------------------------------------------

TENSOR_OPS_CASES = [
    # reshape
    SimCase(
        "reshape",
        {"x": _x4},
        lambda x, **_: x.reshape(1, 4, 2, 6),
        params={"shape": _i64(1, 4, 2, 6)},
        label="static",
        **EXACT,
    ),
    SimCase(
        "reshape",
        {"x": _x4},
        lambda x, **_: x.reshape(1, 2, 4, 6),
        params={"shape": _i64(1, -1, 4, 6)},
        label="infer-minus1",
        **EXACT,
    ),
    SimCase(
        "reshape",
        {"x": _x4},
        # 0 copies x's dim at the same position (K == rank): [1, 8, 1, 6] -> [1, 8, 6, 1]
        lambda x, **_: x.reshape(1, 8, 6, 1),
        params={"shape": _i64(0, 0, 6, 1)},
        label="zero-copies-dim",
        **EXACT,
    ),
    SimCase(
        "reshape",
        {"x": _x4},
        # iOS17 rule: a 0 pairs with the x dim aligned from the right: [-1, 0] on [1, 8, 1, 6] -> [8, 6]
        lambda x, **_: x.reshape(8, 6),
        params={"shape": _i64(-1, 0)},
        label="zero-right-aligned",
        **EXACT,
    ),
    SimCase(
        "reshape",
        {"x": _ints},
        lambda x, **_: x.reshape(4, 6).astype(np.int64),
        params={"shape": _i64(4, -1)},
        label="int32",
    ),
    # transpose
    SimCase(
        "transpose",
        {"x": _x4},
        lambda x, **_: np.einsum("abcd->adcb", x),
        params={"perm": _i64(0, 3, 2, 1)},
        label="channels-to-last",
        **EXACT,
    ),
    SimCase(
        "transpose",
        {"x": _x("heads", 1, 2, 3, 4)},
        lambda x, **_: np.einsum("abcd->acbd", x),
        params={"perm": _i64(0, 2, 1, -1)},
        label="heads-negative-perm",
        **EXACT,
    ),
    SimCase(
        "transpose",
        {"x": _mask_bits},
        lambda x, **_: np.einsum("abcd->dbca", x),
        params={"perm": _i64(3, 1, 2, 0)},
        label="bool",
    ),
    # expand_dims / squeeze / flatten2d
    SimCase(
        "expand_dims",
        {"x": _x("ed", 1, 8, 6)},
        lambda x, **_: x[:, :, None, :],
        params={"axes": _i64(2)},
        label="to-ane-rank",
        **EXACT,
    ),
    SimCase(
        "expand_dims",
        {"x": _x("ed2", 8, 6)},
        lambda x, **_: x[None, :, :, None],
        params={"axes": _i64(-1, 0)},
        label="two-axes",
        **EXACT,
    ),
    SimCase(
        "squeeze",
        {"x": _x4},
        lambda x, **_: x[:, :, 0, :],
        params={"axes": _i64(2)},
        label="axis",
        **EXACT,
    ),
    SimCase("squeeze", {"x": _x4}, lambda x, **_: x[0, :, 0, :], label="all-unit", **EXACT),
    SimCase("flatten2d", {"x": _img}, lambda x, **_: x.reshape(1, 60), label="default-axis", **EXACT),
    SimCase(
        "flatten2d",
        {"x": _img},
        lambda x, **_: x.reshape(12, 5),
        params={"axis": -1},
        label="axis-minus1",
        **EXACT,
    ),
    SimCase(
        "flatten2d",
        {"x": _img},
        lambda x, **_: x.reshape(12, 5),
        params={"axis": 3},
        label="axis3",
        **EXACT,
    ),
    # concat
    SimCase(
        "concat",
        {"values": [_x("c0", 1, 2, 1, 5), _x("c1", 1, 4, 1, 5), _x("c2", 1, 1, 1, 5)]},
        lambda values, **_: np.array([v[0, c] for v in values for c in range(v.shape[1])])[None, :, :, :],
        params={"axis": 1},
        label="channels",
        **EXACT,
    ),
    SimCase(
        "concat",
        {"values": [_x("cs0", 1, 4, 1, 3), _x("cs1", 1, 4, 1, 2)]},
        lambda values, **_: np.block([[values[0], values[1]]]),
        params={"axis": -1},
        label="spatial",
        **EXACT,
    ),
    SimCase(
        "concat",
        {"values": _taps},
        # taps: out channel c * N + k is channel c of input k
        lambda values, **_: np.array([values[k][0, c] for c in range(4) for k in range(3)])[None],
        params={"axis": 1, "interleave": True},
        label="interleave-taps",
        **EXACT,
    ),
    SimCase(
        "concat",
        {"values": [_x("ci0", 1, 4, 1, 3), _x("ci1", 1, 4, 1, 3)]},
        lambda values, **_: np.stack([values[0], values[1]], axis=-1).reshape(1, 4, 1, 6),
        params={"axis": 3, "interleave": True},
        label="interleave-spatial",
        **EXACT,
    ),
    SimCase(
        "concat",
        {"values": [_ints, _ints * 2]},
        lambda values, **_: np.array([*list(values[0][0]), *list(values[1][0])])[None].astype(np.int64),
        params={"axis": 1},
        label="int32",
    ),
    # split
    SimCase(
        "split",
        {"x": _x("split", 1, 6, 1, 4)},
        lambda x, **_: (x[:, 0:2], x[:, 2:4], x[:, 4:6]),
        params={"num_splits": 3, "axis": 1},
        label="num-splits",
        **EXACT,
    ),
    SimCase(
        "split",
        {"x": _x4},
        lambda x, **_: (x[..., 0:1], x[..., 1:4], x[..., 4:6]),
        params={"split_sizes": _i64(1, 3, 2), "axis": -1},
        label="split-sizes",
        **EXACT,
    ),
    SimCase(
        "split",
        {"x": _x4},
        lambda x, **_: (x[:, 0:5], x[:, 5:8]),
        params={"num_splits": 2, "split_sizes": _i64(5, 3), "axis": 1},
        label="both",
        **EXACT,
    ),
    # stack
    SimCase(
        "stack",
        {"values": [_x("st0", 4, 5), _x("st1", 4, 5), _x("st2", 4, 5)]},
        lambda values, **_: np.array([values[0], values[1], values[2]]),
        params={"axis": 0},
        label="axis0",
        **EXACT,
    ),
    SimCase(
        "stack",
        {"values": [_x("sl0", 1, 4, 5), _x("sl1", 1, 4, 5)]},
        lambda values, **_: np.concatenate([values[0][..., None], values[1][..., None]], axis=-1),
        params={"axis": -1},
        label="axis-last",
        **EXACT,
    ),
    # slice_by_size
    SimCase(
        "slice_by_size",
        {"x": _x4},
        lambda x, **_: x[0:1, 2:5, 0:1, 1:5],
        params={"begin": _i64(0, 2, 0, 1), "size": _i64(1, 3, 1, 4)},
        label="window",
        **EXACT,
    ),
    SimCase(
        "slice_by_size",
        {"x": _x4},
        lambda x, **_: x[:, 5:8, :, 2:6],
        params={"begin": _i64(0, -3, 0, 2), "size": _i64(-1, -1, 1, -1)},
        label="negative-begin-to-end",
        **EXACT,
    ),
    # slice_by_index
    SimCase(
        "slice_by_index",
        {"x": _x4},
        lambda x, **_: x[:, 1:7, :, 0:5],
        params={"begin": _i64(0, 1, 0, 0), "end": _i64(1, 7, 1, 5)},
        label="plain",
        **EXACT,
    ),
    SimCase(
        "slice_by_index",
        {"x": _x4},
        lambda x, **_: x[:, 1::2, :, ::-2],
        params={
            "begin": _i64(0, 1, 0, 4),
            "end": _i64(1, 3, 1, 0),
            "stride": _i64(1, 2, 1, -2),
            "begin_mask": _bools(0, 0, 0, 1),
            "end_mask": _bools(1, 1, 1, 1),
        },
        label="strides-masks",
        **EXACT,
    ),
    SimCase(
        "slice_by_index",
        {"x": _x4},
        lambda x, **_: x[:, -2:-7:-1, 0, :],
        params={
            "begin": _i64(0, -2, 0, 0),
            "end": _i64(1, -7, 1, 6),
            "stride": _i64(1, -1, 1, 1),
            "squeeze_mask": _bools(0, 0, 1, 0),
        },
        label="negative-squeeze",
        **EXACT,
    ),
    SimCase(
        "slice_by_index",
        {"x": _img},
        lambda x, **_: x[0, :, 1:100, 3],
        params={
            "begin": _i64(0, 2, 1, 3),
            "end": _i64(1, 3, 100, 4),
            "begin_mask": _bools(0, 1, 0, 0),
            "end_mask": _bools(0, 1, 0, 0),
            "squeeze_mask": _bools(1, 0, 0, 1),
        },
        label="clamped-end-two-squeezes",
        **EXACT,
    ),
    SimCase(
        "slice_by_index",
        {"x": _x4},
        # squeezing every dim gives a scalar; begin_mask + squeeze takes index 0 (stride > 0)
        lambda x, **_: x[0, 3, 0, -1],
        params={
            "begin": _i64(0, 3, 5, -1),
            "end": _i64(1, 4, 1, 6),
            "begin_mask": _bools(0, 0, 1, 0),
            "squeeze_mask": _bools(1, 1, 1, 1),
        },
        label="scalar",
        **EXACT,
    ),
    # crop
    SimCase(
        "crop",
        {"x": _img},
        lambda x, **_: x[:, :, 1:4, 1:3],
        params={"crop_height": _i64(1, 0), "crop_width": _i64(1, 2)},
        label="",
        **EXACT,
    ),
    # tile
    SimCase(
        "tile",
        {"x": _x("tile", 1, 3, 1, 4)},
        lambda x, **_: x[:, [0, 1, 2, 0, 1, 2]][..., [0, 1, 2, 3] * 3],
        params={"reps": _i64(1, 2, 1, 3)},
        label="",
        **EXACT,
    ),
    SimCase(
        "tile",
        {"x": _mask_bits[:, :2]},
        lambda x, **_: np.concatenate([x, x], axis=2),
        params={"reps": _i64(1, 1, 2, 1)},
        label="bool",
    ),
    # reverse
    SimCase("reverse", {"x": _x4}, lambda x, **_: x[::-1, ::-1, ::-1, ::-1], label="all", **EXACT),
    SimCase(
        "reverse",
        {"x": _x4},
        lambda x, **_: x[:, ::-1, :, ::-1],
        params={"axes": _i64(1, -1)},
        label="axes",
        **EXACT,
    ),
    # gather
    SimCase(
        "gather",
        {"x": _x4, "indices": np.array([7, 0, 3, 3, -1])},
        lambda x, indices, **_: x[:, [7, 0, 3, 3, 7]],
        params={"axis": 1},
        label="runtime-indices",
        **EXACT,
    ),
    SimCase(
        "gather",
        {"x": _x("emb", 10, 6)},
        # an embedding lookup: [2, 3] token ids -> [2, 3, 6]
        lambda x, **_: np.array([[x[t] for t in row] for row in [[1, 9, 4], [0, 0, 7]]]),
        params={"indices": np.array([[1, 9, 4], [0, 0, 7]], dtype=np.int32), "axis": 0},
        label="const-2d-indices",
        **EXACT,
    ),
    SimCase(
        "gather",
        {"x": _x("gb", 2, 5, 3)},
        lambda x, **_: np.array([x[0][[4, 1]], x[1][[0, 0]]]),
        params={"indices": np.array([[4, 1], [0, 0]], dtype=np.int16), "axis": 1, "batch_dims": 1},
        label="batch-dims",
        **EXACT,
    ),
    SimCase(
        "gather",
        {"x": _ints, "indices": np.array([5, 0, 2])},
        lambda x, indices, **_: x[..., [5, 0, 2]].astype(np.int64),
        params={"axis": -1},
        label="int32",
    ),
    # gather_along_axis
    SimCase(
        "gather_along_axis",
        {"x": _x4, "indices": rng("gaa").integers(-6, 6, size=(1, 8, 1, 3))},
        lambda x, indices, **_: _gather_along(x, indices.astype(np.int64), 3),
        params={"axis": -1},
        label="spatial",
        **EXACT,
    ),
    SimCase(
        "gather_along_axis",
        {"x": _x4},
        lambda x, **_: _gather_along(x, _gaa_idx, 1),
        params={"indices": _gaa_idx, "axis": 1},
        label="channels-const-uint8",
        **EXACT,
    ),
    # pad
    SimCase(
        "pad",
        {"x": _img},
        lambda x, **_: _pad_expected(x, [1, 2, 0, 3], "constant", 1.5),
        params={"pad": _i64(1, 2, 0, 3), "mode": "constant", "constant_val": 1.5},
        label="constant",
        **EXACT,
    ),
    SimCase(
        "pad",
        {"x": _img},
        lambda x, **_: _pad_expected(x, [2, 3], "constant", 0.0),
        params={"pad": _i64(2, 3)},
        label="constant-default-last-dim",
        **EXACT,
    ),
    SimCase(
        "pad",
        {"x": _img},
        lambda x, **_: _pad_expected(x, [3, 1, 2, 4], "reflect"),
        params={"pad": _i64(3, 1, 2, 4), "mode": "reflect"},
        label="reflect",
        **EXACT,
    ),
    SimCase(
        "pad",
        {"x": _img},
        lambda x, **_: _pad_expected(x, [4, 2, 5, 1], "replicate"),
        params={"pad": _i64(4, 2, 5, 1), "mode": "replicate"},
        label="replicate",
        **EXACT,
    ),
    SimCase(
        "pad",
        {"x": _x4},
        lambda x, **_: _pad_expected(x, [0, 0, 0, 0, 2, 2], "reflect"),
        params={"pad": _i64(0, 0, 0, 0, 2, 2), "mode": "reflect"},
        label="reflect-sequence",
        **EXACT,
    ),
    # shuffles
    SimCase(
        "depth_to_space",
        {"x": _x("d2s", 1, 8, 2, 3)},
        lambda x, **_: _depth_to_space(x, 2),
        params={"block_size": 2},
        label="",
        **EXACT,
    ),
    SimCase(
        "space_to_depth",
        {"x": _x("s2d", 1, 2, 4, 6)},
        lambda x, **_: _space_to_depth(x, 2),
        params={"block_size": 2},
        label="",
        **EXACT,
    ),
    SimCase(
        "pixel_shuffle",
        {"x": _x("ps", 1, 8, 2, 3)},
        lambda x, **_: _pixel_shuffle(x, 2),
        params={"upscale_factor": 2},
        label="",
        **EXACT,
    ),
    SimCase(
        "pixel_unshuffle",
        {"x": _x("pu", 1, 2, 6, 3)},
        lambda x, **_: _pixel_unshuffle(x, 3),
        params={"downscale_factor": np.array(3, dtype=np.uint32)},
        label="uint32-factor",
        **EXACT,
    ),
    SimCase(
        "pixel_unshuffle",
        {"x": _x("pu2", 1, 2, 4, 6)},
        lambda x, **_: _pixel_unshuffle(x, 2),
        params={"downscale_factor": 2},
        label="int32-factor",
        **EXACT,
    ),
    # upsample_nearest_neighbor
    SimCase(
        "upsample_nearest_neighbor",
        {"x": _x("up", 1, 2, 3, 4)},
        lambda x, **_: x[:, :, [0, 0, 1, 1, 2, 2]][..., [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]],
        params={"scale_factor_height": 2, "scale_factor_width": 3},
        label="integer",
        **EXACT,
    ),
    SimCase(
        "upsample_nearest_neighbor",
        {"x": _x("upf", 1, 2, 4, 3)},
        # floor(4 * 1.5) = 6 rows from floor(i / 1.5); floor(3 * 2.5) = 7 cols from floor(j / 2.5)
        lambda x, **_: x[:, :, [0, 0, 1, 2, 2, 3]][..., [0, 0, 0, 1, 1, 2, 2]],
        params={
            "scale_factor_height": np.array(1.5, dtype=np.float32),
            "scale_factor_width": np.array(2.5, dtype=np.float32),
        },
        label="fractional",
        **EXACT,
    ),
    # fill / shape / identity
    SimCase(
        "fill",
        {},
        lambda **_: np.full((1, 4, 1, 6), -2.5),
        params={"shape": _i64(1, 4, 1, 6), "value": np.array(-2.5, dtype=np.float16)},
        label="fp16",
        **EXACT,
    ),
    SimCase(
        "fill",
        {},
        lambda **_: np.zeros((2, 3)),
        params={"shape": _i64(2, 3)},
        label="default-fp32-zero",
        **EXACT,
    ),
    SimCase(
        "fill",
        {},
        lambda **_: np.full((3, 2), 7, dtype=np.int64),
        params={"shape": _i64(3, 2), "value": 7},
        label="int32",
    ),
    SimCase(
        "fill",
        {},
        lambda **_: np.ones((2, 2), dtype=bool),
        params={"shape": _i64(2, 2), "value": True},
        label="bool",
    ),
    SimCase("shape", {"x": _x4}, lambda x, **_: np.array([1, 8, 1, 6], dtype=np.int64), label="fp16"),
    SimCase("shape", {"x": _mask_bits}, lambda x, **_: np.array([1, 4, 1, 6], dtype=np.int64), label="bool"),
    SimCase("identity", {"x": _x4}, lambda x, **_: x, label="fp16", **EXACT),
    SimCase("identity", {"x": _ints}, lambda x, **_: x.astype(np.int64), label="int32"),
]

_INT_RANGES = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
    "int32": (-(2**31), 2**31 - 1),
}

QUANTIZATION_CASES = [
    # cast
    *[
        SimCase(
            "cast",
            {"x": _cast_x},
            lambda x, lo=lo, hi=hi, **_: _cast_int(x, lo, hi),
            params={"dtype": name},
            label=f"fp16-to-{name}",
        )
        for name, (lo, hi) in _INT_RANGES.items()
    ],
    SimCase(
        "cast",
        {"x": _cast_x},
        lambda x, **_: np.array([[v != 0 for v in row] for row in x.reshape(3, 8)]).reshape(x.shape),
        params={"dtype": "bool"},
        label="fp16-to-bool",
    ),
    SimCase(
        "cast",
        {"x": _cast_x},
        lambda x, **_: x,
        params={"dtype": "fp32"},
        label="fp16-to-fp32",
        **EXACT,
    ),
    SimCase(
        "cast",
        {"x": _x4},
        lambda x, **_: x,
        params={"dtype": "fp16"},
        label="fp16-to-fp16",
        **EXACT,
    ),
    SimCase(
        "cast",
        {"x": np.array([[0.1, -1.0 / 3.0, 1e5, 65519.0, 65520.0, 1e-6, 3e-8, 2e-8, 2049.0, 2051.0]])},
        # fp32 input -> fp16 rounds once to nearest even: 65520 overflows to inf, 3e-8 becomes the
        # smallest subnormal 2**-24 and 2e-8 flushes to 0; 2049 and 2051 are ties (-> 2048, 2052)
        lambda x, **_: np.array(
            [
                [
                    0.0999755859375,
                    -0.333251953125,
                    np.inf,
                    65504.0,
                    np.inf,
                    1.0132789611816406e-06,
                    2.0**-24,
                    0.0,
                    2048.0,
                    2052.0,
                ]
            ]
        ),
        params={"dtype": "fp16"},
        dtype="fp32",
        label="fp32-to-fp16",
        **EXACT,
    ),
    SimCase(
        "cast",
        {"x": _ints * 7},
        # |x| up to 7000: above 2048 fp16 keeps multiples of 2, above 4096 multiples of 4
        lambda x, **_: x.astype(np.float64),
        params={"dtype": "fp16"},
        label="int32-to-fp16",
        **FP16_ONCE,
    ),
    SimCase(
        "cast",
        {"x": _ints // 4},
        lambda x, **_: np.clip(x, -128, 127),
        params={"dtype": "int8"},
        label="int32-to-int8-saturates",
    ),
    SimCase(
        "cast",
        {"x": _mask_bits},
        lambda x, **_: x.astype(np.int64),
        params={"dtype": "int32"},
        label="bool-to-int32",
    ),
    SimCase(
        "cast",
        {"x": _mask_bits},
        lambda x, **_: x.astype(np.float64),
        params={"dtype": "fp16"},
        label="bool-to-fp16",
        **EXACT,
    ),
    # quantize
    SimCase(
        "quantize",
        {"input": _q_x},
        lambda input, **_: _quantize(input, np.array(0.25), np.array(3), -128, 127),
        params={"scale": 0.25, "zero_point": np.array(3, dtype=np.int8), "output_dtype": "int8"},
        label="per-tensor-int8",
    ),
    SimCase(
        "quantize",
        {"input": _q_x},
        lambda input, **_: _quantize(input, np.array(0.125), np.array(0), 0, 255),
        params={"scale": 0.125, "output_dtype": "uint8"},
        label="per-tensor-uint8-no-zp",
    ),
    SimCase(
        "quantize",
        {"input": _q_x},
        lambda input, **_: _quantize(
            input, _q_scale_axis.reshape(1, 4, 1, 1), _q_zp_axis.astype(np.int64).reshape(1, 4, 1, 1), 0, 255
        ),
        params={"scale": _q_scale_axis, "zero_point": _q_zp_axis, "axis": 1, "output_dtype": "uint8"},
        label="per-axis-uint8",
    ),
    SimCase(
        "quantize",
        {"input": _q_x},
        lambda input, **_: _quantize(input, _q_scale_axis[[0, 1, 2, 3, 0, 1, 2, 3]], np.array(0), -128, 127),
        params={"scale": _q_scale_axis[[0, 1, 2, 3, 0, 1, 2, 3]], "axis": -1, "output_dtype": "int8"},
        label="per-axis-last-int8",
    ),
    # dequantize (the input must be int8 / uint8, which a runtime input of the harness cannot be: const)
    SimCase(
        "dequantize",
        {},
        lambda **_: (_dq_int8.astype(np.float64) + 4.0) * 0.0625,
        params={
            "input": _dq_int8,
            "scale": np.array(0.0625, dtype=np.float16),
            "zero_point": np.array(-4, dtype=np.int8),
        },
        label="per-tensor-fp16",
        **FP16_ONCE,
    ),
    SimCase(
        "dequantize",
        {},
        lambda **_: (
            (_dq_uint8.astype(np.float64) - _dq_zp_axis.reshape(1, 4, 1, 1))
            * _dq_scale_axis.astype(np.float64).reshape(1, 4, 1, 1)
        ),
        params={"input": _dq_uint8, "scale": _dq_scale_axis, "zero_point": _dq_zp_axis, "axis": 1},
        label="per-axis-fp32",
        **FP32_ONCE,
    ),
    SimCase(
        "dequantize",
        {},
        lambda **_: _dq_int8.astype(np.float64) * 0.5,
        params={"input": _dq_int8, "scale": np.array(0.5, dtype=np.float32)},
        label="no-zero-point",
        **EXACT,
    ),
    # constexpr_affine_dequantize (iOS16)
    SimCase(
        "constexpr_affine_dequantize",
        {},
        lambda **_: (
            (_w_q.astype(np.float64) - _w_zp.reshape(8, 1, 1, 1))
            * _w_scale16.astype(np.float64).reshape(8, 1, 1, 1)
        ),
        params={"quantized_data": _w_q, "zero_point": _w_zp, "scale": _w_scale16, "axis": 0},
        label="per-channel-uint8-fp16",
        **FP16_ONCE,
    ),
    SimCase(
        "constexpr_affine_dequantize",
        {},
        lambda **_: (_w_qi8.astype(np.float64) - 1.5) * np.float64(np.float32(0.02)),
        params={
            "quantized_data": _w_qi8,
            "zero_point": np.array(1.5, dtype=np.float32),
            "scale": np.array(0.02, dtype=np.float32),
            "axis": 1,
        },
        label="scalar-int8-fp32-zp",
        **FP32_ONCE,
    ),
    SimCase(
        "constexpr_affine_dequantize",
        {},
        lambda **_: (_w_qi8.astype(np.float64) - np.array([0, -3, 5, 127]).reshape(1, 4)) * 0.25,
        params={
            "quantized_data": _w_qi8,
            "zero_point": np.array([0, -3, 5, 127], dtype=np.int8),
            "scale": np.array(0.25, dtype=np.float32),
            "axis": -1,
        },
        label="vector-zp-scalar-scale",
        **EXACT,
    ),
    # constexpr_cast (iOS16)
    SimCase(
        "constexpr_cast",
        {},
        lambda **_: _cast_src.astype(np.float64),
        params={"source_val": _cast_src, "output_dtype": "fp32"},
        label="",
        **EXACT,
    ),
    # constexpr_blockwise_shift_scale (iOS18)
    SimCase(
        "constexpr_blockwise_shift_scale",
        {},
        lambda **_: (
            (_bw_int4 - _blocks((8, 6), _bw_int4_off)) * _blocks((8, 6), _bw_scale32.astype(np.float64))
        ),
        params={
            "data": tensor_literal("int4", _bw_int4),
            "scale": _bw_scale32,
            "offset": tensor_literal("int4", _bw_int4_off),
        },
        label="int4-int4-offset",
        **FP32_ONCE,
    ),
    SimCase(
        "constexpr_blockwise_shift_scale",
        {},
        lambda **_: (
            (_bw_uint4 - _blocks((4, 8, 1, 1), _bw_uint4_off))
            * _blocks((4, 8, 1, 1), _bw_uint4_scale16.astype(np.float64))
        ),
        params={
            "data": tensor_literal("uint4", _bw_uint4),
            "scale": _bw_uint4_scale16,
            "offset": tensor_literal("uint4", _bw_uint4_off),
        },
        label="uint4-conv-weight-fp16",
        **FP16_ONCE,
    ),
    SimCase(
        "constexpr_blockwise_shift_scale",
        {},
        # data - offset cancels to small values; the product is still one rounding of exact operands
        lambda **_: (
            (_bw_uint8 - _blocks((6, 8), _bw_uint8_off.astype(np.float64)))
            * _blocks((6, 8), _bw_uint8_scale.astype(np.float64))
        ),
        params={"data": _bw_uint8, "scale": _bw_uint8_scale, "offset": _bw_uint8_off},
        label="uint8-float-offset",
        **FP32_ONCE,
    ),
    SimCase(
        "constexpr_blockwise_shift_scale",
        {},
        lambda **_: _bw_int8 * _blocks((8, 4), _bw_int8_scale16.astype(np.float64)),
        params={"data": _bw_int8, "scale": _bw_int8_scale16},
        label="int8-per-row-no-offset",
        **FP16_ONCE,
    ),
    # constexpr_lut_to_dense: iOS16 (packed bytes + shape) and iOS18 (typed indices) forms
    _lut16_case(1),
    _lut16_case(4),
    _lut16_case(6),  # 6-bit indices straddle byte boundaries
    SimCase(
        "constexpr_lut_to_dense",
        {},
        lambda **_: _lut18(_l18_u4, _l18_u4_lut.astype(np.float64)),
        params={"indices": tensor_literal("uint4", _l18_u4), "lut": _l18_u4_lut},
        label="ios18-uint4-grouped",
        **EXACT,
    ),
    SimCase(
        "constexpr_lut_to_dense",
        {},
        lambda **_: _lut18(_l18_u2, _l18_u2_lut.astype(np.float64), vector_axis=1),
        params={"indices": tensor_literal("uint2", _l18_u2), "lut": _l18_u2_lut, "vector_axis": 1},
        label="ios18-uint2-vector",
        **EXACT,
    ),
    SimCase(
        "constexpr_lut_to_dense",
        {},
        lambda **_: _lut18(_l18_u1, _l18_u1_lut.astype(np.float64)).astype(np.int64),
        params={"indices": tensor_literal("uint1", _l18_u1), "lut": _l18_u1_lut},
        label="ios18-uint1-int8-lut",
    ),
    SimCase(
        "constexpr_lut_to_dense",
        {},
        lambda **_: _lut18(_l18_u3, _l18_u3_lut.astype(np.float64), vector_axis=-2),
        params={"indices": tensor_literal("uint3", _l18_u3), "lut": _l18_u3_lut, "vector_axis": -2},
        label="ios18-uint3-vector-blocked",
        **EXACT,
    ),
    SimCase(
        "constexpr_lut_to_dense",
        {},
        lambda **_: _lut18(_l18_u6, _l18_u6_lut.astype(np.float64)),
        params={"indices": tensor_literal("uint6", _l18_u6), "lut": _l18_u6_lut},
        label="ios18-uint6",
        **EXACT,
    ),
    SimCase(
        "constexpr_lut_to_dense",
        {},
        lambda **_: _lut18(_l18_u8, _l18_u8_lut.astype(np.float64)).astype(np.int64),
        params={"indices": _l18_u8, "lut": _l18_u8_lut},
        label="ios18-uint8-uint8-lut",
    ),
    # constexpr_sparse_to_dense: iOS16 (packed mask bits + shape) and iOS18 (uint1 mask) forms
    SimCase(
        "constexpr_sparse_to_dense",
        {},
        lambda **_: _scatter(_sp_bits16, _sp_data16),
        params={
            "nonzero_data": _sp_data16,
            "mask": _pack_lsb(_sp_bits16, 1),
            "shape": np.array(_sp_bits16.shape, dtype=np.uint32),
        },
        label="ios16",
        opset="ios16",
        **EXACT,
    ),
    SimCase(
        "constexpr_sparse_to_dense",
        {},
        lambda **_: _scatter(_sp_bits18, _sp_data18),
        params={"nonzero_data": _sp_data18, "mask": tensor_literal("uint1", _sp_bits18)},
        label="ios18-fp16",
        **EXACT,
    ),
    SimCase(
        "constexpr_sparse_to_dense",
        {},
        lambda **_: _scatter(_sp_bits18b, _sp_int4).astype(np.int64),
        params={
            "nonzero_data": tensor_literal("int4", _sp_int4),
            "mask": tensor_literal("uint1", _sp_bits18b),
        },
        label="ios18-int4",
    ),
    SimCase(
        "constexpr_sparse_to_dense",
        {},
        lambda **_: _scatter(_sp_bits_u8, _sp_data_u8).astype(np.int64),
        params={"nonzero_data": _sp_data_u8, "mask": tensor_literal("uint1", _sp_bits_u8)},
        label="ios18-uint8",
    ),
    # constexpr_lut_to_sparse (iOS18): outputs (mask, decoded nonzero values)
    SimCase(
        "constexpr_lut_to_sparse",
        {},
        lambda **_: (
            _ls_mask.astype(np.int64),
            _nonzero_in_order(
                _lut18(_scatter(_ls_mask, _ls_idx).astype(np.int64), _ls_lut.astype(np.float64)), _ls_mask
            ),
        ),
        params={
            "indices_mask": tensor_literal("uint1", _ls_mask),
            "indices_nonzero_data": tensor_literal("uint2", _ls_idx),
            "lut": _ls_lut,
        },
        label="uint2-grouped",
        **EXACT,
    ),
    SimCase(
        "constexpr_lut_to_sparse",
        {},
        lambda **_: (
            np.repeat(_ls_mask_v, 3, axis=1).astype(np.int64),
            _nonzero_in_order(
                _lut18(_scatter(_ls_mask_v, _ls_idx_v).astype(np.int64), _ls_lut_v.astype(np.float64), 1),
                np.repeat(_ls_mask_v, 3, axis=1),
            ),
        ),
        params={
            "indices_mask": tensor_literal("uint1", _ls_mask_v),
            "indices_nonzero_data": tensor_literal("uint1", _ls_idx_v),
            "lut": _ls_lut_v,
            "vector_axis": 1,
        },
        label="uint1-vector",
        **EXACT,
    ),
    # constexpr_sparse_blockwise_shift_scale (iOS18): outputs (mask, dequantized nonzero values)
    SimCase(
        "constexpr_sparse_blockwise_shift_scale",
        {},
        lambda **_: (
            _sbs_mask.astype(np.int64),
            _nonzero_in_order(
                (_scatter(_sbs_mask, _sbs_data) - _blocks((4, 8), _sbs_off.astype(np.float64)))
                * _blocks((4, 8), _sbs_scale.astype(np.float64)),
                _sbs_mask,
            ),
        ),
        params={
            "data_mask": tensor_literal("uint1", _sbs_mask),
            "nonzero_data": _sbs_data,
            "scale": _sbs_scale,
            "offset": _sbs_off,
        },
        label="int8-offset-fp16",
        **FP16_ONCE,
    ),
    SimCase(
        "constexpr_sparse_blockwise_shift_scale",
        {},
        lambda **_: (
            _sbs_mask4.astype(np.int64),
            _nonzero_in_order(
                _scatter(_sbs_mask4, _sbs_data4) * _blocks((2, 3, 4), _sbs_scale4.astype(np.float64)),
                _sbs_mask4,
            ),
        ),
        params={
            "data_mask": tensor_literal("uint1", _sbs_mask4),
            "nonzero_data": tensor_literal("uint4", _sbs_data4),
            "scale": _sbs_scale4,
        },
        label="uint4-no-offset-fp32",
        **FP32_ONCE,
    ),
]

CASES = TENSOR_OPS_CASES + QUANTIZATION_CASES

assert len({c.id for c in CASES}) == len(CASES), "case ids must be distinct"

# A runtime int8 activation (the real use of dequantize), per-tensor scale and zero point.
_q8 = rng("dequantize-runtime").integers(-128, 128, size=(1, 4, 1, 6)).astype(np.int8)
CASES.append(
    SimCase(
        "dequantize",
        {"input": _q8},
        lambda input, scale, zero_point, **_: (input.astype(np.float64) - float(zero_point)) * float(scale),
        params={"scale": np.array(0.0625, dtype=np.float16), "zero_point": np.array(3, dtype=np.int8)},
        rtol=1e-3,
        atol=0,
        label="runtime-int8",
    )
)
