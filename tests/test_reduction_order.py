"""A user's tuple reducer keeps the first of tied points in row-major order of
its reduction axes (docs/conventions.md): the kernels visit the points in that
order whatever loop order, residue split or unrolling they use elsewhere.

The combine below keeps the accumulator at a tie, so a kernel that visits a
later tied point first returns that point's index: every case here failed
(silently) before the reduction loops of such reducers kept their order.
The fuzzer's case: tests/test_fuzz.py::test_fuzz_tie_order_of_a_residue_class_reduction."""

import numpy as np

import texpr as te
from texpr import codegen

KEEP_FIRST = te.comm_reducer(
    lambda x, y: (te.if_then_else(x[0] >= y[0], x[0], y[0]),
                  te.if_then_else(x[0] >= y[0], x[1], y[1])),
    lambda vd, idd: (te.const(-np.inf, vd), te.const(-1, idd)), name="keep_first")


def _check(outs, inputs, feed):
    want = te.evaluate(list(outs), feed)
    got = codegen.build(list(outs), inputs)(*[feed[t] for t in inputs])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    return want


def test_a_residue_class_split_keeps_the_row_major_tie():
    # where=(5 - k) % 3 <= 1 keeps two of three residue classes (k % 3 = 1, 2):
    # split, class k = 1, 4 would run before class k = 2, 5 (the first tie is 2)
    X = te.placeholder((6,), "X", "float64")
    k = te.reduce_axis(6, "k")
    V, I = te.compute((3,), lambda i: KEEP_FIRST((X[k] + i, k), axis=k,
                                                 where=(5 - k) % 3 <= 1), name="A")
    _, idx = _check([V, I], [X], {X: np.array([0.0, 1.0, 5.0, 0.0, 5.0, 0.0])})
    assert list(idx) == [2, 2, 2]


def test_reduction_axes_keep_their_declared_nesting():
    # X[k1, k0]: the contiguous axis k0 would be the inner loop; row-major order
    # of axis=[k0, k1] visits (k0=0, k1=1) before the tied (k0=1, k1=0)
    X = te.placeholder((2, 2), "X", "float64")
    k0, k1 = te.reduce_axis(2, "k0"), te.reduce_axis(2, "k1")
    V, I = te.compute((), lambda: KEEP_FIRST((X[k1, k0], k0 * 10 + k1), axis=[k0, k1]),
                      name="A")
    _, idx = _check([V, I], [X], {X: np.array([[0.0, 5.0], [5.0, 1.0]])})
    assert int(idx) == 1


def test_a_long_reduction_inside_the_spatial_loops_keeps_its_order():
    # X[k, j] with j contiguous: the reduction loop runs inside the spatial ones,
    # and a long one would be unrolled in groups of 16 where a whole group is in
    # the domain (k >= j: the groups above j), the partial group after them
    X = te.placeholder((32, 32), "X", "float64")
    k = te.reduce_axis(32, "k")
    V, I = te.compute((64, 32), lambda i, j: KEEP_FIRST(
        (X[k, j] + i, k), axis=k, where=k >= j), name="A")
    _, idx = _check([V, I], [X], {X: np.zeros((32, 32))})
    assert (idx == np.arange(32)[None, :]).all()

