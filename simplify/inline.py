"""Inlining passes: elementwise producers into consumers, and reductions into the
elementwise re-indexing stages that read them (tail accesses).

* :func:`inline_elementwise` -- substitutes the body of every elementwise stage
  that :func:`texpr.simplify.materialize.should_inline` says to inline (the identity
  head, Jacobian indicators, masks, re-indexings, cheap adjoint sums) at each of
  its loads. After this the selects of the Jacobian sit inside the consumer's
  summand, where :mod:`texpr.simplify.lift` can see them.
* :func:`inline_tail_accesses` -- an elementwise stage ``C[i] = P[f(i)] * g(i)``
  (possibly guarded, ``select(c(i), ..., 0)``) reading a sum-reduction stage
  ``P`` that nothing else reads (``P`` may be a requested output too: it stays
  for whoever asked), through an index map ``f`` injective where ``c``
  holds, becomes the reduction itself:
  ``C[i] = sum(P.source[f(i), k] * g(i), where=c(i) && P.where[f(i), k])``.
  The flatten / reshape / transpose / padding stage after a gradient reduction
  then costs nothing (the reduction visits at most the points ``P`` visited).
  An adjoint sum ``C[i] = P1[i] + P2[i]`` of two such reductions (a tensor
  read by two consumers) becomes ONE reduction over the disjoint union of their
  domains (an extra axis ``t`` tells the parts apart), so the sum costs the
  parts' points and nothing more -- unless two of the parts are contractions
  (products of two loads): each is a GEMM on its own, their union none.

  The fold weighs iteration counts. Terms with the same condition and the same
  load of ``P`` are one part: the local derivative of ``S = sigmoid(X) * X``
  has three terms, and ``dX = dS * (a + b + c)`` folds as one pass over ``dS``'s
  domain, never three. The fold happens only when the folded domain has no
  more points than ``P``'s domain plus the tail's box, and when a factor beside
  ``P`` that is not cheap (:func:`simplify.materialize.is_cheap`: an intrinsic,
  a division) would not be recomputed at every point of the reduction (the
  folded domain has more points than the tail's box). Otherwise ``P`` is
  computed once (materialised) and the tail multiplies it: the adjoint of a
  tanh layer's matmul is computed once, then scaled by ``1 - tanh(x)**2``.
"""

import numpy as np

from texpr import expr as E
from texpr.expr import Load, iter_var
from texpr.tensor import ComputeOp, ScatterAddOp, topo_order
from texpr.visitor import loads, post_order, substitute, transform

from .affine_index import is_scattered
from .domain import Domain, access_is_injective, domain_count
from .isl_bridge import DomainError, isl
from .graph import accesses, is_elementwise, is_sum_stage, rebuild, remap_loads
from .materialize import inlined_stages, is_cheap, stage_count
from .terms import all_expr, guarded_terms


def inline_elementwise(tensors):
    """Inline the elementwise stages that the materialisation rule does not keep."""
    inline_ids = inlined_stages(tensors)
    if not inline_ids:
        return list(tensors)
    bodies = {}  # id(new tensor) -> (axis, inlined body)

    def fn(op, orig, _tmap):
        new = op
        if isinstance(op, ComputeOp):
            body = tuple(_inline_loads(b, bodies) for b in op.body)
            if any(x is not y for x, y in zip(body, op.body)):
                new = ComputeOp(op.name, op.axis, body, op.tag, op.attrs)
        elif isinstance(op, ScatterAddOp):
            parts = tuple(_inline_loads(x, bodies) for x in op.indices + (op.value, op.where))
            if any(x is not y for x, y in zip(parts, op.indices + (op.value, op.where))):
                n = len(op.indices)
                new = ScatterAddOp(op.name, op.shape, op.dtypes[0], op.axis, parts[:n],
                                   parts[n], parts[n + 1], op.init)
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


def _tail_terms(orig, accs):
    """The guarded terms of the tail stage ``orig`` as ``[(conjuncts, P load, rest)]``
    with ``select(all(conjuncts), P[f] * rest, 0)`` each (``rest`` True for 1),
    terms with the same conditions and the same load merged (``P * a + P * b``
    is ``P * (a + b)``: one pass over ``P``'s domain, not two); None when a term
    is not such a product with ``f`` injective where the term's conditions hold."""
    groups, order = {}, []
    for cs, value in guarded_terms(orig.body[0]):
        for ld in loads(value):
            p = ld.tensor
            if not is_sum_stage(p.op) or len(accs.get(id(p.op), ())) != 1:
                continue
            rest = _factor_out(value, ld)
            if rest is not None and access_is_injective(orig.axis, all_expr(cs), ld.args):
                break
        else:
            return None
        key = (frozenset(id(c) for c in cs), id(ld))
        if key in groups:
            cs0, ld0, r0 = groups[key]
            one = E.const(1, ld.dtype)
            groups[key] = (cs0, ld0, E.add(one if r0 is True else r0,
                                           one if rest is True else rest))
        else:
            groups[key] = (cs, ld, rest)
            order.append(key)
    return [groups[k] for k in order]


def _tail_part(orig, cs, ld, rest, tmap):
    """One guarded term ``select(cs, P[f] * rest, 0)`` of a tail stage (``f``
    injective where ``cs`` holds), as ``(source, where, axes, combiner)`` of a
    reduction over ``P``'s (fresh) axes."""
    where_c = all_expr(cs)
    p = ld.tensor
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
    return source, where, tuple(fresh[a] for a in red.axes), red.combiner


def _fold_pays(orig, parts, rests, sources):
    """Whether folding the reductions into the tail stage ``orig`` costs no more
    than computing them once and the tail after them (the rule of the module
    docstring): the folded domain has at most the points of the reductions plus
    the tail's box, and a factor that is not cheap (an intrinsic, a division:
    a local derivative such as ``1 - tanh(x)**2``) is not recomputed at every
    point of a reduction (only where the folded domain has at most one point per
    element of the tail)."""
    try:
        folded = sum(domain_count(tuple(orig.axis) + axes, where)
                     for _s, where, axes, _c in parts)
        kept = sum(stage_count(p.op) for p in {id(p): p for p in sources}.values())
    except DomainError:
        return False
    box = int(np.prod(orig.shape, dtype=np.int64))
    if folded > kept + box:
        return False
    if folded <= box:
        return True
    return all(r is True or is_cheap(r) for r in rests)


def _fuse_parts(axis, parts):
    """One reduction over the disjoint union of the parts' domains: a new axis ``t``
    says which part a point belongs to; the parts' axes share positions (an axis a
    part does not have is pinned to its lower bound). None unless every part's
    condition is quasi-affine (the union must stay visible to ISL)."""
    for _src, where, axes, _c in parts:
        if Domain(tuple(axis) + axes, where).residual is not None:
            return None
    n = max(len(axes) for _s, _w, axes, _c in parts)
    bounds = []
    for i in range(n):
        doms = [axes[i].dom for _s, _w, axes, _c in parts if i < len(axes)]
        bounds.append((min(d[0] for d in doms), max(d[1] for d in doms)))
    ks = tuple(iter_var(lo, hi, f"k{i}", "reduce") for i, (lo, hi) in enumerate(bounds))
    t = iter_var(0, len(parts), "t", "reduce")
    where, source = None, None
    for tc in reversed(range(len(parts))):
        src, w, axes, _c = parts[tc]
        mapping = dict(zip(axes, ks))
        conds = [t == tc, substitute(w, mapping)]
        for i, k in enumerate(ks):
            if i < len(axes):
                lo, hi = axes[i].dom
                if (lo, hi) != bounds[i]:
                    conds += [k >= lo, k < hi]
            else:
                conds.append(k == bounds[i][0])
        part_where = all_expr(conds)
        where = part_where if where is None else E.logical_or(part_where, where)
        src = substitute(src, mapping)
        source = src if source is None else E.select(t == tc, src, source)
    return E.make_reduce(parts[0][3], (source,), (t,) + ks, where, 0)


def inline_tail_accesses(tensors):
    """Fold sum-reductions into the elementwise stage that re-indexes (or adds) them
    (see the module docstring)."""
    accs = accesses(tensors)

    def fn(op, orig, tmap):
        if not is_elementwise(orig):
            return None
        terms = _tail_terms(orig, accs)
        if not terms:
            return None
        parts = []
        for cs, ld, rest in terms:
            part = _tail_part(orig, cs, ld, rest, tmap)
            if part is None:
                return None
            parts.append(part)
        if not _fold_pays(orig, parts, [r for _c, _l, r in terms],
                          [ld.tensor for _c, ld, _r in terms]):
            return None
        if any(_is_contraction(src) and is_scattered(ld.tensor, ld.args, orig.axis)
               for (src, _w, _a, _c), (_cs, ld, _r) in zip(parts, terms)):
            return None  # a GEMM whose result a transpose-reshape reads: no GEMM folded
        if len(parts) == 1:
            source, where, axes, comb = parts[0]
            body = E.make_reduce(comb, (source,), axes, where, 0)
        elif sum(_is_contraction(src) for src, _w, _a, _c in parts) >= 2:
            return None  # each a GEMM as it is; fused, none (a select picks the operands)
        else:
            try:
                body = _fuse_parts(op.axis, parts)
            except isl.Error:
                body = None
            if body is None:
                return None
        return ComputeOp(op.name, op.axis, (body,), op.tag, op.attrs).output(0)

    return rebuild(tensors, fn)


def _is_contraction(source):
    """Whether a reduction's summand is a product of two loads of float tensors (and
    constants): a contraction the code generator runs as a GEMM. The union of
    two of them (:func:`_fuse_parts`: the qkv split's adjoint adds the three
    products of attention's backward pass) is a reduction whose operands a
    select picks, which no GEMM reads: they stay reductions of their own."""
    factors, stack = [], [source]
    while stack:
        x = stack.pop()
        if isinstance(x, E.Mul):
            stack.extend(x.args)
        elif isinstance(x, E.Cast):
            stack.append(x.args[0])
        elif not isinstance(x, E.Const):
            factors.append(x)
    return len(factors) == 2 and all(isinstance(f, Load) for f in factors)


def _factor_out(value, ld):
    """``value == ld * rest`` with ``rest`` free of ``ld``: returns ``rest`` (True for 1),
    or None when ``value`` is not such a product (a sum or difference of such
    products factors too: ``ld * a + ld * b`` gives ``a + b``)."""
    if value is ld:
        return True
    if isinstance(value, (E.Add, E.Sub)) and value.dtype == ld.dtype:
        ra, rb = _factor_out(value.a, ld), _factor_out(value.b, ld)
        if ra is None or rb is None:
            return None
        one = E.const(1, ld.dtype)
        ra = one if ra is True else ra
        rb = one if rb is True else rb
        return E.add(ra, rb) if isinstance(value, E.Add) else E.sub(ra, rb)
    if isinstance(value, E.Mul):
        for a, b in ((value.a, value.b), (value.b, value.a)):
            if a is ld and not any(n is ld for n in post_order(b)):
                return b
            inner = _factor_out(a, ld) if not any(n is ld for n in post_order(b)) else None
            if inner is not None:
                return b if inner is True else E.mul(inner, b)
    return None
