"""An unrolled float sum keeps its partial sums per output element
(``Options.partials_per_output``, docs/conventions.md "The order of a sum's
terms"): set once before the reduction loops, every row of the innermost loop
adds its unrolled part to them, its remainder goes to the accumulator, and
the partial sums are added to the accumulator once, in a fixed pairwise tree,
after the last row. The values equal the evaluator's within rounding (NaN and
the infinities as IEEE sums give them), and the order is exactly the one the
docs state: :func:`_documented_sum` rebuilds it term by term."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen

# small stages unrolled as large ones are (the mechanism under test)
SMALL = {"unroll_min_points": 0}


def _tree(parts):
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


def _documented_sum(rows, u_n, per_output=True):
    """The documented order: ``rows`` are the innermost loop's runs (arrays of
    terms, in loop order); each run's first ``len // u_n * u_n`` terms go to
    partial sum ``t % u_n``, the rest to the accumulator; the partial sums are
    added in a pairwise tree once (``per_output``) or after each run. Python
    floats: float64 adds, as a float32 sum's float64 accumulator."""
    acc = 0.0
    parts = [0.0] * u_n
    for row in rows:
        row = [float(v) for v in row]
        m = len(row) // u_n * u_n
        for t in range(m):
            parts[t % u_n] += row[t]
        for t in range(m, len(row)):
            acc += row[t]
        if not per_output:
            acc += _tree(parts)
            parts = [0.0] * u_n
    return acc + _tree(parts) if per_output else acc


def _bn_sum(shape, dtype):
    N, C, H, W = shape
    X = te.placeholder(shape, "X", dtype)
    n, h, w = te.reduce_axis(N, "n"), te.reduce_axis(H, "h"), te.reduce_axis(W, "w")
    S = te.compute((C,), lambda c: te.sum(X[n, c, h, w], axis=[n, h, w]), name="S")
    return X, S


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("per_output", [True, False])
def test_a_sum_over_rows_adds_in_the_documented_order(dtype, per_output):
    # rows of 37: float64 unrolls by 4 (Options.unroll // 2), float32 by 8, and
    # each row leaves a remainder (1 or 5 terms) to the accumulator
    shape = (3, 4, 5, 37)
    X, S = _bn_sum(shape, dtype)
    with codegen.options(partials_per_output=per_output, **SMALL):
        k = codegen.build([S], [X])
    src = k.source
    unit = src[src.index("stage S"):src.index("return 0", src.index("stage S"))]
    u_n = 8 if dtype == "float32" else 4
    assert f"acc0_0_p{u_n - 1} +=" in unit and f"acc0_0_p{u_n} " not in unit
    inits = [ln for ln in unit.splitlines() if ln.strip().startswith("acc0_0_p0 = ")]
    assert len(inits) == 1
    first_loop = next(ln for ln in unit.splitlines() if ln.lstrip().startswith("for c0_2"))
    indent = len(inits[0]) - len(inits[0].lstrip())
    # per output: set before the reduction loops; else inside the innermost's parent
    assert (indent <= len(first_loop) - len(first_loop.lstrip())) == per_output
    rng = np.random.default_rng(5)
    # terms of very different sizes: another order of adds gives other bits
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 7, shape)).astype(dtype)
    got = k(x)[0]
    want = te.evaluate([S], {X: x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-5 * np.abs(x).sum((0, 2, 3)).max())
    N, C, H, W = shape
    for c in range(C):
        rows = [x[i, c, j] for i in range(N) for j in range(H)]
        exact = _documented_sum(rows, u_n, per_output)
        assert got[c] == np.asarray(exact).astype(dtype), (c, got[c], exact)


def test_the_partial_sums_run_on_across_rows_of_varying_length():
    # a triangular where: row a of the innermost loop runs k < a + 3 (3..10
    # terms), so some rows are too short for a full group and the bounds are not
    # constant; the partial sums still carry over from row to row
    A, K = 8, 40
    X = te.placeholder((6, A, K), "X", "float64")
    a, kk = te.reduce_axis(A, "a"), te.reduce_axis(K, "k")
    S = te.compute((6,), lambda i: te.sum(X[i, a, kk], axis=[a, kk], where=kk < 4 * a + 3),
                   name="S")
    with codegen.options(**SMALL):
        k = codegen.build([S], [X])
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, A, K)) * 10.0 ** rng.integers(-8, 9, (6, A, K))
    got = k(x)[0]
    np.testing.assert_allclose(got, te.evaluate([S], {X: x})[0], rtol=1e-12,
                               atol=1e-12 * np.abs(x).sum((1, 2)).max())
    if "acc0_0_p3 +=" in k.source:  # (the unrolled loop: rows of at least 8 values)
        for i in range(6):
            rows = [x[i, j, :4 * j + 3] for j in range(A)]
            assert got[i] == _documented_sum(rows, 4), i


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_non_finite_terms_keep_ieee_sums(dtype):
    shape = (3, 4, 5, 37)
    X, S = _bn_sum(shape, dtype)
    with codegen.options(**SMALL):
        k = codegen.build([S], [X])
    x = np.random.default_rng(2).uniform(-1, 1, shape).astype(dtype)
    x[0, 0, 1, 3] = np.inf                               # one inf: inf
    x[2, 1, 4, 9], x[1, 1, 0, 36] = np.inf, -np.inf      # inf and -inf (another lane): NaN
    x[1, 2, 2, 17] = np.nan                              # NaN stays NaN
    x[0, 3, 0, 0], x[2, 3, 4, 36] = -np.inf, -np.inf     # -inf twice: -inf
    got = k(x)[0]
    want = te.evaluate([S], {X: x})[0]
    assert got[0] == np.inf and np.isnan(got[1]) and np.isnan(got[2]) and got[3] == -np.inf
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[:1], want[:1])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("N", [0, 1])
def test_empty_and_size_one_outer_axes(dtype, N):
    # an empty reduction axis: the identity (the partial sums stay 0); a loop of
    # one value (isl substitutes it away): the one row
    X, S = _bn_sum((N, 3, 4, 37), dtype)
    with codegen.options(**SMALL):
        k = codegen.build([S], [X])
    x = np.random.default_rng(4).standard_normal((N, 3, 4, 37)).astype(dtype)
    got = k(x)[0]
    want = te.evaluate([S], {X: x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    if N == 0:
        assert (got == 0).all() and not np.signbit(got).any()
    u_n = 8 if dtype == "float32" else 4
    for c in range(3 * N):
        exact = _documented_sum([x[0, c, j] for j in range(4)], u_n)
        assert got[c] == np.asarray(exact).astype(dtype)


def test_a_register_blocked_sum_keeps_its_partial_sums_per_point():
    # 4 points of j share the reduction loops (Options.jam), each with its own
    # partial sums (Options.jam_unroll // 2 for float64), kept across the rows of r
    X = te.placeholder((6, 5, 21), "X", "float64")
    V = te.placeholder((10, 5, 21), "V", "float64")
    r, kk = te.reduce_axis(5, "r"), te.reduce_axis(21, "k")
    D = te.compute((6, 10), lambda i, j: te.sum(te.abs(X[i, r, kk] - V[j, r, kk]),
                                                 axis=[r, kk]), name="D")
    with codegen.options(**SMALL):
        k = codegen.build([D], [X, V])
    assert "acc0_0_l3_p1 +=" in k.source and "_l3_p2" not in k.source
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 5, 21)) * 10.0 ** rng.integers(-6, 7, (6, 5, 21))
    v = rng.standard_normal((10, 5, 21))
    got = k(x, v)[0]
    np.testing.assert_allclose(got, te.evaluate([D], {X: x, V: v})[0], rtol=1e-12)
    for i in range(6):
        for j in range(8):  # the blocked tiles (the last two points run unblocked)
            rows = [np.abs(x[i, q] - v[j, q]) for q in range(5)]
            assert got[i, j] == _documented_sum(rows, 2), (i, j)
