"""The gradient suite (docs/testing.md) built from te.nn at small sizes
(batch 2, channels 3, 10x10 images): forward values vs torch/numpy and gradients
vs float64 finite differences. The loss of each case is ``sum(op(inputs) * H)``
with ``H`` a random head (``check_grads`` passes ``H`` as ``head=``)."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, ph, tt

nn = te.nn


def causal_scores(q, k):
    """``S[b, i, j] = sum_d Q[b, i, d] K[b, j, d]`` where ``j <= i`` (0 elsewhere)."""
    d = te.reduce_axis(q.shape[2], "d")
    return te.compute((q.shape[0], q.shape[1], k.shape[1]),
                      lambda b, i, j: te.sum(q[b, i, d] * k[b, j, d], axis=d, where=j <= i),
                      name="causal_scores")


def transpose_sum(a):
    """``Y[i, j] = A[i, j] + A[j, i]``."""
    return te.compute(a.shape, lambda i, j: a[i, j] + a[j, i], name="transpose_sum")


def softmax_xent(z, labels):
    """``-sum_{i, c} onehot[i, c] * log_softmax(Z)[i, c]`` with the one-hot from int labels."""
    ls = nn.log_softmax(z, axis=1)
    i, c = te.reduce_axis(z.shape[0], "i"), te.reduce_axis(z.shape[1], "c")
    return te.compute((), lambda: te.sum(
        te.if_then_else(labels[i] == c, -ls[i, c], 0.0), axis=[i, c]), name="softmax_xent")


def build(case):
    """(output, differentiated inputs, feed, reference forward value) of one small case."""
    r = np.random.default_rng(sum(map(ord, case)))

    def P(shape, name):
        t = ph(shape, name)
        feed[t] = r.uniform(-1, 1, shape)
        return t

    feed = {}
    if case == "dense":
        x, w = P((2, 20), "X"), P((3, 20), "W")
        return nn.dense(x, w), [x, w], feed, feed[x] @ feed[w].T
    conv = {"conv2d_s1": dict(stride=1, padding=1), "conv2d_s2": dict(stride=2, padding=1),
            "conv2d_dil2": dict(stride=1, dilation=2, padding=2)}
    if case in conv:
        x, w = P((2, 3, 10, 10), "X"), P((3, 3, 3, 3), "W")
        ref = F.conv2d(tt(feed[x]), tt(feed[w]), **conv[case]).numpy()
        return nn.conv2d(x, w, **conv[case]), [x, w], feed, ref
    if case == "depthwise":
        x, w = P((2, 3, 10, 10), "X"), P((3, 1, 3, 3), "W")
        ref = F.conv2d(tt(feed[x]), tt(feed[w]), padding=1, groups=3).numpy()
        return nn.conv2d(x, w, padding=1, groups=3), [x, w], feed, ref
    if case == "maxpool2":
        x = P((2, 3, 10, 10), "X")
        return nn.max_pool2d(x, 2, 2), [x], feed, F.max_pool2d(tt(feed[x]), 2, 2).numpy()
    if case == "avgpool3s2":
        x = P((2, 3, 10, 10), "X")
        ref = F.avg_pool2d(tt(feed[x]), 3, 2, 1, count_include_pad=True).numpy()
        return nn.avg_pool2d(x, 3, 2, 1, count_include_pad=True), [x], feed, ref
    if case == "conv2d_transpose_s2":
        x, w = P((2, 3, 5, 5), "X"), P((3, 2, 4, 4), "W")
        ref = F.conv_transpose2d(tt(feed[x]), tt(feed[w]), stride=2, padding=1).numpy()
        y = nn.conv2d_transpose(x, w, stride=2, padding=1)
        assert y.shape == (2, 2, 10, 10)
        return y, [x, w], feed, ref
    if case == "cumsum":
        x = P((2, 10), "X")
        return nn.cumsum(x, axis=1), [x], feed, np.cumsum(feed[x], axis=1)
    if case == "causal_scores":
        q, k = P((2, 10, 4), "Q"), P((2, 10, 4), "K")
        ref = np.tril(np.einsum("bid,bjd->bij", feed[q], feed[k]))
        return causal_scores(q, k), [q, k], feed, ref
    if case == "upsample2":
        x = P((2, 3, 5, 5), "X")
        ref = F.interpolate(tt(feed[x]), scale_factor=2, mode="nearest").numpy()
        return nn.upsample_nearest(x, 2), [x], feed, ref
    if case == "pixel_shuffle2":
        x = P((2, 12, 5, 5), "X")
        return nn.pixel_shuffle(x, 2), [x], feed, F.pixel_shuffle(tt(feed[x]), 2).numpy()
    if case == "flatten_dense":
        x, w = P((2, 3, 4, 4), "X"), P((10, 48), "W")
        ref = feed[x].reshape(2, -1) @ feed[w].T
        return nn.dense(nn.flatten(x), w), [x, w], feed, ref
    if case == "transpose_sum":
        a = P((10, 10), "A")
        return transpose_sum(a), [a], feed, feed[a] + feed[a].T
    if case == "layernorm":
        x = P((4, 10), "X")
        ref = F.layer_norm(tt(feed[x]), (10,), eps=1e-5).numpy()
        return nn.layer_norm(x, 10, eps=1e-5), [x], feed, ref
    if case == "softmax_xent":
        z = P((4, 10), "Z")
        labels = ph((4,), "labels", "int64")
        feed[labels] = np.array([3, 0, 9, 3])
        ref = F.cross_entropy(tt(feed[z]), tt(feed[labels]), reduction="sum").numpy()
        return softmax_xent(z, labels), [z], feed, ref
    raise KeyError(case)


CASES = ["dense", "conv2d_s1", "conv2d_s2", "conv2d_dil2", "depthwise", "maxpool2",
         "avgpool3s2", "conv2d_transpose_s2", "cumsum", "causal_scores", "upsample2",
         "pixel_shuffle2", "flatten_dense", "transpose_sum", "layernorm", "softmax_xent"]


@pytest.mark.parametrize("case", CASES)
def test_suite_case_forward(case):
    out, _, feed, ref = build(case)
    check_forward(out, feed, ref)


@pytest.mark.parametrize("simplify", [False, True], ids=["raw", "simplified"])
@pytest.mark.parametrize("case", CASES)
def test_suite_case_gradient(case, simplify):
    out, wrt, feed, _ = build(case)
    check_grads(out, wrt, feed, simplify=simplify)


def _taps(n, k, s, d, p, m):
    """Pairs (output position o < m, tap r < k) with 0 <= o*s + r*d - p < n."""
    return sum(1 for o in range(m) for r in range(k) if 0 <= o * s + r * d - p < n)


def _taps_transpose(n, k, s, d, p, m):
    """Pairs (input position i < n, tap r < k) with 0 <= i*s + r*d - p < m (m outputs)."""
    return sum(1 for i in range(n) for r in range(k) if 0 <= i * s + r * d - p < m)


#: the suite's "ideal" (structurally nonzero terms) of every gradient at the small sizes
#: built above; layernorm and softmax_xent are only "linear in the input" there.
IDEAL = {
    "dense": [2 * 3 * 20] * 2,
    "conv2d_s1": [2 * 3 * 3 * _taps(10, 3, 1, 1, 1, 10) ** 2] * 2,
    "conv2d_s2": [2 * 3 * 3 * _taps(10, 3, 2, 1, 1, 5) ** 2] * 2,
    "conv2d_dil2": [2 * 3 * 3 * _taps(10, 3, 1, 2, 2, 10) ** 2] * 2,
    "depthwise": [2 * 3 * _taps(10, 3, 1, 1, 1, 10) ** 2] * 2,
    "maxpool2": [2 * 600],  # pairs + window points (the argmax pass)
    "avgpool3s2": [2 * 3 * _taps(10, 3, 2, 1, 1, 5) ** 2],
    "conv2d_transpose_s2": [2 * 3 * 2 * _taps_transpose(5, 4, 2, 1, 1, 10) ** 2] * 2,
    "cumsum": [2 * 55],
    "causal_scores": [2 * 4 * 55] * 2,
    "upsample2": [600],
    "pixel_shuffle2": [600],
    "flatten_dense": [2 * 10 * 48] * 2,
    "transpose_sum": [200],
}


def test_ideal_counts_are_forward_work():
    """The ideal of a convolution is the forward's in-bounds multiply-adds (docs/testing.md)."""
    out, (x, w), feed, _ = build("conv2d_s2")
    ones = {x: np.ones(x.shape), w: np.ones(w.shape)}
    assert te.evaluate(out, ones).sum() == IDEAL["conv2d_s2"][0]
    out, (x, w), feed, _ = build("conv2d_transpose_s2")
    ones = {x: np.ones(x.shape), w: np.ones(w.shape)}
    assert te.evaluate(out, ones).sum() == IDEAL["conv2d_transpose_s2"][0]


@pytest.mark.parametrize("case", sorted(IDEAL))
def test_suite_case_iteration_count(case):
    """The simplified gradient (head given as a placeholder) visits at most the ideal count."""
    from texpr import simplify
    out, wrt, _, _ = build(case)
    head = ph(out.shape, "H")
    grads = te.differentiate(out, wrt, head=head).result
    for g, t, ideal in zip(grads, wrt, IDEAL[case]):
        count = simplify.iteration_count([g])
        assert count <= ideal, f"{case}: d{t.name} visits {count} points, ideal {ideal}"


def test_softmax_xent_matches_cross_entropy():
    out, (z,), feed, _ = build("softmax_xent")
    labels = next(t for t in feed if t.dtype == "int64")
    ce = nn.cross_entropy(z, labels, reduction="sum")
    np.testing.assert_allclose(te.evaluate(ce, feed), te.evaluate(out, feed), rtol=1e-12)
