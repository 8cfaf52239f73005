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
    # without the tree bound (any DAG of 48 cheap nodes inlines) the same chain grows
    monkeypatch.setattr(materialize, "CHEAP_TREE_NODES", 10 ** 9)
    X, t, loss = _chain(8)
    assert _largest_tree(simplify.simplify([loss])) > 3 ** 8


def test_inlined_stages_write_out_their_producers():
    X, t, loss = _chain(1)
    g1 = t.op
    g0 = next(x.op for x in g1.input_tensors() if x.op.name == "G0")
    sizes = simplify.inlined_stages([loss])
    assert sizes[id(g0)] == simplify.tree_size(g0.body[0])
    # G1 reads G0 at four loads (i, and (i + 1) % n three times): each counts G0's body
    own = simplify.tree_size(g1.body[0])
    assert simplify.tree_size(g1.body[0], {id(g0): sizes[id(g0)]}) == \
        own + 4 * (sizes[id(g0)] - 1)
    assert (id(g1) in sizes) == (own + 4 * (sizes[id(g0)] - 1) <= materialize.CHEAP_TREE_NODES)


def test_the_compiled_chain_and_its_gradient_agree_with_the_evaluator():
    X, t, loss = _chain(5)
    dX, = te.differentiate(loss, [X]).result
    x = np.random.default_rng(0).standard_normal(5)
    k = codegen.build([loss, dX], [X], parallel=False)
    assert len(k.source) < 60_000
    got = k(x)
    want = te.evaluate([loss, dX], {X: x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
