"""The host side of generation route "dynamic-engine-attention": one kernel per block, the norms on the host.

Each layer runs as two kernels of ``anekit.kernels.generation`` — ``attention_kernel`` (the attention
block with the KV cache read from its own "cache" surface) and ``mlp_kernel`` — whose weights travel in
their "x" surface after the activation columns, written once when the kernel is loaded
(``layers.Compiled``); each call writes only the activation columns. The head tiles take their rows the
same way. Only the real tokens' columns of every kernel are read (a simulated kernel computes only those
where that keeps their bits: ``layers.read_columns``); an attention kernel mixes a chunk's columns, so it
is handed its causal copies (``layers.causal_copies``: the same kernel built for a chunk of n tokens; the
baked-engine-attention routes run this class too), and the padding columns of its result are zeros on the
host. A dynamic kernel's activations are transposed into the rows of its products, which the simulator
cannot cut by itself, so its MLP kernels and head tiles get copies too: each reads the kernel's own "x",
the weights in the same columns (``kernels.generation.same_weight_columns``), the activations in its
first n columns.

The blocks' insides are the family's (lowered into the kernels); the host keeps the residual stream in
float32 and applies what a norm-on-host route leaves to it around each block, the family's names and
order: x + post_att_norm(attention(rms_att(x))), then x + post_ffn_norm(mlp(rms_ffn(x))), the post-norms
only where the family has them (Gemma 3), every norm scaling by ``cfg.norm_offset + w``; the final norm
before the head tiles. Keys and values are written into each attention kernel's own cache surface in
place, copied once between the two widths' kernels (``layers.catch_up``).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from anekit.generate.layers import (
    Compiled,
    catch_up,
    causal_copies,
    copy_at,
    copy_cache,
    embed,
    host_parts,
    ran,
)
from anekit.generate.plan import GenerationPlan
from anekit.kernels.generation import attention_kernel, gen_weights, head_kernel, mlp_kernel
from anekit.kernels.route import KernelRoute
from anekit.llama import cpu_ops
from anekit.llama.cpu_forward import check_norm_input
from anekit.llama.params import Params
from anekit.runtime.base import Backend


class BlockSet:
    """The attention and MLP kernels of every layer and the head tiles at one width."""

    def __init__(
        self, params: Params, backend: Backend, plan: GenerationPlan, route: KernelRoute, width: int
    ):
        cfg, weights = params.cfg, gen_weights(params)
        dynamic = route.weights == "dynamic"
        self.width, self.capacity = width, plan.capacity_for(width)
        self.attention: list[Compiled] = []
        self.mlp: list[Compiled] = []
        self.tiles: list[Compiled] = []
        self.filled = 0
        try:
            for i in range(cfg.n_layers):
                att = attention_kernel(
                    cfg, i, width=width, capacity=self.capacity, route=route, weights=weights
                )
                self.attention.append(Compiled(att, backend, weights))
                # it attends over its own chunk after the cache: causal
                copy = partial(attention_kernel, cfg, i, width=width, capacity=self.capacity)
                causal_copies(self.attention[-1].kernel, partial(copy_at, copy, route=route, weights=weights))
                self.mlp.append(
                    Compiled(mlp_kernel(cfg, i, width=width, route=route, weights=weights), backend, weights)
                )
                if dynamic:  # its columns kept apart, but moved by transposes: its copies built here
                    copy = partial(mlp_kernel, cfg, i, width=width)
                    causal_copies(self.mlp[-1].kernel, partial(copy_at, copy, route=route, weights=weights))
            for start, stop in plan.tiles:
                head = head_kernel(cfg, start, stop, width=width, route=route, weights=weights)
                self.tiles.append(Compiled(head, backend, weights))
                if dynamic:
                    copy = partial(head_kernel, cfg, start, stop, width=width)
                    causal_copies(self.tiles[-1].kernel, partial(copy_at, copy, route=route, weights=weights))
        except BaseException:
            self.close()
            raise

    def copy_from(self, other: BlockSet, start: int, stop: int) -> None:
        """Positions start .. stop-1 of every layer's k / v from ``other``'s cache surfaces into ours."""
        copy_cache(self.attention, other.attention, start, stop)

    def close(self) -> None:
        for k in (*self.attention, *self.mlp, *self.tiles):
            k.close()
        self.attention, self.mlp, self.tiles = [], [], []


class BlockRunner:
    """The dynamic-engine-attention route for one model: a BlockSet per width of the plan."""

    def __init__(self, params: Params, backend: Backend, plan: GenerationPlan, route: KernelRoute) -> None:
        self.params, self.plan, self.cfg = params, plan, params.cfg
        self.sets: dict[int, BlockSet] = {}
        try:
            for w in plan.widths:
                self.sets[w] = BlockSet(params, backend, plan, route, w)
        except BaseException:
            self.close()
            raise

    def _norm(self, x: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        assert w is not None
        return cpu_ops.rmsnorm(
            x, (np.float32(self.cfg.norm_offset) + w).astype(np.float32), self.cfg.norm_eps
        )

    def _mlp(self, kernel: Compiled, x: np.ndarray, n: int, post_norm: np.ndarray | None) -> np.ndarray:
        """The MLP block of the first ``n`` columns of ``x`` (dim, W), zeros in the others (dim, W).

        The MLP kernel keeps its columns apart, so only the real tokens' columns are read
        (``read_columns``: a simulated kernel computes only those). Its padding columns would only feed the
        padding columns of the next attention kernel, which the real tokens never see: a real query's
        score against a padding key is masked (``gen_blocks.MASK_VALUE``), its exp is an exact 0 for any
        finite key, and a 0 weight adds 0 to the sums. The post-norm (Gemma 3) runs on the full width, as
        every other norm does, so a column's norm is summed as before."""
        m = np.zeros_like(x)
        m[:, :n] = kernel.run({"x": x}, columns=n)["x"]
        return m if not self.cfg.post_norms else self._norm(m, post_norm)

    def run(self, tokens: np.ndarray, pos: int, width: int) -> np.ndarray:
        """Tokens (n,), n <= width, at positions pos .. pos+n-1: the last token's logits (vocab,)."""
        s, n, cfg = self.sets[width], tokens.shape[0], self.cfg
        catch_up(self.sets.values(), s, pos)
        x = embed(self.params, tokens, width)  # (dim, W)
        shared = host_parts(cfg, s.capacity, width, pos, n, s.attention[0].gen.act.names)
        for i, layer in enumerate(self.params.layers):
            att = s.attention[i]
            # only the real tokens' columns are read (a simulated baked kernel may run its causal copy);
            # the padding columns of its result are zeros, which only padding queries would see
            out = att.run({"x": self._norm(x, layer.rms_att), **shared}, columns=n)
            att.write_cache(out, pos, n)  # the chunk's k / v into this kernel's own cache, in place
            a = np.zeros_like(x)
            a[:, :n] = out["x"]
            if cfg.post_norms:  # on the full width, as every norm here
                a = self._norm(a, layer.post_att_norm)  # (dim, W)
            x = x + a
            x = x + self._mlp(s.mlp[i], self._norm(x, layer.rms_ffn), n, layer.post_ffn_norm)
        ran(self.sets.values(), s, pos, n)
        check_norm_input(x[:, :n], f"layer {cfg.n_layers - 1}'s output", pos)
        xn = self._norm(x, self.params.rms_final)  # (dim, W)
        # the head reads column n-1 alone
        return np.concatenate([t.run({"x": xn}, columns=n)["logits"][:, n - 1] for t in s.tiles])  # (vocab,)

    def reset(self) -> None:
        for s in self.sets.values():
            s.filled = 0

    def close(self) -> None:
        for s in self.sets.values():
            s.close()
        self.sets = {}


__all__ = ["BlockRunner", "BlockSet"]
