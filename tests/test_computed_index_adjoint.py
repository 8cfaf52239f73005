"""The adjoint of a load whose index is known only where it is evaluated -- read
from data (``X[I[k]]``), computed through floating point
(``X[int64(floor(i * s))]``) or not quasi-affine (``X[i * i]``) -- is a
scatter-add with a checked index, never the indicator form
``select(index == j, ...)``, which silently dropped the terms of an index
outside ``X`` while the forward raised OutOfBoundsError for it.

Found by a new-user trial: ``Y[i] = X[int64(floor(i * 0.6))]`` for i < 16 with
X of 8 reads X[8] and X[9]; the forward raised, and the raw gradient, the
simplified one and the gradient-only kernel all returned [2, 2, 1, 2, 2, 1, 2, 2]."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify


def _resize(index, n_in=8, n_out=16, dtype="float64"):
    X = te.placeholder((n_in,), "X", dtype)
    H = te.placeholder((n_out,), "H", dtype)
    r = te.reduce_axis(n_out, "r")
    Y = te.compute((n_out,), lambda i: X[index(i)] * 3.0, name="Y")
    L = te.compute((), lambda: te.sum(Y[r] * H[r], axis=r), name="L")
    return X, H, L


FLOOR = lambda s: (lambda i: te.cast(te.floor(i * s), "int64"))  # noqa: E731
SQUARE = lambda i: i * i  # noqa: E731


@pytest.mark.parametrize("index,n_out", [(FLOOR(0.6), 16), (SQUARE, 4),
                                         (lambda i: (i * i) // 2 + te.cast(i * 0.0, "int64"), 5)])
def test_an_out_of_range_computed_index_raises_on_every_gradient_path(index, n_out):
    X, H, L = _resize(index, n_out=n_out)
    feed = {X: np.ones(8), H: np.ones(n_out)}
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate(L, feed)
    raw = te.differentiate(L, [X], simplify=False).result
    simp = te.differentiate(L, [X]).result
    for grads in (raw, simp):
        with pytest.raises(te.OutOfBoundsError):
            te.evaluate(list(grads), feed)
    kernel = codegen.build(list(simp), [X, H], parallel=False, blas=False)  # the gradient alone
    with pytest.raises(te.OutOfBoundsError):
        kernel(feed[X], feed[H])


@pytest.mark.parametrize("index,n_out", [(FLOOR(0.5), 16), (FLOOR(1.5), 5), (SQUARE, 3)])
def test_an_in_range_computed_index_has_the_exact_gradient_at_one_point_per_output(index, n_out):
    X, H, L = _resize(index, n_out=n_out)
    x = np.random.default_rng(1).standard_normal(8)
    h = np.random.default_rng(2).standard_normal(n_out)
    dX, = te.differentiate(L, [X]).result
    want = np.zeros(8)  # numpy's own adjoint of the gather
    idx = np.array([int(te.evaluate(te.compute((), lambda: index(te.const(i, "int64")),
                                                name="ix"), {})) for i in range(n_out)])
    np.add.at(want, idx, 3.0 * h)
    got = codegen.build([dX], [X, H], parallel=False, blas=False)(x, h)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(te.evaluate(dX, {X: x, H: h}), want, rtol=1e-12, atol=1e-12)
    # the adjoint visits one point per output element, not |X| * |Y|
    assert simplify.iteration_count([dX]) <= n_out + 8


def _constant_along_the_read_axis(kind):
    # C does not depend on its axis (an empty min: +inf; X[0] * 2 + X[1]; a sum
    # over all of X);
    # Y reads it at a computed index that leaves C at j = 0
    X = te.placeholder((4,), "X", "float64")
    k = te.reduce_axis(4, "k")
    if kind == "empty_min":
        C = te.compute((3,), lambda i: te.min(X[k], axis=k, where=k + i < 0), name="C")
    elif kind == "elementwise":
        C = te.compute((3,), lambda i: X[0] * 2.0 + X[1], name="C")
    else:
        C = te.compute((3,), lambda i: te.sum(X[k], axis=k), name="C")
    index = ((lambda j: te.cast(te.floor(j * 0.6 - 1.0), "int64")) if kind == "empty_min"
             else (lambda j: j * j - 1))
    Y = te.compute((4,), lambda j: te.tanh(C[index(j)]) * 2.0, name="Y")
    r = te.reduce_axis(4, "r")
    L = te.compute((), lambda: te.sum(Y[r], axis=r), name="L")
    return X, Y, L


@pytest.mark.parametrize("kind", ["empty_min", "elementwise", "sum"])
def test_a_stage_constant_along_an_axis_read_at_an_out_of_range_computed_index_raises(kind):
    # the long run on 0e829d7 (seed 7005700007): an empty min (+inf everywhere)
    # read at int64(floor(k * 0.6 - 1)); simplify inlined the constant at the
    # load, its bounds check went with it, and every compiled path returned
    # values where te.evaluate raised
    X, Y, L = _constant_along_the_read_axis(kind)
    x = np.array([0.5, -1.0, 2.0, 0.25])
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate([Y, L], {X: x})
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate(list(simplify.simplify([Y, L])), {X: x})
    with pytest.raises(te.OutOfBoundsError):
        codegen.build([Y, L], [X], parallel=False, blas=False)(x)
    if kind != "empty_min":
        # the gradient alone reads C through the same index (an empty min's
        # gradient is structurally zero: simplified, it reads nothing)
        (dX,) = te.differentiate(L, [X]).result
        with pytest.raises(te.OutOfBoundsError):
            codegen.build([dX], [X], parallel=False, blas=False)(x)
