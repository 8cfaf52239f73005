"""te.nn activations: relu, leaky_relu, elu, gelu, sigmoid, tanh."""

import math

import numpy as np
import pytest

import texpr as te
from nn_testutil import F, check_forward, check_grads, ph, rand, tt

nn = te.nn

ERF = np.vectorize(math.erf)

CASES = [
    ("relu", {}, lambda x: np.maximum(x, 0), lambda t: F.relu(t)),
    ("leaky_relu", {}, lambda x: np.where(x > 0, x, 0.01 * x), lambda t: F.leaky_relu(t)),
    ("leaky_relu", {"negative_slope": 0.2}, lambda x: np.where(x > 0, x, 0.2 * x),
     lambda t: F.leaky_relu(t, 0.2)),
    ("elu", {}, lambda x: np.where(x > 0, x, np.expm1(x)), lambda t: F.elu(t)),
    ("elu", {"alpha": 0.5}, lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)),
     lambda t: F.elu(t, 0.5)),
    ("gelu", {}, lambda x: 0.5 * x * (1 + ERF(x / np.sqrt(2))), lambda t: F.gelu(t)),
    ("gelu", {"approximate": "tanh"},
     lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
     lambda t: F.gelu(t, approximate="tanh")),
    ("sigmoid", {}, lambda x: 1 / (1 + np.exp(-x)), lambda t: t.sigmoid()),
    ("tanh", {}, np.tanh, lambda t: t.tanh()),
]


@pytest.mark.parametrize("op,kw,ref,tref", CASES)
def test_activation(op, kw, ref, tref):
    x = ph((3, 4), "X")
    feed = {x: rand(x, 1, -3, 3)}
    y = getattr(nn, op)(x, **kw)
    assert y.op.name == op and y.shape == x.shape and y.dtype == "float64"
    check_forward(y, feed, ref(feed[x]), rtol=1e-12, atol=1e-12)
    check_forward(y, feed, tref(tt(feed[x])).numpy(), rtol=1e-12, atol=1e-12)
    check_grads(y, [x], feed)


@pytest.mark.parametrize("op", ["relu", "sigmoid", "gelu"])
def test_float32_stays_float32(op):
    x = ph((5,), "X", "float32")
    y = getattr(nn, op)(x)
    assert y.dtype == "float32"
    v = te.evaluate(y, {x: np.linspace(-2, 2, 5).astype("float32")})
    assert v.dtype == np.float32


def test_relu_derivative_at_zero_is_zero():
    x = ph((3,), "X")
    (g,) = te.differentiate(te.nn.sum(nn.relu(x)), [x], simplify=False)
    np.testing.assert_array_equal(te.evaluate(g, {x: np.array([-1.0, 0.0, 1.0])}), [0, 0, 1])


def test_errors():
    with pytest.raises(te.DTypeError, match="float tensor"):
        nn.relu(ph((3,), "I", "int64"))
    with pytest.raises(te.TexprError, match="approximate"):
        nn.gelu(ph((3,), "X"), approximate="fast")
    with pytest.raises(te.TexprError, match="negative_slope must be a number"):
        nn.leaky_relu(ph((3,), "X"), negative_slope="0.1")
