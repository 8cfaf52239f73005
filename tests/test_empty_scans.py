"""Scans whose state has a zero-size axis (an attack's find): ``te.evaluate`` gave
empty arrays, ``codegen.build`` raised a raw TypeError from the unit interface
(a unit with no buffers: every one it would read or write is empty). Kernels
now build, run and give the evaluator's (empty) values; gradients of the
weights are zeros."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen


def _check(outputs, inputs, feed):
    got = codegen.build(outputs, inputs)(*[feed[p] for p in inputs])
    want = te.evaluate(outputs, feed)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    return got


def test_a_scan_over_an_empty_state():
    T = 3
    Xs = te.placeholder((T, 0), name="Xs")
    S = te.placeholder((T, 0), name="S")
    init = te.compute((1, 0), lambda t, i: Xs[t, i] * 2.0, name="init")
    upd = te.compute((T, 0), lambda t, i: te.tanh(S[t - 1, i]) + Xs[t, i], name="upd")
    h = te.scan(init, upd, S, name="sc")
    (got,) = _check([h], [Xs], {Xs: np.zeros((T, 0), np.float32)})
    assert got.shape == (T, 0)


@pytest.mark.parametrize("layer, gates", [("rnn", 1), ("gru", 3)])
def test_a_recurrent_layer_with_batch_0_and_its_weight_gradients(layer, gates):
    T, H, I = 2, 4, 3
    x = te.placeholder((T, 0, I), name="x")
    wi = te.placeholder((gates * H, I), name="wi")
    wh = te.placeholder((gates * H, H), name="wh")
    out, _ = getattr(te.nn, layer)(x, wi, wh)
    loss = te.nn.sum(out)
    rng = np.random.default_rng(0)
    feed = {x: np.zeros((T, 0, I), np.float32),
            wi: rng.standard_normal((gates * H, I)).astype(np.float32),
            wh: rng.standard_normal((gates * H, H)).astype(np.float32)}
    (y,) = _check([out], [x, wi, wh], feed)
    assert y.shape == (T, 0, H)
    dwi, dwh = te.differentiate(loss, [wi, wh]).result
    got = _check([loss, dwi, dwh], [x, wi, wh], feed)
    assert got[0] == 0 and not got[1].any() and not got[2].any()
