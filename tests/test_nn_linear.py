"""te.nn linear maps: dense, matmul, batch_matmul, bias_add, einsum."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, feed_of, ph, tt

nn = te.nn


@pytest.mark.parametrize("bias", [False, True])
def test_dense_forward_and_grad(bias):
    x, w, b = ph((3, 5), "X"), ph((4, 5), "W"), ph((4,), "b")
    y = nn.dense(x, w, b if bias else None)
    feed = feed_of(x, w, b)
    ref = feed[x] @ feed[w].T + (feed[b] if bias else 0)
    check_forward(y, feed, ref)
    check_forward(y, feed, F.linear(tt(feed[x]), tt(feed[w]), tt(feed[b]) if bias else None))
    assert y.op.name == ("dense_bias" if bias else "dense")
    check_grads(y, [x, w, b] if bias else [x, w], feed)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul(ta, tb):
    a = ph((4, 3) if ta else (3, 4), "A")
    b = ph((5, 4) if tb else (4, 5), "B")
    y = nn.matmul(a, b, transpose_a=ta, transpose_b=tb)
    feed = feed_of(a, b)
    av = feed[a].T if ta else feed[a]
    bv = feed[b].T if tb else feed[b]
    check_forward(y, feed, av @ bv)
    check_grads(y, [a, b], feed)


@pytest.mark.parametrize("pa,pb,tb", [(2, 2, False), (2, 2, True), (1, 3, False), (3, 1, True)])
def test_batch_matmul(pa, pb, tb):
    a = ph((pa, 3, 4), "A")
    b = ph((pb, 2, 4) if tb else (pb, 4, 2), "B")
    y = nn.batch_matmul(a, b, transpose_b=tb)
    feed = feed_of(a, b)
    bv = np.swapaxes(feed[b], 1, 2) if tb else feed[b]
    check_forward(y, feed, np.matmul(feed[a], bv))
    if pa == pb:
        import torch

        check_forward(y, feed, torch.bmm(tt(feed[a]), tt(np.ascontiguousarray(bv))))
    check_grads(y, [a, b], feed)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_bias_add(axis):
    x = ph((2, 3, 4), "X")
    n = x.shape[axis]
    b = ph((n,), "b")
    y = nn.bias_add(x, b, axis=axis)
    feed = feed_of(x, b)
    shape = [1, 1, 1]
    shape[axis] = n
    check_forward(y, feed, feed[x] + feed[b].reshape(shape))
    check_grads(y, [x, b], feed)


@pytest.mark.parametrize("spec,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)]),
    ("ii->i", [(3, 3)]),
    ("ij->", [(2, 3)]),
    ("ij->ji", [(2, 3)]),
    ("i,j->ij", [(2,), (3,)]),
    ("ij,ij,j->i", [(2, 3), (2, 3), (3,)]),
])
def test_einsum(spec, shapes):
    ops = [ph(s, f"T{k}") for k, s in enumerate(shapes)]
    y = nn.einsum(spec, *ops)
    feed = feed_of(*ops)
    check_forward(y, feed, np.einsum(spec, *[feed[t] for t in ops]))
    check_grads(y, ops, feed)


def test_errors():
    x, w = ph((3, 5), "X"), ph((4, 6), "W")
    with pytest.raises(te.ShapeError, match="5 features.*expects 6"):
        nn.dense(x, w)
    with pytest.raises(te.ShapeError, match="2 dimensions"):
        nn.dense(ph((3,), "v"), w)
    with pytest.raises(te.TexprError, match="Tensor"):
        nn.dense(np.zeros((3, 5)), w)
    with pytest.raises(te.ShapeError, match="inner extents"):
        nn.matmul(x, w)
    with pytest.raises(te.ShapeError, match="batch extents"):
        nn.batch_matmul(ph((2, 3, 4), "A"), ph((3, 4, 2), "B"))
    with pytest.raises(te.ShapeError, match="bias b has 3 entries.*extent 5"):
        nn.bias_add(x, ph((3,), "b"), axis=1)
    with pytest.raises(te.ShapeError, match="axis 2 is out of range"):
        nn.bias_add(x, ph((3,), "b"), axis=2)
    with pytest.raises(te.ShapeError, match="letter 'j' has extent 5 and 4"):
        nn.einsum("ij,jk->ik", x, ph((4, 2), "B"))
    with pytest.raises(te.TexprError, match="ellipsis"):
        nn.einsum("...i->i", x)
    with pytest.raises(te.TexprError, match="2 operand"):
        nn.einsum("ij,jk->ik", x)
    with pytest.raises(te.TexprError, match="output letter 'z'"):
        nn.einsum("ij->z", x)
