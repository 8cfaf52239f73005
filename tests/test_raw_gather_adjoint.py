"""The raw (``simplify=False``) adjoint of a data-dependent gather ``X[I[k]]`` is a
scatter-add (issue 10, kind 5): an index outside ``X`` raises OutOfBoundsError
on every path -- the forward, the raw and the simplified gradient, te.evaluate
and the kernel -- instead of the indicator sum dropping its term; an index
guarded by a select is only read where the forward reads it."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.errors import OutOfBoundsError

from gradcheck import check_gradients


def _gather_program(guarded=False, reduce=False):
    X = te.placeholder((5,), name="X", dtype="float64")
    I = te.placeholder((4,), name="I", dtype="int64")
    if reduce:
        k = te.reduce_axis(4, "k")
        Y = te.compute((2,), lambda i: te.sum(X[I[k]] * (i + 1.0), axis=k), name="Y")
    elif guarded:
        Y = te.compute((4,), lambda i: te.if_then_else(
            te.all(I[i] >= 0, I[i] < 5), X[I[i]] * X[I[i]], 0.0), name="Y")
    else:
        Y = te.compute((4,), lambda i: X[I[i]] * X[I[i]], name="Y")
    k2 = te.reduce_axis(Y.shape[0], "k2")
    L = te.compute((), lambda: te.sum(Y[k2] * (k2 + 1.0), axis=k2), name="L")
    return X, I, L


X_VAL = np.array([0.5, -1.0, 2.0, 0.25, 3.0])


@pytest.mark.parametrize("simplify", [False, True])
@pytest.mark.parametrize("reduce", [False, True])
def test_out_of_range_gather_index_raises_in_every_gradient(simplify, reduce):
    X, I, L = _gather_program(reduce=reduce)
    (dX,) = te.differentiate(L, [X], simplify=simplify)
    bad = np.array([0, 5, 2, 2])
    with pytest.raises(OutOfBoundsError):
        te.evaluate(L, {X: X_VAL, I: bad})
    with pytest.raises(OutOfBoundsError):
        te.evaluate(dX, {X: X_VAL, I: bad})
    neg = np.array([0, -1, 2, 2])  # negative: no numpy wrap-around either
    with pytest.raises(OutOfBoundsError):
        te.evaluate(dX, {X: X_VAL, I: neg})
    good = np.array([0, 4, 2, 2])
    check_gradients(L, [X], {X: X_VAL, I: good}, simplify=simplify)


def test_raw_gather_adjoint_kernel_raises_and_matches():
    X, I, L = _gather_program()
    (dX,) = te.differentiate(L, [X], simplify=False)
    k = codegen.build([L, dX], [X, I])
    good = np.array([1, 4, 1, 0])
    got = k(X_VAL, good)
    want = [te.evaluate(t, {X: X_VAL, I: good}) for t in (L, dX)]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    # duplicates accumulate: X[1] is read twice, X[4] once, X[0] once
    w = np.array([1.0, 2.0, 3.0, 4.0])
    expect = np.zeros(5)
    np.add.at(expect, good, w * 2 * X_VAL[good])
    np.testing.assert_allclose(got[1], expect, rtol=1e-12)
    with pytest.raises(OutOfBoundsError):
        k(X_VAL, np.array([1, 7, 1, 0]))


@pytest.mark.parametrize("simplify", [False, True])
def test_select_guarded_gather_reads_only_where_the_forward_does(simplify):
    X, I, L = _gather_program(guarded=True)
    (dX,) = te.differentiate(L, [X], simplify=simplify)
    idx = np.array([3, -1, 9, 3])  # two indices out of range, guarded away
    feed = {X: X_VAL, I: idx}
    want = np.zeros(5)
    want[3] = (1.0 + 4.0) * 2 * X_VAL[3]
    np.testing.assert_allclose(te.evaluate(dX, feed), want, rtol=1e-12)
    check_gradients(L, [X], feed, simplify=simplify)


def test_raw_gradient_of_a_scatter_value_gather_raises():
    # the value of a user scatter-add gathers X through J: its raw adjoint too
    X = te.placeholder((5,), name="X", dtype="float64")
    I = te.placeholder((3,), name="I", dtype="int64")
    J = te.placeholder((3,), name="J", dtype="int64")
    S = te.scatter_add((4,), "float64", (3,), lambda p: I[p], lambda p: X[J[p]] * 2.0, name="S")
    k = te.reduce_axis(4, "k")
    L = te.compute((), lambda: te.sum(S[k] * S[k], axis=k), name="L")
    (dX,) = te.differentiate(L, [X], simplify=False)
    feed = {X: X_VAL, I: np.array([0, 3, 0]), J: np.array([4, 1, 4])}
    check_gradients(L, [X], feed)
    with pytest.raises(OutOfBoundsError):
        te.evaluate(dX, {X: X_VAL, I: np.array([0, 3, 0]), J: np.array([4, 5, 4])})


def test_second_order_through_a_raw_gather():
    X, I, L = _gather_program()
    (dX,) = te.differentiate(L, [X], simplify=False)
    k = te.reduce_axis(5, "k")
    G = te.compute((), lambda: te.sum(dX[k] * dX[k], axis=k), name="G")
    good = np.array([1, 4, 1, 0])
    check_gradients(G, [X], {X: X_VAL, I: good})
    (ddX,) = te.differentiate(G, [X], simplify=False)
    with pytest.raises(OutOfBoundsError):
        te.evaluate(ddX, {X: X_VAL, I: np.array([1, 4, 8, 0])})


def _inlined_gather(kind):
    """``Y[k] = P[I[k]] * X[k]`` with an elementwise stage ``P`` the simplifier
    inlines elsewhere: ``const`` -- a sum over an empty domain (the identity,
    0, once simplified: its body reads nothing); ``no_axis`` -- ``P[i] = X[0]
    * 2`` (does not read ``i``); ``longer`` -- ``P[i<2] = X[i] * 2`` with ``X``
    of 5 (inlined, ``I[k]`` would be checked against 5, not 2)."""
    X = te.placeholder((5,), name="X", dtype="float64")
    I = te.placeholder((3,), name="I", dtype="int64")
    if kind == "const":
        r = te.reduce_axis(2, "r")
        P = te.compute((2,), lambda i: te.sum(X[r + i], axis=r, where=r * 2 + i < 0), name="P")
    elif kind == "no_axis":
        P = te.compute((2,), lambda i: X[0] * 2.0, name="P")
    else:
        P = te.compute((2,), lambda i: X[i] * 2.0, name="P")
    Y = te.compute((3,), lambda k: P[I[k]] * X[k], name="Y")
    k2 = te.reduce_axis(3, "k2")
    L = te.compute((), lambda: te.sum(Y[k2] * (k2 + 1.0), axis=k2), name="L")
    return X, I, L


@pytest.mark.parametrize("kind", ["const", "no_axis", "longer"])
def test_inlining_never_drops_a_data_index_check(kind):
    """A stage read at a data-dependent index is inlined only where the inlined
    body still checks that index against the same extent (fuzz seed
    7000003194: a constant stage read at an out-of-range index gave values
    after simplification, an OutOfBoundsError before)."""
    X, I, L = _inlined_gather(kind)
    (dX,) = te.differentiate(L, [X]).result
    x = np.linspace(-1.0, 1.0, 5)
    bad = {X: x, I: np.array([0, 3, 1])}
    with pytest.raises(OutOfBoundsError):
        te.evaluate(L, bad)
    with pytest.raises(OutOfBoundsError):
        te.evaluate(dX, bad)
    kernel = codegen.build([L, dX], [X, I])
    with pytest.raises(OutOfBoundsError):
        kernel(x, bad[I])
    good = {X: x, I: np.array([0, 1, 1])}
    want = te.evaluate([L, dX], good)
    for got, ref in zip(kernel(x, good[I]), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    check_gradients(L, [X], good)
