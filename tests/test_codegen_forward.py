"""codegen.build, forward kernels vs the reference evaluator (float64, tight tolerance).

Compilation is slow, so each fixture compiles one kernel with many outputs and
the tests share it: scalar semantics (intrinsics, floor division/modulo with
negative operands, select that must not evaluate the untaken branch,
short-circuit ``&&``/``||``, casts, round half to even), reductions (matmul with
an inlined epilogue, argmax as a tuple reduction, a triangular cumsum, max/min/
prod, empty and shifted reduction axes, a data-dependent ``where``), and
data-dependent gathers/scatters with their run-time errors.
"""

import contextlib
import os

import numpy as np
import pytest

from texpr import codegen
import texpr.codegen.loopnest.stage as stage_knobs
import texpr as te

RTOL = 1e-12
ATOL = 1e-12


def _check(kernel, outs, feed, inputs, rtol=RTOL, atol=ATOL):
    got = kernel(*[feed[t] for t in inputs])
    want = te.evaluate(list(outs), feed)
    assert len(got) == len(want)
    for t, g, w in zip(outs, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (t.name, g.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=t.name)
    return got


# ---- scalar semantics -----------------------------------------------------------------

@pytest.fixture(scope="module")
def scalar_case():
    n, m = 5, 8
    A = te.placeholder((n, m), "A", "float64")
    I = te.placeholder((n, m), "I", "int64")
    J = te.placeholder((n, m), "J", "int64")
    outs = [
        te.compute((n, m), lambda i, j: te.exp(A[i, j]) + te.log(te.abs(A[i, j]) + 1.0)
                   + te.sqrt(te.abs(A[i, j])) + te.rsqrt(te.abs(A[i, j]) + 1.0), name="math1"),
        te.compute((n, m), lambda i, j: te.tanh(A[i, j]) * te.sigmoid(A[i, j])
                   + te.power(te.abs(A[i, j]) + 1.0, 1.5) + te.erf(A[i, j])
                   + te.sin(A[i, j]) - te.cos(A[i, j]), name="math2"),
        te.compute((n, m), lambda i, j: te.floor(A[i, j]) + 10.0 * te.ceil(A[i, j])
                   + 100.0 * te.round(A[i, j]) + 1000.0 * te.trunc(A[i, j]), name="rounding"),
        te.compute((n, m), lambda i, j: (I[i, j] // 3) * 1000 + (I[i, j] % 3) * 100
                   + (I[i, j] // -2) * 10 + I[i, j] % -2, name="floordiv_const"),
        te.compute((n, m), lambda i, j: (I[i, j] // J[i, j]) * 100 + I[i, j] % J[i, j],
                   name="floordiv_data"),
        te.compute((n, m), lambda i, j: te.max(I[i, j], J[i, j]) * 100 + te.min(I[i, j], -1)
                   + te.abs(I[i, j]), name="int_minmax"),
        # the untaken branch reads outside A: it must not run
        te.compute((n, m), lambda i, j: te.if_then_else(i + 1 < n, A[te.min(i + 1, n), j], -7.0),
                   name="guarded_read"),
        te.compute((n, m), lambda i, j: te.if_then_else(
            te.all(j >= 1, A[i, j - 1] > 0.0), A[i, j - 1], te.if_then_else(
                te.any(j == 0, A[i, j - 1] < -0.5), 3.0, 4.0)), name="short_circuit"),
        te.compute((n, m), lambda i, j: te.if_then_else(A[i, j] > 0.0, te.sqrt(A[i, j]), -1.0),
                   name="data_select"),
        te.compute((n, m), lambda i, j: te.cast(te.cast(A[i, j] * 3.0, "int64") * 2
                                                 + te.cast(A[i, j] > 0.0, "int64"), "float64")
                   + te.cast(I[i, j], "float64"), name="casts"),
        te.compute((n, m), lambda i, j: te.cast(A[i, j], "float32") * 2.0 + 1.0, name="f32"),
        te.compute((n, m), lambda i, j: te.cast(I[i, j], "int32") * 3 + 1, name="i32"),
        te.compute((), lambda: A[2, 3] * 2.0, name="scalar_out"),
    ]
    rng = np.random.default_rng(0)
    a = rng.uniform(-3, 3, (n, m))
    a[0, :4] = [0.5, 1.5, 2.5, -2.5]  # round half to even
    i_ = rng.integers(-9, 10, (n, m))
    j_ = rng.integers(1, 4, (n, m)) * rng.choice([-1, 1], (n, m))
    feed = {A: a, I: i_, J: j_}
    inputs = [A, I, J]
    return codegen.build(outs, inputs), outs, feed, inputs


def test_intrinsics_and_scalar_semantics_match_the_evaluator(scalar_case):
    kernel, outs, feed, inputs = scalar_case
    got = _check(kernel, outs, feed, inputs)
    rounding = got[2]
    np.testing.assert_array_equal(rounding[0, :4] // 100 % 10 * 0 + np.round(rounding[0, :4]),
                                  rounding[0, :4])
    a = feed[inputs[0]]
    assert (np.round(a[0, :4]) == [0.0, 2.0, 2.0, -2.0]).all()


def test_dtypes_and_shapes_are_as_declared(scalar_case):
    kernel, outs, feed, inputs = scalar_case
    got = kernel(*[feed[t] for t in inputs])
    assert [g.dtype.name for g in got] == [t.dtype for t in outs]
    assert got[-1].shape == ()
    assert kernel.stages == [t.name for t in outs]


def test_outputs_are_fresh_arrays(scalar_case):
    kernel, outs, feed, inputs = scalar_case
    a = kernel(*[feed[t] for t in inputs])
    b = kernel(*[feed[t] for t in inputs])
    assert all(x is not y and not np.shares_memory(x, y) for x, y in zip(a, b))


def test_integer_division_by_zero_is_a_texpr_error(scalar_case):
    kernel, outs, feed, inputs = scalar_case
    j = feed[inputs[2]].copy()
    j[1, 1] = 0
    with pytest.raises(te.TexprError, match="division by zero"):
        kernel(feed[inputs[0]], feed[inputs[1]], j)


def test_wrong_feeds_are_feed_errors(scalar_case):
    kernel, outs, feed, inputs = scalar_case
    a, i, j = (feed[t] for t in inputs)
    with pytest.raises(te.FeedError, match="expects shape"):
        kernel(a[:2], i, j)
    with pytest.raises(te.FeedError, match="expects dtype float64"):
        kernel(a.astype("float32"), i, j)
    with pytest.raises(te.FeedError, match="expected 3 arrays"):
        kernel(a, i)
    with pytest.raises(te.FeedError, match="numpy array"):
        kernel(a.tolist(), i, j)


# ---- reductions ------------------------------------------------------------------------

def _argmax_reducer():
    return te.comm_reducer(
        lambda x, y: (te.if_then_else(x[0] >= y[0], x[0], y[0]),
                      te.if_then_else(x[0] >= y[0], x[1], y[1])),
        lambda vd, idd: (te.const(-np.inf, vd), te.const(-1, idd)), name="argmax")


@pytest.fixture(scope="module")
def reduction_case():
    n, kk, m = 6, 9, 5
    X = te.placeholder((n, kk), "X", "float64")
    W = te.placeholder((m, kk), "W", "float64")
    b = te.placeholder((m,), "b", "float64")
    k = te.reduce_axis(kk, "k")
    mm = te.compute((n, m), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="mm")
    biased = te.compute((n, m), lambda i, j: mm[i, j] + b[j], name="biased")  # inlined
    relu = te.compute((n, m), lambda i, j: te.max(biased[i, j], 0.0), name="relu")
    argmax = _argmax_reducer()
    r = te.reduce_axis(kk, "r")
    amax_v, amax_i = te.compute((n,), lambda i: argmax((X[i, r], r), axis=r), name="amax")
    c = te.reduce_axis(kk, "c")
    cumsum = te.compute((n, kk), lambda i, j: te.sum(X[i, c], axis=c, where=c <= j),
                        name="cumsum")
    q = te.reduce_axis(kk, "q")
    mx = te.compute((n,), lambda i: te.max(X[i, q], axis=q), name="rowmax")
    q2 = te.reduce_axis(kk, "q2")
    mn = te.compute((n,), lambda i: te.min(X[i, q2], axis=q2), name="rowmin")
    q3 = te.reduce_axis(4, "q3")
    pr = te.compute((n,), lambda i: te.prod(X[i, q3] + 2.0, axis=q3), name="rowprod")
    e = te.reduce_axis(0, "e")
    empty = te.compute((n,), lambda i: te.max(X[i, e], axis=e), name="empty_max")
    s = te.reduce_axis((3, 7), "s")
    shifted = te.compute((n,), lambda i: te.sum(X[i, s] * s, axis=s), name="shifted")
    d = te.reduce_axis(kk, "d")
    positive = te.compute((n,), lambda i: te.sum(X[i, d], axis=d, where=X[i, d] > 0.0),
                          name="positive_sum")
    a1, a2 = te.reduce_axis(n, "a1"), te.reduce_axis(kk, "a2")
    total = te.compute((), lambda: te.sum(X[a1, a2], axis=[a1, a2]), name="total")
    V = te.placeholder((10, kk), "V", "float64")
    k2 = te.reduce_axis(kk, "k2")
    # 10 columns: two register-blocked tiles of 4, then a partial tile of 2
    blocked = te.compute((n, 10), lambda i, j: te.sum(X[i, k2] * V[j, k2], axis=k2),
                         name="blocked")
    outs = [relu, amax_v, amax_i, cumsum, mx, mn, pr, empty, shifted, positive, total, blocked]
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (n, kk))
    x[0, 3] = x[0, 5] = 5.0  # a tie: the first index wins with >=
    feed = {X: x, W: rng.uniform(-1, 1, (m, kk)), b: rng.uniform(-1, 1, (m,)),
            V: rng.uniform(-1, 1, (10, kk))}
    inputs = [X, W, b, V]
    # small stages, unrolled and blocked as large ones are (the mechanism under test)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stage_knobs, "UNROLL_MIN_POINTS", 0)
        mp.setenv("TEXPR_SYMBOLIC_CACHE", "0")  # the lowering's key holds no knobs
        return codegen.build(outs, inputs), outs, feed, inputs


def test_reductions_match_the_evaluator(reduction_case):
    kernel, outs, feed, inputs = reduction_case
    got = _check(kernel, outs, feed, inputs)
    assert got[2][0] in (3, 5)
    assert (got[7] == -np.inf).all()  # empty reduction: the identity


def test_default_schedule_inlines_elementwise_and_materialises_reductions(reduction_case):
    kernel, outs, feed, inputs = reduction_case
    assert "mm" in kernel.stages and "biased" not in kernel.stages and "relu" in kernel.stages
    assert "amax" in kernel.stages
    assert "prange(" not in kernel.source  # small stages: waking threads costs more
    # blocked: 4 columns x 2 partial sums (float64: JAM_UNROLL // 2); the loop is too
    # short for _radd (REASSOCIATE_MIN_TRIPS)
    assert "_l3_p1" in kernel.source and "_l3_p2" not in kernel.source
    # the triangular cumsum gets an exact bound, not a test
    src = kernel.source
    block = src[src.index("stage cumsum"):src.index("stage rowmax")]
    # no guard statement in its loops (the scan's first step is a conditional expression)
    assert not any(ln.lstrip().startswith(("if ", "elif ")) for ln in block.splitlines())


def test_a_unit_stride_sum_is_written_once_and_a_strided_one_unrolled():
    """Row sums read X at unit stride: their loop is written once, accumulated with
    _radd (a reassociable add: LLVM's loop vectoriser splits it into partial sums).
    Sums of a row's even columns read X at stride 2: unrolled into UNROLL partial
    sums by copies. A register-blocked sum (L1 distances of X's rows to V's, 4
    rows of V at a time) gets one _radd accumulator per blocked row. All equal the evaluator's, and non-finite terms keep
    IEEE sums (an inf and a -inf give NaN, a NaN stays NaN, one inf stays inf)."""
    n, m = 70, 600
    X = te.placeholder((n, m), "X", "float32")
    k, r = te.reduce_axis(m, "k"), te.reduce_axis(m // 2, "r")
    rows = te.compute((n,), lambda i: te.sum(X[i, k] * 0.5, axis=k), name="rows")
    cols = te.compute((n,), lambda i: te.sum(X[i, 2 * r] * 0.5, axis=r), name="evens")
    V = te.placeholder((8, m), "V", "float32")
    k2 = te.reduce_axis(m, "k2")
    blocked = te.compute((n, 8), lambda i, j: te.sum(te.abs(X[i, k2] - V[j, k2]), axis=k2),
                         name="blocked")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stage_knobs, "UNROLL_MIN_POINTS", 0)
        mp.setenv("TEXPR_SYMBOLIC_CACHE", "0")
        kernel = codegen.build([rows, cols, blocked], [X, V])
    src = kernel.source
    row_unit = src[src.index("stage rows"):src.index("return 0", src.index("stage rows"))]
    col_unit = src[src.index("stage evens"):src.index("return 0", src.index("stage evens"))]
    assert "= _radd(acc" in row_unit and "_p1" not in row_unit
    assert "_radd" not in col_unit and "acc0_0_p7 +=" in col_unit
    assert "acc0_0_l3 = _radd(acc0_0_l3, " in src and "_l3_p0" not in src
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, m)).astype("float32")
    v = rng.standard_normal((8, m)).astype("float32")
    got_rows, got_cols, got_blocked = kernel(x, v)
    want = x.astype("float64") * 0.5
    np.testing.assert_allclose(got_rows, want.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got_cols, want[:, ::2].sum(1), rtol=1e-5, atol=1e-4)
    l1 = np.abs(x.astype("float64")[:, None, :] - v.astype("float64")[None]).sum(-1)
    np.testing.assert_allclose(got_blocked, l1, rtol=1e-5, atol=1e-4)
    x[1, 7], x[2, 3], x[2, 9], x[3, 5] = np.inf, np.inf, -np.inf, np.nan
    x[4, 10], x[5, 12], x[5, 14], x[6, 16] = np.inf, np.inf, -np.inf, np.nan
    got_rows, got_cols, _ = kernel(x, v)
    assert got_rows[1] == np.inf and np.isnan(got_rows[2]) and np.isnan(got_rows[3])
    assert got_cols[4] == np.inf and np.isnan(got_cols[5]) and np.isnan(got_cols[6])
    _check(kernel, [rows, cols, blocked], {X: x, V: v}, [X, V], rtol=1e-5, atol=1e-4)


# ---- gathers and scatters -----------------------------------------------------------------

@pytest.fixture(scope="module")
def gather_case():
    X = te.placeholder((5, 4), "X", "float64")
    I = te.placeholder((7,), "I", "int64")
    V = te.placeholder((7, 4), "V", "float64")
    gathered = te.compute((7, 4), lambda k, j: X[I[k], j] * 2.0, name="gathered")
    scattered = te.scatter_add((5, 4), "float64", (7, 4), lambda k, j: (I[k], j),
                               lambda k, j: V[k, j], name="scattered")
    base = te.compute((5, 4), lambda i, j: X[i, j] + 1.0, name="base")
    scattered_init = te.scatter_add((5, 4), "float64", (7, 4), lambda k, j: (I[k], j),
                                    lambda k, j: V[k, j], where=lambda k, j: V[k, j] > 0.0,
                                    init=base, name="scattered_init")
    outs = [gathered, scattered, scattered_init]
    rng = np.random.default_rng(2)
    feed = {X: rng.uniform(-1, 1, (5, 4)), I: np.array([0, 4, 4, 2, 0, 0, 3]),
            V: rng.uniform(-1, 1, (7, 4))}
    inputs = [X, I, V]
    return codegen.build(outs, inputs), outs, feed, inputs


def test_gathers_and_scatters_with_duplicates(gather_case):
    kernel, outs, feed, inputs = gather_case
    _check(kernel, outs, feed, inputs)
    assert "scattered" in kernel.stages and "base" in kernel.stages


def test_scatter_loops_are_sequential(gather_case):
    kernel, *_ = gather_case
    src = kernel.source
    for name, end in (("scattered:", "stage base"), ("scattered_init:", "return 0")):
        block = src[src.index("stage " + name):]
        block = block[:block.index(end)]
        assert "for" in block and "prange" not in block


def test_data_dependent_index_out_of_bounds_is_reported(gather_case):
    kernel, outs, feed, inputs = gather_case
    bad = feed[inputs[1]].copy()
    bad[3] = 9
    with pytest.raises(te.OutOfBoundsError, match="reads X outside its shape|leaves the shape"):
        kernel(feed[inputs[0]], bad, feed[inputs[2]])
    bad[3] = -1
    with pytest.raises(te.OutOfBoundsError):
        kernel(feed[inputs[0]], bad, feed[inputs[2]])


def _heavy_transpose():
    # 360,000 points of about 120 expression nodes each: work enough for parallel
    X = te.placeholder((600, 600), "X", "float64")

    def body(i, j):
        y = X[j, i]
        for _ in range(20):
            y = te.tanh(y) * 0.5 + X[j, i] * 0.25
        return y
    return X, te.compute((600, 600), body, name="Y")


def _heavy_transpose_value(x):
    y = x.T.copy()
    for _ in range(20):
        y = np.tanh(y) * 0.5 + x.T * 0.25
    return y


def test_large_stages_run_in_parts_of_their_outermost_axis():
    from texpr.codegen.loopnest import stage

    X, Y = _heavy_transpose()
    kernel = codegen.build([Y], [X])
    # a chunked unit (codegen.backends.numba_cpu.chunks): serial text, the parts of axis 0 run at once
    assert "for c0_0 in range(max(0, part[0]), min(600, part[1])):" in kernel.source
    assert "prange(" not in kernel.source and kernel.units[0].chunks == 600
    x = np.random.default_rng(0).uniform(-1, 1, (600, 600))
    np.testing.assert_allclose(kernel(x)[0], _heavy_transpose_value(x), rtol=1e-12)
    serial = codegen.build([Y], [X], parallel=False, blas=False)
    assert "prange(" not in serial.source and "part[" not in serial.source
    np.testing.assert_allclose(serial(x)[0], _heavy_transpose_value(x), rtol=1e-12)
    # chunks off: numba's prange loop
    old = stage.CHUNKS
    stage.CHUNKS = False
    try:
        with _no_symbolic_cache():
            pr = codegen.build([Y], [X])
    finally:
        stage.CHUNKS = old
    assert "for c0_0 in prange(0, 600):" in pr.source
    np.testing.assert_allclose(pr(x)[0], _heavy_transpose_value(x), rtol=1e-12)


def test_cheap_stages_run_serially_however_many_points():
    # 90,000 points of a copy: waking a second thread costs more than the loop
    X = te.placeholder((300, 300), "X", "float64")
    Y = te.compute((300, 300), lambda i, j: X[j, i] * 2.0, name="Y")
    kernel = codegen.build([Y], [X])
    assert "prange(" not in kernel.source and "part[" not in kernel.source
    x = np.random.default_rng(0).uniform(-1, 1, (300, 300))
    np.testing.assert_array_equal(kernel(x)[0], x.T * 2.0)


@contextlib.contextmanager
def _no_symbolic_cache():
    # the lowered program is cached by graph, not by codegen's knobs
    old = os.environ.get("TEXPR_SYMBOLIC_CACHE")
    os.environ["TEXPR_SYMBOLIC_CACHE"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TEXPR_SYMBOLIC_CACHE")
        else:
            os.environ["TEXPR_SYMBOLIC_CACHE"] = old


def test_affine_out_of_bounds_is_reported_at_build_time():
    X = te.placeholder((5,), "X", "float64")
    Y = te.compute((5,), lambda i: X[i + 1], name="shifted")
    with pytest.raises(te.OutOfBoundsError, match=r"X.*i=4"):
        codegen.build([Y], [X])


def test_missing_input_and_bad_arguments_are_texpr_errors():
    X = te.placeholder((5,), "X", "float64")
    Z = te.placeholder((5,), "Z", "float64")
    Y = te.compute((5,), lambda i: X[i] + Z[i], name="Y")
    with pytest.raises(te.TexprError, match="not listed in inputs"):
        codegen.build([Y], [X])
    with pytest.raises(te.TexprError, match="placeholder"):
        codegen.build([Y], [X, Y])
    with pytest.raises(te.TexprError, match="Tensors"):
        codegen.build([3], [X])
    with pytest.raises(te.TexprError, match="listed twice"):
        codegen.build([Y], [X, Z, X])


@pytest.mark.parametrize("n", [7, 10])
def test_a_chunked_unit_never_clips_a_pass_that_writes_two_rows(n, monkeypatch):
    # an attack's find: isl ran two rows of dW in one pass of a stride-2 loop
    # (U(c); U(c + 1)); chunks clipped the loop variable, so the part owning c
    # wrote row c + 1 of the next part (zeroed by that part's fill) and a pass at
    # c = -1 ran in no part. Such a unit keeps prange loops now.
    from texpr.codegen.loopnest import stage

    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    for knob, v in (("PARALLEL_MIN_POINTS", 1), ("PARALLEL_POINTS", 1), ("PARALLEL_MIN_WORK", 0)):
        monkeypatch.setattr(stage, knob, v)
    X = te.placeholder((n, 3), "X", "float64")
    W = te.placeholder((n, 3), "W", "float64")
    b = te.reduce_axis(n, "b")
    Y = te.compute((3, 3), lambda i, j: te.sum(X[b, i] * W[b, j], axis=b,
                                                where=(b + 2 * j) % 4 != 1), name="Y")
    H = te.placeholder((3, 3), "H", "float64")
    dX, dW = te.differentiate(Y, [X, W], head=H).result
    kern = codegen.build([dX, dW], [X, W, H])
    rng = np.random.default_rng(0)
    x, w, h = rng.standard_normal((n, 3)), rng.standard_normal((n, 3)), rng.standard_normal((3, 3))
    for got, want in zip(kern(x, w, h), te.evaluate([dX, dW], {X: x, W: w, H: h})):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
