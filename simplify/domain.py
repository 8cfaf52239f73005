"""Iteration domains of stages, seen by ISL: counting, solving, tightening.

The iteration domain of a reduction stage is ``spatial box x reduce box``
intersected with its ``where=`` condition. The quasi-affine part of ``where``
becomes an ISL set (see :mod:`texpr.simplify.isl_bridge`); the rest (data-dependent
tests, float comparisons) is the *residual*, kept as a guard that ISL does not
see. Every function here works on the affine part and carries the residual
along.

The three moves of the algorithm (docs/pipeline.md) live here:

* :func:`solve` -- eliminate reduction variables that the domain determines
  (``PwMultiAff.from_map`` of the single-valued map ``others -> r``), substituting
  their value and projecting them out of the set.
* :func:`tighten` -- shrink each reduction axis' box to the bounds of the
  domain's projection (``dim_min_val``/``dim_max_val``) and rewrite ``where``
  simplified under the new box (``gist``: conditions implied by the bounds go).
* :func:`domain_count` -- the exact number of points (barvinok's ``card``).
"""

from texpr import expr as E
from texpr.expr import IterVar, iter_var
from texpr.visitor import substitute

from . import isl_bridge as B
from .isl_bridge import isl


class Domain:
    """The affine part (``set``, an ``isl.Set`` over ``space``) and the ``residual``
    (an Expr or None) of ``where`` over the variables ``vars`` (IterVars)."""

    def __init__(self, vars, where=None):
        self.vars = tuple(vars)
        self.space = B.VarSpace(self.vars)
        s = B.box_set(self.space)
        self.residual = None
        if where is not None:
            aff, self.residual = B.to_set(where, self.space)
            s = s.intersect(aff)
        self.set = s

    def count(self):
        return B.card(self.set)


def domain_count(vars, where=None):
    """Exact number of points of ``box(vars)`` where the affine part of ``where`` holds."""
    try:
        return Domain(vars, where).count()
    except isl.Error as exc:
        raise B.DomainError(f"cannot count the iteration domain over "
                            f"{[v.name for v in vars]} where {where!r}: {exc}") from None


def _where_expr(s, space, bounds, residual):
    """``where`` for the affine set ``s`` (simplified under the box ``bounds``) and the
    residual guard (affine part first: it has no loads, so it may guard them)."""
    ctx = B.bounds_set(space, bounds)
    cond = B.set_to_expr(s, space, context=ctx)
    if residual is not None:
        cond = E.logical_and(cond, residual)
    return cond


def _bounds_of(vars):
    return {id(v): v.dom for v in vars if isinstance(v, IterVar)}


class Solved:
    """The result of :func:`solve`: ``subs`` maps eliminated reduction axes to their
    values, ``axes`` are the remaining reduction axes, ``where`` the new condition;
    ``empty`` says the domain has no point at all."""

    def __init__(self, subs, axes, where, empty=False):
        self.subs, self.axes, self.where, self.empty = subs, axes, where, empty


def solve(axis, raxes, where):
    """Eliminate the reduction axes that the domain determines.

    Args:
        axis: the spatial IterVars of the stage.
        raxes: its reduction IterVars.
        where: the reduction's condition.
    Returns:
        :class:`Solved`, or None when no axis can be eliminated and the domain is
        not empty. Among several solvable axes the one whose value has the fewest
        pieces and integer divisions goes first (a stride then stays a loop bound
        rather than a ``%`` test).
    """
    try:
        return _solve(tuple(axis), tuple(raxes), where)
    except isl.Error:
        return None


def _solve(axis, raxes, where):
    dom = Domain(axis + raxes, where)
    s = dom.set
    if s.is_empty():
        return Solved({}, (), E.const(False), empty=True)
    cur = list(axis + raxes)
    remaining = list(raxes)
    subs = []
    while remaining:
        best = None
        for r in remaining:
            pos = next(i for i, v in enumerate(cur) if v is r)
            res = B.solve_last_dims(s, pos)
            if res is None:
                continue
            pa, proj, score = res
            if score[0] > 1:  # a piecewise value: the domain is a union; keep the axis
                continue
            if best is None or score < best[0]:
                best = (score, r, pa, proj)
        if best is None:
            break
        _score, r, pa, proj = best
        others = [v for v in cur if v is not r]
        osp = B.VarSpace(others)
        single = B.single_piece_aff(pa)
        if single is not None:
            value = B.pwaff_to_expr(single, osp)
        else:
            value = B.pwaff_to_expr(pa, osp, context=proj)
        subs = [(v, substitute(e, {r: value})) for v, e in subs] + [(r, value)]
        s, cur = proj, others
        remaining = [v for v in remaining if v is not r]
    if not subs:
        return None
    mapping = dict(subs)
    residual = None if dom.residual is None else substitute(dom.residual, mapping)
    space = B.VarSpace(cur)
    new_where = _where_expr(s, space, _bounds_of(cur), residual)
    return Solved(mapping, tuple(remaining), new_where)


class Tightened:
    """The result of :func:`tighten`: ``rename`` maps old reduction axes to the new
    (smaller) ones, ``axes`` the new axes, ``where`` the new condition."""

    def __init__(self, rename, axes, where, empty=False):
        self.rename, self.axes, self.where, self.empty = rename, axes, where, empty


def tighten(axis, raxes, where):
    """Shrink the reduction boxes to the projection's bounds and simplify ``where``
    under the new boxes (conditions implied by the bounds disappear; ``%``
    conditions stay for codegen to turn into strides).

    Returns:
        :class:`Tightened` (``empty`` when the domain has no point), or None when
        ISL cannot handle the domain.
    """
    try:
        return _tighten(tuple(axis), tuple(raxes), where)
    except isl.Error:
        return None


def _tighten(axis, raxes, where):
    vars = axis + raxes
    dom = Domain(vars, where)
    s = dom.set
    if s.is_empty():
        return Tightened({}, (), E.const(False), empty=True)
    bounds = _bounds_of(axis)
    rename = {}
    new_axes = []
    for pos, r in enumerate(vars):
        if pos < len(axis):
            continue
        lo, hi = B.dim_bounds(s, pos)
        bounds[id(r)] = (lo, hi)
        if (lo, hi) != r.dom:
            nr = iter_var(lo, hi, r.name, "reduce")
            rename[r] = nr
            new_axes.append(nr)
        else:
            new_axes.append(r)
    cond = _where_expr(s, dom.space, bounds, dom.residual)
    cond = substitute(cond, rename)
    return Tightened(rename, tuple(new_axes), cond)


def access_is_injective(vars, where, indices):
    """Whether the load indices (Exprs over ``vars``) read each point at most once
    over the domain ``box(vars) & where``; False when not quasi-affine."""
    try:
        dom = Domain(vars, where)
        pas = [B.to_pwaff(i, dom.space) for i in indices]
        if any(p is None for p in pas):
            return False
        return B.is_injective(dom.set, pas)
    except isl.Error:
        return False
