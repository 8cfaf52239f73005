"""The derivative-rule table: complete, and every rule right on its own.

Each rule is checked alone: an elementwise stage ``Y[i] = f(X0[i], X1[i])``,
its partial derivative built by :func:`texpr.rules.partial` (one rule
application on top of seeded loads), against float64 central finite
differences of ``Y`` through ``te.evaluate``.
"""

import math

import numpy as np
import pytest

import texpr as te
from texpr.expr import INTRINSICS, KINDS
from texpr.rules import RULES, jvp, partial

N = 6


def test_table_covers_every_kind_and_intrinsic():
    assert set(RULES) == set(KINDS) | set(INTRINSICS)
    assert all(callable(r) for r in RULES.values())


def _inputs(n, dtype="float64"):
    return [te.placeholder((N,), f"X{m}", dtype) for m in range(n)]


def _check(fn, values, eps=1e-6, rtol=1e-6, atol=1e-8, expect_zero=()):
    """Compare the rule's partials of fn with central differences, per argument."""
    xs = _inputs(len(values))
    feed = {x: np.asarray(v, dtype="float64") for x, v in zip(xs, values)}
    y = te.compute((N,), lambda i: fn(*[x[i] for x in xs]), name="Y")
    for m, x in enumerate(xs):
        built = {}

        def body(i, m=m):
            d = partial(fn(*[x[i] for x in xs]), xs[m][i])
            built["d"] = d
            return 0.0 if d is None else d

        dy = te.compute((N,), body, name=f"dY_dX{m}")
        plus, minus = dict(feed), dict(feed)
        plus[x] = feed[x] + eps
        minus[x] = feed[x] - eps
        fd = (te.evaluate(y, plus).astype("float64") - te.evaluate(y, minus)) / (2 * eps)
        got = te.evaluate(dy, feed)
        if m in expect_zero:
            assert built["d"] is None, f"argument {m}: expected a symbolic zero"
        np.testing.assert_allclose(got, fd, rtol=rtol, atol=atol, err_msg=f"argument {m}")


rng = np.random.default_rng(0)
A = rng.uniform(0.3, 2.0, N)
B = rng.uniform(-2.0, 2.0, N)
B_POS = rng.uniform(0.5, 1.5, N)


@pytest.mark.parametrize("name,fn,values", [
    ("add", lambda a, b: a + b, [A, B]),
    ("sub", lambda a, b: a - b, [A, B]),
    ("mul", lambda a, b: a * b, [A, B]),
    ("div", lambda a, b: a / b, [B, A]),
    ("floormod", lambda a, b: a % b, [np.array([0.3, 1.7, -0.4, 2.9, -3.3, 5.1]), B_POS]),
    ("min", lambda a, b: te.min(a, b), [A, B]),
    ("max", lambda a, b: te.max(a, b), [A, B]),
    ("select", lambda a, b: te.if_then_else(b > 0, a * a, 3.0 * b), [A, B]),
    ("select_nested_cond", lambda a, b: te.if_then_else((a > 1) & (b < 0), a * b, b - a), [A, B]),
])
def test_arithmetic_rules(name, fn, values):
    _check(fn, values)


def test_cast_float_rules():
    # float64 -> float32 -> float64 is linear: a large eps is exact up to rounding
    _check(lambda a: te.cast(te.cast(a * 3.0, "float32"), "float64"), [A], eps=1e-2, rtol=1e-5)


@pytest.mark.parametrize("name,fn", [
    ("floordiv", lambda a, b: a // b),
    ("cast_int", lambda a, b: te.cast(te.cast(a * 4.0, "int64"), "float64")),
    ("eq", lambda a, b: te.cast(a == b, "float64")),
    ("ne", lambda a, b: te.cast(a != b, "float64")),
    ("lt", lambda a, b: te.cast(a < b, "float64")),
    ("le", lambda a, b: te.cast(a <= b, "float64")),
    ("gt", lambda a, b: te.cast(a > b, "float64")),
    ("ge", lambda a, b: te.cast(a >= b, "float64")),
    ("and", lambda a, b: te.cast((a > 1) & (b > 0), "float64")),
    ("or", lambda a, b: te.cast((a > 1) | (b > 0), "float64")),
    ("not", lambda a, b: te.cast(~(a > b), "float64")),
    ("floor", lambda a, b: te.floor(a * 3.0) + 0 * b),
    ("ceil", lambda a, b: te.ceil(a * 3.0)),
    ("round", lambda a, b: te.round(a * 3.0)),
    ("trunc", lambda a, b: te.trunc(b * 3.0)),
])
def test_declared_zero_rules(name, fn):
    # values away from the jumps: finite differences are 0 there too
    a = np.array([0.41, 0.77, 1.09, 1.52, 1.93, 0.62])
    b = np.array([0.12, -0.71, 0.55, -1.39, 1.24, 0.93])
    if name == "floor":
        fn = lambda a, b: te.floor(a * 3.0)  # noqa: E731
    xs = _inputs(2)
    y = te.compute((N,), lambda i: fn(xs[0][i], xs[1][i]))
    for m in range(2):
        assert jvp(y.op.body[0], {xs[m][y.op.axis[0]]: te.const(1.0, "float64")}) is None
    _check(fn, [a, b])


def test_leaves_and_loads():
    x = te.placeholder((N,), "X", "float64")
    idx = te.placeholder((N,), "I", "int64")
    i = te.compute((N,), lambda i: i * 1.0).op.axis[0]
    assert jvp(te.const(2.0), {}) is None
    assert jvp(i, {i: te.const(1, "int64")}) is None  # an index variable: integer
    assert partial(x[i], x[i]).value == 1.0  # a seeded load
    assert jvp(x[i], {}) is None  # an unseeded load
    assert partial(idx[i] * 1.0, idx[i]) is None  # an int load: data-dependent index
    v = te.expr.var("v", "float64")
    assert partial(v * v, v) is not None


def test_reduce_is_structural():
    x = te.placeholder((N, 3), "X", "float64")
    seen = {}

    def body(i):
        k = te.reduce_axis(3, "k")
        r = te.sum(x[i, k], axis=k)
        seen["r"], seen["load"] = r, x[i, k]
        return r

    te.compute((N,), body)
    with pytest.raises(te.TexprError, match="reduction"):
        jvp(seen["r"], {seen["load"]: te.const(1.0, "float64")})


@pytest.mark.parametrize("name,fn,values", [
    ("exp", te.exp, [B]),
    ("log", te.log, [A]),
    ("sqrt", te.sqrt, [A]),
    ("rsqrt", te.rsqrt, [A]),
    ("tanh", te.tanh, [B]),
    ("sigmoid", te.sigmoid, [B]),
    ("abs", te.abs, [B]),
    ("sin", te.sin, [B]),
    ("cos", te.cos, [B]),
    ("erf", te.erf, [B]),
    ("power", te.power, [A, B]),
    ("power_const2", lambda a: te.power(a, 2.0), [B]),
    ("power_const3", lambda a: te.power(a, 3.0), [B]),
    ("power_const1", lambda a: te.power(a, 1.0), [B]),
    ("power_const_half", lambda a: a ** 0.5, [A]),
])
def test_intrinsic_rules(name, fn, values):
    _check(fn, values, rtol=1e-5)


def test_power_const0_is_symbolic_zero():
    _check(lambda a: te.power(a, 0.0), [B], expect_zero=(0,))


def test_sqrt_at_zero_convention_is_zero():
    x = te.placeholder((2,), "X", "float64")
    d = te.compute((2,), lambda i: partial(te.sqrt(x[i]), x[i]))
    np.testing.assert_array_equal(te.evaluate(d, {x: np.array([0.0, 4.0])}), [0.0, 0.25])


def test_abs_at_zero_is_zero():
    x = te.placeholder((3,), "X", "float64")
    d = te.compute((3,), lambda i: partial(te.abs(x[i]), x[i]))
    np.testing.assert_array_equal(te.evaluate(d, {x: np.array([-2.0, 0.0, 3.0])}), [-1, 0, 1])


def test_power_at_zero_base():
    # bug case C11A: d/db of a^b at a == 0 is 0, not NaN; d/da of a^1 at 0 is 1
    a = te.placeholder((2,), "A", "float64")
    b = te.placeholder((2,), "B", "float64")
    da = te.compute((2,), lambda i: partial(te.power(a[i], b[i]), a[i]))
    db = te.compute((2,), lambda i: partial(te.power(a[i], b[i]), b[i]))
    feed = {a: np.array([0.0, 2.0]), b: np.array([1.0, 1.0])}
    np.testing.assert_allclose(te.evaluate(da, feed), [1.0, 1.0])
    np.testing.assert_allclose(te.evaluate(db, feed), [0.0, 2 * math.log(2)])
    # a^0 is constant: d/da is 0 even at a == 0
    feed = {a: np.array([0.0, 2.0]), b: np.array([0.0, 0.0])}
    np.testing.assert_allclose(te.evaluate(da, feed), [0.0, 0.0])


def test_max_min_tie_convention():
    # te.max(a, b) / te.min(a, b): the winner gets the tangent, a tie or a NaN halves it
    a = te.placeholder((4,), "A", "float64")
    b = te.placeholder((4,), "B", "float64")
    feed = {a: np.array([1.0, 2.0, 0.0, np.nan]), b: np.array([1.0, 0.0, 2.0, 1.0])}
    for f, want_a in ((te.max, [0.5, 1, 0, 0.5]), (te.min, [0.5, 0, 1, 0.5])):
        da = te.compute((4,), lambda i: partial(f(a[i], b[i]), a[i]))
        db = te.compute((4,), lambda i: partial(f(a[i], b[i]), b[i]))
        np.testing.assert_array_equal(te.evaluate(da, feed), want_a)
        np.testing.assert_array_equal(te.evaluate(db, feed), 1.0 - np.array(want_a))


def test_select_untaken_branch_does_not_leak():
    # bug case C10C at the rule level: sqrt' of a negative number is never evaluated
    x = te.placeholder((2,), "X", "float64")
    d = te.compute((2,), lambda i: partial(te.if_then_else(x[i] > 0, te.sqrt(x[i]), x[i]), x[i]))
    np.testing.assert_array_equal(te.evaluate(d, {x: np.array([-1.0, -4.0])}), [1.0, 1.0])


def test_no_zero_terms_are_built():
    x = te.placeholder((N,), "X", "float64")
    w = te.placeholder((N,), "W", "float64")
    out = {}

    def body(i):
        out["d"] = partial(x[i] * w[i] + w[i] * 2.0, x[i])
        return x[i]

    te.compute((N,), body)
    # d/dx (x w + 2 w) = w: the w * 2 term contributes nothing, and 1 * w folds
    assert out["d"] is w[out["d"].args[0]]
