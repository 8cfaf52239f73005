"""Every run-time error names its stage, whichever lowering raises it (issue 52):
the evaluator, a loop nest, a scatter-add, a scan, a GEMM unit and a shift unit
all say ``stage NAME: ...`` (texpr.errors.in_stage). The GEMM path's own case
is tests/test_codegen_contraction.py's guarded-GEMM test."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.errors import TexprError

from fuzz import every_contraction_on_blas as blas_at_any_size


def _int_division():
    A = te.placeholder((4,), "A", "int64")
    D = te.placeholder((4,), "D", "int64")
    Q = te.compute((4,), lambda i: A[i] // D[i], name="Q")
    feed = {A: np.arange(4, dtype=np.int64), D: np.array([1, 2, 0, 3], dtype=np.int64)}
    return Q, [A, D], feed


def _scatter():
    I = te.placeholder((3,), "I", "int64")
    V = te.placeholder((3,), "V", "float64")
    S = te.scatter_add((4,), "float64", [3], lambda k: (I[k],), lambda k: V[k], name="S")
    feed = {I: np.array([0, 5, 1], dtype=np.int64), V: np.ones(3)}
    return S, [I, V], feed


def test_the_evaluator_names_the_stage():
    Q, _, feed = _int_division()
    with pytest.raises(TexprError, match="^stage Q: integer division by zero"):
        te.evaluate(Q, feed)


def test_the_evaluator_names_a_scatter_add_stage():
    S, _, feed = _scatter()
    with pytest.raises(te.OutOfBoundsError, match="^stage S: scatter-add index 0"):
        te.evaluate(S, feed)


def test_a_loop_nest_names_the_stage():
    Q, ins, feed = _int_division()
    kernel = codegen.build([Q], ins, parallel=False, blas=False)
    with pytest.raises(TexprError, match="^stage Q: integer division by zero"):
        kernel(*[feed[t] for t in ins])


def test_a_compiled_scatter_add_names_the_stage():
    S, ins, feed = _scatter()
    kernel = codegen.build([S], ins, parallel=False, blas=False)
    with pytest.raises(te.OutOfBoundsError, match="^stage S: "):
        kernel(*[feed[t] for t in ins])


def test_a_scan_names_the_stage():
    # a running sum whose step divides by a fed divisor
    X = te.placeholder((4, 2), "X", "int64")
    D = te.placeholder((4, 2), "D", "int64")
    init = te.compute((1, 2), lambda _, j: X[0, j] * 0, name="init")
    s = te.placeholder((4, 2), "s", "int64")
    step = te.compute((4, 2), lambda t, j: s[t - 1, j] + X[t, j] // D[t, j], name="step")
    (out,) = te.scan([init], [step], [s], inputs=[X, D], name="run")
    feed = {X: np.arange(8, dtype=np.int64).reshape(4, 2), D: np.ones((4, 2), np.int64)}
    feed[D][2, 1] = 0
    with pytest.raises(TexprError, match="^stage [A-Za-z_.0-9]+: integer division by zero"):
        te.evaluate(out, feed)
    kernel = codegen.build([out], [X, D], parallel=False, blas=False)
    with pytest.raises(TexprError, match="^stage [A-Za-z_.0-9]+: integer division by zero"):
        kernel(feed[X], feed[D])


def test_a_shift_unit_error_names_the_stage(monkeypatch):
    # a shift plan fails only on a broken invariant (its own message names the
    # stage); any error a unit kind raises reaches the caller named by the driver
    X = te.placeholder((2, 3, 7, 7), "X", "float32")
    W = te.placeholder((5, 3, 3, 3), "W", "float32")
    y = te.nn.conv2d(X, W, padding=1, name="conv")
    H = te.placeholder(y.shape, "H", "float32")
    ax = [te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij")]
    L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
    grads = list(te.differentiate(L, [X, W]).result)
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, [X, W, H])
    unit = next(u for u in kernel.units if u.kind == "shift")
    blas = next(u for u in kernel.units if u.kind == "blas")
    feed = [np.ones(t.shape, "float32") for t in (X, W, H)]

    def broken(arrays, err):
        raise TexprError("the plan's table is damaged")

    monkeypatch.setattr(unit, "run", broken)
    with pytest.raises(TexprError, match=f"^stage {unit.stage}: the plan's table is damaged"):
        kernel(*feed)
    monkeypatch.undo()
    monkeypatch.setattr(blas, "run", broken)
    with pytest.raises(TexprError, match=f"^stage {blas.stage}: the plan's table is damaged"):
        kernel(*feed)


def test_arrays_in_the_wrong_order_get_the_expected_order():
    # kernel(w, x) with X and W swapped: a shape error with no hint before (issue 52)
    X = te.placeholder((4, 5), "X", "float64")
    W = te.placeholder((3, 5), "W", "float32")
    r = te.reduce_axis(5, "r")
    Y = te.compute((4, 3), lambda i, j: te.sum(X[i, r] * W[j, r], axis=r), name="Y")
    kernel = codegen.build([Y], [X, W], parallel=False, blas=False)
    x = np.arange(20, dtype=np.float64).reshape(4, 5)
    w = np.ones((3, 5), np.float32)
    with pytest.raises(te.FeedError) as info:
        kernel(w, x)
    msg = str(info.value)
    assert msg.startswith("kernel: placeholder X expects shape (4, 5), got an array of "
                          "shape (3, 5)"), msg
    assert "in this order: X (4, 5) float64, W (3, 5) float32" in msg, msg
    assert "it was given: (3, 5) float32, (4, 5) float64" in msg, msg
    assert "fit the inputs in the order W, X" in msg and "kernel(W=..., X=...)" in msg, msg
    # the same shapes, only the dtypes swapped: the order is named too
    A = te.placeholder((2,), "A", "float64")
    B = te.placeholder((2,), "B", "int64")
    S = te.compute((2,), lambda i: A[i] + te.cast(B[i], "float64"), name="S")
    k2 = codegen.build([S], [A, B], parallel=False, blas=False)
    a, b = np.array([0.5, 1.5]), np.array([1, 2], np.int64)
    with pytest.raises(te.FeedError, match="(?s)expects dtype float64.*in the order B, A"):
        k2(b, a)
    # a wrong count lists the order with shapes and dtypes; no other order fits
    with pytest.raises(te.FeedError, match="(?s)expected 2 arrays.*A \\(2,\\) float64, B "
                                           "\\(2,\\) int64") as info:
        k2(a)
    assert "fit the inputs" not in str(info.value)
    np.testing.assert_array_equal(k2(a, b)[0], [1.5, 3.5])
    np.testing.assert_array_equal(k2(B=b, A=a)[0], [1.5, 3.5])
