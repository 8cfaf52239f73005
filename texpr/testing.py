"""Utilities for checking gradients: finite differences through :func:`texpr.evaluate`.

Used by the test suite; public so users can check their own operators.
"""

import numpy as np

from .evaluate import evaluate, symbolic_zero_products  # noqa: F401 - re-exported for tests
from .errors import TexprError


def random_feed(tensors, seed=0, dtype=None, low=-1.0, high=1.0, int_high=None):
    """Random arrays for the placeholders among ``tensors`` and the graphs they define.

    Floats are uniform in ``[low, high)`` (cast to ``dtype`` when given, else the
    placeholder's), bools fair coins, ints uniform in ``[0, int_high)`` (default 2;
    ``int_high=1`` gives zeros, a valid index into any non-empty axis).
    Returns a dict placeholder Tensor -> array.
    """
    from .tensor import PlaceholderOp, Tensor, topo_order

    if isinstance(tensors, Tensor):
        tensors = [tensors]
    rng = np.random.default_rng(seed)
    feed = {}
    for op in topo_order(list(tensors)):
        if not isinstance(op, PlaceholderOp):
            continue
        t = op.output(0)
        if t.dtype.startswith("float"):
            feed[t] = rng.uniform(low, high, size=t.shape).astype(dtype or t.dtype)
        elif t.dtype == "bool":
            feed[t] = rng.integers(0, 2, size=t.shape).astype(bool)
        else:
            feed[t] = rng.integers(0, int_high or 2, size=t.shape).astype(t.dtype)
    return feed


def numeric_gradient(loss, wrt, feed, eps=1e-6):
    """Central finite differences of a scalar (shape ``()``) ``loss`` w.r.t. ``wrt``.

    The graph must be float64 (``loss`` and ``wrt``), and ``feed`` hold float64
    arrays: a step of ``eps`` = 1e-6 is below float32's resolution (the
    differences would be rounding noise). Returns an array of ``wrt``'s shape
    (float64). Costs two evaluations per element of ``wrt``.

    Raises:
        TexprError: ``loss`` is not a scalar, or ``loss`` or ``wrt`` is not
        float64 while ``eps`` is below 1e-3 (build the graph with
        ``dtype="float64"``).
    """
    if loss.shape != ():
        raise TexprError(f"numeric_gradient: loss {loss.name} must be a scalar, got shape {loss.shape}")
    return numeric_jacobian(loss, wrt, feed, eps)


def numeric_jacobian(output, wrt, feed, eps=1e-6):
    """Central finite differences of any ``output`` w.r.t. ``wrt``: an array of shape
    ``output.shape + wrt.shape`` (float64). The graph must be float64 (see
    :func:`numeric_gradient`; TexprError otherwise, for ``eps`` below 1e-3)."""
    if eps < 1e-3:
        for t in (output, wrt):
            if getattr(t, "dtype", "float64") != "float64":
                raise TexprError(
                    f"numeric_gradient: {t.name} is {t.dtype}; central differences with "
                    f"eps={eps:g} need a float64 graph (in {t.dtype} the step is rounding "
                    "noise): build the graph with dtype=\"float64\" and feed float64 arrays")
    base = np.array(feed[wrt], dtype=np.float64, copy=True)
    jac = np.zeros(output.shape + base.shape, dtype=np.float64)
    f = dict(feed)
    for idx in np.ndindex(*base.shape):
        plus = base.copy()
        plus[idx] += eps
        minus = base.copy()
        minus[idx] -= eps
        f[wrt] = plus.astype(feed[wrt].dtype)
        hi = np.asarray(evaluate(output, f), dtype=np.float64)
        f[wrt] = minus.astype(feed[wrt].dtype)
        lo = np.asarray(evaluate(output, f), dtype=np.float64)
        jac[(Ellipsis,) + idx] = (hi - lo) / (2 * eps)
    return jac
