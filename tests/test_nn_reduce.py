"""te.nn reductions along axes with keepdims: sum, mean, max, min."""

import numpy as np
import pytest

import texpr as te
from nn_testutil import check_forward, check_grads, ph, rand

nn = te.nn


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (None, True), (1, False), (-1, True),
                                           ((0, 2), False), ((2, 0), True), ((), False)])
def test_reduce(op, axis, keepdims):
    x = ph((2, 3, 4), "X")
    feed = {x: rand(x, 3)}
    y = getattr(nn, op)(x, axis=axis, keepdims=keepdims)
    ref = getattr(np, op)(feed[x], axis=axis, keepdims=keepdims)
    check_forward(y, feed, ref, rtol=1e-12, atol=1e-12)
    check_grads(y, [x], feed)


def test_max_min_int_and_float32():
    x = ph((3, 4), "I", "int64")
    v = np.arange(12).reshape(3, 4) - 5
    check_forward(nn.max(x, 1), {x: v}, v.max(1))
    check_forward(nn.sum(x, 0, keepdims=True), {x: v}, v.sum(0, keepdims=True))
    f = ph((3, 4), "F", "float32")
    assert nn.mean(f).dtype == "float32"


def test_errors():
    x = ph((2, 3), "X")
    with pytest.raises(te.ShapeError, match="axis 3 is out of range"):
        nn.sum(x, 3)
    with pytest.raises(te.ShapeError, match="repeats an axis"):
        nn.mean(x, (0, -2))
    with pytest.raises(te.TexprError, match="axis must be an int"):
        nn.max(x, 0.5)
