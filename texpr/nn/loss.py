"""Softmax family and losses: ``softmax``, ``log_softmax``, ``logsumexp``,
``cross_entropy``, ``mse_loss``.

All softmax-type operators subtract the maximum along the axis before
exponentiating (stages ``{name}_max`` and ``{name}_sum``), so they are finite
at large inputs. The shift is under ``te.stop_gradient`` (as in JAX's
``log_softmax``): the outputs do not depend on it in exact arithmetic, so the
gradients have no term through the maximum (no argmax stage, no two terms
that cancel). A row holding ``+inf``: the gradients at its finite entries are
finite (log_softmax's is the head there, cross_entropy's 0), where torch gives
NaN across the row. The shift is ``m`` where ``m`` is finite and 0 where it is
``+-inf`` (as torch's logsumexp), so a row of ``-inf`` gives ``logsumexp = -inf``
instead of ``nan``.
"""

import math

from .. import intrinsics as intr
from .. import reduction as red
from ..errors import ShapeError
from ..expr import select
from ..tensor import compute, reduce_axis
from ._util import check_bool, check_choice, check_tensor, float_const, norm_axis
from .reduce import input_index, reduced_shape

__all__ = ["softmax", "log_softmax", "logsumexp", "cross_entropy", "mse_loss"]


def _shifted_exp_sum(x, axis, op, name):
    """Stages ``m = max_axis x`` and ``s = sum_axis exp(x - shift)`` (axis removed), and a
    function giving the expression ``shift`` at an output index with the axis removed."""
    check_tensor(x, op, "input", float_only=True)
    axis = norm_axis(axis, x.ndim, op)
    if x.shape[axis] == 0:
        raise ShapeError(f"{op}: axis {axis} of {x.name} (shape {x.shape}) is empty")
    shape = reduced_shape(x.shape, (axis,), False)
    rm = reduce_axis(x.shape[axis], "r")
    m = compute(shape, lambda *i: red.max(x[input_index(i, [rm], x.ndim, (axis,), False)],
                                         axis=rm), name=f"{name}_max", tag=op)

    def shift(i):
        # a constant to differentiation: the outputs do not depend on the shift in
        # exact arithmetic (its two gradient terms, -1 and the softmax's sum, cancel)
        v = m[i]
        return intr.stop_gradient(select(intr.abs(v) == math.inf, 0, v))

    rs = reduce_axis(x.shape[axis], "r")
    s = compute(shape, lambda *i: red.sum(
        intr.exp(x[input_index(i, [rs], x.ndim, (axis,), False)] - shift(i)), axis=rs),
        name=f"{name}_sum", tag=op)
    return axis, shift, s


def _drop(i, axis):
    return tuple(v for d, v in enumerate(i) if d != axis)


def softmax(x, axis=-1, name="softmax"):
    """``exp(x - m) / sum_axis exp(x - m)``, as ``torch.softmax`` (``m`` the max along axis).

    Three stages: ``{name}_max``, ``{name}_sum``, ``{name}``. A row holding ``+inf``
    gives NaN at its ``+inf`` entries and 0 at the others (torch: NaN across the row).

    Args:
        x: float tensor. axis: the normalised axis (default last).
    Returns:
        same shape as ``x``.
    Raises:
        ShapeError: bad or empty axis. DTypeError: int input.
    """
    axis, shift, s = _shifted_exp_sum(x, axis, "softmax", name)
    return compute(x.shape, lambda *i: intr.exp(x[i] - shift(_drop(i, axis))) / s[_drop(i, axis)],
                   name=name, tag="softmax", attrs=dict(axis=axis))


def log_softmax(x, axis=-1, name="log_softmax"):
    """``x - m - log(sum_axis exp(x - m))``, as ``torch.log_softmax``.

    Three stages: ``{name}_max``, ``{name}_sum``, ``{name}``. A row holding ``+inf``
    gives NaN at its ``+inf`` entries and ``-inf`` at the others (torch: NaN across the row).

    Args/Returns/Raises: as :func:`softmax`.
    """
    axis, shift, s = _shifted_exp_sum(x, axis, "log_softmax", name)
    return compute(x.shape,
                   lambda *i: x[i] - shift(_drop(i, axis)) - intr.log(s[_drop(i, axis)]),
                   name=name, tag="log_softmax", attrs=dict(axis=axis))


def logsumexp(x, axis=-1, keepdims=False, name="logsumexp"):
    """``log(sum_axis exp(x))`` computed as ``m + log(sum exp(x - m))``, as
    ``torch.logsumexp``: finite for large inputs, ``-inf`` for a row of ``-inf``,
    ``-inf`` entries contribute nothing.

    Three stages: ``{name}_max``, ``{name}_sum``, ``{name}``.

    Args:
        x: float tensor. axis: one axis (default last). keepdims: keep it with extent 1.
    Returns:
        ``x``'s shape without ``axis`` (or with extent 1 there).
    Raises:
        ShapeError: bad or empty axis. DTypeError: int input.
    """
    keepdims = check_bool(keepdims, "logsumexp", "keepdims")
    axis, shift, s = _shifted_exp_sum(x, axis, "logsumexp", name)
    shape = reduced_shape(x.shape, (axis,), keepdims)

    def body(*i):
        j = _drop(i, axis) if keepdims else i
        return shift(j) + intr.log(s[j])

    return compute(shape, body, name=name, tag="logsumexp",
                   attrs=dict(axis=axis, keepdims=bool(keepdims)))


def _reduction_arg(reduction, op):
    return check_choice(reduction, ("mean", "sum", "none"), op, "reduction")


def cross_entropy(logits, labels, reduction="mean", name="cross_entropy"):
    """Softmax cross-entropy with integer class labels, as
    ``torch.nn.functional.cross_entropy(logits, labels)``.

    ``loss[n] = -log_softmax(logits)[n, labels[n]]`` (a data-dependent index),
    computed stably as ``log(sum_c exp(z - m)) - (z[labels[n]] - m)`` with ``m`` the
    row's max (never as the difference of two large numbers), then the mean
    (default), the sum, or nothing (``reduction="none"``) over the batch. Stages:
    ``{name}_lse_max``, ``{name}_lse_sum``, ``{name}``.

    Non-finite rows differ from torch, which gives NaN for each: a row with ``+inf``
    logits has loss ``inf`` when its label's logit is finite and NaN when it is ``+inf``.
    The mean over an empty batch (N = 0) is 0 (torch: NaN).

    Args:
        logits: float ``(N, C)``. labels: int ``(N,)`` with values in ``[0, C)`` (an
            ``OutOfBoundsError`` at evaluation otherwise).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    Returns:
        shape ``()`` (``(N,)`` for ``"none"``).
    Raises:
        ShapeError: wrong ranks or batch extents. DTypeError: float labels or int logits.
        TexprError: bad ``reduction``.
    """
    op = "cross_entropy"
    check_tensor(logits, op, "logits", ndim=2, float_only=True)
    check_tensor(labels, op, "labels", ndim=1, int_only=True)
    reduction = _reduction_arg(reduction, op)
    n, c = logits.shape
    if labels.shape[0] != n:
        raise ShapeError(f"{op}: labels {labels.name} has {labels.shape[0]} entries but logits "
                         f"{logits.name} {logits.shape} has a batch of {n}")
    if c == 0:
        raise ShapeError(f"{op}: logits {logits.name} {logits.shape} has no classes")
    _, shift, s = _shifted_exp_sum(logits, 1, op, f"{name}_lse")

    def nll(i):
        # -log_softmax at the label: log(sum exp(z - m)) - (z_label - m), never
        # logsumexp - z_label (the difference of two large numbers loses the
        # digits: ln 2 came out as 0.69336 for logits [1e4, 1e4] in float32)
        return intr.log(s[i]) - (logits[i, labels[i]] - shift(i))

    if reduction == "none":
        return compute((n,), lambda i: nll(i), name=name, tag=op)
    r = reduce_axis(n, "n")
    scale = 1.0 / n if reduction == "mean" and n else 1.0

    def body():
        v = nll(r)
        if scale != 1.0:
            v = v * float_const(scale, v)
        return red.sum(v, axis=r)

    return compute((), body, name=name, tag=op, attrs=dict(reduction=reduction))


def mse_loss(pred, target, reduction="mean", name="mse_loss"):
    """Mean squared error, as ``torch.nn.functional.mse_loss``:
    ``mean((pred - target)^2)`` over every element (or the sum, or elementwise).

    One stage.

    Args:
        pred, target: float tensors of the same shape.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    Returns:
        shape ``()`` (``pred.shape`` for ``"none"``).
    Raises:
        ShapeError: shapes differ. TexprError: bad ``reduction``.
    """
    op = "mse_loss"
    check_tensor(pred, op, "pred", float_only=True)
    check_tensor(target, op, "target", float_only=True)
    reduction = _reduction_arg(reduction, op)
    if pred.shape != target.shape:
        raise ShapeError(f"{op}: pred {pred.name} {pred.shape} and target {target.name} "
                         f"{target.shape} differ in shape")

    def sq(i):
        d = pred[i] - target[i]
        return d * d

    if reduction == "none":
        return compute(pred.shape, lambda *i: sq(i), name=name, tag=op)
    if pred.ndim == 0:
        return compute((), lambda: sq(()), name=name, tag=op)
    raxes = [reduce_axis(n, f"r{d}") for d, n in enumerate(pred.shape)]
    count = pred.size

    def body():
        v = sq(tuple(raxes))
        if reduction == "mean" and count:
            v = v * float_const(1.0 / count, v)
        return red.sum(v, axis=raxes)

    return compute((), body, name=name, tag=op, attrs=dict(reduction=reduction))
