"""Split reductions: a long reduction to few outputs runs as partial reductions over
slices of one axis (in parallel), then their combination (codegen.rewrite.split_reductions)."""

import numpy as np
import pytest
from scipy.special import logsumexp

import texpr as te
from texpr import codegen
from texpr.codegen.rewrite import split_reductions as sr

N = (1 << 19) + 3  # not a multiple of the slices


def test_logsumexp_value_and_gradient_split_and_exact():
    X = te.placeholder((N,), name="X", dtype="float64")
    L = te.nn.logsumexp(X, axis=0)
    dX, = te.differentiate(L, [X])
    k = codegen.build([L, dX], [X])
    assert "logsumexp_sum_parts" in k.stages and "logsumexp_max_parts" in k.stages
    assert "partial reductions of logsumexp_sum, split across cores" in k.explain()
    lowering = {r.stage: r.lowering for r in k.profile(np.zeros(N), print_table=False).rows}
    assert "parallel" in lowering["logsumexp_sum_parts"]
    x = np.random.default_rng(0).normal(size=N) * 3
    x[-1] = 40.0  # the max in the last, short slice
    value, grad = k(x)
    np.testing.assert_allclose(value, logsumexp(x), rtol=1e-13)
    np.testing.assert_allclose(grad, np.exp(x - logsumexp(x)), rtol=1e-11, atol=1e-300)
    # the result does not depend on the run: the partition is fixed
    again = k(x)
    assert again[0] == value and np.array_equal(again[1], grad)


def test_max_min_prod_and_a_where_domain_against_the_evaluator():
    X = te.placeholder((N,), name="X", dtype="float64")
    r = [te.reduce_axis(N, f"r{i}") for i in range(4)]
    mx = te.compute((), lambda: te.max(X[r[0]], axis=r[0]), name="mx")
    mn = te.compute((2,), lambda i: te.min(X[r[1]] * (i + 1), axis=r[1]), name="mn")
    pr = te.compute((), lambda: te.prod(1.0 + X[r[2]] * 1e-6, axis=r[2]), name="pr")
    sw = te.compute((), lambda: te.sum(X[r[3]], axis=r[3], where=r[3] % 3 == 1), name="sw")
    outs = [mx, mn, pr, sw]
    k = codegen.build(outs, [X])
    assert {f"{t.name}_parts" for t in outs} <= set(k.stages)
    x = np.random.default_rng(1).normal(size=N)
    for inject in (None, np.nan, np.inf, -np.inf):
        if inject is not None:
            x[N // 2] = inject
        got = k(x)
        want = te.evaluate(outs, {X: x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-9, equal_nan=True)


def test_what_is_not_split():
    X = te.placeholder((N,), name="X", dtype="float64")
    Y = te.placeholder((N,), name="Y", dtype="float64")
    S = te.placeholder((1000,), name="S", dtype="float64")
    r, q, s = te.reduce_axis(N, "r"), te.reduce_axis(N, "q"), te.reduce_axis(1000, "s")
    small = te.compute((), lambda: te.sum(S[s], axis=s), name="small")
    dot = te.compute((), lambda: te.sum(X[r] * Y[r], axis=r), name="dot")  # a GEMM's
    wide = te.compute((16,), lambda i: te.sum(X[q] * (i + 1.0), axis=q), name="wide")
    k = codegen.build([small, dot, wide], [X, Y, S])
    assert not any(n.endswith("_parts") for n in k.stages)
    serial = codegen.build([te.nn.logsumexp(X, axis=0)], [X], parallel=False, blas=False)
    assert not any(n.endswith("_parts") for n in serial.stages)
    x, y = np.arange(N) * 1e-6, np.ones(N)
    got = k(x, y, np.ones(1000))
    np.testing.assert_allclose(got[1], x.sum(), rtol=1e-12)
    assert got[0] == 1000.0


def test_the_switch(monkeypatch):
    monkeypatch.setattr(sr, "ENABLED", False)
    X = te.placeholder((N,), name="X", dtype="float64")
    r = te.reduce_axis(N, "r")
    mx = te.compute((), lambda: te.max(X[r], axis=r), name="mx")
    assert "mx_parts" not in codegen.build([mx], [X]).stages
