"""Elementwise stages that are structurally zero outside a quasi-affine region
iterate over that region only.

The adjoint of a pooling whose stride exceeds its window, of a strided 1x1
convolution with one output channel per group, of a strided slice or of an
upsampling with gaps is an elementwise stage of the input's shape whose body
is zero outside a quasi-affine *support* on its own spatial axes:
``dX[h] = select((h + 1) % 3 >= 1, H[h // 3] * 0.25, 0)`` (the rows no window
covers are zero). Computed over its box, such a stage visits every zero; the
work that matters is the support's points (writing the zeros is a memset of
the output, not work).

:func:`restrict_to_support` writes such a stage as a *support stage*: a
:class:`texpr.ScatterAddOp` with no ``init`` (zeros), its domain the stage's
own axes, ``where`` the support (quasi-affine), and identity ``indices``
(``out[h] += value(h)`` with each point written at most once). The support is
the union over the body's guarded terms (:func:`texpr.simplify.terms.guarded_terms`)
of the quasi-affine part of each term's condition; a term without one makes
the support the whole box and the stage stays as it is. The value is the body
with every condition simplified under the support (ISL ``gist``: the tests the
domain already guarantees disappear; data-dependent tests such as max
pooling's argmax comparison stay).

Everything downstream already handles a scatter-add: the evaluator, the
iteration count (``domain_count(axis, where)``: the support's points), the
materialisation rule (a scatter-add is always materialised), codegen (the
output is zero-filled, then isl's AST generator gives loops over the support
only), and the differentiation (its adjoint reads the head at the identity
indices). :func:`is_support_stage` recognises the form structurally, so that a
consumer (codegen) may treat the scatter as injective (no two domain points
write one element: the loops can run in parallel and ``+=`` is a store).

Only stages that are materialised and not inlined into any consumer are
rewritten (an inlined stage is counted inside its consumers, whose own
domains take up its condition through :mod:`texpr.simplify.lift`); the pass runs
last in the pipeline so that it sees every other pass's result.
"""

from texpr import dtypes as dt
from texpr import expr as E
from texpr.tensor import ComputeOp, ScatterAddOp
from texpr.visitor import post_order, transform

from .graph import is_elementwise, rebuild
from .isl_bridge import (VarSpace, box_set, is_subset, isl, pwaff_to_expr, set_to_expr, to_pwaff,
                         to_set)
from .materialize import inlined_stages
from .terms import all_expr, guarded_terms


def is_support_stage(op):
    """Whether ``op`` is a support stage: a scatter-add without ``init`` whose
    indices are its own domain axes, in order, over a domain of the output's
    shape (so each output element is written at most once: the scatter is
    injective, and the elements outside ``where`` are zero)."""
    return (isinstance(op, ScatterAddOp) and op.init is None
            and len(op.axis) == len(op.indices)
            and all(i is a for i, a in zip(op.indices, op.axis))
            and all(a.dom == (0, n) for a, n in zip(op.axis, op.shape)))


def support_of(op):
    """The support of an elementwise stage: ``(isl.Set, VarSpace)`` over ``op.axis``
    (the union of the quasi-affine parts of its guarded terms' conditions, inside
    the box), or None when it is the whole box (or ISL cannot tell)."""
    body = op.body[0]
    space = VarSpace(op.axis)
    box = box_set(space)
    try:
        support = space.empty()
        for cs, _v in guarded_terms(body):
            aff, _resid = to_set(all_expr(cs), space)
            support = support.union(aff)
            if is_subset(box, support):
                return None
        support = support.intersect(box).coalesce()
        if is_subset(box, support):
            return None
    except isl.Error:
        return None
    return support, space


def _gist_index(e, support, space):
    """A quasi-affine load index simplified under ``support`` when that makes it
    smaller (``2 * (h // 2)`` is ``h`` where ``h % 2 == 0``), else ``e``."""
    if e.dtype not in ("int32", "int64") or isinstance(e, (E.Const, E.Var)):
        return e
    pa = to_pwaff(e, space)
    if pa is None:
        return e
    g = pwaff_to_expr(pa.gist(support), space, context=support)
    if g.dtype != e.dtype:
        g = E.cast(g, e.dtype)
    return g if len(post_order(g)) < len(post_order(e)) else e


def _gist_conditions(body, support, space):
    """``body`` with the quasi-affine part of every condition (of a select, or of a
    bool cast to a number) and every quasi-affine load index simplified under
    ``support`` (the only points where the body is evaluated), when that is not
    larger; the data-dependent part of a condition stays after it, as it was."""
    memo = {}

    def gist(cond):
        hit = memo.get(id(cond))
        if hit is not None:
            return hit[1]
        out = cond
        try:
            aff, resid = to_set(cond, space)
            if not aff.plain_is_universe():
                g = set_to_expr(aff.intersect(support), space, context=support)
                g = g if resid is None else E.logical_and(g, resid)
                if len(post_order(g)) <= len(post_order(cond)):
                    out = g
        except isl.Error:
            out = cond
        memo[id(cond)] = (cond, out)
        return out

    def fn(node):
        if isinstance(node, E.Select):
            c = gist(node.cond)
            if c is not node.cond:
                return E.select(c, node.true_value, node.false_value)
        elif isinstance(node, E.Cast) and node.value.dtype == "bool":
            c = gist(node.value)
            if c is not node.value:
                return E.cast(c, node.dtype)
        elif isinstance(node, E.Load):
            try:
                args = tuple(_gist_index(a, support, space) for a in node.args)
            except isl.Error:
                return None
            if any(a is not b for a, b in zip(args, node.args)):
                return E.load(node.tensor, args)
        return None

    return transform(body, fn)


def to_support_stage(op):
    """The support stage of the elementwise stage ``op``, or None when its support is
    its whole box (or its dtype is not numeric)."""
    if not is_elementwise(op) or not (dt.is_float(op.dtypes[0]) or dt.is_int(op.dtypes[0])):
        return None
    found = support_of(op)
    if found is None:
        return None
    support, space = found
    where = set_to_expr(support, space, context=box_set(space))
    value = _gist_conditions(op.body[0], support, space)
    if value.dtype != op.dtypes[0]:
        value = E.cast(value, op.dtypes[0])
    return ScatterAddOp(op.name, op.shape, op.dtypes[0], op.axis, tuple(op.axis), value, where)


def restrict_to_support(tensors):
    """Rewrite every materialised, not inlined elementwise stage whose support is a
    strict subset of its box as a support stage (see the module docstring)."""
    inlined = inlined_stages(tensors)

    def fn(op, orig, _tmap):
        if not isinstance(orig, ComputeOp) or not is_elementwise(orig):
            return None
        if id(orig) in inlined:
            return None
        new = to_support_stage(op)
        return None if new is None else new.output(0)

    return rebuild(tensors, fn)
