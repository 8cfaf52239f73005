"""Helpers of the operator-library tests (tests/test_nn_*.py).

Forward: compare ``te.evaluate`` with a numpy (or torch) reference. Gradients:
``te.differentiate(out, inputs, head=H)`` with ``H`` a random float64 head of
``out``'s shape, against float64 central finite differences of
``L = sum(out * H)`` (``texpr.testing.numeric_gradient``).
"""

import numpy as np
import pytest

import texpr as te
from texpr.testing import numeric_gradient

try:  # torch is an optional, extra reference
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = F = None


def ph(shape, name, dtype="float64"):
    """A placeholder (float64 by default: the finite differences need it)."""
    return te.placeholder(shape, name, dtype)


def rand(t, seed=0, low=-1.0, high=1.0):
    """A random float64 array of tensor ``t``'s shape."""
    return np.random.default_rng(seed).uniform(low, high, t.shape).astype(t.dtype)


def feed_of(*tensors, seed=0):
    """Random arrays for float placeholders (different seed per tensor)."""
    return {t: rand(t, seed + k) for k, t in enumerate(tensors)}


def tt(a):
    """numpy -> torch (float64 stays float64)."""
    return torch.from_numpy(np.ascontiguousarray(a))


def check_forward(out, feed, ref, rtol=1e-10, atol=1e-10):
    """Evaluate ``out`` and compare with the reference array; returns the value."""
    got = te.evaluate(out, feed)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=out.name)
    return got


def weighted_loss(out, head):
    """``L = sum(out * head)`` (a scalar stage)."""
    if out.shape == ():
        return te.compute((), lambda: out[()] * head[()], name="L")
    axes = [te.reduce_axis(n, f"s{d}") for d, n in enumerate(out.shape)]
    return te.compute((), lambda: te.sum(out[tuple(axes)] * head[tuple(axes)], axis=axes),
                      name="L")


def check_grads(out, wrt, feed, seed=123, rtol=1e-6, atol=1e-7, simplify=False, eps=1e-6):
    """Gradients of ``sum(out * H)`` w.r.t. each tensor of ``wrt`` (via ``head=H``) vs
    central finite differences. Returns the list of gradients."""
    head = ph(out.shape, "H", out.dtype)
    feed = dict(feed)
    feed[head] = np.random.default_rng(seed).standard_normal(out.shape).astype(out.dtype)
    res = te.differentiate(out, list(wrt), head=head, simplify=simplify)
    grads = te.evaluate(list(res.result), feed)
    loss = weighted_loss(out, head)
    for g, w in zip(grads, wrt):
        assert g.shape == w.shape, (g.shape, w.shape)
        fd = numeric_gradient(loss, w, feed, eps=eps)
        np.testing.assert_allclose(g, fd, rtol=rtol, atol=atol,
                                   err_msg=f"d({out.name})/d({w.name})")
    return grads


def gradients_match_torch(model):
    """Evaluate ``model.outs`` and the gradients of ``model.loss`` w.r.t.
    ``model.wrt()`` (te.evaluate on ``model.feed``) and check them against
    ``model.torch_reference()`` (float64, 1e-10). Returns ``(wrt, grads, got)``."""
    wrt = model.wrt()
    grads = list(te.differentiate(model.loss, wrt).result)
    got = te.evaluate(model.outs + grads, model.feed)
    ref_outs, ref_grads = model.torch_reference()
    names = [o.name for o in model.outs] + [f"d{t.name}" for t in wrt]
    for g, r, n in zip(got, ref_outs + ref_grads, names):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12, err_msg=n)
    return wrt, grads, got
