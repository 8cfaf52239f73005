"""Memory stays flat over graphs, ops and calls made and dropped (issue 52).

The interning table's keys held a load's tensor (and a reduction's combiner and
axes) strongly, so a dropped graph stayed alive until the loads over it had been
collected and their entries removed: one collection freed one layer, and 10
graphs built and dropped left 20 placeholders alive after ``gc.collect()``.
The index cleanup's memo held every node it visited (loads included) across
calls. Counts of live texpr objects and the bytes tracemalloc traces come back
to where they were.
"""

import gc
import sys
import tracemalloc
import weakref

import numpy as np
import pytest

import texpr as te
from texpr import expr as E
from texpr.tensor import Operation, Tensor


def _live():
    """Live texpr objects by kind (after one collection)."""
    gc.collect()
    n = {"ops": 0, "tensors": 0, "exprs": 0}
    for o in gc.get_objects():
        t = type(o)  # (not isinstance: it reads __class__, which some modules warn about)
        if issubclass(t, Operation):
            n["ops"] += 1
        elif issubclass(t, Tensor):
            n["tensors"] += 1
        elif issubclass(t, E.Expr):
            n["exprs"] += 1
    n["interned"] = len(E._INTERN)
    return n


def _matmul_tanh(n=4, m=3, k=5, dtype="float64"):
    X = te.placeholder((n, k), name="X", dtype=dtype)
    W = te.placeholder((m, k), name="W", dtype=dtype)
    r = te.reduce_axis(k, name="r")
    Y = te.compute((n, m), lambda i, j: te.tanh(te.sum(X[i, r] * W[j, r], axis=r)), name="Y")
    Z = te.compute((n, m), lambda i, j: Y[i, j] * 2.0 + X[i, 0], name="Z")
    return Z, X, W


def test_dropped_graphs_are_freed_by_one_collection():
    refs = []
    for _ in range(10):
        Z, X, W = _matmul_tanh()
        refs += [weakref.ref(X.op), weakref.ref(W.op), weakref.ref(Z.op),
                 weakref.ref(Z.op.body[0])]
        del Z, X, W
    gc.collect()
    assert [r() for r in refs if r() is not None] == []


def test_interning_identity_holds_while_alive_and_entries_go_with_their_nodes():
    X = te.placeholder((4, 5), name="X", dtype="float64")
    i, j = E.var("i"), E.var("j")
    a = X[i, j] * 2.0 + 1.0
    assert X[i, j] is X[i, j]
    assert (X[i, j] * 2.0 + 1.0) is a
    r = te.reduce_axis(5, name="r")
    s = te.sum(X[i, r], axis=r)
    assert te.sum(X[i, r], axis=r) is s
    # another tensor of the same shape is another load, another reduction
    X2 = te.placeholder((4, 5), name="X", dtype="float64")
    l2, s2 = X2[i, j], te.sum(X2[i, r], axis=r)
    assert l2 is not X[i, j] and s2 is not s
    before = len(E._INTERN)
    refs = [weakref.ref(X2), weakref.ref(l2), weakref.ref(s2)]
    del X2, l2, s2
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert len(E._INTERN) <= before - 3  # the loads over X2, the sum: their entries gone
    assert X[i, j] * 2.0 + 1.0 is a and te.sum(X[i, r], axis=r) is s


def test_simplified_gradients_release_their_graphs(monkeypatch):
    # the cleanup's memo of every visited node (loads included) kept each graph it
    # simplified; the symbolic cache off, so the simplifier runs every time
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")
    refs = []
    for _ in range(5):
        Z, X, W = _matmul_tanh()
        grads = te.differentiate(Z, [X, W])
        refs += [weakref.ref(X.op), weakref.ref(W.op), weakref.ref(Z.op)]
        refs += [weakref.ref(g.op) for g in grads]
        del Z, X, W, grads
    gc.collect()
    assert [r() for r in refs if r() is not None] == []


def test_a_thousand_torch_ops_made_used_and_dropped_keep_memory_flat():
    torch = pytest.importorskip("torch")
    import texpr.torch as tt
    from texpr import bridge

    def small():
        X = te.placeholder((4,), name="X", dtype="float64")
        return te.compute((4,), lambda i: te.tanh(X[i]) * 2.0, name="Y"), X

    x = torch.linspace(-1.0, 1.0, 4, dtype=torch.float64, requires_grad=True)
    want = 2.0 * (1.0 - torch.tanh(x.detach()) ** 2)

    def one():
        Y, X = small()
        y = tt.op(Y, [X])(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)

    for _ in range(20):  # kernels compiled, caches warm
        one()
    before, specs = _live(), len(bridge.SPECS)
    blocks = sys.getallocatedblocks()  # (tracemalloc would slow the loop several times)
    for _ in range(1000):
        one()
    after = _live()
    grown = sys.getallocatedblocks() - blocks
    assert len(bridge.SPECS) == specs
    for kind in before:
        assert after[kind] <= before[kind] + 8, (kind, before, after)
    # before the fix: hundreds of blocks an op, the dropped graphs
    assert grown < 5000, grown


def test_ten_thousand_calls_of_one_kernel_keep_memory_flat():
    from texpr import codegen

    Z, X, W = _matmul_tanh(dtype="float32")
    k = codegen.build([Z], [X, W])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    want = np.tanh(x @ w.T) * 2 + x[:, :1]
    for _ in range(10):
        k(x, w)
    before = _live()
    tracemalloc.start()
    try:
        t0 = tracemalloc.get_traced_memory()[0]
        for _ in range(10_000):
            (z,) = k(x, w)
        del z
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - t0
    finally:
        tracemalloc.stop()
    (z,) = k(x, w)
    np.testing.assert_allclose(z, want, rtol=1e-5, atol=1e-5)
    assert _live() == before
    assert grown < 64 * 1024, grown
