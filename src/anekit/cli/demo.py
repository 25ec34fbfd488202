"""``anekit demo``: build a transformer layer as MIL, print it, parse it back and verify it."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from anekit import mil
from anekit.mil import tensor

WEIGHTS = "@model_path/weights/layer.bin"


def _blob_offsets(sizes: list[int]) -> list[int]:
    """Metadata offsets of consecutive fp16 blobs in one weight file (64-byte header, 64-byte records)."""
    offsets, pos = [], 64
    for nbytes in sizes:
        offsets.append(pos)
        pos += 64 + (nbytes + 63) // 64 * 64
    return offsets


def transformer_layer(dim: int = 64, hidden: int = 176, heads: int = 4, seq: int = 16) -> mil.Program:
    """One llama-style layer on [1, dim, 1, seq] fp16: RMSNorm, causal attention, RMSNorm, SwiGLU FFN.

    Projections are 1x1 convs whose weights are BLOBFILE consts in one weight file, as the ANE
    training kernels lay them out.
    """
    hd = dim // heads
    shapes = {
        "wq": [dim, dim, 1, 1],
        "wk": [dim, dim, 1, 1],
        "wv": [dim, dim, 1, 1],
        "wo": [dim, dim, 1, 1],
        "w1": [hidden, dim, 1, 1],
        "w3": [hidden, dim, 1, 1],
        "w2": [dim, hidden, 1, 1],
        "rms_att": [1, dim, 1, 1],
        "rms_ffn": [1, dim, 1, 1],
        "mask": [1, 1, seq, seq],
    }
    offsets = _blob_offsets([2 * math.prod(s) for s in shapes.values()])
    b = mil.Builder()
    f = b.function("main", opset="ios18")
    x = f.input("x", tensor("fp16", [1, dim, 1, seq]))
    w = {k: f.weight(tensor("fp16", s), WEIGHTS, off, name=k) for (k, s), off in zip(shapes.items(), offsets)}

    def rmsnorm(v: mil.Var, scale: mil.Var, tag: str) -> mil.Var:
        sq = f.mul(x=v, y=v, name=f"{tag}_sq")  # (1, dim, 1, seq)
        ss = f.reduce_sum(x=sq, axes=[1], keep_dims=True, name=f"{tag}_ss")  # (1, 1, 1, seq)
        ms = f.mul(x=ss, y=1.0 / dim, name=f"{tag}_ms")
        rr = f.pow(x=f.add(x=ms, y=1e-5, name=f"{tag}_eps"), y=-0.5, name=f"{tag}_rrms")
        return f.mul(x=f.mul(x=v, y=rr, name=f"{tag}_xr"), y=scale, name=f"{tag}_out")

    def conv(v: mil.Var, weight: mil.Var, name: str) -> mil.Var:
        return f.conv(
            x=v,
            weight=weight,
            strides=[1, 1],
            pad_type="valid",
            pad=[0, 0, 0, 0],
            dilations=[1, 1],
            groups=1,
            name=name,
        )

    def heads_view(v: mil.Var, tag: str) -> mil.Var:
        v4 = f.reshape(x=v, shape=[1, heads, hd, seq], name=f"{tag}_4d")  # (1, heads, hd, seq)
        return f.transpose(x=v4, perm=[0, 1, 3, 2], name=f"{tag}_t")  # (1, heads, seq, hd)

    xn = rmsnorm(x, w["rms_att"], "att_norm")
    q = heads_view(conv(xn, w["wq"], "q"), "q")
    k = heads_view(conv(xn, w["wk"], "k"), "k")
    v = heads_view(conv(xn, w["wv"], "v"), "v")
    scores = f.matmul(x=q, y=k, transpose_x=False, transpose_y=True, name="scores")  # (1, heads, seq, seq)
    scaled = f.mul(x=scores, y=1.0 / math.sqrt(hd), name="scaled")
    probs = f.softmax(x=f.add(x=scaled, y=w["mask"], name="masked"), axis=-1, name="probs")
    att = f.matmul(x=probs, y=v, transpose_x=False, transpose_y=False, name="att")  # (1, heads, seq, hd)
    att_t = f.transpose(x=att, perm=[0, 1, 3, 2], name="att_t")  # (1, heads, hd, seq)
    att = f.reshape(x=att_t, shape=[1, dim, 1, seq], name="att_f")  # (1, dim, 1, seq)
    x2 = f.add(x=x, y=conv(att, w["wo"], "o"), name="x2")  # residual, (1, dim, 1, seq)
    x2n = rmsnorm(x2, w["rms_ffn"], "ffn_norm")
    h1 = conv(x2n, w["w1"], "h1")  # (1, hidden, 1, seq)
    h3 = conv(x2n, w["w3"], "h3")
    gate = f.mul(x=f.mul(x=h1, y=f.sigmoid(x=h1, name="sig"), name="silu"), y=h3, name="gate")
    out = f.add(x=x2, y=conv(gate, w["w2"], "ffn"), name="out")
    f.output(out)
    return b.build()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build, print, parse and verify a transformer-layer MIL program")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=176)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--out", type=Path, help="also write the MIL text to this file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    prog = transformer_layer(args.dim, args.hidden, args.heads, args.seq)
    t1 = time.perf_counter()
    text = mil.to_text(prog)
    t2 = time.perf_counter()
    parsed = mil.verify(mil.parse(text, "<demo>"))
    t3 = time.perf_counter()
    lines = text.splitlines()
    print(
        f"Built a transformer layer (dim {args.dim}, hidden {args.hidden}, heads {args.heads}, "
        f"seq {args.seq}): {prog.op_count()} ops, {len(text)} characters of MIL."
    )
    print("\n".join([*lines[:6], "    ...", *lines[-4:]]))
    print(f"signature: {parsed.main.signature()}")
    same_ir = parsed == prog
    same_text = mil.to_text(parsed) == text
    print(f"parse(print(p)) == p: {same_ir}; print(parse(t)) == t: {same_text}")
    ms = [1e3 * d for d in (t1 - t0, t2 - t1, t3 - t2)]
    print(f"build {ms[0]:.1f} ms, print {ms[1]:.1f} ms, parse+verify {ms[2]:.1f} ms")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    if not (same_ir and same_text):
        print("round trip FAILED", file=sys.stderr)
        return 1
    return 0
