"""A scan step that is a matrix product runs as ``np.dot`` (a GEMM) inside the scan's unit.

A recurrent cell's step multiplies the previous state by a weight matrix:
``pre[b, g] = sum_k h[t - 1, b, k] * W[g, k]``. Inside a scan the step is part of
one compiled unit, so the stage-level GEMM path (:mod:`codegen.analysis.contraction`, a
plan run by numpy between units) cannot take it; a loop nest does the
product at a few GFLOP/s. This module recognises the step stage

    S[i, j] = sum(A[..] * B[..], axis=k)        (no condition, or one on t only)

whose two loads read, at each step ``t``, a dense matrix block of their buffers:
flat offsets affine in ``(t, i, k)`` and ``(t, j, k)`` with unit stride along one
of the two axes and the other's extent as the row stride (a C-contiguous
``(M, K)`` or ``(K, M)`` block, so a reshape of a slice, no copy). It emits

    if [condition on t] and _gemm_ok(A_t, B_t, K, float max):
        np.dot(A_t, B_t.T, S_t)                 # in the unit: BLAS through SciPy
    else:
        <the step's loop nest>                   # exact IEEE terms (and the
                                                 # empty sum where t fails), as before

``_gemm_ok`` (the loop-nest backend's runtime helper) applies the rule of
:mod:`codegen.ir.gemm_policy`, the one both GEMM paths follow: every operand value
finite and ``max|A| * max|B| * K`` within :func:`codegen.ir.gemm_policy.limit` (the
dtype's largest value less the rounding of ``K`` terms), so that no product and
no partial sum overflows in any order: then the GEMM is the loop nest up to
rounding. Otherwise (an inf or NaN, or values large enough to overflow) the
loop nest runs, whose terms are the evaluator's (a BLAS may reorder terms and
fuse multiply-adds: ``1e154 * 2e154 + 1e154 * -2e154`` is NaN term by term,
inf in an FMA). Both blocks are proven inside
their buffers for every step ``L <= t < T`` at build time (a slice that left
the buffer would be cut short silently); otherwise the loop nest stays.

The recognition shares its pieces with the stage-level matcher: the summand's
factors are :func:`codegen.analysis.contraction.summand_factors`'s, the loads'
offsets :func:`codegen.analysis.affine.linear_coefs`'s.
"""

from texpr import expr as E
from texpr.expr import Reduce

from texpr.tensor import row_major_strides
from texpr.visitor import free_vars, post_order

from .emit import ExprEmitter
from ..analysis.affine import linear_coefs
from ..analysis.contraction import summand_factors
from ..ir import gemm_policy
from ..ir.schedule import inline_expand
from ..options import current as _opts

# options.scan_gemm_min_macs (default 4096): the smallest product (M * N * K multiply-adds)
#   worth a BLAS call per step


def _flat(ld, buf):
    """The load's flat offset as ``{id(var): coef}``, const (None if not affine)."""
    coefs, const = {}, 0
    for a, st in zip(ld.args, row_major_strides(ld.tensor.shape)):
        lin = linear_coefs(a)
        if lin is None:
            return None
        vs, c = lin
        const += c * st
        for key, cf in vs.items():
            coefs[key] = coefs.get(key, 0) + cf * st
    return {k: c for k, c in coefs.items() if c}, const


def _block(ld, buf, tv, row, k, m, kk):
    """``(offset coefficient of t, constant, transposed)`` when the load reads a
    C-contiguous ``(m, kk)`` block (``transposed``: a ``(kk, m)`` block) at each
    step, its rows along ``row`` and columns along ``k``; else None."""
    if hasattr(buf, "physical") or not isinstance(ld, E.Load) or ld.tensor.dtype != buf.dtype:
        return None
    f = _flat(ld, buf)
    if f is None:
        return None
    coefs, const = f
    allowed = {id(tv), id(row), id(k)}
    if any(key not in allowed for key in coefs):
        return None
    cr, ck = coefs.get(id(row), 0), coefs.get(id(k), 0)
    if cr == kk and ck == 1:
        transposed = False
    elif cr == 1 and ck == m:
        transposed = True
    else:
        return None
    return coefs.get(id(tv), 0), const, transposed


def gemm_step(s, buffers, inlined, tv, tname, L, T):
    """The GEMM lines of the step stage ``s`` (see the module docstring), or None.

    Returns ``(test, call)``: the condition of :mod:`codegen.ir.gemm_policy`'s rule
    (source text) and the ``np.dot`` statement; the caller puts the loop nest in
    the else branch."""
    if len(s.axis) != 2 or s.num_outputs != 1:
        return None
    body = inline_expand(s.body[0], inlined)
    if not isinstance(body, Reduce) or body.combiner.kind != "sum" or len(body.axes) != 1:
        return None
    step_test = None  # a condition on the step alone (``t >= 2``): the GEMM runs where it holds
    if not (isinstance(body.where, E.Const) and body.where.value is True):
        if any(v is not tv for v in free_vars(body.where)) or any(
                isinstance(x, E.Load) for x in post_order(body.where)):
            return None
        step_test = ExprEmitter({id(tv): tname}, buffers, s.name, [])(body.where)
    src = body.source[0]
    if src.dtype not in ("float32", "float64"):
        return None
    factors = summand_factors(src)
    # two loads, no constant and no guard: np.dot writes the sum as it is
    if factors is None or factors[1] or factors[2] or len(factors[0]) != 2:
        return None
    out = buffers[id(s.output(0))]
    if hasattr(out, "physical") or out.dtype != src.dtype:
        return None
    i, j = s.axis
    k = body.axes[0]
    if i.dom[0] != 0 or j.dom[0] != 0 or k.dom[0] != 0:
        return None
    m, n, kk = i.dom[1], j.dom[1], k.dom[1]
    if m * n * kk < _opts().scan_gemm_min_macs:
        return None
    a_ld, b_ld = factors[0]
    for first, second in ((a_ld, b_ld), (b_ld, a_ld)):
        if not isinstance(first, E.Load) or not isinstance(second, E.Load):
            return None
        ba, bb = buffers[id(first.tensor)], buffers[id(second.tensor)]
        pa = _block(first, ba, tv, i, k, m, kk)
        pb = _block(second, bb, tv, j, k, n, kk)
        if pa is not None and pb is not None:
            break
    else:
        return None
    views = []
    for (ct, c0, transposed), buf, rows in ((pa, ba, m), (pb, bb, n)):
        span = rows * kk
        # the block [c0 + ct * t, + span) inside the buffer at every step
        lo = min(c0 + ct * L, c0 + ct * (T - 1))
        hi = max(c0 + ct * L, c0 + ct * (T - 1)) + span
        if lo < 0 or hi > buf.size:
            return None
        start = f"{c0} + {ct} * {tname}" if ct else f"{c0}"
        shape = f"({kk}, {rows})" if transposed else f"({rows}, {kk})"
        view = f"{buf.name}[{start}:{start} + {span}].reshape({shape})"
        views.append(view + (".T" if transposed else ""))
    a_view, b_view = views
    # the guard reads max|A| and max|B| itself: the bound carries the sum's K roundings
    lim = repr(gemm_policy.limit(src.dtype, kk))
    test = " and ".join(([step_test] if step_test else [])
                        + [f"_gemm_ok({a_view}, {b_view}, {kk}, {lim})"])
    call = f"np.dot({a_view}, ({b_view}).T, {out.name}[:{m * n}].reshape(({m}, {n})))"
    return test, call
