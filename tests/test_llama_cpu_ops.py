"""The training step's CPU ops against float64 formulations written here, and their backward ops against
central finite differences of those formulations."""

from __future__ import annotations

import numpy as np
import pytest

from anekit.errors import AnekitError
from anekit.llama import cpu_ops

EPS = 1e-5


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- float64 formulations ---------------------------------------------------------------------------------


def rmsnorm64(x: np.ndarray, w: np.ndarray, eps: float = EPS) -> np.ndarray:
    """Column by column: x[:, s] / sqrt(sum(x[:, s]^2) / C + eps) * w."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    out = np.empty_like(x)
    for s in range(x.shape[1]):
        col = x[:, s]
        out[:, s] = col / np.sqrt(np.dot(col, col) / col.size + eps) * w
    return out


def cross_entropy64(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean over positions of -log softmax(logits[:, s])[targets[s]], via logsumexp."""
    logits = logits.astype(np.float64)
    total = 0.0
    for s, t in enumerate(targets):
        col = logits[:, s]
        m = col.max()
        total += m + np.log(np.sum(np.exp(col - m))) - col[t]
    return total / len(targets)


def central_diff(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d f / d x for a scalar f of a float64 array, one element at a time."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + h
        up = f()
        x[idx] = old - h
        down = f()
        x[idx] = old
        g[idx] = (up - down) / (2 * h)
    return g


# -- RMSNorm ----------------------------------------------------------------------------------------------


def test_rmsnorm_matches_float64_per_column() -> None:
    r = rng(1)
    x = r.standard_normal((48, 7)).astype(np.float32) * 3
    w = r.standard_normal(48).astype(np.float32)
    y = cpu_ops.rmsnorm(x, w, EPS)
    assert y.shape == (48, 7) and y.dtype == np.float32
    np.testing.assert_allclose(y, rmsnorm64(x, w), rtol=1e-5, atol=1e-6)


def test_rmsnorm_eps_matters_for_tiny_inputs() -> None:
    x = np.full((4, 2), 1e-4, np.float32)
    w = np.ones(4, np.float32)
    np.testing.assert_allclose(cpu_ops.rmsnorm(x, w, 1e-5), rmsnorm64(x, w, 1e-5), rtol=1e-5)
    np.testing.assert_allclose(cpu_ops.rmsnorm(x, w, 1.0), rmsnorm64(x, w, 1.0), rtol=1e-5)


def test_rmsnorm_bwd_matches_finite_differences() -> None:
    r = rng(2)
    c, s = 6, 5
    x = r.standard_normal((c, s))
    w = r.standard_normal(c)
    dy = r.standard_normal((c, s))

    def loss() -> float:  # L = sum(dy * rmsnorm(x, w)): its gradients are the backward's outputs
        return float(np.sum(dy * rmsnorm64(x, w)))

    dx_fd = central_diff(loss, x)
    dw_fd = central_diff(loss, w)
    dx, dw = cpu_ops.rmsnorm_bwd(dy.astype(np.float32), x.astype(np.float32), w.astype(np.float32), EPS)
    assert dx.shape == (c, s) and dw.shape == (c,)
    assert dx.dtype == np.float32 and dw.dtype == np.float32
    np.testing.assert_allclose(dx, dx_fd, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw, dw_fd, rtol=1e-4, atol=1e-5)


def test_rmsnorm_rejects_mismatched_shapes() -> None:
    with pytest.raises(AnekitError, match=r"\[rmsnorm\]"):
        cpu_ops.rmsnorm(np.zeros((4, 3), np.float32), np.ones(5, np.float32), EPS)
    with pytest.raises(AnekitError, match=r"\[rmsnorm_bwd\]"):
        cpu_ops.rmsnorm_bwd(np.zeros((4, 2), np.float32), np.zeros((4, 3), np.float32), np.ones(4), EPS)


# -- cross-entropy ----------------------------------------------------------------------------------------


def test_cross_entropy_loss_and_gradient() -> None:
    r = rng(3)
    vocab, seq = 11, 6
    logits = r.standard_normal((vocab, seq)) * 2
    targets = r.integers(0, vocab, seq)
    loss, dlogits = cpu_ops.cross_entropy(logits.astype(np.float32), targets)
    assert isinstance(loss, float)
    assert dlogits.shape == (vocab, seq) and dlogits.dtype == np.float32
    assert loss == pytest.approx(cross_entropy64(logits, targets), rel=1e-5)
    fd = central_diff(lambda: cross_entropy64(logits, targets), logits)
    np.testing.assert_allclose(dlogits, fd, rtol=1e-4, atol=1e-6)
    # (softmax - onehot) / seq: each column sums to zero
    np.testing.assert_allclose(dlogits.sum(axis=0), 0.0, atol=1e-6)


def test_cross_entropy_is_stable_for_huge_logits() -> None:
    logits = np.array([[1e4, 0.0], [1e4 - 1, 3e4], [-1e4, 3e4 - 2]], np.float32)  # (vocab 3, seq 2)
    targets = np.array([1, 2], np.uint16)
    loss, dlogits = cpu_ops.cross_entropy(logits, targets)
    assert np.isfinite(loss) and np.isfinite(dlogits).all()
    assert loss == pytest.approx(cross_entropy64(logits, targets), rel=1e-6)
    p1 = 1 / (1 + np.e)  # column 0: logits 1e4 and 1e4 - 1
    assert dlogits[0, 0] == pytest.approx((1 - p1) / 2, rel=1e-5)
    assert dlogits[1, 0] == pytest.approx((p1 - 1) / 2, rel=1e-5)


def test_cross_entropy_rejects_bad_targets() -> None:
    logits = np.zeros((5, 3), np.float32)
    with pytest.raises(AnekitError, match=r"\[cross_entropy\] targets must lie in \[0, 5\)"):
        cpu_ops.cross_entropy(logits, np.array([0, 5, 1]))
    with pytest.raises(AnekitError, match=r"\[cross_entropy\] targets must be \(3,\)"):
        cpu_ops.cross_entropy(logits, np.array([0, 1]))
    with pytest.raises(AnekitError, match="integers"):
        cpu_ops.cross_entropy(logits, np.array([0.0, 1.0, 2.0]))


# -- embedding --------------------------------------------------------------------------------------------


def test_embed_lookup_gathers_rows_channel_first() -> None:
    embed = rng(4).standard_normal((10, 4)).astype(np.float32)
    tokens = np.array([3, 0, 9, 3], np.uint16)
    x = cpu_ops.embed_lookup(embed, tokens)
    assert x.shape == (4, 4) and x.flags.c_contiguous
    for s, t in enumerate(tokens):
        np.testing.assert_array_equal(x[:, s], embed[t])


def test_embed_backward_adds_repeated_tokens() -> None:
    r = rng(5)
    dembed = r.standard_normal((10, 4)).astype(np.float32)
    start = dembed.astype(np.float64)
    dx = r.standard_normal((4, 6)).astype(np.float32)
    tokens = np.array([2, 7, 2, 2, 0, 7])
    cpu_ops.embed_backward(dembed, dx, tokens)
    expected = start.copy()
    for s, t in enumerate(tokens):
        expected[t] += dx[:, s]
    np.testing.assert_allclose(dembed, expected, rtol=1e-6, atol=1e-6)


def test_embed_ops_reject_out_of_range_tokens() -> None:
    embed = np.zeros((10, 4), np.float32)
    with pytest.raises(AnekitError, match=r"\[embed_lookup\] tokens must lie in \[0, 10\)"):
        cpu_ops.embed_lookup(embed, np.array([1, 10]))
    with pytest.raises(AnekitError, match=r"\[embed_backward\] tokens"):
        cpu_ops.embed_backward(embed, np.zeros((4, 2), np.float32), np.array([-1, 0]))
    with pytest.raises(AnekitError, match=r"\[embed_backward\] dx must be \(dim, seq\)"):
        cpu_ops.embed_backward(embed, np.zeros((3, 2), np.float32), np.array([1, 0]))


# -- AdamW ------------------------------------------------------------------------------------------------


def adamw64(w, g, m, v, t, lr, b1, b2, eps, wd):
    """PyTorch's AdamW written out: decoupled decay, moments, bias-corrected update."""
    w = w * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    return w - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


@pytest.mark.parametrize("shape, decayed", [((6, 5), True), ((7,), False)])
def test_adamw_matches_float64_over_steps(shape: tuple[int, ...], decayed: bool) -> None:
    r = rng(6)
    w = r.standard_normal(shape).astype(np.float32)
    m = np.zeros(shape, np.float32)
    v = np.zeros(shape, np.float32)
    w64, m64, v64 = w.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    lr, wd = 1e-2, 0.1
    for t in range(1, 6):
        g = r.standard_normal(shape).astype(np.float32)
        cpu_ops.adamw_update(w, g, m, v, t, lr, weight_decay=wd)  # 2-D decayed, 1-D not, by default
        w64, m64, v64 = adamw64(w64, g, m64, v64, t, lr, 0.9, 0.95, 1e-8, wd if decayed else 0.0)
    np.testing.assert_allclose(m, m64, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(v, v64, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(w, w64, rtol=1e-5, atol=1e-6)


def test_adamw_decay_flag_overrides_the_rule() -> None:
    # A zero gradient leaves only the decay: w * (1 - lr * weight_decay), or w unchanged.
    for shape, flag, expect in (((2, 2), False, 2.0), ((3,), True, 2.0 * (1 - 0.5 * 0.1))):
        w = np.full(shape, 2.0, np.float32)
        zeros = [np.zeros(shape, np.float32) for _ in range(3)]
        cpu_ops.adamw_update(w, *zeros, 1, 0.5, weight_decay=0.1, apply_decay=flag)
        np.testing.assert_allclose(w, expect, rtol=1e-6)
    assert cpu_ops.takes_weight_decay(np.zeros((2, 2))) and not cpu_ops.takes_weight_decay(np.zeros(3))


def test_adamw_first_step_moves_each_weight_by_lr() -> None:
    # At t = 1 the bias-corrected update is lr * g / (|g| + eps): a step of lr against the gradient's sign.
    w = np.zeros(4, np.float32)
    g = np.array([3.0, -0.5, 1e-3, -20.0], np.float32)
    cpu_ops.adamw_update(w, g, np.zeros(4, np.float32), np.zeros(4, np.float32), 1, 0.01)
    np.testing.assert_allclose(w, -0.01 * np.sign(g), rtol=1e-4)


def test_adamw_rejects_bad_input() -> None:
    w = np.zeros(3, np.float32)
    with pytest.raises(AnekitError, match=r"\[adamw\] step t must be an integer >= 1"):
        cpu_ops.adamw_update(w, w.copy(), w.copy(), w.copy(), 0, 0.1)
    with pytest.raises(AnekitError, match=r"\[adamw\] m shape \(4,\) differs"):
        cpu_ops.adamw_update(w, w.copy(), np.zeros(4, np.float32), w.copy(), 1, 0.1)
    with pytest.raises(AnekitError, match="float32"):
        cpu_ops.adamw_update(np.zeros(3), w.copy(), w.copy(), w.copy(), 1, 0.1)


def test_adamw_grad_scale_gives_the_bits_of_clipping_first(fp16_path: str) -> None:
    """grad_scale (the clip fused into the AdamW pass) = clip_grad_norm's g *= scale, then adamw_update;
    with the compiled loop and with the numpy path (same bits, w, m, v and the clipped g)."""
    r = rng(9)
    shapes = [(300, 77), (77,)]
    start = [[r.standard_normal(s).astype(np.float32) for _ in range(3)] for s in shapes]
    for k in range(3):
        start = [[w, np.abs(m) * 0.1, np.abs(v) * 0.01] for w, m, v in start]
        grads = [r.standard_normal(s).astype(np.float32) * 10.0 ** (k - 3) for s in shapes]  # k 0: no clip
        unfused = [[a.copy() for a in t] for t in start]
        clipped = [g.copy() for g in grads]
        norm = cpu_ops.clip_grad_norm(clipped, 1.0)
        for (w, m, v), g in zip(unfused, clipped):
            cpu_ops.adamw_update(w, g, m, v, k + 1, 3e-3)
        fused = [[a.copy() for a in t] for t in start]
        scale = cpu_ops.clip_scale(cpu_ops.grad_norm(grads), 1.0)
        assert (scale == 1) == (norm <= 1.0)
        for (w, m, v), g in zip(fused, grads):
            cpu_ops.adamw_update(w, g, m, v, k + 1, 3e-3, grad_scale=scale)
        for a, b in zip([a for t in unfused for a in t] + clipped, [a for t in fused for a in t] + grads):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


# -- gradient clipping ------------------------------------------------------------------------------------


def test_clip_grad_norm_scales_to_max_norm() -> None:
    r = rng(7)
    grads = [r.standard_normal((5, 4)).astype(np.float32) * 3, r.standard_normal(7).astype(np.float32)]
    before = [g.astype(np.float64) for g in grads]
    expected = np.sqrt(sum(float(np.sum(g * g)) for g in before))
    norm = cpu_ops.clip_grad_norm(grads, 1.0)
    assert norm == pytest.approx(expected, rel=1e-6)
    after = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    assert after == pytest.approx(1.0, rel=1e-5)
    for g, b in zip(grads, before):
        np.testing.assert_allclose(g, b / (expected + 1e-6), rtol=1e-6)  # one scale for all tensors


def test_clip_grad_norm_leaves_small_or_nonfinite_gradients() -> None:
    small = np.array([0.3, 0.4], np.float32)
    grads = [small.copy()]
    assert cpu_ops.clip_grad_norm(grads, 1.0) == pytest.approx(0.5, rel=1e-6)
    np.testing.assert_array_equal(grads[0], small)
    assert cpu_ops.clip_grad_norm(grads, 0.0) == pytest.approx(0.5, rel=1e-6)  # 0: clipping off
    np.testing.assert_array_equal(grads[0], small)
    bad = [np.array([np.inf, 1.0], np.float32)]
    assert cpu_ops.clip_grad_norm(bad, 1.0) == np.inf
    np.testing.assert_array_equal(bad[0], [np.inf, 1.0])


def test_cross_entropy_into_the_logits_array_gives_the_same_bits() -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((300, 17)) * 4).astype(np.float32)
    targets = rng.integers(0, 300, 17)
    loss, fresh = cpu_ops.cross_entropy(logits, targets)
    work = logits.copy()
    loss2, inplace = cpu_ops.cross_entropy(work, targets, out=work)
    assert inplace is work and loss2 == loss
    np.testing.assert_array_equal(inplace.view(np.uint32), fresh.view(np.uint32))
    with pytest.raises(AnekitError, match="out must be a C-contiguous float32 array of shape"):
        cpu_ops.cross_entropy(logits, targets, out=np.empty((17, 300), np.float32))
