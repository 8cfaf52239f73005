"""The reference evaluator: every node kind against hand-written numpy."""

import math
import time

import numpy as np
import pytest

import texpr as te

RNG = np.random.default_rng(0)


def _x(shape, dtype="float64", low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape).astype(dtype)


@pytest.mark.parametrize("fn,ref", [
    (lambda a, b: a + b, np.add), (lambda a, b: a - b, np.subtract),
    (lambda a, b: a * b, np.multiply), (lambda a, b: a / b, np.divide),
    (lambda a, b: te.min(a, b), np.minimum), (lambda a, b: te.max(a, b), np.maximum),
    (lambda a, b: a // b, np.floor_divide), (lambda a, b: a % b, np.mod),
    (lambda a, b: te.power(te.abs(a), b), lambda a, b: np.abs(a) ** b),
])
def test_binary_float(fn, ref):
    A = te.placeholder((5, 3), name="A", dtype="float64")
    B = te.placeholder((5, 3), name="B", dtype="float64")
    C = te.compute((5, 3), lambda i, j: fn(A[i, j], B[i, j]), name="C")
    a, b = _x((5, 3)), _x((5, 3), low=0.5, high=2.0)
    np.testing.assert_allclose(te.evaluate(C, {A: a, B: b}), ref(a, b), rtol=1e-12)


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "abs",
                                  "floor", "ceil", "round", "trunc", "sin", "cos", "erf"])
def test_intrinsics(name):
    A = te.placeholder((7,), name="A", dtype="float64")
    C = te.compute((7,), lambda i: getattr(te, name)(A[i]), name="C")
    a = np.array([0.1, 0.5, 1.5, 2.5, 3.7, 0.25, 1.0])
    refs = {"rsqrt": lambda x: 1 / np.sqrt(x), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
            "erf": np.vectorize(math.erf)}
    ref = refs.get(name, getattr(np, name, None))
    np.testing.assert_allclose(te.evaluate(C, {A: a}), ref(a), rtol=1e-12)


def test_floor_semantics_on_negative_operands():
    C = te.compute((13,), lambda i: (i - 6) // 4, name="C")
    D = te.compute((13,), lambda i: (i - 6) % 4, name="D")
    E_ = te.compute((13,), lambda i: (i - 6) // -4, name="E")
    F = te.compute((13,), lambda i: (i - 6) % -4, name="F")
    v = np.arange(13) - 6
    c, d, e, f = te.evaluate([C, D, E_, F], {})
    np.testing.assert_array_equal(c, [x // 4 for x in v])
    np.testing.assert_array_equal(d, [x % 4 for x in v])
    np.testing.assert_array_equal(e, [x // -4 for x in v])
    np.testing.assert_array_equal(f, [x % -4 for x in v])
    fl = te.placeholder((4,), name="fl", dtype="float64")
    G = te.compute((4,), lambda i: fl[i] // 2.0 + fl[i] % 2.0 * 100, name="G")
    x = np.array([-3.5, -1.0, 1.0, 3.5])
    np.testing.assert_allclose(te.evaluate(G, {fl: x}), x // 2.0 + (x % 2.0) * 100)


def test_integer_division_by_zero_is_an_error_only_where_taken():
    A = te.placeholder((3,), name="A", dtype="int64")
    C = te.compute((3,), lambda i: te.if_then_else(A[i] != 0, 12 // A[i], -1), name="C")
    np.testing.assert_array_equal(te.evaluate(C, {A: np.array([0, 3, -5])}), [-1, 4, -3])
    D = te.compute((3,), lambda i: 12 // A[i], name="D")
    with pytest.raises(te.TexprError, match="division by zero"):
        te.evaluate(D, {A: np.array([0, 3, -5])})


def test_comparisons_logic_and_casts():
    A = te.placeholder((6,), name="A", dtype="float64")
    C = te.compute((6,), lambda i: te.cast(te.any(te.all(A[i] > 0, ~(A[i] >= 1)), A[i] == -1), "int32"),
                   name="C")
    a = np.array([-1, -0.5, 0.5, 1.0, 2.0, 0.0])
    np.testing.assert_array_equal(te.evaluate(C, {A: a}),
                                  (((a > 0) & ~(a >= 1)) | (a == -1)).astype("int32"))
    T = te.compute((6,), lambda i: te.cast(A[i] * 2.7, "int64"), name="T")
    np.testing.assert_array_equal(te.evaluate(T, {A: a}), (a * 2.7).astype("int64"))


def test_guarded_loads_at_the_borders():
    X = te.placeholder((5,), name="X", dtype="float64")
    Y = te.compute((7,), lambda i: te.if_then_else(te.all(i >= 1, i - 1 < 5), X[i - 1], 0.0),
                   name="Y")
    x = np.arange(1.0, 6.0)
    np.testing.assert_array_equal(te.evaluate(Y, {X: x}), [0, 1, 2, 3, 4, 5, 0])
    # the short-circuit of && guards the load too
    Z = te.compute((7,), lambda i: te.if_then_else(te.all(i >= 1, i <= 5, X[te.min(i - 1, 4)] > 2),
                                                      1.0, 0.0), name="Z")
    np.testing.assert_array_equal(te.evaluate(Z, {X: x}), [0, 0, 0, 1, 1, 1, 0])


def test_unguarded_out_of_bounds_load_names_tensor_and_index():
    X = te.placeholder((5,), name="X")
    Y = te.compute((5,), lambda i: X[i + 1], name="Y")
    with pytest.raises(te.OutOfBoundsError, match=r"X\[i \+ 1\].*\(5,\).*i=4"):
        te.evaluate(Y, {X: np.zeros(5, "float32")})


def test_select_untaken_branch_makes_no_nan_or_warning():
    X = te.placeholder((3,), name="X", dtype="float64")
    Y = te.compute((3,), lambda i: te.if_then_else(X[i] > 0, te.sqrt(X[i]), X[i]), name="Y")
    with np.errstate(all="raise"):
        out = te.evaluate(Y, {X: np.array([-1.0, 4.0, -4.0])})
    np.testing.assert_array_equal(out, [-1.0, 2.0, -4.0])


def test_reductions_with_where_and_empty_domains():
    X = te.placeholder((3, 4), name="X", dtype="float64")
    x = _x((3, 4))
    k = te.reduce_axis(4, "k")
    S = te.compute((3, 4), lambda i, j: te.sum(X[i, k], axis=k, where=k <= j), name="S")
    np.testing.assert_allclose(te.evaluate(S, {X: x}), np.cumsum(x, 1))
    P = te.compute((3,), lambda i: te.prod(X[i, k], axis=k), name="P")
    np.testing.assert_allclose(te.evaluate(P, {X: x}), x.prod(1))
    Mx = te.compute((3,), lambda i: te.max(X[i, k], axis=k), name="Mx")
    Mn = te.compute((3,), lambda i: te.min(X[i, k], axis=k), name="Mn")
    np.testing.assert_allclose(te.evaluate(Mx, {X: x}), x.max(1))
    np.testing.assert_allclose(te.evaluate(Mn, {X: x}), x.min(1))
    e = te.reduce_axis(0, "e")
    Z = te.compute((3,), lambda i: te.sum(X[i, e], axis=e), name="Z")
    M = te.compute((3,), lambda i: te.max(X[i, e], axis=e), name="M")
    z, m = te.evaluate([Z, M], {X: x})
    np.testing.assert_array_equal(z, 0)
    assert np.all(m == -np.inf)
    W = te.compute((3,), lambda i: te.sum(X[i, k], axis=k, where=k > 10), name="W")
    np.testing.assert_array_equal(te.evaluate(W, {X: x}), 0)


def test_reduce_axis_with_lower_bound_and_multiple_axes():
    X = te.placeholder((4, 6), name="X", dtype="float64")
    r = te.reduce_axis((2, 5), "r")
    a = te.reduce_axis(4, "a")
    Y = te.compute((), lambda: te.sum(X[a, r], axis=[a, r]), name="Y")
    x = _x((4, 6))
    np.testing.assert_allclose(te.evaluate(Y, {X: x}), x[:, 2:5].sum())


def test_tuple_reducer_argmax():
    argmax = te.comm_reducer(
        lambda x, y: (te.select(x[0] >= y[0], x[0], y[0]), te.select(x[0] >= y[0], x[1], y[1])),
        lambda vd, idt: (te.const(-np.inf, vd), te.const(-1, idt)), name="argmax")
    X = te.placeholder((3, 5), name="X", dtype="float64")
    k = te.reduce_axis(5, "k")
    V, I = te.compute((3,), lambda i: argmax((X[i, k], k), axis=k), name="am")
    x = np.array([[1, 3, 3, 0, 2], [5, 1, 1, 1, 5], [0, 0, 0, 0, 1.0]])
    v, idx = te.evaluate([V, I], {X: x})
    np.testing.assert_array_equal(v, x.max(1))
    np.testing.assert_array_equal(idx, x.argmax(1))  # first occurrence wins


def test_custom_reducer_with_where():
    lse = te.comm_reducer(lambda a, b: te.log(te.exp(a) + te.exp(b)),
                          lambda d: te.const(-np.inf, d), name="logaddexp")
    X = te.placeholder((2, 4), name="X", dtype="float64")
    k = te.reduce_axis(4, "k")
    Y = te.compute((2,), lambda i: lse(X[i, k], axis=k, where=k % 2 == 0), name="Y")
    x = _x((2, 4))
    np.testing.assert_allclose(te.evaluate(Y, {X: x}), np.logaddexp(x[:, 0], x[:, 2]))


def test_data_dependent_index_and_scatter_add():
    X = te.placeholder((4,), name="X", dtype="float64")
    I = te.placeholder((3,), name="I", dtype="int32")
    Y = te.compute((3,), lambda k: X[I[k]], name="Y")
    x = np.array([10.0, 20.0, 30.0, 40.0])
    np.testing.assert_array_equal(te.evaluate(Y, {X: x, I: np.array([3, 0, 3], "int32")}),
                                  [40, 10, 40])
    H = te.placeholder((3,), name="H", dtype="float64")
    S = te.scatter_add((4,), "float64", (3,), lambda p: I[p], lambda p: H[p], name="S")
    out = te.evaluate(S, {H: np.array([1.0, 2.0, 3.0]), I: np.array([3, 0, 3], "int32")})
    np.testing.assert_array_equal(out, [2.0, 0.0, 0.0, 4.0])


def test_scalar_tensors():
    X = te.placeholder((), name="X", dtype="float64")
    Y = te.compute((), lambda: X[()] * 2 + 1, name="Y")
    assert te.evaluate(Y, {X: np.array(3.0)}) == 7.0


def test_empty_tensors():
    X = te.placeholder((2, 0), name="X", dtype="float64")
    k = te.reduce_axis(0, "k")
    Y = te.compute((2,), lambda i: te.sum(X[i, k], axis=k), name="Y")
    Z = te.compute((2, 0), lambda i, j: X[i, j] * 2, name="Z")
    y, z = te.evaluate([Y, Z], {X: np.zeros((2, 0))})
    np.testing.assert_array_equal(y, [0, 0])
    assert z.shape == (2, 0)


def test_feed_errors():
    X = te.placeholder((2, 3), name="X")
    Y = te.compute((2, 3), lambda i, j: X[i, j] + 1, name="Y")
    with pytest.raises(te.FeedError, match="no value fed for placeholder X"):
        te.evaluate(Y, {})
    with pytest.raises(te.FeedError, match=r"expects shape \(2, 3\)"):
        te.evaluate(Y, {X: np.zeros((3, 2), "float32")})
    with pytest.raises(te.FeedError, match="expects dtype float32, got float64"):
        te.evaluate(Y, {X: np.zeros((2, 3))})
    # Python lists are converted to the declared dtype
    out = te.evaluate(Y, {X: [[1, 2, 3], [4, 5, 6]]})
    assert out.dtype == np.float32


def test_conv2d_full_size_is_fast_and_exact():
    N, C, H, W, F = 32, 16, 28, 28, 32
    X = te.placeholder((N, C, H, W), name="X")
    K = te.placeholder((F, C, 3, 3), name="K")
    rc, kh, kw = te.reduce_axis(C, "rc"), te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw")

    def body(n, f, h, w):
        hh, ww = h + kh - 1, w + kw - 1
        inside = te.all(hh >= 0, hh < H, ww >= 0, ww < W)
        return te.sum(te.if_then_else(inside, X[n, rc, hh, ww], 0.0) * K[f, rc, kh, kw],
                      axis=[rc, kh, kw])

    Y = te.compute((N, F, H, W), body, name="conv")
    x = RNG.normal(size=(N, C, H, W)).astype("float32")
    k = RNG.normal(size=(F, C, 3, 3)).astype("float32")
    t0 = time.perf_counter()
    y = te.evaluate(Y, {X: x, K: k})
    elapsed = time.perf_counter() - t0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((N, F, H, W))
    for a in range(3):
        for b in range(3):
            ref += np.einsum("nchw,fc->nfhw", xp[:, :, a:a + H, b:b + W], k[:, :, a, b])
    rel = np.abs(y - ref).max() / np.abs(ref).max()
    assert rel < 1e-5
    assert elapsed < 5.0, f"conv2d evaluation took {elapsed:.2f} s"


@pytest.mark.parametrize("domain,where,want", [((), None, 2.5), ((), False, 0.0),
                                               ((3,), None, 7.5), ((3,), "odd", 2.5)])
def test_scatter_add_into_a_0d_output(domain, where, want):
    # a 0-d scatter-add (the support form of a scalar with an empty or full domain,
    # which the simplifier builds) adds every point into the one element, in the
    # evaluator and in a kernel
    from texpr import codegen

    X = te.placeholder((), "X", dtype="float64")
    fw = None if where is None else (
        (lambda *p: te.const(False)) if where is False else (lambda p: p % 2 == 1))
    S = te.scatter_add((), "float64", domain, lambda *p: (), lambda *p: X[()] * 1.0,
                       where=fw, name="S")
    x = np.array(2.5)
    assert te.evaluate(S, {X: x}) == want
    assert codegen.build([S], [X])(x)[0] == want


@pytest.mark.parametrize("scale", [0.1, 10 / 3, 0.7])
def test_weak_float_constants_at_the_operations_precision(scale):
    # i * s in a float64 expression multiplies by s, not by float32(s): the
    # evaluator agrees with the kernel and numpy (a float-computed resize index,
    # floor(i * 10/3), once differed at i = 3, 6, ... between them)
    from texpr import codegen

    n, m = 100, 30
    X = te.placeholder((n,), "X", dtype="float64")
    F = te.compute((m,), lambda i: i * scale, name="F")
    Y = te.compute((m,), lambda i: X[te.min(te.cast(te.floor(i * scale), "int64"), n - 1)],
                   name="Y")
    x = np.arange(n, dtype="float64")
    want_f = np.arange(m) * scale
    want_y = x[np.minimum(np.floor(np.arange(m) * scale).astype(int), n - 1)]
    got_f, got_y = te.evaluate([F, Y], {X: x})
    np.testing.assert_array_equal(got_f, want_f)
    np.testing.assert_array_equal(got_y, want_y)
    kf, ky = codegen.build([F, Y], [X])(x)
    np.testing.assert_array_equal(kf, want_f)
    np.testing.assert_array_equal(ky, want_y)


def test_symbolic_zero_products_is_an_oracle_switch_restored_on_exit():
    from texpr.testing import symbolic_zero_products
    X = te.placeholder((4,), "X", "float64")
    Y = te.compute((4,), lambda i: X[i] * te.if_then_else(X[i] > 1.0, 2.0, 0.0), name="Y")
    I = te.placeholder((4,), "I", "int64")
    N = te.compute((4,), lambda i: I[i] * 0, name="N")   # int products are exact anyway
    x = np.array([np.inf, np.nan, -np.inf, 2.0])
    feed = {X: x, I: np.arange(4)}
    np.testing.assert_array_equal(te.evaluate(Y, feed), [np.inf, np.nan, np.nan, 4.0])
    with symbolic_zero_products():
        np.testing.assert_array_equal(te.evaluate(Y, feed), [np.inf, 0.0, 0.0, 4.0])
        np.testing.assert_array_equal(te.evaluate(N, feed), [0, 0, 0, 0])
    np.testing.assert_array_equal(te.evaluate(Y, feed), [np.inf, np.nan, np.nan, 4.0])


def _select_chain(depth, gathered=True):
    """``Y[i] = select(0 <= I[i] < 64, chain(X[I[i]]), 0)``, each level of the chain
    ``select(v > 0.1, tanh(v) * v, v * 0.5 - 0.1)``: its gradient is a DAG whose
    shared nodes are reached under many masks. Returns (graph, feed)."""
    X = te.placeholder((64,), "X", "float64")
    I = te.placeholder((64,), "I", "int64")

    def chain(v):
        for _ in range(depth):
            v = te.select(v > 0.1, te.tanh(v) * v, v * 0.5 - 0.1)
        return v
    Y = te.compute((64,), lambda i: te.select(te.all(I[i] >= 0, I[i] < 64),
                                              chain(X[I[i]]), 0.0), name="Y")
    k = te.reduce_axis(64, "k")
    L = te.compute((), lambda: te.sum(Y[k] * Y[k], axis=k), name="L")
    feed = {X: RNG.standard_normal(64), I: RNG.integers(-3, 67, 64)}
    return [Y, L] + list(te.differentiate(L, [X], simplify=False)), feed, (X, I)


def test_a_select_chain_is_evaluated_once_per_node_not_once_per_path(monkeypatch):
    # a node shared by both branches of a select was evaluated again under every
    # mask it was reached with: 16x per level of the chain's gradient (19 s at
    # depth 5). Now the work grows linearly with the depth: counted, not timed
    import importlib
    ev = importlib.import_module("texpr.evaluate")
    calls = [0]
    inner = ev._StageEval._eval

    def counted(self, e, mask):
        calls[0] += 1
        return inner(self, e, mask)
    monkeypatch.setattr(ev._StageEval, "_eval", counted)
    counts = {}
    for depth in (4, 8):
        graph, feed, _ = _select_chain(depth)
        calls[0] = 0
        te.evaluate(graph, feed)
        counts[depth] = calls[0]
    assert counts[8] < 2.5 * counts[4], counts


def test_a_select_chain_gradient_equals_finite_differences():
    graph, feed, (X, _) = _select_chain(6)
    dx = te.evaluate(graph[2], feed)
    x, eps = feed[X], 1e-6
    for j in (0, 5, 17, 40):
        up, dn = x.copy(), x.copy()
        up[j] += eps
        dn[j] -= eps
        fd = (te.evaluate(graph[1], {**feed, X: up}) - te.evaluate(graph[1], {**feed, X: dn}))
        np.testing.assert_allclose(dx[j], fd / (2 * eps), rtol=1e-5, atol=1e-7)


def test_a_shared_load_raises_where_a_later_mask_reaches_outside_the_tensor():
    # X[I[i]] is shared: first reached where I[i] is in range (no error), then by
    # a second select whose condition also lets an out-of-range I[i] through.
    # The second reach is not within the first's points: it is evaluated there
    # and raises, naming the point
    X = te.placeholder((4,), "X")
    I = te.placeholder((3,), "I", "int64")

    def body(i):
        g = X[I[i]]
        inside = te.all(I[i] >= 0, I[i] < 4)
        return te.select(inside, g, 0.0) + te.select(I[i] != 0, g * 2.0, 1.0)
    Y = te.compute((3,), body, name="Y")
    x = np.array([1.0, 2.0, 3.0, 4.0], "float32")
    np.testing.assert_array_equal(te.evaluate(Y, {X: x, I: np.array([1, 0, 3])}),
                                  [2 + 4, 1 + 1, 4 + 8])
    with pytest.raises(te.OutOfBoundsError, match=r"X.*index \(7,\).*i=2"):
        te.evaluate(Y, {X: x, I: np.array([1, 0, 7])})
    # reached the other way round: the wider mask first, then the narrower one
    Z = te.compute((3,), lambda i: te.select(I[i] != 0, X[I[i]] * 2.0, 1.0)
                   + te.select(te.all(I[i] >= 0, I[i] < 4), X[I[i]], 0.0), name="Z")
    np.testing.assert_array_equal(te.evaluate(Z, {X: x, I: np.array([1, 0, 3])}),
                                  [4 + 2, 1 + 1, 8 + 4])
    with pytest.raises(te.OutOfBoundsError, match=r"X.*index \(-5,\).*i=0"):
        te.evaluate(Z, {X: x, I: np.array([-5, 0, 3])})


def test_a_guarded_nested_reduction_is_evaluated_only_where_its_branch_is_taken():
    # te.compute lifts a nested reduction into a stage of its own; te.evaluate
    # computed it over its whole grid and refused X[i - 1, d] at i = 0, "guard the
    # load with te.if_then_else", which the program does (issue 52, kind 7). The
    # compiled kernel runs it only where the guard holds; so does the evaluator now
    from texpr.codegen import build

    X = te.placeholder((4, 3), name="X", dtype="float64")
    G = te.placeholder((4,), name="G", dtype="float64")
    d = te.reduce_axis(3, name="d")
    e = te.reduce_axis(3, name="e")
    j = te.reduce_axis(4, name="j")
    # the case
    Y = te.compute((4,), lambda i: te.if_then_else(i >= 1, te.sum(X[i - 1, d], axis=d), 0.0),
                   name="Y")
    # the else branch (the build takes a guarded nested sum whose other branch is
    # zero; a data-dependent guard, another branch (a tensor, a nonzero constant) or
    # a nested max, V below, are the evaluator's alone: the build's bounds proof
    # refuses their lifted stage's load today)
    Z = te.compute((4,), lambda i: te.if_then_else(
        i >= 2, 0.0, te.sum(X[3 - 2 * i, e] * X[3 - 2 * i, e], axis=e)), name="Z")
    # nested in a reduction, guarded by its axis j (the evaluator's alone too)
    W = te.compute((4,), lambda i: te.sum(te.if_then_else(
        j >= i, te.sum(X[j - i, d] * 2.0, axis=d), 0.0), axis=j) + 0.5, name="W")
    x = np.arange(12.0).reshape(4, 3) + 1.0
    feed = {X: x}
    y, z, w = te.evaluate([Y, Z, W], feed)  # Z's sum runs at i = 0, 1: rows 3 and 1
    np.testing.assert_array_equal(y, [0.0, 6.0, 15.0, 24.0])
    np.testing.assert_array_equal(z, [100.0 + 121.0 + 144.0, 16.0 + 25.0 + 36.0, 0.0, 0.0])
    want_w = [0.5 + sum(2.0 * x[jj - i].sum() for jj in range(i, 4)) for i in range(4)]
    np.testing.assert_allclose(w, want_w, rtol=1e-15)
    kernel = build([Y, Z], [X])
    for got, want in zip(kernel(x), (y, z)):
        np.testing.assert_allclose(got, want, rtol=1e-15)
    # where the branch is taken, an index outside still raises, naming the stage
    V = te.compute((4,), lambda i: te.if_then_else(
        G[i] > 0, 1.0, te.max(X[3 - 2 * i, e], axis=e)), name="V")
    np.testing.assert_array_equal(te.evaluate(V, {X: x, G: np.array([-1.0, -1.0, 1.0, 1.0])}),
                                  [12.0, 6.0, 1.0, 1.0])
    with pytest.raises(te.OutOfBoundsError, match=r"stage V\.red0: load `X\[3 - 2 \* i, e\]`"):
        te.evaluate(V, {X: x, G: np.array([-1.0, -1.0, -1.0, 1.0])})
    # the lifted stage asked for itself is computed whole (and raises at i = 0)
    (lifted,) = Y.op.input_tensors()
    with pytest.raises(te.OutOfBoundsError, match=r"stage Y\.red0"):
        te.evaluate(lifted, feed)
    ok = te.compute((4,), lambda i: te.sum(X[i, d], axis=d) * 2.0, name="Ok")
    (lifted_ok,) = ok.op.input_tensors()
    assert lifted_ok.op.attrs.get("texpr.nested_reduction")
    np.testing.assert_array_equal(te.evaluate(lifted_ok, feed), x.sum(axis=1))
    np.testing.assert_array_equal(te.evaluate(ok, feed), 2.0 * x.sum(axis=1))


def test_feed_by_placeholder_name_as_kernels_take_them():
    # kernels take kernel(X=x); te.evaluate took only Tensor keys (issue 52, friction)
    X = te.placeholder((2, 3), name="X", dtype="float64")
    W = te.placeholder((3,), name="W", dtype="float64")
    Y = te.compute((2,), lambda i: X[i, 0] * W[1], name="Y")
    x, w = np.arange(6.0).reshape(2, 3), np.array([1.0, 2.0, 3.0])
    want = x[:, 0] * 2.0
    np.testing.assert_array_equal(te.evaluate(Y, {"X": x, "W": w}), want)
    np.testing.assert_array_equal(te.evaluate(Y, {"X": x, W: w}), want)
    with pytest.raises(te.FeedError, match=r"no placeholder of the graph is named 'Z' "
                                           r"\(placeholders: W, X\)"):
        te.evaluate(Y, {"Z": x, W: w})
    with pytest.raises(te.FeedError, match="fed twice"):
        te.evaluate(Y, {"X": x, X: x, W: w})
    X2 = te.placeholder((2,), name="X", dtype="float64")
    Y2 = te.compute((2,), lambda i: X[i, 0] + X2[i], name="Y2")
    with pytest.raises(te.FeedError, match="several placeholders are named 'X'"):
        te.evaluate(Y2, {"X": x})
    with pytest.raises(te.FeedError, match="feed key must be a placeholder Tensor or its name"):
        te.evaluate(Y, {0: x, W: w})
