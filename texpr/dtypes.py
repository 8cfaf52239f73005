"""The dtypes texpr knows and how they promote (like numpy).

Supported: ``float32`` (the default), ``float64``, ``int32``, ``int64``,
``bool``. Index variables are ``int64``. Python scalars are *weak*: ``x * 2``
keeps ``x``'s dtype, as in numpy 2 and JAX. A Python float combined with an
integer expression is a ``float32`` constant, promoted with the integer dtype
as numpy does: ``float64`` for ``int32`` and ``int64`` (numpy 2 gives the same
for an int array times a Python float). True division of integers gives
``float32`` (:class:`texpr.expr.Div`). See docs/conventions.md.
"""

import numpy as np

from .errors import DTypeError

DTYPES = ("float32", "float64", "int32", "int64", "bool")
FLOATS = ("float32", "float64")
INTS = ("int32", "int64")
INDEX_DTYPE = "int64"
DEFAULT_FLOAT = "float32"


def normalize(dtype, what="dtype"):
    """Return the canonical name of ``dtype`` (a str or numpy dtype).

    Raises:
        DTypeError: ``dtype`` is not one of :data:`DTYPES`.
    """
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError) as exc:
        hint = " (te.cast takes the value first: te.cast(value, dtype))" if what == "cast" else ""
        raise DTypeError(f"{what}: unknown dtype {dtype!r}; expected one of {DTYPES}{hint}") from exc
    if name not in DTYPES:
        raise DTypeError(f"{what}: dtype {name!r} is not supported; expected one of {DTYPES}")
    return name


def is_float(dtype):
    """Whether the dtype name is float32 or float64."""
    return dtype in FLOATS


def is_int(dtype):
    """Whether the dtype name is int32 or int64."""
    return dtype in INTS


def is_bool(dtype):
    """Whether the dtype name is bool."""
    return dtype == "bool"


def promote(a, b):
    """numpy's result dtype of two texpr dtypes (int32 with float32 gives float64)."""
    return np.result_type(np.dtype(a), np.dtype(b)).name


def scalar_dtype(value, like=None):
    """The dtype a Python scalar takes next to an expression of dtype ``like``."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        if like is not None and like != "bool":
            return like
        return np.dtype(type(value)).name if isinstance(value, np.integer) else INDEX_DTYPE
    if isinstance(value, (float, np.floating)):
        if like is not None and is_float(like):
            return like
        return np.dtype(type(value)).name if isinstance(value, np.floating) else DEFAULT_FLOAT
    raise DTypeError(f"cannot make a texpr constant of {value!r} ({type(value).__name__})")
