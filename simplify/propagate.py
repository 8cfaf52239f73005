"""Lifting nonzeroness conditions through reductions: from a producer to the
sums that read it.

A sum stage ``P[j] = sum_k(v, where=w(j, k))`` is structurally zero outside the
projection ``S = {j : exists k, w(j, k)}`` of its domain (e.g. the adjoint of a
stride-2 convolution's input is zero on odd rows when the kernel is 1 wide).
:func:`propagate_zero_conditions` wraps each load ``P[f]`` in a sum's summand as
``select(f in S, P[f], 0)`` when the consumer's domain does not already imply
it, so that :func:`texpr.simplify.lift.lift_conditions` moves the condition into the
consumer's domain: the next layer's weight gradient then visits only the
points where the adjoint can be nonzero. Only the affine part of the
producer's condition is used (a data-dependent guard cannot be projected),
and loads at data-dependent indices are left alone (their bounds check must
stay: an out-of-range index is an error on every path).
A support stage (:mod:`texpr.simplify.support`: an elementwise stage written as an
identity scatter-add over its nonzero region) is zero outside its ``where``,
and its loads are guarded the same way.
"""

from texpr import expr as E
from texpr.expr import Load
from texpr.visitor import post_order, substitute, transform

from .domain import Domain
from .graph import is_sum_stage, rebuild
from .isl_bridge import (DomainError, VarSpace, box_set, is_subset, isl, project_onto_first,
                         set_to_expr, to_set)
from .support import is_support_stage


def _support(op, cache):
    """The condition (over ``op.axis``) outside which the sum stage (or support
    stage) ``op`` is zero, or None when it may be nonzero everywhere."""
    hit = cache.get(id(op))
    if hit is not None:
        return hit[1]
    cond = None
    try:
        if is_support_stage(op):
            proj = Domain(op.axis, op.where).set
        else:
            red = op.body[0]
            dom = Domain(op.axis + red.axes, red.where)
            proj = project_onto_first(dom.set, len(op.axis))
        space = VarSpace(op.axis)
        box = box_set(space)
        if not is_subset(box, proj):
            cond = set_to_expr(proj, space, context=box)
    except (isl.Error, DomainError):
        cond = None
    cache[id(op)] = (op, cond)
    return cond


def propagate_zero_conditions(tensors):
    """Guard the loads of structurally-zero-somewhere sum stages (and support
    stages) inside sums."""
    cache = {}

    def fn(op, _orig, _tmap):
        if not is_sum_stage(op):
            return None
        red = op.body[0]
        vars = op.axis + red.axes
        dom = None
        changed = []

        def wrap(node):
            nonlocal dom
            if not isinstance(node, Load) or not (is_sum_stage(node.tensor.op)
                                                  or is_support_stage(node.tensor.op)):
                return None
            if any(isinstance(n, Load) for a in node.args for n in post_order(a)):
                # a gather P[I[k]]: the guard would also skip the bounds check of an
                # out-of-range I[k] (an error on every path), e.g. of an empty P
                return None
            cond = _support(node.tensor.op, cache)
            if cond is None:
                return None
            at = substitute(cond, dict(zip(node.tensor.op.axis, node.args)))
            try:
                if dom is None:
                    dom = Domain(vars, red.where)
                s, resid = to_set(at, dom.space)
                if resid is not None or is_subset(dom.set, s):
                    return None
            except isl.Error:
                return None
            changed.append(node)
            return E.select(at, node, E.const(0, node.dtype))

        source = transform(red.source[0], wrap)
        if not changed:
            return None
        body = E.make_reduce(red.combiner, (source,), red.axes, red.where, 0)
        from texpr.tensor import ComputeOp

        return ComputeOp(op.name, op.axis, (body,), op.tag, op.attrs).output(0)

    return rebuild(tensors, fn)
