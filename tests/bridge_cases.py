"""te.nn operators for the bridge tests (torch gradcheck, jax check_grads):
``CASES`` has one case for every name of ``te.nn.__all__``, at small shapes.
Every case compiles a forward and a backward kernel; the JAX tests build the
same graphs as the torch tests, so their units come from the compile caches.

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


CASES = {
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


def _unary(fn, shape=(3, 4)):
    return _case(lambda: (lambda x: (fn(x), [x]))(_ph(shape, "x")))


def _binary(fn, sa, sb):
    return _case(lambda: (lambda a, b: (fn(a, b), [a, b]))(_ph(sa, "a"), _ph(sb, "b")))


# recurrent cases at the smallest shapes that still have every axis (batch 1,
# input 2, hidden 2, 2 steps): their kernels are the largest of te.nn to compile
def _cell(fn, gates, state_pair=False):
    def build():
        x, h = _ph((1, 2), "x"), _ph((1, 2), "h")
        wi, wh = _ph((gates * 2, 2), "wi"), _ph((gates * 2, 2), "wh")
        bi, bh = _ph((gates * 2,), "bi"), _ph((gates * 2,), "bh")
        if state_pair:
            c = _ph((1, 2), "c")
            return list(fn(x, (h, c), wi, wh, bi, bh)), [x, h, c, wi, wh, bi, bh]
        return fn(x, h, wi, wh, bi, bh), [x, h, wi, wh, bi, bh]
    return _case(build)


def _sequence(fn, gates):
    def build():
        x = _ph((2, 1, 2), "x")
        wi, wh = _ph((gates * 2, 2), "wi"), _ph((gates * 2, 2), "wh")
        bi, bh = _ph((gates * 2,), "bi"), _ph((gates * 2,), "bh")
        out, state = fn(x, wi, wh, bi, bh)
        outs = [out] + (list(state) if isinstance(state, (tuple, list)) else [state])
        return outs, [x, wi, wh, bi, bh]
    return _case(build)


CASES.update({
    "matmul": _binary(te.nn.matmul, (3, 4), (4, 2)),
    "batch_matmul": _binary(te.nn.batch_matmul, (2, 3, 4), (2, 4, 2)),
    "bias_add": _binary(te.nn.bias_add, (2, 3, 4), (3,)),
    "einsum": _binary(lambda a, b: te.nn.einsum("ij,jk->ik", a, b), (3, 4), (4, 2)),
    "scaled_dot_product_attention": _case(
        lambda: (lambda q, k, v: (te.nn.scaled_dot_product_attention(q, k, v, causal=True),
                                  [q, k, v]))(
            _ph((2, 3, 2), "q"), _ph((2, 3, 2), "k"), _ph((2, 3, 2), "v"))),
    "conv1d": _binary(lambda x, w: te.nn.conv1d(x, w, stride=2, padding=1), (1, 2, 7), (3, 2, 3)),
    "conv2d_transpose": _binary(lambda x, w: te.nn.conv2d_transpose(x, w, stride=2),
                                (1, 2, 3, 3), (2, 3, 3, 3)),
    "avg_pool2d": _unary(lambda x: te.nn.avg_pool2d(x, 2), (1, 2, 4, 4)),
    "global_avg_pool2d": _unary(te.nn.global_avg_pool2d, (1, 2, 3, 3)),
    "adaptive_avg_pool2d": _unary(lambda x: te.nn.adaptive_avg_pool2d(x, (2, 2)), (1, 2, 5, 5)),
    "relu": _unary(te.nn.relu),
    "leaky_relu": _unary(te.nn.leaky_relu),
    "elu": _unary(te.nn.elu),
    "gelu": _unary(te.nn.gelu),
    "sigmoid": _unary(te.nn.sigmoid),
    "tanh": _unary(te.nn.tanh),
    "softmax": _unary(te.nn.softmax),
    "logsumexp": _unary(te.nn.logsumexp),
    "mse_loss": _binary(te.nn.mse_loss, (3, 4), (3, 4)),
    "batch_norm": _case(lambda: (lambda x, w, b: (te.nn.batch_norm(x, w, b), [x, w, b]))(
        _ph((4, 3), "x"), _ph((3,), "w"), _ph((3,), "b"))),
    "dropout": _binary(lambda x, m: te.nn.dropout(x, m, p=0.25), (3, 4), (3, 4)),
    "flatten": _unary(te.nn.flatten, (2, 3, 2)),
    "reshape": _unary(lambda x: te.nn.reshape(x, (3, 4)), (2, 6)),
    "transpose": _unary(te.nn.transpose),
    "squeeze": _unary(lambda x: te.nn.squeeze(x, 1), (3, 1, 4)),
    "expand_dims": _unary(lambda x: te.nn.expand_dims(x, 1)),
    "broadcast_to": _unary(lambda x: te.nn.broadcast_to(x, (3, 4)), (1, 4)),
    "concatenate": _binary(lambda a, b: te.nn.concatenate([a, b], axis=0), (2, 3), (1, 3)),
    "split": _unary(lambda x: list(te.nn.split(x, 2, axis=0)), (4, 3)),
    "pad": _unary(lambda x: te.nn.pad(x, ((1, 0), (0, 2))), (2, 3)),
    "take": _case(lambda: (lambda x, i: (te.nn.take(x, i, axis=0), [x, i]))(
        _ph((5, 3), "x"), _ph((4,), "i", "int64")), ints={"i": [4, 0, 2, 2]}),
    "embedding": _case(lambda: (lambda i, w: (te.nn.embedding(i, w), [i, w]))(
        _ph((4,), "i", "int64"), _ph((5, 3), "w")), ints={"i": [1, 4, 4, 0]}),
    "upsample_nearest": _unary(lambda x: te.nn.upsample_nearest(x, 2), (1, 2, 2, 2)),
    "pixel_shuffle": _unary(lambda x: te.nn.pixel_shuffle(x, 2), (1, 4, 2, 2)),
    "cumsum": _unary(te.nn.cumsum, (2, 4)),
    "rnn_cell": _cell(te.nn.rnn_cell, 1),
    "lstm_cell": _cell(te.nn.lstm_cell, 4, state_pair=True),
    "gru_cell": _cell(te.nn.gru_cell, 3),
    "rnn": _sequence(te.nn.rnn, 1),
    "lstm": _sequence(te.nn.lstm, 4),
    "gru": _sequence(te.nn.gru, 3),
    "sum": _unary(te.nn.sum),
    "mean": _unary(lambda x: te.nn.mean(x, axis=1)),
    "max": _unary(lambda x: te.nn.max(x, axis=1)),
    "min": _unary(lambda x: te.nn.min(x, axis=0)),
})


def run_threads(work, n=4):
    """Run ``work(seed)`` for seeds ``0..n-1`` on ``n`` threads at once; returns after
    every thread has finished (an exception in a thread fails the caller's
    assertions on the results it left)."""
    import threading
    threads = [threading.Thread(target=work, args=(s,)) for s in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
