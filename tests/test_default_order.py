"""The default loop order of a reduction stage (codegen.stage.default_order): the
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
import texpr.codegen.stage as L


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
def test_loads_invariant_in_the_reduction_do_not_pull_the_row_axis_inside(stage, monkeypatch):
    X, mean, var = _variance()
    if stage == "centred_head":  # layernorm's d(var): a head row, per-row factors
        H = te.placeholder((20, 40), "H", "float64")
        s = te.reduce_axis(40, "s")
        t = te.compute((20,), lambda i: te.sum(
            H[i, s] * (-0.5 * te.rsqrt(var[i] + 1e-5) * (X[i, s] - mean[i])), axis=s), name="t")
    else:
        t = var
    assert _innermost(t).kind == "reduce"
    monkeypatch.setattr(L, "INVARIANT_FREE", False)  # the earlier scores chose the row axis
    assert _innermost(t).kind == "spatial"


def test_a_matrix_product_keeps_its_contiguous_output_axis_inside():
    A = te.placeholder((5, 7), "A", "float64")
    B = te.placeholder((7, 9), "B", "float64")
    k = te.reduce_axis(7, "k")
    C = te.compute((5, 9), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    assert _innermost(C) is C.op.axis[1]  # buffer mode: B and C walk j contiguously


@pytest.mark.parametrize("invariant_free", [True, False])
def test_both_orders_compute_the_same_variance_and_gradient(invariant_free, monkeypatch):
    monkeypatch.setattr(L, "INVARIANT_FREE", invariant_free)
    X, mean, var = _variance()
    i = te.reduce_axis(20, "i")
    loss = te.compute((), lambda: te.sum(var[i], axis=i), name="loss")
    dX, = te.differentiate(loss, [X]).result
    x = np.random.default_rng(3).standard_normal((20, 40))
    got = codegen.build([var, dX], [X], parallel=False)(x)
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
    got = codegen.build([out], [A, S], parallel=False)(a, s)[0]
    want = (a * s[None, :, 0]).sum(axis=0) + (n * s[:, 1] * s[:, 2] if stats == 3 else 0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
