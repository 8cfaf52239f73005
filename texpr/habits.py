"""Where Python and numpy habits meet texpr expressions: what works, and the hints.

An expression (or a tensor) has no value while the graph is built, so the
Python protocols that need one cannot work. Each raises
:class:`texpr.ConcretizationError` (a ``TexprError`` and a ``TypeError``) whose
message prints the expression and names the texpr spelling, never an internal
class name:

==============================  ==================================================
Python / numpy                  texpr
==============================  ==================================================
``math.exp(e)``, ``float(e)``   ``te.exp(e)``, ... ; ``te.cast(e, "float32")``
``int(e)``                      ``te.cast(e, "int64")``
``range(e)``, ``lst[e]``        ``te.reduce_axis`` (+ ``where=``); ``te.if_then_else``
``if a > b:``, ``max(a, b)``    ``te.if_then_else``, ``te.max(a, b)``, ``te.min``
``np.exp(e)`` (any ufunc)       ``te.exp(e)`` (see :data:`UFUNC_SPELLING`)
``np.where``, ``np.sum``, ...   ``te.if_then_else``, ``te.sum``, ...
==============================  ==================================================

What works: ``abs(e)`` is ``te.abs(e)``; ``round(e)``, ``math.floor(e)``,
``math.ceil(e)`` and ``math.trunc(e)`` are the intrinsics ``te.round``, ...
(float results); arithmetic and comparisons with numpy scalars
(``np.float32(2) * e``) are texpr arithmetic, as with Python numbers.
"""

import sys

import numpy as np

from . import expr as E
from .errors import ConcretizationError
from .expr import Expr
from .printer import expr_str
from .tensor import Tensor

#: numpy ufunc name -> the texpr spelling named in the error
UFUNC_SPELLING = {
    "exp": "te.exp(x)", "exp2": "te.power(2.0, x)", "expm1": "te.exp(x) - 1",
    "log": "te.log(x)", "log2": "te.log(x) / math.log(2)", "log10": "te.log(x) / math.log(10)",
    "log1p": "te.log(1 + x)", "sqrt": "te.sqrt(x)", "tanh": "te.tanh(x)",
    "sin": "te.sin(x)", "cos": "te.cos(x)", "floor": "te.floor(x)", "ceil": "te.ceil(x)",
    "rint": "te.round(x)", "trunc": "te.trunc(x)", "absolute": "abs(x) or te.abs(x)",
    "fabs": "abs(x) or te.abs(x)", "maximum": "te.max(a, b)", "fmax": "te.max(a, b)",
    "minimum": "te.min(a, b)", "fmin": "te.min(a, b)", "power": "a ** b or te.power(a, b)",
    "float_power": "te.power(a, b)", "square": "x * x", "reciprocal": "1.0 / x",
    "sign": "te.if_then_else(x > 0, 1.0, te.if_then_else(x < 0, -1.0, 0.0))",
    "logical_and": "te.all(a, b) or a & b", "logical_or": "te.any(a, b) or a | b",
    "logical_not": "~c", "erf": "te.erf(x)", "expit": "te.sigmoid(x)",
}

#: numpy function name -> the texpr spelling (``__array_function__``)
FUNCTION_SPELLING = {
    "where": "te.if_then_else(cond, a, b)", "select": "te.if_then_else(cond, a, b)",
    "sum": "te.sum(x, axis=k) with k = te.reduce_axis(n)", "max": "te.max(a, b) or te.max(x, axis=k)",
    "amax": "te.max(a, b) or te.max(x, axis=k)", "min": "te.min(a, b) or te.min(x, axis=k)",
    "amin": "te.min(a, b) or te.min(x, axis=k)", "prod": "te.prod(x, axis=k)",
    "clip": "te.min(te.max(x, lo), hi)", "round": "te.round(x)", "around": "te.round(x)",
    "all": "te.all(...)", "any": "te.any(...)",
}


def _binary(name):
    ops = {
        "add": E.add, "subtract": E.sub, "multiply": E.mul, "true_divide": E.div,
        "divide": E.div, "floor_divide": E.floordiv, "remainder": E.floormod,
        "mod": E.floormod, "power": lambda a, b: E.call("power", a, b),
        "less": lambda a, b: E._cmp(E.LT, a, b), "less_equal": lambda a, b: E._cmp(E.LE, a, b),
        "greater": lambda a, b: E._cmp(E.GT, a, b),
        "greater_equal": lambda a, b: E._cmp(E.GE, a, b),
        "equal": lambda a, b: E._cmp(E.EQ, a, b), "not_equal": lambda a, b: E._cmp(E.NE, a, b),
    }
    return ops.get(name)


def _describe(x):
    if isinstance(x, Expr):
        return f"the texpr expression `{expr_str(x)}`"
    if isinstance(x, Tensor):
        return f"the texpr tensor {x.name}"
    return f"`{x!r}`"


_NO_VALUE = "which has no value while the graph is built"


def no_float(x):
    """``float(x)`` / ``math.<fn>(x)`` of an expression or tensor ``x``."""
    return ConcretizationError(
        f"float() or a math function (math.exp, math.log, ...) was applied to {_describe(x)}, "
        f"{_NO_VALUE}; use the texpr spelling: te.exp, te.log, te.sqrt, te.tanh, te.sigmoid, "
        "te.sin, te.cos, te.erf, te.power(a, b), te.floor, ... (and te.cast(x, 'float32') "
        "for float(x))")


def no_int(x):
    """``int(x)`` of an expression or tensor."""
    return ConcretizationError(
        f"int() was applied to {_describe(x)}, {_NO_VALUE}; use te.cast(x, 'int64') "
        "(truncates toward zero), te.floor(x) or x // 1")


def no_complex(x):
    """``complex(x)``: texpr has no complex dtypes."""
    return ConcretizationError(
        f"complex() was applied to {_describe(x)}; texpr has no complex dtypes (write the "
        "real and imaginary parts as two float tensors)")


def no_index(x):
    """``operator.index(x)``: ``range(x)``, ``lst[x]``, slices, shapes."""
    return ConcretizationError(
        f"{_describe(x)} was used as a Python integer (range(), a list or array index, a "
        f"slice, a shape), {_NO_VALUE}. A loop over values is a reduction axis: "
        "k = te.reduce_axis(n) with te.sum(..., axis=k, where=k < x); choosing among "
        "values is te.if_then_else(cond, a, b); a texpr tensor is indexed directly: T[x]")


def no_bool(x):
    """``bool(x)``: ``if``/``and``/``or``/``not`` and Python's ``max``/``min``/``sorted``."""
    return ConcretizationError(
        f"the truth value of {_describe(x)} is not known while the graph is built: Python's "
        "if/and/or/not and the builtins max(), min() and sorted() need one. Use "
        "te.if_then_else(cond, a, b), te.max(a, b) / te.min(a, b), and te.all / te.any / "
        "~cond (or & | ~) for conditions")


def array_ufunc(x, ufunc, method, inputs, kwargs):
    """``x.__array_ufunc__``: numpy arithmetic with scalar operands is texpr
    arithmetic; anything else raises ConcretizationError naming the texpr spelling."""
    name = getattr(ufunc, "__name__", str(ufunc))
    # numpy hands a scalar operand over as a 0-d array at times
    inputs = tuple(a[()] if isinstance(a, np.ndarray) and a.ndim == 0 else a for a in inputs)
    op = _binary(name) if method == "__call__" and not kwargs else None
    scalar = (Expr, int, float, bool, np.generic)
    if op is not None and len(inputs) == 2 and all(isinstance(a, scalar + (Tensor,))
                                                  for a in inputs):
        a, b = (t._scalar() if isinstance(t, Tensor) else t for t in inputs)
        return op(a, b)
    if method == "__call__" and not kwargs and name in ("negative", "positive") \
            and len(inputs) == 1:
        v = inputs[0]._scalar() if isinstance(inputs[0], Tensor) else inputs[0]
        return -v if name == "negative" else v
    if any(isinstance(a, np.ndarray) for a in inputs):
        return ConcretizationError(
            f"numpy's {name} was given a numpy array and {_describe(x)}: data enters a texpr "
            "graph as a te.placeholder (fed to te.evaluate or a kernel), constants as Python "
            "or numpy scalars")
    if method != "__call__":
        return ConcretizationError(
            f"numpy's {name}.{method} was applied to {_describe(x)}, {_NO_VALUE}; reduce "
            "with te.sum / te.prod / te.max / te.min over a te.reduce_axis")
    spelling = UFUNC_SPELLING.get(name)
    hint = (f"use {spelling}" if spelling else
            "write it with texpr arithmetic and intrinsics (te.exp, te.log, te.sqrt, "
            "te.rsqrt, te.tanh, te.sigmoid, te.power, te.floor, te.ceil, te.round, te.trunc, "
            "te.sin, te.cos, te.erf)")
    return ConcretizationError(
        f"numpy's {name} was applied to {_describe(x)}, {_NO_VALUE}; {hint}")


def array_function(x, func):
    """``x.__array_function__``: numpy functions never take texpr expressions."""
    name = getattr(func, "__name__", str(func))
    spelling = FUNCTION_SPELLING.get(name)
    hint = f"use {spelling}" if spelling else "write it with texpr expressions (te.compute)"
    return ConcretizationError(f"numpy.{name} was applied to {_describe(x)}, {_NO_VALUE}; {hint}")


# expressions and tensors raise the errors built here (texpr.expr.NeedsValue)
E.install_habits(sys.modules[__name__])
