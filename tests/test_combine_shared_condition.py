"""A custom reducer whose components all select on one condition writes it once
(sel<k>_<n>, 7430681): values and errors as te.evaluate, for 2 and 3
components, a tie rule, a NaN rule, an integer division that can fail, and
components on different conditions (no sel line)."""
import re

import numpy as np
import pytest

import texpr as te
from texpr import codegen


def _idn(*ds):
    return tuple(te.const(-np.inf if d.startswith("float") else -1, d) for d in ds)


def _tie(x, y):
    return (x[0] > y[0]) | ((x[0] == y[0]) & (x[1] < y[1]))


def _nan(x, y):
    return (x[0] != x[0]) | (x[0] >= y[0])


RULES = {
    "ge3": (lambda x, y: tuple(te.select(x[0] >= y[0], x[c], y[c]) for c in range(3)), 3, True),
    "tie": (lambda x, y: tuple(te.select(_tie(x, y), x[c], y[c]) for c in range(2)), 2, True),
    "nan": (lambda x, y: tuple(te.select(_nan(x, y), x[c], y[c]) for c in range(2)), 2, True),
    "diff": (lambda x, y: (te.select(x[0] >= y[0], x[0], y[0]),
                           te.select(x[0] <= y[0], x[1], y[1])), 2, False),
}


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("where", [False, True])
def test_shared_condition_combine_matches_evaluate(rule, where):
    fc, ncomp, shared = RULES[rule]
    red = te.comm_reducer(fc, _idn, name="r_" + rule)
    X = te.placeholder((3, 6), "X", "float64")
    k = te.reduce_axis(6, "k")
    src = lambda i: (X[i, k], k, X[i, k] * 2.0)[:ncomp]
    outs = list(te.compute((3,), lambda i: red(src(i), axis=k,
                                              where=(k != 2) if where else None), name="A"))
    kern = codegen.build(outs, [X])
    assert bool(re.search(r"\bsel\d+_\d+ = ", kern.source)) == shared
    for d in (np.random.default_rng(0).uniform(-1, 1, (3, 6)),
              np.array([[1, 3, 3, 0, 3, 1], [2] * 6, [-1, 5, 0, 5, 5, -2]], float),
              np.array([[1, np.nan, 3, 0, 3, 1], [np.nan, 2, 2, np.nan, 2, 2],
                        [-1, 5, 0, 5, np.inf, -np.inf]]),
              np.full((3, 6), np.nan), np.full((3, 6), -np.inf)):
        for a, b in zip(te.evaluate(outs, {X: d}), kern(d)):
            np.testing.assert_array_equal(a, b)


def test_a_shared_condition_that_divides_by_zero_raises_as_evaluate():
    def c(x, y):
        return (x[0] > y[0]) | ((x[0] == y[0]) & (y[1] // (x[1] + 1) >= 0))
    red = te.comm_reducer(lambda x, y: (te.select(c(x, y), x[0], y[0]),
                                        te.select(c(x, y), x[1], y[1])), _idn, name="rz")
    X = te.placeholder((2, 3), "X", "float64")
    k = te.reduce_axis(3, "k")
    outs = list(te.compute((2,), lambda i: red((X[i, k], k), axis=k), name="A"))
    kern = codegen.build(outs, [X])
    d = np.array([[1.0, 2, 3], [-np.inf, 0, 1]])
    with pytest.raises(te.TexprError, match="division by zero"):
        te.evaluate(outs, {X: d})
    with pytest.raises(te.TexprError, match="division by zero"):
        kern(d)
