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
    kernel = codegen.build([Q], ins, parallel=False)
    with pytest.raises(TexprError, match="^stage Q: integer division by zero"):
        kernel(*[feed[t] for t in ins])


def test_a_compiled_scatter_add_names_the_stage():
    S, ins, feed = _scatter()
    kernel = codegen.build([S], ins, parallel=False)
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
    kernel = codegen.build([out], [X, D], parallel=False)
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
