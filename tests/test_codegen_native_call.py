"""The compiled driver the bridges use (texpr.codegen.backends.numba_cpu.native_call): the same
outputs as the kernel's Python driver, bit for bit, and the same errors."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen.backends.numba_cpu import native_call


def _run(kernel, arrays):
    outs = [np.empty(t.shape, dtype=t.dtype) for t in kernel.outputs]
    r = native_call.runner(kernel)
    assert r is not None
    r.run([a.ctypes.data for a in arrays] + [o.ctypes.data for o in outs])
    return outs


def test_temporaries_of_several_dtypes_copies_and_a_gather():
    # an int32 temporary (a data-dependent index) and a float64 one (row sums)
    # live in the driver's allocation; Y is listed twice and X as an output
    X = te.placeholder((5, 3), name="X", dtype="float64")
    I = te.placeholder((4,), name="I", dtype="int64")
    j = te.reduce_axis(3, name="j")
    J = te.compute((4,), lambda i: te.cast((I[i] * 3 + 1) % 5, "int32"), name="J")
    S = te.compute((5,), lambda r: te.sum(X[r, j] * X[r, j], axis=j), name="S")
    Y = te.compute((4, 3), lambda i, c: X[J[i], c] / (1.0 + S[J[i]]), name="Y")
    kernel = codegen.build([Y, X, Y, J], [X, I])
    assert {"J", "S"} <= set(kernel.stages)
    x = np.random.default_rng(0).standard_normal((5, 3))
    i = np.array([0, 3, 1, 4])
    want = kernel(x, i)
    got = _run(kernel, [x, i])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_the_drivers_raise_the_same_error():
    X = te.placeholder((4,), name="X", dtype="float32")
    I = te.placeholder((3,), name="I", dtype="int32")
    G = te.compute((3,), lambda i: X[I[i]] * 2.0, name="G")
    kernel = codegen.build(G, [X, I])
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(_run(kernel, [x, np.array([3, 0, 1], np.int32)])[0],
                                  [6.0, 0.0, 2.0])
    bad = np.array([0, 7, 1], np.int32)
    with pytest.raises(te.OutOfBoundsError) as want:
        kernel(x, bad)
    with pytest.raises(te.OutOfBoundsError) as got:
        _run(kernel, [x, bad])
    assert str(got.value) == str(want.value)
    assert "index value 7" in str(got.value)


def test_every_dtype_zero_d_empty_and_size_one_outputs_against_the_evaluator():
    # one kernel: a 0-d reduction, a sum over an empty axis, an empty output, int32,
    # int64 and bool stages, a float32 cast; placeholders listed as outputs
    # (0-d, empty, bool) and one int32 stage listed three times
    A = te.placeholder((3, 4), name="A", dtype="float64")
    B = te.placeholder((), name="B", dtype="float32")
    E = te.placeholder((0, 4), name="E", dtype="float64")
    I = te.placeholder((3,), name="I", dtype="int32")
    L = te.placeholder((1, 1), name="L", dtype="int64")
    M = te.placeholder((4,), name="M", dtype="bool")
    r, r0 = te.reduce_axis(4, "r"), te.reduce_axis(0, "r0")
    S = te.compute((), lambda: te.sum(A[0, r], axis=r) * te.cast(B[()], "float64"), name="S")
    Es = te.compute((4,), lambda j: te.sum(E[r0, j], axis=r0) + 1.0, name="Es")
    Ee = te.compute((0, 4), lambda i, j: E[i, j] * 2.0, name="Ee")
    Ii = te.compute((3,), lambda i: I[i] * 2 + te.cast(L[0, 0], "int32"), name="Ii")
    Ll = te.compute((1, 1), lambda i, j: L[i, j] * 3, name="Ll")
    Mb = te.compute((4,), lambda j: te.if_then_else(M[j], A[1, j] > 0.0, A[2, j] > 0.0),
                    name="Mb")
    F = te.compute((3, 4), lambda i, j: te.cast(A[i, j], "float32") + B[()], name="F")
    outs = [S, Es, Ee, Ii, Ll, Mb, F, A, Ii, Ii, M, B, E, S]
    ins = [A, B, E, I, L, M]
    kernel = codegen.build(outs, ins)
    vals = [np.random.default_rng(1).standard_normal((3, 4)), np.array(1.5, np.float32),
            np.zeros((0, 4)), np.array([1, -2, 3], np.int32), np.array([[7]], np.int64),
            np.array([True, False, True, False])]
    want = te.evaluate(outs, dict(zip(ins, vals)))
    got = _run(kernel, vals)
    for t, g, k, w in zip(outs, got, kernel(*vals), want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, t.name
        np.testing.assert_array_equal(g, k, err_msg=t.name)  # the same units
        if w.dtype.kind == "f":  # the evaluator sums in another order
            np.testing.assert_allclose(g, w, rtol=1e-6 if w.dtype == np.float32 else 1e-14,
                                       err_msg=t.name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=t.name)


def test_a_unit_over_max_args_falls_back_and_one_at_the_limit_runs():
    # a stage reading n placeholders is one unit of n + 2 arguments (its output
    # and the error flag): 24 (MAX_ARGS) runs in the driver, 25 has no descriptor
    assert native_call.MAX_ARGS == 24
    for n, native in ((22, True), (23, False)):
        P = [te.placeholder((5,), name=f"P{i}", dtype="float64" if i % 2 else "int32")
             for i in range(n)]

        def body(i):
            e = te.cast(P[0][i], "float64")
            for k, p in enumerate(P[1:]):
                e = e + te.cast(p[i], "float64") * (k + 2)
            return e

        Y = te.compute((5,), body, name="Ymany")
        kernel = codegen.build(Y, P)
        assert [len(u.args) + 1 for u in kernel.units] == [n + 2]
        rng = np.random.default_rng(n)
        vals = [rng.standard_normal(5) if i % 2 else rng.integers(-9, 9, 5).astype(np.int32)
                for i in range(n)]
        want = te.evaluate(Y, dict(zip(P, vals)))
        assert (native_call.runner(kernel) is not None) is native
        if native:
            np.testing.assert_array_equal(_run(kernel, vals)[0], want)
        np.testing.assert_array_equal(kernel(*vals)[0], want)
