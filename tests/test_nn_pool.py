"""te.nn pooling: max_pool2d, avg_pool2d, global_avg_pool2d, adaptive_avg_pool2d."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, feed_of, ph, tt

nn = te.nn


def np_pool(x, k, s, p, d, kind, count_include_pad=True):
    """Direct numpy reference over the windows."""
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    ones = np.pad(np.ones((h, w)), ((p[0], p[0]), (p[1], p[1])))
    ho = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    wo = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            rows = slice(i * s[0], i * s[0] + d[0] * (k[0] - 1) + 1, d[0])
            cols = slice(j * s[1], j * s[1] + d[1] * (k[1] - 1) + 1, d[1])
            win = xp[:, :, rows, cols]
            if kind == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = k[0] * k[1] if count_include_pad else ones[rows, cols].sum()
                out[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return out


def pair(v):
    return v if isinstance(v, tuple) else (v, v)


POOL_CASES = [
    # kernel, stride, padding, dilation
    (2, None, 0, 1),
    (3, 2, 1, 1),  # the suite's avgpool3s2
    (3, 1, 1, 1),
    ((3, 2), (2, 1), (1, 0), 1),
    (3, 2, 0, 1),
    (2, 1, 1, 2),
    (3, 3, 1, (2, 1)),
]


@pytest.mark.parametrize("k,s,p,d", POOL_CASES)
def test_max_pool2d(k, s, p, d):
    x = ph((2, 2, 7, 6), "X")
    y = nn.max_pool2d(x, k, s, p, d)
    feed = feed_of(x)
    sp = pair(k) if s is None else pair(s)
    check_forward(y, feed, np_pool(feed[x], pair(k), sp, pair(p), pair(d), "max"))
    check_forward(y, feed, F.max_pool2d(tt(feed[x]), k, s, p, d).numpy())
    x2 = ph((1, 2, 5, 5), "X")
    check_grads(nn.max_pool2d(x2, k, s, p, d), [x2], feed_of(x2))


@pytest.mark.parametrize("cip", [True, False])
@pytest.mark.parametrize("k,s,p,d", POOL_CASES)
def test_avg_pool2d(k, s, p, d, cip):
    x = ph((2, 2, 7, 6), "X")
    y = nn.avg_pool2d(x, k, s, p, count_include_pad=cip, dilation=d)
    feed = feed_of(x)
    sp = pair(k) if s is None else pair(s)
    check_forward(y, feed, np_pool(feed[x], pair(k), sp, pair(p), pair(d), "avg", cip))
    if d == 1:
        check_forward(y, feed, F.avg_pool2d(tt(feed[x]), k, s, p,
                                            count_include_pad=cip).numpy())
    x2 = ph((1, 1, 5, 5), "X")
    check_grads(nn.avg_pool2d(x2, k, s, p, count_include_pad=cip, dilation=d), [x2],
                feed_of(x2))


def test_avg_pool2d_is_one_stage():
    x = ph((1, 1, 6, 6), "X")
    for cip in (True, False):
        y = nn.avg_pool2d(x, 3, 2, 1, count_include_pad=cip)
        assert y.op.input_tensors() == [x]


def test_max_pool2d_padding_never_wins():
    x = ph((1, 1, 4, 4), "X")
    y = nn.max_pool2d(x, 3, 1, 1)
    feed = {x: -np.full((1, 1, 4, 4), 1e30)}
    assert np.all(te.evaluate(y, feed) == -1e30)


def test_global_avg_pool2d():
    x = ph((2, 3, 4, 5), "X")
    y = nn.global_avg_pool2d(x)
    feed = feed_of(x)
    check_forward(y, feed, feed[x].mean(axis=(2, 3), keepdims=True))
    check_grads(y, [x], feed)


@pytest.mark.parametrize("out", [1, 3, (2, 5), (4, 4), 7])
def test_adaptive_avg_pool2d(out):
    x = ph((2, 2, 7, 5), "X")
    y = nn.adaptive_avg_pool2d(x, out)
    feed = feed_of(x)
    check_forward(y, feed, F.adaptive_avg_pool2d(tt(feed[x]), out).numpy(), atol=1e-12)
    x2 = ph((1, 1, 5, 4), "X")
    check_grads(nn.adaptive_avg_pool2d(x2, out), [x2], feed_of(x2))


def test_errors():
    x = ph((1, 2, 5, 5), "X")
    with pytest.raises(te.TexprError, match="padding 2 .* at most half the kernel extent 3"):
        nn.max_pool2d(x, 3, padding=2)
    with pytest.raises(te.ShapeError, match="window of extent 6 .* larger than the padded"):
        nn.avg_pool2d(x, 6)
    with pytest.raises(te.ShapeError, match="4 dimensions"):
        nn.max_pool2d(ph((2, 5, 5), "X3"), 2)
    with pytest.raises(te.TexprError, match="kernel must be >= 1, got 0"):
        nn.max_pool2d(x, 0)
    with pytest.raises(te.TexprError, match="output_size must be >= 1"):
        nn.adaptive_avg_pool2d(x, 0)
    with pytest.raises(te.ShapeError, match="empty spatial extent"):
        nn.global_avg_pool2d(ph((1, 2, 0, 3), "E"))


def _taps(n, k, s, d, p, m):
    """Pairs (output position o < m, tap r < k) with 0 <= o*s + r*d - p < n."""
    return sum(1 for o in range(m) for r in range(k) if 0 <= o * s + r * d - p < n)


@pytest.mark.parametrize("kind", ["max", "avg", "avg_exclude_pad"])
@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 1, 0), (2, 2, 0), (3, 2, 1), (2, 2, 1),
                                   (2, 3, 0)])
def test_pool_gradient_iteration_count(kind, k, s, p):
    """Simplified pooling gradients (stride <, = and > window) visit at most the in-bounds
    (input, window) pairs, plus one pass over the window points for max (docs/testing.md)."""
    from texpr import simplify
    x = ph((1, 2, 6, 6), "X")
    if kind == "max":
        y = nn.max_pool2d(x, k, s, p)
    else:
        y = nn.avg_pool2d(x, k, s, p, count_include_pad=(kind == "avg"))
    ho = y.shape[2]
    ideal = 2 * _taps(6, k, s, 1, p, ho) ** 2
    if kind == "max":
        ideal += 2 * ho * ho * k * k
    (g,) = te.differentiate(y, [x], head=ph(y.shape, "H")).result
    assert simplify.iteration_count([g]) <= ideal
