"""The transposed products of the backward kernels over either weight source (``WeightSource.linear_t``):
baked (1x1 convs of W^T) and packed (token-row matmuls, a segment holding W as stored or W^T) give the
float64 sum of W^T @ x, whatever the form of the packed input: one product of a stacked input, or one per
term summed in the token-row layout."""

from __future__ import annotations

import numpy as np
import pytest

from anekit import mil, runtime
from anekit.kernels import ModelConfig
from anekit.kernels.blocks import KernelBuilder
from anekit.kernels.composable import COLUMN_ALIGN, Segment, SpatialLayout, dynamic_builder
from anekit.kernels.source import Baked, Packed
from anekit.kernels.spec import Layout, LayoutError

CFG = ModelConfig(32, 64, 1, 2, 1, 16, 64)  # q_dim 32, kv_dim 16
S = CFG.seq_len
TERMS = [("dq", "wq", "q"), ("dk", "wk", "k"), ("dv", "wv", "v")]
PARTS = Layout.of([("dq", CFG.q_dim), ("dk", CFG.kv_dim), ("dv", CFG.kv_dim)], S)
OUT = Layout.of([("dx", CFG.dim)], S)


def _data(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """fp16-exact weights (llama2.c's (out, in)), the three gradients, and the float64 dx."""
    rng = np.random.default_rng(seed)

    def fp16(shape: tuple[int, ...], scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)

    d, q, kv = CFG.dim, CFG.q_dim, CFG.kv_dim
    w = {"wq": fp16((q, d), 0.2), "wk": fp16((kv, d), 0.2), "wv": fp16((kv, d), 0.2)}
    acts = {"dq": fp16((q, S), 1.0), "dk": fp16((kv, S), 1.0), "dv": fp16((kv, S), 1.0)}
    want = sum(w[key].astype(np.float64).T @ acts[part].astype(np.float64) for part, key, _ in TERMS)
    return w, acts, want


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-2 * np.abs(want).max()


def test_baked_sum_of_transposed_products_is_the_float64_one():
    w, acts, want = _data()
    src = Baked(KernelBuilder("t", CFG, PARTS, w))
    spec = src.finish(OUT, {"dx": src.linear_t(TERMS, "dx")})
    mil.verify(spec.program)
    names = [op.outputs[0].name for op in spec.program.functions["main"].block.ops]
    assert {"dx_q", "dx_k", "dx_v", "dx_qk", "out"} <= set(names)  # the partial sum named by its labels
    _close(spec.run(runtime.open("sim", numerics="ieee"), **acts)["dx"], want)


@pytest.mark.parametrize("wk_transposed", [False, True])
def test_packed_terms_side_by_side_are_summed_in_token_rows(wk_transposed):
    """Each gradient in its own segment (no stacked product possible), W_k packed as W or as W^T."""
    d, q, kv = CFG.dim, CFG.q_dim, CFG.kv_dim
    wk = (
        Segment("wk_t", d, kv, (("wk", d, True),))
        if wk_transposed
        else Segment("wk", kv, d, (("wk", kv, False),))
    )
    columns = SpatialLayout.of(
        q,
        [
            Segment("dq", q, S),
            Segment("dk", kv, S),
            Segment("dv", kv, S),
            Segment("wq", q, d, (("wq", q, False),)),
            wk,
            Segment("wv", kv, d, (("wv", kv, False),)),
        ],
        align=COLUMN_ALIGN,
    )
    w, acts, want = _data(1)
    src = Packed(dynamic_builder("t", CFG, columns), columns, PARTS)
    spec = src.finish(OUT, {"dx": src.linear_t(TERMS, "dx", name="out")})
    mil.verify(spec.program)
    ops = spec.program.functions["main"].block.ops
    assert sum(op.op_type == "matmul" for op in ops) == 3
    names = {op.outputs[0].name for op in ops}
    assert {"dx_sum2", "dx_sum", "out"} <= names
    assert ("dx_k_wt" in names) == wk_transposed  # a W^T segment is transposed to W in the kernel
    _close(spec.run(runtime.open("sim", numerics="ieee"), w, **acts)["dx"], want)


def test_packed_stacked_input_is_one_product():
    c = CFG.q_dim + 2 * CFG.kv_dim
    sources = (("wq", CFG.q_dim, False), ("wk", CFG.kv_dim, False), ("wv", CFG.kv_dim, False))
    columns = SpatialLayout.of(
        c, [Segment("act", c, S), Segment("wqkv", c, CFG.dim, sources)], align=COLUMN_ALIGN
    )
    w, acts, want = _data(2)
    src = Packed(dynamic_builder("t", CFG, columns), columns, PARTS)
    spec = src.finish(OUT, {"dx": src.linear_t(TERMS, "dx", name="out")})
    assert sum(op.op_type == "matmul" for op in spec.program.functions["main"].block.ops) == 1
    _close(spec.run(runtime.open("sim", numerics="ieee"), w, **acts)["dx"], want)


def test_no_terms_is_refused_naming_the_kernel():
    with pytest.raises(LayoutError, match=r"\[t\] linear_t 'dx' has no terms"):
        Baked(KernelBuilder("t", CFG, PARTS, None)).linear_t([], "dx")
