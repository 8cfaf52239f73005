"""Every bug case C1-C12 (docs/testing.md) with its stated values, and
variants covering each *kind* of fault, against float64 finite differences.

``L = sum(dY * Y)``: the head of ``differentiate`` is ``dY`` (a placeholder).
"""

import math

import numpy as np
import pytest

import texpr as te
from gradcheck import feed_for, weighted_sum
from texpr.testing import numeric_gradient

F = "float64"


def ph(shape, name, dtype=F):
    return te.placeholder(shape, name, dtype)


def vjp(y, xs, feed, dy=None):
    """Evaluate ``L = sum(dY * Y)``'s gradients w.r.t. ``xs`` (``dY`` = 1 when not given)."""
    head = ph(y.shape, "dY")
    feed = dict(feed)
    feed[head] = np.ones(y.shape) if dy is None else np.asarray(dy, dtype=F)
    res = te.differentiate(y, xs, head=head, simplify=False)
    return te.evaluate(list(res.result), feed)


def fd_vjp(y, x, feed, dy=None):
    """Finite differences of ``sum(dY * Y)`` w.r.t. ``x``."""
    loss, c = weighted_sum(y)
    feed = dict(feed)
    feed[c] = np.ones(y.shape) if dy is None else np.asarray(dy, dtype=F)
    return numeric_gradient(loss, x, feed)


# ---- C1: repeated index variable ------------------------------------------------------


def test_c1_diagonal():
    x = ph((4, 4), "X")
    y = te.compute((4,), lambda i: x[i, i], name="Y")
    (dx,) = vjp(y, [x], {x: np.arange(16.0).reshape(4, 4)}, dy=[2, 3, 5, 7])
    np.testing.assert_array_equal(dx, np.diag([2.0, 3, 5, 7]))


@pytest.mark.parametrize("fn,xshape,yshape", [
    (lambda x: lambda i, j: x[i, i, j], (3, 3, 2), (3, 2)),
    (lambda x: lambda i, j: x[i + j, i], (4, 3), (3, 2)),
    (lambda x: lambda i, j: x[j, j] * x[i, j], (3, 3), (3, 3)),
    (lambda x: lambda i, j: x[2 * i % 3, i], (3, 3), (3, 2)),
])
def test_c1_kind_non_injective_access(fn, xshape, yshape):
    x = ph(xshape, "X")
    y = te.compute(yshape, fn(x), name="Y")
    feed = feed_for([x])
    dy = np.random.default_rng(1).uniform(size=yshape)
    (dx,) = vjp(y, [x], feed, dy)
    np.testing.assert_allclose(dx, fd_vjp(y, x, feed, dy), rtol=1e-6, atol=1e-8)


# ---- C2: strided index inversion with a boundary ----------------------------------------


def test_c2_strided_conv():
    i_ = ph((7,), "I")
    w = ph((3,), "W")
    kh = te.reduce_axis(3, "kh")
    o = te.compute((3,), lambda h: te.sum(i_[2 * h + kh] * w[kh], axis=kh), name="O")
    feed = {i_: np.arange(7.0), w: np.array([1.0, 10.0, 100.0])}
    di, dw = vjp(o, [i_, w], feed, dy=[1, 2, 3])
    np.testing.assert_array_equal(di, [1, 10, 102, 20, 203, 30, 300])
    np.testing.assert_allclose(dw, fd_vjp(o, w, feed, [1, 2, 3]), rtol=1e-6)


@pytest.mark.parametrize("n,k,stride,dil",
                         [(9, 3, 2, 1), (10, 2, 3, 2), (8, 3, 1, 3), (7, 1, 3, 1)])
def test_c2_kind_strided_dilated(n, k, stride, dil):
    out = (n - dil * (k - 1) - 1) // stride + 1
    x = ph((n,), "X")
    w = ph((k,), "W")
    r = te.reduce_axis(k, "r")
    y = te.compute((out,), lambda h: te.sum(x[stride * h + dil * r] * w[r], axis=r), name="Y")
    feed = feed_for([x, w])
    dy = np.arange(1.0, out + 1)
    dx, dw = vjp(y, [x, w], feed, dy)
    np.testing.assert_allclose(dx, fd_vjp(y, x, feed, dy), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dw, fd_vjp(y, w, feed, dy), rtol=1e-6, atol=1e-8)


# ---- C3: strided scatter, last position --------------------------------------------------


def test_c3_strided_scatter():
    x = ph((2,), "X")
    w = ph((), "w")
    y = te.compute((3,), lambda o: te.if_then_else(o % 2 == 0, w[()] * x[o // 2], 0.0), name="Y")
    feed = {x: np.array([0.3, -1.2]), w: np.array(-0.7767)}
    dx, dw = vjp(y, [x, w], feed, dy=[1.5, 0, 0.7])
    np.testing.assert_allclose(dx, [-1.16505, -0.54369], rtol=1e-12)
    np.testing.assert_allclose(dw, 1.5 * 0.3 + 0.7 * -1.2, rtol=1e-12)


@pytest.mark.parametrize("n,s,size", [(3, 2, 6), (3, 3, 7), (4, 2, 7)])
def test_c3_kind_transposed_strides(n, s, size):
    x = ph((n,), "X")
    y = te.compute((size,), lambda o: te.if_then_else((o % s == 0) & (o // s < n),
                                                      x[te.min(o // s, n - 1)] * (o + 1.0), 0.0),
                   name="Y")
    feed = feed_for([x])
    dy = np.arange(1.0, size + 1)
    (dx,) = vjp(y, [x], feed, dy)
    np.testing.assert_allclose(dx, fd_vjp(y, x, feed, dy), rtol=1e-6, atol=1e-8)


# ---- C4 / C5: max windows, ties ------------------------------------------------------------


def test_c4_overlapping_max_windows():
    x = ph((5,), "X")
    r = te.reduce_axis(2, "r")
    y = te.compute((4,), lambda i: te.max(x[i + r], axis=r), name="Y")
    (dx,) = vjp(y, [x], {x: np.array([5.0, 3, 1, 2, 5])})
    np.testing.assert_array_equal(dx, [1, 1, 0, 1, 1])


def test_c4_kind_max_pool_2d_stride_1():
    x = ph((2, 5, 5), "X")
    a = te.reduce_axis(3, "a")
    b = te.reduce_axis(2, "b")
    y = te.compute((2, 3, 4), lambda c, i, j: te.max(x[c, i + a, j + b], axis=[a, b]), name="Y")
    feed = feed_for([x], seed=4)
    dy = np.random.default_rng(2).uniform(size=(2, 3, 4))
    (dx,) = vjp(y, [x], feed, dy)
    np.testing.assert_allclose(dx, fd_vjp(y, x, feed, dy), rtol=1e-6, atol=1e-8)


def test_c5a_column_ties():
    x = ph((4, 3), "X")
    r = te.reduce_axis(4, "r")
    y = te.compute((3,), lambda j: te.max(x[r, j], axis=r), name="Y")
    (dx,) = vjp(y, [x], {x: np.ones((4, 3))}, dy=[1.0, 2.0, 3.0])
    np.testing.assert_array_equal(dx.sum(axis=0), [1, 2, 3])  # ties sum to dY
    np.testing.assert_array_equal(dx[0], [1, 2, 3])  # convention: the first maximal point


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_c5b_many_ties(dtype):
    from texpr.jacobian import arg_stage

    # at the stated size: the argmax stage (one pass, no tie counting) picks point 0
    n = 70000
    x = te.placeholder((n,), "X", dtype)
    r = te.reduce_axis(n, "r")
    y = te.compute((), lambda: te.max(x[r], axis=r), name="Y")
    assert te.evaluate(arg_stage(y), {x: np.full(n, 0.25, dtype=dtype)}) == 0
    # the raw (unsimplified) gradient is an n x n sum: evaluate it at a smaller n
    n = 1500
    x = te.placeholder((n,), "X", dtype)
    r = te.reduce_axis(n, "r")
    y = te.compute((), lambda: te.max(x[r], axis=r), name="Y")
    (dx,) = te.differentiate(y, [x], simplify=False)
    got = te.evaluate(dx, {x: np.full(n, 0.25, dtype=dtype)})
    assert got.dtype == np.dtype(dtype)
    assert got[0] == 1 and got.sum() == 1  # no tie counting, no overflow


def test_c5c_elementwise_tie():
    a = ph((3,), "A")
    b = ph((3,), "B")
    y = te.compute((3,), lambda i: te.max(a[i], b[i]), name="Y")
    z = te.compute((3,), lambda i: te.min(a[i], b[i]), name="Z")
    feed = {a: np.array([1.0, 2.0, 3.0]), b: np.array([1.0, 5.0, 0.0])}
    # a tie splits dY evenly (as JAX and PyTorch): the two halves sum to dY
    da, db = vjp(y, [a, b], feed, dy=[2.0, 3.0, 4.0])
    np.testing.assert_array_equal(da, [1, 0, 4])
    np.testing.assert_array_equal(db, [1, 3, 0])
    da, db = vjp(z, [a, b], feed, dy=[2.0, 3.0, 4.0])
    np.testing.assert_array_equal(da, [1, 3, 0])
    np.testing.assert_array_equal(db, [1, 0, 4])


def test_c5_kind_max_pool_ties_sum_to_dy():
    x = ph((4, 4), "X")
    a = te.reduce_axis(2, "a")
    b = te.reduce_axis(2, "b")
    y = te.compute((3, 3), lambda i, j: te.max(x[i + a, j + b], axis=[a, b]), name="Y")
    xv = np.array([[1, 1, 0, 2], [1, 1, 2, 2], [0, 3, 3, 0], [3, 3, 3, 0]], dtype=F)
    dy = np.arange(1.0, 10.0).reshape(3, 3)
    (dx,) = vjp(y, [x], {x: xv}, dy)
    want = np.zeros((4, 4))
    for i in range(3):
        for j in range(3):
            win = xv[i:i + 2, j:j + 2]
            ai, bi = np.unravel_index(np.argmax(win), win.shape)  # first maximal, row-major
            want[i + ai, j + bi] += dy[i, j]
    np.testing.assert_array_equal(dx, want)
    assert dx.sum() == dy.sum()


# ---- C6: duplicate indices ------------------------------------------------------------------


def test_c6a_duplicate_gather():
    x = ph((1,), "X")
    idx = te.placeholder((2,), "I", "int64")
    y = te.compute((2,), lambda k: x[idx[k]], name="Y")
    (dx,) = vjp(y, [x], {x: np.array([0.1]), idx: np.array([0, 0])}, dy=[0.2, 0.3])
    np.testing.assert_allclose(dx, [0.5])
    with pytest.raises(te.NotDifferentiableError, match="I"):
        te.differentiate(y, [idx])


def test_c6b_duplicate_gather_2d():
    x = ph((2, 2), "X")
    i0 = te.placeholder((3,), "I0", "int64")
    i1 = te.placeholder((3,), "I1", "int64")
    y = te.compute((3,), lambda k: x[i0[k], i1[k]], name="Y")
    feed = {x: np.zeros((2, 2)), i0: np.array([1, 1, 0]), i1: np.array([1, 1, 0])}
    (dx,) = vjp(y, [x], feed)
    np.testing.assert_array_equal(dx, [[1, 0], [0, 2]])


def test_c6_kind_embedding_with_duplicates():
    table = ph((4, 3), "T")
    idx = te.placeholder((5,), "I", "int64")
    w = ph((5, 3), "W")
    y = te.compute((5, 3), lambda k, d: table[idx[k], d] * w[k, d], name="Y")
    feed = feed_for([table, w])
    feed[idx] = np.array([3, 1, 3, 3, 0])
    dy = np.random.default_rng(0).uniform(size=(5, 3))
    dt_, dw = vjp(y, [table, w], feed, dy)
    want = np.zeros((4, 3))
    np.add.at(want, feed[idx], dy * feed[w])
    np.testing.assert_allclose(dt_, want, rtol=1e-12)
    np.testing.assert_allclose(dw, dy * feed[table][feed[idx]], rtol=1e-12)


# ---- C7: padding is a mask ----------------------------------------------------------------


def test_c7_padding_mask():
    x = ph((4,), "X")
    w = ph((3,), "W")
    k = te.reduce_axis(3, "k")
    y = te.compute((4,), lambda o: te.sum(w[k] * te.if_then_else(
        (o + k - 1 >= 0) & (o + k - 1 < 4), x[o + k - 1], 0.0), axis=k), name="Y")
    feed = {x: np.arange(4.0), w: np.array([1.0, 10.0, 100.0])}
    dx, dw = vjp(y, [x, w], feed, dy=[1, 2, 3, 4])
    np.testing.assert_array_equal(dx, [12, 123, 234, 340])
    np.testing.assert_allclose(dw, fd_vjp(y, w, feed, [1, 2, 3, 4]), rtol=1e-6)


def test_c7_kind_padded_strided_conv2d_vs_torch():
    torch = pytest.importorskip("torch")
    n, c, h, wd, oc, kh, kw, s, p = 2, 2, 5, 4, 3, 3, 2, 2, 1
    oh, ow = (h + 2 * p - kh) // s + 1, (wd + 2 * p - kw) // s + 1
    x = ph((n, c, h, wd), "X")
    w = ph((oc, c, kh, kw), "W")
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")

    def pad_read(b, ch, yy, xx):
        ok = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < wd)
        return te.if_then_else(ok, x[b, ch, yy, xx], 0.0)

    y = te.compute((n, oc, oh, ow), lambda b, o, i, j: te.sum(
        pad_read(b, rc, s * i + ry - p, s * j + rx - p) * w[o, rc, ry, rx], axis=[rc, ry, rx]),
        name="Conv")
    feed = feed_for([x, w])
    dy = np.random.default_rng(3).uniform(size=(n, oc, oh, ow))
    dx, dw = vjp(y, [x, w], feed, dy)
    tx, tw = (torch.tensor(feed[t], requires_grad=True) for t in (x, w))
    out = torch.nn.functional.conv2d(tx, tw, stride=s, padding=p)
    np.testing.assert_allclose(te.evaluate(y, feed), out.detach().numpy(), rtol=1e-12)
    out.backward(torch.tensor(dy))
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-10, atol=1e-12)


# ---- C8: computed-index gathers ----------------------------------------------------------


def test_c8a_gather_div_mod():
    x = ph((4, 5), "X")
    idx = te.placeholder((4,), "I", "int64")
    y = te.compute((4,), lambda k: x[idx[k] // 5, idx[k] % 5], name="Y")
    (dx,) = vjp(y, [x], {x: np.zeros((4, 5)), idx: np.array([7, 7, 19, 0])}, dy=[1, 2, 3, 4])
    want = np.zeros((4, 5))
    want[1, 2], want[3, 4], want[0, 0] = 3, 3, 4
    np.testing.assert_array_equal(dx, want)


def _upsample_linear(x):
    return te.compute((6,), lambda i: te.if_then_else(
        i % 2 == 0,
        0.25 * x[te.max(i // 2 - 1, 0)] + 0.75 * x[i // 2],
        0.75 * x[i // 2] + 0.25 * x[te.min(i // 2 + 1, 2)]), name="Y")


def test_c8b_linear_upsampling_edge_clamp():
    x = ph((3,), "X")
    (dx,) = vjp(_upsample_linear(x), [x], {x: np.array([1.0, 2.0, 3.0])}, dy=np.arange(1.0, 7.0))
    np.testing.assert_allclose(dx, [3.25, 7.0, 10.75], rtol=1e-12)


def test_c8_kind_nearest_upsample_and_pixel_shuffle():
    x = ph((2, 4, 2, 3), "X")  # (n, c*r*r, h, w), r = 2
    ps = te.compute((2, 1, 4, 6),
                    lambda b, c, i, j: x[b, c * 4 + (i % 2) * 2 + j % 2, i // 2, j // 2],
                    name="PS")
    up = te.compute((2, 1, 8, 12), lambda b, c, i, j: ps[b, c, i // 2, j // 2] * (1.0 + i),
                    name="Up")
    feed = feed_for([x])
    dy = np.random.default_rng(5).uniform(size=(2, 1, 8, 12))
    (dx,) = vjp(up, [x], feed, dy)
    np.testing.assert_allclose(dx, fd_vjp(up, x, feed, dy), rtol=1e-6, atol=1e-8)


# ---- C9: index computed from float data ---------------------------------------------------


def test_c9_float_data_index():
    n = 4
    x = ph((n,), "X")
    r = ph((5,), "R")

    def index(i):
        return te.min(te.max(te.cast(te.floor(r[i] * 0.5), "int64"), 0), n - 1)

    y = te.compute((5,), lambda i: x[index(i)] * r[i], name="Y")
    rv = np.array([0.7, 5.1, 9.9, -3.0, 4.2])
    feed = {x: np.array([1.0, 2.0, 3.0, 4.0]), r: rv}
    dy = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    dx, dr = vjp(y, [x, r], feed, dy)
    pos = np.clip(np.floor(rv * 0.5).astype(int), 0, n - 1)
    want = np.zeros(n)
    np.add.at(want, pos, dy * rv)
    np.testing.assert_allclose(dx, want, rtol=1e-12)
    # R only reaches Y as a value (its derivative) and as an index (no derivative)
    np.testing.assert_allclose(dr, dy * feed[x][pos], rtol=1e-12)
    np.testing.assert_allclose(dr, fd_vjp(y, r, feed, dy), rtol=1e-6)
    # an index-only use gives a zero adjoint, structurally
    z = te.compute((5,), lambda i: x[index(i)], name="Z")
    res = te.differentiate(z, [x, r], head=ph((5,), "dZ"), simplify=False)
    assert r not in res.adjoints and res[1].op.tag == "zeros"


# ---- C10: NaN from the untaken branch ------------------------------------------------------


def test_c10a_norm_guarded_by_select():
    x = ph((3, 2), "X")
    j = te.reduce_axis(2, "j")
    r = te.compute((3,), lambda i: te.sqrt(te.sum(x[i, j] * x[i, j], axis=j)), name="R")
    y = te.compute((3,), lambda i: te.if_then_else(r[i] > 0.5, r[i], 1.0), name="Y")
    (dx,) = vjp(y, [x], {x: np.array([[1.0, 2], [3, 4], [0, 0]])})
    s5 = math.sqrt(5)
    np.testing.assert_allclose(dx, [[1 / s5, 2 / s5], [0.6, 0.8], [0, 0]], rtol=1e-12)


def test_c10b_constant_branch_at_singularity():
    x = ph((1,), "X")
    y = te.compute((1,), lambda i: te.if_then_else(x[i] == 0, 0.0, x[i] * te.sqrt(x[i])), name="Y")
    (dx,) = vjp(y, [x], {x: np.array([0.0])})
    np.testing.assert_array_equal(dx, [0.0])


def test_c10c_sqrt_of_negative_untaken():
    x = ph((2,), "X")
    y = te.compute((2,), lambda i: te.if_then_else(x[i] > 0, te.sqrt(x[i]), x[i]), name="Y")
    (dx,) = vjp(y, [x], {x: np.array([-1.0, -4.0])})
    np.testing.assert_array_equal(dx, [1.0, 1.0])


@pytest.mark.parametrize("fn", [
    lambda v: te.if_then_else(v > 0, te.log(v), v * 2.0),
    lambda v: te.if_then_else(v != 0, 1.0 / v, 2.0 * v),
    lambda v: te.if_then_else(v <= 0, v, te.power(v, 0.5)),
])
def test_c10_kind_untaken_branch_is_never_evaluated(fn):
    x = ph((4,), "X")
    w = ph((4,), "W")
    y = te.compute((4,), lambda i: fn(x[i]) * w[i], name="Y")
    feed = {x: np.array([-1.0, 0.0, 2.0, -3.0]), w: np.array([1.0, 2.0, 3.0, 4.0])}
    dx, dw = vjp(y, [x, w], feed)
    assert np.all(np.isfinite(dx)) and np.all(np.isfinite(dw))
    inner = feed_for([x])
    inner[x] = np.array([-1.0, 0.5, 2.0, -3.0])
    inner[w] = feed[w]
    (dx2,) = vjp(y, [x], inner)
    np.testing.assert_allclose(dx2, fd_vjp(y, x, inner), rtol=1e-6)


# ---- C11: singular local derivatives -------------------------------------------------------


def test_c11a_power_at_zero_base():
    a = ph((2,), "A")
    b = ph((2,), "B")
    y = te.compute((2,), lambda i: te.power(a[i], b[i]), name="Y")
    da, db = vjp(y, [a, b], {a: np.array([0.0, 2.0]), b: np.array([1.0, 1.0])})
    np.testing.assert_allclose(da, [1.0, 1.0])
    np.testing.assert_allclose(db, [0.0, 2 * math.log(2)])


def _norm(x, square):
    i = te.reduce_axis(2, "i")
    s = te.compute((), lambda: te.sqrt(te.sum(x[i] * x[i], axis=i)), name="S")
    if not square:
        return s
    return te.compute((), lambda: s[()] * s[()], name="S2")


def test_c11b_squared_norm_at_zero():
    x = ph((2,), "X")
    (dx,) = vjp(_norm(x, True), [x], {x: np.zeros(2)})
    np.testing.assert_array_equal(dx, [0.0, 0.0])


def test_c11c_norm_at_zero_convention_zero():
    # texpr's convention: sqrt'(0) = 0, so the gradient of |x| at x = 0 is 0
    x = ph((2,), "X")
    (dx,) = vjp(_norm(x, False), [x], {x: np.zeros(2)})
    np.testing.assert_array_equal(dx, [0.0, 0.0])
    (dx,) = vjp(_norm(x, False), [x], {x: np.array([3.0, 4.0])})
    np.testing.assert_allclose(dx, [0.6, 0.8])


@pytest.mark.parametrize("bv", [0.0, 0.5, 2.0, 3.0])
def test_c11_kind_power_at_zero_base(bv):
    a = ph((3,), "A")
    b = ph((3,), "B")
    y = te.compute((3,), lambda i: te.power(a[i], b[i]), name="Y")
    da, db = vjp(y, [a, b], {a: np.array([0.0, 0.5, 1.5]), b: np.full(3, bv)})
    assert db[0] == 0.0
    if bv != 0.5:
        assert np.isfinite(da[0])  # 0 * inf never formed for b == 0
    np.testing.assert_allclose(da[1:], bv * np.array([0.5, 1.5]) ** (bv - 1), rtol=1e-12)


# ---- C12: empty iteration domains ----------------------------------------------------------


def test_c12a_empty_input():
    x = ph((2, 0), "X")
    k = te.reduce_axis(0, "k")
    y = te.compute((2, 0), lambda i, j: te.sum(x[i, k], axis=k, where=k <= j), name="Y")
    (dx,) = vjp(y, [x], {x: np.zeros((2, 0))})
    assert dx.shape == (2, 0)


def test_c12b_empty_reduction():
    x = ph((2, 3), "X")
    k = te.reduce_axis(0, "k")
    y = te.compute((2,), lambda i: te.sum(x[i, k], axis=k), name="Y")
    (dx,) = vjp(y, [x], {x: np.ones((2, 3))})
    np.testing.assert_array_equal(dx, np.zeros((2, 3)))


def test_c12c_empty_output():
    x = ph((5,), "X")
    y = te.compute((0,), lambda i: x[3 + 2 * i], name="Y")
    (dx,) = vjp(y, [x], {x: np.ones(5)}, dy=np.zeros(0))
    np.testing.assert_array_equal(dx, np.zeros(5))


@pytest.mark.parametrize("kind", ["max", "prod"])
def test_c12_kind_empty_non_sum_reductions(kind):
    x = ph((2, 3), "X")
    k = te.reduce_axis(0, "k")
    red = te.max if kind == "max" else te.prod
    y = te.compute((2,), lambda i: red(x[i, k], axis=k), name="Y")
    z = te.compute((2,), lambda i: te.if_then_else(y[i] > 0, y[i] * 0.0, 1.0), name="Z")
    (dx,) = vjp(z, [x], {x: np.ones((2, 3))})
    np.testing.assert_array_equal(dx, np.zeros((2, 3)))
