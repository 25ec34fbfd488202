"""Benchmark: anekit's simulated training step against a plain numpy float32 llama2.c step, side by side.

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_step_vs_numpy.py [--configs stories15M stories110M]

For each model, in one process and interleaved (so machine load hits every variant alike), on one
sequence of seq_len tokens, median of ``--repeat`` steps, each step being forward + backward + AdamW:

* anekit ane  — the kernels in the simulator with ANE numerics (fp16 storage after every op), weight
  gradients and the head on the CPU (``anekit.llama.step.train_step``) and anekit's AdamW;
* anekit fp32 — the same with ``precision="fp32"`` (no fp16 rounding anywhere);
* numpy       — ``NumpyLlama`` below: the model written directly in numpy float32 as one would to compare
  against (fused q|k|v and w1|w3 matmuls, heads batched, preallocated buffers, in-place elementwise work,
  one flat fused AdamW pass with the global-norm clip), independent of anekit (only the initial weights
  are copied from anekit's ``Params``; llama2.c's math otherwise). tests/test_bench_numpy_loop.py checks
  its gradients against finite differences and a float64 oracle.

It prints the ratios (goal: ane <= 1.0x numpy, fp32 <= 0.8x), this machine's sgemm rate (best of
typical step shapes) and the fraction of it the anekit ane step achieves on the step's matmul FLOPs
(goal for stories110M: >= 0.6).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import numpy as np

from anekit import runtime
from anekit.kernels import ModelConfig, preset
from anekit.llama import Params
from anekit.llama.kernel_sets import make_kernels
from anekit.llama.step import Timer, train_step
from anekit.training.loop import TrainConfig, TrainState, apply_adamw

F32 = np.float32

try:  # a fused AdamW pass when numba is installed (anekit's ``fast`` extra); numpy with out= otherwise
    import numba
except ImportError:  # pragma: no cover - numba is in the fast extra
    numba = None


def _adamw_numpy(w, g, m, v, n_decay, lr, b1, b2, c1, c2, eps, wd, scale, tmp):  # type: ignore[no-untyped-def]
    """One AdamW step over flat float arrays in place (numpy, every pass with ``out=``; ``tmp`` is a
    scratch array of w's size): the first ``n_decay`` values (the matrices) take weight decay."""
    dt = w.dtype.type
    np.multiply(g, dt(scale * (1 - b1)), out=tmp)
    m *= dt(b1)
    m += tmp
    np.multiply(g, g, out=tmp)
    tmp *= dt(scale * scale * (1 - b2))
    v *= dt(b2)
    v += tmp
    np.multiply(v, dt(1 / c2), out=tmp)  # the update: lr * (m / c1) / (sqrt(v / c2) + eps)
    np.sqrt(tmp, out=tmp)
    tmp += dt(eps)
    np.divide(m, tmp, out=tmp)
    tmp *= dt(lr / c1)
    w[:n_decay] *= dt(1 - lr * wd)  # decoupled decay, before the step (as torch's AdamW)
    w -= tmp


if numba is not None:

    @numba.njit(cache=True, parallel=True, fastmath=False)
    def _adamw_numba(w, g, m, v, n_decay, lr, b1, b2, c1, c2, eps, wd, scale, tmp):  # type: ignore[no-untyped-def]
        """The same step in one pass over the four arrays, on numba's threads (``tmp`` unused)."""
        decay = 1 - lr * wd
        for i in numba.prange(w.size):
            gi = g[i] * scale
            mi = b1 * m[i] + (1 - b1) * gi
            vi = b2 * v[i] + (1 - b2) * gi * gi
            m[i] = mi
            v[i] = vi
            wi = w[i] * decay if i < n_decay else w[i]
            w[i] = wi - (lr / c1) * mi / (np.sqrt(vi / c2) + eps)

    ADAMW = _adamw_numba
else:  # pragma: no cover
    ADAMW = _adamw_numpy


class NumpyLlama:
    """A llama2.c transformer (RMSNorm, RoPE, causal MHA with grouped kv heads, SwiGLU, tied classifier)
    in plain numpy, forward, backward and AdamW, written as one would to compare against:

    * activations are (seq, channels) rows, so every projection is one sgemm on contiguous rows: x @ W.T
      with W kept (out, in) as llama2.c stores it (BLAS reads it transposed, no copy);
    * q, k and v are one matmul (their weights are rows of one (dim + 2 kv_dim, dim) array), w1 and w3
      one (a (2 hidden, dim) array), and so are their weight gradients and the input gradients they give;
    * attention is batched over heads (strided views of the q / k / v rows, no transposed copies), RoPE
      rotates q and k together in place;
    * every buffer (activations kept for the backward, gradients, scratch) is allocated once; the
      elementwise work runs with ``out=``;
    * the weights, gradients and both Adam moments are each one flat array (matrices first), so the
      global gradient norm is one dot product and AdamW one fused pass (numba when installed);
    * BLAS runs on every core it is given (OPENBLAS_NUM_THREADS).

    ``dtype`` float64 gives the same model in double precision (the gradient test's reference for finite
    differences). ``w`` / ``g``: name -> view of the weights / gradients, with ``Params.tensors``' names.
    """

    def __init__(self, cfg: ModelConfig, params: Params, dtype: type = np.float32) -> None:
        if params.wcls is not None:
            raise ValueError("NumpyLlama trains a tied classifier (params.wcls must be None)")
        self.cfg, self.dtype = cfg, np.dtype(dtype)
        D, KV, Hd, L, V = cfg.dim, cfg.kv_dim, cfg.hidden_dim, cfg.n_layers, cfg.vocab_size
        mats = [("embed", (V, D))]
        for i in range(L):
            p = f"layers.{i}."
            mats += [
                (p + "wqkv", (D + 2 * KV, D)),
                (p + "wo", (D, D)),
                (p + "w13", (2 * Hd, D)),
                (p + "w2", (D, Hd)),
            ]
        vecs = [(f"layers.{i}.{k}", (D,)) for i in range(L) for k in ("rms_att", "rms_ffn")] + [
            ("rms_final", (D,))
        ]
        self.n_decay = sum(math.prod(s) for _, s in mats)
        size = self.n_decay + sum(math.prod(s) for _, s in vecs)
        self.flat, self.gflat = np.empty(size, self.dtype), np.zeros(size, self.dtype)
        self.m, self.v = np.zeros(size, self.dtype), np.zeros(size, self.dtype)
        self._tmp = np.empty(size, self.dtype) if ADAMW is _adamw_numpy else np.empty(1, self.dtype)
        self.W: dict[str, np.ndarray] = {}  # the fused arrays and the vectors, views of flat
        self.G: dict[str, np.ndarray] = {}
        at = 0
        for name, shape in mats + vecs:
            n = math.prod(shape)
            self.W[name] = self.flat[at : at + n].reshape(shape)
            self.G[name] = self.gflat[at : at + n].reshape(shape)
            at += n
        self.w: dict[str, np.ndarray] = {}
        self.g: dict[str, np.ndarray] = {}
        for big, parts in (("wqkv", (("wq", D), ("wk", KV), ("wv", KV))), ("w13", (("w1", Hd), ("w3", Hd)))):
            for i in range(L):
                row = 0
                for name, n in parts:
                    self.w[f"layers.{i}.{name}"] = self.W[f"layers.{i}.{big}"][row : row + n]
                    self.g[f"layers.{i}.{name}"] = self.G[f"layers.{i}.{big}"][row : row + n]
                    row += n
        for name in self.W:
            if not name.endswith(("wqkv", "w13")):
                self.w[name], self.g[name] = self.W[name], self.G[name]
        for name, a in params.tensors():
            self.w[name][...] = a
        self.t = 0
        T, H, hd, nkv = cfg.seq_len, cfg.n_heads, cfg.head_dim, cfg.n_kv_heads
        freqs = cfg.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
        ang = np.arange(T)[:, None, None] * freqs[None, None, :]  # (T, 1, hd/2): one row per position
        self.cos, self.sin = np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype)
        self.mask = np.triu(np.full((T, T), -np.inf, self.dtype), 1)
        z = lambda *s: np.zeros(s, self.dtype)  # noqa: E731
        # kept for the backward, one per layer: its input, both norms' outputs and scales, q/k/v, the
        # attention probabilities, the heads' output, the FFN's input, h1|h3, sigmoid(h1), silu(h1)
        self.xs = [z(T, D) for _ in range(L + 1)]
        self.xn1, self.xn2 = [z(T, D) for _ in range(L)], [z(T, D) for _ in range(L)]
        self.r1, self.r2 = [z(T, 1) for _ in range(L)], [z(T, 1) for _ in range(L)]
        self.qkv = [z(T, D + 2 * KV) for _ in range(L)]
        self.prob = [z(H, T, T) for _ in range(L)]
        self.o = [z(T, D) for _ in range(L)]
        self.x2 = [z(T, D) for _ in range(L)]
        self.h13 = [z(T, 2 * Hd) for _ in range(L)]
        self.sig, self.silu = [z(T, Hd) for _ in range(L)], [z(T, Hd) for _ in range(L)]
        self.gate = [z(T, Hd) for _ in range(L)]
        self.xf, self.rf = z(T, D), z(T, 1)
        self.logits = z(T, V)
        # scratch
        self.td, self.td2, self.dx = z(T, D), z(T, D), z(T, D)
        self.th, self.dg = z(T, Hd), z(T, Hd)
        self.dh13 = z(T, 2 * Hd)
        self.dqkv = z(T, D + 2 * KV)
        self.dprob = z(H, T, T)
        self.rot = z(3, T, H + nkv, hd // 2)
        self.t1 = z(T, 1)
        self.kv_sum = z(nkv, cfg.kv_group, T, hd) if cfg.kv_group > 1 else None

    # -- pieces -------------------------------------------------------------------------------------

    def _rms(self, x: np.ndarray, w: np.ndarray, out: np.ndarray, r: np.ndarray) -> None:
        """out = x / rms(x) * w, r = 1 / rms(x) (T, 1)."""
        np.einsum("tc,tc->t", x, x, out=r[:, 0])
        r *= self.dtype.type(1 / x.shape[1])
        r += self.dtype.type(self.cfg.norm_eps)
        np.sqrt(r, out=r)
        np.reciprocal(r, out=r)
        np.multiply(x, r, out=out)
        out *= w

    def _rms_bwd(self, dy: np.ndarray, x: np.ndarray, w: np.ndarray, r: np.ndarray, dw: np.ndarray,
                 dx: np.ndarray) -> None:  # fmt: skip
        """dx += the gradient through out = x * r * w; dw = sum over rows of dy * x * r."""
        td, s = self.td2, self.t1
        np.multiply(dy, x, out=td)
        np.matmul(r[:, 0], td, out=dw)
        np.multiply(dy, w, out=td)  # g = dy * w
        np.einsum("tc,tc->t", td, x, out=s[:, 0])
        s *= r**3
        s *= self.dtype.type(1 / x.shape[1])
        td *= r
        dx += td
        np.multiply(x, s, out=td)
        dx -= td

    def _rope(self, qk: np.ndarray, sign: float) -> None:
        """Rotate the channel pairs (2j, 2j + 1) of every q and k head by +-its position's angle, in
        place; qk (T, H + n_kv, hd), a strided view of the q|k columns."""
        a, b = qk[..., 0::2], qk[..., 1::2]
        t1, t2, t3 = self.rot
        c, s = self.cos, self.sin
        np.multiply(a, c, out=t1)
        np.multiply(b, s, out=t2)
        if sign < 0:
            t1 += t2
        else:
            t1 -= t2
        np.multiply(a, s, out=t3)
        np.multiply(b, c, out=t2)
        if sign < 0:
            t2 -= t3
        else:
            t2 += t3
        a[...] = t1
        b[...] = t2

    def _heads(self, rows: np.ndarray, n: int) -> np.ndarray:
        """(T, n * hd) rows -> (n_kv, n / n_kv, T, hd), a view (the query heads grouped by kv head)."""
        T, hd, nkv = rows.shape[0], self.cfg.head_dim, self.cfg.n_kv_heads
        return rows.reshape(T, nkv, n // nkv, hd).transpose(1, 2, 0, 3)

    # -- the step -----------------------------------------------------------------------------------

    def grads(self, tokens: np.ndarray, targets: np.ndarray) -> float:
        """The loss of one sequence (mean cross-entropy) and its gradients into ``self.gflat``."""
        cfg, W, G = self.cfg, self.W, self.G
        T, D, KV, Hd, H, nkv = len(tokens), cfg.dim, cfg.kv_dim, cfg.hidden_dim, cfg.n_heads, cfg.n_kv_heads
        if len(tokens) != cfg.seq_len:
            raise ValueError(f"tokens: expected {cfg.seq_len} tokens, got {T}")
        dt = self.dtype.type
        scale = dt(1 / math.sqrt(cfg.head_dim))
        np.take(W["embed"], tokens, axis=0, out=self.xs[0])
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            x, xn, qkv, prob, o, x2 = (
                self.xs[i],
                self.xn1[i],
                self.qkv[i],
                self.prob[i],
                self.o[i],
                self.x2[i],
            )
            self._rms(x, W[p + "rms_att"], xn, self.r1[i])
            np.matmul(xn, W[p + "wqkv"].T, out=qkv)
            self._rope(qkv[:, : D + KV].reshape(T, H + nkv, -1), 1.0)
            q, k, v = (
                self._heads(qkv[:, :D], H),
                self._heads(qkv[:, D : D + KV], nkv),
                self._heads(qkv[:, D + KV :], nkv),
            )
            s = prob.reshape(nkv, H // nkv, T, T)
            np.matmul(q, k.swapaxes(-1, -2), out=s)
            s *= scale
            s += self.mask
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            np.matmul(s, v, out=self._heads(o, H))
            np.matmul(o, W[p + "wo"].T, out=x2)
            x2 += x
            xn2, h13, sig, silu, gate = self.xn2[i], self.h13[i], self.sig[i], self.silu[i], self.gate[i]
            self._rms(x2, W[p + "rms_ffn"], xn2, self.r2[i])
            np.matmul(xn2, W[p + "w13"].T, out=h13)
            h1, h3 = h13[:, :Hd], h13[:, Hd:]
            np.negative(h1, out=sig)
            np.exp(sig, out=sig)
            sig += dt(1)
            np.reciprocal(sig, out=sig)
            np.multiply(h1, sig, out=silu)
            np.multiply(silu, h3, out=gate)
            nxt = self.xs[i + 1]
            np.matmul(gate, W[p + "w2"].T, out=nxt)
            nxt += x2
        x, xf = self.xs[-1], self.xf
        self._rms(x, W["rms_final"], xf, self.rf)
        logits = self.logits
        np.matmul(xf, W["embed"].T, out=logits)
        rows = np.arange(T)
        mx = logits.max(axis=1, keepdims=True)
        logits -= mx
        picked = logits[rows, targets]
        np.exp(logits, out=logits)
        total = logits.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(total[:, 0]) - picked))
        dlog = logits  # softmax - onehot, over T
        dlog *= 1 / (total * T)
        dlog[rows, targets] -= dt(1 / T)
        # backward
        np.matmul(dlog.T, xf, out=G["embed"])
        dx = self.dx
        np.matmul(dlog, W["embed"], out=self.td)
        dx.fill(0)
        self._rms_bwd(self.td, x, W["rms_final"], self.rf, G["rms_final"], dx)
        for i in reversed(range(cfg.n_layers)):
            p = f"layers.{i}."
            h13, sig, silu, gate = self.h13[i], self.sig[i], self.silu[i], self.gate[i]
            h1, h3 = h13[:, :Hd], h13[:, Hd:]
            np.matmul(dx.T, gate, out=G[p + "w2"])
            dg, dh13, th = self.dg, self.dh13, self.th
            np.matmul(dx, W[p + "w2"], out=dg)
            np.multiply(dg, silu, out=dh13[:, Hd:])
            np.subtract(dt(1), sig, out=th)  # dsilu = sig * (1 + h1 * (1 - sig))
            th *= h1
            th += dt(1)
            th *= sig
            th *= h3
            np.multiply(th, dg, out=dh13[:, :Hd])
            np.matmul(dh13.T, self.xn2[i], out=G[p + "w13"])
            np.matmul(dh13, W[p + "w13"], out=self.td)
            self._rms_bwd(self.td, self.x2[i], W[p + "rms_ffn"], self.r2[i], G[p + "rms_ffn"], dx)  # dx2
            np.matmul(dx.T, self.o[i], out=G[p + "wo"])
            do = self.td
            np.matmul(dx, W[p + "wo"], out=do)
            qkv, prob, dqkv = self.qkv[i], self.prob[i], self.dqkv
            q, k, v = (
                self._heads(qkv[:, :D], H),
                self._heads(qkv[:, D : D + KV], nkv),
                self._heads(qkv[:, D + KV :], nkv),
            )
            dq, dk, dv = (
                self._heads(dqkv[:, :D], H),
                self._heads(dqkv[:, D : D + KV], nkv),
                self._heads(dqkv[:, D + KV :], nkv),
            )
            P = prob.reshape(nkv, H // nkv, T, T)
            dP = self.dprob.reshape(nkv, H // nkv, T, T)
            doh = self._heads(do, H)
            np.matmul(doh, v.swapaxes(-1, -2), out=dP)
            self._kv_grad(P.swapaxes(-1, -2), doh, dv)
            dP -= np.einsum("...ij,...ij->...i", dP, P)[..., None]
            dP *= P
            dP *= scale
            np.matmul(dP, k, out=dq)
            self._kv_grad(dP.swapaxes(-1, -2), q, dk)
            self._rope(dqkv[:, : D + KV].reshape(T, H + nkv, -1), -1.0)
            np.matmul(dqkv.T, self.xn1[i], out=G[p + "wqkv"])
            np.matmul(dqkv, W[p + "wqkv"], out=self.td)
            self._rms_bwd(self.td, self.xs[i], W[p + "rms_att"], self.r1[i], G[p + "rms_att"], dx)
        np.add.at(G["embed"], tokens, dx)
        return loss

    def _kv_grad(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """out (n_kv, 1, T, hd) = a @ b summed over the query heads sharing each kv head."""
        if self.kv_sum is None:
            np.matmul(a, b, out=out)
        else:
            np.matmul(a, b, out=self.kv_sum)
            np.sum(self.kv_sum, axis=1, keepdims=True, out=out)

    def step(self, tokens: np.ndarray, targets: np.ndarray, lr: float = 1e-4, b1: float = 0.9,
             b2: float = 0.95, weight_decay: float = 0.1, clip: float = 1.0) -> float:  # fmt: skip
        """One training step on one sequence: forward, backward, the global gradient-norm clip and AdamW
        (decay on the matrices only, as llama2.c); returns the loss."""
        loss = self.grads(tokens, targets)
        self.adamw(lr, b1, b2, weight_decay, clip)
        return loss

    def adamw(self, lr: float, b1: float = 0.9, b2: float = 0.95, weight_decay: float = 0.1,
              clip: float = 1.0) -> None:  # fmt: skip
        """Clip the gradients' global norm to ``clip`` and take one AdamW step on the flat arrays."""
        self.t += 1
        norm = math.sqrt(float(np.dot(self.gflat, self.gflat)))
        scale = min(1.0, clip / (norm + 1e-6))
        dt = self.dtype.type
        bias = (dt(1 - b1**self.t), dt(1 - b2**self.t))
        ADAMW(self.flat, self.gflat, self.m, self.v, self.n_decay, dt(lr), dt(b1), dt(b2), *bias,
              dt(1e-8), dt(weight_decay), dt(scale), self._tmp)  # fmt: skip


def sgemm_rate(cfg: ModelConfig, repeat: int = 5) -> float:
    """Best float32 matmul rate (FLOP/s) over the step's typical shapes: weight x activations, dW."""
    t, d, h = cfg.seq_len, cfg.dim, cfg.hidden_dim
    rng = np.random.default_rng(0)
    best = 0.0
    for m, k, n in ((h, d, t), (d, h, t), (h, t, d), (d, d, t)):
        a, b = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32)
        a @ b
        dt = min(_time(lambda a=a, b=b: a @ b) for _ in range(repeat))
        best = max(best, 2 * m * k * n / dt)
    return best


def step_flops(cfg: ModelConfig) -> float:
    """Matmul FLOPs of one training step (forward 2, backward 4 per weight multiply-add; attention too)."""
    t = cfg.seq_len
    per_layer = cfg.dim * cfg.dim * 2 + cfg.kv_dim * cfg.dim * 2 + 3 * cfg.hidden_dim * cfg.dim
    weights = cfg.n_layers * per_layer + cfg.vocab_size * cfg.dim
    attention = cfg.n_layers * 2 * t * t * cfg.dim  # QK^T and PV
    return 6.0 * t * weights + 3 * 2.0 * attention


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["stories15M", "stories110M"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weights", choices=["baked", "dynamic"], default="baked")
    args = ap.parse_args()
    for name in args.configs:
        cfg = preset(name)
        params = Params.init(cfg, seed=0)
        tc = TrainConfig(steps=10**6, lr=1e-4)
        variants: dict[str, Callable[[np.ndarray], object]] = {}
        for precision in ("ane", "fp32"):
            backend = runtime.open("sim", compile_budget=10**9, precision=precision)
            kernels = make_kernels(backend, cfg, args.weights)
            state = TrainState.fresh(params.copy(), tc)
            kernels.compile(state.params, Timer())
            grads = state.params.zeros_like()

            def anekit_step(window: np.ndarray, kernels=kernels, state=state, grads=grads, tc=tc) -> object:
                train_step(kernels, state.params, grads, window[:-1], window[1:], Timer(), 1024.0)
                for _, g in grads.tensors():
                    g *= F32(1 / 1024)
                apply_adamw(state, grads, tc)
                for _, g in grads.tensors():
                    g.fill(0.0)
                return None

            variants[f"anekit {precision}"] = anekit_step
        ref = NumpyLlama(cfg, params)
        variants["numpy"] = lambda window, ref=ref: ref.step(window[:-1], window[1:])
        rng = np.random.default_rng(0)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for i in range(args.repeat + 1):  # the first round warms up
            window = rng.integers(0, cfg.vocab_size, cfg.seq_len + 1)
            for key, fn in variants.items():
                dt = _time(lambda fn=fn, window=window: fn(window))
                if i:
                    times[key].append(dt)
        med = {k: statistics.median(v) for k, v in times.items()}
        rate = sgemm_rate(cfg)
        flops = step_flops(cfg)
        print(f"{name} ({args.weights} weights, seq {cfg.seq_len}, median of {args.repeat}):")
        for key, t in med.items():
            print(
                f"  {key:12s} {1e3 * t:9.1f} ms/step  {t / med['numpy']:5.2f}x numpy  "
                f"{flops / t / 1e9:6.1f} GFLOP/s = {flops / t / rate:4.2f} of sgemm"
            )
        print(f"  sgemm rate {rate / 1e9:.1f} GFLOP/s; step {flops / 1e9:.1f} GFLOP")


if __name__ == "__main__":
    main()
