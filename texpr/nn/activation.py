"""Elementwise activations: ``relu``, ``leaky_relu``, ``elu``, ``gelu``, ``sigmoid``, ``tanh``.

Each is one elementwise stage of the input's shape and dtype (Python float
parameters are weak constants, so a float64 input stays float64).
"""

import math

from .. import intrinsics as intr
from ..expr import select
from ..tensor import compute
from ._util import check_choice, check_float, check_tensor

__all__ = ["relu", "leaky_relu", "elu", "gelu", "sigmoid", "tanh"]


def _elementwise(x, op, name, f):
    check_tensor(x, op, "input", float_only=True)
    return compute(x.shape, lambda *i: f(x[i]), name=name, tag=op)


def relu(x, name="relu"):
    """``max(x, 0)``, as ``torch.nn.functional.relu``; written ``select(x > 0, x, 0)`` so
    the derivative at 0 is 0 (as torch). NaN maps to 0 (``NaN > 0`` is false), where
    torch returns NaN.

    Args: x: any float tensor. Returns: same shape. Raises: DTypeError for int input.
    """
    return _elementwise(x, "relu", name, lambda v: select(v > 0, v, 0))


def leaky_relu(x, negative_slope=0.01, name="leaky_relu"):
    """``x if x > 0 else negative_slope * x``, as ``torch.nn.functional.leaky_relu``.

    Args: x: any float tensor; negative_slope: a number. Returns: same shape.
    Raises: DTypeError for int input, TexprError for a non-number slope.
    """
    a = check_float(negative_slope, "leaky_relu", "negative_slope")
    return _elementwise(x, "leaky_relu", name, lambda v: select(v > 0, v, v * a))


def elu(x, alpha=1.0, name="elu"):
    """``x if x > 0 else alpha * (exp(x) - 1)``, as ``torch.nn.functional.elu``.

    Args: x: any float tensor; alpha: a number. Returns: same shape.
    Raises: DTypeError for int input, TexprError for a non-number alpha.
    """
    a = check_float(alpha, "elu", "alpha")
    return _elementwise(x, "elu", name, lambda v: select(v > 0, v, (intr.exp(v) - 1.0) * a))


def gelu(x, approximate="none", name="gelu"):
    """Gaussian error linear unit, as ``torch.nn.functional.gelu``.

    ``approximate="none"``: ``0.5 x (1 + erf(x / sqrt 2))``;
    ``approximate="tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    Args: x: any float tensor; approximate: ``"none"`` or ``"tanh"``. Returns: same shape.
    Raises: TexprError for another ``approximate``, DTypeError for int input.
    """
    approximate = check_choice(approximate, ("none", "tanh"), "gelu", "approximate")
    if approximate == "none":
        c = 1.0 / math.sqrt(2.0)
        return _elementwise(x, "gelu", name,
                            lambda v: v * 0.5 * (intr.erf(v * c) + 1.0))
    c = math.sqrt(2.0 / math.pi)
    return _elementwise(
        x, "gelu", name,
        lambda v: v * 0.5 * (intr.tanh((v + v * v * v * 0.044715) * c) + 1.0))


def sigmoid(x, name="sigmoid"):
    """``1 / (1 + exp(-x))``, as ``torch.sigmoid`` (the ``sigmoid`` intrinsic).

    Args: x: any float tensor. Returns: same shape. Raises: DTypeError for int input.
    """
    return _elementwise(x, "sigmoid", name, intr.sigmoid)


def tanh(x, name="tanh"):
    """Hyperbolic tangent, as ``torch.tanh`` (the ``tanh`` intrinsic).

    Args: x: any float tensor. Returns: same shape. Raises: DTypeError for int input.
    """
    return _elementwise(x, "tanh", name, intr.tanh)

