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
    kernel = codegen.build(list(simp), [X, H], parallel=False)  # the gradient alone
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
    got = codegen.build([dX], [X, H], parallel=False)(x, h)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(te.evaluate(dX, {X: x, H: h}), want, rtol=1e-12, atol=1e-12)
    # the adjoint visits one point per output element, not |X| * |Y|
    assert simplify.iteration_count([dX]) <= n_out + 8
