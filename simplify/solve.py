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
"""

from texpr import expr as E
from texpr.tensor import ComputeOp
from texpr.visitor import substitute

from .domain import solve, tighten
from .graph import is_reduction, rebuild


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


def solve_equalities(tensors):
    """Eliminate the reduction axes determined by the domain's equalities."""

    def fn(op, _orig, _tmap):
        if not is_reduction(op):
            return None
        red = op.body[0]
        res = solve(op.axis, red.axes, red.where)
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
