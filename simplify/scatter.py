"""Gathers with data-dependent indices become scatter-adds.

The adjoint of ``Y[k] = X[I[k]]`` (``I`` an int tensor) is, raw,
``dX[j] = sum_k select(I[k] == j, dY[k], 0)``: after lifting, a reduction whose
``where=`` holds a *residual* equality ``I[k] == j`` on the output index ``j``
that ISL cannot see. Computed as written it costs ``size(X) * len(I)``.
:func:`gathers_to_scatters` turns every sum stage whose residual condition fixes
some output dimensions ``j_d == L_d`` (``L_d`` data-dependent and free of the
fixed dimensions) into a :class:`texpr.ScatterAddOp` over the reduction domain
and the remaining output dimensions: ``dX[L(k)] += dY[k]``, work ``O(len(I))``.
Duplicated indices accumulate (``np.add.at`` semantics), as the sum did; an
index outside the output's shape matched no output point of the sum, so the
scatter skips it (a guard ``0 <= L < n``).

An index that depends on loop variables only but is not quasi-affine (a product
``X[i * j]``, float arithmetic then floor and cast ``X[int(floor(i * 0.5))]``)
is treated the same way: ISL cannot solve ``i * j == j0`` for the output index
``j0``, but the scatter computes ``i * j`` at each of its points, so the work
is the forward's points, never ``points x |X|``.
"""

from texpr import expr as E
from texpr.expr import Load, iter_var
from texpr.tensor import ScatterAddOp
from texpr.triangles import linear_form
from texpr.visitor import free_vars, post_order, substitute

from .domain import Domain
from .graph import fresh_stage, is_sum_stage, rebuild
from .isl_bridge import box_set, isl, set_to_expr, to_pwaff
from .terms import all_expr, conjuncts, group_terms, guarded_terms, rebuild_sum


def _has_load(e):
    return any(isinstance(n, Load) for n in post_order(e))


def _not_affine(e, space):
    """Whether the integer expression ``e`` is an index ISL cannot see: it loads
    data, or it is not quasi-affine in the loop variables (``i * j``,
    ``int(floor(i * 0.5))``)."""
    return e.dtype in ("int32", "int64") and (_has_load(e) or to_pwaff(e, space) is None)


def _mentions(e, var_ids):
    return any(id(v) in var_ids for v in free_vars(e))


def gathers_to_scatters(tensors):
    """Rewrite sums over data-dependent index equalities as scatter-add stages."""

    def fn(op, _orig, _tmap):
        if not is_sum_stage(op):
            return None
        red = op.body[0]
        sop = _scatter(op, red.where, red.source[0])
        if sop is None:
            sop = _split_scatters(op)
        return None if sop is None else sop.output(0)

    return rebuild(tensors, fn)


def _split_scatters(op):
    """A sum whose summand's guarded terms carry different data-dependent index
    equalities (``Y[i] = X[I[i]] * X[J[i]]``: ``dX[j] = sum_i H[i] * (select(I[i] == j,
    X[J[i]], 0) + select(J[i] == j, X[I[i]], 0))``) as a chain of scatter-adds, one
    per term, each accumulating onto the previous one (``init``); the terms no
    equality fixes stay one sum stage, the chain's start. None when no term
    becomes a scatter."""
    red = op.body[0]
    terms = group_terms(guarded_terms(red.source[0]))
    if len(terms) < 2:
        return None
    scattered, kept = [], []
    for cs, v in terms:
        v = v if v.dtype == red.dtype else E.cast(v, red.dtype)
        where = all_expr(conjuncts(red.where) + tuple(cs))
        sop = _scatter(op, where, v)
        (scattered if sop is not None else kept).append((where, v))
    if not scattered:
        return None
    init = None
    if kept:
        source = kept[0][1] if len(kept) == 1 else rebuild_sum(
            [(conjuncts(w), v) for w, v in kept], red.dtype)
        where = kept[0][0] if len(kept) == 1 else red.where
        body = E.make_reduce(red.combiner, (source,), red.axes, where, 0)
        init = fresh_stage(f"{op.name}_rest", op.axis, body, tag=op.tag).output(0)
    sop = None
    for k, (where, v) in enumerate(scattered):
        last = k == len(scattered) - 1
        sop = _scatter(op, where, v, init, op.name if last else f"{op.name}_s{k}")
        init = sop.output(0)
    return sop


def _scatter(op, where, source, init=None, name=None):
    """The sum stage ``op`` with summand ``source`` and condition ``where`` as a
    scatter-add (onto ``init`` when given), or None when no data-dependent equality
    fixes an output dimension."""
    axis, raxes = op.axis, op.body[0].axes
    try:
        dom = Domain(axis + raxes, where)
    except isl.Error:
        return None
    if dom.residual is None:
        return None
    spatial_ids = {id(a) for a in axis}
    fixed = {}  # id(axis var) -> expression
    used = []
    for c in conjuncts(dom.residual):
        if not isinstance(c, E.EQ):
            continue
        flat = _flat_solution(c, axis, fixed, dom.space)
        if flat is not None:
            fixed.update(flat)
            used.append(c)
            continue
        for j, other in ((c.a, c.b), (c.b, c.a)):
            if id(j) in spatial_ids and id(j) not in fixed \
                    and _not_affine(other, dom.space) \
                    and not _mentions(other, {id(j)} | set(fixed)):
                fixed[id(j)] = other
                used.append(c)
                break
    if not fixed:
        return None
    # the fixed dimensions may not appear in the other fixed values either
    fixed_ids = set(fixed)
    if any(_mentions(v, fixed_ids) for v in fixed.values()):
        return None
    resid = list(conjuncts(dom.residual))
    first = min(k for k, c in enumerate(resid) if any(c is u for u in used))
    unused = [(k < first, c) for k, c in enumerate(resid) if all(c is not u for u in used)]
    try:
        # under the box: the bounds of the scatter's own axes are its loop bounds,
        # those of the fixed dimensions become explicit index checks below
        affine = set_to_expr(dom.set, dom.space, context=box_set(dom.space))
        # the affine conditions on the scatter's own axes alone: ``affine`` with the
        # fixed dimensions eliminated (there is some output index). Substituted, the
        # fixed dimensions are loads, so ``affine`` guards nothing; this does (long
        # run seed 7016100758: ``j1 == 2 && r_k0 % 3 == 0 || ...`` with j1 fixed by
        # an argmin let r_k0 = 1 read the argmin at index 2 of its 2)
        own = dom.set
        for a in axis:
            if id(a) in fixed:
                own = own.eliminate(isl.dim_type.set, dom.space.pos[id(a)][1], 1)
        own = set_to_expr(own, dom.space, context=box_set(dom.space))
    except isl.Error:
        return None
    mapping = {a: fixed[id(a)] for a in axis if id(a) in fixed}
    affine_parts = conjuncts(substitute(affine, mapping))
    value = substitute(source, mapping)
    # the scatter's domain: the reduction axes and the output dimensions not fixed
    free_axes = [a for a in axis if id(a) not in fixed]
    dom_vars = list(raxes) + free_axes
    new_vars = {v: iter_var(v.dom[0], v.dom[1], v.name, "spatial") for v in dom_vars}
    # A fixed index is guarded by ``0 <= ix < n``: the sum it replaces compared
    # ``ix`` with the output index, so an ``ix`` outside the output matched no
    # output point (a segment id of -1 means "no segment"). The raw adjoint of a
    # gather is a scatter-add already (texpr.jacobian), which fails where the
    # forward gather fails; this rewrite only makes sums cheaper. An argmax/argmin
    # value inside the index is tested first: its sentinel 2**63 - 1 marks an
    # empty domain (the forward read nothing), and the conditions after it may
    # load through the index (``I[argmax[j]]``): ``&&`` evaluates its right side
    # only where the left holds.
    indices, bounds, ranges = [], [], []
    for d, a in enumerate(axis):
        ix = substitute(fixed.get(id(a), a), new_vars)
        indices.append(ix)
        if id(a) in fixed:
            bounds.extend(n < _EMPTY_ARGMAX for n in _argmax_loads(ix))
            ranges += [ix >= a.dom[0], ix < a.dom[1]]
    # The order of the tests is the order in which the sum evaluated them, so that
    # each load is reached only where the sum reached it. First the conditions on
    # the scatter's own axes alone (no load: they cannot fail; long run seed
    # 7009700500: an argmin read at j0 = 2 of its 2 columns, before the test
    # j0 <= 1). Then the data conditions the sum tested before the equality that
    # fixes an index, unless they mention a fixed output axis (the guards of the
    # index's own loads: J[r] < 4 before I[J[r]], r < 2 || V[r] > 5 before A[r],
    # I[r] < 3 before J[I[r]]; attack helpers 20 and 22), then the index's tests,
    # then everything that reads through it.
    def has_load(x):
        return any(isinstance(n, Load) for n in post_order(x))

    axis_only, early, late = list(conjuncts(substitute(own, new_vars))), [], []
    for x in affine_parts:
        x = substitute(x, new_vars)
        (late if has_load(x) else axis_only).append(x)
    for before, c in unused:
        # (one that mentions a fixed output axis reads through its index once
        # substituted: ``M[j] > 0`` with ``j = int(X[r])`` needs the range tests first)
        on_fixed = any(id(v) in fixed for v in free_vars([c]))
        for x in conjuncts(substitute(substitute(c, mapping), new_vars)):
            if not has_load(x):
                axis_only.append(x)
            else:
                (early if before and not on_fixed else late).append(x)
    where = all_expr(axis_only + early + bounds + ranges + late)
    if any(id(v) in spatial_ids and id(v) in fixed_ids
           for v in free_vars([value, where] + indices)):
        return None
    value = substitute(value, new_vars)
    return ScatterAddOp(name or op.name, op.shape, op.dtypes[0],
                        tuple(new_vars[v] for v in dom_vars), tuple(indices), value, where,
                        init)



#: the value an argmax/argmin stage holds for an empty reduction domain (texpr.jacobian)
_EMPTY_ARGMAX = 2**63 - 1


def _argmax_loads(ix):
    """The loads from argmax/argmin stages inside the index expression ``ix``."""
    return [n for n in post_order(ix)
            if isinstance(n, Load) and getattr(n.tensor.op, "tag", None) == "argmax"]


def _flat_solution(c, axis, fixed, space):
    """``{id(j_d): index}`` when the equality ``c`` sets a row-major flat position of
    several output axes to data, ``sum_d a_d j_d + c0 == L`` (all lower bounds 0,
    the strides decreasing to ``a_last = 1`` with ``a_d >= a_(d+1) n_(d+1)``: a
    multi-axis argmax's flat index, one of whose axes may be pinned), else None.
    Then at most one point of the box matches ``v = L - c0``, the greedy digits
    ``j_0 = v // a_0``, ``j_d = (v % a_0 % .. % a_(d-1)) // a_d``; a ``v`` that no
    point matches gives a digit outside its range, which the scatter's index
    checks skip (the sum matched no point)."""
    spatial = {id(a): a for a in axis}
    for lhs, other in ((c.a, c.b), (c.b, c.a)):
        form = linear_form(lhs)
        if form is None or not _not_affine(other, space):
            continue
        coefs, c0 = form
        if len(coefs) < 2 or any(k not in spatial or k in fixed for k in coefs):
            continue
        dims = sorted(coefs.values(), key=lambda vc: -vc[1])
        if any(v.dom[0] != 0 for v, _c in dims) or dims[-1][1] != 1:
            continue
        if any(dims[d][1] < dims[d + 1][1] * dims[d + 1][0].extent
               for d in range(len(dims) - 1)):
            continue
        if _mentions(other, set(coefs)):
            continue
        rem = other - c0 if c0 else other
        out = {}
        for var, coef in dims:
            out[id(var)] = E.floordiv(rem, coef) if coef != 1 else rem
            rem = E.floormod(rem, coef) if coef != 1 else rem
        return out
    return None
