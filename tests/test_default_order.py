"""The default loop order of a reduction stage (codegen.loopnest.order.default_order): the
axis along which most accesses are unit stride or invariant goes innermost.

A load invariant in a loop is kept in a register, and a reduction's output is
stored once after its loop, so neither may pull a spatial axis innermost.
Before, layernorm's variance ``sum_r (X[i, r] - mean[i])^2`` ran with ``i``
innermost (buffer mode): X read at stride 512 and the reduction unrolled 16
times (about 0.2 s more numba time per such stage)."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
import texpr.codegen.loopnest.order as L


def _variance(n=20, m=40):
    X = te.placeholder((n, m), "X", "float64")
    r = te.reduce_axis(m, "r")
    mean = te.compute((n,), lambda i: te.sum(X[i, r], axis=r) / m, name="mean")
    r2 = te.reduce_axis(m, "r2")
    var = te.compute((n,), lambda i: te.sum((X[i, r2] - mean[i]) * (X[i, r2] - mean[i]),
                                             axis=r2), name="var")
    return X, mean, var


def _innermost(t):
    op = t.op
    order = L.default_order(op, list(op.body), list(op.axis), list(op.reduce_axis))
    return order[-1]


@pytest.mark.parametrize("stage", ["var", "centred_head"])
def test_loads_invariant_in_the_reduction_do_not_pull_the_row_axis_inside(stage):
    X, mean, var = _variance()
    if stage == "centred_head":  # layernorm's d(var): a head row, per-row factors
        H = te.placeholder((20, 40), "H", "float64")
        s = te.reduce_axis(40, "s")
        t = te.compute((20,), lambda i: te.sum(
            H[i, s] * (-0.5 * te.rsqrt(var[i] + 1e-5) * (X[i, s] - mean[i])), axis=s), name="t")
    else:
        t = var
    assert _innermost(t).kind == "reduce"
    with codegen.options(invariant_free=False):  # the earlier scores chose the row axis
        assert _innermost(t).kind == "spatial"


def test_a_matrix_product_keeps_its_contiguous_output_axis_inside():
    A = te.placeholder((5, 7), "A", "float64")
    B = te.placeholder((7, 9), "B", "float64")
    k = te.reduce_axis(7, "k")
    C = te.compute((5, 9), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    assert _innermost(C) is C.op.axis[1]  # buffer mode: B and C walk j contiguously


@pytest.mark.parametrize("invariant_free", [True, False])
def test_both_orders_compute_the_same_variance_and_gradient(invariant_free):
    opts = {"invariant_free": invariant_free}
    X, mean, var = _variance()
    i = te.reduce_axis(20, "i")
    loss = te.compute((), lambda: te.sum(var[i], axis=i), name="loss")
    dX, = te.differentiate(loss, [X]).result
    x = np.random.default_rng(3).standard_normal((20, 40))
    got = codegen.build([var, dX], [X], parallel=False, blas=False, options=opts)(x)
    want = te.evaluate([var, dX], {X: x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[0], x.var(axis=1) * 40, rtol=1e-12)
    np.testing.assert_allclose(got[1], 2 * (x - x.mean(axis=1, keepdims=True)), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("stats", [1, 3])
def test_invariant_loads_never_make_a_far_strided_loop_innermost(stats):
    # an attack's find: sum_k A[k, i] * S[i, 0] + S[i, 1] * S[i, 2] -- the loads of
    # S are invariant in k, and crediting them put k innermost, reading A by
    # columns: 170 ms against 14.5 ms at 3000 x 3000
    n = 40
    A = te.placeholder((n, n), "A", "float64")
    S = te.placeholder((n, 3), "S", "float64")
    k = te.reduce_axis(n, "k")
    if stats == 3:
        body = lambda i: te.sum(A[k, i] * S[i, 0] + S[i, 1] * S[i, 2], axis=k)  # noqa: E731
    else:
        body = lambda i: te.sum(A[k, i] * S[i, 0], axis=k)  # noqa: E731
    out = te.compute((n,), body, name="out")
    assert _innermost(out) is out.op.axis[0]
    a = np.random.default_rng(0).standard_normal((n, n))
    s = np.random.default_rng(1).standard_normal((n, 3))
    got = codegen.build([out], [A, S], parallel=False, blas=False)(a, s)[0]
    want = (a * s[None, :, 0]).sum(axis=0) + (n * s[:, 1] * s[:, 2] if stats == 3 else 0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _masked_input_gradient(n=64, c=16, k=8, s=4):
    # the main job's conv2 input gradient behind its relu: the where's load of the
    # convolution varies along the batch, output channels and image axes, not
    # along the input channel j1
    G = te.placeholder((n, c, s, s), "G", "float64")
    conv = te.placeholder((n, c, s, s), "conv", "float64")
    W = te.placeholder((c, k, 3, 3), "W", "float64")
    rc, kh, kw = te.reduce_axis(c, "rc"), te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw")

    def body(i, j1, j2, j3):
        h, w = j2 - kh + 1, j3 - kw + 1
        inside = te.all(h >= 0, h < s, w >= 0, w < s)
        return te.sum(G[i, rc, h, w] * W[rc, j1, kh, kw], axis=[rc, kh, kw],
                      where=te.logical_and(inside, conv[i, rc, h, w] > 0.0))
    return G, conv, W, te.compute((n, k, s, s), body, name="dP")


def test_a_small_convolution_runs_along_its_image_rows_not_its_batch():
    # the main job's conv2 (3x3 on 4x4 images, batch 64): every long loop strides
    # far, so the short contiguous image row goes innermost (numba, serial, one
    # run: 0.98 -> 0.27 ms); the loads' invariance credit had put the batch inside
    # (as the simplifier leaves it: the padding as the reduction's where)
    P = te.placeholder((64, 8, 4, 4), "P", "float64")
    W = te.placeholder((16, 8, 3, 3), "W", "float64")
    rc, kh, kw = te.reduce_axis(8, "rc"), te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw")
    out = te.compute((64, 16, 4, 4), lambda n, c, h, w: te.sum(
        P[n, rc, h + kh - 1, w + kw - 1] * W[c, rc, kh, kw], axis=[rc, kh, kw],
        where=te.all(h + kh >= 1, h + kh <= 4, w + kw >= 1, w + kw <= 4)), name="conv")
    assert _innermost(out) is out.op.axis[3]
    with codegen.options(condition_invariant=False):
        assert _innermost(out) is out.op.axis[0]


def test_the_innermost_loop_keeps_a_data_dependent_where_invariant(monkeypatch):
    _, _, _, dP = _masked_input_gradient()
    assert _innermost(dP) is dP.op.axis[1]  # the condition is tested once per loop
    varies = L._data_condition_axes(list(dP.op.body))
    assert id(dP.op.axis[1]) not in varies and id(dP.op.axis[3]) in varies
    # blind to the condition, the short contiguous image row would go inside (the
    # main job's kernel, one run: this stage 0.42 -> 0.85 ms)
    monkeypatch.setattr(L, "_data_condition_axes", lambda exprs: set())
    assert _innermost(dP) is dP.op.axis[3]


@pytest.mark.parametrize("rule", [True, False])
def test_both_orders_compute_the_same_masked_input_gradient(rule):
    opts = {"condition_invariant": rule}
    G, conv, W, dP = _masked_input_gradient(n=5, c=3, k=4, s=4)
    rng = np.random.default_rng(7)
    vals = {G: rng.standard_normal((5, 3, 4, 4)), conv: rng.standard_normal((5, 3, 4, 4)),
            W: rng.standard_normal((3, 4, 3, 3))}
    got, = codegen.build([dP], [G, conv, W], parallel=False, blas=False,
                         options=opts)(*vals.values())
    want = te.evaluate([dP], vals)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # and against numpy: the relu-masked adjoint convolved with the flipped kernel
    g = np.where(vals[conv] > 0, vals[G], 0.0)
    gp = np.pad(g, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((5, 4, 4, 4))
    for kh in range(3):
        for kw in range(3):
            ref += np.einsum("ncij,ck->nkij", gp[:, :, 2 - kh:6 - kh, 2 - kw:6 - kw],
                             vals[W][:, :, kh, kw])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
