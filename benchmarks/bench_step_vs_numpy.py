"""Benchmark: anekit's simulated training step against a plain numpy float32 llama2.c step, side by side.

Run: OPENBLAS_NUM_THREADS=2 python benchmarks/bench_step_vs_numpy.py [--configs stories15M stories110M]

For each model, in one process and interleaved (so machine load hits every variant alike), on one
sequence of seq_len tokens, median of ``--repeat`` steps, each step being forward + backward + AdamW:

* anekit ane  — the kernels in the simulator with ANE numerics (fp16 storage after every op), weight
  gradients and the head on the CPU (``anekit.llama.step.train_step``) and anekit's AdamW;
* anekit fp32 — the same with ``precision="fp32"`` (no fp16 rounding anywhere);
* numpy       — ``NumpyLlama`` below: the model written directly in numpy float32, independent of
  anekit (only the initial weights are copied from anekit's ``Params``; llama2.c's math otherwise).

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


class NumpyLlama:
    """A llama2.c transformer (RMSNorm, RoPE, causal MHA, SwiGLU, tied classifier) in numpy float32,
    with its backward pass and AdamW; activations are (seq, channels) rows."""

    def __init__(self, cfg: ModelConfig, params: Params) -> None:
        self.cfg = cfg
        self.w: dict[str, np.ndarray] = {name: a.copy() for name, a in params.tensors()}
        self.m = {k: np.zeros_like(v) for k, v in self.w.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.w.items()}
        self.t = 0
        hd = cfg.head_dim
        freqs = cfg.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
        ang = np.arange(cfg.seq_len)[:, None] * freqs[None, :]  # (T, hd/2)
        self.cos, self.sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)

    # -- pieces -------------------------------------------------------------------------------------

    def _rms(self, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = 1.0 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + F32(self.cfg.norm_eps))  # (T, 1)
        return x * r * w, r

    @staticmethod
    def _rms_bwd(
        dy: np.ndarray, x: np.ndarray, w: np.ndarray, r: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        g = dy * w  # (T, C)
        dx = r * g - x * (r**3 * np.mean(g * x, axis=1, keepdims=True))
        return dx, np.sum(dy * x * r, axis=0)

    def _rope(self, x: np.ndarray, sign: float) -> np.ndarray:
        """Rotate channel pairs (2i, 2i+1) of every head by +-position angle; x (H, T, hd)."""
        a, b = x[..., 0::2], x[..., 1::2]
        c, s = self.cos, self.sin * F32(sign)
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    def _heads(self, x: np.ndarray, n: int) -> np.ndarray:
        return x.reshape(x.shape[0], n, -1).transpose(1, 0, 2)  # (T, n*hd) -> (n, T, hd)

    # -- the step -----------------------------------------------------------------------------------

    def step(self, tokens: np.ndarray, targets: np.ndarray, lr: float = 1e-4) -> float:
        cfg, w = self.cfg, self.w
        T, H, hd = len(tokens), cfg.n_heads, cfg.head_dim
        rep = cfg.kv_group
        mask = np.triu(np.full((T, T), -np.inf, F32), 1)
        x = w["embed"][tokens]  # (T, dim)
        cache = []
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            xn, r1 = self._rms(x, w[p + "rms_att"])
            q = self._rope(self._heads(xn @ w[p + "wq"].T, H), 1.0)  # (H, T, hd)
            k = self._rope(self._heads(xn @ w[p + "wk"].T, cfg.n_kv_heads), 1.0).repeat(rep, axis=0)
            v = self._heads(xn @ w[p + "wv"].T, cfg.n_kv_heads).repeat(rep, axis=0)
            s = q @ k.transpose(0, 2, 1) * F32(1 / math.sqrt(hd)) + mask  # (H, T, T)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            prob = s / s.sum(axis=-1, keepdims=True)
            o = (prob @ v).transpose(1, 0, 2).reshape(T, -1)  # (T, dim)
            x2 = x + o @ w[p + "wo"].T
            x2n, r2 = self._rms(x2, w[p + "rms_ffn"])
            h1, h3 = x2n @ w[p + "w1"].T, x2n @ w[p + "w3"].T  # (T, hidden)
            sig = 1.0 / (1.0 + np.exp(-h1))
            g = h1 * sig * h3
            cache.append((x, xn, r1, q, k, v, prob, o, x2, x2n, r2, h1, h3, sig, g))
            x = x2 + g @ w[p + "w2"].T
        xf, rf = self._rms(x, w["rms_final"])
        logits = xf @ w["embed"].T  # (T, vocab)
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        probs = e / e.sum(axis=1, keepdims=True)
        loss = float(-np.mean(np.log(probs[np.arange(T), targets])))
        dlog = probs
        dlog[np.arange(T), targets] -= 1.0
        dlog /= F32(T)
        grad = {k: np.zeros_like(a) for k, a in w.items()}
        grad["embed"] += dlog.T @ xf
        dx, grad["rms_final"] = self._rms_bwd(dlog @ w["embed"], x, w["rms_final"], rf)
        for i in reversed(range(cfg.n_layers)):
            p = f"layers.{i}."
            x, xn, r1, q, k, v, prob, o, x2, x2n, r2, h1, h3, sig, g = cache[i]
            grad[p + "w2"] = dx.T @ g
            dg = dx @ w[p + "w2"]  # (T, hidden)
            dh3 = dg * h1 * sig
            dh1 = dg * h3 * sig * (1.0 + h1 * (1.0 - sig))
            grad[p + "w1"], grad[p + "w3"] = dh1.T @ x2n, dh3.T @ x2n
            dx2n = dh1 @ w[p + "w1"] + dh3 @ w[p + "w3"]
            dnorm, grad[p + "rms_ffn"] = self._rms_bwd(dx2n, x2, w[p + "rms_ffn"], r2)
            dx2 = dx + dnorm
            grad[p + "wo"] = dx2.T @ o
            do = self._heads(dx2 @ w[p + "wo"], H)  # (H, T, hd)
            dprob = do @ v.transpose(0, 2, 1)
            dv = prob.transpose(0, 2, 1) @ do
            ds = prob * (dprob - np.sum(dprob * prob, axis=-1, keepdims=True)) * F32(1 / math.sqrt(hd))
            dq = self._rope(ds @ k, -1.0)
            dk = self._rope(ds.transpose(0, 2, 1) @ q, -1.0)
            kv = cfg.n_kv_heads
            dk = dk.reshape(kv, rep, T, hd).sum(axis=1).transpose(1, 0, 2).reshape(T, -1)
            dv = dv.reshape(kv, rep, T, hd).sum(axis=1).transpose(1, 0, 2).reshape(T, -1)
            dq = dq.transpose(1, 0, 2).reshape(T, -1)
            grad[p + "wq"], grad[p + "wk"], grad[p + "wv"] = dq.T @ xn, dk.T @ xn, dv.T @ xn
            dxn = dq @ w[p + "wq"] + dk @ w[p + "wk"] + dv @ w[p + "wv"]
            dnorm, grad[p + "rms_att"] = self._rms_bwd(dxn, x, w[p + "rms_att"], r1)
            dx = dx2 + dnorm
        np.add.at(grad["embed"], tokens, dx)
        self._adamw(grad, lr)
        return loss

    def _adamw(self, grad: dict[str, np.ndarray], lr: float, b1: float = 0.9, b2: float = 0.95) -> None:
        self.t += 1
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for k, g in grad.items():
            w, m, v = self.w[k], self.m[k], self.v[k]
            m *= F32(b1)
            m += F32(1 - b1) * g
            v *= F32(b2)
            v += F32(1 - b2) * g * g
            if w.ndim == 2:
                w *= F32(1 - lr * 0.1)
            w -= F32(lr / c1) * m / (np.sqrt(v / F32(c2)) + F32(1e-8))


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
