"""Solving equalities and tightening reduction domains (the ISL passes).

* :func:`solve_equalities` -- a reduction axis that the iteration domain
  determines (e.g. ``i`` in ``{i : i // W == a and i % W == b}``) is replaced
  by its value (``i = W*a + b``) and disappears; a reduction left without axes
  becomes an elementwise ``select(where, source, 0)``. Works for every reducer:
  the points of the domain do not change, only their parametrisation.
* :func:`tighten_domains` -- each remaining reduction axis gets the bounds of
  the domain's projection on it, and ``where=`` is rewritten under the new
  boxes (ISL ``gist``): conditions implied by the bounds go, the rest stays as
  affine conditions that codegen turns into exact loop bounds and strides.
  An empty domain makes the stage the reducer's identity.

  A reduction axis fixed by a condition ISL cannot see, ``r == L`` with ``L``
  free of ``r`` but data-dependent (``I[k] == r``: a segment sum's adjoint) or
  not quasi-affine (``r == i * j``), is eliminated the same way: ``r := L``,
  guarded by ``lo <= L < hi`` (``r``'s box) before anything that reads through
  ``L``. The gradient of ``Y[i] = sum(X[k], where=I[k] == i)`` becomes the gather
  ``dX[k] = select(0 <= I[k] < n, H[I[k]], 0)``: one term per ``k``.
"""

from texpr import expr as E
from texpr.tensor import ComputeOp, ScatterAddOp
from texpr.visitor import free_vars, substitute

from .domain import Domain, Solved, solve, tighten
from .graph import is_reduction, rebuild
from .isl_bridge import box_set, isl, set_to_expr, to_pwaff, to_set
from .terms import all_expr, conjuncts


def _combine_once(comb, sources, vi):
    """The reducer applied to its identity and one element: ``f(identity, x)``."""
    mapping = {}
    for lhs, ident in zip(comb.lhs, comb.identity):
        mapping[lhs] = ident
    for rhs, s in zip(comb.rhs, sources):
        mapping[rhs] = s
    if comb.kind in ("sum", "max", "min", "prod"):
        return sources[vi]
    return substitute(comb.result[vi], mapping)


def _new_bodies(op, sources, axes, where):
    red = op.body[0]
    comb = red.combiner
    out = []
    for b in op.body:
        vi = b.value_index
        if axes:
            out.append(E.make_reduce(comb, sources, axes, where, vi))
            continue
        ident = comb.identity[vi]
        if isinstance(where, E.Const) and not where.value:
            out.append(ident)
            continue
        val = _combine_once(comb, sources, vi)
        if val.dtype != b.dtype:
            val = E.cast(val, b.dtype)
        out.append(E.select(where, val, ident))
    return tuple(out)


def _identity_bodies(op):
    comb = op.body[0].combiner
    return tuple(comb.identity[b.value_index] for b in op.body)


def _solved_scatter(op):
    """The scatter-add stage ``op`` with an axis fixed by a data-dependent equality
    of its ``where`` eliminated (:func:`solve_residual`, the scatter's axes all
    free), or None. (Affine equalities stay: the support rewrite's scatters keep
    their strided domains.)

    The gradient of ``Y[i] = sum(X[J[k]], axis=k, where=I[k] == i)`` is the scatter
    ``for i, k: if I[k] == i: dX[J[k]] += H[i]``; with ``i := I[k]`` (guarded by
    ``0 <= I[k] < n``) it is one term per ``k``. A scatter that would be left
    without axes is kept as it is (it is already that small)."""
    res = solve_residual((), op.axis, op.where)
    if res is None or not res.axes:
        return None
    indices = tuple(substitute(x, res.subs) for x in op.indices)
    value = substitute(op.value, res.subs)
    return ScatterAddOp(op.name, op.shape, op.dtypes[0], res.axes, indices, value,
                        res.where, op.init).outputs


def solve_equalities(tensors):
    """Eliminate the reduction axes determined by the domain's equalities (and a
    scatter-add's axes determined by its ``where``)."""

    def fn(op, _orig, _tmap):
        if isinstance(op, ScatterAddOp):
            return _solved_scatter(op)
        if not is_reduction(op):
            return None
        red = op.body[0]
        res = solve(op.axis, red.axes, red.where)
        if res is None:
            res = solve_residual(op.axis, red.axes, red.where)
        if res is None:
            return None
        if res.empty:
            bodies = _identity_bodies(op)
        else:
            sources = tuple(substitute(s, res.subs) for s in red.source)
            bodies = _new_bodies(op, sources, res.axes, res.where)
        return ComputeOp(op.name, op.axis, bodies, op.tag, op.attrs).outputs

    return rebuild(tensors, fn)


def tighten_domains(tensors):
    """Shrink reduction boxes to the domain's bounds and simplify ``where`` under them."""

    def fn(op, _orig, _tmap):
        if not is_reduction(op):
            return None
        red = op.body[0]
        res = tighten(op.axis, red.axes, red.where)
        if res is None:
            return None
        if res.empty:
            return ComputeOp(op.name, op.axis, _identity_bodies(op), op.tag, op.attrs).outputs
        if not res.rename and res.where is red.where:
            return None
        sources = tuple(substitute(s, res.rename) for s in red.source)
        bodies = _new_bodies(op, sources, res.axes, res.where)
        return ComputeOp(op.name, op.axis, bodies, op.tag, op.attrs).outputs

    return rebuild(tensors, fn)


def _residual_value(c, r, dom):
    """``L`` when the conjunct ``c`` is ``r == L`` (either side) with ``L`` an integer
    expression free of ``r`` that ISL cannot see (a load, a product of variables,
    float arithmetic cast to int), else None."""
    if not isinstance(c, E.EQ):
        return None
    for a, b in ((c.a, c.b), (c.b, c.a)):
        if b.dtype not in ("int32", "int64") or _mentions(b, r) \
                or to_pwaff(b, dom.space) is not None:
            continue
        unit = _unit_in(a, r)
        if unit is None:
            continue
        sign, rest = unit  # a == sign * r + rest, so r == sign * (b - rest)
        # in int64, as the comparison was (r is an int64 index): int32 loads
        # subtracted in int32 could wrap where the original did not
        value = _i64(b) if rest is None else _i64(b) - _i64(rest)
        return value if sign == 1 else -value
    return None


def _i64(e):
    return e if e.dtype == "int64" else E.cast(e, "int64")


def _unit_in(e, r):
    """``(sign, rest)`` when ``e == sign * r + rest`` (``sign`` in {1, -1}, ``rest``
    an integer expression free of ``r``, or None for 0), through ``+`` and ``-``;
    else None."""
    if e is r:
        return 1, None
    if not isinstance(e, (E.Add, E.Sub)):
        return None
    x, y = e.args
    neg = isinstance(e, E.Sub)
    for first, other, flip in ((x, y, neg), (y, x, False)):
        if _mentions(other, r):
            continue
        inner = _unit_in(first, r)
        if inner is None:
            return None
        sign, rest = inner
        if first is y and neg:  # e = x - (sign * r + rest)
            sign, rest = -sign, (None if rest is None else -_i64(rest))
            add = _i64(x)
        else:                   # e = (sign * r + rest) +/- other
            add = -_i64(other) if flip else _i64(other)
        return sign, add if rest is None else _i64(rest) + add
    return None


def solve_residual(axis, raxes, where):
    """Eliminate one reduction axis fixed by a residual equality ``r == L`` (see the
    module docstring). Returns :class:`simplify.domain.Solved` or None.

    The conjuncts of ``where`` keep their order (one may guard a load of the next),
    except that those before the equality that mention ``r`` move after the bounds
    check of ``L`` (they read through ``L`` now)."""
    try:
        dom = Domain(tuple(axis) + tuple(raxes), where)
    except isl.Error:
        return None
    if dom.residual is None:
        return None
    parts = conjuncts(where)
    for pos, c in enumerate(parts):
        for r in raxes:
            value = _residual_value(c, r, dom)
            if value is None:
                continue
            lo, hi = r.dom
            if value.dtype != "int64":
                value = E.cast(value, "int64")
            mapping = {r: value}
            before = [x for x in parts[:pos] if not _mentions(x, r)]
            moving = [x for x in parts[:pos] if _mentions(x, r)]
            guard = _exists(moving, r, dom) if moving else E.const(True)
            if guard is None:
                continue
            moved = [substitute(x, mapping) for x in moving]
            after = [substitute(x, mapping) for x in parts[pos + 1:]]
            new_where = all_expr(before + [guard, value >= lo, value < hi] + moved + after)
            return Solved({r: value}, tuple(a for a in raxes if a is not r), new_where)
    return None


def _exists(conds, r, dom):
    """``exists r in its box: all conds``, as an expression free of ``r`` (ISL's
    exact projection), or None when a condition is not quasi-affine.

    The conjuncts before a residual equality ``r == L`` guarded the loads of ``L``
    (they were evaluated first, for every ``r``); once ``r`` is replaced by ``L``
    they can only come after ``L``'s bounds check. Since ``L`` does not depend
    on ``r``, "some ``r`` passes them" is exactly when the original evaluated
    ``L``: this guard, put first, keeps ``L``'s loads where they were safe."""
    aff, resid = to_set(all_expr(conds), dom.space)
    if resid is not None:
        return None
    d = next(p for p, v in enumerate(dom.vars) if v is r)
    box = box_set(dom.space)
    s = box.intersect(aff).eliminate(isl.dim_type.set, d, 1)
    return set_to_expr(s, dom.space, context=box.eliminate(isl.dim_type.set, d, 1))


def _mentions(e, v):
    return any(x is v for x in free_vars(e))
