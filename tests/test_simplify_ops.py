"""More operators through the simplifier: re-indexings (flatten, reshape --
also not size-preserving --, transpose, concatenate/split, pad, upsample, pixel
shuffle, broadcasts), grouped/depthwise/transposed convolutions, pooling with
stride smaller than, equal to and larger than the window, cumsum, causal masks,
data-dependent gathers (scatter-adds), and the BUGS.md cases.

Ideal counts are computed independently: the number of structurally nonzero
entries of the Jacobian (the raw adjoint with the identity head, evaluated on
random data), and for a gradient written elementwise over the input at least
the input's size (every entry of the gradient is written, zeros included).
"""

import numpy as np
import pytest

import texpr as te
from texpr.tensor import ScatterAddOp, topo_order

import simplify
from test_simplify_cases import conv_case, conv_transpose_case, pool_case
from test_simplify_suite import assert_no_dense_jacobian, feed_for


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
    # stride > window leaves input rows unread: the gradient still writes them (zeros)
    Y, inputs, (ideal,) = pool_case("avg", 2, 2, 9, 9, k, s)
    _g, (c,) = check(Y, inputs)
    assert c == max(ideal, inputs[0].size)
    Y, inputs, (ideal,) = pool_case("max", 2, 2, 9, 9, k, s)
    windows = 2 * 2 * Y.shape[2] * Y.shape[3] * k * k
    _g, (c,) = check(Y, inputs, allow=max(ideal, inputs[0].size + windows))


def test_cumsum_variants_and_causal_mask():
    X = te.placeholder((3, 7), "X")
    for ex in (False, True):
        for rev in (False, True):
            Y = te.nn.cumsum(X, axis=1, exclusive=ex, reverse=rev)
            n = 7 * 6 // 2 if ex else 7 * 8 // 2
            _g, (c,) = check(Y, [X], allow=3 * n)
            assert c == 3 * n
    A = te.placeholder((5, 5), "A")
    M = te.compute((5, 5), lambda i, j: te.if_then_else(j <= i, A[i, j], 0.0), name="mask")
    _g, (c,) = check(M, [A])
    assert c == 25


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
    # X read by two convolutions: dX is the sum of two reductions, fused into one
    # reduction over the disjoint union of their domains (no extra pass over X)
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
    grads, (c,) = check(Z, [X], allow=pairs1 + pairs2 + up)
    assert c == pairs1 + pairs2 + up


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
