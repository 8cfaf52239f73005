"""Inlining never makes an expression grow geometrically with a chain of stages.

A cheap elementwise stage is recomputed at each of its loads. When each stage
of a chain reads its producer a few times (``select(G[c] > t, G[c] * 2, G[c] -
1)`` reads ``G[c]`` three times), inlining the whole chain wrote the first
stage out 3^depth times: a fuzzed gradient (seed 7003600271, 3 stages) had one
statement of 143 KB, and numba compiled it for over 10 minutes in 10 GB
before the process was stopped. A stage is now cheap only while its body,
written out as a tree with its inlined producers (``simplify.tree_size``),
stays within ``CHEAP_TREE_NODES``."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.simplify import materialize
from texpr.testing import numeric_gradient


def _chain(depth, n=5):
    X = te.placeholder((n,), "X", "float64")
    t = te.compute((n,), lambda i: te.if_then_else(X[i] > 0.0, X[i], X[i] * 0.1), name="G0")
    for d in range(depth):
        prev = t
        t = te.compute((n,), lambda i, p=prev: p[i] - te.if_then_else(
            p[(i + 1) % n] > 0.25, p[(i + 1) % n] * 2.0, p[(i + 1) % n] - 1.0) * 0.5,
            name=f"G{d + 1}")
    k = te.reduce_axis(n, "k")
    loss = te.compute((), lambda: te.sum(t[k] * t[k], axis=k), name="loss")
    return X, t, loss


def _largest_tree(tensors):
    return max(simplify.tree_size(b) for op in simplify.materialized_stages(tensors)
               for b in getattr(op, "body", ()))


@pytest.mark.parametrize("depth", [4, 8])
def test_a_chain_of_cheap_stages_is_not_written_out_geometrically(depth):
    X, t, loss = _chain(depth)
    dX, = te.differentiate(loss, [X]).result
    outs = simplify.simplify([loss, dX])
    assert _largest_tree(outs) < 40 * materialize.CHEAP_TREE_NODES


def test_the_bound_is_what_keeps_it_small(monkeypatch):
    # without the tree bound (any DAG of 48 cheap nodes inlines) and the policy's cost
    # rules (stored_is_cheaper: each stage reads its producer three times, with work)
    # the same chain grows
    monkeypatch.setenv("TEXPR_SYMBOLIC_CACHE", "0")  # the cache keys no module constant
    monkeypatch.setattr(materialize, "CHEAP_TREE_NODES", 10 ** 9)
    monkeypatch.setattr(materialize, "stored_is_cheaper", lambda *a, **k: False)
    X, t, loss = _chain(8)
    assert _largest_tree(simplify.simplify([loss])) > 3 ** 8


def test_the_cost_rule_alone_keeps_it_small(monkeypatch):
    # the materialisation policy stores a stage whose accesses recompute more than
    # storing it costs: the chain stays small without the tree bound
    monkeypatch.setattr(materialize, "CHEAP_TREE_NODES", 10 ** 9)
    X, t, loss = _chain(8)
    assert _largest_tree(simplify.simplify([loss])) < 100


def _reflect_chain(depth, n=4):
    # each stage reads its producer once, at an index that uses its axis 3 times
    X = te.placeholder((n,), "X", "float64")
    t = X
    for d in range(depth):
        p, m = t, t.shape[0]
        t = te.compute((m + 2,), lambda i, p=p, m=m: p[te.if_then_else(
            i == 0, 1, te.if_then_else(i == m + 1, m - 2, i - 1))], name=f"P{d + 1}")
    return X, t


def _square_chain(depth, n=7):
    X = te.placeholder((n,), "X", "float64")
    t = te.compute((n,), lambda i: X[i] * 2.0, name="Q0")
    for d in range(depth):
        p = t
        t = te.compute((n,), lambda i, p=p: p[(i * i + 1) % n] + 1.0, name=f"Q{d + 1}")
    return X, t


@pytest.mark.parametrize("chain", ["cheap", "reflect", "square"])
def test_the_written_out_size_is_exact(chain):
    # the estimate of every inlined stage equals the tree of its body with its
    # inlined producers substituted (codegen's own expansion)
    from texpr.codegen.ir.schedule import inline_expand
    from texpr.tensor import topo_order
    if chain == "cheap":
        X, t, out = _chain(2)
    elif chain == "reflect":
        X, out = _reflect_chain(3)
    else:
        X, out = _square_chain(3)
    sizes = simplify.inlined_stages([out])
    assert sizes
    for op in topo_order([out]):
        if id(op) in sizes:
            expanded = inline_expand(op.body[0], set(sizes))
            assert sizes[id(op)].size == simplify.tree_size(expanded), op.name


@pytest.mark.parametrize("make,depth", [(_reflect_chain, 8), (_square_chain, 12)])
def test_a_chain_read_once_at_a_growing_index_stays_small(make, depth):
    # an attack on the first bound: one load each, so the single-load rule
    # inlined them all (reflect, 7 stages: a 107 KB kernel text and a 607 s
    # build; 8 stages ran out of 21 GB; the square chain: 211 KB)
    X, out = make(depth)
    assert _largest_tree([out]) <= 4 * materialize.INLINE_ONCE_TREE_NODES
    x = np.arange(X.shape[0], dtype=np.float64) + 1.0
    want = te.evaluate(out, {X: x})
    k = codegen.build([out], [X], parallel=False, blas=False)
    assert max(map(len, k.source.splitlines())) < 30_000
    np.testing.assert_array_equal(k(x)[0], want)


def test_the_compiled_chain_and_its_gradient_agree_with_the_evaluator():
    X, t, loss = _chain(5)
    dX, = te.differentiate(loss, [X]).result
    x = np.random.default_rng(0).standard_normal(5)
    k = codegen.build([loss, dX], [X], parallel=False, blas=False)
    assert len(k.source) < 60_000
    got = k(x)
    want = te.evaluate([loss, dX], {X: x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def _broadcast_sum(n, form):
    # Y[i] reads n points of X; every dX[j0, j1] reads the adjoint of Y at j0
    X = te.placeholder((4, n), "X", "float64")

    def body(i):
        v = X[i, 0] * 0.5
        for k in range(1, n):
            v = v + (X[i, k] * (0.5 + k) if form == "linear" else te.tanh(X[i, k]))
        return v

    Y = te.compute((4,), body, name="Y")
    r = te.reduce_axis(4, "r")
    loss = te.compute((), lambda: te.sum(Y[r] * Y[r], axis=r), name="L")
    return X, loss


@pytest.mark.parametrize("form", ["linear", "tanh"])
def test_a_stage_read_through_a_broadcast_is_computed_once(form):
    # dY[j0] = 2 * Y[j0] is not cheap (Y reads 30 points); inlined into dX[j0, j1]
    # it was recomputed for each j1: 30x the work, and at 62 terms a 198 KB
    # kernel that took 186 s to build
    n = 30
    X, loss = _broadcast_sum(n, form)
    (dX,) = te.differentiate(loss, [X])
    stages = simplify.materialized_stages([dX])
    assert len(stages) == 2  # dY once, then dX
    assert _largest_tree([dX]) <= 25 * n  # inlined: n copies of 6n nodes or more
    assert simplify.iteration_count([dX]) == 4 + 4 * n
    x = np.random.default_rng(3).standard_normal((4, n))
    want = numeric_gradient(loss, X, {X: x})
    np.testing.assert_allclose(te.evaluate(dX, {X: x}), want, rtol=1e-6, atol=1e-6)


def test_a_cheap_stage_is_still_inlined_through_a_broadcast():
    # a cheap body costs less to recompute than to store and load
    X = te.placeholder((4,), "X", "float64")
    Y = te.compute((4,), lambda i: X[i] * 2.0 + 1.0, name="Y")
    Z = te.compute((4, 5), lambda i, j: Y[i] * (j + 1.0), name="Z")
    assert [op.name for op in simplify.materialized_stages([Z])] == ["Z"]


def test_the_broadcast_gradient_compiles_and_matches():
    X, loss = _broadcast_sum(12, "tanh")
    (dX,) = te.differentiate(loss, [X])
    x = np.random.default_rng(4).standard_normal((4, 12))
    k = codegen.build([loss, dX], [X], parallel=False, blas=False)
    got = k(x)
    want = te.evaluate([loss, dX], {X: x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
