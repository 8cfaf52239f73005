"""Work-optimal gradients beyond the quasi-affine fragment (issue 16).

Each kind is a general rule of the simplifier; each test builds the issue's case
or a variant, differentiates it with a placeholder head ``H``, and asserts

* the iteration count of the simplified gradient (``simplify.iteration_count``)
  against the ideal: the structurally nonzero (iteration point, input element)
  pairs, counted independently here (numpy on concrete index data), and
* the values: equal to the raw adjoint (``te.evaluate``) and to float64 central
  finite differences of ``sum(H * Y)``.
"""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.testing import numeric_jacobian

F64 = "float64"


def _feed(tensors, ints=None, seed=0):
    rng = np.random.default_rng(seed)
    feed = {}
    for op in te.topo_order(list(tensors)):
        t = op.output(0)
        if not isinstance(op, te.PlaceholderOp):
            continue
        if ints and t in ints:
            feed[t] = np.asarray(ints[t], dtype=t.dtype)
        elif t.dtype.startswith("float"):
            feed[t] = rng.uniform(-1.0, 1.0, t.shape).astype(t.dtype)
        else:
            raise AssertionError(f"give the int placeholder {t.name} data")
    return feed


def check(Y, X, ideal, ints=None, exact=True, seed=0):
    """Simplified dX of ``Y`` with a placeholder head: count <= ideal (== when
    ``exact``), values equal to the raw adjoint and to finite differences.
    Returns the simplified gradient."""
    H = te.placeholder(Y.shape, "H", dtype=F64)
    (g,) = te.differentiate(Y, [X], head=H)
    (raw,) = te.differentiate(Y, [X], head=H, simplify=False)
    count = simplify.iteration_count([g])
    assert count <= ideal, (count, ideal, te.graph_str(g))
    if exact:
        assert count == ideal, (count, ideal, te.graph_str(g))
    feed = _feed([Y, H, g, raw], ints, seed)
    got, want = te.evaluate([g, raw], feed)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    jac = numeric_jacobian(Y, X, feed)
    fd = np.tensordot(feed[H], jac, axes=len(Y.shape))
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
    return g


# ---- 1. multi-term local derivatives read by a reduction ----------------------------


def _layer(act, n=4, m=16, o=16):
    X = te.placeholder((n, m), "X", dtype=F64)
    W = te.placeholder((m, o), "W", dtype=F64)
    S = te.compute((n, m), lambda i, j: act(X[i, j]), name="S")
    k = te.reduce_axis(m, "k")
    Y = te.compute((n, o), lambda i, j: te.sum(S[i, k] * W[k, j], axis=k), name="Y")
    return Y, X


@pytest.mark.parametrize("act", [
    lambda x: te.sigmoid(x) * x,          # the case: three derivative terms
    lambda x: te.tanh(x),                 # two terms (1 - tanh^2)
    lambda x: x * te.tanh(te.exp(x)),     # a chain of intrinsics
    lambda x: te.log(x * x + 1.0) / (x * x + 2.0),  # a quotient
], ids=["silu", "tanh", "x_tanh_exp", "quotient"])
def test_multi_term_derivative_computes_the_matmul_once(act):
    # dS = H @ W^T once (4*16*16 points), then dX = dS * S'(X) (4*16)
    Y, X = _layer(act)
    g = check(Y, X, 4 * 16 * 16 + 4 * 16)
    names = [op.tag for op in simplify.materialized_stages([g])]
    assert len(names) == 2, names


def test_cheap_local_derivative_folds_into_the_reduction():
    # S = X * X: S' = 2X is cheap, so dX = sum_j H W (2 X) folds into one reduction
    # (the matmul's points only: no extra elementwise pass)
    Y, X = _layer(lambda x: x * x + x)
    check(Y, X, 4 * 16 * 16)


def test_multi_term_derivative_of_two_consumers():
    # S read by two matmuls: its adjoint is their sum (fused into one reduction over
    # the disjoint union of both domains), then one elementwise pass with S'(X)
    X = te.placeholder((3, 8), "X", dtype=F64)
    W1 = te.placeholder((8, 5), "W1", dtype=F64)
    W2 = te.placeholder((8, 6), "W2", dtype=F64)
    S = te.compute((3, 8), lambda i, j: te.sigmoid(X[i, j]) * X[i, j], name="S")
    k1, k2 = te.reduce_axis(8, "k1"), te.reduce_axis(8, "k2")
    Y1 = te.compute((3, 5), lambda i, j: te.sum(S[i, k1] * W1[k1, j], axis=k1), name="Y1")
    Y2 = te.compute((3, 6), lambda i, j: te.sum(S[i, k2] * W2[k2, j], axis=k2), name="Y2")
    Y = te.compute((3, 11), lambda i, j: te.if_then_else(j < 5, Y1[i, te.min(j, 4)],
                                                          Y2[i, te.max(j - 5, 0)]), name="Y")
    check(Y, X, 3 * 8 * 5 + 3 * 8 * 6 + 3 * 8)


# ---- 2. abs in indices and conditions ---------------------------------------------


def test_abs_in_an_index():
    # the case: |i - 1| is max(i - 1, 1 - i) for ISL (12 points, not 144)
    X = te.placeholder((12,), "X", dtype=F64)
    Y = te.compute((12,), lambda i: X[te.abs(i - 1)], name="Y")
    check(Y, X, 12)


def test_reflect_padding_written_with_abs():
    n, p = 10, 3
    X = te.placeholder((n,), "X", dtype=F64)
    Y = te.compute((n + 2 * p,), lambda i: X[n - 1 - te.abs(n - 1 - te.abs(i - p))], name="Y")
    check(Y, X, n + 2 * p)


def test_reflect_padding_2d_with_abs():
    n, p = 6, 2
    X = te.placeholder((n, n), "X", dtype=F64)

    def refl(i):
        return n - 1 - te.abs(n - 1 - te.abs(i - p))

    Y = te.compute((n + 2 * p, n), lambda i, j: X[refl(i), refl(j + p)] * 2.0, name="Y")
    check(Y, X, (n + 2 * p) * n)


@pytest.mark.parametrize("w", [0, 2])
def test_band_condition_with_abs(w):
    X = te.placeholder((12,), "X", dtype=F64)
    k = te.reduce_axis(12, "k")
    Y = te.compute((12,), lambda i: te.sum(X[k] * (i + 1.0), axis=k,
                                           where=te.abs(k - i) <= w), name="Y")
    i, kk = np.meshgrid(np.arange(12), np.arange(12))
    check(Y, X, int(np.count_nonzero(np.abs(kk - i) <= w)))


def test_diamond_condition_with_abs():
    n, r = 8, 2
    X = te.placeholder((n, n), "X", dtype=F64)
    k, l = te.reduce_axis(n, "k"), te.reduce_axis(n, "l")
    Y = te.compute((n, n), lambda i, j: te.sum(
        X[k, l], axis=[k, l], where=te.abs(k - i) + te.abs(l - j) <= r), name="Y")
    i, j, a, b = np.meshgrid(*[np.arange(n)] * 4, indexing="ij")
    check(Y, X, int(np.count_nonzero(np.abs(a - i) + np.abs(b - j) <= r)))


def test_abs_in_a_select_condition():
    X = te.placeholder((12,), "X", dtype=F64)
    Y = te.compute((12,), lambda i: te.if_then_else(te.abs(i - 5) <= 3, X[11 - i], 0.0),
                   name="Y")
    check(Y, X, 7)


def test_abs_index_compiles():
    from texpr import codegen

    n, p = 10, 3
    X = te.placeholder((n,), "X", dtype=F64)
    Y = te.compute((n + 2 * p,), lambda i: X[n - 1 - te.abs(n - 1 - te.abs(i - p))], name="Y")
    H = te.placeholder(Y.shape, "H", dtype=F64)
    (g,) = te.differentiate(Y, [X], head=H)
    feed = _feed([H, X])
    kernel = codegen.build([g], [H, X])
    np.testing.assert_allclose(kernel(feed[H], feed[X])[0], te.evaluate(g, feed))
    h = feed[H]
    want = np.zeros(n)
    np.add.at(want, n - 1 - np.abs(n - 1 - np.abs(np.arange(n + 2 * p) - p)), h)
    np.testing.assert_allclose(te.evaluate(g, feed), want)


# ---- 3. data-dependent equalities that fix a reduction axis ------------------------

SEG = np.array([3, 0, 0, 11, -1, 5, 5, 5, 12, 2, 7, 0])  # -1 and 12: no segment


def test_segment_sum_gradient_is_a_gather():
    # Y[i] = sum_k X[k] where I[k] == i: dX[k] = H[I[k]] (one term per k, not 144)
    X = te.placeholder((12,), "X", dtype=F64)
    I = te.placeholder((12,), "I", dtype="int64")
    k = te.reduce_axis(12, "k")
    Y = te.compute((12,), lambda i: te.sum(X[k], axis=k, where=I[k] == i), name="Y")
    g = check(Y, X, 12, ints={I: SEG})
    assert not any(isinstance(op, te.ScatterAddOp) for op in te.topo_order([g]))


def test_segment_sum_condition_in_a_select():
    X = te.placeholder((12,), "X", dtype=F64)
    I = te.placeholder((12,), "I", dtype="int64")
    k = te.reduce_axis(12, "k")
    Y = te.compute((12,), lambda i: te.sum(te.if_then_else(I[k] == i, X[k] * X[k], 0.0),
                                           axis=k), name="Y")
    check(Y, X, 12, ints={I: SEG})


def test_segment_sum_2d_with_offset_and_affine_condition():
    # Y[i, c] = sum_k X[k, c] where I[k] + 1 == i and k % 2 == 0 (the int32 index cast)
    X = te.placeholder((12, 3), "X", dtype=F64)
    I = te.placeholder((12,), "I", dtype="int32")
    k = te.reduce_axis(12, "k")
    Y = te.compute((8, 3), lambda i, c: te.sum(X[k, c] * (c + 1.0), axis=k,
                                               where=te.all(k % 2 == 0, I[k] + 1 == i)),
                   name="Y")
    check(Y, X, 6 * 3, ints={I: SEG}, exact=False)


SEG_FORMS = {
    "I[k] == i + 1": lambda I, k, i: I[k] == i + 1,
    "I[k] == 11 - i": lambda I, k, i: I[k] == 11 - i,
    "i - 2 == I[k]": lambda I, k, i: i - 2 == I[k],
    "3 + i == I[k] + 1": lambda I, k, i: 3 + i == I[k] + 1,
    "(i + 1) - 3 == I[k]": lambda I, k, i: (i + 1) - 3 == I[k],
}


@pytest.mark.parametrize("form", sorted(SEG_FORMS))
def test_segment_sum_with_the_output_index_inside_an_affine_side(form):
    # the equality fixes the adjoint's reduction axis r (the output index i) as
    # r = +/-(I[k] - rest): one term per k (12), not |Y| x |X| (144)
    X = te.placeholder((12,), "X", dtype=F64)
    I = te.placeholder((12,), "I", dtype="int64")
    k = te.reduce_axis(12, "k")
    cond = SEG_FORMS[form]
    Y = te.compute((12,), lambda i: te.sum(X[k] * X[k], axis=k, where=cond(I, k, i)),
                   name="Y")
    check(Y, X, 12, ints={I: SEG})


# ---- 4. several loads of one tensor, some data-dependent ---------------------------

IDX = np.array([3, 0, 0, 11, 4, 5, 5, 5, 1, 2, 7, 0])
JDX = np.array([3, 1, 9, 10, 4, 2, 8, 5, 1, 6, 0, 0])


def test_two_gathers_of_one_tensor_scatter_once_each():
    # the case: one scatter-add per load (12 + 12), not 144
    X = te.placeholder((12,), "X", dtype=F64)
    I = te.placeholder((12,), "I", dtype="int64")
    J = te.placeholder((12,), "J", dtype="int64")
    Y = te.compute((12,), lambda i: X[I[i]] * X[J[i]], name="Y")
    g = check(Y, X, 24, ints={I: IDX, J: JDX})
    assert sum(isinstance(op, te.ScatterAddOp) for op in te.topo_order([g])) == 2


def test_gather_beside_an_affine_load_of_the_same_tensor():
    X = te.placeholder((12,), "X", dtype=F64)
    I = te.placeholder((12,), "I", dtype="int64")
    Y = te.compute((12,), lambda i: te.sin(X[I[i]]) + X[i] * 2.0, name="Y")
    check(Y, X, 24, ints={I: IDX})


def test_gather_and_modular_load_2d():
    X = te.placeholder((4, 3), "X", dtype=F64)
    I = te.placeholder((6,), "I", dtype="int64")
    Y = te.compute((6, 3), lambda i, c: X[I[i], c] * X[i % 4, c], name="Y")
    check(Y, X, 2 * 6 * 3, ints={I: IDX[:6] % 4})


def test_three_gathers_compile():
    from texpr import codegen

    X = te.placeholder((12,), "X", dtype=F64)
    I = te.placeholder((12,), "I", dtype="int64")
    J = te.placeholder((12,), "J", dtype="int64")
    Y = te.compute((12,), lambda i: X[I[i]] * X[J[i]] + X[(I[i] + J[i]) % 12], name="Y")
    g = check(Y, X, 36, ints={I: IDX, J: JDX})
    H = [t for t in te.topo_order([g]) if t.name == "H"][0].output(0)
    feed = _feed([H, X, I, J], {I: IDX, J: JDX})
    kernel = codegen.build([g], [H, X, I, J])
    got = kernel(feed[H], feed[X], feed[I], feed[J])[0]
    x, h = feed[X], feed[H]
    want = np.zeros(12)
    np.add.at(want, IDX, h * x[JDX])
    np.add.at(want, JDX, h * x[IDX])
    np.add.at(want, (IDX + JDX) % 12, h)
    np.testing.assert_allclose(got, want)


# ---- 5. indices of loop variables only, not quasi-affine ---------------------------


def test_product_of_loop_variables_in_an_index():
    # the case: X[i * j], 8x8 over X of 50: one term per point (64, not 3,200)
    X = te.placeholder((50,), "X", dtype=F64)
    Y = te.compute((8, 8), lambda i, j: X[i * j], name="Y")
    check(Y, X, 64)


def test_float_index_floor_cast():
    X = te.placeholder((6,), "X", dtype=F64)
    Y = te.compute((12,), lambda i: X[te.cast(te.floor(i * 0.5), "int64")], name="Y")
    check(Y, X, 12)


@pytest.mark.parametrize("n,m", [(64, 128), (16, 4)])
def test_nearest_resize_with_a_float_scale(n, m):
    # BUGS.md C15: Y[i] = X[min(int(floor(i * s)), n - 1)], s = n / m
    X = te.placeholder((n,), "X", dtype=F64)
    s = n / m
    Y = te.compute((m,), lambda i: X[te.min(te.cast(te.floor(i * s), "int64"), n - 1)],
                   name="Y")
    check(Y, X, m)


def test_quadratic_index_and_a_reduction():
    # Y[i] = sum_k X[i * k] * X[k]: two loads per point (i * k not quasi-affine)
    X = te.placeholder((50,), "X", dtype=F64)
    k = te.reduce_axis(8, "k")
    Y = te.compute((8,), lambda i: te.sum(X[i * k] * X[(k * k) % 50], axis=k), name="Y")
    check(Y, X, 2 * 64)


# ---- 6. property test: random programs of these kinds vs a brute-force ideal -------
#
# Each draw builds one program (X read by Y, sometimes through a stage S) and, in
# numpy, its ideal: the (iteration point, load of X) pairs that are structurally
# nonzero, found by evaluating the index maps and the loop-variable conditions at
# every point. A data-dependent index or condition, or one that is not
# quasi-affine in the loop variables (``i * j``), counts as possibly nonzero: the
# gradient cannot know the data when it is built, and testing a non-affine
# condition is work at every point (O(points), never O(points x |X|)). The
# simplified gradient
# must visit at most 1.5x that, and equal the raw adjoint on concrete data.

from hypothesis import HealthCheck, given, note, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _inb(e, n):
    return te.all(e >= 0, e < n)


@st.composite
def programs(draw):
    kind = draw(st.sampled_from(["abs_index", "abs_band", "diamond", "product", "float",
                                 "segment", "two_loads", "multi_term", "prod_window",
                                 "triangle", "gathered_segment", "shared_head"]))
    n = draw(st.integers(3, 9))
    m = draw(st.integers(2, 8))
    a = draw(st.integers(1, 2))
    c = draw(st.integers(-3, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    X = te.placeholder((n,), "X", dtype=F64)
    ints = {}
    i_ = np.arange(m)
    if kind == "abs_index":      # Y[i] = X[|a*i + c|] where in range
        Y = te.compute((m,), lambda i: te.if_then_else(
            te.abs(a * i + c) < n, X[te.min(te.abs(a * i + c), n - 1)], 0.0), name="Y")
        ideal = np.count_nonzero(np.abs(a * i_ + c) < n)
    elif kind == "abs_band":     # Y[i] = sum_k X[k] * (i+1) where |a*k - i| <= w
        w = draw(st.integers(0, 2))
        k = te.reduce_axis(n, "k")
        Y = te.compute((m,), lambda i: te.sum(X[k] * (i + 1.0), axis=k,
                                              where=te.abs(a * k - i + c) <= w), name="Y")
        ii, kk = np.meshgrid(i_, np.arange(n), indexing="ij")
        ideal = np.count_nonzero(np.abs(a * kk - ii + c) <= w)
    elif kind == "diamond":
        r = draw(st.integers(0, 2))
        X = te.placeholder((n, n), "X", dtype=F64)
        k, l = te.reduce_axis(n, "k"), te.reduce_axis(n, "l")
        Y = te.compute((m, m), lambda i, j: te.sum(
            X[k, l], axis=[k, l], where=te.abs(k - i) + te.abs(l - j - c) <= r), name="Y")
        ii, jj, kk, ll = np.meshgrid(i_, i_, np.arange(n), np.arange(n), indexing="ij")
        ideal = np.count_nonzero(np.abs(kk - ii) + np.abs(ll - jj - c) <= r)
    elif kind == "product":      # Y[i, j] = X[i * j + c] where in range
        Y = te.compute((m, m), lambda i, j: te.if_then_else(
            _inb(i * j + c, n), X[te.max(te.min(i * j + c, n - 1), 0)], 0.0), name="Y")
        ideal = m * m  # the guard on i * j is tested at every point
    elif kind == "float":        # nearest resize with a float scale
        s = draw(st.sampled_from([0.25, 0.5, 0.75, 1.5, 2.0]))
        Y = te.compute((m,), lambda i: X[te.min(te.cast(te.floor(i * s), "int64"), n - 1)],
                       name="Y")
        ideal = m
    elif kind == "segment":      # Y[i] = sum_k X[k] where I[k] == i + c (or in a select)
        I = te.placeholder((n,), "I", dtype="int64")
        ints[I] = rng.integers(-1, m + 1, n)
        k = te.reduce_axis(n, "k")
        if draw(st.booleans()):
            Y = te.compute((m,), lambda i: te.sum(X[k] * X[k], axis=k, where=I[k] == i + c),
                           name="Y")
        else:
            Y = te.compute((m,), lambda i: te.sum(te.if_then_else(I[k] - c == i, X[k], 0.0),
                                                  axis=k), name="Y")
        ideal = n
    elif kind == "two_loads":    # Y[i] = X[I[i]] * X[g(i)], g a gather, abs or product
        I = te.placeholder((m,), "I", dtype="int64")
        ints[I] = rng.integers(0, n, m)
        other = draw(st.sampled_from(["gather", "abs", "product"]))
        if other == "gather":
            J = te.placeholder((m,), "J", dtype="int64")
            ints[J] = rng.integers(0, n, m)
            g, valid = (lambda i: J[i]), np.ones(m, bool)
        elif other == "abs":
            g, valid = (lambda i: te.abs(i + c)), np.abs(i_ + c) < n
        else:
            g, valid = (lambda i: i * i + c), np.ones(m, bool)  # tested at every point
        Y = te.compute((m,), lambda i: X[I[i]] * te.if_then_else(
            _inb(g(i), n), X[te.max(te.min(g(i), n - 1), 0)], 1.0), name="Y")
        ideal = m + np.count_nonzero(valid)
    elif kind == "prod_window":  # Y[i] = (x) over k < w of X[a*i + k], (x) prod or custom
        w = draw(st.integers(1, 12))
        X = te.placeholder((a * (m - 1) + w,), "X", dtype=F64)
        red = draw(st.sampled_from(["prod", "logaddexp", "mymax"]))
        if red == "prod":
            red = te.prod
        elif red == "logaddexp":
            red = te.comm_reducer(lambda u, v: te.log(te.exp(u) + te.exp(v)),
                                  lambda d: te.const(-np.inf, d), name="logaddexp")
        else:
            red = te.comm_reducer(lambda u, v: te.max(u, v), lambda d: te.const(-np.inf, d),
                                  name="mymax")
        k = te.reduce_axis(w, "k")
        Y = te.compute((m,), lambda i: red(X[a * i + k], axis=k), name="Y")
        # the (window, point) pairs, and one forward re-scan of them: the products
        # of the other points of each window
        ideal = 2 * m * w
    elif kind == "triangle":     # Y = (x) of X over a triangle in each of 1-3 axes
        dims = draw(st.integers(1, 3))
        red_name = draw(st.sampled_from(["sum", "prod", "max", "min", "logaddexp"]))
        red = {"sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min,
               "logaddexp": _logaddexp()}.get(red_name)
        shape = tuple(draw(st.integers(2, 6)) for _ in range(dims))
        X = te.placeholder(shape, "X", dtype=F64)
        ks = [te.reduce_axis(e, f"k{d}") for d, e in enumerate(shape)]
        cmps = [draw(st.sampled_from(["<=", "<", ">=", ">"])) for _ in shape]
        ops = {"<=": lambda a, b: a <= b, "<": lambda a, b: a < b,
               ">=": lambda a, b: a >= b, ">": lambda a, b: a > b}
        src = (lambda: X[tuple(ks)] * X[tuple(ks)] + 0.5) if red_name == "prod" \
            else (lambda: X[tuple(ks)])
        Y = te.compute(shape, lambda *ii: red(src(), axis=ks, where=te.all(
            *[ops[c](k, i) for c, k, i in zip(cmps, ks, ii)])), name="Y")
        # hand-written backward kernels' counts: one scan per axis for a sum; for a
        # max, one running (value, index) scan per axis and one scatter of the head;
        # for the others a forward and a reverse scan per axis and one term per point
        ideal = {"sum": dims, "max": dims + 1, "min": dims + 1}.get(red_name, 2 * dims + 1) \
            * X.size
    elif kind == "gathered_segment":  # Y[i] = sum_k X[J[k]] where I[k] == i + c
        I = te.placeholder((n,), "I", dtype="int64")
        J = te.placeholder((n,), "J", dtype="int64")
        ints[I], ints[J] = rng.integers(-1, m + 1, n), rng.integers(0, n, n)
        k = te.reduce_axis(n, "k")
        Y = te.compute((m,), lambda i: te.sum(X[J[k]], axis=k, where=I[k] == i + c), name="Y")
        ideal = n
    elif kind == "shared_head":  # Y[r, c] = sum_k F1(X)[r, k] ... Fq(X)[r, k] * C[.., k, c]
        r_, c_ = draw(st.integers(1, 4)), draw(st.integers(2, 5))
        X = te.placeholder((r_, n), "X", dtype=F64)
        acts = [lambda x: te.exp(x), lambda x: te.sin(x), lambda x: x * x + 1.0,
                lambda x: te.tanh(x), lambda x: x]
        picks = draw(st.lists(st.integers(0, len(acts) - 1), min_size=2, max_size=3))
        fs = [te.compute((r_, n), lambda i, j, f=acts[p]: f(X[i, j]), name=f"F{q}")
              for q, p in enumerate(picks)]
        per_row = draw(st.booleans())  # C[r, k, c] (batched) or C[k, c] (a GEMM)
        C = te.placeholder((r_, n, c_) if per_row else (n, c_), "C", dtype=F64)
        k = te.reduce_axis(n, "k")

        def summand(i, j):
            v = C[i, k, j] if per_row else C[k, j]
            for f in fs:
                v = f[i, k] * v
            return v

        Y = te.compute((r_, c_), lambda i, j: te.sum(summand(i, j), axis=k), name="Y")
        # the head contracted with C once, then one pass over X's box
        ideal = r_ * n * c_ + X.size
    else:                        # S = act(X) read by a matmul
        o = draw(st.integers(1, 6))
        act = draw(st.sampled_from([lambda x: te.sigmoid(x) * x, te.tanh,
                                    lambda x: te.exp(x) * x + x * x]))
        W = te.placeholder((n, o), "W", dtype=F64)
        S = te.compute((n,), lambda i: act(X[i]), name="S")
        k = te.reduce_axis(n, "k")
        Y = te.compute((o,), lambda j: te.sum(S[k] * W[k, j], axis=k), name="Y")
        ideal = n * o + n
    return kind, Y, X, ints, int(ideal)


@seed(20261130)
@settings(max_examples=80, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=list(HealthCheck))
@given(programs())
def test_fuzz_gradients_within_the_ideal(case):
    kind, Y, X, ints, ideal = case
    H = te.placeholder(Y.shape, "H", dtype=F64)
    (raw,) = te.differentiate(Y, [X], head=H, simplify=False)
    (g,) = simplify.simplify([raw])
    note(f"{kind}: ideal {ideal}\n{te.graph_str(g)}")
    count = simplify.iteration_count([g])
    assert count <= 1.5 * max(ideal, 1), (kind, count, ideal)
    feed = _feed([Y, H, raw, g], ints)
    got, want = te.evaluate([g, raw], feed)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


# ---- prod windows: exclusive products by scans (linear per window) -----------------


@pytest.mark.parametrize("n_win,k", [(4, 16), (2, 24)])
def test_product_windows_in_linear_work(n_win, k):
    # the case Y[i] = prod_{k<16} X[i + k], 4 windows: the points before and
    # after each window point are two scans (k steps each; their first, the
    # identity, is written straight into the states), then one term per (window,
    # point): 3 * n_win * k (192 for the case: 1.5x its ideal of 64 pairs and
    # a 64-point re-scan), not the n_win * k * k triangle (1,024).
    # (Short windows keep the triangle, where it visits fewer points than the scans.)
    X = te.placeholder((n_win + k - 1,), "X", dtype=F64)
    kk = te.reduce_axis(k, "k")
    Y = te.compute((n_win,), lambda i: te.prod(X[i + kk], axis=kk), name="Y")
    check(Y, X, 3 * n_win * k)


def test_product_window_with_a_zero_stays_exact():
    # no division by X: a zero factor gives the other factors' product, not nan
    X = te.placeholder((6,), "X", dtype=F64)
    k = te.reduce_axis(4, "k")
    Y = te.compute((3,), lambda i: te.prod(X[i + k], axis=k), name="Y")
    H = te.placeholder((3,), "H", dtype=F64)
    (g,) = te.differentiate(Y, [X], head=H)
    x = np.array([0.5, 0.0, 2.0, -1.5, 3.0, 0.25])
    h = np.array([1.0, 2.0, 3.0])
    want = np.zeros(6)
    for i in range(3):
        for m in range(4):
            want[i + m] += h[i] * np.prod([x[i + q] for q in range(4) if q != m])
    np.testing.assert_allclose(te.evaluate(g, {X: x, H: h}), want, rtol=1e-12)


# ---- a residual equality whose load was guarded by a conjunct on the solved axis ---


@pytest.mark.parametrize("shift,n_a", [(2, 3), (3, 2), (1, 4)])
def test_solved_data_equality_keeps_the_guard_of_its_load(shift, n_a):
    # dX[j] = sum_{a, k} H[a] where k <= a && k == I[a] && a + shift == j: solving a
    # (= j - shift) then k (= I[j - shift]) must keep "some k <= j - shift exists"
    # (j >= shift) before the load I[j - shift], which is outside I for j < shift
    # (a fuzzed argmax gradient once read it there)
    n = n_a + shift
    H = te.placeholder((n_a,), "H", dtype=F64)
    I = te.placeholder((n_a,), "I", dtype="int64")
    a, k = te.reduce_axis(n_a, "a"), te.reduce_axis(n_a, "k")
    Y = te.compute((n,), lambda j: te.sum(H[a], axis=[a, k],
                                          where=te.all(k <= a, k == I[a], a + shift == j)),
                   name="Y")
    (s,) = simplify.simplify([Y])
    feed = {H: np.linspace(1.0, 2.0, n_a), I: np.arange(n_a)[::-1].copy()}
    want = te.evaluate(Y, feed)
    np.testing.assert_allclose(te.evaluate(s, feed), want)
    assert simplify.iteration_count([s]) <= n
    kern = codegen.build([s], [H, I])
    np.testing.assert_allclose(kern(feed[H], feed[I])[0], want)


# ---- a segment id outside the output matches no segment ----------------------------


@pytest.mark.parametrize("form", ["plain", "guarded_after", "guarded_before", "squared"])
def test_segment_sum_ids_outside_the_output_match_no_segment(form):
    # the scatter form of Y[i] = sum_k X[k] where I[k] == i skips I[k] = -1 or 7 (the
    # sum compared them with i and matched nothing): kernel, evaluator of the
    # simplified graph and of the original agree (the unguarded scatter raised)
    n, m = 6, 4
    X = te.placeholder((m,), "X", dtype=F64)
    I = te.placeholder((m,), "I", dtype="int32")
    k = te.reduce_axis(m, "k")
    where = {"plain": lambda i: I[k] == i,
             "guarded_after": lambda i: te.all(k >= i, I[k] == i),
             "guarded_before": lambda i: te.all(I[k] == i, k >= 1),
             "squared": lambda i: I[k] == i}[form]
    src = (lambda: X[k] * X[k]) if form == "squared" else (lambda: X[k])
    Y = te.compute((n,), lambda i: te.sum(src(), axis=k, where=where(i)), name="Y")
    (s,) = simplify.simplify([Y])
    assert any(isinstance(op, te.ScatterAddOp) for op in te.topo_order([s]))
    feed = {X: np.array([1.0, 2.0, 4.0, 8.0]), I: np.array([0, -1, 1, 7], "int32")}
    want = te.evaluate(Y, feed)
    np.testing.assert_array_equal(te.evaluate(s, feed), want)
    np.testing.assert_array_equal(codegen.build([Y], [X, I])(feed[X], feed[I])[0], want)


@pytest.mark.parametrize("form", ["r + J", "J + r", "J - r"])
def test_solved_equality_of_int32_loads_is_computed_in_int64(form):
    # I[k] == r + J[k] with int32 I, J: the comparison ran in int64 (r is an index),
    # so the solved r = I[k] - J[k] is too; in int32 it wrapped and the kernel
    # build refused the program for any data
    n, m = 6, 8
    H = te.placeholder((n,), "H", dtype=F64)
    I = te.placeholder((m,), "I", dtype="int32")
    J = te.placeholder((m,), "J", dtype="int32")
    r = te.reduce_axis(n, "r")
    side = {"r + J": lambda k: r + J[k], "J + r": lambda k: J[k] + r,
            "J - r": lambda k: J[k] - r}[form]
    Y = te.compute((m,), lambda k: te.sum(H[r], axis=r, where=I[k] == side(k)), name="Y")
    (s,) = simplify.simplify([Y])
    assert simplify.iteration_count([s]) <= m
    big, small = np.iinfo(np.int32).max, np.iinfo(np.int32).min
    feed = {H: np.arange(1.0, n + 1), I: np.array([3, big, small, 0, 1, 2, 3, -4], "int32"),
            J: np.array([1, small, big, 0, 0, 0, 0, -6], "int32")}
    want = te.evaluate(Y, feed)
    np.testing.assert_array_equal(te.evaluate(s, feed), want)
    np.testing.assert_array_equal(codegen.build([Y], [H, I, J])(*feed.values())[0], want)


# ---- one-hot picks in a gradient (cross entropy) -------------------------------------


def test_cross_entropy_gradient_picks_the_label_once():
    """The gradient of ``sum(select(labels[i] == c, -log_softmax(Z)[i, c], 0))``:
    the Jacobian's delta conditions ``j0 == j0 && c == c`` (after the solve) used
    to stay around the pick ``select(labels[j0] == c, ...)``, so the per-row
    factor summed it over every class. Decided, the pick is a where= the solver
    eliminates: one term per row. Ideal: the softmax's max and sum (2 * n * c),
    one value per row (n), dZ (n * c)."""
    n, c = 6, 4
    Z = te.placeholder((n, c), "Z", F64)
    labels = te.placeholder((n,), "labels", "int64")
    ls = te.nn.log_softmax(Z, axis=1)
    i, k = te.reduce_axis(n, "i"), te.reduce_axis(c, "k")
    Y = te.compute((), lambda: te.sum(te.if_then_else(labels[i] == k, -ls[i, k], 0.0),
                                      axis=[i, k]), name="xent")
    # a label outside [0, c) picks nothing
    check(Y, Z, 3 * n * c + n, ints={labels: [0, 3, 1, -1, 2, 4]})


# ---- user reducers over windows: the rest stages are scans too (issue 51) ------------


def _logaddexp():
    return te.comm_reducer(lambda u, v: te.log(te.exp(u) + te.exp(v)),
                           lambda d: te.const(-np.inf, d), name="logaddexp")


def _torch_grad(fn, x, h):
    """``h . d fn(x) / dx`` by PyTorch autograd (float64)."""
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    (fn(torch, xt) * torch.tensor(h, dtype=torch.float64)).sum().backward()
    return xt.grad.numpy()


@pytest.mark.parametrize("n_win,k", [(4, 16), (3, 5)])
def test_custom_reducer_windows_in_linear_work(n_win, k):
    # the case Y[i] = logaddexp_{k<16} X[i + k], 4 windows: before this the
    # rest stages of the generic rule (the windows' points before and after each m)
    # were triangles, 4 * 16 * 16 = 1,024 points; as scans they cost what te.prod's
    # windows cost, 3 * n_win * k (the pairs and two scans of the windows' points)
    X = te.placeholder((n_win + k - 1,), "X", dtype=F64)
    kk = te.reduce_axis(k, "k")
    Y = te.compute((n_win,), lambda i: _logaddexp()(X[i + kk], axis=kk), name="Y")
    g = check(Y, X, 3 * n_win * k)
    H = [t for t in te.topo_order([g]) if t.output(0).name == "H"][0].output(0)
    rng = np.random.default_rng(1)
    x, h = rng.uniform(-2, 2, n_win + k - 1), rng.uniform(-1, 1, n_win)
    want = _torch_grad(lambda torch, t: torch.logsumexp(t.unfold(0, k, 1), dim=1), x, h)
    np.testing.assert_allclose(te.evaluate(g, {X: x, H: h}), want, rtol=1e-10, atol=1e-12)


def test_custom_reducer_window_kernel_and_ties_go_to_the_first_point():
    # a selecting user reducer (max written with comm_reducer) over windows of a
    # tied input, its rest stages now scans: a tie still goes to the first point,
    # as in the raw gradient, and the compiled kernel (scans included) agrees
    mymax = te.comm_reducer(lambda u, v: te.max(u, v), lambda d: te.const(-np.inf, d),
                            name="mymax")
    X = te.placeholder((12,), "X", dtype=F64)
    kk = te.reduce_axis(8, "k")
    Y = te.compute((5,), lambda i: mymax(X[i + kk], axis=kk), name="Y")
    H = te.placeholder((5,), "H", dtype=F64)
    (g,) = te.differentiate(Y, [X], head=H)
    (raw,) = te.differentiate(Y, [X], head=H, simplify=False)
    assert simplify.iteration_count([g]) == 3 * 5 * 8
    x = np.array([0.0, 1.0, 3.0, 2.0, 3.0, 0.5, 3.0, 1.0, 0.0, 4.0, 4.0, 0.0])
    h = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    want = np.zeros(12)
    for i in range(5):
        want[i + int(np.argmax(x[i:i + 8]))] += h[i]  # the first maximum
    got = te.evaluate(g, {X: x, H: h})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(te.evaluate(raw, {X: x, H: h}), want)
    np.testing.assert_array_equal(codegen.build([g], [X, H])(x, h)[0], want)


# ---- a gathered summand under a data-dependent domain (issue 51) ----------------------


@pytest.mark.parametrize("form", ["plain", "shifted", "squared"])
def test_gathered_summand_under_a_data_dependent_domain(form):
    # Y[i] = sum_k X[J[k]] where I[k] == i: the gradient is the scatter
    # `for i, k: if I[k] == i: dX[J[k]] += H[i]` (n * n = 144 points); solving i = I[k]
    # in the scatter's where leaves one term per k (12). Ids outside [0, n) (-1, 12)
    # match no output and send nothing
    n = 12
    X = te.placeholder((n,), "X", dtype=F64)
    I = te.placeholder((n,), "I", dtype="int64")
    J = te.placeholder((n,), "J", dtype="int64")
    k = te.reduce_axis(n, "k")
    c = 1 if form == "shifted" else 0
    src = (lambda: X[J[k]] * X[J[k]]) if form == "squared" else (lambda: X[J[k]])
    Y = te.compute((n,), lambda i: te.sum(src(), axis=k, where=I[k] == i + c), name="Y")
    ints = {I: [3, 0, -1, 11, 12, 3, 5, 7, 0, 2, 11, 6], J: [0, 4, 4, 11, 2, 9, 1, 1, 4, 8, 7, 3]}
    g = check(Y, X, n, ints=ints)
    assert any(isinstance(op, te.ScatterAddOp) for op in te.topo_order([g]))


def test_gathered_summand_under_a_data_dependent_domain_kernel_and_torch():
    n = 12
    X = te.placeholder((n,), "X", dtype=F64)
    I = te.placeholder((n,), "I", dtype="int64")
    J = te.placeholder((n,), "J", dtype="int64")
    k = te.reduce_axis(n, "k")
    Y = te.compute((n,), lambda i: te.sum(X[J[k]], axis=k, where=I[k] == i), name="Y")
    H = te.placeholder((n,), "H", dtype=F64)
    (g,) = te.differentiate(Y, [X], head=H)
    assert simplify.iteration_count([g]) == n
    rng = np.random.default_rng(3)
    x, h = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    i_, j_ = rng.integers(0, n, n), rng.integers(0, n, n)
    want = _torch_grad(lambda torch, t: torch.zeros(n, dtype=torch.float64).index_add(
        0, torch.tensor(i_), t[torch.tensor(j_)]), x, h)
    np.testing.assert_allclose(te.evaluate(g, {X: x, H: h, I: i_, J: j_}), want, rtol=1e-12)
    np.testing.assert_allclose(codegen.build([g], [H, I, J])(h, i_, j_)[0], want, rtol=1e-12)


# ---- multi-dimensional prefix sums written as one reduction (issue 51) ---------------


def _sat(h, w, order, kind="sum"):
    I = te.placeholder((h, w), "I", dtype=F64)
    k, l = te.reduce_axis(h, "k"), te.reduce_axis(w, "l")
    conds = {"kl": lambda y, x: te.all(k <= y, l <= x),
             "lk": lambda y, x: te.all(l <= x, k <= y),
             "strict": lambda y, x: te.all(k < y, l < x),
             "mixed": lambda y, x: te.all(k <= y, l >= x)}[order]
    axes = [l, k] if order == "lk" else [k, l]
    red = te.prod if kind == "prod" else te.sum
    S = te.compute((h, w), lambda y, x: red(I[k, l], axis=axes, where=conds(y, x)), name="S")
    return S, I


@pytest.mark.parametrize("order,count", [("kl", 144), ("lk", 144), ("strict", 136),
                                         ("mixed", 144)])
def test_summed_area_table_is_one_scan_per_axis(order, count):
    # S[y, x] = sum(I[k, l], k <= y && l <= x) (9x8): the triangle visits 1,620 points;
    # split into T[k, x] = sum(I[k, l], l <= x) and S = sum(T[k, x], k <= y), two 1-D
    # prefix sums, it is 2 * 72 = 144, whatever the order of the conditions and axes;
    # its adjoint (the same with >=) too. (k < y && l < x: the inner scan has 8 rows)
    S, I = _sat(9, 8, order)
    (s,) = simplify.simplify([S])
    assert simplify.iteration_count([s]) == count, te.graph_str(s)
    x = np.random.default_rng(2).uniform(-1, 1, (9, 8))
    np.testing.assert_allclose(te.evaluate(s, {I: x}), te.evaluate(S, {I: x}), rtol=1e-12)
    check(S, I, count)


def test_summed_area_table_against_torch_and_kernel():
    torch = pytest.importorskip("torch")
    S, I = _sat(9, 8, "kl")
    H = te.placeholder((9, 8), "H", dtype=F64)
    (g,) = te.differentiate(S, [I], head=H)
    rng = np.random.default_rng(4)
    x, h = rng.uniform(-1, 1, (9, 8)), rng.uniform(-1, 1, (9, 8))
    want_s = torch.cumsum(torch.cumsum(torch.tensor(x), 0), 1).numpy()
    want_g = _torch_grad(lambda torch, t: torch.cumsum(torch.cumsum(t, 0), 1), x, h)
    kern = codegen.build([S, g], [I, H])
    got_s, got_g = kern(x, h)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-12)
    np.testing.assert_allclose(got_g, want_g, rtol=1e-12)


def test_two_dimensional_prefix_product_forward_is_linear():
    # the same split for prod: one cumprod per axis (no division, zeros exact)
    S, I = _sat(6, 5, "kl", kind="prod")
    (s,) = simplify.simplify([S])
    assert simplify.iteration_count([s]) == 2 * 30
    x = np.random.default_rng(5).uniform(0.5, 1.5, (6, 5))
    x[2, 3] = 0.0
    want = np.array([[np.prod(x[:y + 1, :c + 1]) for c in range(5)] for y in range(6)])
    np.testing.assert_allclose(te.evaluate(s, {I: x}), want, rtol=1e-12)


def test_three_dimensional_triangle_is_one_scan_per_axis():
    # a prefix in c, a prefix in a and a suffix in b (4x5x6): 3 * 120 points for the
    # value and for the gradient, not the 4 * 5 * 6 * (sum of the boxes) triangle
    X = te.placeholder((4, 5, 6), "X", dtype=F64)
    a, b, c = te.reduce_axis(4, "a"), te.reduce_axis(5, "b"), te.reduce_axis(6, "c")
    Y = te.compute((4, 5, 6), lambda i, j, k: te.sum(
        X[a, b, c] * 2.0, axis=[a, b, c], where=te.all(c <= k, a <= i, b >= j)), name="Y")
    (s,) = simplify.simplify([Y])
    assert simplify.iteration_count([s]) == 360
    check(Y, X, 360)


# ---- prefix products and user reducers over a triangle (issue 51) --------------------


def _prefix(red, n, where, src=None):
    X = te.placeholder((3, n), "X", dtype=F64)
    j = te.reduce_axis(n, "j")
    src = src or (lambda X, r, j: X[r, j])
    P = te.compute((3, n), lambda r, i: red(src(X, r, j), axis=j, where=where(j, i)),
                   name="P")
    return P, X


@pytest.mark.parametrize("n", [12, 24])
def test_prefix_product_gradient_is_linear(n):
    # P[r, i] = prod(X[r, j], where=j < i) (NeRF's transmittance): the rest stages
    # of the general rule made the gradient quadratic per row (1,062 points at
    # n = 12, 4,284 at 24). As the adjoint of the product's scan: the forward scan
    # (3n), the reverse scan of the head (3n) and one term per point that enters
    # a product (3 (n - 1)): 9n - 3
    P, X = _prefix(te.prod, n, lambda j, i: j < i)
    check(P, X, 9 * n - 3)


@pytest.mark.parametrize("form,count", [("j <= i", 108), ("j > i", 105), ("j >= i + 1", 105),
                                        ("j <= i - 2", 102)])
def test_prefix_and_suffix_products_of_a_function(form, count):
    where = {"j <= i": lambda j, i: j <= i, "j > i": lambda j, i: j > i,
             "j >= i + 1": lambda j, i: j >= i + 1, "j <= i - 2": lambda j, i: j <= i - 2}[form]
    P, X = _prefix(te.prod, 12, where, src=lambda X, r, j: X[r, j] * X[r, j] + 0.5)
    check(P, X, count)


def test_prefix_product_with_zeros_against_torch_and_kernel():
    # no division: zero factors (one, then two in a row) give exact gradients
    n = 7
    X = te.placeholder((2, n), "X", dtype=F64)
    j = te.reduce_axis(n, "j")
    P = te.compute((2, n), lambda r, i: te.prod(X[r, j], axis=j, where=j < i), name="P")
    H = te.placeholder((2, n), "H", dtype=F64)
    (g,) = te.differentiate(P, [X], head=H)
    assert simplify.iteration_count([g]) == 2 * (3 * n - 1)
    x = np.array([[0.5, 0.0, 2.0, -1.5, 3.0, 0.25, 1.5], [1.5, -2.0, 0.0, 0.0, 0.5, 2.0, 1.0]])
    h = np.random.default_rng(6).uniform(-1, 1, (2, n))

    def exclusive_cumprod(torch, t):
        ones = torch.ones((2, 1), dtype=torch.float64)
        return torch.cat([ones, torch.cumprod(t, 1)[:, :-1]], 1)

    want = _torch_grad(exclusive_cumprod, x, h)
    np.testing.assert_allclose(te.evaluate(g, {X: x, H: h}), want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(codegen.build([g], [X, H])(x, h)[0], want, rtol=1e-12,
                               atol=1e-15)


@pytest.mark.parametrize("form", ["prefix", "suffix"])
def test_user_reducer_over_a_triangle_is_linear(form):
    # a running logaddexp (and its suffix form): the same reverse scan with the
    # combine's partials, 111 points instead of the rest stages' quadratic count
    where = (lambda j, i: j <= i) if form == "prefix" else (lambda j, i: j >= i)
    P, X = _prefix(_logaddexp(), 12, where)
    check(P, X, 111)
    rng = np.random.default_rng(7)
    x, h = rng.uniform(-2, 2, (3, 12)), rng.uniform(-1, 1, (3, 12))
    H = te.placeholder((3, 12), "H", dtype=F64)
    (g,) = te.differentiate(P, [X], head=H)

    def running(torch, t):
        u = t if form == "prefix" else torch.flip(t, [1])
        out = torch.logcumsumexp(u, 1)
        return out if form == "prefix" else torch.flip(out, [1])

    want = _torch_grad(running, x, h)
    np.testing.assert_allclose(te.evaluate(g, {X: x, H: h}), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("form", ["prefix", "suffix"])
def test_running_user_max_sends_a_tie_to_the_first_point(form):
    # a running max written with comm_reducer over tied data: the reverse scan reads
    # the tie-ordered combine, so each output's adjoint goes to the first maximal
    # point of its domain (row-major), as the general rule's rest stages do
    mymax = te.comm_reducer(lambda u, v: te.max(u, v), lambda d: te.const(-np.inf, d),
                            name="mymax")
    where = (lambda j, i: j <= i) if form == "prefix" else (lambda j, i: j >= i)
    P, X = _prefix(mymax, 8, where)
    H = te.placeholder((3, 8), "H", dtype=F64)
    (g,) = te.differentiate(P, [X], head=H)
    (raw,) = te.differentiate(P, [X], head=H, simplify=False)
    assert simplify.iteration_count([g]) == 3 * 3 * 8  # forward, reverse scan, terms
    x = np.array([[1.0, 3, 3, 2, 3, 0, 5, 5], [2, 2, 2, 2, 2, 2, 2, 2], [0, 1, 0, 1, 4, 4, 1, 4]])
    h = np.tile(2.0 ** np.arange(8), (3, 1))
    want = np.zeros((3, 8))
    for r in range(3):
        for i in range(8):
            lo, hi = (0, i + 1) if form == "prefix" else (i, 8)
            want[r, lo + int(np.argmax(x[r, lo:hi]))] += h[r, i]
    got, want_raw = te.evaluate([g, raw], {X: x, H: h})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want_raw, want)
