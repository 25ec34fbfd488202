"""The training step's kernel set on the matmul-free route: projections and the MLP on the engine, the rest
on the host.

Route "conv-host-attention", ``KernelRoute("baked", "host", "host", "host")``: for chips where matmul
and scaled_dot_product_attention have no hardware run (M1 / M2 under macOS 26, maderix/ANE commit
709b602), the engine runs only ``anekit.kernels.conv_only``'s 1x1 conv kernels with baked weights; the
host runs every RMSNorm, Qwen 3's / Gemma 3's per-head q / k norm, RoPE, the attention core (scores,
causal or banded mask, softmax, probs @ V, grouped-query) and its backward, in float32 numpy
(``cpu_ops``: one batched BLAS product per step over the heads, no loop over positions), as maderix/
ANE's first training pipeline did (training/forward.h: conv kernels for the projections, RMSNorm, RoPE
and attention on the CPU).

``HostAttentionKernels.run`` answers the names ``step.train_step`` and ``forward_layers`` call with the
dict keys the engine kernels' taps have, so the step is the same code on every route:

    sdpa_fwd(x)              host RMSNorm -> qkv_fwd -> host q / k norm, RoPE, attention -> wo_fwd
                             -> host post-norm: o_out, q, k, v, attn_out, xnorm (q_pre, k_pre, o_pre)
    ffn_fwd(x)               host RMSNorm -> ffn_fwd -> host post-norm: ffn_out, h1, h3, silu_out,
                             x2norm (ffn_pre)
    ffn_bwd(dffn, h1, h3)    the engine's ffn_bwd: dx, dh1, dh3
    sdpa_bwd1(q, k, v, do)   wo_bwd (da = Wo^T do), then on the host the probabilities recomputed from q
                             and k, dv = P^T da, dp = da V^T: dv, probs, dp (scores as (H*S, S) rows)
    sdpa_bwd2(probs, dp, q, k)   host softmax backward, dq = dS K, dk = dS^T Q, RoPE turned back: dq, dk
    qkv_bwd(dq, dk, dv)      the engine's qkv_bwd: dx

The forward's values entering a kernel (xnorm, x2norm, attn_out) are rounded to fp16 on the host and
kept so as the taps, so the weight gradients read what the kernel read (``Kernels.host_normed``); the
gradients entering the backward kernels are rounded by the kernel's input surface, and what the host
computes besides stays float32. The step's timer counts the host parts inside ``run`` as kernel time.

Every kernel bakes a layer's weights, so all six per layer are compiled again for each accumulation
batch (``compiles_per_batch``): the compile-budget re-exec of ``anekit.training`` covers them as it
covers the baked route. There is no weightless kernel to keep across batches (the engine route's SDPA
backward 2 is host work here).
"""

from __future__ import annotations

import numpy as np

from anekit.errors import AnekitError
from anekit.fp16 import round_to_fp16
from anekit.kernels.blocks import causal_mask, rope_tables
from anekit.kernels.config import ModelConfig
from anekit.kernels.conv_only import KERNELS, conv_route_specs
from anekit.kernels.route import kernel_route
from anekit.llama import cpu_ops
from anekit.llama.cpu_forward import head_rmsnorm
from anekit.llama.params import Params
from anekit.llama.step import Kernels, Timer, norm_scale
from anekit.runtime.base import Backend

ROUTE = kernel_route("conv-host-attention")  # KernelRoute("baked", "host", "host", "host")

# The norm weights of a layer the host applies (each norm scales by cfg.norm_offset + w).
HOST_NORMS = ("rms_att", "rms_ffn", "q_norm", "k_norm", "post_att_norm", "post_ffn_norm")


class HostAttentionKernels(Kernels):
    """The conv kernels of every layer for one set of weights (``layers[i][name]``, names
    ``conv_only.KERNELS``), the host's norm weights of the same weights, and the host's attention."""

    def __init__(self, backend: Backend, cfg: ModelConfig) -> None:
        super().__init__(backend, cfg, ROUTE)  # host attention: no SDPA backward 2 kernel to compile
        self._tables: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}  # (C, kind) -> cos, sin
        self._masks: dict[str, np.ndarray] = {}  # kind -> (S, S) additive mask

    @staticmethod
    def compiles_per_batch(cfg: ModelConfig) -> int:
        """Programs one ``compile`` call compiles: every kernel of every layer (all bake weights)."""
        return len(KERNELS) * cfg.n_layers

    def compile(self, params: Params, timer: Timer) -> None:
        """(Re)compile every layer's kernels with the current weights, and keep a copy of the norm weights
        the host applies (``norm_weight``) taken with them."""
        self.close_layers()
        cfg = self.cfg
        with timer.phase("compile"):
            for i in range(cfg.n_layers):
                w = params.kernel_weights(i)
                specs = conv_route_specs(cfg, w)
                self.specs.append(specs)
                self.layers.append({name: spec.compile(self.backend).load() for name, spec in specs.items()})
                self._scales.append({k: np.array(w[k]) for k in HOST_NORMS if w.get(k) is not None})

    # -- the step's names ------------------------------------------------------------------------------

    def run(self, layer: int, name: str, **parts: np.ndarray) -> dict[str, np.ndarray]:
        if not self.layers:
            raise AnekitError("[step] the host-attention kernels are not compiled: compile() first")
        if name == "sdpa_fwd":
            return self._attention(layer, parts["x"])
        if name == "sdpa_bwd1":
            return self._attention_bwd1(layer, parts["q"], parts["k"], parts["v"], parts["do"])
        if name == "sdpa_bwd2":
            return self._attention_bwd2(layer, parts["probs"], parts["dp"], parts["q"], parts["k"])
        if name in ("ffn_fwd", "ffn_bwd", "qkv_bwd"):  # ffn_fwd: the host norms around the kernel (``run``)
            return super().run(layer, name, **parts)
        raise AnekitError(
            f"[step] no step part '{name}' on the host-attention route (known: sdpa_fwd, ffn_fwd, ffn_bwd, "
            "sdpa_bwd1, sdpa_bwd2, qkv_bwd)"
        )

    def _scale(self, i: int, key: str) -> np.ndarray:
        """What norm ``key`` of layer ``i`` multiplies by: cfg.norm_offset + the compiled-with weight."""
        return norm_scale(self.cfg, self.norm_weight(i, key))

    def _attention(self, i: int, x: np.ndarray) -> dict[str, np.ndarray]:
        """The attention block of layer ``i`` on the residual stream x (dim, T), with the SDPA taps. What
        enters a kernel is rounded to fp16 first and kept as the tap (the weight gradients read what the
        kernel read), as ``Kernels.host_normed`` does."""
        cfg, eps = self.cfg, self.cfg.norm_eps
        kind = cfg.layer_type(i)
        xn = round_to_fp16(cpu_ops.rmsnorm(x, self._scale(i, "rms_att"), eps))  # (dim, T)
        qkv = self.run_kernel(i, "qkv_fwd", xnorm=xn)  # the projections (+ biases)
        q, k, v = qkv["q"], qkv["k"], qkv["v"]  # (q_dim, T), (kv_dim, T) x 2
        taps: dict[str, np.ndarray] = {}
        if cfg.qk_norm:  # Qwen 3 / Gemma 3: each head RMS-normalised; the backward reads the inputs
            taps["q_pre"], taps["k_pre"] = q, k
            q = head_rmsnorm(q, self._scale(i, "q_norm"), eps, cfg.head_dim)  # (q_dim, T)
            k = head_rmsnorm(k, self._scale(i, "k_norm"), eps, cfg.head_dim)  # (kv_dim, T)
        if cfg.rope:
            q = cpu_ops.rope_rotate(q, *self._rope(cfg.q_dim, kind))  # (q_dim, T)
            k = cpu_ops.rope_rotate(k, *self._rope(cfg.kv_dim, kind))  # (kv_dim, T)
        att = round_to_fp16(cpu_ops.attend(self._probs(i, q, k), v, cfg.head_dim))  # (q_dim, T)
        o = self.run_kernel(i, "wo_fwd", attn=att)["o"]  # (dim, T)
        if cfg.post_norms:  # Gemma 3: the residual adds the normalised projection
            taps["o_pre"] = o
            o = cpu_ops.rmsnorm(o, self._scale(i, "post_att_norm"), eps)  # (dim, T)
        return {"o_out": o, "q": q, "k": k, "v": v, "attn_out": att, "xnorm": xn, **taps}

    def _attention_bwd1(
        self, i: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray
    ) -> dict[str, np.ndarray]:
        """dv, and the probabilities and their gradient dp for ``_attention_bwd2``, from do (dim, T)."""
        cfg = self.cfg
        da = self.run_kernel(i, "wo_bwd", do=do)["da"]  # (q_dim, T): Wo^T do
        probs = self._probs(i, q, k)  # (KVH, G, T, T), recomputed: nothing kept between the passes
        dv, dp = cpu_ops.attend_bwd(probs, v, da, cfg.head_dim)  # (kv_dim, T), (KVH, G, T, T)
        rows = (cfg.n_heads * cfg.seq_len, cfg.seq_len)  # the engine route's score layout
        return {"dv": dv, "probs": probs.reshape(rows), "dp": dp.reshape(rows)}

    def _attention_bwd2(
        self, i: int, probs: np.ndarray, dp: np.ndarray, q: np.ndarray, k: np.ndarray
    ) -> dict[str, np.ndarray]:
        """dq, dk before RoPE (after any q / k norm) from the probabilities and dp."""
        cfg, s = self.cfg, self.cfg.seq_len
        shape = (cfg.n_kv_heads, cfg.kv_group, s, s)
        dq, dk = cpu_ops.attention_probs_bwd(
            probs.reshape(shape), dp.reshape(shape), q, k, cfg.head_dim, cfg.scores_scale
        )  # (q_dim, T), (kv_dim, T)
        if cfg.rope:
            kind = cfg.layer_type(i)
            dq = cpu_ops.rope_rotate(dq, *self._rope(cfg.q_dim, kind), inverse=True)
            dk = cpu_ops.rope_rotate(dk, *self._rope(cfg.kv_dim, kind), inverse=True)
        return {"dq": dq, "dk": dk}

    # -- host tables -----------------------------------------------------------------------------------

    def _probs(self, i: int, q: np.ndarray, k: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        mask = self._mask(cfg.layer_type(i))
        return cpu_ops.attention_probs(q, k, cfg.n_kv_heads, cfg.head_dim, cfg.scores_scale, mask)

    def _mask(self, kind: str) -> np.ndarray:
        """The (S, S) additive mask of a layer kind: where the engine route's mask hides a key (causal, or
        banded to the sliding window) -inf, else 0, float32: a hidden key's probability is exactly 0 however
        large the float32 scores (the engine's -65504 is the most an fp16 mask can hold)."""
        if kind not in self._masks:
            cfg = self.cfg
            hidden = causal_mask(cfg.seq_len, cfg.kind_window(kind))[0, 0] < 0  # (S, S)
            self._masks[kind] = np.where(hidden, np.float32(-np.inf), np.float32(0.0))
        return self._masks[kind]

    def _rope(self, channels: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin (channels / 2, S) float32 of a layer kind's RoPE: the engine route's tables."""
        key = (channels, kind)
        if key not in self._tables:
            cos, sin = rope_tables(self.cfg, channels, kind)  # (1, C/2, 1, S) each
            shape = (channels // 2, self.cfg.seq_len)
            self._tables[key] = (cos.reshape(shape).astype(np.float32), sin.reshape(shape).astype(np.float32))
        return self._tables[key]


__all__ = ["HOST_NORMS", "ROUTE", "HostAttentionKernels"]
