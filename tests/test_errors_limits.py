"""Bad programs get TexprErrors where they enter, never raw numpy/islpy/Python errors:
constant out-of-range loads, extents and constants beyond int64, exact sizes and the
address space, the expression depth limit, cycles, messages naming the tensor."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.visitor import MAX_DEPTH, depth

F = "float32"


@pytest.mark.parametrize("shape,index", [((4,), (4, 0)), ((), (4, 0)), ((2, 3), (0, 3))])
def test_constant_out_of_range_index_is_an_out_of_bounds_error(shape, index):
    X = te.placeholder((4, 3), "X", F)
    Y = te.compute(shape, lambda *i: X[index] + 1.0, name="Y")
    with pytest.raises(te.OutOfBoundsError, match=r"stage Y: load `X\[.*reads X at index"):
        te.evaluate(Y, {X: np.zeros((4, 3), F)})


def test_out_of_range_point_is_reported_on_the_whole_grid():
    X = te.placeholder((4,), "X", F)
    Y = te.compute((2, 3), lambda i, j: X[i * 3 + j], name="Y")
    with pytest.raises(te.OutOfBoundsError, match=r"index \(4,\).*at i=1, j=1"):
        te.evaluate(Y, {X: np.zeros(4, F)})


@pytest.mark.parametrize("make", [
    lambda: te.compute((2**63,), lambda i: i * 1.0, name="B"),
    lambda: te.placeholder((3, 2**64), "P"),
    lambda: te.reduce_axis(2**63, "k"),
    lambda: te.reduce_axis((-(2**63) - 1, 0), "k"),
])
def test_extents_beyond_int64_are_shape_errors(make):
    with pytest.raises(te.ShapeError, match="int64"):
        make()


@pytest.mark.parametrize("big", [2**63, 2**64 + 5, -(2**63) - 1])
def test_integer_constants_beyond_int64_are_dtype_errors(big):
    X = te.placeholder((4,), "X", F)
    with pytest.raises(te.DTypeError, match=r"compute Y: the integer constant .* does not fit int64"):
        te.compute((3,), lambda i: X[te.min(i + big, 3)], name="Y")
    with pytest.raises(te.DTypeError, match="does not fit int32"):
        te.const(2**31, "int32")


def test_sizes_are_exact_and_checked_against_the_address_space():
    Y = te.compute((2**62 + 1, 4), lambda i, j: 1.0, name="Y")
    assert Y.size == (2**62 + 1) * 4
    P = te.placeholder((2**32, 2**32), "P", F)
    assert P.size == 2**64
    with pytest.raises(te.ShapeError, match="Y .*address space"):
        te.evaluate(Y, {})
    Z = te.compute((2**31, 2**31), lambda i, j: 1.0, name="Z")  # 2**62 elements fit int64
    with pytest.raises(te.ShapeError, match="Z .*address space"):
        te.evaluate(Z, {})
    # the kernel's buffers too (int64 products wrapped to 4 elements: a segfault)
    X = te.placeholder((4,), "X", F)
    W = te.compute((2**62 + 1, 4), lambda i, j: X[j] * 2.0, name="W")
    for out in (W, Z):
        with pytest.raises(te.ShapeError, match="build: tensor .* address space"):
            codegen.build([out], [X] if out is W else [])


def _chain(levels, kind):
    """A body of exactly ``levels`` levels (or the deepest below it)."""
    P = te.placeholder((3,), "P", "float64")

    def body(i):
        e = P[i]
        while True:
            new = te.tanh(e) * 1.01 + 0.1 if kind == "chain" else e + P[(i + 1) % 3]
            if depth(new) > levels:
                return e
            e = new
    return P, body


@pytest.mark.parametrize("kind", ["chain", "sum"])
def test_bodies_at_the_depth_limit_evaluate_differentiate_simplify_and_build(kind):
    P, body = _chain(MAX_DEPTH, kind)
    D = te.compute((3,), body, name="D")
    assert MAX_DEPTH - 3 <= depth(D.op.body) <= MAX_DEPTH
    L = te.compute((), lambda: D[0] + D[1] + D[2], name="L")
    feed = {P: np.array([0.1, -0.2, 0.3])}
    (raw,) = te.differentiate(L, [P], simplify=False)
    (simp,) = te.differentiate(L, [P])
    g_raw, g_simp = te.evaluate([raw, simp], feed)
    np.testing.assert_allclose(g_simp, g_raw, rtol=1e-12)
    eps = 1e-6
    fd = [(te.evaluate(L, {P: feed[P] + eps * e}) - te.evaluate(L, {P: feed[P] - eps * e}))
          / (2 * eps) for e in np.eye(3)]
    np.testing.assert_allclose(g_raw, fd, rtol=1e-5, atol=1e-7)
    loss, g = codegen.build([L, simp], [P])(feed[P])
    np.testing.assert_allclose(loss, te.evaluate(L, feed), rtol=1e-12)
    np.testing.assert_allclose(g, g_raw, rtol=1e-12)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 10_000])
def test_bodies_deeper_than_the_limit_are_rejected_naming_it(levels):
    P = te.placeholder((3,), "P", F)

    def body(i):
        e = P[i]
        for _ in range(levels // 2):
            e = te.tanh(e) + 1.0
        return e
    with pytest.raises(te.TexprError, match=f"compute D: the body is .* levels deep.*MAX_DEPTH = {MAX_DEPTH}"):
        te.compute((3,), body, name="D")


def test_a_body_mutated_into_a_cycle_is_a_texpr_error():
    X = te.placeholder((3,), "X", F)
    Y = te.compute((3,), lambda i: X[i] + 1.0, name="Y")
    Z = te.compute((3,), lambda i: Y[i] * 2.0, name="Z")
    # the body alone: Y now reads Z (its consumer), its input list is stale
    Y.op.body = (Z[Y.op.axis[0]] + 1.0,)
    with pytest.raises(te.TexprError, match="stage Y: reads Z, which is not computed before it"):
        te.evaluate(Z, {X: np.zeros(3, F)})
    # body and input list: topo_order sees the cycle
    Y.op._inputs = [Z]
    with pytest.raises(te.TexprError, match="cycle"):
        te.evaluate(Z, {X: np.zeros(3, F)})
    with pytest.raises(te.TexprError, match="cycle"):
        te.topo_order([Z])


@pytest.mark.parametrize("body,match", [
    (lambda X: lambda i: te.sum(X[i], axis=i), "compute Y: sum: axis="),
    (lambda X: lambda i: te.sum(X[i], axis=te.reduce_axis(3, "k"), where=X[i]),
     "compute Y: where= expects a boolean"),
    (lambda X: lambda i: te.cast(X[i], "complex64"), "compute Y: .*complex64"),
    (lambda X: lambda i: te.if_then_else(X[i], 1.0, 0.0), "compute Y: if_then_else expects"),
])
def test_messages_for_malformed_axes_conditions_casts_name_the_tensor(body, match):
    X = te.placeholder((3,), "X", F)
    with pytest.raises(te.TexprError, match=match):
        te.compute((3,), body(X), name="Y")


@pytest.mark.parametrize("index", [
    lambda i: te.max(te.min(i * (2**62 - 5) + 2**62, 3), 0),   # the product wraps at i = 2
    lambda i: te.max(te.min((2**62 + i) + 2**62, 3), 0),       # the sum wraps at i = 0
    lambda i: te.max(te.min(-(2**62) - 2**62 - (i + 1), 3), 0),  # the difference wraps
])
def test_the_evaluator_never_wraps_integer_arithmetic(index):
    # the exact index is min(huge, 3) = 3: a wrapped one reads X[0] (a silent wrong value)
    X = te.placeholder((4,), name="X", dtype="float64")
    Y = te.compute((4,), lambda i: X[index(i)], name="Y")
    with pytest.raises(te.TexprError, match="would wrap around"):
        te.evaluate(Y, {X: np.arange(4.0)})


@pytest.mark.parametrize("index", [
    lambda i: te.min(te.const(-2, "int64") * te.const(-(2**62), "int64") + i, 3),
    lambda i: te.min(te.const(2**62, "int64") + te.const(2**62, "int64") + i, 3),
    lambda i: te.min(te.const(-(2**62), "int64") - te.const(2**62 + 1, "int64") + i, 3),
])
def test_folding_constants_refuses_what_would_wrap(index):
    # two constants folded at construction (or by the simplifier, fuzz seed
    # 7000000475) into a value outside int64: refused naming the arithmetic
    X = te.placeholder((4,), name="X", dtype="float64")
    with pytest.raises(te.TexprError, match=r"compute Y: the integer arithmetic .* would wrap"):
        te.compute((4,), lambda i: X[index(i)], name="Y")


def test_integer_arithmetic_is_checked_only_where_it_is_evaluated():
    X = te.placeholder((4,), name="X", dtype="float64")
    Y = te.compute((4,), lambda i: te.if_then_else(
        i < 2, X[te.max(te.min(i * (2**62 - 5) + 2**62, 3), 0)], -1.0), name="Y")
    np.testing.assert_array_equal(te.evaluate(Y, {X: np.arange(4.0)}), [3.0, 3.0, -1.0, -1.0])
    # a data-dependent product: the loaded value decides
    I = te.placeholder((2,), name="I", dtype="int64")
    Z = te.compute((2,), lambda i: X[te.max(te.min(I[i] * (2**40), 3), 0)], name="Z")
    np.testing.assert_array_equal(te.evaluate(Z, {X: np.arange(4.0), I: np.array([0, 1])}),
                                  [0.0, 3.0])
    with pytest.raises(te.TexprError, match="would wrap around"):
        te.evaluate(Z, {X: np.arange(4.0), I: np.array([0, 2**23])})


def test_a_kernel_reports_the_first_out_of_range_index():
    from texpr import codegen

    X = te.placeholder((4,), name="X", dtype="float64")
    I = te.placeholder((5,), name="I", dtype="int64")
    Y = te.compute((5,), lambda i: X[I[i]] * 2.0, name="Y")
    k = codegen.build(Y, [X, I])
    np.testing.assert_array_equal(k(np.arange(4.0), np.array([3, 2, 1, 0, 0]))[0],
                                  [6.0, 4.0, 2.0, 0.0, 0.0])
    with pytest.raises(te.OutOfBoundsError, match=r"index value 7\)"):
        k(np.arange(4.0), np.array([0, 7, -3, 9, 1]))
    with pytest.raises(te.OutOfBoundsError, match=r"index value -3\)"):
        k(np.arange(4.0), np.array([0, 1, -3, 9, 1]))


def test_shared_subexpressions_are_walked_once_per_node():
    # e = e * e thirty times: 31 distinct nodes, 2**30 paths (a tree walk never ends)
    X = te.placeholder((3,), name="X", dtype="float64")

    def body(i):
        e = X[i]
        for _ in range(30):
            e = e * e
        return e
    Y = te.compute((3,), body, name="Y")
    x = np.array([1.0, -1.0, 1.0000001])
    np.testing.assert_allclose(te.evaluate(Y, {X: x}), x ** (2**30), rtol=1e-6)


def test_numeric_gradient_refuses_a_float32_graph():
    # a step of 1e-6 is rounding noise in float32: the differences were silently
    # wrong (max error 2.17 on the README tour's dW, a new user's trial)
    import numpy as np
    import texpr as te
    from texpr.testing import numeric_gradient
    X = te.placeholder((3,), "X")
    k = te.reduce_axis(3, "k")
    L = te.compute((), lambda: te.sum(X[k] * X[k], axis=k), name="L")
    with pytest.raises(te.TexprError, match=r"L is float32.*float64"):
        numeric_gradient(L, X, {X: np.ones(3, "float32")})
    # a float32 graph with a step float32 resolves is still allowed
    got = numeric_gradient(L, X, {X: np.ones(3, "float32")}, eps=1e-2)
    np.testing.assert_allclose(got, 2.0, rtol=1e-3)


@pytest.mark.parametrize("make, match", [
    (lambda x: te.cast("float64", x[0]), r"cast: unknown dtype X\[0\].*value first"),
    (lambda x: te.cast(x[0], x), r"cast: unknown dtype"),
    (lambda x: te.const("a", "float32"), r"constant 'a': expected a number.*str"),
    (lambda x: te.const("1", "bool"), r"constant '1': expected a number"),
    (lambda x: te.const(None), r"constant None"),
    (lambda x: te.const([1.0], "float64"), r"constant \[1.0\]"),
    (lambda x: te.const(float("nan"), "int32"), r"constant nan is not an integer"),
    (lambda x: x[0] + "a", r"str"),
], ids=["cast-swapped", "cast-tensor", "const-str", "const-str-bool", "const-none",
        "const-list", "const-nan-int", "add-str"])
def test_a_constant_or_dtype_that_is_not_one_is_a_dtype_error(make, match):
    # an attack found raw ValueErrors (numpy's dtype parser, float('a')) for the first two
    x = te.placeholder((2,), "X")
    with pytest.raises(te.TexprError, match=match):
        make(x)


def test_a_0d_array_is_a_constant():
    x = te.placeholder((2,), "X", "float64")
    y = te.compute((2,), lambda i: x[i] * te.const(np.array(3.0)), name="Y")
    np.testing.assert_array_equal(te.evaluate(y, {x: np.array([1.0, 2.0])}), [3.0, 6.0])


_BIG = -(2**62)


@pytest.mark.parametrize("make", [
    # a reduction axis fixed by its where (solve_equalities puts k = 0 into the index)
    lambda X: (lambda k: te.compute(
        (2,), lambda i: te.sum(X[te.max(te.min((k + 3) * _BIG, 3), 0)], axis=k,
                               where=k == 0), name="W1"))(te.reduce_axis((0, 4), "k")),
    # an axis of one point (the fuzzer's seed 7022002120 had this form)
    lambda X: (lambda k: te.compute(
        (1,), lambda i: te.sum(X[te.max(te.min((2 * k + 3) * _BIG, 3), 0)], axis=k),
        name="W1"))(te.reduce_axis((0, 1), "k")),
])
def test_the_simplifier_refusing_a_wrapping_constant_names_the_stage(make):
    # te.evaluate refuses the same program for the same arithmetic; the
    # simplifier's refusal says which stage and which rewrite met it
    X = te.placeholder((4,), "X", F)
    Y = make(X)
    with pytest.raises(te.TexprError, match="wrap around"):
        te.evaluate(Y, {X: np.arange(4.0, dtype=F)})
    with pytest.raises(te.DTypeError,
                       match=r"^stage W1: the integer arithmetic `3 \* -4611686018427387904`"
                             r".*wrap around.*solve_equalities"):
        simplify.simplify([Y])


def test_a_cast_of_an_int_constant_outside_its_dtype_is_a_dtype_error():
    # attack helper-30: numpy's own OverflowError came out of te.cast
    with pytest.raises(te.DTypeError, match="int32"):
        te.cast(te.const(2**40, "int64"), "int32")
    assert te.cast(te.const(-7, "int64"), "int32").value == -7
