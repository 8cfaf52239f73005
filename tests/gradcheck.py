"""Shared helpers of the differentiation tests: weighted-sum losses and checks of
``te.differentiate`` against float64 central finite differences (texpr.testing)."""

import numpy as np

import texpr as te
from texpr.testing import numeric_gradient, numeric_jacobian


def weighted_sum(y, name="L"):
    """``L = sum(C * Y)`` with ``C`` a new float64 placeholder of ``y``'s shape; returns (L, C)."""
    c = te.placeholder(y.shape, f"C_{y.name}", "float64")
    if y.shape == ():
        return te.compute((), lambda: c[()] * y[()], name=name), c
    axes = [te.reduce_axis(n, f"s{d}") for d, n in enumerate(y.shape)]
    return te.compute((), lambda: te.sum(c[tuple(axes)] * y[tuple(axes)], axis=axes), name=name), c


def square_sum(y, name="L"):
    """``L = sum(Y * Y)``."""
    if y.shape == ():
        return te.compute((), lambda: y[()] * y[()], name=name)
    axes = [te.reduce_axis(n, f"s{d}") for d, n in enumerate(y.shape)]
    return te.compute((), lambda: te.sum(y[tuple(axes)] * y[tuple(axes)], axis=axes), name=name)


def feed_for(tensors, seed=0, low=-1.0, high=1.0):
    rng = np.random.default_rng(seed)
    return {t: rng.uniform(low, high, t.shape).astype("float64") for t in tensors}


def check_gradients(loss, inputs, feed, rtol=1e-6, atol=1e-8, simplify=False, eps=1e-6):
    """Assert that the adjoints of a scalar ``loss`` match finite differences; returns them."""
    res = te.differentiate(loss, inputs, simplify=simplify)
    got = te.evaluate(list(res.result), feed)
    for g, x in zip(got, inputs):
        fd = numeric_gradient(loss, x, feed, eps=eps)
        assert g.shape == x.shape
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol, err_msg=f"d{loss.name}/d{x.name}")
    return got


def check_jacobian(y, x, feed, rtol=1e-6, atol=1e-8):
    """Assert that the full Jacobian (``head=None``) matches finite differences."""
    (jac,) = te.differentiate(y, [x], simplify=False)
    got = te.evaluate(jac, feed)
    fd = numeric_jacobian(y, x, feed)
    assert got.shape == y.shape + x.shape
    np.testing.assert_allclose(got, fd, rtol=rtol, atol=atol)
    return got
