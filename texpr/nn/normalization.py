"""Normalisation layers: ``layer_norm``, ``batch_norm`` (training mode) and ``dropout``
with a given mask.

The statistics are reduction stages ``{name}_mean`` and ``{name}_var``
(biased variance, ``1/count`` folded into the summand); the normalised output
is one elementwise stage ``(x - mean) * rsqrt(var + eps) * weight + bias``.
"""

from .. import dtypes as dt
from .. import intrinsics as intr
from .. import reduction as red
from ..errors import DTypeError, ShapeError, TexprError
from ..expr import select
from ..tensor import compute, reduce_axis
from ._util import check_float, check_shape, check_tensor, float_const

__all__ = ["layer_norm", "batch_norm", "dropout"]


def _moments(x, axes, op, name):
    """Stages mean and biased variance over ``axes``; both have the shape of the kept axes."""
    kept = [d for d in range(x.ndim) if d not in axes]
    shape = tuple(x.shape[d] for d in kept)
    count = 1
    for d in axes:
        count *= x.shape[d]
    if count == 0:
        raise ShapeError(f"{op}: no elements to normalise over in {x.name} {x.shape}")
    inv = 1.0 / count

    def full_index(out_idx, raxes):
        idx, it, rit = [], iter(out_idx), iter(raxes)
        for d in range(x.ndim):
            idx.append(next(rit) if d in axes else next(it))
        return tuple(idx)

    r1 = [reduce_axis(x.shape[d], f"r{d}") for d in axes]
    mean = compute(shape, lambda *i: red.sum(x[full_index(i, r1)] * float_const(inv, x),
                                             axis=r1), name=f"{name}_mean", tag=op)
    r2 = [reduce_axis(x.shape[d], f"r{d}") for d in axes]

    def var_body(*i):
        dv = x[full_index(i, r2)] - mean[i]
        return red.sum(dv * dv * float_const(inv, x), axis=r2)

    var = compute(shape, var_body, name=f"{name}_var", tag=op)
    return kept, mean, var


def _affine(t, shape, op, what):
    if t is None:
        return None
    check_tensor(t, op, what)
    if t.shape != tuple(shape):
        raise ShapeError(f"{op}: {what} {t.name} has shape {t.shape}, expected {tuple(shape)}")
    return t


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, name="layer_norm"):
    """Layer normalisation over the trailing axes, as ``torch.nn.functional.layer_norm``.

    ``Y = (X - mean) / sqrt(var + eps) * weight + bias`` with mean and biased variance
    over the last ``len(normalized_shape)`` axes. Stages ``{name}_mean``,
    ``{name}_var``, ``{name}``.

    Args:
        x: float tensor ``(..., *normalized_shape)``.
        normalized_shape: int or tuple, the trailing extents of ``x``.
        weight, bias: optional tensors of ``normalized_shape``.
        eps: a number added to the variance.
    Returns:
        same shape as ``x``.
    Raises:
        ShapeError: ``normalized_shape`` is not the tail of ``x.shape``; weight/bias of
            the wrong shape. TexprError: bad eps.
    """
    op = "layer_norm"
    check_tensor(x, op, "input", float_only=True)
    ns = check_shape(normalized_shape, op, "normalized_shape")
    eps = check_float(eps, op, "eps")
    k = len(ns)
    if k == 0 or k > x.ndim or x.shape[x.ndim - k:] != ns:
        raise ShapeError(f"{op}: normalized_shape {ns} is not the trailing part of the "
                         f"shape {x.shape} of {x.name}")
    weight = _affine(weight, ns, op, "weight")
    bias = _affine(bias, ns, op, "bias")
    axes = tuple(range(x.ndim - k, x.ndim))
    lead = x.ndim - k
    _, mean, var = _moments(x, axes, op, name)

    def body(*i):
        lo, tail = i[:lead], i[lead:]
        y = (x[i] - mean[lo]) * intr.rsqrt(var[lo] + eps)
        if weight is not None:
            y = y * weight[tail]
        if bias is not None:
            y = y + bias[tail]
        return y

    return compute(x.shape, body, name=name, tag=op, attrs=dict(eps=eps))


def batch_norm(x, weight=None, bias=None, eps=1e-5, name="batch_norm"):
    """Batch normalisation in training mode (batch statistics), as
    ``torch.nn.functional.batch_norm(x, None, None, weight, bias, training=True)``.

    ``Y[n, c, ...] = (X[n, c, ...] - mean[c]) / sqrt(var[c] + eps) * weight[c] + bias[c]``
    with mean and biased variance over every axis but 1 (channels). Running statistics
    are not tracked (compute them from the ``{name}_mean``/``{name}_var`` stages:
    ``out.op.input_tensors()``). Stages ``{name}_mean``, ``{name}_var``, ``{name}``.

    Args:
        x: float ``(N, C, ...)`` with at least 2 dimensions.
        weight, bias: optional ``(C,)``. eps: a number.
    Returns:
        same shape as ``x``.
    Raises:
        ShapeError: fewer than 2 dimensions, weight/bias not ``(C,)``, nothing to average.
    """
    op = "batch_norm"
    check_tensor(x, op, "input", float_only=True)
    if x.ndim < 2:
        raise ShapeError(f"{op}: input {x.name} must have at least 2 dimensions (N, C, ...), "
                         f"got shape {x.shape}")
    eps = check_float(eps, op, "eps")
    c = x.shape[1]
    weight = _affine(weight, (c,), op, "weight")
    bias = _affine(bias, (c,), op, "bias")
    axes = tuple(d for d in range(x.ndim) if d != 1)
    _, mean, var = _moments(x, axes, op, name)

    def body(*i):
        ch = i[1]
        y = (x[i] - mean[ch]) * intr.rsqrt(var[ch] + eps)
        if weight is not None:
            y = y * weight[ch]
        if bias is not None:
            y = y + bias[ch]
        return y

    return compute(x.shape, body, name=name, tag=op, attrs=dict(eps=eps))


def dropout(x, mask, p=0.5, name="dropout"):
    """Inverted dropout with a given mask, as ``torch.nn.functional.dropout`` in training
    mode with its random draw replaced by ``mask``: ``Y = X * mask / (1 - p)``.

    A boolean mask keeps the entries where it is True (``select(mask, x / (1-p), 0)``);
    a float mask (of 0s and 1s, or any weights) multiplies.

    Args:
        x: float tensor. mask: bool or float tensor of ``x``'s shape.
        p: the drop probability the mask was drawn with, ``0 <= p < 1``.
    Returns:
        same shape as ``x``.
    Raises:
        ShapeError: mask shape differs. TexprError: ``p`` outside ``[0, 1)``.
        DTypeError: an int mask.
    """
    op = "dropout"
    check_tensor(x, op, "input", float_only=True)
    check_tensor(mask, op, "mask")
    p = check_float(p, op, "p")
    if not 0.0 <= p < 1.0:
        raise TexprError(f"{op}: p must be in [0, 1), got {p}")
    if mask.shape != x.shape:
        raise ShapeError(f"{op}: mask {mask.name} has shape {mask.shape} but input {x.name} "
                         f"has {x.shape}")
    scale = 1.0 / (1.0 - p)
    if dt.is_bool(mask.dtype):
        return compute(x.shape, lambda *i: select(mask[i], x[i] * scale, 0), name=name,
                       tag=op, attrs=dict(p=p))
    if not dt.is_float(mask.dtype):
        raise DTypeError(f"{op}: mask {mask.name} must be bool or float, got {mask.dtype}")
    return compute(x.shape, lambda *i: x[i] * mask[i] * scale, name=name, tag=op,
                   attrs=dict(p=p))
