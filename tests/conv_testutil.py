"""Helpers of the convolution GEMM-rewrite tests (tests/test_codegen_tap_split.py,
test_codegen_windows.py, test_codegen_shifts.py): a conv2d loss and the
checks of a kernel built from it against the evaluator, finite differences and
PyTorch."""

import numpy as np
import pytest

import texpr as te
from texpr.testing import numeric_gradient


def conv_loss(cin=3, cout=3, stride=1, dilation=1, padding=1, k=3, size=7, dtype="float64",
              with_conv=False):
    """``(L, [X, W, H])`` (and the convolution, ``with_conv``): ``L = sum(conv2d(X, W)
    * H)`` for a batch of 2 images of ``cin`` channels, ``size`` x ``size``."""
    X = te.placeholder((2, cin, size, size), "X", dtype)
    W = te.placeholder((cout, cin, k, k), "W", dtype)
    y = te.nn.conv2d(X, W, stride=stride, padding=padding, dilation=dilation, name="conv")
    H = te.placeholder(y.shape, "H", dtype)
    ax = [te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij")]
    L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
    return (L, [X, W, H], y) if with_conv else (L, [X, W, H])


def check_conv_kernel(kernel, L, ins, grads, stride, dilation, padding, seed,
                      output_padding=None):
    """A kernel of ``[L, dX, dW]`` (float64) against the evaluator, float64 finite
    differences and PyTorch (``conv_transpose2d`` where ``output_padding`` is
    given: ``L`` is then a transposed convolution's)."""
    X, W, H = ins
    rng = np.random.default_rng(seed)
    feed = {t: rng.standard_normal(t.shape) for t in ins}
    got = kernel(*[feed[t] for t in ins])
    for g, w in zip(got, te.evaluate([L] + grads, feed)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    for t, g in zip([X, W], got[1:]):
        np.testing.assert_allclose(g, numeric_gradient(L, t, feed), rtol=1e-6, atol=1e-7)
    torch = pytest.importorskip("torch")
    tx, tw = (torch.tensor(feed[t], requires_grad=True) for t in (X, W))
    if output_padding is None:
        y = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding, dilation=dilation)
    else:
        y = torch.nn.functional.conv_transpose2d(tx, tw, stride=stride, padding=padding,
                                                 output_padding=output_padding,
                                                 dilation=dilation)
    loss = (y * torch.tensor(feed[H])).sum()
    loss.backward()
    np.testing.assert_allclose(got[0], loss.item(), rtol=1e-10)
    np.testing.assert_allclose(got[1], tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got[2], tw.grad.numpy(), rtol=1e-10, atol=1e-10)


def assert_same_values(got, want, rtol=1e-4, atol=1e-4):
    """``got`` has NaN, +inf and -inf exactly where ``want`` has them, and is close
    to it elsewhere."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=rtol, atol=atol)
