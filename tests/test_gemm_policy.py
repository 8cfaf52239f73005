"""The one rule of both GEMM paths (codegen/ir/gemm_policy.py): a stage's plan on
numpy's BLAS and a scan step's np.dot accept the BLAS's result only where every
operand value is finite and no product or partial sum can overflow; elsewhere
their values are the evaluator's terms (an inf operand, products that overflow to
+inf and -inf: NaN term by term, where a fused multiply-add gave inf)."""

import ast
import os

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.codegen import create_schedule
from texpr.codegen.ir import gemm_policy

M, N, K = 16, 16, 16
#: values whose products overflow the dtype: |x * 2x| > max
HUGE = {"float64": 1e154, "float32": 2e19}


def _stage_kernel(dtype):
    A = te.placeholder((M, K), name="A", dtype=dtype)
    W = te.placeholder((N, K), name="W", dtype=dtype)
    k = te.reduce_axis(K, "k")
    Y = te.compute((M, N), lambda i, j: te.sum(A[i, k] * W[j, k], axis=k), name="Y")
    s = create_schedule([Y])
    s[Y].blas(True)
    kern = codegen.build([Y], [A, W], s)
    assert [u.kind for u in kern.units] == ["blas"]
    return kern, (lambda a, w: te.evaluate(Y, {A: a, W: w}))


def _scan_kernel(dtype):
    # two steps: step 1's state is A[0] (init), multiplied by W^T as a GEMM
    T = 2
    S = te.placeholder((T, M, K), name="S", dtype=dtype)
    X = te.placeholder((T, M, K), name="X", dtype=dtype)
    W = te.placeholder((N, K), name="W", dtype=dtype)
    k = te.reduce_axis(K, "k")
    pre = te.compute((T, M, N), lambda t, i, j: te.sum(S[t - 1, i, k] * W[j, k], axis=k),
                     name="pre")
    init = te.compute((1, M, K), lambda t, i, kk: X[t, i, kk], name="init")
    upd = te.compute((T, M, K), lambda t, i, kk: pre[t, i, kk], name="upd")
    sc = te.scan(init, upd, S, name="sc")
    kern = codegen.build([sc], [X, W])
    assert "np.dot(" in kern.source
    # the guard's limit is the policy's
    assert repr(gemm_policy.limit(dtype, K)) in kern.source

    def run(a, w):
        x = np.zeros((T, M, K), dtype)
        x[0] = a
        return kern(x, w)[0][1]

    def want(a, w):
        x = np.zeros((T, M, K), dtype)
        x[0] = a
        return te.evaluate(sc, {X: x, W: w})[1]
    return run, want


def _cases(dtype):
    """(name, A, W): finite moderate values; an inf operand; products that overflow
    to +inf and -inf in some rows only (the other rows keep their GEMM values)."""
    rng = np.random.default_rng(7)
    a, w = rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((N, K)).astype(dtype)
    yield "moderate", a, w
    a_inf = a.copy()
    a_inf[2, 5] = np.inf
    a_inf[4, 0] = -np.inf
    yield "inf operand", a_inf, w
    h = HUGE[dtype]
    a_big, w_big = a.copy(), w.copy()
    a_big[:3, :2] = h
    w_big[:, 0], w_big[:, 1] = 2 * h, -2 * h
    w_big[5, 1] = 0.5  # column 5: only +inf terms
    yield "overflowing products", a_big, w_big
    a_both = a_big.copy()
    a_both[7, 3] = np.nan
    yield "overflow and NaN", a_both, w_big


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("path", ["stage", "scan step"])
def test_both_gemm_paths_give_the_evaluators_values(path, dtype):
    run, want = _stage_kernel(dtype) if path == "stage" else _scan_kernel(dtype)
    if path == "stage":
        kern = run
        run = lambda a, w: kern(a, w)[0]  # noqa: E731
    for name, a, w in _cases(dtype):
        got, ref = run(a, w), want(a, w)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=name)
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref), err_msg=name)
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref), err_msg=name)
        fin = np.isfinite(ref)
        np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5 if dtype == "float32" else 1e-12,
                                   atol=1e-5 if dtype == "float32" else 1e-12, err_msg=name)
        if name == "overflowing products":
            assert np.isnan(ref[:3]).any() and np.isfinite(ref[3:]).all()


def test_the_stage_path_recomputes_only_the_elements_its_bound_refuses(monkeypatch):
    # products that overflow in A's row 1 only: that output row is summed term by
    # term (numpy), the others keep the GEMM's values
    from texpr.codegen.backends.numpy_host import exact

    kern, want = _stage_kernel("float64")
    chosen = []
    real = exact._add_terms

    def spy(p, zeroed, arrays, out, sel, *rest):
        chosen.append(np.flatnonzero(sel))
        return real(p, zeroed, arrays, out, sel, *rest)
    monkeypatch.setattr(exact, "_add_terms", spy)
    rng = np.random.default_rng(1)
    a, w = rng.standard_normal((M, K)), rng.standard_normal((N, K))
    a[1, :2] = 1e154
    w[:, 0], w[:, 1] = 2e154, -2e154
    got, ref = kern(a, w)[0], want(a, w)
    assert np.isnan(ref[1]).all() and np.isfinite(ref[[0] + list(range(2, M))]).all()
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert len(chosen) == 1
    np.testing.assert_array_equal(chosen[0], np.arange(N, 2 * N))  # row 1 only
    chosen.clear()
    a[1, :2] = 1.0
    kern(a, w)
    assert not chosen  # accepted as a whole: no exact path


def test_the_rule_and_its_limit():
    for dt in ("float32", "float64"):
        big = float(np.finfo(dt).max)
        # the limit leaves room for the roundings of K terms, and only that
        assert gemm_policy.limit(dt, 16) < big
        assert gemm_policy.limit(dt, 16) > big * (1 - 32 * float(np.finfo(dt).eps))
        assert gemm_policy.limit(dt, 10 ** 6) < gemm_policy.limit(dt, 16)
        assert gemm_policy.accepts(1.0, dt, 16)
        assert not gemm_policy.accepts(big, dt, 16)
        assert not gemm_policy.accepts(float("nan"), dt, 16)
        assert not gemm_policy.accepts(float("inf"), dt, 16)
        x = np.array([3.0, -4.0], dt)
        assert gemm_policy.magnitude(x) >= 4.0
        assert np.isnan(gemm_policy.magnitude(np.array([1.0, np.nan], dt)))
        assert gemm_policy.magnitude(np.array([np.inf, 1.0], dt)) == np.inf
        assert gemm_policy.magnitude(np.zeros(0, dt)) == 0.0


def test_analysis_and_ir_import_no_backend():
    # the plan's data (codegen/ir) and the matcher (codegen/analysis) are read by
    # every backend; only the backends run plans
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "codegen")
    for sub in ("analysis", "ir"):
        for f in sorted(os.listdir(os.path.join(root, sub))):
            if not f.endswith(".py"):
                continue
            tree = ast.parse(open(os.path.join(root, sub, f)).read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] + [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                assert not any("backends" in n for n in names), (sub, f, names)


def test_old_paths_of_the_plan_still_import():
    from texpr.codegen import contraction, gemm
    from texpr.codegen.ir.contraction_plan import ContractionPlan
    assert gemm.ContractionPlan is ContractionPlan is contraction.ContractionPlan
    assert gemm.OperandView is contraction.OperandView
