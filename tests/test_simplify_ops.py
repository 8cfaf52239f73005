"""More operators through the simplifier: re-indexings (flatten, reshape --
also not size-preserving --, transpose, concatenate/split, pad, upsample, pixel
shuffle, broadcasts), grouped/depthwise/transposed convolutions, pooling with
stride smaller than, equal to and larger than the window, cumsum, causal masks,
data-dependent gathers (scatter-adds), and the bug cases (docs/testing.md).

Ideal counts are computed independently: the number of structurally nonzero
entries of the Jacobian (the raw adjoint with the identity head, evaluated on
random data), and for a gradient written elementwise over the input at least
the input's size (an upper bound: a gradient zero outside a quasi-affine region
of its own axes iterates over that region only, see
test_zero_regions_of_the_output_are_not_iterated).
"""

import numpy as np
import pytest

import texpr as te
from texpr.tensor import PlaceholderOp, ScatterAddOp, topo_order

from texpr import simplify
from test_simplify_cases import conv_case, conv_transpose_case, pool_case
from test_simplify_suite import assert_no_dense_jacobian
from texpr.testing import random_feed as feed_for


def jacobian_nnz(Y, x, feed):
    """Nonzero entries of dY/dx on ``feed`` (the raw Jacobian, numerically)."""
    J = te.differentiate(Y, [x], head=None, simplify=False)[0]
    return int(np.count_nonzero(te.evaluate(J, feed)))


def check(Y, inputs, extra=None, allow=None, feed_extra=None):
    """Simplified gradients: values equal to raw, counts within the ideal."""
    H = te.placeholder(Y.shape, "H", dtype=Y.dtype)
    raw = list(te.differentiate(Y, inputs, head=H, simplify=False))
    grads = simplify.simplify(raw)
    feed = feed_for([Y] + raw + grads)
    if feed_extra:
        feed.update(feed_extra)
    want = te.evaluate(raw, feed)
    got = te.evaluate(grads, feed)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(a).max()))
    counts = []
    for g, x in zip(grads, inputs):
        if allow is not None:
            ideal = allow
        else:
            ideal = max(jacobian_nnz(Y, x, feed), x.size) + (extra or 0)
        c = simplify.iteration_count([g])
        assert c <= ideal, (x.name, c, ideal, te.graph_str(g))
        assert_no_dense_jacobian(g, Y.shape, x.shape)
        counts.append(c)
    return grads, counts


def X4(shape=(2, 3, 4, 4), name="X"):
    return te.placeholder(shape, name)


def test_flatten_reshape_transpose():
    X = X4()
    check(te.nn.flatten(X), [X])
    check(te.nn.reshape(X, (6, 16)), [X])
    check(te.nn.reshape(X, (4, 24)), [X])
    check(te.nn.transpose(X, (0, 2, 3, 1)), [X])


def test_reshape_not_size_preserving():
    X = te.placeholder((4, 6), "X")
    # the first 15 elements of X, row-major, as a 3x5 matrix
    Y = te.compute((3, 5), lambda i, j: X[(5 * i + j) // 6, (5 * i + j) % 6], name="trunc")
    check(Y, [X])
    # a bigger output that wraps around (every X element read twice)
    Z = te.compute((8, 6), lambda i, j: X[i % 4, j], name="wrap")
    _g, (c,) = check(Z, [X])
    assert c == 48


def test_concatenate_split_pad():
    A, B = te.placeholder((2, 3), "A"), te.placeholder((2, 5), "B")
    check(te.nn.concatenate([A, B], axis=1), [A, B])
    X = te.placeholder((3, 8), "X")
    parts = te.nn.split(X, [3, 5], axis=1)
    for p in parts:
        check(p, [X])
    check(te.nn.pad(X, ((1, 2), (0, 3))), [X])


def test_upsample_pixel_shuffle_broadcast():
    X = X4((2, 8, 3, 3))
    check(te.nn.upsample_nearest(X, 2), [X])
    check(te.nn.pixel_shuffle(X, 2), [X])
    b = te.placeholder((3,), "b")
    Y = te.nn.broadcast_to(b, (4, 3))
    _g, (c,) = check(Y, [b])
    assert c == 12
    x = te.placeholder((4, 1), "x")
    Z = te.compute((4, 5), lambda i, j: x[i, 0] * 2.0, name="bcast")
    check(Z, [x])


@pytest.mark.parametrize("groups,cout", [(1, 4), (2, 4), (4, 4), (4, 8)])
def test_grouped_and_depthwise_conv(groups, cout):
    Y, inputs, ideals = conv_case(2, 4, 7, 7, cout, 3, 2, 1, 1, groups=groups)
    check(Y, inputs, allow=None)
    _g, counts = check(Y, inputs)
    assert counts == ideals


@pytest.mark.parametrize("s,p", [(1, 0), (2, 1), (3, 2), (2, 0)])
def test_conv2d_transpose(s, p):
    Y, inputs, ideals = conv_transpose_case(2, 3, 4, 4, 2, 3, s, p)
    _g, counts = check(Y, inputs)
    assert counts == ideals


@pytest.mark.parametrize("k,s", [(3, 1), (2, 2), (2, 3), (3, 2)])
def test_pooling_strides(k, s):
    # stride > window (or a last row no window reaches) leaves input rows unread: the
    # gradient is zero there and iterates over the covered rows only (simplify.support)
    Y, inputs, (ideal,) = pool_case("avg", 2, 2, 9, 9, k, s)
    _g, (c,) = check(Y, inputs, allow=ideal)
    assert c == ideal
    Y, inputs, (ideal,) = pool_case("max", 2, 2, 9, 9, k, s)  # pairs + window points
    _g, (c,) = check(Y, inputs, allow=ideal)
    assert c == ideal


def test_cumsum_variants_and_causal_mask():
    X = te.placeholder((3, 7), "X")
    for ex in (False, True):
        for rev in (False, True):
            Y = te.nn.cumsum(X, axis=1, exclusive=ex, reverse=rev)
            n = 7 * 6 // 2 if ex else 7 * 8 // 2  # the triangle per row
            _g, (c,) = check(Y, [X], allow=3 * n)
            # the adjoint is a scan over the row (simplify/prefix_scan.py): 3 x 7 steps
            # (the first computed straight into the state), written in X's layout
            assert c == 3 * 7, c
    A = te.placeholder((5, 5), "A")
    M = te.compute((5, 5), lambda i, j: te.if_then_else(j <= i, A[i, j], 0.0), name="mask")
    _g, (c,) = check(M, [A])
    assert c == 15  # the lower triangle: the zeros above the diagonal are a memset


def test_gathers_become_scatters():
    X = te.placeholder((4, 5), "X")
    I = te.placeholder((4,), "I", dtype="int64")
    Y = te.compute((4,), lambda k: X[I[k] // 5, I[k] % 5], name="gather")
    grads, (c,) = check(Y, [X], allow=4, feed_extra={I: np.array([7, 7, 19, 0])})
    assert any(isinstance(op, ScatterAddOp) for op in topo_order(grads))
    E = te.placeholder((7, 3), "E")
    J = te.placeholder((5,), "J", dtype="int64")
    Z = te.nn.embedding(J, E)
    grads, (c,) = check(Z, [E], allow=15, feed_extra={J: np.array([1, 1, 6, 0, 2])})
    assert any(isinstance(op, ScatterAddOp) for op in topo_order(grads))


def test_index_from_float_data():
    X = te.placeholder((6,), "X")
    R = te.placeholder((4,), "R")
    Y = te.compute((4,), lambda i: X[te.max(te.min(te.cast(te.floor(R[i] * 0.5), "int64"), 5),
                                           0)], name="fgather")
    H = te.placeholder((4,), "H")
    raw = list(te.differentiate(Y, [X, R], head=H, simplify=False))
    grads = simplify.simplify(raw)
    feed = {X: np.arange(6, dtype="float32"), R: np.array([0.5, 3.1, 9.9, -7.0], "float32"),
            H: np.ones(4, "float32")}
    for a, b in zip(te.evaluate(raw, feed), te.evaluate(grads, feed)):
        np.testing.assert_allclose(a, b)
    assert simplify.iteration_count([grads[0]]) <= 4


def test_bugs_strided_and_padding_cases():
    # C2: strided index inversion with a boundary
    I = te.placeholder((7,), "I")
    W = te.placeholder((3,), "W")
    kh = te.reduce_axis(3, "kh")
    O = te.compute((3,), lambda h: te.sum(I[2 * h + kh] * W[kh], axis=kh), name="c2")
    H = te.placeholder((3,), "H")
    g = simplify.simplify(list(te.differentiate(O, [I], head=H, simplify=False)))
    out = te.evaluate(g[0], {H: np.array([1, 2, 3], "float32"),
                             W: np.array([1, 10, 100], "float32")})
    np.testing.assert_allclose(out, [1, 10, 102, 20, 203, 30, 300])
    assert simplify.iteration_count(g) == 9
    # C3: strided scatter, last position
    X = te.placeholder((2,), "X")
    w = te.placeholder((), "w")
    Y = te.compute((3,), lambda o: te.if_then_else(o % 2 == 0, w[()] * X[o // 2], 0.0), name="c3")
    H3 = te.placeholder((3,), "H3")
    g = simplify.simplify(list(te.differentiate(Y, [X, w], head=H3, simplify=False)))
    vals = te.evaluate(g, {H3: np.array([1.5, 0, 0.7], "float32"), X: np.array([2, 3], "float32"),
                           w: np.array(-0.7767, "float32")})
    np.testing.assert_allclose(vals[0], [1.5 * -0.7767, 0.7 * -0.7767], rtol=1e-5)
    np.testing.assert_allclose(vals[1], 1.5 * 2 + 0.7 * 3, rtol=1e-5)
    assert simplify.iteration_count([g[0]]) == 2
    # C7: padding is a mask
    X = te.placeholder((4,), "X")
    Wk = te.placeholder((3,), "Wk")
    k = te.reduce_axis(3, "k")
    Y = te.compute((4,), lambda o: te.sum(Wk[k] * te.if_then_else(
        te.all(o + k - 1 >= 0, o + k - 1 < 4), X[o + k - 1], 0.0), axis=k), name="c7")
    H7 = te.placeholder((4,), "H7")
    g = simplify.simplify(list(te.differentiate(Y, [X], head=H7, simplify=False)))
    out = te.evaluate(g[0], {H7: np.array([1, 2, 3, 4], "float32"),
                             Wk: np.array([1, 10, 100], "float32")})
    np.testing.assert_allclose(out, [12, 123, 234, 340])
    assert simplify.iteration_count(g) == 10


def test_bugs_empty_domains():
    X = te.placeholder((2, 0), "X")
    Y = te.nn.cumsum(X, axis=1)
    g = simplify.simplify(list(te.differentiate(Y, [X], head=te.placeholder((2, 0), "H"))))
    assert g[0].shape == (2, 0) and simplify.iteration_count(g) == 0
    X = te.placeholder((3, 4), "X")
    k = te.reduce_axis((0, 0), "k")
    Y = te.compute((3,), lambda i: te.sum(X[i, k], axis=k), name="empty")
    g = te.differentiate(Y, [X], head=te.placeholder((3,), "H"))
    np.testing.assert_array_equal(te.evaluate(g[0], {}), np.zeros((3, 4)))
    X = te.placeholder((5,), "X")
    Y = te.compute((0,), lambda i: X[3 + 2 * i], name="none")
    g = te.differentiate(Y, [X], head=te.placeholder((0,), "H"))
    np.testing.assert_array_equal(te.evaluate(g[0], {}), np.zeros(5))


def test_two_consumers_fuse_into_one_reduction():
    # X read by a convolution and a strided one: dX is the sum of two reductions.
    # Both are contractions (products of two loads): each stays a reduction of its
    # own, a GEMM for the code generator, and one pass over X adds them (fused into
    # one reduction over the disjoint union of their domains, neither was a GEMM)
    X = te.placeholder((2, 3, 8, 8), "X")
    W1 = te.placeholder((4, 3, 3, 3), "W1")
    W2 = te.placeholder((4, 3, 2, 2), "W2")
    Y1 = te.nn.conv2d(X, W1, padding=1)
    Y2 = te.nn.conv2d(X, W2, stride=2)
    Z = te.compute(Y1.shape, lambda n, c, h, w: Y1[n, c, h, w] + Y2[n, c, h // 2, w // 2],
                   name="Z")
    pairs1 = 2 * 4 * 3 * (8 * 3 - 2) ** 2
    pairs2 = 2 * 4 * 3 * (4 * 2) ** 2
    up = 2 * 4 * 8 * 8  # the adjoint of Y2: each head element read once
    add = 2 * 3 * 8 * 8  # the sum of the two products
    grads, (c,) = check(Z, [X], allow=pairs1 + pairs2 + up + add)
    assert c == pairs1 + pairs2 + up + add


def test_two_elementwise_consumers_still_fuse_into_one_reduction():
    # the fold itself is unchanged where a part is no contraction: X read by a sum
    # over rows and a sum over columns; dX[i, j] = H0[i] + H1[j] stays one stage
    X = te.placeholder((6, 5), "X")
    r, c = te.reduce_axis(5, "c"), te.reduce_axis(6, "r")
    R = te.compute((6,), lambda i: te.sum(te.exp(X[i, r]), axis=r), name="R")
    C = te.compute((5,), lambda j: te.sum(X[c, j] * X[c, j], axis=c), name="C")
    Y = te.compute((11,), lambda t: te.if_then_else(t < 6, R[te.min(t, 5)],
                                                    C[te.max(t - 6, 0)]), name="Y")
    grads, (n,) = check(Y, [X], allow=30 + 11)
    assert [op.name for op in simplify.materialized_stages(grads)] == ["d_X"] and n == 30


def test_through_a_scatter_add_stage():
    X = te.placeholder((5,), "X")
    I = te.placeholder((3,), "I", dtype="int64")
    A = te.placeholder((3,), "A")
    E = te.compute((3,), lambda k: A[k] * 2.0, name="E")
    S = te.scatter_add((5,), "float32", (3,), lambda k: I[k], lambda k: E[k])
    Y = te.compute((5,), lambda i: S[i] * X[i], name="Y")
    grads, counts = check(Y, [A, X], allow=8, feed_extra={I: np.array([0, 4, 4])})
    assert counts == [3, 5 + 3]  # dX needs the scatter-add (3 points) itself
    # the cheap producer is inlined into the scatter-add itself
    assert [op.name for op in simplify.materialized_stages(simplify.simplify([Y]))] == \
        [S.op.name, "Y"]


def test_zero_regions_propagate_through_reductions():
    # conv1 (3x3, pad 1) then conv2 (1x1, stride 2): the adjoint of conv1's output is
    # zero on odd rows/columns, so conv1's weight gradient only visits even ones
    X = te.placeholder((2, 3, 8, 8), "X")
    W1 = te.placeholder((4, 3, 3, 3), "W1")
    W2 = te.placeholder((5, 4, 1, 1), "W2")
    Y2 = te.nn.conv2d(te.nn.conv2d(X, W1, padding=1), W2, stride=2)
    per_dim = sum(1 for oh in range(0, 8, 2) for kh in range(3) if 0 <= oh + kh - 1 < 8)
    dW1_pairs = 2 * 4 * 3 * per_dim ** 2
    dY1_points = 2 * 4 * 4 * 4 * 5  # the 1x1 stride-2 adjoint: nonzero rows only
    _g, (c,) = check(Y2, [W1], allow=dW1_pairs + dY1_points)
    assert c == dW1_pairs + dY1_points


@pytest.mark.parametrize("name", ["conv2d_s2", "conv2d_transpose_s2", "cumsum", "maxpool2"])
def test_simplified_gradients_differentiate_again(name):
    # a simplified graph (tightened axes, solved indices, argmax stages) is ordinary IR:
    # its own gradient simplifies back to the forward's work
    from test_simplify_cases import suite

    Y, inputs, _ = suite(small=True)[name]
    H = te.placeholder(Y.shape, "H")
    g = te.differentiate(Y, inputs, head=H)[0]
    V = te.placeholder(g.shape, "V")
    gg = te.differentiate(g, [H], head=V)[0]
    raw = te.differentiate(g, [H], head=V, simplify=False)[0]
    feed = feed_for([gg, raw])
    np.testing.assert_allclose(te.evaluate(gg, feed), te.evaluate(raw, feed), rtol=1e-4,
                               atol=1e-4)
    assert simplify.iteration_count([gg]) * 10 < simplify.iteration_count([raw])


# ---- stages zero outside a quasi-affine region iterate over that region only ----------

def _support_cases():
    """(name, output, input, pool): operators whose input gradient is zero outside a
    quasi-affine region of its own axes (rows no window or stride reaches); ``pool``
    is the max pooling's ``(kind, k, s, p)`` or None. Ideals (:func:`_ideal`) are
    counted independently: the nonzero entries of the raw Jacobian (random data),
    for max pooling the (input, window) pairs plus one pass over the window points
    (the argmax)."""
    cases = []
    X = te.placeholder((1, 2, 10, 10), "X")
    W = te.placeholder((1, 2, 1, 1), "W")
    cases.append(("conv1x1_s2", te.nn.conv2d(X, W, stride=2), X, None))
    Wd = te.placeholder((2, 1, 1, 1), "Wd")
    cases.append(("depthwise1x1_s2", te.nn.conv2d(X, Wd, stride=2, groups=2), X, None))
    for k, s, p in [(2, 3, 0), (2, 3, 1), (1, 2, 0)]:
        P = te.placeholder((1, 2, 7, 7), "P")
        cases.append((f"maxpool_k{k}s{s}p{p}", te.nn.max_pool2d(P, k, s, p), P,
                      ("max", k, s, p)))
        for cip in (True, False):
            cases.append((f"avgpool_k{k}s{s}p{p}_{'incl' if cip else 'excl'}",
                          te.nn.avg_pool2d(P, k, s, p, count_include_pad=cip), P, None))
    x = te.placeholder((12,), "x")
    # a strided subsample: its gradient is an upsampling with gaps
    cases.append(("subsample3", te.compute((4,), lambda i: x[3 * i + 1] * 2.0, name="sub"),
                  x, None))
    return cases


def _ideal(Y, x, feed, pool):
    if pool is None:
        return jacobian_nnz(Y, x, feed)
    _kind, k, s, p = pool
    # the (input, window) pairs are the avg pooling's Jacobian entries
    pairs = jacobian_nnz(te.nn.avg_pool2d(x, k, s, p), x, feed)
    return pairs + int(np.prod(Y.shape)) * k * k


def _raw_and_simplified(Y, x):
    H = te.placeholder(Y.shape, "H")
    raw = te.differentiate(Y, [x], head=H, simplify=False)[0]
    return raw, simplify.simplify([raw])[0]


@pytest.mark.parametrize("case", _support_cases(), ids=lambda c: c[0])
def test_zero_regions_of_the_output_are_not_iterated(case):
    from texpr.simplify.support import is_support_stage

    _name, Y, x, pool = case
    raw, g = _raw_and_simplified(Y, x)
    feed = feed_for([Y, raw, g])
    ideal = _ideal(Y, x, feed, pool)
    assert simplify.iteration_count([g]) == ideal, te.graph_str(g)
    assert is_support_stage(g.op)
    assert simplify.stage_count(g.op) < x.size  # the zeros are not iterated over
    a, b = te.evaluate(raw, feed), te.evaluate(g, feed)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    # a fixpoint, and the same stages for codegen
    again = simplify.simplify([g])
    assert te.graph_str(again, canonical=True) == te.graph_str([g], canonical=True)
    assert [op.name for op in simplify.materialized_stages([g])] == \
        [op.name for op in simplify.materialized_stages(again)]


def test_upsampling_with_gaps_iterates_over_its_points():
    # a forward stage zero outside j % 3 == 1, j < 10: 3 points of 12
    X = te.placeholder((4,), "X")
    U = te.compute((12,), lambda j: te.if_then_else(te.all(j % 3 == 1, j < 10),
                                                    X[(j - 1) // 3] * 3.0, 0.0), name="up")
    (u,) = simplify.simplify([U])
    assert simplify.iteration_count([U]) == 12 and simplify.iteration_count([u]) == 3
    feed = {X: np.arange(1, 5, dtype="float32")}
    np.testing.assert_array_equal(te.evaluate(u, feed), te.evaluate(U, feed))
    want = np.zeros(12, "float32")
    want[[1, 4, 7]] = [3, 6, 9]
    np.testing.assert_array_equal(te.evaluate(u, feed), want)


def test_support_stage_through_codegen():
    from texpr import codegen
    P = te.placeholder((2, 3, 8, 8), "P")
    for Y in (te.nn.max_pool2d(P, 2, 3, 1), te.nn.conv2d(P, te.placeholder((3, 1, 1, 1), "Wd"),
                                                          stride=2, groups=3)):
        raw, g = _raw_and_simplified(Y, P)
        feed = feed_for([Y, raw, g])
        inputs = [op.output(0) for op in topo_order([g]) if isinstance(op, PlaceholderOp)]
        kern = codegen.build(g, inputs)
        (got,) = kern(*[feed[t] for t in inputs])
        want = te.evaluate(raw, feed)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(te.evaluate(g, feed), want, rtol=1e-5, atol=1e-5)


def test_support_stage_guards_its_loads_in_sums():
    # dX = select(h % 2 == 0, H[h // 2] * exp(X[h]), 0) is not cheap and is re-read by
    # the conv's weight gradient: it stays a stage (5 points, not 10), and the weight
    # gradient's sum only visits the even rows (15 points, not 30)
    X0 = te.placeholder((12,), "X0")
    W0 = te.placeholder((3,), "W0")
    k = te.reduce_axis(3, "k")
    X = te.compute((10,), lambda h: te.sum(X0[h + k] * W0[k], axis=k), name="X")
    Y = te.compute((5,), lambda i: te.exp(X[2 * i]), name="Y")
    H = te.placeholder((5,), "H")
    raw = te.differentiate(Y, [W0], head=H, simplify=False)
    (g,) = simplify.simplify(list(raw))
    counts = {op.name: simplify.stage_count(op) for op in simplify.materialized_stages([g])}
    assert sorted(counts.values()) == [5, 15, 30], counts
    feed = feed_for([g] + list(raw))
    np.testing.assert_allclose(te.evaluate(g, feed), te.evaluate(raw[0], feed), rtol=1e-4,
                               atol=1e-4)


def test_support_stage_differentiates_again():
    P = te.placeholder((1, 2, 7, 7), "P")
    Y = te.nn.avg_pool2d(P, 2, 3)
    H = te.placeholder(Y.shape, "H")
    g = te.differentiate(Y, [P], head=H)[0]
    V = te.placeholder(g.shape, "V")
    gg = te.differentiate(g, [H], head=V)[0]
    raw = te.differentiate(g, [H], head=V, simplify=False)[0]
    feed = feed_for([gg, raw])
    np.testing.assert_allclose(te.evaluate(gg, feed), te.evaluate(raw, feed), rtol=1e-5,
                               atol=1e-5)
    assert simplify.iteration_count([gg]) <= 2 * 2 * 2 * 4  # each head element: its window
