"""float32 exp and erf are written without a libm call (codegen.backends.numba_cpu.runtime: _exp_float32,
_erf_float32), so that their loops vectorise; they must stay within a few ulp of the
float64 functions rounded to float32, and keep the special values."""

import numpy as np
from scipy.special import erf

import texpr as te
from texpr import codegen

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 88.72, 88.73, -87.3, -103.3,
           -103.98, -104.5, 4.0, -4.0, 3.9999]


def _kernel(n):
    X = te.placeholder((n,), name="X")
    outs = [te.compute((n,), lambda i, f=f: f(X[i]), name=name)
            for name, f in (("e", te.exp), ("f", te.erf), ("s", te.sigmoid))]
    return X, outs, codegen.build(outs, [X], parallel=False, blas=False)


def test_exp_erf_sigmoid_within_a_few_ulp_and_special_values():
    x = np.concatenate([np.linspace(-110, 95, 200_001), SPECIAL]).astype("float32")
    X, outs, k = _kernel(x.size)
    assert "_exp_float32(" in k.source and "_erf_float32(" in k.source
    e, f, s = k(x)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        ref_e = np.exp(x64)
    ulp = np.spacing(np.float32(np.minimum(ref_e, 3e38)).astype(np.float32)).astype(np.float64)
    normal = np.isfinite(ref_e) & (ref_e > 1.2e-38) & (ref_e < 3.4e38)
    assert np.max(np.abs(e[normal] - ref_e[normal]) / ulp[normal]) <= 1.0
    tiny = (ref_e <= 1.2e-38)
    assert np.max(np.abs(e[tiny] - ref_e[tiny])) <= 2e-45  # subnormals kept, not flushed
    assert np.array_equal(np.isinf(e), ref_e > np.finfo(np.float32).max)
    assert np.array_equal(np.isnan(e), np.isnan(x)) and np.array_equal(np.isnan(f), np.isnan(x))
    assert np.nanmax(np.abs(f - erf(x64))) <= 4e-7 and np.nanmax(np.abs(f)) <= 1.0  # 3.3 ulp at 1
    def at(v):  # (-0.0 and 0.0 are one dict key: looked up one by one)
        return int(np.flatnonzero((x == v) & (np.signbit(x) == np.signbit(np.float32(v))))[0])

    assert f[at(np.inf)] == 1.0 and f[at(-np.inf)] == -1.0
    assert np.signbit(f[at(-0.0)]) and f[at(0.0)] == 0.0 and not np.signbit(f[at(0.0)])
    assert e[at(-np.inf)] == 0.0 and e[at(np.inf)] == np.inf and e[at(0.0)] == 1.0
    assert s[at(np.inf)] == 1.0 and s[at(-np.inf)] == 0.0
    want = te.evaluate(outs, {X: x})
    for got, w in zip((e, f, s), want):
        np.testing.assert_allclose(got, w, rtol=3e-7, atol=4e-7, equal_nan=True)


def test_float64_keeps_libm():
    X = te.placeholder((4,), name="X", dtype="float64")
    Y = te.compute((4,), lambda i: te.exp(X[i]) + te.erf(X[i]), name="Y")
    k = codegen.build([Y], [X], parallel=False, blas=False)
    assert "_exp_float32(" not in k.source and "math.erf(" in k.source
    x = np.array([-1.0, 0.0, 0.5, 2.0])
    np.testing.assert_allclose(k(x)[0], np.exp(x) + erf(x), rtol=1e-15)
