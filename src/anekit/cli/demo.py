"""``anekit demo``: a transformer layer as MIL — built, printed, parsed, verified and simulated.

The layer's weights are packed into one MILBlob weight file, the program refers to them with
BLOBFILE consts, the simulator runs it with ANE numerics (fp16 storage, fp32 accumulation), and the
result is compared with an unfused float64 numpy reference of the same layer.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from anekit import mil, runtime
from anekit.blob import build_blob_bytes
from anekit.mil import tensor

WEIGHTS = "@model_path/weights/layer.bin"
EPS = 1e-5
MASKED = -65504.0  # the most negative fp16: what the engine's causal mask adds above the diagonal


def layer_weights(dim: int, hidden: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random layer weights (float32) in the shapes the program's consts declare, plus the causal mask."""
    rng = np.random.default_rng(seed)

    def proj(out_ch: int, in_ch: int) -> np.ndarray:
        return (rng.standard_normal((out_ch, in_ch, 1, 1)) / math.sqrt(in_ch)).astype(np.float32)

    mask = np.triu(np.full((seq, seq), MASKED, dtype=np.float32), k=1).reshape(1, 1, seq, seq)
    return {
        "wq": proj(dim, dim),
        "wk": proj(dim, dim),
        "wv": proj(dim, dim),
        "wo": proj(dim, dim),
        "w1": proj(hidden, dim),
        "w3": proj(hidden, dim),
        "w2": proj(dim, hidden),
        "rms_att": (1 + 0.1 * rng.standard_normal((1, dim, 1, 1))).astype(np.float32),
        "rms_ffn": (1 + 0.1 * rng.standard_normal((1, dim, 1, 1))).astype(np.float32),
        "mask": mask,
    }


def transformer_layer(
    dim: int = 64,
    hidden: int = 176,
    heads: int = 4,
    seq: int = 16,
    offsets: dict[str, int] | None = None,
    ffn: bool = True,
) -> mil.Program:
    """One llama-style layer on [1, dim, 1, seq] fp16: RMSNorm, causal attention, RMSNorm, SwiGLU FFN.

    Projections are 1x1 convs whose weights are BLOBFILE consts in one weight file (``offsets``: the
    metadata offset of each weight; by default the layout ``pack_weights`` produces). With
    ``ffn=False`` the program ends after the attention residual (an SDPA-sized kernel).
    """
    hd = dim // heads
    ffn_only = ("w1", "w2", "w3", "rms_ffn")
    shapes = {
        k: list(v.shape) for k, v in layer_weights(dim, hidden, seq).items() if ffn or k not in ffn_only
    }
    if offsets is None:
        offsets = _default_offsets(shapes)
    b = mil.Builder()
    f = b.function("main", opset="ios18")
    x = f.input("x", tensor("fp16", [1, dim, 1, seq]))
    w = {k: f.weight(tensor("fp16", s), WEIGHTS, offsets[k], name=k) for k, s in shapes.items()}

    def rmsnorm(v: mil.Var, scale: mil.Var, tag: str) -> mil.Var:
        sq = f.mul(x=v, y=v, name=f"{tag}_sq")  # (1, dim, 1, seq)
        ss = f.reduce_sum(x=sq, axes=[1], keep_dims=True, name=f"{tag}_ss")  # (1, 1, 1, seq)
        ms = f.mul(x=ss, y=1.0 / dim, name=f"{tag}_ms")
        rr = f.pow(x=f.add(x=ms, y=EPS, name=f"{tag}_eps"), y=-0.5, name=f"{tag}_rrms")
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
    if not ffn:
        f.output(x2)
        return b.build()
    x2n = rmsnorm(x2, w["rms_ffn"], "ffn_norm")
    h1 = conv(x2n, w["w1"], "h1")  # (1, hidden, 1, seq)
    h3 = conv(x2n, w["w3"], "h3")
    gate = f.mul(x=f.mul(x=h1, y=f.sigmoid(x=h1, name="sig"), name="silu"), y=h3, name="gate")
    out = f.add(x=x2, y=conv(gate, w["w2"], "ffn"), name="out")
    f.output(out)
    return b.build()


def _default_offsets(shapes: dict[str, list[int]]) -> dict[str, int]:
    """Metadata offsets of consecutive fp16 blobs (64-byte header, 64-byte record, data padded to 64)."""
    offsets, pos = {}, 64
    for name, shape in shapes.items():
        offsets[name] = pos
        pos += 64 + (2 * math.prod(shape) + 63) // 64 * 64
    return offsets


def pack_weights(weights: dict[str, np.ndarray]) -> tuple[bytes, dict[str, int]]:
    """The layer's weight file (fp16 MILBlob) and the metadata offset of each weight."""
    data, offsets = build_blob_bytes([(w, "fp16") for w in weights.values()])
    return data, dict(zip(weights, offsets))


def layer_reference(x: np.ndarray, weights: dict[str, np.ndarray], heads: int) -> np.ndarray:
    """The same layer, unfused, in float64 numpy on (dim, seq) matrices."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    w16 = {k: v.astype(np.float16).astype(np.float64) for k, v in weights.items()}  # what the blob holds
    x = x.reshape(x.shape[1], x.shape[3]).astype(np.float64)  # (dim, seq)
    dim, seq = x.shape
    hd = dim // heads

    def rmsnorm(v: np.ndarray, scale: np.ndarray) -> np.ndarray:
        return v / np.sqrt(np.mean(v * v, axis=0, keepdims=True) + EPS) * scale.reshape(-1, 1)

    def mat(name: str) -> np.ndarray:
        return w16[name][:, :, 0, 0]  # (out, in)

    xn = rmsnorm(x, w16["rms_att"])
    q, k, v = (mat(n) @ xn for n in ("wq", "wk", "wv"))  # (dim, seq) each
    q, k, v = (m.reshape(heads, hd, seq).transpose(0, 2, 1) for m in (q, k, v))  # (heads, seq, hd)
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + w["mask"][0, 0]  # (heads, seq, seq)
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
    att = (probs @ v).transpose(0, 2, 1).reshape(dim, seq)  # (dim, seq)
    x2 = x + mat("wo") @ att
    x2n = rmsnorm(x2, w16["rms_ffn"])
    h1, h3 = mat("w1") @ x2n, mat("w3") @ x2n  # (hidden, seq)
    gate = h1 / (1 + np.exp(-h1)) * h3
    return (x2 + mat("w2") @ gate).reshape(1, dim, 1, seq)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="build, print, parse, verify and simulate a transformer-layer MIL program"
    )
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=176)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="also write the MIL text to this file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.dim % args.heads:
        print(f"anekit demo: --dim {args.dim} is not divisible by --heads {args.heads}", file=sys.stderr)
        return 2
    weights = layer_weights(args.dim, args.hidden, args.seq, args.seed)
    blob, offsets = pack_weights(weights)
    t0 = time.perf_counter()
    prog = transformer_layer(args.dim, args.hidden, args.heads, args.seq, offsets)
    t1 = time.perf_counter()
    text = mil.to_text(prog)
    t2 = time.perf_counter()
    parsed = mil.verify(mil.parse(text, "<demo>"))
    t3 = time.perf_counter()
    lines = text.splitlines()
    print(
        f"Built a transformer layer (dim {args.dim}, hidden {args.hidden}, heads {args.heads}, "
        f"seq {args.seq}): {prog.op_count()} ops, {len(text)} characters of MIL, "
        f"{len(blob)} bytes of fp16 weights."
    )
    print("\n".join([*lines[:6], "    ...", *lines[-4:]]))
    print(f"signature: {parsed.main.signature()}")
    same_ir = parsed == prog
    same_text = mil.to_text(parsed) == text
    print(f"parse(print(p)) == p: {same_ir}; print(parse(t)) == t: {same_text}")
    ms = [1e3 * d for d in (t1 - t0, t2 - t1, t3 - t2)]
    print(f"build {ms[0]:.1f} ms, print {ms[1]:.1f} ms, parse+verify {ms[2]:.1f} ms")

    backend = runtime.open("sim")
    t4 = time.perf_counter()
    kernel = backend.compile(text, {WEIGHTS: blob})
    t5 = time.perf_counter()
    x = np.random.default_rng(args.seed + 1).standard_normal((1, args.dim, 1, args.seq)).astype(np.float16)
    with kernel:
        got = kernel(x=x)["out"]
    t6 = time.perf_counter()
    want = layer_reference(x, weights, args.heads)
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    compile_ms, run_ms = 1e3 * (t5 - t4), 1e3 * (t6 - t5)
    print(
        f"simulator ({backend.name}, fp16 storage): compile {compile_ms:.1f} ms, run {run_ms:.1f} ms; "
        f"max |error| vs float64 reference = {err:.2e} of max |output|"
    )
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    if not (same_ir and same_text):
        print("round trip FAILED", file=sys.stderr)
        return 1
    if not err < 1e-2:
        print("simulated layer does not match the float64 reference", file=sys.stderr)
        return 1
    return 0
