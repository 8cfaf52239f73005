"""The dense layer's gradient that several codegen tests build: ``L = sum(Y * Y)``
with ``Y = te.nn.dense(X, W)``, and ``dL/dW``."""

import texpr as te


def dense_grad(n=64, k=96, m=48, dtype="float32"):
    """``(X, W, L, dW)``: placeholders X (n, k) and W (m, k), the loss and its
    gradient with respect to W (three GEMM-shaped stages at the default sizes)."""
    X = te.placeholder((n, k), name="X", dtype=dtype)
    W = te.placeholder((m, k), name="W", dtype=dtype)
    Y = te.nn.dense(X, W, name="Y")
    r = te.reduce_axis(m, "r")
    i = te.reduce_axis(n, "i")
    L = te.compute((), lambda: te.sum(Y[i, r] * Y[i, r], axis=[i, r]), name="L")
    dW, = te.differentiate(L, [W])
    return X, W, L, dW
