"""te.nn normalisation: layer_norm, batch_norm (training mode), dropout with a given mask."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, feed_of, ph, rand, tt

nn = te.nn


@pytest.mark.parametrize("shape,ns,affine", [
    ((3, 5), 5, False), ((3, 5), (5,), True), ((2, 3, 4), (3, 4), True), ((2, 3, 4), 4, False)])
def test_layer_norm(shape, ns, affine):
    x = ph(shape, "X")
    nsh = ns if isinstance(ns, tuple) else (ns,)
    w, b = ph(nsh, "w"), ph(nsh, "b")
    y = nn.layer_norm(x, ns, w if affine else None, b if affine else None, eps=1e-5)
    feed = feed_of(x, w, b)
    axes = tuple(range(len(shape) - len(nsh), len(shape)))
    xv = feed[x]
    ref = (xv - xv.mean(axes, keepdims=True)) / np.sqrt(xv.var(axes, keepdims=True) + 1e-5)
    if affine:
        ref = ref * feed[w] + feed[b]
    check_forward(y, feed, ref)
    check_forward(y, feed, F.layer_norm(tt(xv), nsh, tt(feed[w]) if affine else None,
                                        tt(feed[b]) if affine else None, eps=1e-5).numpy())
    check_grads(y, [x, w, b] if affine else [x], feed)


@pytest.mark.parametrize("shape,affine", [((4, 3), True), ((2, 3, 2, 2), False),
                                          ((2, 2, 3, 2), True)])
def test_batch_norm(shape, affine):
    x = ph(shape, "X")
    c = shape[1]
    w, b = ph((c,), "w"), ph((c,), "b")
    y = nn.batch_norm(x, w if affine else None, b if affine else None, eps=1e-3)
    feed = feed_of(x, w, b)
    ref = F.batch_norm(tt(feed[x]), None, None, tt(feed[w]) if affine else None,
                       tt(feed[b]) if affine else None, training=True, eps=1e-3).numpy()
    check_forward(y, feed, ref)
    axes = tuple(d for d in range(len(shape)) if d != 1)
    xv = feed[x]
    bshape = [1] * len(shape)
    bshape[1] = c
    ref2 = (xv - xv.mean(axes, keepdims=True)) / np.sqrt(xv.var(axes, keepdims=True) + 1e-3)
    if affine:
        ref2 = ref2 * feed[w].reshape(bshape) + feed[b].reshape(bshape)
    check_forward(y, feed, ref2)
    check_grads(y, [x, w, b] if affine else [x], feed)


@pytest.mark.parametrize("kind", ["bool", "float64"])
@pytest.mark.parametrize("p", [0.0, 0.25, 0.5])
def test_dropout(kind, p):
    x = ph((3, 4), "X")
    m = ph((3, 4), "M", kind)
    mv = np.random.default_rng(7).uniform(size=(3, 4)) > 0.4
    feed = {x: rand(x), m: mv.astype(kind)}
    y = nn.dropout(x, m, p)
    check_forward(y, feed, feed[x] * mv / (1 - p))
    check_grads(y, [x], feed)


def test_errors():
    x = ph((3, 5), "X")
    with pytest.raises(te.ShapeError, match=r"normalized_shape \(4,\) is not the trailing"):
        nn.layer_norm(x, 4)
    with pytest.raises(te.ShapeError, match=r"weight w has shape \(4,\), expected \(5,\)"):
        nn.layer_norm(x, 5, ph((4,), "w"))
    with pytest.raises(te.ShapeError, match="at least 2 dimensions"):
        nn.batch_norm(ph((3,), "v"))
    with pytest.raises(te.ShapeError, match=r"weight w has shape \(3,\), expected \(5,\)"):
        nn.batch_norm(x, ph((3,), "w"))
    with pytest.raises(te.TexprError, match=r"p must be in \[0, 1\), got 1.0"):
        nn.dropout(x, ph((3, 5), "M", "bool"), 1.0)
    with pytest.raises(te.ShapeError, match="mask M has shape"):
        nn.dropout(x, ph((5, 3), "M", "bool"))
    with pytest.raises(te.DTypeError, match="bool or float"):
        nn.dropout(x, ph((3, 5), "M", "int64"))
