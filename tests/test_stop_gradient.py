"""te.stop_gradient: the value of its argument, a constant to differentiation
(jax.lax.stop_gradient), and the softmax family's max shift held under it."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.errors import DTypeError


def test_its_value_is_its_argument_in_every_dtype():
    X = te.placeholder((5,), "X", "float32")
    I = te.placeholder((5,), "I", "int64")
    Y = te.compute((5,), lambda i: te.stop_gradient(X[i]) * 2.0, name="Y")
    J = te.compute((5,), lambda i: te.stop_gradient(I[i]) + 1, name="J")
    assert Y.dtype == "float32" and J.dtype == "int64"
    x = np.array([1.5, -2.0, np.nan, np.inf, 0.0], "float32")
    ix = np.array([3, -4, 2**40, 0, 7], "int64")
    y, j = te.evaluate([Y, J], {X: x, I: ix})
    np.testing.assert_array_equal(y, x * 2)
    np.testing.assert_array_equal(j, ix + 1)
    got = codegen.build([Y, J], [X, I])(x, ix)
    np.testing.assert_array_equal(got[0], y)
    np.testing.assert_array_equal(got[1], j)
    with pytest.raises(DTypeError, match="stop_gradient"):
        te.stop_gradient(X[0] > 0)
    with pytest.raises(DTypeError, match="stop_gradient"):
        te.stop_gradient(True)
    # an integer expression or a constant has no derivative: returned as it is, so an
    # index under it stays affine to the simplifier
    i = te.reduce_axis(5, "i")
    assert te.expr_str(te.stop_gradient(i + 1)) == te.expr_str(i + 1)
    assert te.expr_str(te.stop_gradient(2.5)) == te.expr_str(te.const(2.5))


def test_nothing_flows_through_it():
    # L = sum(X * stop_gradient(X) + stop_gradient(tanh(W)) * W): dL/dX = X (not 2X),
    # dL/dW = tanh(W); as jax.grad with lax.stop_gradient
    n = 6
    X = te.placeholder((n,), "X", "float64")
    W = te.placeholder((n,), "W", "float64")
    k = te.reduce_axis(n, "k")
    L = te.compute((), lambda: te.sum(X[k] * te.stop_gradient(X[k])
                                      + te.stop_gradient(te.tanh(W[k])) * W[k], axis=k),
                   name="L")
    dX, dW = te.differentiate(L, [X, W]).result
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(n), rng.standard_normal(n)
    want = (x, np.tanh(w))
    got = te.evaluate([dX, dW], {X: x, W: w})
    kern = codegen.build([L, dX, dW], [X, W])(x, w)
    for g, c, ref in zip(got, kern[1:], want):
        np.testing.assert_allclose(g, ref, rtol=1e-12)
        np.testing.assert_allclose(c, ref, rtol=1e-12)
    np.testing.assert_allclose(kern[0], (x * x + np.tanh(w) * w).sum(), rtol=1e-12)
    jax = pytest.importorskip("jax")
    jnp, lax = jax.numpy, jax.lax

    def f(a, b):
        return jnp.sum(a * lax.stop_gradient(a) + lax.stop_gradient(jnp.tanh(b)) * b)

    with jax.enable_x64(True):
        refs = [np.asarray(r) for r in jax.grad(f, argnums=(0, 1))(x, w)]
    for g, ref in zip(got, refs):
        assert ref.dtype == np.float64
        np.testing.assert_allclose(g, ref, rtol=1e-12)


def test_log_softmax_gradient_has_no_term_through_its_max():
    # the shift is a constant to differentiation: no argmax stage, and the gradient
    # is the exact softmax - onehot form, checked against finite differences
    n, c = 4, 7
    Z = te.placeholder((n, c), "Z", "float64")
    labels = te.placeholder((n,), "labels", "int64")
    loss = te.nn.cross_entropy(Z, labels, reduction="sum")
    (dZ,) = te.differentiate(loss, [Z]).result
    kern = codegen.build([loss, dZ], [Z, labels])
    assert not any("argmax" in s for s in kern.stages), kern.stages
    rng = np.random.default_rng(1)
    z = rng.standard_normal((n, c)) * 3
    z[2] += 1e3  # a large row: the shift matters for the value, not the gradient
    lab = np.array([0, 6, 3, 2])
    val, g = kern(z, lab)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = p.copy()
    want[np.arange(n), lab] -= 1
    np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)
    eps = 1e-6
    for i, j in [(0, 0), (1, 6), (2, 3), (3, 1)]:
        zp, zm = z.copy(), z.copy()
        zp[i, j] += eps
        zm[i, j] -= eps
        fd = (float(kern(zp, lab)[0]) - float(kern(zm, lab)[0])) / (2 * eps)
        assert abs(fd - g[i, j]) < 1e-6


def test_a_gemm_condition_under_it_stays_a_gemm():
    # a contraction whose where= reads a float under stop_gradient still runs on BLAS
    # (the condition's evaluator sees the argument), with the loop nest's values
    A = te.placeholder((6, 5), "A", "float64")
    B = te.placeholder((5, 4), "B", "float64")
    M = te.placeholder((5,), "M", "float64")
    k = te.reduce_axis(5, "k")
    C = te.compute((6, 4), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k,
                                               where=te.stop_gradient(M[k]) > 0), name="C")
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    m = np.array([1.0, -1.0, 0.5, np.nan, 2.0])
    with pytest.MonkeyPatch.context() as mp:
        from texpr.codegen.analysis import contraction
        mp.setattr(contraction, "cost_ok", lambda plan: True)  # small, on BLAS all the same
        mp.setenv("TEXPR_SYMBOLIC_CACHE", "0")
        kern = codegen.build([C], [A, B, M])
    assert [u.kind for u in kern.units] == ["blas"], [u.kind for u in kern.units]
    want = a[:, m > 0] @ b[m > 0]
    np.testing.assert_allclose(kern(a, b, m)[0], want, rtol=1e-12)
    np.testing.assert_allclose(te.evaluate(C, {A: a, B: b, M: m}), want, rtol=1e-12)


def test_a_stage_under_it_is_inlined_as_the_same_stage_without_it():
    # the inlining rule counts stop_gradient as free (attack helper-29: Y was
    # materialised with it, 12,288 points against 8,192 without)
    from texpr import simplify

    counts, stages = [], []
    for wrap in (lambda e: e, te.stop_gradient):
        X = te.placeholder((64, 64), "X", "float64")
        Y = te.compute((64, 64), lambda i, j: wrap(X[i, j]) * X[i, j], name="Y")
        Z = te.compute((64, 64), lambda i, j: Y[i, j] + Y[j, i], name="Z")
        ri, rj = te.reduce_axis(64, "ri"), te.reduce_axis(64, "rj")
        L = te.compute((), lambda: te.sum(Z[ri, rj] * Z[ri, rj], axis=[ri, rj]), name="L")
        (dX,) = te.differentiate(L, [X]).result
        counts.append(simplify.iteration_count([L, dX]))
        kern = codegen.build([L, dX], [X])
        stages.append(list(kern.stages))
        x = np.random.default_rng(4).standard_normal((64, 64))
        y = x * x
        z = y + y.T
        got = kern(x)
        np.testing.assert_allclose(got[0], (z * z).sum(), rtol=1e-12)
        # d/dx of sum((sg(x) x + (sg(x) x)^T)^2): 2 z + 2 z^T times sg(x) (the plain
        # form has the factor 2 x)
        factor = 2 * x if len(stages) == 1 else x
        np.testing.assert_allclose(got[1], 2 * (z + z.T) * factor, rtol=1e-12)
    assert counts[0] == counts[1] and stages[0] == stages[1], (counts, stages)
