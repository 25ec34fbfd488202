"""The programs the published timings ran, written as MIL: each benchmark's kernel rebuilt from what its
source says it is (shapes, depth, weights as BLOBFILE constants), so anekit counts their work itself.

Layouts follow the source: anekit's own [1, C, 1, S] for maderix/ANE's kernels (a 1x1 conv over S
columns), NCHW for the guide's and ANEForge's convolutions, and a GEMM of M rows, K inputs and N outputs
as a 1x1 conv over M columns (the engine's dense layer: the same FLOPs, weights and surfaces).
"""

from __future__ import annotations

from anekit.mil import Builder, Program, tensor
from anekit.mil.builder import FunctionBuilder
from anekit.mil.ir import Var


def _weight(f: FunctionBuilder, shape: list[int], name: str) -> Var:
    return f.weight(tensor("fp16", shape), f"@model_path/weights/{name}.bin", 64)


def conv_program(
    channels: int,
    spatial: int,
    depth: int = 1,
    *,
    out_channels: int | None = None,
    kernel: int = 1,
    height: int = 1,
    batch: int = 1,
    relu: bool = False,
) -> Program:
    """``depth`` chained convs on [batch, channels, height, spatial]: the first maps ``channels`` to
    ``out_channels`` (default the same), the rest keep it; ``kernel`` x ``kernel`` windows with "same"
    padding; a relu after each when ``relu``. The default is maderix/ANE's benchmark kernel, 1x1 convs on
    [1, C, 1, S] (inmem_peak.m genMIL)."""
    b = Builder()
    f = b.function("main")
    y = f.input("x", tensor("fp16", [batch, channels, height, spatial]))
    pad = (kernel - 1) // 2
    c_in, c_out = channels, out_channels or channels
    for i in range(depth):
        w = _weight(f, [c_out, c_in, kernel, kernel], f"w{i}")
        y = f.conv(
            x=y, weight=w, strides=[1, 1], pad_type="custom", pad=[pad] * 4, dilations=[1, 1], groups=1
        )  # (batch, c_out, height, spatial)
        if relu:
            y = f.relu(x=y)
        c_in = c_out
    f.output(y)
    return b.build()


def gemm_program(rows: int, inner: int, cols: int) -> Program:
    """Y (rows x cols) = X (rows x inner) @ W (inner x cols), W constant: a 1x1 conv over ``rows`` columns."""
    return conv_program(inner, rows, out_channels=cols)


def add_program(channels: int, spatial: int) -> Program:
    """z = x + y on two [1, channels, 1, spatial] inputs."""
    b = Builder()
    f = b.function("main")
    shape = [1, channels, 1, spatial]
    f.output(f.add(x=f.input("x", tensor("fp16", shape)), y=f.input("y", tensor("fp16", shape))))
    return b.build()


def relu_program(channels: int, spatial: int) -> Program:
    """relu on one [1, channels, 1, spatial] input: a surface streamed in and out."""
    b = Builder()
    f = b.function("main")
    f.output(f.relu(x=f.input("x", tensor("fp16", [1, channels, 1, spatial]))))
    return b.build()


def attention_program(seq: int, dim: int, heads: int) -> Program:
    """Multi-head self-attention on [1, dim, 1, seq]: Q, K, V and output projections (1x1 convs) and,
    per head, softmax(Q K^T) V as two matmuls (ANEForge's decomposed-SDPA route)."""
    b = Builder()
    f = b.function("main")
    head = dim // heads
    x = f.input("x", tensor("fp16", [1, dim, 1, seq]))

    def project(v: Var, name: str) -> Var:
        return f.conv1x1(v, _weight(f, [dim, dim, 1, 1], name))  # (1, dim, 1, seq)

    def split(v: Var) -> Var:
        return f.transpose(
            x=f.reshape(x=v, shape=[1, heads, head, seq]), perm=[0, 1, 3, 2]
        )  # (1, h, seq, hd)

    q, k, v = (split(project(x, n)) for n in ("wq", "wk", "wv"))
    scores = f.matmul(x=q, y=k, transpose_x=False, transpose_y=True)  # (1, h, seq, seq)
    probs = f.softmax(x=scores, axis=-1)
    o = f.matmul(x=probs, y=v, transpose_x=False, transpose_y=False)  # (1, h, seq, hd)
    o = f.reshape(x=f.transpose(x=o, perm=[0, 1, 3, 2]), shape=[1, dim, 1, seq])  # (1, dim, 1, seq)
    f.output(project(o, "wo"))
    return b.build()
