"""Work-optimal gradients, round 2 (issue 51): shared head contractions and
multi-dimensional triangles under prod, max and user reducers.

Each test asserts the exact iteration count of the simplified gradients
(``simplify.iteration_count``) and their values: equal to the raw adjoint
(``te.evaluate``), to float64 central finite differences and, where PyTorch has
the operation, to its autograd in float64.
"""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.testing import numeric_jacobian

F64 = "float64"


def _grads(Y, Xs):
    H = te.placeholder(Y.shape, "H", dtype=F64)
    gs = te.differentiate(Y, Xs, head=H).result
    raw = te.differentiate(Y, Xs, head=H, simplify=False).result
    return H, gs, raw


def _feed(tensors, seed=0, lo=-1.0, hi=1.0):
    rng = np.random.default_rng(seed)
    return {op.output(0): rng.uniform(lo, hi, op.output(0).shape)
            for op in te.topo_order(list(tensors)) if isinstance(op, te.PlaceholderOp)}


def check(Y, Xs, count, seed=0, feed=None):
    """The simplified gradients of ``Y`` by ``Xs`` (placeholder head): exactly
    ``count`` points, values equal to the raw adjoint and to finite differences.
    Returns (H, gradients, feed)."""
    Xs = [Xs] if isinstance(Xs, te.Tensor) else list(Xs)
    H, gs, raw = _grads(Y, Xs)
    got = simplify.iteration_count(gs)
    assert got == count, (got, count, te.graph_str(gs))
    feed = feed or _feed([Y, H] + gs + raw, seed)
    vals = te.evaluate(gs + raw, feed)
    for g, r in zip(vals[:len(gs)], vals[len(gs):]):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-12)
    for X, g in zip(Xs, vals[:len(gs)]):
        jac = numeric_jacobian(Y, X, feed)
        fd = np.tensordot(feed[H], jac, axes=len(Y.shape))
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    return H, gs, feed


def _torch_grads(fn, xs, h):
    """``h . d fn(*xs) / d xs`` by PyTorch autograd (float64)."""
    torch = pytest.importorskip("torch")
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
    (fn(torch, *ts) * torch.tensor(h, dtype=torch.float64)).sum().backward()
    return [t.grad.numpy() for t in ts]


# ---- shared head contractions ----------------------------------------------------------


def _three_factors(R=4, K=5, C=6):
    A, B, D = (te.placeholder((R, K), n, dtype=F64) for n in "ABD")
    Cc = te.placeholder((R, K, C), "C", dtype=F64)
    k = te.reduce_axis(K, "k")
    out = te.compute((R, C), lambda r, c: te.sum(A[r, k] * B[r, k] * D[r, k] * Cc[r, k, c],
                                                 axis=k), name="out")
    return out, (A, B, D, Cc)


def test_three_differentiated_factors_share_one_head_contraction():
    # dA = B D u, dB = A D u, dD = A B u with u[r, k] = sum_c H[r, c] C[r, k, c] formed
    # once: 120 + 3 * 20 points (each factor contracting the head itself: 3 * 120)
    out, (A, B, D, Cc) = _three_factors()
    H, gs, feed = check(out, [A, B, D], 4 * 5 * 6 + 3 * 4 * 5)
    shared = [op for op in simplify.materialized_stages(gs) if op.tag == "shared_head"]
    assert len(shared) == 1, te.graph_str(gs)
    want = _torch_grads(lambda torch, a, b, d: torch.einsum("rk,rk,rk,rkc->rc", a, b, d,
                                                            torch.tensor(feed[Cc])),
                        [feed[A], feed[B], feed[D]], feed[H])
    for g, w in zip(te.evaluate(gs, feed), want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_factors_of_one_input_share_the_head_contraction():
    # the case: out[r, c] = sum_k A[r, k] B[r, k] C[r, k, c] with A and B
    # functions of X: u once (120), then dX = u (B A' + A B') elementwise (20, A and B
    # inlined into it); 300 points before (u formed for each factor, A and B stored)
    R, K, C = 4, 5, 6
    X = te.placeholder((R, K), "X", dtype=F64)
    Cc = te.placeholder((R, K, C), "C", dtype=F64)
    A = te.compute((R, K), lambda r, k: te.exp(X[r, k]), name="A")
    B = te.compute((R, K), lambda r, k: te.sin(X[r, k]), name="B")
    k = te.reduce_axis(K, "k")
    out = te.compute((R, C), lambda r, c: te.sum(A[r, k] * B[r, k] * Cc[r, k, c], axis=k),
                     name="out")
    H, (g,), feed = check(out, [X], R * K * C + R * K)
    (want,) = _torch_grads(lambda torch, x: torch.einsum(
        "rk,rk,rkc->rc", torch.exp(x), torch.sin(x), torch.tensor(feed[Cc])), [feed[X]], feed[H])
    np.testing.assert_allclose(te.evaluate(g, feed), want, rtol=1e-12, atol=1e-14)


def test_transposed_factor_reads_the_shared_stage_transposed():
    # B is read as Bt[k, r]: its adjoint's core is u with its axes swapped, matched
    R, K, C = 4, 5, 6
    A = te.placeholder((R, K), "A", dtype=F64)
    Bt = te.placeholder((K, R), "Bt", dtype=F64)
    Cc = te.placeholder((R, K, C), "C", dtype=F64)
    k = te.reduce_axis(K, "k")
    out = te.compute((R, C), lambda r, c: te.sum(A[r, k] * Bt[k, r] * Cc[r, k, c], axis=k),
                     name="out")
    check(out, [A, Bt], R * K * C + 2 * R * K)


def test_bilinear_pooling_head():
    # Y[b, o] = sum_i x[b, i] y[b, i] W[o, i]: dx and dy share H @ W (105 points) and
    # dW is its own contraction with x * y (105): 105 + 21 + 21 + 105, not 3 * 105
    Bn, I, O = 3, 7, 5
    x = te.placeholder((Bn, I), "x", dtype=F64)
    y = te.placeholder((Bn, I), "y", dtype=F64)
    W = te.placeholder((O, I), "W", dtype=F64)
    i = te.reduce_axis(I, "i")
    Y = te.compute((Bn, O), lambda b, o: te.sum(x[b, i] * y[b, i] * W[o, i], axis=i), name="Y")
    H, gs, feed = check(Y, [x, y, W], 2 * Bn * I * O + 2 * Bn * I)
    want = _torch_grads(lambda torch, a, b, w: torch.einsum("bi,bi,oi->bo", a, b, w),
                        [feed[x], feed[y], feed[W]], feed[H])
    for g, w in zip(te.evaluate(gs, feed), want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_volume_renderer_shares_its_head_contraction():
    # alpha and the transmittance (an exclusive prefix product of 1 - alpha) are both
    # functions of sigma: img[r, c] = sum_k T[r, k] alpha[r, k] col[r, k, c]. The
    # head contracted with the colours is formed once (192 points, not twice), dcol is
    # its own 192, the transmittance's scans and terms 4 * 64: 640 points (832 before)
    R, N = 4, 16
    sig = te.placeholder((R, N), "sigma", dtype=F64)
    col = te.placeholder((R, N, 3), "col", dtype=F64)
    a = te.compute((R, N), lambda r, k: 1.0 - te.exp(-sig[r, k] * 0.1), name="alpha")
    j = te.reduce_axis(N, "j")
    T = te.compute((R, N), lambda r, k: te.prod(1.0 - a[r, j], axis=j, where=j < k), name="T")
    k = te.reduce_axis(N, "k")
    img = te.compute((R, 3), lambda r, c: te.sum(T[r, k] * a[r, k] * col[r, k, c], axis=k),
                     name="img")
    H, gs, feed = check(img, [sig, col], 2 * R * N * 3 + 4 * R * N)

    def render(torch, s, c):
        alpha = 1.0 - torch.exp(-s * 0.1)
        ones = torch.ones((R, 1), dtype=torch.float64)
        trans = torch.cat([ones, torch.cumprod(1.0 - alpha, 1)[:, :-1]], 1)
        return torch.einsum("rk,rk,rkc->rc", trans, alpha, c)

    want = _torch_grads(render, [feed[sig], feed[col]], feed[H])
    for g, w in zip(te.evaluate(gs, feed), want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_a_core_not_shared_is_left_alone():
    # one differentiated factor: B u would cost u's points plus the box; the
    # contraction with B folded in stays one reduction (120 points)
    out, (A, B, D, Cc) = _three_factors()
    check(out, [A], 4 * 5 * 6)


def test_an_empty_core_domain_keeps_the_sum():
    # where=c >= 4 k is empty for k = 3: the sum is an exact 0 there, B * 0 would be
    # nan for an infinite B, so the stages keep their reductions (sharing would cost
    # 3 * 24 + 2 * 12 points instead of 2 * 3 * 24, but is not exact)
    R, K, C = 3, 4, 12
    A = te.placeholder((R, K), "A", dtype=F64)
    B = te.placeholder((R, K), "B", dtype=F64)
    Cc = te.placeholder((R, C), "C", dtype=F64)
    c = te.reduce_axis(C, "c")
    out = te.compute((R, K), lambda r, k: te.sum(A[r, k] * B[r, k] * Cc[r, c], axis=c,
                                                 where=c >= 4 * k), name="out")
    H, (gA, gB), feed = check(out, [A, B], 2 * R * 24)
    feed[B] = feed[B].copy()
    feed[B][:, 3] = np.inf
    got = te.evaluate(gA, feed)
    assert np.all(got[:, 3] == 0.0), got


# ---- multi-dimensional triangles under prod, max and user reducers ---------------------


def _logaddexp():
    return te.comm_reducer(lambda u, v: te.log(te.exp(u) + te.exp(v)),
                           lambda d: te.const(-np.inf, d), name="logaddexp")


_CMP = {"<=": lambda a, b: a <= b, "<": lambda a, b: a < b,
        ">=": lambda a, b: a >= b, ">": lambda a, b: a > b}


def _triangle(red, shape, cmps, src=None):
    X = te.placeholder(shape, "X", dtype=F64)
    ks = [te.reduce_axis(e, f"k{d}") for d, e in enumerate(shape)]
    src = src or (lambda X, ks: X[tuple(ks)])
    P = te.compute(shape, lambda *ii: red(src(X, ks), axis=ks, where=te.all(
        *[_CMP[c](k, i) for c, k, i in zip(cmps, ks, ii)])), name="P")
    return P, X


@pytest.mark.parametrize("cmps,count", [(("<=", "<="), 100), (("<", ">="), 116),
                                        ((">", "<"), 111)])
def test_two_dimensional_prefix_product_gradient_is_linear(cmps, count):
    # P[y, x] = prod(X[k, l], where=k <= y && l <= x), 5x4: the rest stages of the
    # general rule made the gradient quadratic (3,915 points at 6x5); as a 1-D
    # triangle over k of the rows' 1-D triangles over l, forward and adjoint are one
    # scan per axis: 5 * 20 (two forward scans, two reverse scans, the terms)
    P, X = _triangle(te.prod, (5, 4), cmps, src=lambda X, ks: X[tuple(ks)] * X[tuple(ks)] + 0.5)
    check(P, X, count)


def test_three_dimensional_prefix_product():
    # one forward and one reverse scan per axis and the terms: 264 points, under
    # (2d + 1) x size = 252 plus the scans' first steps
    P, X = _triangle(te.prod, (4, 3, 3), ("<=", ">", "<"))
    check(P, X, 264)


def test_two_dimensional_prefix_product_with_zeros_against_torch_and_kernel():
    # no division: zeros, one and two in a rectangle, give exact gradients; the value
    # and the gradient in one compiled kernel
    P, X = _triangle(te.prod, (5, 4), ("<=", "<="))
    H = te.placeholder((5, 4), "H", dtype=F64)
    (g,) = te.differentiate(P, [X], head=H)
    x = np.random.default_rng(8).uniform(0.5, 1.5, (5, 4))
    x[1, 2] = x[3, 0] = x[3, 1] = 0.0
    h = np.random.default_rng(9).uniform(-1, 1, (5, 4))
    (want,) = _torch_grads(lambda torch, t: torch.cumprod(torch.cumprod(t, 0), 1), [x], h)
    want_p = np.cumprod(np.cumprod(x, 0), 1)
    np.testing.assert_allclose(te.evaluate(g, {X: x, H: h}), want, rtol=1e-12, atol=1e-15)
    got_p, got_g = codegen.build([P, g], [X, H])(x, h)
    np.testing.assert_allclose(got_p, want_p, rtol=1e-12)
    np.testing.assert_allclose(got_g, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("cmps,count", [(("<=", "<="), 129), ((">=", "<="), 129)])
def test_two_dimensional_running_user_reducer(cmps, count):
    # a user logaddexp splits at its first axis only (row-major order kept); the
    # gradient is the two reverse scans, linear (4,575 points at 6x5 before)
    P, X = _triangle(_logaddexp(), (5, 4), cmps)
    H, (g,), feed = check(P, X, count)
    if cmps == ("<=", "<="):
        (want,) = _torch_grads(lambda torch, t: torch.logcumsumexp(
            torch.logcumsumexp(t, 1), 0), [feed[X]], feed[H])
        np.testing.assert_allclose(te.evaluate(g, feed), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("red", ["max", "min"])
def test_two_dimensional_running_max_is_one_scan_per_axis(red):
    # the forward: one running max per axis (60 points at 6x5, the triangle 315);
    # the gradient: the argmax stage scanned the same way (a tuple scan of value and
    # flat index: 71 points with its steps' starts) and one scatter of the head to
    # each output's argmax (30), whose flat index the scatter splits into its two
    # digits; 630 points before
    P, X = _triangle(getattr(te, red), (6, 5), ("<=", "<="))
    (s,) = simplify.simplify([P])
    assert simplify.iteration_count([s]) == 60
    H, (g,), feed = check(P, X, 101)
    x = np.random.default_rng(10).uniform(-1, 1, (6, 5))
    x[2, 3] = np.nan
    want = np.array([[getattr(np, red)(x[:y + 1, :c + 1]) for c in range(5)] for y in range(6)])
    np.testing.assert_array_equal(te.evaluate(s, {X: x}), want)


def test_two_dimensional_running_max_ties_go_to_the_first_point():
    # tied data: each output's adjoint goes to the first maximal point of its
    # rectangle in row-major order (k, then l), as te.max's rule says
    P, X = _triangle(te.max, (5, 4), ("<=", ">="))
    H = te.placeholder((5, 4), "H", dtype=F64)
    (g,) = te.differentiate(P, [X], head=H)
    x = np.random.default_rng(11).integers(0, 3, (5, 4)).astype(float)
    h = 2.0 ** np.arange(20).reshape(5, 4)
    want = np.zeros((5, 4))
    for y in range(5):
        for c in range(4):
            box = x[:y + 1, c:]
            k, l = np.unravel_index(int(np.argmax(box)), box.shape)
            want[k, c + l] += h[y, c]
    np.testing.assert_array_equal(te.evaluate(g, {X: x, H: h}), want)


def test_two_dimensional_max_and_product_in_one_kernel():
    # the tuple scan (value, flat index) and the product's scans compiled together
    X = te.placeholder((5, 4), "X", dtype=F64)
    Pm, _ = _triangle(te.max, (5, 4), ("<=", "<="), src=lambda _X, ks: X[tuple(ks)])
    Pp, _ = _triangle(te.prod, (5, 4), ("<", "<="), src=lambda _X, ks: X[tuple(ks)])
    L = te.compute((5, 4), lambda i, j: Pm[i, j] + Pp[i, j], name="L")
    H = te.placeholder((5, 4), "H", dtype=F64)
    (g,) = te.differentiate(L, [X], head=H)
    (raw,) = te.differentiate(L, [X], head=H, simplify=False)
    x = np.random.default_rng(12).integers(-2, 3, (5, 4)).astype(float)
    h = np.random.default_rng(13).uniform(-1, 1, (5, 4))
    kern = codegen.build([L, g], [X, H])
    x_nan = x.copy()
    x_nan[1, 2] = np.nan  # the running max propagates it; its point gets the adjoint
    for data in (x, x_nan):
        got = kern(data, h)
        want = te.evaluate([L, raw], {X: data, H: h})
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
