"""The compiled driver the bridges use (texpr.codegen.native_call): the same
outputs as the kernel's Python driver, bit for bit, and the same errors."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen import native_call


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
