"""Reductions along axes with ``keepdims``: ``sum``, ``mean``, ``max``, ``min``.

As ``numpy.sum(x, axis, keepdims=...)`` and friends. One reduction stage each.
``max``/``min`` of an empty extent give ``-inf``/``+inf`` (the reducer's
identity) rather than an error; their gradient follows ``te.max``'s
subgradient rule (the first extremum of a tie set receives the whole adjoint,
docs/conventions.md).
"""

import builtins

from .. import reduction as red
from ..tensor import compute, reduce_axis
from ._util import check_bool, check_tensor, float_const, norm_axes

__all__ = ["sum", "mean", "max", "min"]


def reduced_shape(shape, axes, keepdims):
    """The shape left after reducing ``axes`` (kept as 1 with ``keepdims``)."""
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def input_index(out_idx, raxes, ndim, axes, keepdims):
    """The input index of an output point: reduction axes where ``axes`` were reduced."""
    it = iter(out_idx)
    rit = iter(raxes)
    idx = []
    for d in range(ndim):
        if d in axes:
            idx.append(next(rit))
            if keepdims:
                next(it)
        else:
            idx.append(next(it))
    return tuple(idx)


def _reduce(x, axis, keepdims, kind, op, name):
    check_tensor(x, op, "input")
    axes = norm_axes(axis, x.ndim, op)
    keepdims = check_bool(keepdims, op, "keepdims")
    shape = reduced_shape(x.shape, axes, keepdims)
    if not axes:
        return compute(x.shape, lambda *i: x[i], name=name, tag=op)
    raxes = [reduce_axis(x.shape[d], f"r{d}") for d in axes]
    count = 1
    for d in axes:
        count *= x.shape[d]

    def body(*i):
        v = x[input_index(i, raxes, x.ndim, axes, keepdims)]
        if kind == "sum":
            return red.sum(v, axis=raxes)
        if kind == "mean":
            return red.sum(v * float_const(1.0 / builtins.max(count, 1), v), axis=raxes)
        if kind == "max":
            return red.max(v, axis=raxes)
        return red.min(v, axis=raxes)

    return compute(shape, body, name=name, tag=op,
                   attrs=dict(axis=axes, keepdims=bool(keepdims)))


def sum(x, axis=None, keepdims=False, name="sum"):  # noqa: A001 - numpy's name
    """Sum over ``axis`` (None: all axes; an int or a tuple), as ``numpy.sum``.

    Args:
        x: any tensor. axis: None, int or tuple of ints (negative from the end).
        keepdims: keep reduced axes with extent 1.
    Returns:
        the reduced tensor (shape ``()`` when every axis is reduced without keepdims).
    Raises:
        ShapeError: an axis out of range or repeated.
    """
    return _reduce(x, axis, keepdims, "sum", "sum", name)


def mean(x, axis=None, keepdims=False, name="mean"):
    """Arithmetic mean over ``axis``, as ``numpy.mean`` (the ``1/count`` factor is
    folded into the summand; an int input gives float32).

    Args/Returns/Raises: as :func:`sum`.
    """
    return _reduce(x, axis, keepdims, "mean", "mean", name)


def max(x, axis=None, keepdims=False, name="max"):  # noqa: A001
    """Maximum over ``axis``, as ``numpy.max`` (``-inf`` for an empty extent).

    Args/Returns/Raises: as :func:`sum`.
    """
    return _reduce(x, axis, keepdims, "max", "max", name)


def min(x, axis=None, keepdims=False, name="min"):  # noqa: A001
    """Minimum over ``axis``, as ``numpy.min`` (``+inf`` for an empty extent).

    Args/Returns/Raises: as :func:`sum`.
    """
    return _reduce(x, axis, keepdims, "min", "min", name)
