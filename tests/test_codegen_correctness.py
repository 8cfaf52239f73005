"""Kernel correctness (issue 10, BUGS.md C14): every compiled kernel agrees with
``te.evaluate`` and gradients with float64 finite differences, on the kinds of
program that once compiled to silently wrong, unsafe or failing kernels:

* reductions whose domain the simplifier collapses (one point, an equality
  solved away) or empties: every output of the stage is written;
* IEEE: a written ``0.0`` factor or numerator is a number (NaN for a non-finite
  operand), never folded to 0; NaN propagates through ``max``/``min`` in every
  kernel, with or without the gradient;
* data-dependent indices out of range are an error on every path (gradient
  scatters included);
* index arithmetic is proven to stay in int64 (or the build fails);
* valid programs that failed to build (lane statements outside their loop,
  isl's AST generator failing on a union of pieces);
* feeds in non-native byte order; an output listed twice.

Each test compiles one kernel with several outputs (compiles are the cost).
"""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.testing import numeric_gradient

F = "float64"


def ph(shape, name, dtype=F):
    return te.placeholder(shape, name, dtype)


def total(y, name):
    """``sum(Y)`` over all of ``y``'s axes (a scalar loss)."""
    axes = [te.reduce_axis(n, f"{name}_s{d}") for d, n in enumerate(y.shape)]
    return te.compute((), lambda: te.sum(y[tuple(axes)], axis=axes), name=name)


def weighted(y, c, name):
    """``sum(C * Y)`` with ``C`` a placeholder of ``y``'s shape."""
    axes = [te.reduce_axis(n, f"{name}_s{d}") for d, n in enumerate(y.shape)]
    return te.compute((), lambda: te.sum(c[tuple(axes)] * y[tuple(axes)], axis=axes),
                      name=name)


def run(outputs, inputs, feed):
    """The kernel's and the evaluator's values of ``outputs``."""
    kernel = codegen.build(outputs, inputs)
    got = kernel(*[feed[t] for t in inputs])
    want = te.evaluate(list(outputs), feed)
    return got, want


def assert_same(got, want, names):
    for g, w, n in zip(got, want, names):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=n)


# ---- C14: reductions over one point (collapsed) and over none -----------------------


def _argmax_pair():
    """A user ``(value, index)`` reducer: the larger value, then the smaller index."""
    return te.comm_reducer(
        lambda x, y: (te.if_then_else(te.any(x[0] > y[0], te.all(x[0] == y[0], x[1] <= y[1])),
                                      x[0], y[0]),
                      te.if_then_else(te.any(x[0] > y[0], te.all(x[0] == y[0], x[1] <= y[1])),
                                      x[1], y[1])),
        lambda vd, idd: (te.const(-np.inf, vd), te.const(2**62, idd)), name="argmax_pair")


def test_c14_single_point_reductions_write_every_output():
    # C14 itself: M[i] = max_{k<1} X[i, k], L = sum M; the kernel of [L, dX]
    X = ph((3, 1), "X")
    k = te.reduce_axis(1, "k")
    M = te.compute((3,), lambda i: te.max(X[i, k], axis=k), name="M")
    L = total(M, "L")
    (dX,) = te.differentiate(L, [X])
    # variant: a user (value, index) reducer over one point, its index read by a gather
    A = ph((3, 1), "A")
    T = ph((4,), "T")
    ka = te.reduce_axis(1, "ka")
    V, IX = te.compute((3,), lambda i: _argmax_pair()((A[i, ka], ka + i), axis=ka), name="VI")
    G = te.compute((3,), lambda i: T[IX[i]] * V[i], name="G")
    LG = total(G, "LG")
    dA, dT = te.differentiate(LG, [A, T])
    # variant: te.nn.max over an axis of extent 1, a 1x1 max pool, a min whose
    # equality where= leaves one point (solved away), and an empty max (identity)
    B = ph((2, 1, 3), "B")
    NM = te.nn.max(B, axis=1)
    P = ph((1, 2, 3, 3), "P")
    MP = te.nn.max_pool2d(P, 1)
    Q = ph((4, 5), "Q")
    kq = te.reduce_axis(5, "kq")
    MQ = te.compute((4,), lambda i: te.min(Q[i, kq], axis=kq, where=kq == i + 1), name="MQ")
    ke = te.reduce_axis(5, "ke")
    ME = te.compute((4,), lambda i: te.max(Q[i, ke], axis=ke, where=ke > i + 7), name="ME")
    LB = total(NM, "LB")
    LP = total(MP, "LP")
    LQ = total(MQ, "LQ")
    CE = ph((4,), "CE")
    LE = te.compute((), lambda: te.sum(te.if_then_else(ME[ke] > -np.inf, ME[ke], 0.0) * CE[ke],
                                       axis=ke, where=ke < 4), name="LE")
    dB, dP, dQ, dQe = (te.differentiate(LB, [B])[0], te.differentiate(LP, [P])[0],
                       te.differentiate(LQ, [Q])[0], te.differentiate(LE, [Q])[0])
    rng = np.random.default_rng(0)
    feed = {X: np.array([[0.3], [-0.7], [2.0]]), A: rng.normal(size=(3, 1)),
            T: rng.normal(size=4), B: rng.normal(size=(2, 1, 3)),
            P: rng.normal(size=(1, 2, 3, 3)), Q: rng.normal(size=(4, 5)),
            CE: rng.normal(size=4)}
    outs = [L, dX, V, IX, G, dA, dT, NM, dB, MP, dP, MQ, dQ, ME, dQe]
    got, want = run(outs, [X, A, T, B, P, Q, CE], feed)
    assert_same(got, want, [t.name for t in outs])
    np.testing.assert_array_equal(got[1], [[1.0], [1.0], [1.0]])      # the C14 values
    np.testing.assert_array_equal(got[3], [0, 1, 2])                  # the index output
    np.testing.assert_array_equal(got[13], np.full(4, -np.inf))       # the empty max
    np.testing.assert_array_equal(got[14], np.zeros((4, 5)))
    for loss, x, g in ((L, X, got[1]), (LG, A, got[5]), (LG, T, got[6]), (LB, B, got[8]),
                       (LP, P, got[10]), (LQ, Q, got[12])):
        np.testing.assert_allclose(g, numeric_gradient(loss, x, feed), rtol=1e-6, atol=1e-8,
                                   err_msg=f"d{loss.name}/d{x.name}")


# ---- NaN and infinities through max/min ----------------------------------------------


def test_max_min_propagate_nan_with_and_without_the_gradient():
    X = ph((5, 3), "X")
    k = te.reduce_axis(3, "k")
    M = te.compute((5,), lambda i: te.max(X[i, k], axis=k), name="M")
    N = te.compute((5,), lambda i: te.min(X[i, k], axis=k), name="N")
    C = ph((5,), "C")
    k2 = te.reduce_axis(5, "k2")
    L = te.compute((), lambda: te.sum((M[k2] + N[k2]) * C[k2], axis=k2), name="L")
    (dX,) = te.differentiate(L, [X])
    x = np.array([[np.nan, 3.0, np.nan],      # NaN first: it is the max and the min
                  [1.0, 5.0, np.nan],         # NaN last
                  [-np.inf, -np.inf, -np.inf],  # all -inf: the first point is the argmax
                  [np.inf, 2.0, np.inf],
                  [4.0, -1.0, 4.0]])          # a tie: the first point wins
    feed = {X: x, C: np.arange(1.0, 6.0)}
    kernel_fwd = codegen.build([M, N], [X])
    kernel_both = codegen.build([M, N, L, dX], [X, C])
    fwd = kernel_fwd(x)
    both = kernel_both(x, feed[C])
    want = te.evaluate([M, N, L, dX], feed)
    want_raw = te.evaluate(list(te.differentiate(L, [X], simplify=False)), feed)
    for got in (fwd, both[:2]):
        assert_same(got, want[:2], ["M", "N"])
    np.testing.assert_array_equal(want[0], [np.nan, np.nan, -np.inf, np.inf, 4.0])
    np.testing.assert_array_equal(want[1], [np.nan, np.nan, -np.inf, 2.0, -1.0])
    assert_same(both[2:], want[2:], ["L", "dX"])
    np.testing.assert_array_equal(want_raw[0], want[3])
    # the first NaN point takes the whole adjoint of the max and of the min
    np.testing.assert_array_equal(want[3], [[2.0, 0, 0], [0, 0, 4.0], [6.0, 0, 0],
                                            [4.0, 4.0, 0], [5.0, 5.0, 0]])


# ---- IEEE: no folding that is wrong for non-finite values ------------------------------


def test_written_zero_factors_keep_ieee_semantics():
    X = ph((4,), "X")
    W = ph((4, 3), "W")
    k = te.reduce_axis(3, "k")
    outs = [te.compute((4,), lambda i: X[i] * 0.0, name="Y1"),
            te.compute((4,), lambda i: 0.0 / X[i], name="Y2"),
            te.compute((4,), lambda i: X[i] * -0.0, name="Y3"),
            # variants: inside a sum, behind a cast, in a gradient's head
            te.compute((4,), lambda i: te.sum(W[i, k] * 0.0 + X[i] * 0.0, axis=k), name="Y4"),
            te.compute((4,), lambda i: te.cast(te.cast(0.0, "float32"), F) * X[i] + 1.0,
                       name="Y5")]
    k4 = te.reduce_axis(4, "k4")
    L = te.compute((), lambda: te.sum(outs[0][k4] * 0.0 + X[k4], axis=k4), name="L")
    (dX,) = te.differentiate(L, [X])
    x = np.array([np.inf, np.nan, -np.inf, 2.0])
    w = np.array([[1.0, np.inf, 0.0], [0.0, 0.0, 0.0], [np.nan, 1.0, 1.0], [1.0, 2.0, 3.0]])
    feed = {X: x, W: w}
    raw = te.evaluate(outs, feed)
    simplified = te.evaluate(te.simplify.simplify(outs), feed)
    got, want = run(outs + [dX], [X, W], feed)
    assert_same(simplified, raw, [t.name for t in outs])
    assert_same(got, want, [t.name for t in outs] + ["dX"])
    np.testing.assert_array_equal(raw[0], [np.nan, np.nan, np.nan, 0.0])
    np.testing.assert_array_equal(raw[1], [0.0, np.nan, -0.0, 0.0])
    np.testing.assert_array_equal(raw[3], [np.nan, np.nan, np.nan, 0.0])
    np.testing.assert_array_equal(raw[4], [np.nan, np.nan, np.nan, 1.0])
    # the gradient of x * 0.0 at x = inf is 0.0 * head, a number: dX = 0 * 0 + 1
    np.testing.assert_array_equal(got[5], te.evaluate(
        list(te.differentiate(L, [X], simplify=False)), feed)[0])


def test_derivative_polynomials_are_not_distributed_over_an_infinite_adjoint():
    # fuzz seed 7000001231: tanh's derivative 1 - t*t was distributed over the
    # adjoint, d + d * (0 - t*t), which is inf - inf = NaN for an infinite d where
    # the raw d * (1 - t*t) is +-inf; variants: sigmoid's s * (1 - s), a user-written
    # polynomial, and a select-guarded one (the guard lifts, the sum stays whole)
    X = ph((4,), "X")
    V = ph((4,), "V")
    Y = te.compute((4,), lambda i: te.tanh(X[i]) * V[i], name="Y")
    S = te.compute((4,), lambda i: te.sigmoid(X[i]) * V[i], name="S")
    P = te.compute((4,), lambda i: (X[i] - X[i] * X[i] * X[i]) * V[i], name="P")
    G = te.compute((4,), lambda i: te.if_then_else(X[i] > 0.0, X[i] * X[i] - 3.0 * X[i], 0.0)
                   * V[i], name="G")
    grads = [g for t in (Y, S, P, G) for g in te.differentiate(total(t, f"L{t.name}"), [X])]
    x = np.array([-1.25, 0.5, 2.0, 0.75])
    v = np.array([np.inf, -np.inf, np.inf, 1.0])
    feed = {X: x, V: v}
    raw = te.evaluate([g for t in (Y, S, P, G)
                       for g in te.differentiate(total(t, f"L{t.name}"), [X], simplify=False)],
                      feed)
    got, want = run(grads, [X, V], feed)
    names = ["dtanh", "dsigmoid", "dpoly", "dselect"]
    assert_same(want[:3], raw[:3], names)
    assert_same(got, want, names)
    # where X <= 0 the raw select(c, d, 0) * inf is NaN, the simplified term absent
    # (a symbolic zero, docs/conventions.md "Zeros"); elsewhere +-inf, as the raw
    np.testing.assert_array_equal(raw[3], [np.nan, np.inf, np.inf, -1.5])
    np.testing.assert_array_equal(want[3], [0.0, np.inf, np.inf, -1.5])
    t = np.tanh(x[:3])
    np.testing.assert_array_equal(raw[0][:3], v[:3] * (1 - t * t))  # +-inf, no NaN
    assert not np.isnan(np.concatenate(raw[:3])).any()


# ---- out-of-range data-dependent indices: an error on every path -------------------------


def test_gradient_scatters_check_data_dependent_indices():
    X = ph((4,), "X")
    X2 = ph((3, 4), "X2")
    I = ph((3,), "I", "int64")
    C = ph((3,), "C")
    Y = te.compute((3,), lambda i: X[I[i]], name="Y")
    Y2 = te.compute((3,), lambda i: X2[I[i] % 3, I[i]] * 2.0, name="Y2")
    L = weighted(Y, C, "L")                 # the gradient reads C, never X
    L2 = total(te.compute((3,), lambda i: Y2[i] * Y2[i], name="Y2sq"), "L2")
    (dX,) = te.differentiate(L, [X])
    (dX2,) = te.differentiate(L2, [X2])
    kernel = codegen.build([dX, dX2], [X, X2, I, C])
    rng = np.random.default_rng(1)
    feed = {X: rng.normal(size=4), X2: rng.normal(size=(3, 4)), C: rng.normal(size=3)}
    ok = np.array([3, 0, 3])
    got = kernel(feed[X], feed[X2], ok, feed[C])
    feed[I] = ok
    assert_same(got, te.evaluate([dX, dX2], feed), ["dX", "dX2"])
    np.testing.assert_allclose(got[0], numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-8)
    for bad in (np.array([0, 4, 1]), np.array([-1, 0, 1]), np.array([0, 1, 2**40])):
        feed[I] = bad
        with pytest.raises(te.OutOfBoundsError, match="I"):
            kernel(feed[X], feed[X2], bad, feed[C])
        for t in (Y, dX):  # the forward and the (simplified) gradient alike
            with pytest.raises(te.OutOfBoundsError):
                te.evaluate(t, feed)


# ---- int64 index arithmetic --------------------------------------------------------------


def test_index_arithmetic_that_leaves_int64_is_rejected_at_build():
    X = ph((4,), "X")
    big = 2**62 - 5
    cases = [
        te.compute((4,), lambda i: X[te.min(i * big, 3)], name="Ymin"),
        te.scatter_add((4,), F, (4,), lambda p: te.min(p * big, 3), lambda p: X[p], name="S"),
        te.compute((4,), lambda i: te.if_then_else(i * big + big < 0, 0.0, X[i]), name="Ycond"),
    ]
    # loaded values are bounded by their run-time check (+-2**31) only
    I = ph((3,), "I", "int64")
    cases.append(te.compute((3,), lambda i: X[(I[i] * I[i] * I[i]) % 4], name="Ycube"))
    cases.append(te.compute((3,), lambda i: X[(I[i] * 2**40) % 4], name="Ybig"))
    for y in cases:
        inputs = [X, I] if y.name in ("Ycube", "Ybig") else [X]
        with pytest.raises(te.TexprError, match=f"stage {y.name}: the index arithmetic"):
            codegen.build([y], inputs)


def test_data_dependent_index_arithmetic_is_checked_at_run_time():
    X = ph((6,), "X")
    I = ph((3,), "I", "int64")
    Y = te.compute((3,), lambda i: X[I[i] + 1], name="Y")
    Y2 = te.compute((3,), lambda i: X[(I[i] * 2**20 + i) % 6], name="Y2")
    Y3 = te.compute((3,), lambda i: X[te.cast(te.floor(X[i] * 2.0), "int64") % 6], name="Y3")
    L = total(Y, "L")
    (dX,) = te.differentiate(L, [X])
    kernel = codegen.build([Y, Y2, Y3, dX], [X, I])
    x = np.arange(6.0) / 4
    idx = np.array([0, 4, 2])
    assert_same(kernel(x, idx), te.evaluate([Y, Y2, Y3, dX], {X: x, I: idx}),
                ["Y", "Y2", "Y3", "dX"])
    with pytest.raises(te.OutOfBoundsError, match="index arithmetic"):
        kernel(x, np.array([0, 2**40, 2]))
    with pytest.raises(te.OutOfBoundsError, match="index arithmetic"):
        kernel(np.array([np.nan, 0, 0, 0, 0, 0.0]), idx)


# ---- valid programs that failed to build -------------------------------------------------


@pytest.mark.parametrize("n,m,kext,off", [(4, 5, 3, 0), (5, 4, 4, 1), (6, 5, 3, 0)])
def test_guarded_load_and_gather_of_one_tensor_in_a_strided_sum(n, m, kext, off):
    # was: CompileError "Variable 't1_0' is not defined" (a lane statement that isl
    # placed outside the unrolled lane loop, after a residue split)
    X, W, H = ph((n, 3), "X"), ph((kext,), "W"), ph((m,), "H")
    I = ph((4,), "I", "int64")
    k = te.reduce_axis(kext, "k")

    def body(i):
        def load(e):
            return te.if_then_else(te.all(e >= 0, e < n), X[e, i % 3], 0.0)
        return te.sum((load(i + off) + load(I[i % 4])) * W[k], axis=k,
                      where=(i + k) % 2 == 0)

    Y = te.compute((m,), body, name="Y")
    L = weighted(Y, H, "L")
    dX, dW = te.differentiate(L, [X, W])
    rng = np.random.default_rng(n)
    feed = {X: rng.normal(size=(n, 3)), W: rng.normal(size=kext), H: rng.normal(size=m),
            I: np.array([3, 0, 2, 1]) % n}
    got, want = run([Y, dX, dW], [X, W, I, H], feed)
    assert_same(got, want, ["Y", "dX", "dW"])
    np.testing.assert_allclose(got[1], numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got[2], numeric_gradient(L, W, feed), rtol=1e-6, atol=1e-8)


def _clamp(e, lo, hi):
    return te.max(te.min(e, hi), lo)


@pytest.mark.parametrize("variant", ["case", "three_rows", "two_axes"])
def test_clamped_strided_indices_build(variant):
    # was: a raw islpy Error (isl_ast_build_node_from_schedule_map failed inside
    # isl_map_simplify) while building the gradient
    rows = 3 if variant == "three_rows" else 2
    X, H = ph((rows, 5), "X"), ph((5, 3), "H")
    k = te.reduce_axis(3, "k")
    if variant == "case":
        S = te.compute((5, 3), lambda a, b: te.sum(
            X[_clamp(1 - 2 * a, 0, 1), _clamp((2 * k + 1) % 3 + a, 0, 4)], axis=k), name="S")
    elif variant == "three_rows":
        S = te.compute((5, 3), lambda a, b: te.sum(
            X[_clamp(3 - 2 * a, 0, 2), _clamp((2 * k) % 3 + a, 0, 4)], axis=k), name="S")
    else:
        S = te.compute((5, 3), lambda a, b: te.sum(
            X[_clamp(1 - 2 * a + b, 0, 1), _clamp((2 * k + 1) % 3 + a, 0, 4)] * (b + 1.0),
            axis=k), name="S")
    L = weighted(S, H, "L")
    (dX,) = te.differentiate(L, [X])
    rng = np.random.default_rng(3)
    feed = {X: rng.normal(size=(rows, 5)), H: rng.normal(size=(5, 3))}
    got, want = run([S, dX], [X, H], feed)
    assert_same(got, want, ["S", "dX"])
    np.testing.assert_allclose(got[1], numeric_gradient(L, X, feed), rtol=1e-6, atol=1e-8)


# ---- feeds and outputs --------------------------------------------------------------------


def test_big_endian_feeds_and_repeated_outputs():
    X = te.placeholder((2, 3), "X")  # float32
    I = te.placeholder((2,), "I", "int64")
    Y = te.compute((2, 3), lambda i, j: X[I[i], j] * 2.0, name="Y")
    kernel = codegen.build([Y, Y, X], [X, I])
    x = np.arange(6, dtype=">f4").reshape(2, 3)
    idx = np.array([1, 0], dtype=">i8")
    want = te.evaluate(Y, {X: x, I: idx})
    y1, y2, xo = kernel(x, idx)
    np.testing.assert_array_equal(y1, [[6, 8, 10], [0, 2, 4]])
    np.testing.assert_array_equal(y1, want)
    assert y1 is not y2 and not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(y2, y1)
    np.testing.assert_array_equal(xo, x)
    assert y1.dtype == np.float32 and y1.dtype.isnative
    with pytest.raises(te.FeedError, match="masked"):
        kernel(np.ma.masked_array(np.zeros((2, 3), "float32")), idx)
    with pytest.raises(te.FeedError, match="masked"):
        te.evaluate(Y, {X: np.ma.masked_array(np.zeros((2, 3), "float32")), I: idx})
