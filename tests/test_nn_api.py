"""te.nn as a whole: the exported names, docstrings, dtypes kept, readable stage names,
and small models composed from the operators (forward vs torch, gradients vs finite
differences)."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, feed_of, ph, tt

nn = te.nn

#: the operators issue 6 lists
ISSUE_OPERATORS = """dense matmul batch_matmul bias_add einsum conv1d conv2d conv2d_transpose
max_pool2d avg_pool2d global_avg_pool2d adaptive_avg_pool2d relu leaky_relu elu gelu sigmoid
tanh softmax log_softmax logsumexp cross_entropy mse_loss layer_norm batch_norm dropout flatten
reshape transpose squeeze expand_dims broadcast_to concatenate split pad take embedding
upsample_nearest pixel_shuffle cumsum cumprod sum mean max min""".split()

#: the recurrent operators issue 13 adds
ISSUE_OPERATORS += "rnn_cell lstm_cell gru_cell rnn lstm gru".split()

#: the attention the mini-GPT example needs
ISSUE_OPERATORS += ["scaled_dot_product_attention"]


def test_all_lists_every_operator():
    assert sorted(nn.__all__) == sorted(ISSUE_OPERATORS)
    assert len(set(nn.__all__)) == len(nn.__all__)
    ns = {}
    exec("from texpr.nn import *", ns)
    assert all(name in ns for name in ISSUE_OPERATORS)


@pytest.mark.parametrize("name", ISSUE_OPERATORS)
def test_docstring(name):
    doc = getattr(nn, name).__doc__
    assert doc and len(doc) > 80, name
    assert "Raises" in doc, name  # every operator documents its errors


def f32(shape, name="X"):
    return ph(shape, name, "float32")


FLOAT32_CALLS = {
    "dense": lambda: nn.dense(f32((2, 3)), f32((4, 3), "W"), f32((4,), "b")),
    "matmul": lambda: nn.matmul(f32((2, 3)), f32((3, 4), "B")),
    "batch_matmul": lambda: nn.batch_matmul(f32((2, 2, 3)), f32((2, 3, 4), "B")),
    "bias_add": lambda: nn.bias_add(f32((2, 3)), f32((3,), "b")),
    "einsum": lambda: nn.einsum("ij,jk->ik", f32((2, 3)), f32((3, 4), "B")),
    "scaled_dot_product_attention": lambda: nn.scaled_dot_product_attention(
        f32((2, 3, 4)), f32((2, 5, 4), "K"), f32((2, 5, 3), "V"), causal=True),
    "conv1d": lambda: nn.conv1d(f32((1, 2, 6)), f32((3, 2, 3), "W"), padding=1),
    "conv2d": lambda: nn.conv2d(f32((1, 2, 6, 6)), f32((3, 2, 3, 3), "W"), padding=1),
    "conv2d_transpose": lambda: nn.conv2d_transpose(f32((1, 2, 3, 3)), f32((2, 3, 3, 3), "W"),
                                                    stride=2),
    "max_pool2d": lambda: nn.max_pool2d(f32((1, 2, 6, 6)), 3, 2, 1),
    "avg_pool2d": lambda: nn.avg_pool2d(f32((1, 2, 6, 6)), 3, 2, 1, count_include_pad=False),
    "global_avg_pool2d": lambda: nn.global_avg_pool2d(f32((1, 2, 6, 6))),
    "adaptive_avg_pool2d": lambda: nn.adaptive_avg_pool2d(f32((1, 2, 7, 6)), 4),
    "relu": lambda: nn.relu(f32((4,))),
    "leaky_relu": lambda: nn.leaky_relu(f32((4,))),
    "elu": lambda: nn.elu(f32((4,))),
    "gelu": lambda: nn.gelu(f32((4,))),
    "sigmoid": lambda: nn.sigmoid(f32((4,))),
    "tanh": lambda: nn.tanh(f32((4,))),
    "softmax": lambda: nn.softmax(f32((2, 4))),
    "log_softmax": lambda: nn.log_softmax(f32((2, 4))),
    "logsumexp": lambda: nn.logsumexp(f32((2, 4))),
    "cross_entropy": lambda: nn.cross_entropy(f32((2, 4)), ph((2,), "L", "int64")),
    "mse_loss": lambda: nn.mse_loss(f32((2, 4)), f32((2, 4), "T")),
    "layer_norm": lambda: nn.layer_norm(f32((2, 4)), 4, f32((4,), "w"), f32((4,), "b")),
    "batch_norm": lambda: nn.batch_norm(f32((2, 3, 2)), f32((3,), "w"), f32((3,), "b")),
    "dropout": lambda: nn.dropout(f32((2, 4)), ph((2, 4), "M", "bool"), 0.5),
    "flatten": lambda: nn.flatten(f32((2, 3, 2))),
    "reshape": lambda: nn.reshape(f32((2, 3, 2)), (3, 4)),
    "transpose": lambda: nn.transpose(f32((2, 3))),
    "squeeze": lambda: nn.squeeze(f32((2, 1))),
    "expand_dims": lambda: nn.expand_dims(f32((2,)), 0),
    "broadcast_to": lambda: nn.broadcast_to(f32((3,)), (2, 3)),
    "concatenate": lambda: nn.concatenate([f32((2,)), f32((3,), "B")]),
    "split": lambda: nn.split(f32((4,)), 2)[1],
    "pad": lambda: nn.pad(f32((3,)), 1, "reflect"),
    "take": lambda: nn.take(f32((3, 2)), ph((2,), "I", "int32"), 0),
    "embedding": lambda: nn.embedding(ph((2,), "I", "int64"), f32((3, 2), "W")),
    "upsample_nearest": lambda: nn.upsample_nearest(f32((1, 1, 2, 2))),
    "pixel_shuffle": lambda: nn.pixel_shuffle(f32((1, 4, 2, 2)), 2),
    "cumsum": lambda: nn.cumsum(f32((2, 3))),
    "cumprod": lambda: nn.cumprod(f32((2, 3))),
    "rnn_cell": lambda: nn.rnn_cell(f32((2, 3)), f32((2, 4), "H"), f32((4, 3), "Wi"),
                                    f32((4, 4), "Wh"), f32((4,), "bi"), f32((4,), "bh")),
    "lstm_cell": lambda: nn.lstm_cell(f32((2, 3)), (f32((2, 4), "H"), f32((2, 4), "C")),
                                      f32((16, 3), "Wi"), f32((16, 4), "Wh"), f32((16,), "bi"),
                                      f32((16,), "bh"))[0],
    "rnn": lambda: nn.rnn(f32((3, 2, 3)), f32((4, 3), "Wi"), f32((4, 4), "Wh"))[0],
    "lstm": lambda: nn.lstm(f32((3, 2, 3)), f32((16, 3), "Wi"), f32((16, 4), "Wh"),
                            f32((16,), "bi"), f32((16,), "bh"))[1][1],
    "gru": lambda: nn.gru(f32((2, 3, 3)), f32((12, 3), "Wi"), f32((12, 4), "Wh"),
                          hx=f32((2, 4), "H"), batch_first=True)[1],
    "gru_cell": lambda: nn.gru_cell(f32((2, 3)), f32((2, 4), "H"), f32((12, 3), "Wi"),
                                    f32((12, 4), "Wh"), f32((12,), "bi"), f32((12,), "bh")),
    "sum": lambda: nn.sum(f32((2, 3)), 1),
    "mean": lambda: nn.mean(f32((2, 3)), 1, keepdims=True),
    "max": lambda: nn.max(f32((2, 3))),
    "min": lambda: nn.min(f32((2, 3)), 0),
}


def test_float32_table_covers_every_operator():
    assert sorted(FLOAT32_CALLS) == sorted(ISSUE_OPERATORS)


@pytest.mark.parametrize("name", sorted(FLOAT32_CALLS))
def test_float32_in_float32_out(name):
    """float32 inputs give float32 results (Python-float parameters are weak), and the
    graph evaluates with float32 arrays."""
    out = FLOAT32_CALLS[name]()
    assert out.dtype == "float32", (name, out.dtype)
    feed = {}
    for op in te.topo_order(out):
        if isinstance(op, te.PlaceholderOp):
            t = op.output(0)
            if t.dtype == "float32":
                feed[t] = np.random.default_rng(0).uniform(0.5, 1.5, t.shape).astype("float32")
            elif t.dtype == "bool":
                feed[t] = np.ones(t.shape, bool)
            else:
                feed[t] = np.zeros(t.shape, t.dtype)
    v = te.evaluate(out, feed)
    assert v.dtype == np.float32 and np.isfinite(v).all()


def test_stage_names_are_readable():
    x, w = ph((1, 2, 6, 6), "X"), ph((3, 2, 3, 3), "W")
    y = nn.relu(nn.conv2d(x, w, padding=1))
    assert [op.name for op in te.topo_order(y)] == ["X", "W", "conv2d", "relu"]
    y = nn.conv2d(x, w, ph((3,), "b"), name="conv1")
    assert {op.name for op in te.topo_order(y)} == {"X", "W", "b", "conv1", "conv1_bias"}
    assert y.op.input_tensors()[0].op.tag == "conv2d"
    sm = nn.softmax(ph((2, 3), "Z"))
    assert {op.name for op in te.topo_order(sm)} >= {"softmax_max", "softmax_sum", "softmax"}


def test_small_cnn():
    """conv -> relu -> maxpool -> conv -> batch_norm -> flatten -> dense -> cross-entropy."""
    x, w1, b1 = ph((2, 1, 6, 6), "X"), ph((2, 1, 3, 3), "W1"), ph((2,), "b1")
    w2, w3 = ph((3, 2, 2, 2), "W2"), ph((4, 12), "W3")
    labels = ph((2,), "labels", "int64")
    h = nn.relu(nn.conv2d(x, w1, b1, padding=1))
    h = nn.max_pool2d(h, 2)
    h = nn.batch_norm(nn.conv2d(h, w2))
    loss = nn.cross_entropy(nn.dense(nn.flatten(h), w3), labels)
    feed = feed_of(x, w1, b1, w2, w3)
    feed[labels] = np.array([1, 3])
    t = {k: tt(v) for k, v in feed.items()}
    r = F.max_pool2d(F.relu(F.conv2d(t[x], t[w1], t[b1], padding=1)), 2)
    r = F.batch_norm(F.conv2d(r, t[w2]), None, None, training=True)
    ref = F.cross_entropy(F.linear(r.flatten(1), t[w3]), t[labels])
    check_forward(loss, feed, ref.numpy())
    check_grads(loss, [w1, b1, w2, w3], feed)


def test_transformer_block():
    """Pre-norm single-head attention with a causal mask and a GELU MLP, vs torch."""
    s, d = 4, 6
    x = ph((1, s, d), "X")
    g, b = ph((d,), "g"), ph((d,), "b")
    wq, wk, wv, wo = (ph((d, d), n) for n in ("Wq", "Wk", "Wv", "Wo"))
    w1, w2 = ph((8, d), "W1"), ph((d, 8), "W2")
    h = nn.reshape(nn.layer_norm(x, d, g, b), (s, d))
    q, k, v = (nn.expand_dims(nn.dense(h, w), 0) for w in (wq, wk, wv))
    scores = nn.batch_matmul(q, k, transpose_b=True)
    mask = ph((1, s, s), "mask", "bool")
    masked = te.compute(scores.shape, lambda a, p, r: te.if_then_else(
        mask[a, p, r], scores[a, p, r] * (1.0 / np.sqrt(d)), -1e9), name="masked")
    att = nn.batch_matmul(nn.softmax(masked), v)
    y = nn.dense(nn.reshape(att, (s, d)), wo)
    y = nn.dense(nn.gelu(nn.dense(y, w1)), w2)
    feed = feed_of(x, g, b, wq, wk, wv, wo, w1, w2)
    feed[mask] = np.tril(np.ones((s, s), bool))[None]
    t = {kk: tt(vv) for kk, vv in feed.items()}
    hh = F.layer_norm(t[x], (d,), t[g], t[b]).reshape(s, d)
    qq, kk_, vv = (F.linear(hh, t[w]) for w in (wq, wk, wv))
    sc = (qq @ kk_.T) / np.sqrt(d)
    sc = sc.masked_fill(~t[mask][0], -1e9)
    yy = F.linear(sc.softmax(-1) @ vv, t[wo])
    ref = F.linear(F.gelu(F.linear(yy, t[w1])), t[w2])
    check_forward(y, feed, ref.numpy(), rtol=1e-9, atol=1e-9)
    check_grads(y, [x, g, wq, wk, w1], feed)


@pytest.mark.parametrize("name", sorted(FLOAT32_CALLS))
def test_codegen_builds_every_operator(name):
    """Every operator compiles with codegen.build like user code and matches the evaluator."""
    from texpr import codegen
    out = FLOAT32_CALLS[name]()
    inputs = [op.output(0) for op in te.topo_order(out) if isinstance(op, te.PlaceholderOp)]
    rng = np.random.default_rng(1)
    feed = {}
    for t in inputs:
        if t.dtype == "float32":
            feed[t] = rng.uniform(0.5, 1.5, t.shape).astype("float32")
        elif t.dtype == "bool":
            feed[t] = rng.integers(0, 2, t.shape).astype(bool)
        else:
            feed[t] = rng.integers(0, 2, t.shape).astype(t.dtype)
    (got,) = codegen.build([out], inputs)(*[feed[t] for t in inputs])
    np.testing.assert_allclose(got, te.evaluate(out, feed), rtol=2e-6, atol=1e-6)


JUNK = [None, "abc", 1.5, -1, 0, 100, (1,), (1, 2, 3), [[1]], np.zeros(3), True, (-1, 2), 2,
        (2, 2), ((1, 1),)]


@pytest.mark.parametrize("name", ISSUE_OPERATORS)
def test_bad_arguments_raise_texpr_errors(name):
    """Each parameter in turn replaced by junk (others at their defaults, tensors for the
    required ones): the call succeeds or raises a TexprError, never a raw Python error."""
    import inspect

    f = getattr(nn, name)
    bases = [ph((1, 2, 5, 5), "X4"), ph((3, 4), "X2")]
    if name == "einsum":
        for j in JUNK:
            for args in [(j, bases[1]), ("ij,jk->ik", bases[1], j)]:
                try:
                    f(*args)
                except te.TexprError:
                    pass
        return
    params = [p for p in inspect.signature(f).parameters.values() if p.name != "name"]
    for p, j, base in ((p, j, b) for p in params for j in JUNK for b in bases):
        args = [j if q is p else (base if q.default is inspect.Parameter.empty else q.default)
                for q in params]
        try:
            f(*args)
        except te.TexprError:
            pass
