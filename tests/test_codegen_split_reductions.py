"""Split reductions: a long reduction to few outputs runs as partial reductions over
slices of one axis (in parallel), then their combination (codegen.rewrite.split_reductions)."""

import numpy as np
import pytest
from scipy.special import logsumexp

import texpr as te
from texpr import codegen
from texpr.codegen.rewrite.split_reductions import split_reductions
from texpr.simplify.graph import topo_order

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


def test_the_switch():
    X = te.placeholder((N,), name="X", dtype="float64")
    r = te.reduce_axis(N, "r")
    mx = te.compute((), lambda: te.max(X[r], axis=r), name="mx")
    assert "mx_parts" not in codegen.build([mx], [X], options={"split_reductions": False}).stages


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_per_channel_sum_over_an_outer_axis_is_split(dtype):
    """BatchNorm's statistics: x[n, c, h, w] summed over n, h, w per channel c.
    n is outside c in x's layout, so the 12 channels (more than
    split_reduction_max_outputs) are split on n all the same
    (split_reduction_strided_outputs), and so is a relu-masked sum as in its
    gradient; a row sum (its axis inside the output's) and a stage with more
    outputs than the bound are not. Values against the evaluator, with NaN and
    infinities in some channels."""
    shape = (37, 12, 3, 5)  # 37 = 2 slices of 3 short of 16 x 3: a short last slice
    X = te.placeholder(shape, name="X", dtype=dtype)
    n, h, w = te.reduce_axis(37, "n"), te.reduce_axis(3, "h"), te.reduce_axis(5, "w")
    mean = te.compute((12,), lambda c: te.sum(X[n, c, h, w] * (1.0 / 555), axis=[n, h, w]),
                      name="mean")
    n2, h2, w2 = te.reduce_axis(37, "n2"), te.reduce_axis(3, "h2"), te.reduce_axis(5, "w2")
    masked = te.compute((12,), lambda c: te.sum(X[n2, c, h2, w2] * 3.0, axis=[n2, h2, w2],
                                                 where=X[n2, c, h2, w2] > 0.0), name="masked")
    n3, h3, w3 = te.reduce_axis(37, "n3"), te.reduce_axis(3, "h3"), te.reduce_axis(5, "w3")
    top = te.compute((12,), lambda c: te.max(X[n3, c, h3, w3], axis=[n3, h3, w3]), name="top")
    R = te.placeholder((12, 1000), name="R", dtype=dtype)
    q = te.reduce_axis(1000, "q")
    rows = te.compute((12,), lambda c: te.sum(R[c, q], axis=q), name="rows")
    # a bias gradient: no reduction axis inside the output's (read along already)
    D = te.placeholder((1000, 12), name="D", dtype=dtype)
    q2 = te.reduce_axis(1000, "q2")
    cols = te.compute((12,), lambda c: te.sum(D[q2, c], axis=q2), name="cols")
    opts = {"split_reduction_min_points": 0, "split_reduction_strided_outputs": 12}
    k = codegen.build([mean, masked, top, rows, cols], [X, R, D], options=opts)
    assert {"mean_parts", "masked_parts", "top_parts"} <= set(k.stages)
    assert "rows_parts" not in k.stages and "cols_parts" not in k.stages
    wide = codegen.build([mean], [X], options=dict(opts, split_reduction_strided_outputs=11))
    assert "mean_parts" not in wide.stages
    rng = np.random.default_rng(11)
    x = rng.standard_normal(shape).astype(dtype)
    x[0, 1, 0, 0] = np.inf
    x[5, 2, 1, 1], x[36, 2, 2, 4] = np.inf, -np.inf
    x[20, 3, 0, 2] = np.nan
    feed = {X: x, R: rng.standard_normal((12, 1000)).astype(dtype),
            D: rng.standard_normal((1000, 12)).astype(dtype)}
    got = k(x, feed[R], feed[D])
    want = te.evaluate([mean, masked, top, rows, cols], feed)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for g, wv in zip(got, want):
        np.testing.assert_allclose(g, wv, rtol=tol, atol=tol, equal_nan=True)
    assert got[0][1] == np.inf and np.isnan(got[0][2]) and np.isnan(got[0][3])
    np.testing.assert_allclose(wide(x)[0], got[0], rtol=tol, atol=tol, equal_nan=True)
    again = k(x, feed[R], feed[D])  # the partition is fixed: the same bits on every run
    for g, a in zip(got, again):
        np.testing.assert_array_equal(g, a)


def test_the_stages_after_a_split_one_are_mapped_to_their_rebuilt_stages():
    # every stage downstream of a split one is rebuilt; the earlier rewrites'
    # records (the operands a GEMM reads, the windows) follow through ``remap``
    # (lost, they left a ResNet's conv operands and windows inlined)
    X = te.placeholder((40, 12, 3, 5), name="X", dtype="float32")
    n, h, w = te.reduce_axis(40, "n"), te.reduce_axis(3, "h"), te.reduce_axis(5, "w")
    mean = te.compute((12,), lambda c: te.sum(X[n, c, h, w], axis=[n, h, w]), name="mean")
    Z = te.compute((40, 12, 3, 5), lambda a, c, y, x: X[a, c, y, x] - mean[c], name="Z")
    U = te.compute((40, 12, 3, 5), lambda a, c, y, x: Z[a, c, y, x] * 2.0, name="U")
    remap = {}
    with codegen.options(split_reduction_min_points=0):
        (out,), parts = split_reductions([U], remap)
    assert [p.name for p in parts] == ["mean_parts"]
    new_ops = {id(op): op for op in topo_order([out])}
    for old in (mean.op, Z.op, U.op):
        assert id(remap[id(old)]) in new_ops and remap[id(old)].name == old.name
    assert remap[id(Z.op)] is not Z.op  # rebuilt: it reads the combined stage
