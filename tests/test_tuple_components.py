"""A tuple reduction's components read alone, out of order or nested in an
expression (``argmax(...)[0]``): the stage computes every component, the
kernel builds and agrees with te.evaluate, and the gradient with finite
differences. Before, te.evaluate ran such programs and codegen.build failed
with "variable `x1` is not bound" (found while turning fuzz seed 7005300018
into tests)."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.testing import numeric_gradient

ARGMAX = te.comm_reducer(
    lambda x, y: (te.if_then_else(x[0] >= y[0], x[0], y[0]),
                  te.if_then_else(x[0] >= y[0], x[1], y[1])),
    lambda vd, idd: (te.const(-np.inf, vd), te.const(-1, idd)), name="argmax")


def _programs():
    X = te.placeholder((4, 3), "X", "float64")

    def red(a):
        k = te.reduce_axis((0, 3), "k")
        return ARGMAX((te.tanh(X[a, k]) * 2.0, k), axis=k)

    value = te.compute((4,), lambda a: red(a)[0], name="value")
    index = te.compute((4,), lambda a: red(a)[1], name="index")
    nested = te.compute((4,), lambda a: red(a)[0] * 3.0 + 1.0, name="nested")
    swapped_i, swapped_v = te.compute((4,), lambda a: (lambda r: (r[1], r[0]))(red(a)),
                                      name="swapped")
    one = te.compute((4,), lambda a: (red(a)[0],), name="one")
    assert isinstance(one, tuple) and len(one) == 1
    s = te.reduce_axis((0, 4), "s")
    L = te.compute((), lambda: te.sum(value[s] * nested[s] + swapped_v[s] * one[0][s], axis=s),
                   name="L")
    return X, [value, index, nested, swapped_i, swapped_v, one[0], L]


def test_components_read_alone_out_of_order_or_nested_build_and_match():
    X, outs = _programs()
    x = np.random.default_rng(3).standard_normal((4, 3))
    want = te.evaluate(outs, {X: x})
    got = codegen.build(outs, [X])(x)
    for g, w, t in zip(got, want, outs):
        assert g.dtype == w.dtype, t.name
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=t.name)
    # the index component is the argmax, the value component the max
    np.testing.assert_array_equal(want[1], np.argmax(np.tanh(x), axis=1))
    np.testing.assert_allclose(want[0], np.tanh(x).max(axis=1) * 2.0)
    np.testing.assert_array_equal(want[3], want[1])
    np.testing.assert_allclose(want[4], want[0])


def test_the_gradient_through_a_component_read_alone_matches_finite_differences():
    X, outs = _programs()
    L = outs[-1]
    (dX,) = te.differentiate(L, [X])
    x = np.random.default_rng(4).standard_normal((4, 3))
    fd = numeric_gradient(L, X, {X: x})
    np.testing.assert_allclose(te.evaluate(dX, {X: x}), fd, rtol=1e-6, atol=1e-8)
    got = codegen.build([L, dX], [X])(x)
    np.testing.assert_allclose(got[1], fd, rtol=1e-6, atol=1e-8)


def test_components_of_two_different_reductions_in_one_stage_are_refused():
    X = te.placeholder((4, 3), "X", "float64")
    k, l = te.reduce_axis((0, 3), "k"), te.reduce_axis((0, 3), "l")
    with pytest.raises(te.TexprError, match="one tuple reduction"):
        te.compute((4,), lambda a: (ARGMAX((X[a, k], k), axis=k)[0],
                                    ARGMAX((X[a, l], l), axis=l)[1]), name="two")
