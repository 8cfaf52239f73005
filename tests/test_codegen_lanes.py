"""Buffer-mode reductions whose innermost reduction loop is long: its values are
unrolled by groups of ``Options.split_lanes`` inside the spatial loops (the output
element is loaded and stored once per group), where the whole group is in the
domain; the partial groups (a constant bound's remainder, or the groups a
``where`` such as a band's ``j - w <= k <= j`` cuts) run as plain loops. And register
blocking of a spatial axis that is not the innermost (a strided conv's dW: the
input channel, when the kernel column is tied to the image by the ``where``).
Checked against the evaluator at sizes that leave remainders, and on the
source's shape.
"""

import re

import numpy as np
import pytest

from texpr import codegen
import texpr as te

JAM, SPLIT_LANES = codegen.Options().jam, codegen.Options().split_lanes

nn = te.nn
RTOL = ATOL = 1e-11


@pytest.fixture(scope="module", autouse=True)
def small_stages_unrolled():
    """The shapes here are small: unroll and block them as large ones are (the
    mechanism under test; Options.unroll_min_points)."""
    with codegen.options(unroll_min_points=0):
        yield


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(7)
    X = te.placeholder((18, 37), "X", "float64")
    W = te.placeholder((20, 37), "W", "float64")
    C = te.placeholder((3, 2 * SPLIT_LANES + 5), "C", "float64")
    I = te.placeholder((4, 2 * JAM + 1, 9, 9), "I", "float64")
    K = te.placeholder((2, 2 * JAM + 1, 3, 3), "K", "float64")
    outs, inputs = [], [X, W, C, I, K]
    # a band sum (two-sided: not a prefix, so it stays a reduction, where cumsum
    # becomes a scan): its ``where`` cuts groups at both ends
    n, w = C.shape[1], SPLIT_LANES + 7
    k = te.reduce_axis(n, "k")
    band = te.compute(C.shape, lambda i, j: te.sum(C[i, k], axis=k,
                                                   where=te.all(k <= j, k + w >= j)),
                      name="band")
    for out, wrt in ((nn.dense(X, W), [X, W]), (band, [C]),
                     (nn.conv2d(I, K, stride=2, padding=1), [I, K])):
        h = te.placeholder(out.shape, f"H_{out.name}", "float64")
        outs += [out] + list(te.differentiate(out, wrt, head=h).result)
        inputs.append(h)
    feed = {t: rng.uniform(-1, 1, t.shape) for t in inputs}
    return codegen.build(outs, inputs), outs, inputs, feed


def test_grouped_reductions_match_the_evaluator(case):
    kernel, outs, inputs, feed = case
    got = kernel(*[feed[t] for t in inputs])
    want = te.evaluate(outs, feed)
    for t, g, w in zip(outs, got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=t.name)


def test_groups_are_unrolled_between_one_load_and_one_store(case):
    src = case[0].source
    # a temp loaded from an output, SPLIT_LANES terms added to it, stored back
    # (buffers are named after their tensors, with a trailing underscore)
    runs = re.findall(r"(t\d+_0) = (\w+_)\[[^\n]*\n((?:[^\n]*\n)*?)\s*\2\[[^\n]*\] = \1\n", src)
    counts = [body.count(f"{t} +=") for t, _, body in runs]
    # dense's dX and dW, the band sum's value and dX
    assert counts.count(SPLIT_LANES) >= 3, counts


def test_strided_conv_weight_gradient_blocks_input_channels(case):
    kernel, outs = case[0], case[1]
    dK = outs[-1]
    src = kernel.source[kernel.source.index(f"# ---- stage {dK.op.name}:"):]
    assert f"_l{JAM - 1} " in src.split("# ---- stage", 2)[1], src


def test_a_sum_loop_with_a_short_constant_trip_count_is_not_unrolled():
    # upsample's dX: each output sums a 2x2 window of a 28-wide axis; isl gives the
    # innermost loop the bounds 2*j .. 2*j + 2, two trips, never the 16 an unrolled
    # sum needs (the copies were compile time for nothing); a long innermost
    # loop in the same stage shape is still unrolled (by copies, or, its loads being
    # unit stride, written once with _radd for LLVM's vectoriser to split)
    rng = np.random.default_rng(3)
    for width, unrolled in ((2, False), (24, True)):
        H = te.placeholder((3, 4 * width), "H", "float64")
        r = te.reduce_axis(4 * width, "r")
        D = te.compute((3, 4), lambda i, j: te.sum(H[i, r], axis=r,
                                                   where=(r >= width * j) & (r < width * j + width)),
                       name="D")
        kern = codegen.build([D], [H])
        assert ("_m = " in kern.source or "= _radd(" in kern.source) == unrolled, kern.source
        h = rng.standard_normal((3, 4 * width))
        np.testing.assert_allclose(kern(h)[0], te.evaluate(D, {H: h}), rtol=RTOL, atol=ATOL)
