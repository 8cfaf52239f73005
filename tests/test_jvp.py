"""te.jvp (forward mode) against float64 central finite differences along the
tangent direction; forward-over-reverse Hessian-vector products; errors."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen

EPS = 1e-6


def _fd(outputs, feed, inputs, dirs):
    plus = {**feed, **{x: feed[x] + EPS * d for x, d in zip(inputs, dirs)}}
    minus = {**feed, **{x: feed[x] - EPS * d for x, d in zip(inputs, dirs)}}
    return [(te.evaluate(y, plus) - te.evaluate(y, minus)) / (2 * EPS) for y in outputs]


def _graph():
    X = te.placeholder((4, 5), name="X", dtype="float64")
    W = te.placeholder((3, 5), name="W", dtype="float64")
    k = te.reduce_axis(5, name="k")
    k2 = te.reduce_axis(3, "k2")
    Y = te.compute((4, 3), lambda i, j: te.tanh(te.sum(X[i, k] * W[j, k], axis=k)), name="Y")
    M = te.compute((4,), lambda i: te.max(Y[i, k2], axis=k2), name="M")
    P = te.compute((4,), lambda i: te.prod(Y[i, k2], axis=k2), name="P")
    F = te.compute((20,), lambda i: X[i // 5, i % 5] * 2.0, name="F")  # flatten (quasi-affine)
    return X, W, [Y, M, P, F]


def test_jvp_of_sum_max_prod_and_flatten_matches_finite_differences():
    X, W, outs = _graph()
    dX = te.placeholder((4, 5), name="dX", dtype="float64")
    dW = te.placeholder((3, 5), name="dW", dtype="float64")
    tans = te.jvp(outs, [X, W], [dX, dW])
    assert [t.shape for t in tans] == [y.shape for y in outs]
    rng = np.random.default_rng(0)
    x, w, dx, dw = (rng.standard_normal(s) for s in [(4, 5), (3, 5), (4, 5), (3, 5)])
    feed = {X: x, W: w, dX: dx, dW: dw}
    want = _fd(outs, {X: x, W: w}, [X, W], [dx, dw])
    for y, t, ref in zip(outs, tans, want):
        np.testing.assert_allclose(te.evaluate(t, feed), ref, rtol=1e-6, atol=1e-7,
                                   err_msg=y.name)
    # the compiled kernel agrees (one kernel, every tangent)
    kernel = codegen.build(tans, [X, W, dX, dW])
    for t, got in zip(tans, kernel(x, w, dx, dw)):
        np.testing.assert_allclose(got, te.evaluate(t, feed), rtol=1e-10, atol=1e-12)


def test_jvp_of_a_gather_and_along_one_input_only():
    X = te.placeholder((6, 3), name="Xg", dtype="float64")
    idx = te.placeholder((4,), name="idx", dtype="int64")
    B = te.placeholder((3,), name="B", dtype="float64")
    G = te.compute((4, 3), lambda i, j: te.exp(X[idx[i], j]) + B[j], name="G")
    dX = te.placeholder((6, 3), name="dXg", dtype="float64")
    tG = te.jvp(G, [X], [dX])  # a single Tensor in, a single Tensor out
    assert tG.shape == G.shape
    rng = np.random.default_rng(1)
    x, dx, b = rng.standard_normal((6, 3)), rng.standard_normal((6, 3)), rng.standard_normal(3)
    ix = np.array([5, 0, 0, 2])
    feed = {X: x, idx: ix, B: b}
    ref, = _fd([G], feed, [X], [dx])
    np.testing.assert_allclose(te.evaluate(tG, {**feed, dX: dx}), ref, rtol=1e-6, atol=1e-7)
    # an output not depending on the inputs has a zero tangent
    tB = te.jvp([B], [X], [dX])[0]
    np.testing.assert_array_equal(te.evaluate(tB, {B: b}), np.zeros(3))


def test_hessian_vector_product_forward_over_reverse():
    W = te.placeholder((3, 4), name="W", dtype="float64")
    X = te.placeholder((5, 4), name="X", dtype="float64")
    k = te.reduce_axis(4, "k")
    Z = te.compute((5, 3), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Z")
    a, b = te.reduce_axis(5, "a"), te.reduce_axis(3, "b")
    L = te.compute((), lambda: te.sum(te.log(1.0 + Z[a, b] * Z[a, b]), axis=[a, b]), name="L")
    gW, = te.differentiate(L, [W])
    V = te.placeholder((3, 4), name="V", dtype="float64")
    hv = te.jvp(gW, [W], [V])
    rng = np.random.default_rng(2)
    x, w, v = rng.standard_normal((5, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    ref, = _fd([gW], {X: x, W: w}, [W], [v])
    got = codegen.build(hv, [X, W, V])(x, w, v)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    # H is symmetric: u.(H v) == v.(H u)
    u = rng.standard_normal((3, 4))
    hu = te.evaluate(hv, {X: x, W: w, V: u})
    assert np.isclose((u * got).sum(), (v * hu).sum(), rtol=1e-9)


def test_jvp_errors():
    X, W, outs = _graph()
    with pytest.raises(te.ShapeError, match="tangent"):
        te.jvp(outs[0], [X], [te.placeholder((5, 4), "bad", "float64")])
    with pytest.raises(te.TexprError, match="2 inputs"):
        te.jvp(outs[0], [X, W], [te.placeholder((4, 5), "dx", "float64")])
    I = te.placeholder((3,), name="I", dtype="int64")
    with pytest.raises(te.NotDifferentiableError, match="I"):
        te.jvp(outs[0], [I], [te.placeholder((3,), "dI", "float64")])
