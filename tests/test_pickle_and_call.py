"""Pickling graphs and kernels (in process and through a spawned worker), and
calling kernels with keyword arguments and out= buffers."""

import multiprocessing
import pickle

import numpy as np
import pytest

import texpr as te
from texpr import codegen
from texpr.expr import Const, IterVar, const


def _graph():
    X = te.placeholder((4, 5), name="X")
    W = te.placeholder((3, 5), name="W")
    k = te.reduce_axis(5, name="k")
    Y = te.compute((4, 3), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="Y")
    k2 = te.reduce_axis(3, "k2")
    M = te.compute((4,), lambda i: te.max(Y[i, k2], axis=k2), name="M")
    return X, W, Y, M


_KERNEL = {}


def _kernel():
    if not _KERNEL:
        X, W, Y, M = _graph()
        _KERNEL["k"] = (codegen.build([Y, M], [X, W]), X, W, Y, M)
    return _KERNEL["k"]


def _feed(seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((4, 5), dtype=np.float32), rng.random((3, 5), dtype=np.float32)


def test_graph_round_trip_evaluates_the_same():
    X, W, Y, M = _graph()
    dW, = te.differentiate(M, [W])
    X2, W2, M2, dW2 = pickle.loads(pickle.dumps((X, W, M, dW)))
    x, w = _feed()
    for a, b in ((M, M2), (dW, dW2)):
        np.testing.assert_array_equal(te.evaluate(a, {X: x, W: w}),
                                      te.evaluate(b, {X2: x, W2: w}))
    assert str(M2) == str(M) and M2.shape == M.shape and M2.dtype == M.dtype


def test_loaded_nodes_re_intern_and_variables_stay_distinct():
    c = const(2.5, "float32")
    assert pickle.loads(pickle.dumps(c)) is c          # interned: the same node
    X = te.placeholder((3,), name="X")
    e = X[0] * c + 1.0
    X2, e2 = pickle.loads(pickle.dumps((X, e)))
    assert e2 is not e                                  # another tensor -> another load
    assert e2.args[0].args[1] is c                      # its constant re-interned
    assert X2[0] * c + 1.0 is e2                        # rebuilding it gives the same node
    k = te.reduce_axis(4, "k")
    k2 = pickle.loads(pickle.dumps(k))
    assert isinstance(k2, IterVar) and k2 is not k and k2.dom == k.dom and k2.kind == "reduce"
    # a loaded variable is a fresh one: it never merges with a local one of the same uid
    assert k2.attr[1] != k.attr[1]
    # one dumps keeps sharing: a reduction axis is the same object in body and attr
    _, _, Y, _ = _graph()
    Y2 = pickle.loads(pickle.dumps(Y))
    red = Y2.op.body[0]
    assert red.axes[0] is [n for n in te.visitor.post_order(red) if isinstance(n, IterVar)
                           and n.kind == "reduce"][0]
    # a built-in reducer's combiner is the local one
    assert red.combiner is Y.op.body[0].combiner
    assert isinstance(pickle.loads(pickle.dumps(const(True))), Const)


def test_kernel_round_trip_loads_from_the_cache():
    kernel, X, W, Y, M = _kernel()
    k2 = pickle.loads(pickle.dumps(kernel))
    assert k2.from_memory_cache and k2.source == kernel.source
    x, w = _feed(1)
    for a, b in zip(kernel(x, w), k2(x, w)):
        np.testing.assert_array_equal(a, b)


def _worker(payload):
    kernel, graph_and_inputs, x, w = pickle.loads(payload)
    (Mg, Xg, Wg) = graph_and_inputs
    return kernel(x, w), te.evaluate(Mg, {Xg: x, Wg: w})


def test_kernel_and_graph_in_a_spawned_process():
    kernel, X, W, Y, M = _kernel()
    x, w = _feed(2)
    payload = pickle.dumps((kernel, (M, X, W), x, w))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        (y, m), m_ref = pool.apply(_worker, (payload,))
    want_y, want_m = kernel(x, w)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(m, want_m)
    np.testing.assert_allclose(m_ref, want_m, rtol=1e-6)


# ---- keyword arguments and out= ---------------------------------------------------------

def test_keyword_arguments_by_placeholder_name():
    kernel, *_ = _kernel()
    x, w = _feed(3)
    want = kernel(x, w)
    for got in (kernel(W=w, X=x), kernel(x, W=w)):
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(te.FeedError, match="no input placeholder is named 'Z'"):
        kernel(x, Z=w)
    with pytest.raises(te.FeedError, match="both by position and by name"):
        kernel(x, w, X=x)
    with pytest.raises(te.FeedError, match="no array given for input"):
        kernel(X=x)


def test_out_buffers_are_written_and_returned():
    kernel, *_ = _kernel()
    x, w = _feed(4)
    want = kernel(x, w)
    oy, om = np.full((4, 3), np.nan, np.float32), np.full(4, np.nan, np.float32)
    got = kernel(x, w, out=(oy, om))
    assert got[0] is oy and got[1] is om
    np.testing.assert_array_equal(oy, want[0])
    np.testing.assert_array_equal(om, want[1])
    # None allocates that one
    got = kernel(x, w, out=(None, om))
    assert got[1] is om and got[0] is not oy
    np.testing.assert_array_equal(got[0], want[0])


def test_out_for_an_output_listed_twice_and_a_placeholder_output():
    X = te.placeholder((3,), name="Xo")
    Y = te.compute((3,), lambda i: X[i] * 2.0, name="Yo")
    kernel = codegen.build([Y, Y, X], [X])
    x = np.arange(3, dtype=np.float32)
    a, b, c = np.empty(3, np.float32), np.empty(3, np.float32), np.empty(3, np.float32)
    got = kernel(x, out=(a, b, c))
    assert got[0] is a and got[1] is b and got[2] is c
    np.testing.assert_array_equal(a, x * 2)
    np.testing.assert_array_equal(b, x * 2)
    np.testing.assert_array_equal(c, x)


@pytest.mark.parametrize("make, message", [
    (lambda x: (np.empty((3, 4), np.float32), None), r"out\[0\] \(the buffer of output 0, .*\) has shape"),
    (lambda x: (np.empty((4, 3), np.float64), None), "has dtype float64"),
    (lambda x: (np.empty((3, 4), np.float32).T, None), "not C-contiguous"),
    # '>f4' is named float32 too, but the kernel writes native-order bytes
    (lambda x: (np.empty((4, 3), ">f4"), None), r"out\[0\] .* byte order '>f4'"),
    (lambda x: (None, np.empty(4, ">f4")), r"out\[1\] .* byte order '>f4'"),
    (lambda x: (None,), "1 entries for 2 outputs"),
    (lambda x: ([[0.0] * 3] * 4, None), "must be a numpy array"),
])
def test_bad_out_buffers(make, message):
    kernel, *_ = _kernel()
    x, w = _feed(5)
    with pytest.raises(te.FeedError, match=message):
        kernel(x, w, out=make(x))


def test_out_overlapping_an_input_or_read_only_is_refused():
    X = te.placeholder((3,), name="Xa")
    Y = te.compute((3,), lambda i: X[2 - i] + 1.0, name="Ya")
    kernel = codegen.build(Y, [X])
    x = np.arange(3, dtype=np.float32)
    with pytest.raises(te.FeedError, match="overlaps"):
        kernel(x, out=(x,))
    ro = np.empty(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(te.FeedError, match="read-only"):
        kernel(x, out=(ro,))
    o = np.empty(3, np.float32)
    assert kernel(x, out=o)[0] is o  # one output: a bare array is accepted
    np.testing.assert_array_equal(o, x[::-1] + 1)


def test_framework_ops_pickle():
    import torch

    import texpr.torch as tt

    X = te.placeholder((3,), name="Xp", dtype="float64")
    Y = te.compute((3,), lambda i: X[i] * X[i], name="Yp")
    f = tt.op(Y, [X])
    g = pickle.loads(pickle.dumps(f))
    assert g.spec.key != f.spec.key
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
    y = g(x)
    torch.testing.assert_close(y, x * x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
