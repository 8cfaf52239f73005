"""Loop decisions of a loop-nest stage that are made before it is written.

One job: the heuristics :class:`codegen.loopnest.stage._StageLowering` plans a
stage with (the rules are in :mod:`codegen.loopnest.stage`'s docstring): the
default loop order (:func:`default_order`), the reduction loop that buffer mode
unrolls by groups (:func:`_split_last`, :func:`_partial_groups`), the spatial
axis a scalar-mode sum blocks in registers (:func:`_jam_axis`), whether a stage
is worth a parallel launch (:func:`_worth_parallel`, :func:`_points`), the
residue classes a domain is split on (:func:`_residue_candidates`), whether a
reducer's result depends on the order of its points (:func:`_order_sensitive`),
and the zero guards a sum's domain takes over (:func:`lift_zero_guards`).
"""

from texpr.simplify.isl_bridge import (VarSpace, box_set, card_within, isl,
                                      projected_cards_within, to_pwaff, to_set)
from texpr import dtypes as dt
from texpr import expr as E
from texpr.errors import TexprError
from texpr.tensor import row_major_strides

from ..options import current as _opts

__all__ = ["default_order", "lift_zero_guards"]


def _coef(e, v):
    """Coefficient of ``v`` in ``e`` if ``e`` is affine in ``v`` (0 if absent), else None."""
    if e is v:
        return 1
    if isinstance(e, (E.Const, E.Var)):
        return 0
    if isinstance(e, E.Add):
        a, b = _coef(e.a, v), _coef(e.b, v)
        return None if a is None or b is None else a + b
    if isinstance(e, E.Sub):
        a, b = _coef(e.a, v), _coef(e.b, v)
        return None if a is None or b is None else a - b
    if isinstance(e, E.Mul):
        for c, o in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, E.Const):
                k = _coef(o, v)
                return None if k is None else k * c.value
        return None if _mentions(e, v) else 0
    return None if _mentions(e, v) else 0


def _mentions(e, v):
    from texpr.visitor import post_order
    return any(n is v for n in post_order(e))


def _nodes(e):
    from texpr.visitor import post_order
    return post_order(e)


def _loads(exprs):
    from texpr.visitor import post_order
    return [n for n in post_order(exprs) if isinstance(n, E.Load)]


def _average_trips(exprs, spatial, reduce_):
    """id(axis) -> the average trip count of a loop over it inside all the other
    loops of the stage's domain (points / points of the projection): the extent,
    unless the reduction's ``where`` ties the axis to others (e.g. a spatial axis
    ``2*r - 1 <= h <= 2*r + 1`` runs 3 times per value of ``r``). The counts are
    bounded in cost (:func:`~texpr.simplify.isl_bridge.projected_cards_within`:
    barvinok took minutes on a 30x300x300 domain with two modulus conditions);
    an axis whose counts are not exact keeps its extent."""
    axes = list(spatial) + list(reduce_)
    red = next((e for e in exprs if isinstance(e, E.Reduce)), None)
    out = {id(a): float(a.extent) for a in axes}
    if red is None or (isinstance(red.where, E.Const) and red.where.value is True):
        return out
    try:
        space = VarSpace(axes)
        dom = box_set(space).intersect(to_set(red.where, space)[0])
        total, projs = projected_cards_within(dom)
        if not total.exact or total.value == 0:
            return out
        for a, proj in zip(axes, projs):
            if proj.exact:
                out[id(a)] = total.value / max(proj.value, 1)
    except TexprError:
        pass
    return out


# options.near_stride (default 4): a stride (in elements) up to which consecutive iterations
#   of the innermost loop still share cache lines (rows of 3 per-row statistics read along
#   the rows)


def _far_strided(op, loads, spatial, reduce_):
    """id(axis) -> how many tensors (each counted once; the output's store too,
    for a spatial axis) a loop over the axis walks at a stride above
    ``options.near_stride`` elements, or an unknown one: the first key of the
    default order, so that the invariant loads the scores credit never put a
    loop that strides through a large tensor innermost (``sum_k A[k, i] *
    S[i, 0]``: ``k`` innermost read A by columns, 11.7x slower at 3000x3000)."""
    far = {}
    for ax in list(spatial) + list(reduce_):
        hit = set()
        for ld in loads:
            if not ld.args:
                continue
            coefs = [_coef(i, ax) for i in ld.args]
            if any(c is None for c in coefs):
                hit.add(id(ld.tensor))
                continue
            step = sum(c * st for c, st in zip(coefs, row_major_strides(ld.tensor.shape)))
            if abs(step) > _opts().near_stride:
                hit.add(id(ld.tensor))
        if ax.kind == "spatial" and op.axis:
            pos = next((d for d, a in enumerate(op.axis) if a is ax), None)
            if pos is not None and row_major_strides(op.shape)[pos] > _opts().near_stride:
                hit.add("store")
        far[id(ax)] = len(hit)
    return far


def _data_condition_axes(exprs):
    """ids of the axes that the reduction's data-dependent ``where`` (its loads:
    a relu's ``conv[n, c, h, w] > 0``, a max pool's argmax) varies along: an
    innermost loop along none of them tests the condition once for the whole
    loop (the compiler hoists it), one along them tests it every trip."""
    red = next((e for e in exprs if isinstance(e, E.Reduce)), None)
    if red is None:
        return set()
    return {id(n) for ld in _loads([red.where]) for i in ld.args for n in _nodes(i)
            if isinstance(n, E.IterVar)}


def default_order(op, exprs, spatial, reduce_):
    """The default leaf order (see the module docstring); returns a list of axes."""
    if not reduce_:
        return list(spatial)
    score = {}
    loads = _loads(exprs)
    accesses = [ld.args for ld in loads]
    for ax in list(spatial) + list(reduce_):
        s = 0
        for idx in accesses:
            if not idx:
                continue
            last = _coef(idx[-1], ax)
            others = [_coef(i, ax) for i in idx[:-1]]
            free = (1, -1, 0) if _opts().invariant_free else (1, -1)
            if last in free and all(o == 0 for o in others):
                # unit stride, or invariant: the loop keeps the value in a register
                # (layernorm's mean[i] is free in a loop over the reduction axis)
                s += 2
            elif any(o not in (0, None) for o in others) or last not in (0, 1, -1):
                s -= 1
        score[id(ax)] = s
    if spatial:
        score[id(spatial[-1])] = score.get(id(spatial[-1]), 0) + 2  # the store
    for ax in reduce_ if _opts().invariant_free else ():
        score[id(ax)] += 2  # the store is invariant in a reduction loop (an accumulator)

    trip = _average_trips(exprs, spatial, reduce_)
    far = _far_strided(op, loads, spatial, reduce_) if _opts().invariant_free else {}
    varies = _data_condition_axes(exprs) if _opts().condition_invariant else set()

    def key(ax):
        is_sp = ax.kind == "spatial"
        return (id(ax) not in varies, -far.get(id(ax), 0), score[id(ax)],
                min(trip[id(ax)], 16), is_sp)

    axes = list(spatial) + list(reduce_)
    cands = [a for a in axes if trip[id(a)] >= 4] or list(reduce_)
    if _opts().short_contiguous and all(score[id(a)] <= 0 or (_opts().condition_invariant and (
            far.get(id(a), 0) or id(a) in varies)) for a in cands):
        # no long loop walks memory contiguously: a short one that does may beat a
        # long strided one (see options.short_contiguous)
        cands += [a for a in axes if 2 <= trip[id(a)] < 4 and score[id(a)] > 0]
    best = max(cands, key=key)
    if best.kind == "reduce":
        rest = [a for a in reduce_ if a is not best]
        return list(spatial) + rest + [best]
    # buffer mode: spatial axes, then the reductions, then a small spatial tile
    sp = [a for a in spatial if a is not best]
    inner = [best]
    tile = best.extent
    while sp and len(sp) > 1 and tile * sp[-1].extent <= _opts().buffer_tile:
        tile *= sp[-1].extent
        inner.insert(0, sp.pop())
    return sp + _split_last(exprs, reduce_, best) + inner


def _partial_groups(where, axes, r, f, box):
    """The points of the box (over ``axes``) whose group of ``f`` consecutive values
    of ``r`` (``r // f`` fixed) has a value outside ``where`` (quasi-affine)."""
    from texpr.visitor import substitute
    r2 = E.iter_var(r.dom[0], r.dom[1], r.name + "_mate", "reduce")
    space2 = VarSpace(list(axes) + [r2])
    box2 = box_set(space2)
    inside = to_set(substitute(where, {r: r2}), space2)[0]
    mates = to_set(E.floordiv(r2, f) == E.floordiv(r, f), space2)[0]
    bad = box2.subtract(inside).intersect(mates)
    return bad.project_out(isl.dim_type.set, len(axes), 1).intersect(box)


def _split_last(exprs, reduce_, inner):
    """The reduction loops of a buffer-mode stage, outermost first: in definition
    order, except that the longest one (``>= options.split_lanes``) whose bounds are
    constant (the ``where`` does not mention it) and that a load reads goes
    innermost, where its values are unrolled by groups (one load and store of
    the output element per group: conv2d's input channels rather than its
    3 kernel columns) -- when every load along the innermost spatial axis
    ``inner`` is contiguous (a strided conv's loads along ``w`` are not, and
    its kernel columns' unrolled loads are faster: 3.5 ms vs 7 ms)."""
    red = next((e for e in exprs if isinstance(e, E.Reduce)), None)
    if red is None or len(reduce_) < 2:
        return list(reduce_)
    loads = _loads(red.source)
    for ld in loads:
        if ld.args and _mentions(ld, inner) and _coef(ld.args[-1], inner) not in (1, -1):
            return list(reduce_)
    ok = [a for a in reduce_ if a.extent >= _opts().split_lanes and a.dom[0] == 0
          and not _mentions(red.where, a) and any(_mentions(ld, a) for ld in loads)]
    if not ok:
        return list(reduce_)
    best = max(ok, key=lambda a: a.extent)
    return [a for a in reduce_ if a is not best] + [best]


def lift_zero_guards(red, space):
    """``sum(select(c, a, 0) * b, where=w)`` -> ``sum(a * b, where=w && c)`` for the
    affine conditions ``c`` of guards in the product of a sum's source: the
    guard becomes a loop bound instead of a test in the innermost loop (the
    terms dropped are zero, as in the simplifier's zero elimination)."""
    if red.combiner.kind != "sum" or len(red.source) != 1:
        return red
    conds = []

    def strip(e):
        if isinstance(e, E.Select) and isinstance(e.false_value, E.Const) \
                and e.false_value.value == 0:
            _, r = to_set(e.cond, space)
            if r is None:
                conds.append(e.cond)
                return strip(e.true_value)
            return e
        if isinstance(e, E.Mul):
            return E.mul(strip(e.a), strip(e.b))
        if isinstance(e, E.Cast) and dt.is_float(e.dtype):
            inner = strip(e.value)
            return E.cast(inner, e.dtype)
        return e

    src = strip(red.source[0])
    if not conds:
        return red
    where = E.all_of([red.where] + conds)
    src = E.cast(src, red.dtype) if src.dtype != red.dtype else src
    return E.make_reduce(red.combiner, (src,), red.axes, where, 0)


def _points(s):
    """Points of a domain for the parallel rules, at a bounded cost
    (:func:`~texpr.simplify.isl_bridge.card_within`: exact, or where counting
    would cost too much the points of its bounding box, the extents' product),
    or a huge number when they cannot be counted."""
    try:
        return card_within(s).value
    except TexprError:
        return 1 << 62


def _worth_parallel(points, exprs):
    """Whether a stage of ``points`` points whose body is ``exprs`` is worth its
    parallel launch (``options.parallel_min_points``, ``options.parallel_points``,
    ``options.parallel_min_work``)."""
    if points < _opts().parallel_min_points:
        return False
    if points >= _opts().parallel_points:
        return True
    from texpr.visitor import post_order

    nodes = sum(len(post_order(x)) for x in exprs if isinstance(x, E.Expr))
    return points * max(nodes, 1) >= _opts().parallel_min_work


def _free(e):
    from texpr.visitor import free_vars
    return free_vars(e) if isinstance(e, E.Expr) else []


def _order_sensitive(red):
    """Whether the result of the reduction ``red`` (a Reduce, or another body)
    can depend on the order of its points beyond rounding: a user's tuple reducer
    (``te.comm_reducer``), whose combine may keep the accumulator at a tie. The
    kernels then visit the points in row-major order of the reduction axes, as
    ``te.evaluate`` does (docs/conventions.md)."""
    return (isinstance(red, E.Reduce) and red.combiner.kind == "custom"
            and not red.combiner.order_free)


def _residue_candidates(where, space, dom):
    """The ``(e, m)`` of the ``e % m`` and ``e // m`` in ``where`` (constant
    ``m >= 2``, ``e`` quasi-affine over the stage's axes) whose residues in the
    domain are more than one class and fewer than ``m``: conditions a single
    stride cannot express."""
    from texpr.visitor import post_order
    out = []
    for n in post_order(where):
        if not (isinstance(n, (E.FloorMod, E.FloorDiv)) and isinstance(n.b, E.Const)
                and isinstance(n.b.value, int) and n.b.value >= 2):
            continue
        if to_pwaff(n.a, space) is None or any(n.a is e for e, _ in out):
            continue
        m = n.b.value
        k = sum(1 for r in range(m)
                if not dom.intersect(to_set(E.floormod(n.a, m) == r, space)[0]).is_empty())
        if 1 < k < m:
            out.append((n.a, m))
    return out[:_opts().max_residue_splits]


def _jam_axis(sp_order, red, fixed=()):
    """The spatial axis to block, innermost first, if register blocking pays and
    is exact: the reduction's domain does not depend on it, and some load of the
    summand does not either (it is then shared by the blocked points). An axis
    other than the innermost (e.g. conv2d dW's input channel, when the kernel
    column is tied to the image by the ``where``) is moved innermost by the
    caller; axes in ``fixed`` (the parallel loop) stay where they are."""
    loads = _loads(red.source)
    for k in range(len(sp_order) - 1, -1, -1):
        a = sp_order[k]
        if any(a is f for f in fixed):
            continue
        if a.extent < 2 * _opts().jam or _mentions(red.where, a):
            continue
        if not any(not _mentions(ld, a) for ld in loads):
            continue
        return a
    return None
