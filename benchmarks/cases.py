"""The gradient suite's cases (docs/testing.md) for benchmarking, in three frameworks.

``CASES[name]`` is a :class:`Case`: the input shapes (and which are
differentiated), and three builders of the same operator:

* ``texpr(inputs) -> Tensor`` (te.nn operators on placeholders),
* ``jax(*arrays) -> array`` (jax.numpy / lax),
* ``torch(*tensors) -> tensor`` (torch.nn.functional).

``scale`` < 1 shrinks the batch (for quick runs); the suite's sizes are scale 1.
"""

import numpy as np

import texpr as te

nn = te.nn


class Case:
    """``inputs``: list of (name, shape, dtype, differentiated?); ``flop``: the
    forward's multiply-add count times 2 (or None)."""

    def __init__(self, name, inputs, texpr, jax, torch, flop=None):
        self.name, self.inputs = name, inputs
        self.texpr, self.jax, self.torch, self.flop = texpr, jax, torch, flop


def _conv_case(name, x, w, stride=1, padding=0, dilation=1, groups=1):
    def tx(X, W):
        return nn.conv2d(X, W, stride=stride, padding=padding, dilation=dilation, groups=groups)

    def jx(X, W):
        from jax import lax
        return lax.conv_general_dilated(X, W, (stride, stride), [(padding, padding)] * 2,
                                        rhs_dilation=(dilation, dilation),
                                        feature_group_count=groups)

    def th(X, W):
        import torch.nn.functional as F
        return F.conv2d(X, W, stride=stride, padding=padding, dilation=dilation, groups=groups)

    return Case(name, [("X", x, "float32", True), ("W", w, "float32", True)], tx, jx, th)


def _causal_texpr(q, k):
    d = te.reduce_axis(q.shape[2], "d")
    return te.compute((q.shape[0], q.shape[1], k.shape[1]),
                      lambda b, i, j: te.sum(q[b, i, d] * k[b, j, d], axis=d, where=j <= i),
                      name="causal_scores")


def _xent_texpr(z, labels):
    ls = nn.log_softmax(z, axis=1)
    i, c = te.reduce_axis(z.shape[0], "i"), te.reduce_axis(z.shape[1], "c")
    return te.compute((), lambda: te.sum(te.if_then_else(labels[i] == c, -ls[i, c], 0.0),
                                         axis=[i, c]), name="softmax_xent")


def make_cases(scale=1.0):
    """All SUITE cases with the batch dimension scaled by ``scale``."""
    def b(n):
        return max(1, int(round(n * scale)))

    cases = {}

    def jnp():
        import jax.numpy as j
        return j

    cases["dense"] = Case(
        "dense", [("X", (b(256), 784), "float32", True), ("W", (128, 784), "float32", True)],
        lambda X, W: nn.dense(X, W), lambda X, W: X @ W.T, lambda X, W: X @ W.T)
    cases["conv2d_s1"] = _conv_case("conv2d_s1", (b(32), 16, 28, 28), (32, 16, 3, 3), 1, 1)
    cases["conv2d_s2"] = _conv_case("conv2d_s2", (b(32), 16, 28, 28), (32, 16, 3, 3), 2, 1)
    cases["conv2d_dil2"] = _conv_case("conv2d_dil2", (b(32), 16, 28, 28), (32, 16, 3, 3), 1, 2, 2)
    cases["depthwise"] = _conv_case("depthwise", (b(32), 32, 28, 28), (32, 1, 3, 3), 1, 1,
                                    groups=32)

    def mp_j(X):
        from jax import lax
        return lax.reduce_window(X, -np.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def mp_t(X):
        import torch.nn.functional as F
        return F.max_pool2d(X, 2, 2)

    cases["maxpool2"] = Case("maxpool2", [("X", (b(32), 32, 28, 28), "float32", True)],
                             lambda X: nn.max_pool2d(X, 2, 2), mp_j, mp_t)

    def ap_j(X):
        from jax import lax
        s = lax.reduce_window(X, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 2, 2),
                              [(0, 0), (0, 0), (1, 1), (1, 1)])
        return s / 9.0

    def ap_t(X):
        import torch.nn.functional as F
        return F.avg_pool2d(X, 3, 2, 1, count_include_pad=True)

    cases["avgpool3s2"] = Case("avgpool3s2", [("X", (b(32), 32, 28, 28), "float32", True)],
                               lambda X: nn.avg_pool2d(X, 3, 2, 1, count_include_pad=True),
                               ap_j, ap_t)

    def ct_j(X, W):
        from jax import lax
        import jax.numpy as j
        wt = j.flip(W, (2, 3)).transpose(1, 0, 2, 3)
        return lax.conv_general_dilated(X, wt, (1, 1), [(2, 2), (2, 2)], lhs_dilation=(2, 2))

    def ct_t(X, W):
        import torch.nn.functional as F
        return F.conv_transpose2d(X, W, stride=2, padding=1)

    cases["conv2d_transpose_s2"] = Case(
        "conv2d_transpose_s2",
        [("X", (b(32), 16, 14, 14), "float32", True), ("W", (16, 8, 4, 4), "float32", True)],
        lambda X, W: nn.conv2d_transpose(X, W, stride=2, padding=1), ct_j, ct_t)

    def cs_t(X):
        import torch
        return torch.cumsum(X, 1)

    cases["cumsum"] = Case("cumsum", [("X", (b(256), 1024), "float32", True)],
                           lambda X: nn.cumsum(X, axis=1), lambda X: jnp().cumsum(X, axis=1), cs_t)

    def cau_j(Q, K):
        j = jnp()
        s = j.einsum("bid,bjd->bij", Q, K)
        n = Q.shape[1]
        return j.where(j.tril(j.ones((n, n), bool)), s, 0.0)

    def cau_t(Q, K):
        import torch
        s = torch.einsum("bid,bjd->bij", Q, K)
        return torch.tril(s)

    cases["causal_scores"] = Case(
        "causal_scores",
        [("Q", (b(8), 128, 64), "float32", True), ("K", (b(8), 128, 64), "float32", True)],
        _causal_texpr, cau_j, cau_t)

    def up_j(X):
        j = jnp()
        return j.repeat(j.repeat(X, 2, axis=2), 2, axis=3)

    def up_t(X):
        import torch.nn.functional as F
        return F.interpolate(X, scale_factor=2, mode="nearest")

    cases["upsample2"] = Case("upsample2", [("X", (b(32), 16, 14, 14), "float32", True)],
                              lambda X: nn.upsample_nearest(X, 2), up_j, up_t)

    def ps_j(X):
        n, c4, h, w = X.shape
        return X.reshape(n, c4 // 4, 2, 2, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(
            n, c4 // 4, 2 * h, 2 * w)

    def ps_t(X):
        import torch.nn.functional as F
        return F.pixel_shuffle(X, 2)

    cases["pixel_shuffle2"] = Case("pixel_shuffle2", [("X", (b(32), 64, 14, 14), "float32", True)],
                                   lambda X: nn.pixel_shuffle(X, 2), ps_j, ps_t)
    cases["flatten_dense"] = Case(
        "flatten_dense",
        [("X", (b(32), 16, 7, 7), "float32", True), ("W", (10, 784), "float32", True)],
        lambda X, W: nn.dense(nn.flatten(X), W), lambda X, W: X.reshape(X.shape[0], -1) @ W.T,
        lambda X, W: X.reshape(X.shape[0], -1) @ W.T)
    cases["transpose_sum"] = Case(
        "transpose_sum", [("A", (10, 10), "float32", True)],
        lambda A: te.compute(A.shape, lambda i, j: A[i, j] + A[j, i], name="transpose_sum"),
        lambda A: A + A.T, lambda A: A + A.T)

    def ln_j(X):
        j = jnp()
        m = X.mean(axis=-1, keepdims=True)
        v = ((X - m) ** 2).mean(axis=-1, keepdims=True)
        return (X - m) / j.sqrt(v + 1e-5)

    def ln_t(X):
        import torch.nn.functional as F
        return F.layer_norm(X, (X.shape[-1],), eps=1e-5)

    cases["layernorm"] = Case("layernorm", [("X", (b(256), 512), "float32", True)],
                              lambda X: nn.layer_norm(X, 512, eps=1e-5), ln_j, ln_t)

    def xe_j(Z, L):
        import jax
        j = jnp()
        oh = jax.nn.one_hot(L, Z.shape[1], dtype=Z.dtype)
        return -(oh * jax.nn.log_softmax(Z, axis=1)).sum()

    def xe_t(Z, L):
        import torch.nn.functional as F
        return F.cross_entropy(Z, L, reduction="sum")

    cases["softmax_xent"] = Case(
        "softmax_xent",
        [("Z", (b(256), 10), "float32", True), ("labels", (b(256),), "int64", False)],
        _xent_texpr, xe_j, xe_t)
    n1 = b(32)
    cases["conv2d_s1"].flop = 2 * n1 * 32 * 28 * 28 * 16 * 9
    cases["conv2d_s2"].flop = 2 * n1 * 32 * 14 * 14 * 16 * 9
    cases["conv2d_dil2"].flop = 2 * n1 * 32 * 28 * 28 * 16 * 9
    # each input pixel meets every kernel tap: 16 in, 8 out channels, 4x4 taps
    cases["conv2d_transpose_s2"].flop = 2 * n1 * 16 * 14 * 14 * 8 * 16
    cases["dense"].flop = 2 * b(256) * 784 * 128
    return cases


def value_and_grad_graph(case):
    """``(placeholders, head, output, gradients)``: the case's texpr graph and its
    adjoints (w.r.t. the differentiable inputs) for a float32 head ``H``."""
    phs = [te.placeholder(shape, name, dtype) for name, shape, dtype, _ in case.inputs]
    out = case.texpr(*phs)
    h = te.placeholder(out.shape, "H", "float32")
    wrt = [p for p, (_, _, _, d) in zip(phs, case.inputs) if d]
    return phs, h, out, list(te.differentiate(out, wrt, head=h).result)


def random_inputs(case, seed=0):
    """numpy arrays for a case's inputs (labels in range for softmax_xent)."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape, dtype, _ in case.inputs:
        if dtype.startswith("int"):
            out.append(rng.integers(0, 10, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


# ---- the peers' value-and-grad (shared by bench_suite.py and peer_alone.py) ----

def jax_value_and_grad(case, arrays, head):
    import jax
    import jax.numpy as jnp

    diff = [k for k, (_, _, _, d) in enumerate(case.inputs) if d]

    def vg(args, h):
        def f(*d):
            full = list(args)
            for k, v in zip(diff, d):
                full[k] = v
            return case.jax(*full)
        out, vjp = jax.vjp(f, *[args[k] for k in diff])
        return out, vjp(h)

    fn = jax.jit(vg)
    args = [jnp.asarray(a) for a in arrays]
    h = jnp.asarray(head)

    def run():
        out, grads = fn(args, h)
        jax.block_until_ready((out, grads))
        return out, grads
    return run


def torch_value_and_grad(case, arrays, head):
    import torch

    ts = []
    for a, (_, _, _, d) in zip(arrays, case.inputs):
        t = torch.from_numpy(a.copy())
        if d:
            t.requires_grad_(True)
        ts.append(t)
    h = torch.from_numpy(head.copy())
    diff = [t for t, (_, _, _, d) in zip(ts, case.inputs) if d]

    def run():
        out = case.torch(*ts)
        grads = torch.autograd.grad(out, diff, h)
        return out, grads
    return run


def median_ms(fn, repeat):
    """Median milliseconds of ``repeat`` calls of ``fn`` (after one untimed call)."""
    import time

    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3
