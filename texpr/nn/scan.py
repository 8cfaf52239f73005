"""Cumulative operators: ``cumsum`` and ``cumprod``.

One reduction stage each over the full extent of the axis, restricted to the
triangle with ``where=k <= j`` (``k >= j`` for ``reverse``), so the gradient's
nonzero terms are the triangle, not the square.
"""

from .. import reduction as red
from ..errors import ShapeError
from ..tensor import compute, reduce_axis
from ._util import check_bool, check_tensor, norm_axis

__all__ = ["cumsum", "cumprod"]


def _scan(x, axis, exclusive, reverse, kind, op, name):
    check_tensor(x, op, "input")
    if x.ndim == 0:
        raise ShapeError(f"{op}: cannot scan the scalar {x.name}")
    axis = norm_axis(axis, x.ndim, op)
    exclusive = check_bool(exclusive, op, "exclusive")
    reverse = check_bool(reverse, op, "reverse")
    k = reduce_axis(x.shape[axis], "k")
    reducer = red.sum if kind == "sum" else red.prod

    def body(*j):
        idx = list(j)
        idx[axis] = k
        t = j[axis]
        if reverse:
            where = k > t if exclusive else k >= t
        else:
            where = k < t if exclusive else k <= t
        return reducer(x[tuple(idx)], axis=k, where=where)

    return compute(x.shape, body, name=name, tag=op,
                   attrs=dict(axis=axis, exclusive=bool(exclusive), reverse=bool(reverse)))


def cumsum(x, axis=-1, exclusive=False, reverse=False, name="cumsum"):
    """Cumulative sum along ``axis``, as ``numpy.cumsum`` / ``torch.cumsum``:
    ``Y[.., j, ..] = sum_{k <= j} X[.., k, ..]`` (``k < j`` with ``exclusive``; ``k >= j``
    / ``k > j`` with ``reverse``). One stage, a ``where=`` triangle.

    Args:
        x: a tensor with at least one axis. axis: int (default last).
    Returns:
        same shape as ``x``.
    Raises:
        ShapeError: bad axis or scalar input.
    """
    return _scan(x, axis, exclusive, reverse, "sum", "cumsum", name)


def cumprod(x, axis=-1, exclusive=False, reverse=False, name="cumprod"):
    """Cumulative product along ``axis``, as ``numpy.cumprod`` / ``torch.cumprod``:
    ``Y[.., j, ..] = prod_{k <= j} X[.., k, ..]`` (options as :func:`cumsum`). One stage.

    Args/Returns/Raises: as :func:`cumsum`.
    """
    return _scan(x, axis, exclusive, reverse, "prod", "cumprod", name)
