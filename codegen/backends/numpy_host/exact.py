"""The exact path of a GEMM plan: the run where :mod:`codegen.ir.gemm_policy`'s rule
does not accept the BLAS's result (an inf or NaN operand value, or values large
enough that some order of the sum could overflow).

One job: the output elements the GEMMs cannot be trusted with, computed with
the evaluator's terms (see :func:`run_exact`). The plan's pieces are run by
:mod:`codegen.backends.numpy_host.gemm`, which passes its piece runner and
operand builder in (this module imports neither).
"""

import math

import numpy as np

from .masks import _mask_array
from ...ir import gemm_policy as _policy

__all__ = ["plan_terms", "accepted", "run_exact"]

#: elements of the term array one step of :func:`_add_terms` builds (32 MB of float64)
_TERMS_PER_STEP = 1 << 22


def _piece_terms(p):
    """The terms of one output element of piece ``p``: its reduction axes' extents."""
    return math.prod(ext for _lo, ext, kind in p.axes if kind != "spatial")


def plan_terms(plan):
    """``K`` of :mod:`codegen.ir.gemm_policy` for a plan: at most this many terms add
    into one output element (its pieces' terms summed: reduction classes add into
    the same elements)."""
    return sum(_piece_terms(p) for p in plan.pieces)


def _static(plan):
    """The plan's operand keys, ``(key_a, key_b, K_p)`` per piece, ``K`` and its numpy
    dtype (kept on the plan: they depend on nothing else)."""
    st = getattr(plan, "_policy_static", None)
    if st is None:
        keys = sorted({v.key for p in plan.pieces for v in (p.a, p.b)}, key=repr)
        st = plan._policy_static = (keys, [(p.a.key, p.b.key, _piece_terms(p))
                                           for p in plan.pieces], plan_terms(plan),
                                    np.dtype(plan.dtype))
    return st


def accepted(plan, arrays):
    """Whether :mod:`codegen.ir.gemm_policy`'s rule accepts the GEMMs' result of
    ``plan`` on ``arrays``: every operand value finite and
    ``|c| * sum_p K_p * M_Ap * M_Bp`` within the limit, ``M`` the
    :func:`codegen.ir.gemm_policy.magnitude` of each operand buffer."""
    keys, pieces, terms, dtype = _static(plan)
    mag, n = {}, terms
    for k in keys:
        x = arrays[k]
        x = x.reshape(-1) if isinstance(x, np.ndarray) else np.asarray(x).reshape(-1)
        if x.dtype != dtype:  # the GEMMs read it cast to the plan's dtype
            x = x.astype(dtype)
        mag[k] = _policy.magnitude(x)
        n += x.size
    bound = abs(plan.scale) * sum(mag[a] * mag[b] * kp for a, b, kp in pieces)
    return _policy.accepts(bound, plan.dtype, n)


def run_exact(plan, arrays, out, keys, run_piece, operand):
    """The run that :mod:`codegen.ir.gemm_policy` prescribes where it does not accept
    the GEMMs' result:

    1. the GEMMs of the finite parts (non-finite operand values as zeros);
    2. where those finite parts are large enough that a product or a partial
       sum could overflow (:func:`_redo_large`), the affected output elements
       term by term;
    3. where an operand holds inf or NaN (:func:`_add_non_finite`), per output
       element, the infinity or NaN its non-finite terms make, added to it.

    Args:
        plan: the :class:`codegen.ir.contraction_plan.ContractionPlan`.
        arrays: the kernel's buffers by key.
        out: the flat output buffer (written).
        keys: the operand buffers' keys.
        run_piece: :func:`codegen.backends.numpy_host.gemm._run_piece`.
        operand: :func:`codegen.backends.numpy_host.gemm._operand`.
    Returns:
        ``out``.
    """
    raw = {k: np.asarray(arrays[k]).reshape(-1) for k in keys}
    finite = {k: bool(np.isfinite(v).all()) for k, v in raw.items()}
    zeroed = {k: v if finite[k] else np.where(np.isfinite(v), v, np.zeros((), v.dtype))
              for k, v in raw.items()}
    if plan.fill:
        out.fill(0)
    for p in plan.pieces:
        run_piece(p, zeroed, zeroed, out, plan.scale, plan.fill, plan.dtype, real=arrays)
    _redo_large(plan, zeroed, arrays, out, run_piece, operand)
    if not all(finite.values()):
        _add_non_finite(plan, raw, arrays, out, run_piece)
    return out


def _redo_large(plan, zeroed, arrays, out, run_piece, operand):
    """Recompute term by term the elements of ``out`` whose own bound
    ``|c| * sum_r |A| * |B|`` over the finite parts ``zeroed`` (a GEMM of the
    absolute values) may exceed :func:`codegen.ir.gemm_policy.limit`; nothing
    when the rule accepts the finite parts as a whole (:func:`accepted`)."""
    if accepted(plan, zeroed):
        return
    terms = plan_terms(plan)
    dt_ = np.dtype(plan.dtype)
    absolute = {k: np.abs(v) for k, v in zeroed.items()}
    bound = np.zeros(out.size, dt_)
    for p in plan.pieces:
        run_piece(p, absolute, absolute, bound, abs(plan.scale), True, plan.dtype, real=arrays)
    # the bound GEMM's own rounding: its sum of non-negative terms is within
    # (1 + u)^K of the true one, so the limit of twice the terms covers both
    large = ~(bound <= _policy.limit(dt_.name, 2 * terms))
    if not large.any():
        return
    out[large] = 0
    for p in plan.pieces:
        _add_terms(p, zeroed, arrays, out, large, plan.scale, dt_, operand)


def _add_terms(p, zeroed, arrays, out, chosen, scale, dtype, operand):
    """Add piece ``p``'s terms into the elements of ``out`` where ``chosen`` holds:
    each term ``a * b * c`` rounded on its own (an overflowing product is an
    infinity), their sum by :func:`numpy.sum` over the piece's reduction axes
    (one output element's terms in one row)."""
    spatial = [q for q, ax in enumerate(p.axes) if ax[2] == "spatial"]
    reduce_ = [q for q, ax in enumerate(p.axes) if ax[2] != "spatial"]
    shape = [p.axes[q][1] for q in spatial]
    nred = len(reduce_)
    index = np.full([1] * len(shape), p.out_offset, dtype=np.int64)
    for d, (ext, stride) in enumerate(zip(shape, p.out_strides)):
        index = index + (np.arange(ext, dtype=np.int64) * stride).reshape(
            [ext if i == d else 1 for i in range(len(shape))])
    index = np.broadcast_to(index, shape)
    sel = chosen[index]
    if p.out_masks:
        sel = sel & _mask_array(p.out_masks, spatial, p.axes, shape, p)
    if shape:
        points, targets = np.nonzero(sel), index[sel]
    else:  # a scalar output: one element
        points, targets = (), index.reshape(1)[np.atleast_1d(sel)]
    if not targets.size:
        return
    a = operand(p.a, zeroed, p.axes, dtype, real=arrays)
    b = operand(p.b, zeroed, p.axes, dtype, real=arrays)
    rext = tuple(p.axes[q][1] for q in reduce_)
    step = max(1, _TERMS_PER_STEP // max(1, math.prod(rext)))

    def pick(v, axes, lo, hi):
        # v's values at the chosen points lo:hi (leading dim) and every reduction point
        ix = []
        for q in axes:
            if q in spatial:
                ix.append(points[spatial.index(q)][lo:hi].reshape((-1,) + (1,) * nred))
            else:
                r, ext = reduce_.index(q), p.axes[q][1]
                ix.append(np.arange(ext).reshape((1,) + tuple(
                    ext if i == r else 1 for i in range(nred))))
        return v[tuple(ix)] if ix else np.reshape(v, (1,) * (nred + 1))

    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, targets.size, step):
            hi = min(targets.size, lo + step)
            t = pick(a, p.a.axes, lo, hi) * pick(b, p.b.axes, lo, hi)
            if scale != 1:
                t = t * np.asarray(scale, dtype=dtype)
            t = np.broadcast_to(t, (hi - lo,) + rext)
            np.add.at(out, targets[lo:hi], t.sum(axis=tuple(range(1, nred + 1)), dtype=dtype))


def _add_non_finite(plan, raw, arrays, out, run_piece):
    """Per output element, whether some term of its domain is NaN (a NaN factor,
    or an infinity times zero), +inf or -inf, found by GEMMs of 0/1 indicators
    (padding and masks stay absent, as in the loop nest, which never visits
    those terms); NaN where both infinities occur (IEEE: the order of the terms
    does not matter). That infinity (or NaN) is added to the finite terms'
    result in ``out``, so a finite product that overflowed to an infinity of
    the other sign gives NaN."""
    dt_ = np.dtype(plan.dtype)

    def classes(v):
        one = lambda m: m.astype(dt_)  # noqa: E731
        return {"any": np.ones(v.shape, dt_), "nan": one(np.isnan(v)),
                "zero": one(v == 0), "pinf": one(v == np.inf), "minf": one(v == -np.inf),
                "pos": one(v > 0), "neg": one(v < 0),
                "inf": one(np.isinf(v))}
    ca = {k: classes(v) for k, v in raw.items()}
    n = out.size
    tmp = np.empty(n, dt_)

    def count(pairs):
        total = np.zeros(n, dt_)
        for x, y in pairs:
            if not any(ca[p.a.key][x].any() and ca[p.b.key][y].any() for p in plan.pieces):
                continue
            tmp.fill(0)
            for p in plan.pieces:
                run_piece(p, {p.a.key: ca[p.a.key][x]}, {p.b.key: ca[p.b.key][y]},
                          tmp, 1.0, True, plan.dtype, real=arrays)
            total += tmp
        return total > 0
    nan = count([("nan", "any"), ("any", "nan"), ("inf", "zero"), ("zero", "inf")])
    pinf = count([("pinf", "pos"), ("minf", "neg"), ("pos", "pinf"), ("neg", "minf")])
    minf = count([("pinf", "neg"), ("minf", "pos"), ("pos", "minf"), ("neg", "pinf")])
    with np.errstate(invalid="ignore", over="ignore"):
        special = np.where(nan | (pinf & minf), np.nan, np.where(pinf, np.inf, -np.inf))
        special = (special * plan.scale).astype(dt_)
        # added to the finite terms' sum, not written over it: a finite product
        # that overflowed to +inf meets a -inf term as NaN, as in the loop nest
        hit = nan | pinf | minf
        out[hit] += special[hit]
