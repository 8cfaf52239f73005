"""Triangular domains: a reduction condition ``k - j <= c`` (``>=``) between a
reduction axis ``k`` and an output axis ``j``.

The simplifier turns such reductions into scans (``simplify/prefix_scan.py``)
and the Jacobian gives a ``prod`` or user reducer under one the adjoint of that
scan (:mod:`texpr.prefix_adjoint`); both read the condition here.
"""

from . import expr as E
from .expr import all_of, iter_var, make_reduce
from .tensor import ComputeOp
from .visitor import free_vars, substitute


def linear_form(e):
    """``({id(var): (var, coef)}, const)`` when the int expression ``e`` is affine in
    its variables with int coefficients, else None."""
    if isinstance(e, E.Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            return None
        return {}, e.value
    if isinstance(e, E.Var):
        return {id(e): (e, 1)}, 0
    if isinstance(e, E.Cast):
        return linear_form(e.args[0]) if e.dtype in ("int32", "int64") else None
    if isinstance(e, (E.Add, E.Sub)):
        a, b = linear_form(e.args[0]), linear_form(e.args[1])
        if a is None or b is None:
            return None
        sign = 1 if isinstance(e, E.Add) else -1
        out = dict(a[0])
        for k, (v, c) in b[0].items():
            out[k] = (v, out.get(k, (v, 0))[1] + sign * c)
        return out, a[1] + sign * b[1]
    if isinstance(e, E.Mul):
        a, b = linear_form(e.args[0]), linear_form(e.args[1])
        if a is None or b is None:
            return None
        if a[0] and b[0]:
            return None
        if a[0]:
            a, b = b, a
        return {k: (v, c * a[1]) for k, (v, c) in b[0].items()}, a[1] * b[1]
    return None


def conjunct_list(c):
    """The conjuncts of the condition ``c`` as a list (``True`` gives ``[]``)."""
    if isinstance(c, E.And):
        return conjunct_list(c.args[0]) + conjunct_list(c.args[1])
    if isinstance(c, E.Const) and c.value is True:
        return []
    return [c]


def triangle_bound(c, k, axes):
    """``(j, c0, kind)`` when the condition ``c`` is ``k - j <= c0`` (kind "prefix") or
    ``k - j >= c0`` ("suffix") for one of the spatial ``axes`` ``j``; else None."""
    if not isinstance(c, (E.LE, E.LT, E.GE, E.GT)):
        return None
    a, b = linear_form(c.args[0]), linear_form(c.args[1])
    if a is None or b is None:
        return None
    coef = dict(a[0])
    for key, (v, x) in b[0].items():
        coef[key] = (v, coef.get(key, (v, 0))[1] - x)
    const_ = a[1] - b[1]  # lhs - rhs = sum coef * v + const_
    coef = {key: vc for key, vc in coef.items() if vc[1]}
    if id(k) not in coef or len(coef) != 2:
        return None
    (j, cj), = [vc for key, vc in coef.items() if key != id(k)]
    ck = coef[id(k)][1]
    if not any(j is a_ for a_ in axes) or ck not in (1, -1) or cj != -ck:
        return None
    # ck (k - j) + const_ OP 0
    if isinstance(c, (E.LE, E.LT)):
        le = True
        bound = -const_ - (1 if isinstance(c, E.LT) else 0)  # ck (k - j) <= bound
    else:
        le = False
        bound = -const_ + (1 if isinstance(c, E.GT) else 0)  # ck (k - j) >= bound
    if ck == -1:  # -(k - j) <= bound  <=>  k - j >= -bound
        le, bound = not le, -bound
    return j, bound, "prefix" if le else "suffix"


def triangle_split(op, any_axis):
    """``(k, j, bound, rest)`` when the reduction stage ``op`` (several reduction axes)
    holds one of its reduction axes ``k`` by a triangle ``bound`` (``k - j <= c`` or
    ``>=``) with an output axis ``j`` that neither its sources nor its other
    conditions ``rest`` mention; else None. ``any_axis=False`` looks at the first
    reduction axis only (a reducer whose points must keep their row-major order)."""
    red = op.body[0]
    if len(red.axes) < 2:
        return None
    parts = conjunct_list(red.where)
    for pos, k in enumerate(red.axes):
        if pos and not any_axis:
            break
        for ci, c in enumerate(parts):
            b = triangle_bound(c, k, op.axis)
            if b is None:
                continue
            j = b[0]
            rest = parts[:ci] + parts[ci + 1:]
            if any(v is j for v in free_vars(list(red.source) + rest)):
                continue
            return k, j, c, rest
    return None


def nested_stages(op, split, inner_hook=None):
    """The reduction stage ``op`` split at ``split`` (:func:`triangle_split`) into two::

        T[k, ..] = reduce(s, axis=the other axes, where=rest)       (inner, over k and
                                                                     the other outputs)
        Y[.., j, ..] = reduce(T[k, ..], axis=k, where=bound)        (outer, a 1-D triangle)

    A tuple reducer gives a tuple inner stage whose outputs are the outer's sources.

    Args:
        op: a ComputeOp whose body is a Reduce (every output of ``op`` one component).
        split: ``(k, j, bound, rest)``.
        inner_hook: ``outputs -> outputs`` applied to the inner stage's outputs before
            the outer stage reads them (the simplifier scans them).
    Returns:
        ``(inner outputs, outer ComputeOp)``; the outer has ``op``'s axes' extents,
        name, tag and attrs.
    """
    k, j, bound, rest = split
    red = op.body[0]
    others = [a for a in op.axis if a is not j]
    lo = k.dom[0]
    t_k = iter_var(0, k.extent, k.name, "spatial")
    t_others = [iter_var(0, a.extent, a.name, "spatial") for a in others]
    mapping = {k: t_k + lo if lo else t_k, **dict(zip(others, t_others))}
    inner_axes = tuple(a for a in red.axes if a is not k)
    where = substitute(all_of(rest), mapping)
    srcs = tuple(substitute(s, mapping) for s in red.source)
    body = tuple(make_reduce(red.combiner, srcs, inner_axes, where, v)
                 for v in range(len(srcs)))
    inner = ComputeOp(f"{op.name}_{k.name}", [t_k] + t_others, body, tag=op.tag).outputs
    if inner_hook is not None:
        inner = tuple(inner_hook(inner))
    k2 = iter_var(k.dom[0], k.dom[1], k.name, "reduce")
    y_axes = [iter_var(0, a.extent, a.name, "spatial") for a in op.axis]
    ymap = dict(zip(op.axis, y_axes))
    idx = tuple([k2 - lo if lo else k2] + [ymap[a] for a in others])
    terms = tuple(t[idx] for t in inner)
    outer_where = substitute(bound, {k: k2, **ymap})
    outer = ComputeOp(op.name, y_axes,
                      tuple(make_reduce(red.combiner, terms, (k2,), outer_where, v)
                            for v in range(len(terms))),
                      tag=op.tag, attrs=op.attrs)
    return inner, outer
