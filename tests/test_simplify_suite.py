"""Work-optimality and correctness of the simplified gradients of the suite.

For every operator of the gradient suite (docs/testing.md) (small and full sizes) and the 27-case conv
sweep: the simplified gradient visits at most the ideal number of points
(``simplify.iteration_count``, exact and symbolic), no dense Jacobian survives,
and the simplified gradient evaluates equal to the raw adjoint.
"""


import numpy as np
import pytest

import texpr as te
from texpr.expr import EQ, FloorMod, Load, Reduce
from texpr.tensor import ComputeOp, PlaceholderOp, topo_order
from texpr.visitor import post_order

from texpr import simplify
from texpr.testing import random_feed
from test_simplify_cases import KNOWN_GAPS, SUITE_FULL_IDEALS, gradients, suite, sweep_cases

SMALL = suite(small=True)


def assert_same_values(raw, simp, seed=0):
    feed = random_feed(list(raw) + list(simp), seed)
    want = te.evaluate(list(raw), feed)
    got = te.evaluate(list(simp), feed)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(a).max()))


def assert_no_dense_jacobian(grad, out_shape, in_shape):
    bad = tuple(out_shape) + tuple(in_shape)
    for op in topo_order([grad]):
        if isinstance(op, PlaceholderOp):
            continue
        assert tuple(op.shape) != bad or bad == tuple(in_shape), \
            f"a dense Jacobian survives: {op.name} {op.shape}"
        if isinstance(op, ComputeOp) and isinstance(op.body[0], Reduce):
            red = op.body[0]
            raxes = {id(a) for a in red.axes}
            for n in post_order(red.where):
                # an equality (not a stride test ``... % s == 0``) on a reduction axis,
                # with no data in it, could have been solved away
                # (pinning an axis to a constant, ``t == 1``, is no indicator)
                spatial = {id(a) for a in op.axis}
                if isinstance(n, EQ) and any(id(v) in raxes for v in post_order(n)) \
                        and any(id(v) in spatial for v in post_order(n)):
                    assert any(isinstance(x, (FloorMod, Load)) for x in post_order(n)), \
                        f"reduction over an equality indicator in {op.name}: {n!r}"


@pytest.mark.parametrize("name", sorted(SMALL))
def test_suite_small_counts_and_values(name):
    Y, inputs, ideals = SMALL[name]
    if name in KNOWN_GAPS:
        ideals = KNOWN_GAPS[name](*inputs[0].shape)
    grads, H = gradients(Y, inputs)
    raw, _ = gradients(Y, inputs, simplify_=False, H=H)
    for g, r, ideal, x in zip(grads, raw, ideals, inputs):
        assert simplify.iteration_count([g]) <= ideal, (name, x.name, te.graph_str(g))
        assert_no_dense_jacobian(g, Y.shape, x.shape)
    # the raw adjoints of a different differentiate call read the same placeholders
    assert_same_values(raw, grads)


@pytest.mark.parametrize("name", sorted(SUITE_FULL_IDEALS) + ["layernorm", "softmax_xent"])
def test_suite_full_size_counts(name):
    Y, inputs, ideals = suite(small=False)[name]
    if name in KNOWN_GAPS:
        ideals = KNOWN_GAPS[name](*inputs[0].shape)
    grads, _H = gradients(Y, inputs)
    counts = [simplify.iteration_count([g]) for g in grads]
    for c, ideal in zip(counts, ideals):
        assert c <= ideal, (name, counts, ideals)
    if name in SUITE_FULL_IDEALS:
        # work-optimal: equal to the nonzero terms (fewer would mean a wrong count)
        assert counts == ideals, (name, counts, ideals)
    else:  # linear in the input
        assert all(c <= 16 * x.size for c, x in zip(counts, inputs))


@pytest.mark.parametrize("case", list(sweep_cases()), ids=lambda c: "k%d_s%d_d%d" % c[0])
def test_conv_sweep(case):
    (k, s, d), (Y, inputs, ideals) = case
    grads, H = gradients(Y, inputs)
    counts = [simplify.iteration_count([g]) for g in grads]
    assert counts == ideals, ((k, s, d), counts, ideals)
    raw, _ = gradients(Y, inputs, simplify_=False, H=H)
    assert_same_values(raw, grads)


def test_simplify_is_idempotent():
    for name in ("conv2d_s2", "conv2d_transpose_s2", "maxpool2", "pixel_shuffle2",
                 "transpose_sum", "cumsum", "softmax_xent"):
        Y, inputs, _ = SMALL[name]
        raw, _H = gradients(Y, inputs, simplify_=False)
        grads = simplify.simplify(raw)
        again = simplify.simplify(grads)
        assert te.graph_str(again, canonical=True) == te.graph_str(grads, canonical=True), name
