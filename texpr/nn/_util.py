"""Argument checking and small index helpers shared by the operator families.

Every check raises a :class:`~texpr.errors.TexprError` subclass whose message
names the operator, the argument and the offending value, so that a bad call
never surfaces as a raw Python or numpy traceback.
"""

import numpy as np

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, TexprError
from ..expr import Expr, as_expr, logical_and
from ..tensor import Tensor


def check_tensor(x, op, what, ndim=None, float_only=False, int_only=False):
    """Check that ``x`` is a Tensor (of ``ndim`` dimensions when given); return it."""
    if not isinstance(x, Tensor):
        raise TexprError(f"{op}: {what} must be a texpr Tensor, got {type(x).__name__}: {x!r}")
    if ndim is not None:
        ndims = ndim if isinstance(ndim, tuple) else (ndim,)
        if x.ndim not in ndims:
            want = " or ".join(str(n) for n in ndims)
            raise ShapeError(f"{op}: {what} {x.name} must have {want} dimensions, "
                             f"got shape {x.shape}")
    if float_only and not dt.is_float(x.dtype):
        raise DTypeError(f"{op}: {what} {x.name} must be a float tensor, got dtype {x.dtype}")
    if int_only and not dt.is_int(x.dtype):
        raise DTypeError(f"{op}: {what} {x.name} must be an integer tensor, got dtype {x.dtype}")
    return x


def check_int(v, op, what, minimum=None):
    """A Python int (numpy ints accepted) that is at least ``minimum``."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TexprError(f"{op}: {what} must be an int, got {type(v).__name__}: {v!r}")
    v = int(v)
    if minimum is not None and v < minimum:
        raise TexprError(f"{op}: {what} must be >= {minimum}, got {v}")
    return v


def ntuple(v, n, op, what, minimum=None):
    """An int or a sequence of ``n`` ints, returned as a tuple of ``n`` ints."""
    if isinstance(v, (list, tuple)):
        if len(v) != n:
            raise TexprError(f"{op}: {what} must be an int or {n} ints, got {v!r}")
        return tuple(check_int(x, op, what, minimum) for x in v)
    return (check_int(v, op, what, minimum),) * n


def check_bool(v, op, what):
    """A Python bool (numpy bools accepted)."""
    if not isinstance(v, (bool, np.bool_)):
        raise TexprError(f"{op}: {what} must be True or False, got {type(v).__name__}: {v!r}")
    return bool(v)


def check_choice(v, choices, op, what):
    """One of the strings ``choices``."""
    if not isinstance(v, str) or v not in choices:
        raise TexprError(f"{op}: {what} must be one of {', '.join(map(repr, choices))}, "
                         f"got {v!r}")
    return v


def check_float(v, op, what):
    """A Python number, returned as float."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
        raise TexprError(f"{op}: {what} must be a number, got {type(v).__name__}: {v!r}")
    return float(v)


def norm_axis(axis, ndim, op, what="axis"):
    """A single axis in ``[-ndim, ndim)`` normalised to ``[0, ndim)``."""
    axis = check_int(axis, op, what)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op}: {what} {axis} is out of range for a tensor of {ndim} "
                         f"dimension(s) (valid: {-ndim} .. {ndim - 1})")
    return axis % ndim if ndim else axis


def norm_axes(axis, ndim, op, what="axis"):
    """``None`` (all axes), an int or a sequence of ints: sorted unique axes in ``[0, ndim)``."""
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, (list, tuple)) else (axis,)
    out = [norm_axis(a, ndim, op, what) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: {what} {axis!r} repeats an axis")
    return tuple(sorted(out))


def check_shape(shape, op, what="shape"):
    """A tuple of non-negative ints."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)):
        raise ShapeError(f"{op}: {what} must be a tuple of ints, got {shape!r}")
    return tuple(check_int(s, op, f"{what} {tuple(shape)!r} entry", 0) for s in shape)


def all_of(conds):
    """Conjunction of a list of conditions, dropping Python ``True`` placeholders."""
    out = None
    for c in conds:
        if c is True:
            continue
        out = c if out is None else logical_and(out, c)
    return True if out is None else out


def float_const(value, like):
    """A float constant in the dtype of the expression or tensor ``like`` (float32 if int)."""
    d = like.dtype if isinstance(like, (Expr, Tensor)) else like
    return as_expr(float(value), like=d if dt.is_float(d) else dt.DEFAULT_FLOAT)
