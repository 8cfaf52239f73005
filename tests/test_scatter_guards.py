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
