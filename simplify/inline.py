"""Inlining passes: elementwise producers into consumers, and reductions into the
elementwise re-indexing stages that read them (tail accesses).

* :func:`inline_elementwise` -- substitutes the body of every elementwise stage
  that :func:`simplify.materialize.should_inline` says to inline (the identity
  head, Jacobian indicators, masks, re-indexings, cheap adjoint sums) at each of
  its loads. After this the selects of the Jacobian sit inside the consumer's
  summand, where :mod:`simplify.lift` can see them.
* :func:`inline_tail_accesses` -- an elementwise stage ``C[i] = P[f(i)] * g(i)``
  (possibly guarded, ``select(c(i), ..., 0)``) reading a sum-reduction stage
  ``P`` that nothing else reads (``P`` may be a requested output too: it stays
  for whoever asked), through an index map ``f`` injective where ``c``
  holds, becomes the reduction itself:
  ``C[i] = sum(P.source[f(i), k] * g(i), where=c(i) && P.where[f(i), k])``.
  The flatten / reshape / transpose / padding stage after a gradient reduction
  then costs nothing (the reduction visits at most the points ``P`` visited).
"""

from texpr import expr as E
from texpr.expr import Load, iter_var
from texpr.tensor import ComputeOp, topo_order
from texpr.visitor import loads, post_order, substitute, transform

from .domain import access_is_injective
from .graph import accesses, is_elementwise, is_sum_stage, rebuild, remap_loads
from .materialize import should_inline
from .terms import all_expr, guarded_terms


def inline_elementwise(tensors):
    """Inline the elementwise stages that the materialisation rule does not keep."""
    output_ids = {id(t) for t in tensors}
    accs = accesses(tensors)
    inline_ids = {id(op) for op in topo_order(tensors)
                  if should_inline(op, accs.get(id(op), []), output_ids)}
    if not inline_ids:
        return list(tensors)
    bodies = {}  # id(new tensor) -> (axis, inlined body)

    def fn(op, orig, _tmap):
        new = op
        if isinstance(op, ComputeOp):
            body = tuple(_inline_loads(b, bodies) for b in op.body)
            if any(x is not y for x, y in zip(body, op.body)):
                new = ComputeOp(op.name, op.axis, body, op.tag, op.attrs)
        if id(orig) in inline_ids:
            bodies[id(new.output(0))] = (new.axis, new.body[0])
        return None if new is op else new.outputs

    return rebuild(tensors, fn)


def _inline_loads(e, bodies):
    if not bodies:
        return e

    def fn(node):
        if isinstance(node, Load):
            hit = bodies.get(id(node.tensor))
            if hit is not None:
                axis, body = hit
                return substitute(body, dict(zip(axis, node.args)))
        return None

    return transform(e, fn)


def inline_tail_accesses(tensors):
    """Fold a sum-reduction into the elementwise stage that re-indexes it (see the
    module docstring)."""
    accs = accesses(tensors)

    def fn(op, orig, tmap):
        if not is_elementwise(orig):
            return None
        terms = guarded_terms(orig.body[0])
        if len(terms) != 1:
            return None
        cs, value = terms[0]
        for ld in loads(value):
            p = ld.tensor
            if not is_sum_stage(p.op):
                continue
            if len(accs.get(id(p.op), ())) != 1:
                continue
            rest = _factor_out(value, ld)
            if rest is None:
                continue
            where_c = all_expr(cs)
            if not access_is_injective(orig.axis, where_c, ld.args):
                continue
            newp = tmap.get(id(p), p)
            red = newp.op.body[0]
            fresh = {a: iter_var(a.dom[0], a.dom[1], a.name, "reduce") for a in red.axes}
            mapping = dict(zip(newp.op.axis, (remap_loads(i, tmap) for i in ld.args)))
            mapping.update(fresh)
            src = substitute(red.source[0], mapping)
            pwhere = substitute(red.where, mapping)
            source = src if rest is True else E.mul(src, remap_loads(rest, tmap))
            if source.dtype != orig.dtypes[0]:
                source = E.cast(source, orig.dtypes[0])
            where = E.logical_and(remap_loads(where_c, tmap), pwhere)
            body = E.make_reduce(red.combiner, (source,), tuple(fresh[a] for a in red.axes),
                                 where, 0)
            return ComputeOp(op.name, op.axis, (body,), op.tag, op.attrs).output(0)
        return None

    return rebuild(tensors, fn)


def _factor_out(value, ld):
    """``value == ld * rest`` with ``rest`` free of ``ld``: returns ``rest`` (True for 1),
    or None when ``value`` is not such a product."""
    if value is ld:
        return True
    if isinstance(value, E.Mul):
        for a, b in ((value.a, value.b), (value.b, value.a)):
            if a is ld and not any(n is ld for n in post_order(b)):
                return b
            inner = _factor_out(a, ld) if not any(n is ld for n in post_order(b)) else None
            if inner is not None:
                return b if inner is True else E.mul(inner, b)
    return None
