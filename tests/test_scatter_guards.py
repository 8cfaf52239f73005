"""A sum turned into a scatter-add (simplify.scatter) keeps the guards of its loads.

The scatter replaces an output index fixed by a data-dependent equality
(``j == I[f(r)]``) with the load itself. Conditions that tied that index to the
reduction axes (``j >= 1 && r == 3 || j == 0 && r == 0``) then mention the load,
so they no longer guard it: the long run on 509b385 (seed 7016100758) read an
argmin at index 2 of its 2 in a valid gradient. The scatter's where now starts
with those conditions with the fixed index eliminated (``r == 3 || r == 0``).
"""

import numpy as np

import texpr as te
from texpr import codegen, simplify

F = "float64"


def _tied_sum():
    i = te.placeholder((1,), "I", "int64")
    v = te.placeholder((4,), "V", F)
    r = te.reduce_axis(4, "r")
    s = te.compute((4,), lambda j: te.sum(v[r], axis=r, where=te.all(
        te.any(te.all(j >= 1, r == 3), te.all(j == 0, r == 0)), j == i[r % 3])), name="S")
    return i, v, s


def test_a_scatter_tests_the_reduction_axes_before_the_load_they_guard():
    i, v, s = _tied_sum()
    (s2,) = simplify.simplify([s])
    assert type(s2.op).__name__ == "ScatterAddOp"
    for iv, want in ((2, [0, 0, 4, 0]), (0, [1, 0, 0, 0]), (7, [0, 0, 0, 0])):
        feed = {i: np.array([iv]), v: np.array([1.0, 2.0, 3.0, 4.0])}
        np.testing.assert_array_equal(te.evaluate(s, feed), want)
        np.testing.assert_array_equal(te.evaluate(s2, feed), want)


def test_a_scatter_with_a_free_output_axis_keeps_the_guard_per_axis():
    # two output axes, one fixed by the data, one free: the guard mentions the free
    # axis and the reduction axis (r == 2a + 1 where the fixed index is positive)
    i = te.placeholder((2,), "I", "int64")
    v = te.placeholder((3, 4), "V", F)
    r = te.reduce_axis(4, "r")
    s = te.compute((3, 4), lambda a, j: te.sum(v[a, r], axis=r, where=te.all(
        te.any(te.all(j >= 1, r == 2 * a + 1), te.all(j == 0, r == 0)), j == i[r % 3])), name="S")
    (s2,) = simplify.simplify([s])
    assert type(s2.op).__name__ == "ScatterAddOp"
    vv = np.arange(12.0).reshape(3, 4) + 1
    for iv in ([3, 1], [0, 2], [1, 0]):
        feed = {i: np.array(iv), v: vv}
        want = te.evaluate(s, feed)
        np.testing.assert_array_equal(te.evaluate(s2, feed), want)
    kernel = codegen.build([s2], [i, v])
    for iv in ([3, 1], [0, 2], [1, 0]):
        feed = {i: np.array(iv), v: vv}
        np.testing.assert_array_equal(kernel(np.array(iv), vv)[0], te.evaluate(s, feed))


def test_the_guards_of_a_nested_gather_come_before_its_range_test():
    # attack helper-20 (the same on 509b385): dW[k] = sum_i C[i] where J[i] is in
    # range and k == I[J[i]]; the scatter tested I[J[r]] >= 0 before J[r] < 4
    F_ = F
    j = te.placeholder((4,), "J", "int64")
    i = te.placeholder((4,), "I", "int64")
    w = te.placeholder((3,), "W", F_)
    c = te.placeholder((4,), "C", F_)
    k = te.reduce_axis(3, "k")
    y = te.compute((4,), lambda n: te.sum(w[k], axis=k, where=te.all(
        j[n] >= 0, j[n] < 4, k == i[j[n]])), name="Y")
    r = te.reduce_axis(4, "r")
    loss = te.compute((), lambda: te.sum(c[r] * y[r], axis=r), name="L")
    feed = {j: np.array([1, 9, -1, 3]), i: np.array([1, 2, 0, 2]),
            w: np.array([1.0, 2.0, 3.0]), c: np.array([1.0, 2.0, 3.0, 4.0])}
    raw = te.evaluate(list(te.differentiate(loss, [w], simplify=False)), feed)
    np.testing.assert_array_equal(raw[0], [0, 0, 5])
    (g,) = te.differentiate(loss, [w])
    np.testing.assert_array_equal(te.evaluate(g, feed), raw[0])
    kernel = codegen.build([loss, g], [j, i, w, c])
    got = kernel(*(feed[t] for t in (j, i, w, c)))
    np.testing.assert_array_equal(got[1], raw[0])


def test_a_data_guard_of_the_index_load_comes_before_its_range_test():
    # attack helper-20: a segment sum whose index load A[r] is guarded by
    # r < 2 || V[r] > 5 (A has 2 entries, r runs to 4)
    a = te.placeholder((2,), "A", "int64")
    v = te.placeholder((4,), "V", F)
    r = te.reduce_axis(4, "r")
    s = te.compute((3,), lambda j: te.sum(v[r] * v[r], axis=r, where=te.all(
        te.any(r < 2, v[r] > 5.0), j == a[r])), name="S")
    (s2,) = simplify.simplify([s])
    assert type(s2.op).__name__ == "ScatterAddOp"
    for av, vv in (([0, 2], [1.0, 2.0, 3.0, 4.0]), ([2, 2], [3.0, -1.0, 0.5, 5.0])):
        feed = {a: np.array(av), v: np.array(vv)}
        want = te.evaluate(s, feed)
        np.testing.assert_array_equal(te.evaluate(s2, feed), want)


def test_a_guard_mentioning_the_fixed_axis_waits_for_the_range_test():
    # attack helper-22 (new in 49cbe82): k < 3 && M[k] > 0 && k == int(X[n]); with k
    # fixed by the cast, M[k] reads through the index: after its range test
    x = te.placeholder((4,), "X", F)
    m = te.placeholder((3,), "M", F)
    w = te.placeholder((5,), "W", F)
    c = te.placeholder((4,), "C", F)
    k = te.reduce_axis(5, "k")
    y = te.compute((4,), lambda n: te.sum(w[k], axis=k, where=te.all(
        k < 3, m[k] > 0.0, k == te.cast(x[n], "int64"))), name="Y")
    r = te.reduce_axis(4, "r")
    loss = te.compute((), lambda: te.sum(c[r] * y[r] * y[r], axis=r), name="L")
    feed = {x: np.array([0.5, 4.2, 2.0, 1.0]), m: np.array([1.0, -1.0, 2.0]),
            w: np.arange(1.0, 6.0), c: np.array([1.0, 2.0, 3.0, 4.0])}
    raw = te.evaluate(list(te.differentiate(loss, [w], simplify=False)), feed)
    np.testing.assert_array_equal(raw[0], [2, 0, 18, 0, 0])
    np.testing.assert_array_equal(te.evaluate(list(te.differentiate(loss, [w])), feed)[0], raw[0])


def test_guards_of_two_fixed_indices_and_of_a_disjunction_come_first():
    # attack helper-22 (the same on 509b385): I[r] < 3 guards J[I[r]], and
    # (n < 2 && A[n] >= 0) || n >= 5 guards A[n]; both were tested after the ranges
    i = te.placeholder((4,), "I", "int64")
    jj = te.placeholder((3,), "J", "int64")
    v = te.placeholder((4,), "V", F)
    r = te.reduce_axis(4, "r")
    s = te.compute((2, 5), lambda j2, j1: te.sum(v[r], axis=r, where=te.all(
        i[r] >= 0, i[r] < 3, j1 == i[r], j2 == jj[i[r]])), name="S")
    (s2,) = simplify.simplify([s])
    feed = {i: np.array([0, 4, 2, -1]), jj: np.array([1, 0, 1]), v: np.array([1.0, 2.0, 3.0, 4.0])}
    np.testing.assert_array_equal(te.evaluate(s2, feed), [[0, 0, 0, 0, 0], [1, 0, 3, 0, 0]])
    a = te.placeholder((2,), "A", "int64")
    w = te.placeholder((3,), "W", F)
    c = te.placeholder((4,), "C", F)
    k = te.reduce_axis(3, "k")
    y = te.compute((4,), lambda n: te.sum(w[k], axis=k, where=te.all(
        te.any(te.all(n < 2, a[n] >= 0), n >= 5), k == a[n])), name="Y")
    r2 = te.reduce_axis(4, "r2")
    loss = te.compute((), lambda: te.sum(c[r2] * y[r2] * y[r2], axis=r2), name="L")
    feed = {a: np.array([0, 2]), w: np.array([1.0, 2.0, 3.0]), c: np.array([1.0, 2.0, 3.0, 4.0])}
    (g,) = te.differentiate(loss, [w])
    np.testing.assert_array_equal(te.evaluate(g, feed), [2, 0, 12])
    kernel = codegen.build([g], [a, w, c])
    np.testing.assert_array_equal(kernel(feed[a], feed[w], feed[c])[0], [2, 0, 12])
