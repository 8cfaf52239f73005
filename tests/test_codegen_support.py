"""Support stages (:func:`simplify.is_support_stage`) through codegen.

The simplifier writes a gradient stage that is zero outside a quasi-affine
region of its own axes (max pooling with a stride above its window, a strided
1x1 convolution with one channel per group) as a scatter-add with identity
indices over that region. codegen lowers it as an elementwise stage over the
region: ``out[p] = value`` (a store, not ``+=``), no index checks, and the
outermost loop in parallel when the stage is large enough (or when the
schedule asks for it).
"""

import re

import numpy as np
import pytest

from texpr import codegen
from texpr import simplify
import texpr as te

nn = te.nn
RTOL = ATOL = 1e-12


def _graph(shape):
    X = te.placeholder(shape, "X", "float64")
    W = te.placeholder((shape[1], 1, 1, 1), "W", "float64")
    Yp = nn.max_pool2d(X, 2, 3)
    Yc = nn.conv2d(X, W, stride=2, groups=shape[1])
    Hp = te.placeholder(Yp.shape, "Hp", "float64")
    Hc = te.placeholder(Yc.shape, "Hc", "float64")
    dXp, = te.differentiate(Yp, [X], head=Hp).result
    dXc, = te.differentiate(Yc, [X], head=Hc).result
    return [Yp, dXp, Yc, dXc], [X, W, Hp, Hc]


def _stage_source(source, name):
    body = source[source.index(f"# ---- stage {name}:"):]
    nxt = body.find("# ---- stage", 10)
    body = body if nxt < 0 else body[:nxt]
    return body.split("\n", 1)[1]  # the code, without the stage's definition


def _check(kernel, tensors, inputs, seed=0):
    rng = np.random.default_rng(seed)
    feed = {t: rng.uniform(-1, 1, t.shape) for t in inputs}
    got = kernel(*[feed[t] for t in inputs])
    want = te.evaluate(tensors, feed)
    for t, g, w in zip(tensors, got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=t.name)


@pytest.fixture(scope="module")
def large():
    # both supports have at least parallel_min_points points: 4*8*64*64 and 4*8*48*48
    tensors, inputs = _graph((4, 8, 96, 96))
    assert 4 * 8 * 48 * 48 >= codegen.Options().parallel_min_points
    return codegen.build(tensors, inputs), tensors, inputs


def test_gradients_are_support_stages():
    tensors, _ = _graph((1, 2, 7, 7))
    assert simplify.is_support_stage(tensors[1].op)
    assert simplify.is_support_stage(tensors[3].op)


def test_support_stages_match_the_evaluator(large):
    kernel, tensors, inputs = large
    _check(kernel, tensors, inputs)


def test_support_stages_store_in_parallel(large):
    kernel, tensors, _ = large
    for t in (tensors[1], tensors[3]):
        src = _stage_source(kernel.source, t.op.name)
        assert "+=" not in src, src
        assert re.search(r"\] = ", src), src
        assert "_ck(" not in src, src
        assert re.search(r"for c\d+_0 in prange\(", src), src
        # a support of residue classes is strided loops, no modulo test
        assert not re.search(r"^\s*if .*%", src, re.M), src


def test_small_support_stage_runs_sequentially_unless_asked():
    tensors, inputs = _graph((1, 2, 7, 7))
    s = codegen.create_schedule(tensors)
    dXc = tensors[3]
    s[dXc].parallel(dXc.op.axis[1])  # a support stage may run in parallel
    kernel = codegen.build(tensors, inputs, s)
    assert "prange" not in _stage_source(kernel.source, tensors[1].op.name)
    assert re.search(r"for c\d+_1 in prange\(", _stage_source(kernel.source, dXc.op.name))
    _check(kernel, tensors, inputs, seed=1)


def test_general_scatter_add_cannot_run_in_parallel():
    E_ = te.placeholder((7, 5), "Emb", "float64")
    idx = te.placeholder((6,), "idx", "int64")
    y = nn.embedding(idx, E_)
    H = te.placeholder(y.shape, "H", "float64")
    dE, = te.differentiate(y, [E_], head=H).result
    assert isinstance(dE.op, te.ScatterAddOp) and not simplify.is_support_stage(dE.op)
    s = codegen.create_schedule([dE])
    with pytest.raises(te.ScheduleError):
        s[dE].parallel(dE.op.axis[0])
