"""Commutative reducers: ``sum``, ``prod``, ``max``, ``min`` and ``comm_reducer``.

A reducer is called as ``reducer(expr, axis=k, where=cond)`` inside a compute
lambda and builds a :class:`~texpr.expr.Reduce` node. ``max`` and ``min``
without ``axis`` and with two arguments are the elementwise maximum/minimum.
"""

import numpy as np

from . import dtypes as dt
from .errors import AxisError, DTypeError, TexprError
from .expr import (BUILTIN_COMBINERS, Combiner, Expr, IterVar, as_expr, const, make_reduce,
                   maximum, minimum, var)
from .tensor import check_name
from .visitor import MAX_DEPTH, depth


def _identity_value(kind, dtype):
    if kind == "sum":
        return 0
    if kind == "prod":
        return 1
    if dt.is_float(dtype):
        return -np.inf if kind == "max" else np.inf
    info = np.iinfo(np.dtype(dtype))
    return int(info.min) if kind == "max" else int(info.max)


class CommReducer:
    """A commutative, associative reducer (TVM's ``comm_reducer``).

    ``fcombine(x, y)`` combines the accumulator ``x`` with a new element ``y``
    (tuples of expressions for tuple reducers); ``fidentity(*dtypes)`` gives the
    identity element(s). Calling the reducer builds the reduction:
    ``reducer(source, axis, where=None)`` with ``source`` an expression or a tuple
    of expressions (then a tuple of Reduce nodes is returned, one per component,
    to be returned together from a compute lambda).

    The points of a reduction are combined in row-major order of its reduction
    axes, in ``te.evaluate`` and in every kernel, so a ``fcombine`` that keeps
    the accumulator at a tie keeps the first tied point. ``order_free=True``
    declares that the result does not depend on that order (e.g. ties broken
    by an index component), which leaves the kernels free to reorder the loops.
    """

    def __init__(self, fcombine, fidentity, name="reduce", kind="custom", order_free=False):
        self.fcombine, self.fidentity = fcombine, fidentity
        self.name, self.kind = name, kind
        self.order_free = bool(order_free)
        self._instances = {}

    def combiner(self, dtypes):
        """The :class:`Combiner` of this reducer at the given tuple of dtypes."""
        dtypes = tuple(dtypes)
        c = self._instances.get(dtypes)
        if c is None:
            lhs = tuple(var(f"x{i}", d) for i, d in enumerate(dtypes))
            rhs = tuple(var(f"y{i}", d) for i, d in enumerate(dtypes))
            if len(dtypes) == 1:
                res = self.fcombine(lhs[0], rhs[0])
                ident = self.fidentity(dtypes[0])
            else:
                res = self.fcombine(lhs, rhs)
                ident = self.fidentity(*dtypes)
            res = tuple(res) if isinstance(res, (tuple, list)) else (res,)
            ident = tuple(ident) if isinstance(ident, (tuple, list)) else (ident,)
            if len(res) != len(dtypes) or len(ident) != len(dtypes):
                raise TexprError(
                    f"reducer {self.name}: combine/identity give {len(res)}/{len(ident)} "
                    f"values for {len(dtypes)} component(s)")
            res = tuple(as_expr(r, like=d) for r, d in zip(res, dtypes))
            ident = tuple(const(v.value if isinstance(v, Expr) else v, d)
                          for v, d in zip(ident, dtypes))
            for r, d in zip(res, dtypes):
                if r.dtype != d:
                    raise DTypeError(
                        f"reducer {self.name}: combine gives dtype {r.dtype} for a {d} component")
            d = depth(list(res))
            if d > MAX_DEPTH:  # as a compute body's (te.evaluate recursed past Python's limit)
                raise TexprError(
                    f"reducer {self.name}: the combine is {d} levels deep, more than the limit "
                    f"texpr.visitor.MAX_DEPTH = {MAX_DEPTH}; write a shallower combine")
            c = Combiner(self.name, self.kind, lhs, rhs, res, ident, self.order_free)
            self._instances[dtypes] = c
        return c

    def __call__(self, source, axis, where=None):
        multi = isinstance(source, (tuple, list))
        sources = tuple(as_expr(s) for s in (source if multi else (source,)))
        axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        for a in axes:
            if not isinstance(a, IterVar) or a.kind != "reduce":
                raise AxisError(
                    f"{self.name}: axis= takes reduction axes made by te.reduce_axis, got {a!r}")
        if not axes:
            raise AxisError(f"{self.name}: axis= is empty")
        if len({id(a) for a in axes}) != len(axes):
            raise AxisError(f"{self.name}: axis= lists a reduction axis twice: "
                            f"{[a.name for a in axes]}")
        if self.kind != "custom":
            for s in sources:
                if dt.is_bool(s.dtype):
                    raise DTypeError(f"{self.name} of the boolean expression `{s!r}`; cast it first")
        comb = self.combiner(tuple(s.dtype for s in sources))
        nodes = tuple(make_reduce(comb, sources, axes, where, i) for i in range(len(sources)))
        return nodes if multi else nodes[0]


def _builtin(kind, combine):
    return CommReducer(combine, lambda d: const(_identity_value(kind, d), d), kind, kind)


_SUM = _builtin("sum", lambda x, y: x + y)
_PROD = _builtin("prod", lambda x, y: x * y)
_MAX = _builtin("max", maximum)
_MIN = _builtin("min", minimum)
#: kind -> the built-in reducer (unpickled combiners are taken from here)
BUILTIN_REDUCERS = {"sum": _SUM, "prod": _PROD, "max": _MAX, "min": _MIN}
# a pickled built-in combiner loads as the local one (texpr.expr.Combiner.__reduce__)
BUILTIN_COMBINERS.update((kind, r.combiner) for kind, r in BUILTIN_REDUCERS.items())


def comm_reducer(fcombine, fidentity, name="reduce"):
    """Make a user-defined commutative reducer (see :class:`CommReducer`).

    Example (argmax as a tuple reducer; ties keep the accumulator, here the
    first point):

    >>> import numpy as np
    >>> import texpr as te
    >>> argmax = te.comm_reducer(
    ...     lambda x, y: (te.select(x[0] >= y[0], x[0], y[0]),
    ...                   te.select(x[0] >= y[0], x[1], y[1])),
    ...     lambda vd, id_: (te.const(-np.inf, vd), te.const(-1, id_)))
    >>> X = te.placeholder((2, 3), name="X")
    >>> k = te.reduce_axis(3, "k")
    >>> V, I = te.compute((2,), lambda i: argmax((X[i, k], k), axis=k), name="A")
    >>> te.evaluate([V, I], {X: np.array([[1, 5, 2], [7, 0, 7]], dtype="float32")})
    [array([5., 7.], dtype=float32), array([1, 0])]

    One component alone, or the components in another order, are fine: the
    stage computes them all and returns the ones asked for (its other outputs
    stay reachable as ``t.op.output(i)``):

    >>> J = te.compute((2,), lambda i: argmax((X[i, k], k), axis=k)[1], name="J")
    >>> te.evaluate(J, {X: np.array([[1, 5, 2], [7, 0, 7]], dtype="float32")})
    array([1, 0])
    """
    return CommReducer(fcombine, fidentity, check_name(name, "comm_reducer"))


def sum(expr, axis, where=None):  # noqa: A001 - the field's name
    """Sum of ``expr`` over the reduction axes ``axis`` where ``where`` holds (0 if empty)."""
    return _SUM(expr, axis, where)


def prod(expr, axis, where=None):
    """Product of ``expr`` over ``axis`` where ``where`` holds (1 if empty)."""
    return _PROD(expr, axis, where)


def _elementwise_or_reduce(name, reducer, elementwise, a, b, axis, where):
    if axis is None:
        if b is None:
            raise TexprError(f"te.{name} needs axis= (a reduction) or two expressions")
        return elementwise(a, b)
    if b is not None:
        raise TexprError(f"te.{name}: give either two expressions or one and axis=")
    return reducer(a, axis, where)


def max(a, b=None, axis=None, where=None):  # noqa: A001
    """With ``axis``: the maximum of ``a`` over it (``-inf``/int min if empty).
    Without: the elementwise maximum of the two expressions ``a`` and ``b``."""
    return _elementwise_or_reduce("max", _MAX, maximum, a, b, axis, where)


def min(a, b=None, axis=None, where=None):  # noqa: A001
    """With ``axis``: the minimum of ``a`` over it (``+inf``/int max if empty).
    Without: the elementwise minimum of the two expressions ``a`` and ``b``."""
    return _elementwise_or_reduce("min", _MIN, minimum, a, b, axis, where)
