"""te.nn operators for the bridge tests (torch gradcheck, jax check_grads): a
representative subset of te.nn.__all__ -- contraction, strided convolution,
max pooling, a softmax-family op, a norm, a scan-like product and a loss with
integer labels. Every case compiles a forward and a backward kernel, so the
whole of te.nn.__all__ would cost minutes of compiling per framework.

Each case builds ``(output, inputs, values)``: float64 placeholders (int64 for
labels) and numpy values for them (floats in [0.5, 1.5): away from the kinks of
max/relu-like ops, so finite differences are meaningful).
"""

import numpy as np

import texpr as te


def _ph(shape, name, dtype="float64"):
    return te.placeholder(shape, name=name, dtype=dtype)


def _values(inputs, seed=7, ints=None):
    rng = np.random.default_rng(seed)
    out = []
    for t in inputs:
        if t.dtype == "int64":
            out.append(np.asarray(ints[t.name], dtype=np.int64))
        else:
            out.append(rng.uniform(0.5, 1.5, t.shape))
    return out


def _case(build, ints=None):
    def make():
        out, inputs = build()
        return out, inputs, _values(inputs, ints=ints)
    return make


NN_CASES = {
    "dense": _case(lambda: (lambda x, w, b: (te.nn.dense(x, w, b), [x, w, b]))(
        _ph((3, 4), "x"), _ph((2, 4), "w"), _ph((2,), "b"))),
    "conv2d": _case(lambda: (lambda x, w: (te.nn.conv2d(x, w, stride=2, padding=1), [x, w]))(
        _ph((1, 2, 5, 5), "x"), _ph((3, 2, 3, 3), "w"))),
    "max_pool2d": _case(lambda: (lambda x: (te.nn.max_pool2d(x, 2), [x]))(_ph((1, 2, 4, 4), "x"))),
    "log_softmax": _case(lambda: (lambda x: (te.nn.log_softmax(x), [x]))(_ph((3, 5), "x"))),
    "layer_norm": _case(lambda: (lambda x: (te.nn.layer_norm(x, (5,)), [x]))(_ph((3, 5), "x"))),
    "cumprod": _case(lambda: (lambda x: (te.nn.cumprod(x), [x]))(_ph((2, 4), "x"))),
    "cross_entropy": _case(
        lambda: (lambda x, y: (te.nn.cross_entropy(x, y), [x, y]))(
            _ph((3, 5), "x"), _ph((3,), "y", "int64")),
        ints={"y": [4, 0, 2]}),
}
