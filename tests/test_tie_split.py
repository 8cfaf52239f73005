"""Elementwise ``te.max`` / ``te.min`` at a tie: each operand gets half the adjoint
(docs/conventions.md, "Ties of max and min"), as ``jnp.maximum`` and
``torch.maximum`` do.

The attack's cases: a user's reducer combining with ``max(a, b) + min(a, b)``
(that is ``a + b``) gave ``[1, 0, 0, 1]`` on ``[1, 1, 2, 3]`` instead of ones, and a
log-sum-exp written with ``max`` gave 0 where finite differences give 0.135.
With the whole adjoint on one operand a composition that is smooth through the
tie got a wrong derivative there; each case below checks against float64
finite differences (the function is smooth at the tie, so they are exact).
"""

import numpy as np
import pytest

import texpr as te
from texpr.testing import numeric_gradient

F = "float64"


def _sum(y, name="L"):
    axes = [te.reduce_axis(n, f"r{d}") for d, n in enumerate(y.shape)]
    return te.compute((), lambda: te.sum(y[tuple(axes)], axis=axes), name=name)


def _grads(loss, xs, feed, simplify):
    return te.evaluate(list(te.differentiate(loss, xs, simplify=simplify).result), feed)


@pytest.mark.parametrize("simplify", [False, True])
def test_a_reducer_combining_with_max_plus_min_is_a_sum_at_ties(simplify):
    x = te.placeholder((4,), "X", F)
    plus = te.comm_reducer(lambda a, b: te.max(a, b) + te.min(a, b),
                           lambda d: te.const(0, d), name="maxplusmin")
    k = te.reduce_axis(4, "k")
    y = te.compute((), lambda: plus(x[k], axis=k), name="Y")
    for xv in ([1.0, 1.0, 2.0, 3.0], [2.0, 2.0, 2.0, 2.0], [0.0, -1.0, 0.0, -1.0]):
        feed = {x: np.array(xv)}
        (g,) = _grads(y, [x], feed, simplify)
        np.testing.assert_allclose(g, [1.0, 1.0, 1.0, 1.0])
        np.testing.assert_allclose(g, numeric_gradient(y, x, feed), atol=1e-8)


@pytest.mark.parametrize("simplify", [False, True])
def test_logaddexp_written_with_max_is_right_at_a_tie(simplify):
    a = te.placeholder((3,), "A", F)
    b = te.placeholder((3,), "B", F)

    def lae(u, v):
        m = te.max(u, v)
        return m + te.log(te.exp(u - m) + te.exp(v - m))

    y = te.compute((3,), lambda i: lae(a[i], b[i]), name="Y")
    loss = _sum(y)
    feed = {a: np.array([0.5, 2.0, -1.0]), b: np.array([0.5, 0.0, -1.0])}
    ga, gb = _grads(loss, [a, b], feed, simplify)
    np.testing.assert_allclose(ga, numeric_gradient(loss, a, feed), atol=1e-8)
    np.testing.assert_allclose(gb, numeric_gradient(loss, b, feed), atol=1e-8)
    np.testing.assert_allclose(ga[[0, 2]], [0.5, 0.5])


@pytest.mark.parametrize("simplify", [False, True])
def test_min_of_two_paths_then_max_at_a_tie_stays_balanced(simplify):
    # |a - b| = max(a, b) - min(a, b): not smooth at a tie; its adjoints there are 0
    # (half minus half), which is abs's own convention (derivative 0 at 0)
    a = te.placeholder((2,), "A", F)
    b = te.placeholder((2,), "B", F)
    y = te.compute((2,), lambda i: te.max(a[i], b[i]) - te.min(a[i], b[i]), name="Y")
    loss = _sum(y)
    feed = {a: np.array([1.0, 3.0]), b: np.array([1.0, -1.0])}
    ga, gb = _grads(loss, [a, b], feed, simplify)
    np.testing.assert_array_equal(ga, [0.0, 1.0])
    np.testing.assert_array_equal(gb, [0.0, -1.0])


@pytest.mark.parametrize("kind", ["max", "min"])
def test_a_max_or_min_reducer_gives_a_tie_to_its_first_point(kind):
    # inside a combine a tie is broken by position (texpr.jacobian.tie_ordered): an
    # even split there gave a three-point tie 1/2, 1/4, 1/2 (sum 1.25)
    x = te.placeholder((2, 4), "X", F)
    f, ident = (te.max, -np.inf) if kind == "max" else (te.min, np.inf)
    red = te.comm_reducer(lambda u, v: f(u, v), lambda d: te.const(ident, d), name="r" + kind)
    k = te.reduce_axis(4, "k")
    y = te.compute((2,), lambda i: red(x[i, k], axis=k), name="Y")
    head = te.placeholder((2,), "dY", F)
    sign = 1.0 if kind == "max" else -1.0
    xv = sign * np.array([[2.0, 2.0, 2.0, 2.0], [1.0, 4.0, 0.0, 4.0]])
    for simplify in (False, True):
        (g,) = te.evaluate(list(te.differentiate(y, [x], head=head, simplify=simplify).result),
                           {x: xv, head: np.array([8.0, 6.0])})
        np.testing.assert_array_equal(g, [[8.0, 0, 0, 0], [0, 6.0, 0, 0]])


def _top2():
    """(largest, second largest): a combine with max and min of both sides."""
    return te.comm_reducer(
        lambda a, b: (te.max(a[0], b[0]), te.max(te.min(a[0], b[0]), te.max(a[1], b[1]))),
        lambda d0, d1: (te.const(-np.inf, d0), te.const(-np.inf, d1)), name="top2")


@pytest.mark.parametrize("simplify", [False, True])
def test_a_top2_reducer_is_exact_where_its_sum_is_smooth_and_a_subgradient_elsewhere(simplify):
    x = te.placeholder((4,), "X", F)
    k = te.reduce_axis(4, "k")
    m1, m2 = te.compute((), lambda: _top2()((x[k], te.const(-np.inf, F)), axis=k), name="T")
    y = te.compute((), lambda: m1[()] + m2[()], name="Y")
    # smooth at these ties: the two largest are tied, or the second with the third
    # is not (a tie below the top two does not matter)
    for xv, want in (([3.0, 3.0, 1.0, 0.0], [1, 1, 0, 0]), ([0.0, 2.0, 5.0, 2.0], None),
                     ([1.0, 4.0, 1.0, 4.0], [0, 1, 0, 1]), ([2.0, 7.0, 0.0, 0.0], [1, 1, 0, 0])):
        feed = {x: np.array(xv)}
        (g,) = _grads(y, [x], feed, simplify)
        if want is not None:
            np.testing.assert_allclose(g, want)
            np.testing.assert_allclose(g, numeric_gradient(y, x, feed), atol=1e-8)
        else:  # 2 tied for second place: a subgradient, each tied point in [0, 1]
            assert g[2] == 1.0 and g[0] == 0.0 and g[1] + g[3] == 1.0
    (g,) = _grads(y, [x], {x: np.full(4, 3.0)}, simplify)  # all tied: sum 2, each <= 1
    assert g.sum() == 2.0 and ((g == 0) | (g == 1)).all()


@pytest.mark.parametrize("simplify", [False, True])
def test_an_online_logsumexp_reducer_is_exact_at_ties(simplify):
    # (running max m, sum of exp(x - m)): smooth (log-sum-exp is), ties in m included
    def combine(a, b):
        m = te.max(a[0], b[0])
        return m, a[1] * te.exp(a[0] - m) + b[1] * te.exp(b[0] - m)

    lse = te.comm_reducer(combine, lambda d0, d1: (te.const(-np.inf, d0), te.const(0, d1)),
                          name="lse")
    x = te.placeholder((5,), "X", F)
    k = te.reduce_axis(5, "k")
    m, s = te.compute((), lambda: lse((x[k], te.const(1.0, F)), axis=k), name="S")
    y = te.compute((), lambda: m[()] + te.log(s[()]), name="Y")
    for xv in ([1.0, 1.0, 1.0, 0.0, 1.0], [2.0, 0.0, 2.0, -1.0, 0.5]):
        feed = {x: np.array(xv)}
        (g,) = _grads(y, [x], feed, simplify)
        want = np.exp(xv) / np.exp(xv).sum()
        np.testing.assert_allclose(g, want, rtol=1e-12)
        np.testing.assert_allclose(g, numeric_gradient(y, x, feed), atol=1e-8)


def test_ties_match_torch_maximum_and_minimum():
    torch = pytest.importorskip("torch")
    a = te.placeholder((5,), "A", F)
    b = te.placeholder((5,), "B", F)
    y = te.compute((5,), lambda i: te.max(a[i], b[i]) * 3.0 + te.min(a[i], b[i]) * a[i], name="Y")
    loss = _sum(y)
    av = np.array([1.0, 2.0, -1.0, 0.0, 5.0])
    bv = np.array([1.0, 0.0, 4.0, 0.0, 5.0])
    ga, gb = _grads(loss, [a, b], {a: av, b: bv}, True)
    ta = torch.tensor(av, requires_grad=True)
    tb = torch.tensor(bv, requires_grad=True)
    (torch.maximum(ta, tb) * 3.0 + torch.minimum(ta, tb) * ta).sum().backward()
    np.testing.assert_allclose(ga, ta.grad.numpy())
    np.testing.assert_allclose(gb, tb.grad.numpy())


def test_ties_at_second_order_match_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    x = te.placeholder((3,), "X", F)
    # f = sum_i max(x_i^2, x_i) * x_i: a tie at x = 0 and x = 1
    y = te.compute((3,), lambda i: te.max(x[i] * x[i], x[i]) * x[i], name="Y")
    loss = _sum(y)
    xv = np.array([0.0, 1.0, 2.0])
    (g,) = te.differentiate(loss, [x])
    v = te.placeholder((3,), "V", F)
    r = te.reduce_axis(3, "r")
    gdotv = te.compute((), lambda: te.sum(g[r] * v[r], axis=r), name="GV")
    (hv,) = te.differentiate(gdotv, [x])
    vv = np.array([1.0, -2.0, 0.5])
    f = lambda z: jnp.sum(jnp.maximum(z * z, z) * z)
    want_g = jax.grad(f)(xv)
    want_hv = jax.jvp(jax.grad(f), (xv,), (vv,))[1]
    got_g, got_hv = te.evaluate([g, hv], {x: xv, v: vv})
    np.testing.assert_allclose(got_g, np.asarray(want_g))
    np.testing.assert_allclose(got_hv, np.asarray(want_hv))


def test_the_kernel_gives_the_evaluators_split():
    codegen = pytest.importorskip("texpr.codegen")
    a = te.placeholder((4,), "A", F)
    b = te.placeholder((4,), "B", F)
    y = te.compute((4,), lambda i: te.max(a[i], b[i]) + 2.0 * te.min(a[i], b[i]), name="Y")
    loss = _sum(y)
    ga, gb = te.differentiate(loss, [a, b])
    feed = {a: np.array([1.0, 2.0, np.nan, -0.0]), b: np.array([1.0, 3.0, 1.0, 0.0])}
    want = te.evaluate([loss, ga, gb], feed)
    np.testing.assert_array_equal(want[1], [1.5, 2.0, 1.5, 1.5])
    kernel = codegen.build([loss, ga, gb], [a, b])
    got = kernel(feed[a], feed[b])
    for w, g_ in zip(want, got):
        np.testing.assert_array_equal(g_, w)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_a_max_or_min_reducer_gives_the_first_nan_the_adjoint_as_the_built_in_does(kind):
    # a user's max reducer over a NaN gave every point 0 (the tie-ordered selects
    # compared NaN false both ways); NaN propagates, so the first NaN point is
    # where the value came from and receives the adjoint, as for te.max/te.min
    x = te.placeholder((4, 4), "X", F)
    f, ident = (te.max, -np.inf) if kind == "max" else (te.min, np.inf)
    red = te.comm_reducer(lambda u, v: f(u, v), lambda d: te.const(ident, d), name="r" + kind)
    k, kb = te.reduce_axis(4, "k"), te.reduce_axis(4, "kb")
    y = te.compute((4,), lambda i: red(x[i, k], axis=k), name="Y")
    builtin = te.compute((4,), lambda i: f(x[i, kb], axis=kb), name="B")
    head = te.placeholder((4,), "dY", F)
    nan = np.nan
    xv = np.array([[1.0, nan, 3.0, nan], [nan, 1.0, 2.0, 3.0],
                   [nan, nan, nan, nan], [1.0, 2.0, 3.0, nan]])
    feed = {x: xv, head: np.array([8.0, 6.0, 5.0, 3.0])}
    want = [[0, 8.0, 0, 0], [6.0, 0, 0, 0], [5.0, 0, 0, 0], [0, 0, 0, 3.0]]
    (gb,) = te.evaluate(list(te.differentiate(builtin, [x], head=head).result), feed)
    np.testing.assert_array_equal(gb, want)
    for simplify in (False, True):
        value, g = te.evaluate([y] + list(te.differentiate(y, [x], head=head,
                                                           simplify=simplify).result), feed)
        assert np.isnan(value).all()
        np.testing.assert_array_equal(g, want)


def test_a_top2_reducer_over_a_nan_sends_the_tops_adjoint_to_the_first_nan():
    x = te.placeholder((5,), "X", F)
    k = te.reduce_axis(5, "k")
    m1, m2 = te.compute((), lambda: _top2()((x[k], te.const(-np.inf, F)), axis=k), name="T")
    for xv, want in (([1.0, np.nan, 3.0, 2.0, np.nan], [0, 1.0, 0, 0, 0]),
                     ([1.0, 4.0, 3.0, np.nan, 0.0], [0, 0, 0, 1.0, 0])):
        for simplify in (False, True):
            (g,) = _grads(m1, [x], {x: np.array(xv)}, simplify)
            np.testing.assert_array_equal(g, want)


def test_the_kernel_of_a_max_reducer_over_nan_gives_the_evaluators_adjoint():
    codegen = pytest.importorskip("texpr.codegen")
    x = te.placeholder((3, 4), "X", F)
    red = te.comm_reducer(lambda u, v: te.max(u, v), lambda d: te.const(-np.inf, d), name="rmax")
    k = te.reduce_axis(4, "k")
    y = te.compute((3,), lambda i: red(x[i, k], axis=k), name="Y")
    loss = _sum(y)
    (g,) = te.differentiate(loss, [x])
    xv = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, np.nan]])
    want = te.evaluate([loss, g], {x: xv})
    np.testing.assert_array_equal(want[1], [[0, 1.0, 0, 0], [1.0, 0, 0, 0], [0, 0, 0, 1.0]])
    got = codegen.build([loss, g], [x])(xv)
    for w, g_ in zip(want, got):
        np.testing.assert_array_equal(g_, w)
