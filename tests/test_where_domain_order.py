"""A where's index conditions bound the iteration domain, whatever their written order.

A kernel's loop nest runs over the points where a where's index conditions
hold and tests its data conditions there only. te.evaluate tests the conjuncts
in the order they are written (``&&`` short-circuits), so a data condition
written before an index condition may refuse (a zero divisor, an integer wrap,
an out-of-range load) at a point the kernel never visits. The long run on
766b0da met it (seed 7019000666: a gradient scatter's ``data && r_ax0 < 0``
with ``r_ax0`` in [0, 1)). These tests pin the kernel's side and the fuzz
oracle that accepts it (``fuzz.index_conditions_first``): a refusal moved
behind the index conditions must vanish, and every value must be the same.
"""

import numpy as np
import pytest

import fuzz
import texpr as te
from texpr import codegen

F = "float64"


def _division_before_the_domain():
    n = te.placeholder((4,), "N", "int64")
    d = te.placeholder((4,), "D", "int64")
    x = te.placeholder((4,), "X", F)
    k = te.reduce_axis(4, "k")
    s = te.compute((3,), lambda i: te.sum(x[k] * (i + 1), axis=k, where=te.all(
        n[k] // d[k] > 0, k <= i)), name="S")
    return n, d, x, s


def test_a_division_written_before_the_domain_refuses_only_in_the_written_order():
    n, d, x, s = _division_before_the_domain()
    # D[3] == 0: k = 3 lies outside every i's domain (k <= i, i < 3)
    feed = {n: np.array([5, -4, 9, 1]), d: np.array([2, 2, 3, 0]),
            x: np.array([1.0, 10.0, 100.0, 1000.0])}
    with pytest.raises(te.TexprError, match="division by zero"):
        te.evaluate(s, feed)
    (want,) = te.evaluate(fuzz.index_conditions_first([s]), feed)
    # i = 0: k = 0 (5 // 2 > 0); i = 1: k = 0 only (-4 // 2 < 0); i = 2: k = 0, 2
    np.testing.assert_array_equal(want, [1.0, 2.0, 303.0])
    (got,) = codegen.build([s], [n, d, x])(feed[n], feed[d], feed[x])
    np.testing.assert_array_equal(got, want)


def test_its_gradient_kernel_agrees_with_the_reordered_evaluator():
    n, d, x, s = _division_before_the_domain()
    a = te.reduce_axis(3, "a")
    loss = te.compute((), lambda: te.sum(s[a], axis=a), name="L")
    (dx,) = te.differentiate(loss, [x])
    feed = {n: np.array([5, 4, 9, 1]), d: np.array([2, 2, 3, 0]),
            x: np.array([1.0, 10.0, 100.0, 1000.0])}
    with pytest.raises(te.TexprError, match="division by zero"):
        te.evaluate([loss, dx], feed)
    want = te.evaluate(fuzz.index_conditions_first([loss, dx]), feed)
    # dL/dX[k] = sum over i >= k of (i + 1) where N[k] // D[k] > 0: k = 0: 1+2+3,
    # k = 1: 2+3, k = 2: 3 (9 // 3 = 3 > 0)
    np.testing.assert_array_equal(want[1], [6.0, 5.0, 3.0, 0.0])
    got = codegen.build([loss, dx], [n, d, x])(feed[n], feed[d], feed[x])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_an_out_of_range_gather_written_before_the_domain():
    i_ = te.placeholder((4,), "I", "int64")
    x = te.placeholder((4,), "X", F)
    k = te.reduce_axis(4, "k")
    s = te.compute((2,), lambda j: te.sum(x[k], axis=k, where=te.all(
        x[i_[k]] > 0, k <= j)), name="S")
    # I[3] = 99 is out of range, at k = 3, outside every j's domain (k <= j < 2)
    feed = {i_: np.array([0, 2, 1, 99]), x: np.array([1.0, -2.0, 3.0, 4.0])}
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate(s, feed)
    (want,) = te.evaluate(fuzz.index_conditions_first([s]), feed)
    # j = 0: k = 0 (X[0] > 0); j = 1: k = 0 and k = 1 (X[2] > 0)
    np.testing.assert_array_equal(want, [1.0, -1.0])
    (got,) = codegen.build([s], [i_, x])(feed[i_], feed[x])
    np.testing.assert_array_equal(got, want)
    # an out-of-range index inside the domain is an error on every path
    feed[i_] = np.array([0, 99, 1, 2])
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate(fuzz.index_conditions_first([s]), feed)
    with pytest.raises(te.OutOfBoundsError):
        codegen.build([s], [i_, x])(feed[i_], feed[x])


def test_the_reordering_keeps_a_condition_that_may_raise_in_its_place():
    # a division by an axis may raise (k - 1 == 0): it stays behind the data
    # condition written before it, and only index conditions that cannot raise move
    x = te.placeholder((4,), "X", F)
    k = te.reduce_axis(4, "k")
    s = te.compute((2,), lambda j: te.sum(x[k], axis=k, where=te.all(
        x[k] > 0, 4 // (k - 1) > 0, k <= j + 2)), name="S")
    (s2,) = fuzz.index_conditions_first([s])
    where = s2.op.body[0].where
    text = te.printer.expr_str(where)
    assert text.index("k <= ") < text.index("X[k] > ") < text.index("4 // ")
