"""Attention: ``scaled_dot_product_attention`` (optionally causal).

Two plain batched contractions around a softmax: the scores ``S = Q K^T`` (a
reduction over the head dimension, every leading axis a batch axis) and the
output ``O = P V`` (a reduction over the key positions). The scale is applied
inside the softmax's exponent, so the score stage stays a bare product. The
causal mask is exact: the softmax's max and sum reduce only over the allowed
keys (``where=j <= i``) and the masked probabilities are the constant 0 (no
``-1e9`` added to the scores).
"""

import math

from .. import intrinsics as intr
from .. import reduction as red
from ..errors import ShapeError
from ..expr import select
from ..tensor import compute, reduce_axis
from ._util import check_bool, check_float, check_tensor, float_const

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(q, k, v, causal=False, scale=None,
                                 name="scaled_dot_product_attention"):
    """Softmax attention, as ``torch.nn.functional.scaled_dot_product_attention``
    (no dropout, no ``attn_mask``; ``causal`` is its ``is_causal``).

    ``S[..., i, j] = sum_e Q[..., i, e] K[..., j, e]``;
    ``P[..., i, :] = softmax_j(scale * S[..., i, j])`` over the allowed keys (all, or
    ``j <= i`` when causal: torch's top-left aligned lower triangle), 0 elsewhere;
    ``O[..., i, f] = sum_j P[..., i, j] V[..., j, f]``.

    Stages: ``{name}_scores`` (the batched product ``Q K^T``), ``{name}_max``,
    ``{name}_sum``, ``{name}_probs`` and ``{name}`` (the batched product ``P V``).
    The softmax subtracts the row maximum under ``te.stop_gradient``, as
    :func:`texpr.nn.softmax` does.

    Args:
        q: float ``(..., L, E)``. k: float ``(..., S, E)``. v: float ``(..., S, Ev)``;
            the leading (batch) axes, any number of them, must agree exactly
            (no broadcasting), e.g. ``(B, H)`` for multi-head attention.
        causal: mask key ``j`` out of query ``i``'s softmax where ``j > i``.
        scale: the factor on the scores; default ``1 / sqrt(E)`` (torch's).
    Returns:
        ``(..., L, Ev)``.
    Raises:
        ShapeError: fewer than 2 dimensions, ranks or batch axes differ, ``E`` of q
            and k differ, k and v have different key counts, no keys (``S = 0``).
        DTypeError: an int tensor. TexprError: ``causal`` not a bool, ``scale`` not a
            number.
    """
    op = "scaled_dot_product_attention"
    causal = check_bool(causal, op, "causal")
    for t, what in ((q, "query"), (k, "key"), (v, "value")):
        check_tensor(t, op, what, float_only=True)
        if t.ndim < 2:
            raise ShapeError(f"{op}: {what} {t.name} must have at least 2 dimensions "
                             f"(..., positions, features), got shape {t.shape}")
    if not q.ndim == k.ndim == v.ndim or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ShapeError(f"{op}: query {q.name} {q.shape}, key {k.name} {k.shape} and value "
                         f"{v.name} {v.shape} must have the same leading (batch) axes")
    *lead, n_q, e = q.shape
    n_k = k.shape[-2]
    if k.shape[-1] != e:
        raise ShapeError(f"{op}: query {q.name} {q.shape} has {e} features but key "
                         f"{k.name} {k.shape} has {k.shape[-1]}")
    if v.shape[-2] != n_k:
        raise ShapeError(f"{op}: key {k.name} {k.shape} has {n_k} positions but value "
                         f"{v.name} {v.shape} has {v.shape[-2]}")
    if n_k == 0:
        raise ShapeError(f"{op}: key {k.name} {k.shape} has no positions to attend to")
    if scale is None:
        scale = 1.0 / math.sqrt(e) if e else 1.0
    scale = check_float(scale, op, "scale")
    lead = tuple(lead)
    nb = len(lead)

    re = reduce_axis(e, "e")
    scores = compute(lead + (n_q, n_k),
                     lambda *i: red.sum(q[i[:nb] + (i[nb], re)] * k[i[:nb] + (i[nb + 1], re)],
                                        axis=re),
                     name=f"{name}_scores", tag=op)

    def allowed(i, j):
        return (j <= i) if causal else None

    rm = reduce_axis(n_k, "j")
    row_max = compute(lead + (n_q,), lambda *i: red.max(
        scores[i + (rm,)], axis=rm, where=allowed(i[nb], rm)), name=f"{name}_max", tag=op)

    def shift(i):
        # a constant to differentiation (as texpr.nn.softmax): the probabilities do not
        # depend on it in exact arithmetic; 0 where the max is infinite
        m = row_max[i]
        return intr.stop_gradient(select(intr.abs(m) == math.inf, 0, m))

    def expo(i, j):
        return intr.exp((scores[i + (j,)] - shift(i)) * float_const(scale, scores))

    rs = reduce_axis(n_k, "j")
    row_sum = compute(lead + (n_q,), lambda *i: red.sum(
        expo(i, rs), axis=rs, where=allowed(i[nb], rs)), name=f"{name}_sum", tag=op)

    def prob(*i):
        p = expo(i[:-1], i[-1]) / row_sum[i[:-1]]
        return select(i[-1] <= i[-2], p, 0) if causal else p

    probs = compute(lead + (n_q, n_k), prob, name=f"{name}_probs", tag=op,
                    attrs=dict(causal=causal, scale=scale))
    rj = reduce_axis(n_k, "j")
    return compute(lead + (n_q, v.shape[-1]),
                   lambda *i: red.sum(probs[i[:nb] + (i[nb], rj)] * v[i[:nb] + (rj, i[nb + 1])],
                                      axis=rj),
                   name=name, tag=op, attrs=dict(causal=causal, scale=scale))
