"""Value-and-grad kernels (forward plus ``te.differentiate`` adjoints) vs the evaluator.

Each fixture compiles one kernel computing an operator's output and the
gradients of ``sum(out * H)`` w.r.t. its inputs (``H`` a placeholder head), the
default schedule (simplifier first), float64, and compares every output with
``te.evaluate`` of the same tensors. A structural test checks that a strided
convolution's input gradient has no modulo test inside an innermost loop, both
after the simplifier and for the raw "sum over (output index, kernel index) of
head * select(equality, ...)" form that codegen gets alone.
"""

import re

import numpy as np
import pytest

from texpr import codegen
import texpr as te

nn = te.nn
RTOL = ATOL = 1e-11


def _value_and_grad(outs_wrt, extra_inputs=(), seed=0):
    """[(out, wrt list)] -> (kernel, tensors, feed, inputs) with heads as placeholders."""
    rng = np.random.default_rng(seed)
    tensors, feed, inputs = [], {}, []
    for out, wrt in outs_wrt:
        h = te.placeholder(out.shape, f"H_{out.name}", "float64")
        feed[h] = rng.uniform(-1, 1, out.shape)
        grads = te.differentiate(out, wrt, head=h).result
        tensors += [out] + list(grads)
        for t in list(wrt) + [h]:
            if t not in inputs:
                inputs.append(t)
    for t in extra_inputs:
        inputs.append(t)
    for t in inputs:
        if t not in feed:
            feed[t] = rng.uniform(-1, 1, t.shape)
    return codegen.build(tensors, inputs), tensors, feed, inputs


def _check(case):
    kernel, tensors, feed, inputs = case
    got = kernel(*[feed[t] for t in inputs])
    want = te.evaluate(tensors, feed)
    for t, g, w in zip(tensors, got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=t.name)


def innermost_loop_bodies(source):
    """The lines of every innermost ``for`` loop body of a generated kernel."""
    lines = source.splitlines()
    out = []
    for k, ln in enumerate(lines):
        if not re.match(r"\s*for .* in p?range\(", ln):
            continue
        ind = len(ln) - len(ln.lstrip())
        body = []
        for nxt in lines[k + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= ind:
                break
            body.append(nxt)
        if not any(re.match(r"\s*for ", b) for b in body):
            out.append(body)
    return out


def _no_modulo_test_inside_innermost_loops(source):
    bodies = innermost_loop_bodies(source)
    assert bodies
    for body in bodies:
        for ln in body:
            assert not (ln.lstrip().startswith("if ") and "%" in ln), ln


@pytest.fixture(scope="module")
def conv_strided():
    X = te.placeholder((2, 3, 9, 9), "X", "float64")
    W = te.placeholder((4, 3, 3, 3), "W", "float64")
    return _value_and_grad([(nn.conv2d(X, W, stride=2, padding=1), [X, W])])


@pytest.fixture(scope="module")
def conv_dilated():
    X = te.placeholder((2, 3, 10, 11), "X", "float64")
    W = te.placeholder((2, 3, 3, 2), "W", "float64")
    y = nn.conv2d(X, W, stride=(1, 3), dilation=(2, 2), padding=(2, 1))
    return _value_and_grad([(y, [X, W])], seed=1)


@pytest.fixture(scope="module")
def pools():
    X = te.placeholder((2, 3, 10, 10), "X", "float64")
    return _value_and_grad([(nn.max_pool2d(X, 2, 2), [X]),
                            (nn.avg_pool2d(X, 3, 2, 1, count_include_pad=True), [X])], seed=2)


@pytest.fixture(scope="module")
def scans_and_gathers():
    X = te.placeholder((3, 10), "X", "float64")
    Q = te.placeholder((2, 6, 4), "Q", "float64")
    K = te.placeholder((2, 6, 4), "K", "float64")
    E_ = te.placeholder((7, 5), "Emb", "float64")
    idx = te.placeholder((6,), "idx", "int64")
    d = te.reduce_axis(4, "d")
    scores = te.compute((2, 6, 6), lambda b, i, j: te.sum(Q[b, i, d] * K[b, j, d], axis=d,
                                                          where=j <= i), name="causal")
    case = _value_and_grad([(nn.cumsum(X, axis=1), [X]), (scores, [Q, K]),
                            (nn.embedding(idx, E_), [E_])], extra_inputs=[idx], seed=3)
    kernel, tensors, feed, inputs = case
    feed[idx] = np.array([0, 6, 6, 2, 0, 3])
    return case


def test_strided_conv_value_and_grad(conv_strided):
    _check(conv_strided)


def test_dilated_padded_conv_value_and_grad(conv_dilated):
    _check(conv_dilated)


def test_pooling_value_and_grad(pools):
    _check(pools)


def test_cumsum_causal_and_embedding_value_and_grad(scans_and_gathers):
    _check(scans_and_gathers)


def test_strided_conv_gradient_has_no_modulo_test_in_innermost_loops(conv_strided):
    kernel = conv_strided[0]
    assert len(kernel.stages) == 3
    _no_modulo_test_inside_innermost_loops(kernel.source)


def test_raw_strided_conv_input_gradient_lowers_to_strided_loops():
    # dI[n, h] = sum_{oh, kh} H[n, oh] * select(2*oh + kh - 1 == h, W[kh], 0): codegen alone
    H = te.placeholder((2, 6), "H", "float64")
    W = te.placeholder((3,), "W", "float64")
    oh, kh = te.reduce_axis(6, "oh"), te.reduce_axis(3, "kh")
    dI = te.compute((2, 11), lambda n, h: te.sum(
        H[n, oh] * te.if_then_else(2 * oh + kh - 1 == h, W[kh], 0.0), axis=[oh, kh]),
        name="dI_raw")
    s = codegen.create_schedule([dI])  # a schedule given: the simplifier does not run
    kernel = codegen.build([dI], [H, W], s)
    _no_modulo_test_inside_innermost_loops(kernel.source)
    body = kernel.source[kernel.source.index("stage dI_raw"):]
    assert body.count("for ") == 3  # n, h and one reduction loop: the equality is solved
    # the gather order (reduction inside): the parity of kh is a loop stride
    s2 = codegen.create_schedule([dI])
    n, h = dI.op.axis
    s2[dI].reorder(n, h, kh, oh)
    gather = codegen.build([dI], [H, W], s2)
    _no_modulo_test_inside_innermost_loops(gather.source)
    assert re.search(r"for c0_\d+ in range\(.*%.*, 2\):", gather.source), gather.source
    rng = np.random.default_rng(4)
    hv, wv = rng.uniform(-1, 1, (2, 6)), rng.uniform(-1, 1, (3,))
    want = te.evaluate(dI, {H: hv, W: wv})
    for k in (kernel, gather):
        np.testing.assert_allclose(k(hv, wv)[0], want, rtol=RTOL, atol=ATOL)
