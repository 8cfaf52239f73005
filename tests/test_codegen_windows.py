"""Window stages (codegen/rewrite/windows.py): a convolution and its weight gradient read
their input through one materialised window (im2col) stage, with the values
of the stages they replace -- against the evaluator (finite and non-finite
inputs: the window's zeros are absent terms), finite differences and PyTorch."""

import numpy as np
import pytest

import texpr as te
from texpr import codegen, simplify
from texpr.codegen.rewrite.windows import WINDOW, WINDOWED, window_operands
from texpr.tensor import topo_order

from conv_testutil import assert_same_values, check_conv_kernel, conv_loss
from fuzz import every_contraction_on_blas as blas_at_any_size  # the cost rule off

nn = te.nn


def _windows(outs):
    with blas_at_any_size():
        new, wins, _ = window_operands(outs)
    return new, wins


def test_a_convolution_and_its_weight_gradient_share_one_window():
    L, (X, W, H) = conv_loss()
    outs = simplify.simplify([L] + list(te.differentiate(L, [W]).result))
    new, wins = _windows(outs)
    assert [op.name for op in wins] == ["X_window"]
    readers = [op for op in topo_order(new) if getattr(op, "attrs", {}).get(WINDOWED)]
    assert sorted(op.name for op in readers) == ["conv", "d_W__conv"]
    # (c, kh, kw, n, h, w): the convolution's K beside its images
    assert wins[0].output(0).shape == (3, 3, 3, 2, 7, 7)
    assert len(wins[0].attrs[WINDOW]) == 2


def test_a_window_read_by_one_stage_is_not_made():
    L, (X, W, H) = conv_loss()
    outs = simplify.simplify([L] + list(te.differentiate(L, [X]).result))
    _, wins = _windows(outs)
    assert wins == []


@pytest.mark.parametrize("stride,dilation,padding,k", [
    (1, 1, 1, 3), (2, 1, 1, 3), (1, 2, 2, 3), (2, 1, 0, 2), (2, 2, 1, 3)])
def test_window_kernels_match_the_evaluator_fd_and_torch(stride, dilation, padding, k):
    L, ins = conv_loss(3, 3, stride, dilation, padding, k, size=9)
    X, W, H = ins
    grads = list(te.differentiate(L, [X, W]).result)
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    units = {u.stage: u.kind for u in kernel.units}
    assert "X_window" in units and units["conv"] == "blas" and units["d_W__conv"] == "blas"
    check_conv_kernel(kernel, L, ins, grads, stride, dilation, padding, stride * 7 + k)


@pytest.mark.parametrize("where", ["W", "H", "X"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_non_finite_values_meet_the_windows_zeros_as_absent_terms(where, value):
    # an infinite weight meets the window's zeros at the padding: the original
    # never visits those terms, so a border output stays finite (not 0 * inf)
    L, ins, y = conv_loss(dtype="float32", with_conv=True)
    X, W, H = ins
    dW = te.differentiate(L, [W]).result[0]
    with blas_at_any_size():
        kernel = codegen.build([y, dW], ins)
    assert "X_window" in {u.stage for u in kernel.units}
    rng = np.random.default_rng(3)
    feed = {t: rng.standard_normal(t.shape).astype("float32") for t in ins}
    ref = simplify.simplify([y, dW])
    t = {"W": W, "H": H, "X": X}[where]
    spots = {"W": [(0, 0, 0, 0), (2, 1, 2, 2), (1, 2, 1, 1)],
             "H": [(0, 0, 0, 0), (1, 2, 6, 3)],
             "X": [(0, 0, 0, 0), (1, 2, 6, 6), (0, 1, 3, 4)]}[where]
    for pos in spots:
        f = dict(feed)
        f[t] = feed[t].copy()
        f[t][pos] = value
        got = kernel(*[f[s] for s in ins])
        # the kernel's oracle is the simplified graph, where padding is no term
        # (docs/conventions.md, "Zeros"; the unsimplified conv computes 0 * inf)
        want = te.evaluate(ref, f)
        for g, w in zip(got, want):
            assert_same_values(g, w)


def test_a_window_over_a_shrunk_tap_domain_is_read_at_its_offset():
    # two stages read X through one window whose tap runs over [1, 3): the window's
    # axis runs over [0, 2), read at k - 1, and its valid region moves with it
    X = te.placeholder((2, 4, 9), "X", "float64")
    W1 = te.placeholder((5, 4, 3), "W1", "float64")
    W2 = te.placeholder((6, 4, 3), "W2", "float64")

    def stage(W, name):
        c, k = te.reduce_axis(4, "c"), te.reduce_axis((1, 3), "k")
        return te.compute((2, W.shape[0], 9), lambda n, o, h: te.sum(
            X[n, c, h + k - 2] * W[o, c, k], axis=[c, k], where=(h + k >= 2) & (h + k <= 10)),
            name=name)
    y1, y2 = stage(W1, "y1"), stage(W2, "y2")
    new, wins = _windows([y1, y2])
    assert [op.name for op in wins] == ["X_window"]
    assert wins[0].output(0).shape == (4, 2, 2, 9)
    with blas_at_any_size():
        kernel = codegen.build([y1, y2], [X, W1, W2])
    assert "X_window" in kernel.stages
    rng = np.random.default_rng(4)
    feed = {t: rng.standard_normal(t.shape) for t in (X, W1, W2)}
    want = te.evaluate([y1, y2], feed)
    for a, b in zip(te.evaluate(new, feed), want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    got = kernel(feed[X], feed[W1], feed[W2])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    # an infinite weight at the tap that reads the border: absent there
    f = dict(feed)
    f[W1] = feed[W1].copy()
    f[W1][0, 0, 1] = np.inf
    got = kernel(f[X], f[W1], f[W2])
    for a, b in zip(got, te.evaluate([y1, y2], f)):
        assert_same_values(a, b, rtol=1e-10, atol=1e-10)


def test_no_window_larger_than_what_the_gemms_read():
    # a strided convolution's dX reads W[o, c, h - 2 r + 1, ...] by taps: a window
    # over (h, r) would hold ~h/2 copies of every weight per image row
    L, (X, W, H) = conv_loss(3, 3, stride=2, size=9)
    outs = simplify.simplify([L] + list(te.differentiate(L, [X]).result))
    with codegen.options(window_min_readers=1):
        _, wins = _windows(outs)
    assert "W_window" not in [op.name for op in wins]
    assert "X_window" in [op.name for op in wins]  # the forward's, one reader here


def test_a_window_of_a_stage_behind_another_window():
    # conv -> relu -> conv: the second convolution and its weight gradient read the
    # packed relu through one window, though the relu's producer was rewritten
    # first (its own window): the signatures name the input graph's tensors
    X = te.placeholder((2, 3, 7, 7), "X", "float64")
    W0 = te.placeholder((4, 3, 3, 3), "W0", "float64")
    W1 = te.placeholder((5, 4, 3, 3), "W1", "float64")
    h = nn.relu(nn.conv2d(X, W0, padding=1, name="conv0"), name="relu0")
    y = nn.conv2d(h, W1, padding=1, name="conv1")
    H = te.placeholder(y.shape, "H", "float64")
    ax = [te.reduce_axis(s, a) for s, a in zip(y.shape, "ncij")]
    L = te.compute((), lambda: te.sum(y[tuple(ax)] * H[tuple(ax)], axis=ax), name="L")
    ins = [X, W0, W1, H]
    grads = list(te.differentiate(L, [W0, W1]).result)
    with blas_at_any_size():
        kernel = codegen.build([L] + grads, ins)
    wins = sorted(s for s in kernel.stages if s.endswith("_window"))
    assert wins == ["X_window", "conv1_packed0_window"], kernel.stages
    rng = np.random.default_rng(6)
    feed = {t: rng.standard_normal(t.shape) for t in ins}
    for g, w in zip(kernel(*[feed[t] for t in ins]), te.evaluate([L] + grads, feed)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    # an infinite weight: the relu's padding stays absent (simplified graph's oracle)
    f = dict(feed)
    f[W1] = feed[W1].copy()
    f[W1][0, 0, 0, 0] = np.inf
    ref = simplify.simplify([L] + grads)
    for g, w in zip(kernel(*[f[t] for t in ins]), te.evaluate(ref, f)):
        assert_same_values(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-10)
