"""Float selects of an elementwise stage whose arms are small, check-free and in
bounds everywhere are written _sel(c, a, b): both arms computed, then one LLVM
select (codegen.loopnest.stage.speculative_selects). The value is the branch's."""

import numpy as np

import texpr as te
from texpr import codegen
from texpr.codegen.loopnest import stage


def test_a_relu_mask_is_a_select_and_the_untaken_arm_never_leaks():
    n = 50
    X = te.placeholder((n,), name="X", dtype="float64")
    D = te.placeholder((n,), name="D", dtype="float64")
    G = te.placeholder((n,), name="G", dtype="float64")
    Y = te.compute((n,), lambda i: te.if_then_else(
        X[i] > 0, te.if_then_else(G[i] > 0, D[i] * 0.5, 0.0) + D[i], 0.0), name="Y")
    k = codegen.build([Y], [X, D, G], parallel=False, blas=False)
    assert k.source.count("_sel(") == 2  # both selects
    rng = np.random.default_rng(0)
    x, d, g = (rng.normal(size=n) for _ in range(3))
    d[x <= 0] = np.where(rng.random((x <= 0).sum()) < 0.5, np.nan, -np.inf)
    got = k(x, d, g)[0]
    np.testing.assert_array_equal(got, te.evaluate(Y, {X: x, D: d, G: g}))
    assert np.all(got[x <= 0] == 0.0)


def test_a_padding_select_keeps_its_branch_and_reads_nothing_outside():
    # select(i >= 1, X[i - 1], 0): X[-1] is outside; the load stays behind the branch
    X = te.placeholder((6,), name="X", dtype="float64")
    Y = te.compute((6,), lambda i: te.if_then_else(i >= 1, X[i - 1] * 2.0, 0.0), name="Y")
    Z = te.compute((6,), lambda i: te.if_then_else(X[i] > 0.0, X[5 - i], X[i]), name="Z")
    k = codegen.build([Y, Z], [X], parallel=False, blas=False)
    src_y = k.source[k.source.index("stage Y"):k.source.index("stage Z")]
    assert "_sel(" not in src_y
    assert "_sel(" in k.source[k.source.index("stage Z"):]
    x = np.arange(6.0) - 2.5
    y, z = k(x)
    np.testing.assert_array_equal(y, np.r_[0.0, 2 * x[:-1]])
    np.testing.assert_array_equal(z, np.where(x > 0, x[::-1], x))


def test_the_switch(monkeypatch):
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    monkeypatch.setattr(stage, "SPECULATE_SELECTS", False)
    X = te.placeholder((4,), name="X", dtype="float64")
    Y = te.compute((4,), lambda i: te.if_then_else(X[i] > 0, X[i], 0.0), name="Y")
    k = codegen.build([Y], [X], parallel=False, blas=False)
    assert "_sel(" not in k.source.split("def unit", 1)[1]
    np.testing.assert_array_equal(k(np.array([-1.0, 2.0, 0.0, 3.0]))[0], [0, 2, 0, 3])
