"""Triangular domains: a reduction condition ``k - j <= c`` (``>=``) between a
reduction axis ``k`` and an output axis ``j``.

The simplifier turns such reductions into scans (``simplify/prefix_scan.py``)
and the Jacobian gives a ``prod`` or user reducer under one the adjoint of that
scan (:mod:`texpr.prefix_adjoint`); both read the condition here.
"""

from . import expr as E


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
