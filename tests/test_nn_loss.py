"""te.nn softmax family and losses: softmax, log_softmax, logsumexp, cross_entropy, mse_loss."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, ph, rand, tt

nn = te.nn


def np_lse(x, axis, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_log_softmax(axis):
    x = ph((3, 4, 2), "X")
    feed = {x: rand(x, 0, -3, 3)}
    e = np.exp(feed[x] - feed[x].max(axis=axis, keepdims=True))
    sm = e / e.sum(axis=axis, keepdims=True)
    y = nn.softmax(x, axis)
    check_forward(y, feed, sm)
    check_forward(y, feed, tt(feed[x]).softmax(axis).numpy())
    ly = nn.log_softmax(x, axis)
    check_forward(ly, feed, np.log(sm))
    check_forward(ly, feed, tt(feed[x]).log_softmax(axis).numpy())
    check_grads(y, [x], feed)
    check_grads(ly, [x], feed)


@pytest.mark.parametrize("axis,keepdims", [(-1, False), (0, True), (1, False), (1, True)])
def test_logsumexp(axis, keepdims):
    x = ph((3, 4), "X")
    feed = {x: rand(x, 2, -3, 3)}
    y = nn.logsumexp(x, axis, keepdims)
    check_forward(y, feed, np_lse(feed[x], axis, keepdims))
    check_forward(y, feed, tt(feed[x]).logsumexp(axis, keepdims).numpy())
    check_grads(y, [x], feed)


def test_logsumexp_stable_at_large_and_minus_inf():
    x = ph((4, 3), "X")
    big = np.array([[1000.0, 1000.0, 1000.0], [-np.inf, -np.inf, -np.inf],
                    [-np.inf, 0.0, np.log(2.0)], [-1000.0, -1001.0, -np.inf]])
    got = te.evaluate(nn.logsumexp(x, 1), {x: big})
    want = tt(big).logsumexp(1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[1] == -np.inf and np.isfinite(got[[0, 2, 3]]).all()
    rows = [0, 2, 3]  # a row of only -inf has no softmax (nan, as torch)
    sm = te.evaluate(nn.softmax(x, 1), {x: big})
    np.testing.assert_allclose(sm[rows], tt(big).softmax(1).numpy()[rows], rtol=1e-12)
    ls = te.evaluate(nn.log_softmax(x, 1), {x: big})
    np.testing.assert_allclose(ls[rows], tt(big).log_softmax(1).numpy()[rows])


def test_logsumexp_gradient_with_minus_inf_entries():
    x = ph((2, 3), "X")
    res = te.differentiate(te.nn.sum(nn.logsumexp(x, 1)), [x], simplify=False)
    v = np.array([[-np.inf, 0.0, 0.0], [1000.0, 1000.0, -np.inf]])
    np.testing.assert_allclose(te.evaluate(res.result[0], {x: v}),
                               [[0, 0.5, 0.5], [0.5, 0.5, 0]])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    z = ph((4, 5), "Z")
    lab = ph((4,), "labels", "int64")
    feed = {z: rand(z, 3, -4, 4), lab: np.array([0, 4, 2, 4])}
    y = nn.cross_entropy(z, lab, reduction=reduction)
    ref = np_lse(feed[z], 1) - feed[z][np.arange(4), feed[lab]]
    ref = {"mean": ref.mean(), "sum": ref.sum(), "none": ref}[reduction]
    check_forward(y, feed, ref)
    check_forward(y, feed, F.cross_entropy(tt(feed[z]), tt(feed[lab]),
                                           reduction=reduction).numpy())
    check_grads(y, [z], feed)


def test_cross_entropy_int32_labels_and_large_logits():
    z = ph((2, 3), "Z")
    lab = ph((2,), "labels", "int32")
    v = np.array([[1000.0, 0.0, -1000.0], [5.0, 800.0, 799.0]])
    got = te.evaluate(nn.cross_entropy(z, lab), {z: v, lab: np.array([0, 2], "int32")})
    want = F.cross_entropy(tt(v), tt(np.array([0, 2]))).item()
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    a, b = ph((3, 4), "A"), ph((3, 4), "B")
    feed = {a: rand(a, 4), b: rand(b, 5)}
    y = nn.mse_loss(a, b, reduction)
    d = (feed[a] - feed[b]) ** 2
    check_forward(y, feed, {"mean": d.mean(), "sum": d.sum(), "none": d}[reduction])
    check_forward(y, feed, F.mse_loss(tt(feed[a]), tt(feed[b]), reduction=reduction).numpy())
    check_grads(y, [a, b], feed)


def test_errors():
    z = ph((4, 5), "Z")
    with pytest.raises(te.ShapeError, match="labels labels has 3 entries.*batch of 4"):
        nn.cross_entropy(z, ph((3,), "labels", "int64"))
    with pytest.raises(te.DTypeError, match="integer tensor"):
        nn.cross_entropy(z, ph((4,), "labels"))
    with pytest.raises(te.TexprError, match="reduction"):
        nn.cross_entropy(z, ph((4,), "labels", "int64"), reduction="avg")
    with pytest.raises(te.ShapeError, match="axis 2 is out of range"):
        nn.softmax(z, 2)
    with pytest.raises(te.ShapeError, match=r"\(4, 5\) and target B \(5, 4\) differ"):
        nn.mse_loss(z, ph((5, 4), "B"))
    with pytest.raises(te.OutOfBoundsError):
        te.evaluate(nn.cross_entropy(z, (lab := ph((4,), "L", "int64"))),
                    {z: np.zeros((4, 5)), lab: np.array([0, 1, 5, 0])})
