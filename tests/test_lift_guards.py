"""lift_conditions moves a condition common to every term of a summand into the
sum's where= only if the summand evaluated it everywhere, when it loads at a
data-dependent index: inside the branches of a select, such a load is reached
only where a branch's own conditions hold (attack helper-20, the same on
509b385: k == I[int(X[j])] in both branches of X[j] > 2, read at X = 7)."""

import numpy as np

import texpr as te
from texpr.testing import numeric_gradient

F = "float64"


def _check(loss, wrt, feed):
    raw = te.evaluate(list(te.differentiate(loss, wrt, simplify=False)), feed)
    got = te.evaluate(list(te.differentiate(loss, wrt)), feed)
    for a, b, x in zip(raw, got, wrt):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a, numeric_gradient(loss, x, feed), rtol=1e-6, atol=1e-8)
    return got


def test_a_one_hot_gather_through_a_float_index_inside_two_guarded_branches():
    x = te.placeholder((4,), "X", F)
    i = te.placeholder((4,), "I", "int64")
    w = te.placeholder((4,), "W", F)
    k = te.reduce_axis(4, "k")

    def body(n):
        v = x[n]
        g = te.if_then_else(i[te.cast(v, "int64")] == k, w[k], 0.0)
        return te.if_then_else(v > 2.0, te.if_then_else(v < 4.0, g * 2.0, 0.0),
                               te.if_then_else(v >= 0.0, g * 3.0, 0.0))

    y = te.compute((4,), lambda n: te.sum(body(n), axis=k), name="Y")
    r = te.reduce_axis(4, "r")
    loss = te.compute((), lambda: te.sum(y[r] * y[r], axis=r), name="L")
    feed = {x: np.array([0.5, 3.5, 7.0, -3.0]), i: np.array([1, 2, 0, 3]),
            w: np.array([1.0, 2.0, 3.0, 4.0])}
    (g,) = _check(loss, [w], feed)
    np.testing.assert_array_equal(g, [0, 36, 0, 32])


def test_a_gather_index_in_range_only_where_a_value_guard_holds():
    # I[n] is a valid row only where M[n] > 0; both branches read X[I[n]]
    x = te.placeholder((3, 2), "X", F)
    i = te.placeholder((4,), "I", "int64")
    m = te.placeholder((4,), "M", F)
    k = te.reduce_axis(2, "k")

    def body(n):
        g = x[i[n], k]
        return te.if_then_else(m[n] > 0.0, te.if_then_else(m[n] > 1.0, g * g, g * 0.5), 0.0)

    y = te.compute((4,), lambda n: te.sum(body(n), axis=k), name="Y")
    r = te.reduce_axis(4, "r")
    loss = te.compute((), lambda: te.sum(y[r] * m[r], axis=r), name="L")
    feed = {x: np.array([[1.0, -2.0], [0.5, 3.0], [2.0, 1.5]]),
            i: np.array([2, 17, 0, -4]), m: np.array([0.5, -1.0, 2.0, 0.0])}
    _check(loss, [x], feed)


def test_a_compacted_term_keeps_a_branch_only_gather_condition_inside():
    # simplify.terms._compact: terms told apart by value conditions become one term
    # whose conditions are those they share, except a condition loading at a data
    # index that the expression tests only inside its branches
    from texpr import expr as E
    from texpr.simplify.terms import guarded_terms

    x = te.placeholder((4,), "X", F)
    i = te.placeholder((4,), "I", "int64")
    w = te.placeholder((4,), "W", F)
    n, k = E.var("n"), E.var("k")
    v = x[n]
    g = te.if_then_else(i[te.cast(v, "int64")] == k, w[k], 0.0)
    body = te.if_then_else(v > 2.0, g * 2.0, te.if_then_else(v >= 0.0, g * 3.0, 0.0))
    terms = guarded_terms(body)
    assert len(terms) == 1
    assert not any("I[" in str(c) for c in terms[0][0]), terms[0][0]
    # an index condition the expression always tests is still a condition of the term
    h = te.if_then_else(k <= n, body, 0.0)
    (cs, _v), = guarded_terms(h)
    assert any(str(c) == str(k <= n) for c in cs)


def test_a_condition_inside_a_branch_lifts_after_the_branch_condition():
    # attack helper-22: select(j0 == j0, select(j0 == I[X[n]], ...)) -- the gather
    # equality is reached wherever the outer condition, lifted first, holds; it is
    # lifted and solved (a scatter, 64 points), not kept in a 6,400-point sum
    from texpr import simplify

    i = te.placeholder((64,), "I", "int64")
    x = te.placeholder((64,), "X", "int64")
    w = te.placeholder((100,), "W", F)
    k = te.reduce_axis(100, "k")
    e = te.compute((64,), lambda n: te.sum(te.if_then_else(k == i[x[n]], w[k], 0.0), axis=k),
                   name="E")
    r = te.reduce_axis(64, "r")
    loss = te.compute((), lambda: te.sum(e[r] * e[r], axis=r), name="L")
    assert simplify.iteration_count(list(te.differentiate(loss, [w]))) == 64


def test_a_load_at_an_affine_index_in_both_guarded_branches():
    # attack helper-22 (the same on 509b385): X[n + k - 1] > 0 in both branches, one
    # guarded by n + k - 1 >= 0, the other by n + k - 1 < 4: lifting it read X[-1]
    x = te.placeholder((4,), "X", F)
    m = te.placeholder((4,), "M", F)
    w = te.placeholder((4,), "W", F)
    k = te.reduce_axis(3, "k")

    def body(n):
        i = n + k - 1
        g = te.if_then_else(x[i] > 0.0, w[n] * x[i], 0.0)
        return te.if_then_else(m[n] > 0.0, te.if_then_else(i >= 0, g * 2.0, 0.0),
                               te.if_then_else(i < 4, g * 3.0, 0.0))

    y = te.compute((4,), lambda n: te.sum(body(n), axis=k), name="Y")
    r = te.reduce_axis(4, "r")
    loss = te.compute((), lambda: te.sum(y[r] * y[r], axis=r), name="L")
    feed = {x: np.array([0.5, 3.5, -7.0, 3.0]), m: np.array([1.0, -1.0, 2.0, -3.0]),
            w: np.array([1.0, 2.0, 3.0, 4.0])}
    (g,) = _check(loss, [w], feed)
    np.testing.assert_array_equal(g, [128, 576, 1014, 648])
