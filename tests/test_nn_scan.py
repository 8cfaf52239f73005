"""te.nn scans: cumsum and cumprod (one stage, a where= triangle)."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import check_forward, check_grads, ph, rand, tt

nn = te.nn


def np_scan(x, axis, kind, exclusive, reverse):
    f = np.cumsum if kind == "sum" else np.cumprod
    if reverse:
        x = np.flip(x, axis)
    y = f(x, axis=axis)
    if exclusive:
        ident = 0.0 if kind == "sum" else 1.0
        y = np.concatenate([np.full_like(np.take(y, [0], axis), ident),
                            np.delete(y, -1, axis)], axis)
    return np.flip(y, axis) if reverse else y


@pytest.mark.parametrize("kind", ["sum", "prod"])
@pytest.mark.parametrize("axis,exclusive,reverse", [(-1, False, False), (0, False, False),
                                                    (1, True, False), (1, False, True),
                                                    (0, True, True)])
def test_scan(kind, axis, exclusive, reverse):
    x = ph((3, 5), "X")
    feed = {x: rand(x, 1, 0.5, 1.5)}
    op = nn.cumsum if kind == "sum" else nn.cumprod
    y = op(x, axis, exclusive=exclusive, reverse=reverse)
    check_forward(y, feed, np_scan(feed[x], axis, kind, exclusive, reverse))
    if not exclusive and not reverse:
        t = tt(feed[x])
        check_forward(y, feed, (t.cumsum(axis) if kind == "sum" else t.cumprod(axis)).numpy())
    check_grads(y, [x], feed)


def test_cumsum_is_one_triangular_stage():
    x = ph((4, 6), "X")
    y = nn.cumsum(x)
    assert y.op.input_tensors() == [x]
    text = te.tensor_str(y)
    assert "where" in text or "<=" in text


def test_cumprod_with_zeros():
    x = ph((5,), "X")
    v = np.array([2.0, 0.0, 3.0, -1.0, 0.5])
    check_forward(nn.cumprod(x), {x: v}, np.cumprod(v))
    check_grads(nn.cumprod(x), [x], {x: v})


def test_errors():
    with pytest.raises(te.ShapeError, match="axis 2 is out of range"):
        nn.cumsum(ph((3, 4), "X"), 2)
    with pytest.raises(te.ShapeError, match="scalar"):
        nn.cumprod(ph((), "s"))
