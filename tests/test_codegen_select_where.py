"""A reduction's data-dependent ``where`` over a value that runs no check is written as a
select of the combined value (``acc += v if c else 0``), so the loads leave the branch and
the accumulators vectorise (codegen.loopnest.stage._StageLowering._select_combine). The values
must be those of the ``if``: a value where the condition fails is never combined, even
a NaN or an infinity."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.loopnest import stage


def _graph(dtype):
    X = te.placeholder((3, 40), name="X", dtype=dtype)
    D = te.placeholder((3, 40), name="D", dtype=dtype)
    outs = []
    for kind in ("sum", "prod", "max", "min"):
        r = te.reduce_axis(40, "r")
        red = getattr(te, kind)
        outs.append(te.compute((3,), lambda i, red=red, r=r: red(D[i, r] * X[i, r], axis=r,
                                                                 where=X[i, r] > 0),
                               name=f"m{kind}"))
    return X, D, outs


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_masked_reductions_match_the_evaluator_with_non_finite_values_masked_out(dtype):
    X, D, outs = _graph(dtype)
    k = codegen.build(outs, [X, D], parallel=False, blas=False)
    assert " if (" in k.source and " else " in k.source  # the select form
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 40)).astype(dtype)
    d = rng.uniform(0.5, 1.5, size=(3, 40)).astype(dtype)
    x[1] = -np.abs(x[1])  # row 1: nothing passes (the identities)
    masked = x <= 0
    d[masked] = np.where(rng.random(masked.sum()) < 0.5, np.nan, np.inf)  # never combined
    got = k(x, d)
    want = te.evaluate(outs, {X: x, D: d})
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-5 if dtype == "float32" else 1e-12)
    assert np.all(np.isfinite(got[0])) and got[0][1] == 0.0 and got[1][1] == 1.0
    assert got[2][1] == -np.inf and got[3][1] == np.inf
    # a NaN where the condition holds is combined, as the evaluator does
    d[0, np.argmax(x[0] > 0)] = np.nan
    got = k(x, d)
    assert np.isnan(got[0][0]) and np.isnan(got[1][0])


def test_the_if_form_is_kept_for_a_checked_value_and_by_the_switch(monkeypatch):
    # a gather at a data index is checked: it stays behind the if
    X = te.placeholder((30,), name="X", dtype="float64")
    J = te.placeholder((30,), name="J", dtype="int64")
    r = te.reduce_axis(30, "r")
    G = te.compute((), lambda: te.sum(X[J[r]], axis=r, where=X[r] > 0), name="G")
    k = codegen.build([G], [X, J], parallel=False, blas=False)
    x = np.linspace(-1, 1, 30)
    j = np.where(x > 0, 3, 99)  # out of range only where the condition fails
    np.testing.assert_allclose(k(x, j)[0], te.evaluate(G, {X: x, J: j}))
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    monkeypatch.setattr(stage, "SELECT_WHERE", False)
    X2, D2, outs = _graph("float64")
    k2 = codegen.build(outs[:1], [X2, D2], parallel=False, blas=False)
    assert "if (" in k2.source and " else np.float64(0.0)" not in k2.source


def test_a_long_float32_sum_adds_in_float64():
    # stage.SUM_FLOAT64: 2**20 terms of 0.1 in float32 accumulators lost 1e-4 of
    # the sum; added in float64 and rounded once, it is float32's rounding of it
    n = 1 << 20
    X = te.placeholder((n,), name="X", dtype="float32")
    M = te.placeholder((n,), name="M", dtype="float32")
    r, q = te.reduce_axis(n, "r"), te.reduce_axis(n, "q")
    S = te.compute((), lambda: te.sum(X[r], axis=r), name="S")
    T = te.compute((), lambda: te.sum(X[q] * M[q], axis=q, where=M[q] > 0), name="T")
    k = codegen.build([S, T], [X, M], parallel=False, blas=False)
    x = np.full(n, 0.1, dtype="float32")
    m = np.where(np.arange(n) % 3 == 0, 1.0, -1.0).astype("float32")
    s, t = k(x, m)
    exact_s = float(np.float64(x).sum())
    exact_t = float((np.float64(x) * m * (m > 0)).sum())
    assert abs(float(s) - exact_s) <= 1e-7 * exact_s
    assert abs(float(t) - exact_t) <= 1e-7 * exact_t
