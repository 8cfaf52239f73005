"""Intrinsic math functions on expressions (``te.exp(x)``, ``te.power(a, b)``, ...).

Integer arguments compute in ``float32`` (``abs`` keeps integers). ``floor``,
``ceil``, ``round`` (half to even) and ``trunc`` keep a float dtype; cast the
result to use it as an index.
"""

from .expr import call


def exp(x): return call("exp", x)
def log(x): return call("log", x)
def sqrt(x): return call("sqrt", x)
def rsqrt(x): return call("rsqrt", x)
def tanh(x): return call("tanh", x)
def sigmoid(x): return call("sigmoid", x)
def abs(x): return call("abs", x)  # noqa: A001
def power(x, y): return call("power", x, y)
def floor(x): return call("floor", x)
def ceil(x): return call("ceil", x)
def round(x): return call("round", x)  # noqa: A001
def trunc(x): return call("trunc", x)
def sin(x): return call("sin", x)
def cos(x): return call("cos", x)
def erf(x): return call("erf", x)
