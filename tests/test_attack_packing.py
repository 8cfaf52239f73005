"""Packed operands (codegen/rewrite/operands.py) under attack: reproducers of faults found
in the rewrite that packs a contraction's computed operand into a stage of its own."""

import numpy as np

import texpr as te
from texpr import codegen, simplify
from texpr.codegen.analysis import contraction

from fuzz import every_contraction_on_blas as blas_at_any_size  # the cost rule off

nn = te.nn


def _relu_plus(h, b, name):
    return te.compute(h.shape, lambda n, c, i, j: te.select(
        h[n, c, i, j] + b[c] > 0, h[n, c, i, j] + b[c], 0.0), name=name)


def test_packed_operands_of_equally_named_tensors_are_not_shared():
    # relu(conv0 + b) and relu(conv0 + b'), two biases both named "b": their packed
    # stages print the same, but they read different tensors
    X = te.placeholder((1, 2, 4, 4), "X", "float64")
    W0 = te.placeholder((3, 2, 3, 3), "W0", "float64")
    b1 = te.placeholder((3,), "b", "float64")
    b2 = te.placeholder((3,), "b", "float64")
    W1 = te.placeholder((2, 3, 3, 3), "W1", "float64")
    h = nn.conv2d(X, W0, padding=1, name="conv0")
    y1 = nn.conv2d(_relu_plus(h, b1, "r1"), W1, padding=1, name="y1")
    y2 = nn.conv2d(_relu_plus(h, b2, "r2"), W1, padding=1, name="y2")
    ins = [X, W0, b1, b2, W1]
    with blas_at_any_size():
        kernel = codegen.build([y1, y2], ins)
    rng = np.random.default_rng(0)
    feed = {t: rng.standard_normal(t.shape) for t in ins}
    feed[b2] = feed[b1] + 3.0
    got = kernel(*[feed[t] for t in ins])
    for g, w in zip(got, te.evaluate(simplify.simplify([y1, y2]), feed)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


def test_a_packed_group_of_several_factors_keeps_the_products_association():
    # X * W * X is (X * W) * X: packing X's group as X * X and then multiplying by
    # W reassociates the product; in float32 1e20 * 1e20 overflows where
    # (1e20 * 0) * 1e20 is 0 (the loop nest's value): the kernel gave NaN (and inf
    # for W = 1e-30, where the loop nest gives 3e10)
    X = te.placeholder((2, 3), "X", "float32")
    W = te.placeholder((3, 2), "W", "float32")
    k = te.reduce_axis(3, "k")
    Y = te.compute((2, 2), lambda i, j: te.sum(X[i, k] * W[k, j] * X[i, k], axis=k,
                                               where=X[i, k] > 0), name="Y")
    with blas_at_any_size():
        kernel = codegen.build([Y], [X, W])
    x = np.full((2, 3), 1e20, "float32")
    simp = simplify.simplify([Y])
    for wv in (0.0, 1e-30):
        w = np.full((3, 2), wv, "float32")
        (got,) = kernel(x, w)
        (want,) = te.evaluate(simp, {X: x, W: w})
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        np.testing.assert_allclose(got, want, rtol=1e-5)
