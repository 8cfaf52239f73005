"""kernel.explain(): each unit's lowering, and why a contraction stayed a loop nest."""

import numpy as np

import texpr as te
from dense_testutil import dense_grad
from texpr import codegen


_dense_grad = dense_grad


def test_explain_names_each_unit_its_lowering_and_the_blas_work():
    X, W, L, dW = _dense_grad()
    k = codegen.build([L, dW], [X, W])
    text = k.explain()
    for stage in k.stages:
        assert stage in text
    assert "GEMM (64x96 @ 96x48)" in text  # Y on BLAS
    assert f"{2 * 64 * 96 * 48:,} on BLAS" in text  # Y and dW: 64*96*48 multiply-adds each


def test_explain_says_why_a_contraction_stayed_a_loop_nest():
    X, W, L, dW = _dense_grad(8, 12, 6)
    k = codegen.build([L, dW], [X, W], options={"blas_min_flop": 1 << 60})
    text = k.explain()
    assert "stays a loop nest (576 multiply-adds; BLAS does not pay: too small for BLAS" in text
    assert "0 on BLAS" in text
    x = np.random.default_rng(0).normal(size=(8, 12)).astype("float32")
    w = np.random.default_rng(1).normal(size=(6, 12)).astype("float32")
    got = k(x, w)
    want = te.evaluate([L, dW], {X: x, W: w})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4)


def test_explain_of_a_serial_build_says_so():
    X, W, L, dW = _dense_grad(8, 12, 6)
    k = codegen.build([L, dW], [X, W], parallel=False, blas=False)
    assert "blas=False" in k.explain()
