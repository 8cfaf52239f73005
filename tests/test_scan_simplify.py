"""The simplifier turns sums and products over triangles (prefix/suffix domains) into
scans (issue 13): values unchanged, work linear instead of quadratic."""

import numpy as np
import pytest

import texpr as te
from texpr import simplify
from gradcheck import check_gradients

nn = te.nn
RNG = np.random.default_rng(1313)


def _scans(tensors):
    return [op for op in te.topo_order(tensors) if isinstance(op, te.ScanOp)]


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
def test_cumsum_variants_become_scans(axis, reverse, exclusive):
    x = te.placeholder((12, 13), name="X", dtype="float64")
    y = nn.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse)
    (ys,) = simplify.simplify([y])
    assert len(_scans([ys])) == 1, te.graph_str(ys)
    v = RNG.standard_normal((12, 13))
    w = np.flip(v, axis) if reverse else v
    want = np.cumsum(w, axis=axis)
    if exclusive:
        want = want - w
    want = np.flip(want, axis) if reverse else want
    np.testing.assert_allclose(te.evaluate(ys, {x: v}), want, rtol=1e-12, atol=1e-12)
    # linear: the scan (its init and steps) and at most one re-indexing copy
    assert simplify.iteration_count([ys]) <= 2 * 156 + 13


def test_cumprod_with_zeros_stays_exact():
    x = te.placeholder((2, 6), name="X")
    (ys,) = simplify.simplify([nn.cumprod(x, axis=1)])
    assert _scans([ys])
    v = np.array([[2.0, 0.0, 3.0, -1.0, 0.5, 4.0], [0.0, 1.5, 2.0, 0.0, -2.0, 1.0]], "float32")
    np.testing.assert_array_equal(te.evaluate(ys, {x: v}), np.cumprod(v, axis=1))
    # its gradient (simplified: the products before and after each point, no division)
    z = te.placeholder((6,), "Z", "float64")
    cz = te.placeholder((6,), "C", "float64")
    r = te.reduce_axis(6, "r")
    loss = te.compute((), lambda: te.sum(nn.cumprod(z)[r] * cz[r], axis=r), name="L")
    feed = {z: np.array([2.0, 0.0, 3.0, -1.0, 0.0, 4.0]), cz: RNG.standard_normal(6)}
    check_gradients(loss, [z], feed, simplify=True)


def test_cumsum_gradient_is_a_reverse_scan_linear_in_n():
    counts = []
    for n in (64, 128, 256):
        x = te.placeholder((4, n), name="X")
        y = nn.cumsum(x, axis=1)
        h = te.placeholder((4, n), name="H")
        (dx,) = te.differentiate(y, [x], head=h)
        assert len(_scans([dx])) == 1, te.graph_str(dx)
        counts.append(simplify.iteration_count([dx]))
        hv = RNG.standard_normal((4, n)).astype("float32")
        np.testing.assert_allclose(te.evaluate(dx, {h: hv}),
                                   np.flip(np.cumsum(np.flip(hv, 1), 1), 1), rtol=1e-4, atol=1e-4)
    # the reverse scan (4 + 4 (n - 1) points; its first step, a cheap load of the
    # head, is computed straight into the state), whose state lives in X's layout
    # (the re-indexing into it costs no pass: materialize.scan_view)
    assert counts == [4 * n for n in (64, 128, 256)]


def test_offset_bounds_and_larger_expressions():
    # Y[j] = exp(sum_{k <= j + 1} X[k] * W[k]) with k < 8: the last step is the full sum
    x = te.placeholder((8,), name="X", dtype="float64")
    w = te.placeholder((8,), name="W", dtype="float64")
    k = te.reduce_axis(8, "k")
    s = te.compute((8,), lambda j: te.sum(x[k] * w[k], axis=k, where=k <= j + 1), name="s")
    y = te.compute((8,), lambda j: te.exp(s[j]) * 2.0, name="y")
    (ys,) = simplify.simplify([y])
    assert _scans([ys])
    xv, wv = RNG.standard_normal(8), RNG.standard_normal(8)
    c = np.cumsum(xv * wv)
    want = 2 * np.exp(np.concatenate([c[1:], c[-1:]]))
    np.testing.assert_allclose(te.evaluate(ys, {x: xv, w: wv}), want, rtol=1e-12)
    feed = {x: xv, w: wv}
    r = te.reduce_axis(8, "r")
    loss = te.compute((), lambda: te.sum(y[r] * y[r], axis=r), name="L")
    check_gradients(loss, [x, w], feed, simplify=True)


def test_summand_reading_the_outer_index_stays_a_sum():
    # sum_{k <= j} X[k] * j is not a recurrence of the simple form: it stays a reduction
    x = te.placeholder((6,), name="X")
    k = te.reduce_axis(6, "k")
    y = te.compute((6,), lambda j: te.sum(x[k] * te.cast(j, "float32"), axis=k, where=k <= j),
                   name="y")
    (ys,) = simplify.simplify([y])
    assert not _scans([ys])
    v = RNG.standard_normal(6).astype("float32")
    np.testing.assert_allclose(te.evaluate(ys, {x: v}), np.cumsum(v) * np.arange(6), rtol=1e-5)


def test_kernel_cumsum_value_and_gradient():
    from texpr import codegen

    x = te.placeholder((64, 300), name="X")
    y = nn.cumsum(x, axis=1)
    c = te.placeholder((64, 300), name="C")
    r, q = te.reduce_axis(64, "r"), te.reduce_axis(300, "q")
    loss = te.compute((), lambda: te.sum(y[r, q] * c[r, q], axis=[r, q]), name="L")
    (dx,) = te.differentiate(loss, [x])
    kernel = codegen.build([y, dx], [x, c])
    xv = RNG.standard_normal((64, 300)).astype("float32")
    cv = RNG.standard_normal((64, 300)).astype("float32")
    yv, dxv = kernel(xv, cv)
    np.testing.assert_allclose(yv, np.cumsum(xv, axis=1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dxv, np.flip(np.cumsum(np.flip(cv, 1), 1), 1), rtol=1e-4,
                               atol=1e-4)
    assert kernel.source.count(" = scan(") == 2


# ---- a scan's state written in its reader's layout (materialize.scan_view) -----------


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_kernels_write_the_scan_state_in_place(axis, exclusive, reverse):
    # forward and gradient: each one scan unit writing the output's buffer through
    # the (transposed, reversed) view, no copy stage; values equal te.evaluate
    from texpr import codegen

    x = te.placeholder((5, 4), name="X", dtype="float64")
    y = nn.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse)
    h = te.placeholder((5, 4), name="H", dtype="float64")
    (dx,) = te.differentiate(y, [x], head=h)
    assert simplify.iteration_count([dx]) == 20
    kernel = codegen.build([y, dx], [x, h])
    assert len(kernel.units) == 2 and all("scan" in u.stage for u in kernel.units)
    feed = {x: RNG.standard_normal((5, 4)), h: RNG.standard_normal((5, 4))}
    for got, want in zip(kernel(feed[x], feed[h]), te.evaluate([y, dx], feed)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_user_scan_read_transposed_through_a_view():
    # a user scan whose step reads the state mirrored (not pointwise: the step is
    # lowered row by row), read only by a transposing output stage
    from texpr import codegen

    T, n = 6, 3
    X = te.placeholder((T, n), name="X", dtype="float64")
    S = te.placeholder((T, n), name="S", dtype="float64")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    upd = te.compute((T, n), lambda t, i: S[t - 1, n - 1 - i] * 0.5 + X[t, i], name="upd")
    s = te.scan(init, upd, S, name="s")
    out = te.compute((n, T), lambda i, t: s[T - 1 - t, i], name="out")
    a = te.reduce_axis(n, "a")
    loss = te.compute((), lambda: te.sum(out[a, 2] * 3.0, axis=a), name="L")
    (g,) = te.differentiate(loss, [X])
    feed = {X: RNG.standard_normal((T, n))}
    kernel = codegen.build([out, g], [X])
    assert [u.stage for u in kernel.units][0] == "s"
    for got, want in zip(kernel(feed[X]), te.evaluate([out, g], feed)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
