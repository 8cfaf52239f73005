"""Lifting nonzeroness conditions into reduction domains, and splitting sums.

* :func:`lift_conditions` -- in a ``sum`` stage, the conditions shared by every
  guarded term of the summand (:func:`texpr.simplify.terms.guarded_terms`) move into
  ``where=``: ``sum(select(c, v, 0), where=w) -> sum(v, where=w && c)``. This is
  the lifting step of the flatten example in docs/pipeline.md: the Jacobian's indicator becomes part of the
  iteration domain, where ISL can solve it.
* :func:`split_sums` -- a summand whose terms carry *different* conditions,
  ``sum(select(c1, a, 0) + select(c2, b, 0))``, becomes ``sum(a, where=c1) +
  sum(b, where=c2)`` (one reduction stage per condition, added by an
  elementwise stage) when that visits fewer points: each part can then be
  solved on its own (``A[i, j] + A[j, i]``: 100 points, not 10,000). Otherwise
  the disjunction of the conditions is lifted into ``where=`` when it makes the
  domain smaller.
"""

import numpy as np

from texpr import expr as E
from texpr.tensor import ComputeOp
from texpr.visitor import post_order

from .domain import domain_count, solve
from .graph import fresh_stage, is_sum_stage, rebuild
from .isl_bridge import DomainError
from .terms import (all_expr, conj, conjuncts, group_terms, guarded_terms, hoistable,
                    rebuild_sum)


def _zero_stage(op):
    return ComputeOp(op.name, op.axis, (E.const(0, op.dtypes[0]),), op.tag, op.attrs).output(0)


def lift_conditions(tensors):
    """Move the conditions common to every term of a sum's summand into its ``where=``."""

    def fn(op, _orig, _tmap):
        if not is_sum_stage(op):
            return None
        red = op.body[0]
        terms = group_terms(guarded_terms(red.source[0]))
        if not terms:
            return _zero_stage(op)
        common_ids = set.intersection(*({id(c) for c in cs} for cs, _v in terms))
        # a condition that loads is lifted only where the summand reaches it given
        # the ones lifted before it: else the where= would read where no branch did
        # (attack helper-20: k == I[int(X[j])] inside both branches of X[j] > 2)
        common = hoistable([c for c in terms[0][0] if id(c) in common_ids], red.source[0])
        common_ids = {id(c) for c in common}
        if not common:  # nothing to lift: keep the summand as it was written
            return None
        rest = [(tuple(c for c in cs if id(c) not in common_ids), v) for cs, v in terms]
        source = rebuild_sum(rest, red.dtype)
        # (a term's own condition that loads would be tested before the branches that
        # guarded it: the summand as written is kept then)
        unsafe = any(len(hoistable(common + list(cs), red.source[0])) < len(common) + len(cs)
                     for cs, _v in rest)
        if unsafe or len(post_order(source)) > 2 * len(post_order(red.source[0])):
            # the terms repeat what the summand shares (a chain of selects, split at
            # every level): the summand as written is exact too, its conditions
            # being true wherever the lifted ones hold
            source = red.source[0]
            if {id(c) for c in common} <= {id(c) for c in conjuncts(red.where)}:
                return None
        where = all_expr(conj(conjuncts(red.where) + tuple(common)))
        if where is red.where and source is red.source[0]:
            return None
        body = E.make_reduce(red.combiner, (source,), red.axes, where, 0)
        return ComputeOp(op.name, op.axis, (body,), op.tag, op.attrs).output(0)

    return rebuild(tensors, fn)


def _part_cost(axis, raxes, where):
    """Points a part will visit: 0 when every reduction axis can be solved away (it
    becomes a cheap elementwise term of the sum), else its domain's size."""
    solved = solve(axis, raxes, where)
    if solved is not None and (solved.empty or not solved.axes):
        return 0
    return domain_count(axis + raxes, where)


def split_sums(tensors):
    """Split a sum over terms with different conditions when that visits fewer points."""

    def fn(op, _orig, _tmap):
        if not is_sum_stage(op):
            return None
        red = op.body[0]
        terms = group_terms(guarded_terms(red.source[0]))
        if len(terms) < 2:
            return None
        axis, raxes = op.axis, red.axes
        vars = axis + raxes
        try:
            union = E.logical_and(red.where, E.any_of([all_expr(cs) for cs, _v in terms]))
            unsplit = domain_count(vars, union)
            box = int(np.prod(op.shape, dtype=np.int64))
            parts = [E.logical_and(red.where, all_expr(cs)) for cs, _v in terms]
            split = box + sum(_part_cost(axis, raxes, w) for w in parts)
            current = domain_count(vars, red.where)
        except DomainError:
            return None
        if split < unsplit:
            tensors_ = []
            for k, ((_cs, v), w) in enumerate(zip(terms, parts)):
                v = v if v.dtype == red.dtype else E.cast(v, red.dtype)
                body = E.make_reduce(red.combiner, (v,), raxes, w, 0)
                stage = fresh_stage(f"{op.name}_t{k}", axis, body, tag="split_sum")
                tensors_.append(stage.output(0))
            total = None
            for t in tensors_:
                ld = t[axis]
                total = ld if total is None else total + ld
            return ComputeOp(op.name, axis, (total,), op.tag, op.attrs).output(0)
        if unsplit < current:
            body = E.make_reduce(red.combiner, red.source, raxes, union, 0)
            return ComputeOp(op.name, axis, (body,), op.tag, op.attrs).output(0)
        return None

    return rebuild(tensors, fn)
