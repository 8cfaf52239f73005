"""Python and numpy habits on texpr expressions: a ConcretizationError (a TexprError)
that names the texpr spelling and never an internal class name, or, where it can,
the texpr meaning (abs, round, math.floor, numpy scalars)."""

import math
import operator

import numpy as np
import pytest

import texpr as te

INTERNAL_NAMES = ("Load", "Call", "Add", "Mul", "GT", "Const", "Tensor object", "Expr")


@pytest.fixture
def V():
    return te.placeholder((4,), name="V")


def _raises(fn, *spellings, cls=te.ConcretizationError):
    with pytest.raises(cls) as info:
        fn()
    msg = str(info.value)
    assert isinstance(info.value, te.TexprError)
    for s in spellings:
        assert s in msg, msg
    for name in INTERNAL_NAMES:
        assert name not in msg, msg
    return msg


# ---- math.* and float()/int()/complex() ------------------------------------------


@pytest.mark.parametrize("fn", [math.exp, math.log, math.sqrt, math.tanh, float])
def test_math_functions_name_the_intrinsics(V, fn):
    msg = _raises(lambda: fn(V[1]), "te.exp", "te.log", "`V[1]`")
    assert "te.cast(x, 'float32')" in msg


def test_math_on_a_derived_expression_and_on_a_scalar_tensor(V):
    _raises(lambda: math.exp(V[1] * 2.0 + V[0]), "te.exp", "`V[1] * 2.0 + V[0]`")
    S = te.placeholder((), name="S")
    _raises(lambda: math.exp(S), "te.exp", "tensor S")


def test_int_and_complex(V):
    _raises(lambda: int(V[1]), "te.cast(x, 'int64')")
    _raises(lambda: complex(V[1]), "no complex dtypes")


def test_concretization_error_is_a_type_error(V):
    # code that probes for numbers with `except TypeError` keeps working
    with pytest.raises(TypeError):
        float(V[0])


# ---- numpy ufuncs and functions ------------------------------------------------------


@pytest.mark.parametrize("ufunc,spelling", [
    (np.exp, "te.exp(x)"), (np.log, "te.log(x)"), (np.tanh, "te.tanh(x)"),
    (np.sqrt, "te.sqrt(x)"), (np.abs, "te.abs(x)"), (np.floor, "te.floor(x)"),
])
def test_numpy_unary_ufuncs_name_the_intrinsic(V, ufunc, spelling):
    _raises(lambda: ufunc(V[2]), f"numpy's {ufunc.__name__}", spelling)


def test_numpy_binary_ufuncs_and_functions(V):
    _raises(lambda: np.maximum(V[0], 0.0), "te.max(a, b)")
    _raises(lambda: np.minimum(V[0], V[1]), "te.min(a, b)")
    _raises(lambda: np.where(V[0] > 0, V[0], 0.0), "te.if_then_else(cond, a, b)")
    _raises(lambda: np.sum(V[0]), "te.sum")
    _raises(lambda: np.add.reduce(V[0]), "te.sum")
    _raises(lambda: np.arctan2(V[0], V[1]), "numpy's arctan2", "te.exp")


def test_a_numpy_array_operand_is_an_error_not_an_object_array(V):
    # it used to build a silent object array of expressions
    _raises(lambda: np.ones(3) + V[0], "te.placeholder")
    _raises(lambda: V[0] * np.ones(3), "te.placeholder", cls=te.TexprError)


def test_numpy_scalars_are_texpr_arithmetic(V):
    Y = te.compute((4,), lambda j: (np.float32(2) * V[j] - np.float32(1)) / np.float32(4)
                   + te.if_then_else(np.float32(0.5) > V[j], np.float32(1), np.float32(0)),
                   name="Y")
    v = np.array([0.0, 0.4, 1.5, -2.0], dtype="float32")
    np.testing.assert_allclose(te.evaluate(Y, {V: v}), (2 * v - 1) / 4 + (0.5 > v), rtol=1e-6)
    assert Y.dtype == "float32"


# ---- truth values: if, Python's max/min ----------------------------------------------


def test_python_max_min_and_if(V):
    for fn in (lambda: max(V[0], V[1]), lambda: min(V[0], 0.0), lambda: sorted([V[0], V[1]])):
        _raises(fn, "te.max(a, b)", "te.min(a, b)", "te.if_then_else")

    def branchy():
        if V[0] > 0:
            return V[0]
        return 0.0

    msg = _raises(branchy, "te.if_then_else(cond, a, b)", "`V[0] > 0.0`")
    assert "if/and/or/not" in msg
    _raises(lambda: V[0] > 0 and V[1] > 0, "te.all")


# ---- abs, round, math.floor: they work ------------------------------------------------


def test_abs_round_floor_ceil_trunc_work(V):
    v = np.array([-1.5, -0.5, 0.5, 2.7], dtype="float32")
    cases = {
        "abs": (lambda x: abs(x), np.abs(v)),
        "round": (lambda x: round(x), np.round(v)),
        "floor": (lambda x: math.floor(x), np.floor(v)),
        "ceil": (lambda x: math.ceil(x), np.ceil(v)),
        "trunc": (lambda x: math.trunc(x), np.trunc(v)),
    }
    for name, (fn, want) in cases.items():
        Y = te.compute((4,), lambda j: fn(V[j]), name=name)
        np.testing.assert_array_equal(te.evaluate(Y, {V: v}), want, err_msg=name)
    # abs differentiates as te.abs (0 at 0)
    k = te.reduce_axis(4, "k")
    L = te.compute((), lambda: te.sum(abs(V[k]), axis=k), name="L")
    (dV,) = te.differentiate(L, [V])
    w = np.array([-2.0, 0.0, 3.0, -0.1], dtype="float32")
    np.testing.assert_array_equal(te.evaluate(dV, {V: w}), np.sign(w))
    _raises(lambda: round(V[0], 2), "te.round(x * 10**2)")


# ---- Python integers: range(), list indexing ------------------------------------------


def test_range_and_list_indexing(V):
    I = te.placeholder((3,), name="I", dtype="int64")
    _raises(lambda: range(I[0]), "te.reduce_axis", "te.if_then_else", "`I[0]`")
    _raises(lambda: [1.0, 2.0][I[1]], "te.reduce_axis", "`I[1]`")
    _raises(lambda: operator.index(V[0] + 1.0), "Python integer")
    _raises(lambda: range(I), "tensor I")


def test_an_index_expression_still_indexes_a_tensor(V):
    I = te.placeholder((3,), name="I", dtype="int64")
    Y = te.compute((3,), lambda j: V[I[j]], name="Y")
    got = te.evaluate(Y, {V: np.arange(4, dtype="float32"), I: np.array([3, 0, 2])})
    np.testing.assert_array_equal(got, [3.0, 0.0, 2.0])


# ---- negative indices do not wrap --------------------------------------------------


def test_negative_constant_index_does_not_wrap(V):
    msg = _raises(lambda: V[-1], "negative indices do not wrap", "index 3",
                  cls=te.OutOfBoundsError)
    assert "V[-1]" in msg
    X = te.placeholder((2, 5), name="X")
    _raises(lambda: te.compute((2,), lambda i: X[i, -2]), "do not wrap", "index 3",
            cls=te.OutOfBoundsError)
    _raises(lambda: X(0, te.const(-5)), "do not wrap", cls=te.OutOfBoundsError)
    _raises(lambda: X[np.int64(-1), 0], "do not wrap", cls=te.OutOfBoundsError)


def test_expressions_that_may_be_negative_are_still_built_and_guarded(V):
    # a shifted read is legal when a condition guards it; only constants are rejected
    Y = te.compute((4,), lambda i: te.if_then_else(i >= 1, V[i - 1], 0.0), name="shift")
    v = np.arange(1, 5, dtype="float32")
    np.testing.assert_array_equal(te.evaluate(Y, {V: v}), [0.0, 1.0, 2.0, 3.0])
    # unguarded, the evaluator reports the out-of-bounds read (no wrap either)
    Z = te.compute((4,), lambda i: V[i - 1], name="unguarded")
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate(Z, {V: v})
