"""Intrinsic math functions on expressions (``te.exp(x)``, ``te.power(a, b)``, ...).

Each takes scalar expressions (or Python numbers) and returns an expression
of the same shape-less kind; float arguments keep their dtype, integer
arguments compute in ``float32`` (``abs`` keeps integers). ``floor``, ``ceil``,
``round`` (half to even, as numpy) and ``trunc`` keep a float dtype: cast the
result to use it as an index. Semantics are numpy's; each raises
``TexprError`` for a boolean argument.
"""

from . import dtypes as dt
from .expr import Const, as_expr, call


def _unary(name, doc):
    def fn(x):
        return call(name, x)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{doc} (elementwise; float result, see the module docstring)."
    return fn


exp = _unary("exp", "``e ** x``")
log = _unary("log", "Natural logarithm")
sqrt = _unary("sqrt", "Square root (its derivative at 0 is taken as 0)")
rsqrt = _unary("rsqrt", "``1 / sqrt(x)``")
tanh = _unary("tanh", "Hyperbolic tangent")
sigmoid = _unary("sigmoid", "Logistic function ``1 / (1 + exp(-x))``")
abs = _unary("abs", "Absolute value; integers stay integers")  # noqa: A001
floor = _unary("floor", "Largest integer value <= x, as a float")
ceil = _unary("ceil", "Smallest integer value >= x, as a float")
round = _unary("round", "Nearest integer value, half to even (numpy), as a float")  # noqa: A001
trunc = _unary("trunc", "Integer part toward zero, as a float")
sin = _unary("sin", "Sine (radians)")
cos = _unary("cos", "Cosine (radians)")
erf = _unary("erf", "Gauss error function")


def stop_gradient(x):
    """``x`` itself, whose derivative is taken as 0 (``jax.lax.stop_gradient``,
    ``torch.Tensor.detach``): differentiation treats the value as a constant, so
    nothing flows to the tensors ``x`` reads. Keeps ``x``'s dtype, integers
    included. Use it where a term's gradient is zero in exact arithmetic but not
    to the symbolic rules, such as the maximum a softmax subtracts for
    stability (``te.nn``'s softmax family does): the gradient then has no
    cancelling terms to compute. An integer expression or a constant has no
    derivative: it comes back as it is (index analysis sees through nothing).

    Raises:
        DTypeError: a boolean argument."""
    e = as_expr(x)
    if (isinstance(e, Const) or dt.is_int(e.dtype)) and not dt.is_bool(e.dtype):
        return e
    return call("stop_gradient", e)


def power(x, y):
    """``x ** y`` (numpy's ``power`` in floating point; ``d/dy`` is 0 where ``x == 0``)."""
    return call("power", x, y)
