"""te.nn convolutions: conv1d, conv2d, conv2d_transpose vs torch and finite differences."""

import itertools

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, feed_of, ph, tt

nn = te.nn
# torch warns that it copies the input for an even kernel with padding="same"
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")


def np_conv2d(x, w, stride, pad, dil, groups):
    """Direct numpy reference (loops over the kernel taps)."""
    n, c, h, ww = x.shape
    o, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = pad
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho = (h + pt + pb - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (ww + pl + pr - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, ho, wo))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg,
                           i * dil[0]:i * dil[0] + stride[0] * (ho - 1) + 1:stride[0],
                           j * dil[1]:j * dil[1] + stride[1] * (wo - 1) + 1:stride[1]]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
    return out


CONV2D_CASES = [
    # stride, padding, dilation, groups, (C, O, K)
    (1, 0, 1, 1, (2, 3, 3)),
    (1, 1, 1, 1, (2, 3, 3)),
    (2, 1, 1, 1, (2, 3, 3)),
    (1, 2, 2, 1, (2, 3, 3)),
    ((2, 1), (1, 0), (1, 2), 1, (2, 2, 2)),
    (1, 1, 1, 2, (4, 2, 3)),
    (2, 1, 1, 4, (4, 4, 3)),  # depthwise
    (1, 1, 1, 2, (2, 4, 3)),  # depthwise multiplier 2
    (1, "same", 1, 1, (2, 2, 4)),  # asymmetric 'same' padding
    (1, "same", 2, 1, (2, 2, 3)),
    (3, 0, 1, 1, (1, 2, 2)),
    (1, "valid", 1, 1, (2, 2, 3)),
    (1, ((2, 0), (0, 1)), 1, 1, (1, 2, 3)),
]


@pytest.mark.parametrize("stride,padding,dilation,groups,cok", CONV2D_CASES)
def test_conv2d_forward(stride, padding, dilation, groups, cok):
    c, o, k = cok
    x, w, b = ph((2, c, 7, 6), "X"), ph((o, c // groups, k, k), "W"), ph((o,), "b")
    y = nn.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    feed = feed_of(x, w, b)
    if isinstance(padding, tuple) and isinstance(padding[0], tuple):
        tpad = 0
        xin = np.pad(feed[x], ((0, 0), (0, 0)) + padding)
    else:
        tpad, xin = padding, feed[x]
    ref = F.conv2d(tt(xin), tt(feed[w]), tt(feed[b]), stride=stride, padding=tpad,
                   dilation=dilation, groups=groups).numpy()
    check_forward(y, feed, ref)
    conv = y.op.input_tensors()[0]
    pads = conv.op.attrs["padding"]
    check_forward(conv, feed, np_conv2d(feed[x], feed[w], conv.op.attrs["stride"], pads,
                                        conv.op.attrs["dilation"], groups))


@pytest.mark.parametrize("stride,padding,dilation,groups,cok", [
    CONV2D_CASES[1], CONV2D_CASES[2], CONV2D_CASES[3], CONV2D_CASES[4], CONV2D_CASES[6],
    CONV2D_CASES[8], CONV2D_CASES[10]])
def test_conv2d_grad(stride, padding, dilation, groups, cok):
    c, o, k = cok
    c, o = min(c, 2) if groups == 1 else c, o
    x, w, b = ph((1, c, 5, 5), "X"), ph((o, c // groups, k, k), "W"), ph((o,), "b")
    y = nn.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_grads(y, [x, w, b], feed_of(x, w, b))


def test_conv2d_no_guard_without_padding():
    x, w = ph((1, 2, 6, 6), "X"), ph((3, 2, 3, 3), "W")
    text = te.tensor_str(nn.conv2d(x, w, stride=1))
    assert "select" not in text
    # padding only before: only the lower bound is checked
    text = te.tensor_str(nn.conv2d(x, w, padding=((1, 0), (1, 0))))
    assert ">= 0" in text and "< 6" not in text


@pytest.mark.parametrize("stride,padding,dilation,groups", [
    (1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 2), (2, "same", 1, 1)])
def test_conv1d(stride, padding, dilation, groups):
    if padding == "same" and stride != 1:
        x, w = ph((2, 2, 9), "X"), ph((3, 2, 3), "W")
        with pytest.raises(te.TexprError, match="stride 1"):
            nn.conv1d(x, w, stride=stride, padding=padding)
        return
    x, w, b = ph((2, 2, 9), "X"), ph((4, 2 // groups, 3), "W"), ph((4,), "b")
    y = nn.conv1d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    feed = feed_of(x, w, b)
    ref = F.conv1d(tt(feed[x]), tt(feed[w]), tt(feed[b]), stride=stride, padding=padding,
                   dilation=dilation, groups=groups).numpy()
    check_forward(y, feed, ref)
    x2, w2, b2 = ph((1, 2, 6), "X"), ph((4, 2 // groups, 3), "W"), ph((4,), "b")
    y2 = nn.conv1d(x2, w2, b2, stride=stride, padding=padding, dilation=dilation, groups=groups)
    check_grads(y2, [x2, w2, b2], feed_of(x2, w2, b2))


TRANSPOSE_CASES = [
    # stride, padding, output_padding, dilation, groups, (C, O/groups, K)
    (1, 0, 0, 1, 1, (2, 3, 3)),
    (2, 1, 0, 1, 1, (2, 2, 4)),  # the suite's configuration
    (2, 1, 1, 1, 1, (2, 2, 3)),
    (3, 2, 1, 2, 1, (2, 2, 3)),
    ((2, 1), (0, 1), (1, 0), 1, 1, (2, 2, 3)),
    (2, 1, 0, 1, 2, (4, 1, 3)),
    (1, 1, 0, 2, 2, (2, 3, 3)),
]


@pytest.mark.parametrize("stride,padding,opad,dilation,groups,cok", TRANSPOSE_CASES)
def test_conv2d_transpose_forward(stride, padding, opad, dilation, groups, cok):
    c, og, k = cok
    x, w, b = ph((2, c, 5, 4), "X"), ph((c, og, k, k), "W"), ph((og * groups,), "b")
    y = nn.conv2d_transpose(x, w, b, stride=stride, padding=padding, output_padding=opad,
                            dilation=dilation, groups=groups)
    feed = feed_of(x, w, b)
    ref = F.conv_transpose2d(tt(feed[x]), tt(feed[w]), tt(feed[b]), stride=stride,
                             padding=padding, output_padding=opad, groups=groups,
                             dilation=dilation).numpy()
    check_forward(y, feed, ref)


@pytest.mark.parametrize("case", [1, 2, 3, 5])
def test_conv2d_transpose_grad(case):
    stride, padding, opad, dilation, groups, (c, og, k) = TRANSPOSE_CASES[case]
    x, w = ph((1, c, 3, 3), "X"), ph((c, og, k, k), "W")
    y = nn.conv2d_transpose(x, w, stride=stride, padding=padding, output_padding=opad,
                            dilation=dilation, groups=groups)
    check_grads(y, [x, w], feed_of(x, w))


def test_conv2d_transpose_is_conv_input_gradient():
    """conv2d_transpose(dY, W) equals the gradient of conv2d w.r.t. its input."""
    x, w = ph((1, 2, 7, 7), "X"), ph((3, 2, 3, 3), "W")
    y = nn.conv2d(x, w, stride=2, padding=1)
    feed = feed_of(x, w)
    dy = np.random.default_rng(5).standard_normal(y.shape)
    g = ph(y.shape, "G")
    xt = nn.conv2d_transpose(g, w, stride=2, padding=1, output_padding=0)
    ref = F.grad.conv2d_input(x.shape, tt(feed[w]), tt(dy), stride=2, padding=1).numpy()
    check_forward(xt, {g: dy, w: feed[w]}, ref)


SWEEP = list(itertools.product([1, 2, 3], [1, 2, 3], [1, 2, 3]))


@pytest.mark.parametrize("k,s,d", SWEEP)
def test_suite_sweep_forward(k, s, d):
    """The suite's sweep: X 1x2x10x10, W 2x2xKxK, stride, dilation, pad 0."""
    x, w = ph((1, 2, 10, 10), "X"), ph((2, 2, k, k), "W")
    y = nn.conv2d(x, w, stride=s, dilation=d)
    feed = feed_of(x, w)
    check_forward(y, feed, F.conv2d(tt(feed[x]), tt(feed[w]), stride=s, dilation=d).numpy())
    assert "select" not in te.tensor_str(y)


def test_errors():
    x = ph((2, 4, 5, 5), "X")
    with pytest.raises(te.ShapeError, match="input channels 4 of X are not divisible by groups=3"):
        nn.conv2d(x, ph((3, 1, 3, 3), "W"), groups=3)
    with pytest.raises(te.ShapeError, match="output channels 3 are not divisible by groups=2"):
        nn.conv2d(x, ph((3, 2, 3, 3), "W"), groups=2)
    with pytest.raises(te.ShapeError, match=r"expects 3 input channels.*has 4"):
        nn.conv2d(x, ph((2, 3, 3, 3), "W"))
    with pytest.raises(te.ShapeError, match="larger than the padded input extent 5 \\+ 0 \\+ 0"):
        nn.conv2d(x, ph((2, 4, 6, 6), "W"))
    with pytest.raises(te.ShapeError, match="effective 7"):
        nn.conv2d(x, ph((2, 4, 3, 3), "W"), dilation=3)
    with pytest.raises(te.ShapeError, match="4 dimensions"):
        nn.conv2d(ph((4, 5, 5), "X3"), ph((2, 4, 3, 3), "W"))
    with pytest.raises(te.TexprError, match="stride must be >= 1, got 0"):
        nn.conv2d(x, ph((2, 4, 3, 3), "W"), stride=0)
    with pytest.raises(te.TexprError, match="padding must be >= 0"):
        nn.conv2d(x, ph((2, 4, 3, 3), "W"), padding=-1)
    with pytest.raises(te.TexprError, match="padding must be an int"):
        nn.conv2d(x, ph((2, 4, 3, 3), "W"), padding="full")
    with pytest.raises(te.TexprError, match="stride must be an int"):
        nn.conv2d(x, ph((2, 4, 3, 3), "W"), stride=1.5)
    with pytest.raises(te.ShapeError, match="bias"):
        nn.conv2d(x, ph((2, 4, 3, 3), "W"), ph((3,), "b"))
    with pytest.raises(te.ShapeError, match="expects 3 input channels but input X"):
        nn.conv2d_transpose(x, ph((3, 2, 3, 3), "W"))
    with pytest.raises(te.TexprError, match="output_padding 2.*smaller than the stride 2"):
        nn.conv2d_transpose(x, ph((4, 2, 3, 3), "W"), stride=2, output_padding=2)
    with pytest.raises(te.ShapeError, match="not divisible by groups=3"):
        nn.conv2d_transpose(x, ph((4, 2, 3, 3), "W"), groups=3)
    with pytest.raises(te.ShapeError, match="is not positive"):
        nn.conv2d_transpose(ph((1, 1, 1, 1), "X1"), ph((1, 1, 1, 1), "W"), padding=1)


def _taps(n, k, s, d, p, m):
    return sum(1 for o in range(m) for r in range(k) if 0 <= o * s + r * d - p < n)


@pytest.mark.parametrize("k,s,d", SWEEP)
def test_suite_sweep_iteration_count(k, s, d):
    """The suite's sweep: the simplified dX and dW visit at most the forward's
    multiply-adds (N * O * C * taps_h * taps_w)."""
    from texpr import simplify
    x, w = ph((1, 2, 10, 10), "X"), ph((2, 2, k, k), "W")
    y = nn.conv2d(x, w, stride=s, dilation=d)
    head = ph(y.shape, "H")
    ideal = 1 * 2 * 2 * _taps(10, k, s, d, 0, y.shape[2]) ** 2
    for g, t in zip(te.differentiate(y, [x, w], head=head).result, (x, w)):
        count = simplify.iteration_count([g])
        assert count <= ideal, f"K={k} s={s} d={d}: d{t.name} visits {count}, ideal {ideal}"
