"""Higher-order derivatives through simplified stages (issue 17) and iteration
domains that start above 0.

The simplifier turns a gather's gradient into a scatter-add over the points
where the condition holds, e.g. ``k in [1, 4)``; differentiating that stage
again must keep the lower bound (it once rebuilt the axis over ``[0, 3)``, a
silent shift). Every case is checked against nested float64 finite
differences (tests/nested_fd.py), with simplify on and off at each level, and
a few through compiled kernels.
"""

import itertools

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from nested_fd import assert_close, derivative_chain, directional_fd, fd_level

X_VALUES = np.array([0.5, -1.0, 2.0, 1.5])
I_VALUES = np.array([3, 0, 2, 2])


def _gather_loss(cond, f=lambda v: v ** 3, axis=4):
    x = te.placeholder((4,), "X", "float64")
    i = te.placeholder((4,), "I", "int64")
    k = te.reduce_axis(axis, "k")
    loss = te.compute((), lambda: te.sum(f(x[i[k]]), axis=k, where=cond(k)), name="L")
    return x, i, loss


def _hessian_fd(loss, x, feed):
    n = x.shape[0]
    eye = np.eye(n)
    return np.array([[directional_fd(loss, x, feed, [eye[a], eye[b]]) for b in range(n)]
                     for a in range(n)])


# ---- the case of the issue ---------------------------------------------------------------


def test_issue_case_hessian_of_simplified_gradient():
    x, i, loss = _gather_loss(lambda k: k >= 1)
    feed = {x: X_VALUES, i: I_VALUES}
    (g,) = te.differentiate(loss, [x])
    np.testing.assert_allclose(te.evaluate(g, feed), [0.75, 0.0, 24.0, 0.0])
    (h,) = te.differentiate(g, [x])
    np.testing.assert_allclose(te.evaluate(h, feed), np.diag([3.0, 0.0, 24.0, 0.0]))
    kernel = codegen.build([g, h], [x, i])
    kg, kh = kernel(feed[x], feed[i])
    np.testing.assert_allclose(kg, [0.75, 0.0, 24.0, 0.0])
    np.testing.assert_allclose(kh, np.diag([3.0, 0.0, 24.0, 0.0]))


_CONDITIONS = {
    "k>=1": lambda k: k >= 1,
    "k%2==1": lambda k: k % 2 == 1,
    "k>=2": lambda k: k >= 2,
    "1<=k<=3": lambda k: (k >= 1) & (k <= 3),
    "k<3": lambda k: k < 3,
    "k%3!=0": lambda k: k % 3 != 0,
}
_FUNCTIONS = {"cube": lambda v: v ** 3, "sin": te.sin, "exp_half": lambda v: te.exp(v * 0.5),
              "tanh_sq": lambda v: te.tanh(v) * v}


@pytest.mark.parametrize("cond", sorted(_CONDITIONS))
@pytest.mark.parametrize("fname", sorted(_FUNCTIONS))
def test_gather_hessians_every_simplify_combination(cond, fname):
    x, i, loss = _gather_loss(_CONDITIONS[cond], _FUNCTIONS[fname])
    feed = {x: X_VALUES, i: I_VALUES}
    want = _hessian_fd(loss, x, feed)
    for s1, s2 in itertools.product((True, False), repeat=2):
        (g,) = te.differentiate(loss, [x], simplify=s1)
        (h,) = te.differentiate(g, [x], simplify=s2)
        assert_close(te.evaluate(h, feed), want, f"{cond} {fname} simplify={s1},{s2}")


def test_reduce_axis_starting_above_zero_second_order():
    # the axis itself over [1, 4) (no where=): the simplifier's scatter keeps [1, 4)
    x, i, loss = _gather_loss(lambda k: True, axis=(1, 4))
    feed = {x: X_VALUES, i: I_VALUES}
    (g,) = te.differentiate(loss, [x])
    np.testing.assert_allclose(te.evaluate(g, feed), [0.75, 0.0, 24.0, 0.0])
    (h,) = te.differentiate(g, [x])
    np.testing.assert_allclose(te.evaluate(h, feed), np.diag([3.0, 0.0, 24.0, 0.0]))


def test_third_order_through_a_simplified_hvp_of_a_gathered_row_product():
    # Y[r] = prod_{k >= 1} X[I[r, k]];  L = sum_r C[r] * Y[r]
    x = te.placeholder((4,), "X", "float64")
    idx = te.placeholder((2, 4), "I", "int64")
    c = te.placeholder((2,), "C", "float64")
    k = te.reduce_axis(4, "k")
    y = te.compute((2,), lambda r: te.prod(x[idx[r, k]], axis=k, where=k >= 1), name="Y")
    s = te.reduce_axis(2, "s")
    loss = te.compute((), lambda: te.sum(c[s] * y[s], axis=s), name="L")
    v = te.placeholder((4,), "V", "float64")
    u = te.placeholder((4,), "U", "float64")
    rng = np.random.default_rng(3)
    feed = {x: X_VALUES, idx: np.array([[1, 3, 2, 3], [0, 2, 0, 1]]), c: np.array([0.7, -1.3]),
            v: rng.uniform(-1, 1, 4), u: rng.uniform(-1, 1, 4)}
    want = [fd_level(loss, x, feed, dirs) for dirs in ([], [feed[v]], [feed[v], feed[u]])]
    for simp in itertools.product((True, False), repeat=3):
        for via_head in ((True, True), (False, False), (True, False)):
            levels = derivative_chain(loss, x, [v, u], simp, via_head)
            for n, (lv, w) in enumerate(zip(levels, want)):
                assert_close(te.evaluate(lv, feed), w,
                             f"level {n + 1} simplify={simp} via_head={via_head}", rtol=1e-6)


def test_third_order_compiled_kernel():
    x, i, loss = _gather_loss(lambda k: k % 2 == 1, te.sin)
    v = te.placeholder((4,), "V", "float64")
    u = te.placeholder((4,), "U", "float64")
    feed = {x: X_VALUES, i: I_VALUES, v: np.array([0.3, -0.2, 0.9, 0.4]),
            u: np.array([-0.5, 0.8, 0.1, 0.6])}
    levels = derivative_chain(loss, x, [v, u], (True, True, True), (True, True))
    got = codegen.build(levels, [x, i, v, u])(*[feed[t] for t in (x, i, v, u)])
    for n, dirs in enumerate(([], [feed[v]], [feed[v], feed[u]])):
        assert_close(got[n], fd_level(loss, x, feed, dirs), f"level {n + 1}")


# ---- scatter-add stages built directly over [lo, hi) --------------------------------------


def _scatter_case(lo, hi, where=None):
    x = te.placeholder((5,), "X", "float64")
    i = te.placeholder((6,), "I", "int64")
    # S[I[p]] += X[p - 1]^2 for p in [lo, hi): the values read depend on p itself
    s = te.scatter_add((4,), "float64", ((lo, hi),), lambda p: i[p],
                       lambda p: x[p - 1] * x[p - 1], where=where)
    c = te.placeholder((4,), "C", "float64")
    j = te.reduce_axis(4, "j")
    loss = te.compute((), lambda: te.sum(c[j] * te.sin(s[j]), axis=j), name="L")
    rng = np.random.default_rng(1)
    feed = {x: rng.uniform(-1, 1, 5), i: np.array([3, 0, 2, 2, 1, 3]),
            c: rng.uniform(-1, 1, 4)}
    return x, i, c, s, loss, feed


def test_scatter_domain_lower_bound_evaluates_and_prints():
    x, i, c, s, loss, feed = _scatter_case(2, 6)
    xv, iv = feed[x], feed[i]
    want = np.zeros(4)
    for p in range(2, 6):
        want[iv[p]] += xv[p - 1] ** 2
    np.testing.assert_allclose(te.evaluate(s, feed), want)
    assert "for [p0:2..6]" in te.tensor_str(s)
    # the printed graph tells [2, 6) from [0, 4) (canonical text included)
    _x, _i, _c, s0, _l, _f = _scatter_case(0, 4)
    assert te.graph_str(s, canonical=True) != te.graph_str(s0, canonical=True)
    (got,) = codegen.build(s, [x, i])(xv, iv)
    np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("lo,hi,where", [(2, 6, None), (1, 5, lambda p: p % 2 == 1),
                                         (3, 6, lambda p: p <= 4)])
def test_scatter_domain_second_order(lo, hi, where):
    x, i, c, s, loss, feed = _scatter_case(lo, hi, where)
    want1 = fd_level(loss, x, feed, [])
    eye = np.eye(5)
    want2 = np.array([fd_level(loss, x, feed, [eye[a]]) for a in range(5)])
    for s1, s2 in itertools.product((True, False), repeat=2):
        (g,) = te.differentiate(loss, [x], simplify=s1)
        assert_close(te.evaluate(g, feed), want1, f"gradient simplify={s1}")
        (h,) = te.differentiate(g, [x], simplify=s2)
        assert_close(te.evaluate(h, feed), want2, f"Hessian simplify={s1},{s2}")
    kernel = codegen.build([g, h], [x, i, c])
    kg, kh = kernel(feed[x], feed[i], feed[c])
    assert_close(kg, want1, "kernel gradient")
    assert_close(kh, want2, "kernel Hessian")


def test_scatter_domain_errors():
    with pytest.raises(te.ShapeError, match="negative extent"):
        te.scatter_add((4,), "float64", ((3, 1),), lambda p: p, lambda p: 1.0)
    with pytest.raises(te.ShapeError, match="bounds must be ints"):
        te.scatter_add((4,), "float64", ((0.5, 3),), lambda p: p, lambda p: 1.0)
    with pytest.raises(te.ShapeError, match="leaves int64"):
        te.scatter_add((4,), "float64", ((0, 2**63),), lambda p: p, lambda p: 1.0)


def test_compute_axes_start_at_zero():
    from texpr.expr import const, iter_var

    a = iter_var(1, 4, "i", "spatial")
    with pytest.raises(te.AxisError, match=r"\[0, extent\)"):
        te.ComputeOp("Bad", (a,), (const(1.0),))


def test_split_of_an_axis_starting_above_zero():
    # a reduction over [3, 9) split by 4: the outer loop runs over 0..2, not 0..1
    x = te.placeholder((9,), "X", "float64")
    k = te.reduce_axis((3, 9), "k")
    y = te.compute((), lambda: te.sum(x[k] * x[k], axis=k), name="Y")
    s = codegen.create_schedule(y)
    outer, inner = s[y].split(k, 4)
    assert outer.dom == (0, 3) and inner.dom == (0, 4)
    xv = np.arange(9.0)
    np.testing.assert_allclose(codegen.build(y, [x], s)(xv)[0], np.sum(xv[3:] ** 2))


def test_reductions_starting_above_zero_compile():
    # a long sum (unrolled in scalar mode), a short one (lanes in buffer mode), a max,
    # a prod and their first and second derivatives, over axes that start above 0
    x = te.placeholder((3, 40), "X", "float64")
    k1, k2, k3, k4 = (te.reduce_axis(d, n) for d, n in
                      (((3, 40), "k1"), ((2, 5), "k2"), ((1, 6), "k3"), ((4, 9), "k4")))
    long_ = te.compute((3,), lambda i: te.sum(x[i, k1] * x[i, k1], axis=k1), name="Long")
    short = te.compute((3, 8), lambda i, j: te.sum(x[i, j + k2] * x[i, k2], axis=k2), name="Short")
    mx = te.compute((3,), lambda i: te.max(x[i, 2 * k3], axis=k3), name="Mx")
    pr = te.compute((3,), lambda i: te.prod(x[i, k4], axis=k4), name="Pr")
    r, c = te.reduce_axis(3, "r"), te.reduce_axis(8, "c")
    loss = te.compute((), lambda: te.sum(te.sin(long_[r]) + mx[r] * pr[r], axis=r)
                      + te.sum(te.sum(short[r, c] * short[r, c], axis=c), axis=r), name="L")
    (g,) = te.differentiate(loss, [x])
    v = te.placeholder((3, 40), "V", "float64")
    (hv,) = te.differentiate(g, [x], head=v)
    rng = np.random.default_rng(5)
    feed = {x: spread_rows(rng), v: rng.uniform(-0.5, 0.5, (3, 40))}
    tensors = [long_, short, mx, pr, g, hv]
    got = codegen.build(tensors, [x, v])(feed[x], feed[v])
    for t, a, b in zip(tensors, got, te.evaluate(tensors, feed)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12, err_msg=t.name)
    xv = feed[x]
    np.testing.assert_allclose(got[0], np.sum(xv[:, 3:] ** 2, axis=1))
    np.testing.assert_allclose(got[2], np.max(xv[:, 2:12:2], axis=1))
    np.testing.assert_allclose(got[3], np.prod(xv[:, 4:9], axis=1))
    # the Hessian-vector product against a finite difference of the gradient
    eps = 1e-6
    gp = te.evaluate(g, {x: xv + eps * feed[v]})
    gm = te.evaluate(g, {x: xv - eps * feed[v]})
    assert_close(got[5], (gp - gm) / (2 * eps), "HVP", rtol=1e-6, atol=1e-7)


def spread_rows(rng):
    """(3, 40) values, distinct and far apart within each row (max without near-ties)."""
    return np.stack([rng.permutation(np.linspace(-1.2, 1.2, 40)) for _ in range(3)])


# ---- max/min ties at second order: the documented rule ------------------------------------


@pytest.mark.parametrize("kind", ["max", "min"])
def test_tied_extreme_second_order_goes_to_the_first_point(kind):
    x = te.placeholder((4,), "X", "float64")
    k = te.reduce_axis((1, 4), "k")
    red = te.max if kind == "max" else te.min
    y = te.compute((), lambda: red(x[k] * x[k] * x[k], axis=k), name="Y")
    xv = np.array([5.0, 0.5, -2.0, 0.5]) if kind == "max" else np.array([-5.0, -0.5, 2.0, -0.5])
    for s1, s2 in itertools.product((True, False), repeat=2):
        (g,) = te.differentiate(y, [x], simplify=s1)
        (h,) = te.differentiate(g, [x], simplify=s2)
        want_g = np.zeros(4)
        want_g[1] = 3 * xv[1] ** 2  # the first tied point (k = 1) gets the whole adjoint
        want_h = np.zeros((4, 4))
        want_h[1, 1] = 6 * xv[1]
        np.testing.assert_allclose(te.evaluate(g, {x: xv}), want_g)
        np.testing.assert_allclose(te.evaluate(h, {x: xv}), want_h)


# ---- manual= edges -----------------------------------------------------------------------


def test_manual_function_returning_none_is_an_error_naming_the_edge():
    x = te.placeholder((3,), "X", "float64")
    y = te.compute((3,), lambda j: x[j] * x[j], name="Y")
    s = te.reduce_axis(3, "s")
    loss = te.compute((), lambda: te.sum(y[s], axis=s), name="L")

    def forgot_return(out, inp, head):
        te.compute(inp.shape, lambda j: 2.0 * head[j] * inp[j])

    with pytest.raises(te.TexprError, match=r"\(Y, X\) returned None"):
        te.differentiate(loss, [x], manual={(y, x): forgot_return})
    with pytest.raises(te.TexprError, match=r"\(L, None\)|\(L, Y\) returned None"):
        te.differentiate(loss, [x], manual={(loss, None): lambda o, i, h: None})
