"""The IR: interning, construction checks, dtype promotion and the printer."""

import numpy as np
import pytest

import texpr as te
from texpr import expr as E


def test_nodes_are_interned():
    i = te.reduce_axis(4, "i")
    a = (i + 1) * 2
    b = (i + 1) * 2
    assert a is b
    X = te.placeholder((4,), name="X")
    assert X[i] is X[i]
    assert X[i + 1] is not X[i + 2]
    # 0.0 and -0.0, 1 and 1.0 and True stay distinct constants
    assert te.const(0.0) is not te.const(-0.0)
    assert te.const(1) is not te.const(1.0)
    assert te.const(True) is not te.const(1)


def test_nodes_are_immutable():
    e = te.const(3)
    with pytest.raises(AttributeError):
        e.attr = 4


def test_python_truth_of_expression_is_an_error():
    i = te.reduce_axis(3, "i")
    with pytest.raises(te.TexprError, match="if_then_else"):
        bool(i < 2)


def test_constant_folding_is_light():
    assert (te.const(2) + 3).value == 5
    assert (te.const(-7) // 2).value == -4
    assert (te.const(-7) % 2).value == 1
    x = te.placeholder((2,), name="x")
    k = te.reduce_axis(2, "k")
    e = x[k] * 1.0
    assert e is x[k]
    assert (x[k] * 0.0) is not te.const(0.0)  # float x*0 is not folded (NaN/inf semantics)


def test_a_comparison_of_one_variable_with_itself_is_decided():
    # a Jacobian's delta condition j == i after the substitution i := j: decided, so
    # the select around it goes and the condition inside can reach a sum's where=
    from texpr.visitor import substitute
    i, j = te.reduce_axis(4, "i"), te.reduce_axis(4, "j")
    assert te.expr_str(i == i) == "true" and te.expr_str(i < i) == "false"
    assert te.expr_str(i >= i) == "true" and te.expr_str(i != i) == "false"
    x = te.placeholder((4,), name="x")
    e = te.if_then_else((i == j) & (x[j] > 0), x[i], 0.0)
    got = substitute(e, {i: j})
    assert te.expr_str(got) == te.expr_str(te.if_then_else(x[j] > 0, x[j], 0.0))
    assert te.expr_str(substitute(te.if_then_else(i != j, x[i], 1.0), {i: j})) == "1.0"
    # the left operand of && stays (it is evaluated first and may fail); a float
    # compared with itself is not decided (NaN != NaN)
    assert te.expr_str(substitute((x[j] > 0) & (i == j), {i: j})) == te.expr_str(x[j] > 0)
    f = E.var("f", "float64")
    assert te.expr_str(f == f) != "true"
    assert isinstance(substitute((i == j) | (x[i] > 0), {i: j}), E.Const)


@pytest.mark.parametrize("a,b,expected", [
    ("float32", "float32", "float32"), ("float32", "float64", "float64"),
    ("int32", "int64", "int64"), ("int32", "float32", "float64"),
    ("int64", "float64", "float64"), ("bool", "int32", "int32"),
])
def test_dtype_promotion_is_numpy(a, b, expected):
    A = te.placeholder((2,), name="A", dtype=a)
    B = te.placeholder((2,), name="B", dtype=b)
    if a == "bool":
        C = te.compute((2,), lambda i: te.cast(A[i], "int32") + B[i], name="C")
        assert C.dtype == "int32"
        return
    C = te.compute((2,), lambda i: A[i] + B[i], name="C")
    assert C.dtype == expected
    fa = np.array([1, 2]).astype(a)
    fb = np.array([3, 4]).astype(b)
    out = te.evaluate(C, {A: fa, B: fb})
    assert out.dtype == np.result_type(fa, fb)
    np.testing.assert_array_equal(out, fa + fb)


def test_python_scalars_are_weak():
    A = te.placeholder((2,), name="A")
    assert te.compute((2,), lambda i: A[i] * 2.5).dtype == "float32"
    assert te.compute((2,), lambda i: A[i] + 1).dtype == "float32"
    D = te.placeholder((2,), name="D", dtype="float64")
    assert te.compute((2,), lambda i: D[i] * 2).dtype == "float64"
    assert te.compute((2,), lambda i: i * 2).dtype == "int64"


def test_printer_is_deterministic_and_readable():
    X = te.placeholder((4, 5), name="X")
    W = te.placeholder((3, 5), name="W")
    k = te.reduce_axis(5, "k")
    Y = te.compute((4, 3), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    assert repr(Y) == "Y[i<4, j<3] = sum(X[i, k] * W[j, k], axis=[k:0..5])  # float32"
    Z = te.compute((4,), lambda i: te.if_then_else(te.all(i > 0, i % 2 == 0), X[i - 1, i // 2], 0.0),
                   name="Z")
    assert repr(Z) == ("Z[i<4] = select(i > 0 && i % 2 == 0, X[i - 1, i // 2], 0.0)  # float32")
    # canonical printing ignores names
    X2 = te.placeholder((4, 5), name="P")
    W2 = te.placeholder((3, 5), name="Q")
    r = te.reduce_axis(5, "r")
    Y2 = te.compute((4, 3), lambda a, b: te.sum(X2[a, r] * W2[b, r], axis=r), name="R")
    assert te.graph_str(Y, canonical=True) == te.graph_str(Y2, canonical=True)
    assert te.graph_str(Y) != te.graph_str(Y2)


def test_a_long_definition_prints_wrapped_and_the_same_text_unwrapped():
    # a printed gradient was one line of about 900 characters (issue 52): repr and
    # print wrap at te.printer.REPR_WIDTH, and joining the lines' words gives back
    # the one-line text (the canonical and default forms, the cache's, never wrap)
    from texpr.printer import REPR_WIDTH, wrap_text

    x = te.placeholder((1, 2, 6, 6), name="X", dtype="float64")
    w = te.placeholder((2, 2, 3, 3), name="W", dtype="float64")
    y = te.nn.conv2d_transpose(x, w, stride=2, padding=1)
    h = te.placeholder(y.shape, name="H", dtype="float64")
    dx, dw = te.differentiate(y, [x, w], head=h)
    deep = te.compute((4,), lambda i: te.if_then_else(
        te.all(i >= 1, i <= 2), te.exp(x[0, 0, i, i] * 2.0 + x[0, 1, i, 5 - i]) * 3.0
        + te.tanh(x[0, 0, i + 1, i] - x[0, 1, i - 1, i]) / (1.0 + x[0, 0, 0, i] * x[0, 0, 0, i]),
        te.sqrt(te.abs(x[0, 1, i, i]) + 1.0)), name="Deep")
    for t in (dx, dw, deep):
        flat = te.tensor_str(t)
        assert "\n" not in flat and len(flat) > REPR_WIDTH
        shown = repr(t)
        assert shown == str(t) == te.tensor_str(t, width=REPR_WIDTH)
        lines = shown.split("\n")
        assert len(lines) > 2
        assert max(len(line) for line in lines) <= REPR_WIDTH
        squash = lambda s: "".join(s.split())  # noqa: E731
        assert squash(shown) == squash(flat)
        assert lines[0].startswith(flat.split(" = ")[0] + " = ")
        assert lines[-1].endswith("  # float64")
    # a binary chain breaks before its loosest operator, each operand indented
    assert wrap_text("a + bbbbbbbbbb * c + dddddddddd", width=16) == \
        "a\n+ bbbbbbbbbb * c\n+ dddddddddd"
    assert wrap_text("f(aaaa, g(bbbb, cccc))", width=12) == \
        "f(\n    aaaa,\n    g(\n        bbbb,\n        cccc\n    )\n)"
    # short definitions print as before (one line)
    X = te.placeholder((4,), name="X")
    assert repr(te.compute((4,), lambda i: X[i] * 2.0, name="Y")) == "Y[i<4] = X[i] * 2.0  # float32"


def test_nested_reduction_is_lifted_into_its_own_stage():
    X = te.placeholder((3, 4), name="X")
    k = te.reduce_axis(4, "k")
    M = te.compute((3,), lambda i: te.sum(X[i, k], axis=k) / 4, name="M")
    assert not isinstance(M.op.body[0], E.Reduce)
    (producer,) = M.op.input_tensors()
    assert isinstance(producer.op.body[0], E.Reduce)
    x = np.arange(12, dtype="float32").reshape(3, 4)
    np.testing.assert_allclose(te.evaluate(M, {X: x}), x.mean(1))


def test_reduction_inside_reduction_keeps_the_outer_axis():
    X = te.placeholder((3, 4, 5), name="X")
    k = te.reduce_axis(4, "k")
    r = te.reduce_axis(5, "r")
    # sum over k of (max over r)
    Y = te.compute((3,), lambda i: te.sum(te.max(X[i, k, r], axis=r), axis=k), name="Y")
    x = np.random.default_rng(0).normal(size=(3, 4, 5)).astype("float32")
    np.testing.assert_allclose(te.evaluate(Y, {X: x}), x.max(2).sum(1), rtol=1e-6)


# ---- malformed programs -------------------------------------------------------------


def test_wrong_number_of_indices():
    X = te.placeholder((3, 4), name="X")
    with pytest.raises(te.ShapeError, match="X has 2 dimension"):
        te.compute((3,), lambda i: X[i])


def test_float_used_as_index():
    X = te.placeholder((3,), name="X")
    F = te.placeholder((3,), name="F")
    with pytest.raises(te.DTypeError, match="index 0 of tensor X"):
        te.compute((3,), lambda i: X[F[i]])
    with pytest.raises(te.DTypeError, match="float"):
        te.compute((3,), lambda i: X[1.5])


def test_reduce_axis_outside_reduction():
    X = te.placeholder((3, 4), name="X")
    k = te.reduce_axis(4, "k")
    with pytest.raises(te.AxisError, match="reduction axis `k` is used outside"):
        te.compute((3,), lambda i: X[i, k], name="Bad")


def test_spatial_axis_as_reduction_axis():
    X = te.placeholder((3, 4), name="X")
    with pytest.raises(te.AxisError):
        te.compute((3,), lambda i: te.sum(X[i, 0], axis=i))


def test_foreign_variable():
    X = te.placeholder((3,), name="X")
    leaked = []
    te.compute((3,), lambda i: leaked.append(i) or X[i])
    with pytest.raises(te.AxisError, match="not an axis of this compute"):
        te.compute((3,), lambda j: X[leaked[0]], name="Foreign")


@pytest.mark.parametrize("shape", [(-1,), (2, -3), (2.5,), ("a",)])
def test_bad_extents(shape):
    with pytest.raises(te.ShapeError):
        te.placeholder(shape, name="P")
    with pytest.raises(te.ShapeError):
        te.compute(shape, lambda *i: 0.0)


def test_negative_reduce_axis():
    with pytest.raises(te.ShapeError):
        te.reduce_axis((3, 1), "k")
    with pytest.raises(te.ShapeError):
        te.reduce_axis(-2, "k")


def test_lambda_returning_non_expression():
    with pytest.raises(te.TexprError, match="must return a texpr expression"):
        te.compute((3,), lambda i: "hello", name="S")
    with pytest.raises(te.TexprError, match="must return a texpr expression"):
        te.compute((3,), lambda i: None, name="N")


def test_bad_dtype():
    with pytest.raises(te.DTypeError):
        te.placeholder((2,), dtype="complex64")
    with pytest.raises(te.DTypeError):
        te.placeholder((2,), dtype="nonsense")


def test_boolean_arithmetic_is_an_error():
    X = te.placeholder((3,), name="X")
    with pytest.raises(te.DTypeError):
        te.compute((3,), lambda i: (X[i] > 0) + 1.0)


def test_unknown_intrinsic_and_arity():
    from texpr.expr import call

    with pytest.raises(te.TexprError, match="unknown intrinsic"):
        call("gamma", te.const(1.0))
    with pytest.raises(te.TexprError, match="takes 2"):
        call("power", te.const(1.0))


def test_select_condition_must_be_boolean():
    X = te.placeholder((3,), name="X")
    with pytest.raises(te.DTypeError, match="boolean"):
        te.compute((3,), lambda i: te.if_then_else(X[i], 1.0, 0.0))


def test_errors_are_one_hierarchy():
    for cls in (te.ShapeError, te.DTypeError, te.OutOfBoundsError, te.AxisError, te.FeedError,
                te.NotDifferentiableError, te.ScheduleError):
        assert issubclass(cls, te.TexprError)
    assert issubclass(te.OutOfBoundsError, IndexError)


def test_lambda_arity_must_match_the_shape():
    X = te.placeholder((3, 4), name="X")
    with pytest.raises(te.ShapeError, match="2 dimension"):
        te.compute((3, 4), lambda i: X[i, 0], name="Arity")


def test_reduction_axis_listed_twice():
    X = te.placeholder((4, 5), name="X")
    k = te.reduce_axis(5, "k")
    with pytest.raises(te.AxisError, match="twice"):
        te.compute((4,), lambda i: te.sum(X[i, k], axis=[k, k]))


def test_scatter_add_init_of_another_dtype_is_an_error():
    # the kernels copy init into the output as it is: a float64 init of a float32
    # scatter-add is refused where it is built, naming the stage and the init
    I = te.placeholder((3,), name="I", dtype="int64")
    init = te.placeholder((4,), name="Z0", dtype="float64")
    with pytest.raises(te.DTypeError, match="scatter_add counts: init Z0 is float64"):
        te.scatter_add((4,), "float32", (3,), lambda p: I[p], lambda p: 1.0, init=init,
                       name="counts")
    ok = te.scatter_add((4,), "float64", (3,), lambda p: I[p], lambda p: 1.0, init=init)
    np.testing.assert_array_equal(
        te.evaluate(ok, {I: np.array([2, 0, 2]), init: np.ones(4)}), [2.0, 1.0, 3.0, 1.0])
