"""Prefix and suffix sums become scans: O(n) work instead of the triangle's O(n^2).

A reduction stage ::

    Y[.., j, ..] = sum(s(.., k), axis=k, where=k - j <= c && w(.., k))     (a prefix)
    Y[.., j, ..] = sum(s(.., k), axis=k, where=k - j >= c && w(.., k))     (a suffix)

whose summand ``s`` and other conditions ``w`` do not mention ``j`` is the
recurrence ``Y[j] = Y[j - 1] + [k = j + c in k's domain and w] s(k = j + c)``
(a suffix runs the other way). It becomes a scan (:mod:`texpr.scan`) over a
state with the time axis ``j`` first (in reversed order for a suffix):

* init: the original reduction at the first step (``j = 0``, or ``j = n - 1``),
  a reduction stage of one step;
* update: ``P[t, ..] = P[t - 1, ..] + select(guard, s(k = j(t) + c), 0)``;
* the result: ``Y[.., j, ..] = P[j or n - 1 - j, ..]``, a re-indexing the
  materialisation rule inlines into its consumers, or, when ``Y`` keeps a
  buffer, whose buffer the scan writes directly (its state lives there under
  the re-indexing: :func:`texpr.simplify.materialize.scan_view`), or, for a
  prefix over the first axis, the scan's output itself.

``prod`` reductions become ``P[t - 1] * factor`` the same way (exact with zero
factors: no division), and so does any single-component ``comm_reducer``
(``P[t - 1] (+) term`` with its combine; a suffix combines ``term (+) P[t - 1]``,
so the points keep the reduction's row-major order). The *before*/*after* rest
stages of a ``prod`` or user-reducer window's gradient
(:func:`texpr.jacobian.rest_stages`) are such prefixes and suffixes: the
gradient is linear per window.

A reduction over several axes whose ``where=`` holds one of them in a triangle
with an output axis that nothing else mentions (a summed-area table
``sum(I[k, l], where=k <= y && l <= x)``, its adjoint with ``>=``) is split into
a stage reduced over the other axes and a 1-D prefix over that axis
(:func:`_split_triangle`), each scanned in turn: one scan per axis, O(H * W). This covers cumsum, its adjoint (a suffix sum of the
head), exclusive and reverse sums and cumprod, alone or inside larger
expressions (the summand may be anything that does not mention ``j``). A
stage is rewritten only when the scan visits fewer points than the triangle.
"""

from texpr import expr as E
from texpr.errors import TexprError
from texpr.expr import Reduce, const, iter_var, select
from texpr.scan import ScanOp
from texpr.triangles import conjunct_list as _conjuncts, triangle_bound as _bound
from texpr.tensor import ComputeOp, PlaceholderOp, topo_order
from texpr.visitor import free_vars, substitute

from .graph import rebuild
from .materialize import stage_count

_OPS = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b}


def _combine(comb, kind):
    """``(prev, term) -> expr``: one step of the scan for the Combiner ``comb``, or
    None when the combiner has no scan form. ``sum`` and ``prod`` are their
    operators; a single-component user reducer is its combine, with the state on
    the side of the points already combined: a prefix combines ``prev (+) term``
    (``term`` the later point), a suffix ``term (+) prev`` (``term`` the earlier
    point), so the points meet in the reduction's own row-major order and only
    associativity is used (a combine that keeps the accumulator at a tie keeps
    the first tied point, as the reduction does)."""
    if comb.kind in _OPS:
        return _OPS[comb.kind]
    if comb.kind != "custom" or len(comb.lhs) != 1:
        return None
    lhs, rhs, res = comb.lhs[0], comb.rhs[0], comb.result[0]

    def step(prev, term):
        a, b = (prev, term) if kind == "prefix" else (term, prev)
        return substitute(res, {lhs: a, rhs: b})

    return step


def _as_scan(op):
    """The scan form of the reduction stage ``op`` (a Tensor of ``op``'s shape), or None."""
    if op.num_outputs != 1 or not isinstance(op.body[0], Reduce):
        return None
    red = op.body[0]
    if len(red.axes) != 1 or len(red.source) != 1:
        return None
    if _combine(red.combiner, "prefix") is None:
        return None
    k = red.axes[0]
    found, rest = None, []
    for c in _conjuncts(red.where):
        b = _bound(c, k, op.axis) if found is None else None
        if b is not None:
            found = b
        else:
            rest.append(c)
    if found is None:
        return None
    j, c0, kind = found
    src = red.source[0]
    mentions = {id(v) for v in free_vars([src] + rest)}
    if id(j) in mentions:
        return None
    n = j.extent
    p = next(d for d, a in enumerate(op.axis) if a is j)
    others = [a for a in op.axis if a is not j]
    dtype = op.dtypes[0]
    # the state: time axis (j, or reversed j) first, then the other axes
    state = PlaceholderOp(f"{op.name}_state", (n,) + tuple(a.extent for a in others),
                          dtype).output(0)
    first = 0 if kind == "prefix" else n - 1

    def axes_of(shape_axes):
        return [iter_var(0, a.extent, a.name, "spatial") for a in shape_axes]

    # init: the reduction at the first step
    i_axes = axes_of([j] + others)
    mapping = {j: const(first, j.dtype)}
    mapping.update(zip(others, i_axes[1:]))
    init_body = substitute(red, mapping)
    init = ComputeOp(f"{op.name}_first", [iter_var(0, 1, "t0", "spatial")] + i_axes[1:],
                     (init_body,), tag="scan_init").output(0)
    # update: the previous step combined with the new term
    u_axes = axes_of([j] + others)
    t = u_axes[0]
    jt = t if kind == "prefix" else (n - 1) - t
    kv = jt + c0
    # k = j + c0 runs over [c0, n - 1 + c0]: test only the ends of k's domain it leaves
    in_dom = ([kv >= k.dom[0]] if c0 < k.dom[0] else []) + \
        ([kv < k.dom[1]] if n - 1 + c0 >= k.dom[1] else [])
    guard = E.all_of(in_dom
                     + [substitute(c, {k: kv, **dict(zip(others, u_axes[1:]))}) for c in rest])
    term = substitute(src, {k: kv, **dict(zip(others, u_axes[1:]))})
    ident = red.combiner.identity[0]
    new_term = select(guard, term, const(ident.value, dtype))
    prev = state[tuple([t - 1] + list(u_axes[1:]))]
    upd = ComputeOp(f"{op.name}_step", u_axes, (_combine(red.combiner, kind)(prev, new_term),),
                    tag="scan_update").output(0)
    scan = ScanOp(f"{op.name}_scan", [init], [upd], [state], tag="prefix_scan",
                  attrs={"of": op.name, "kind": kind})
    out = scan.output(0)
    if kind == "prefix" and p == 0:
        return out
    y_axes = axes_of(op.axis)
    yj = y_axes[p] if kind == "prefix" else (n - 1) - y_axes[p]
    idx = [yj] + [a for d, a in enumerate(y_axes) if d != p]
    return ComputeOp(op.name, y_axes, (out[tuple(idx)],), tag=op.tag, attrs=op.attrs).output(0)


def _split_triangle(op):
    """A reduction over several axes, one of which (``k``) is held only by a
    triangle ``k - j <= c`` (or ``>=``) with an output axis ``j`` that nothing
    else mentions, as two stages (a Tensor of ``op``'s shape), or None::

        T[k, ..] = reduce(s, axis=the other axes, where=the other conditions)
        Y[.., j, ..] = reduce(T[k, ..], axis=k, where=k - j <= c)

    The outer stage is a 1-D prefix (suffix) and becomes a scan; the inner one
    is split or scanned again when it has the same form (a summed-area table
    ``sum(I[k, l], where=k <= y && l <= x)``: one prefix sum per axis, in
    O(H * W), and its adjoint, the same with ``>=``). ``sum`` and ``prod`` split
    at any axis; a user reducer only at its first axis, so that its points keep
    their row-major order."""
    if op.num_outputs != 1 or not isinstance(op.body[0], Reduce):
        return None
    red = op.body[0]
    comb = red.combiner
    if len(red.axes) < 2 or len(red.source) != 1 or _combine(comb, "prefix") is None:
        return None
    parts = _conjuncts(red.where)
    for pos, k in enumerate(red.axes):
        if comb.kind not in _OPS and pos:
            break
        for ci, c in enumerate(parts):
            b = _bound(c, k, op.axis)
            if b is None:
                continue
            j = b[0]
            rest = parts[:ci] + parts[ci + 1:]
            if any(v is j for v in free_vars(list(red.source) + rest)):
                continue
            return _nested(op, k, j, c, rest)
    return None


def _nested(op, k, j, bound, rest):
    """The two stages of :func:`_split_triangle` (the outer one, as a Tensor)."""
    red = op.body[0]
    others = [a for a in op.axis if a is not j]
    lo = k.dom[0]
    t_k = iter_var(0, k.extent, k.name, "spatial")
    t_others = [iter_var(0, a.extent, a.name, "spatial") for a in others]
    mapping = {k: t_k + lo if lo else t_k, **dict(zip(others, t_others))}
    inner_axes = tuple(a for a in red.axes if a is not k)
    where = substitute(E.all_of(rest), mapping)
    src = substitute(red.source[0], mapping)
    inner = ComputeOp(f"{op.name}_{k.name}", [t_k] + t_others,
                      (E.make_reduce(red.combiner, (src,), inner_axes, where, 0),),
                      tag=op.tag).output(0)
    inner = _cheapest(inner)
    k2 = iter_var(k.dom[0], k.dom[1], k.name, "reduce")
    y_axes = [iter_var(0, a.extent, a.name, "spatial") for a in op.axis]
    ymap = dict(zip(op.axis, y_axes))
    term = inner[tuple([k2 - lo if lo else k2] + [ymap[a] for a in others])]
    outer_where = substitute(bound, {k: k2, **ymap})
    outer = ComputeOp(op.name, y_axes, (E.make_reduce(red.combiner, (term,), (k2,),
                                                      outer_where, 0),),
                      tag=op.tag, attrs=op.attrs)
    return _as_scan(outer)


def _cheapest(t):
    """``t`` (a reduction stage's output) as a scan, or split and scanned, when that
    visits fewer points; else ``t``."""
    new = _scanned(t.op)
    return t if new is None else new


def _new_cost(new, op):
    """Points the stages of ``new`` that ``op``'s inputs do not hold visit; a stage
    that only re-indexes a scan's output costs nothing (the scan writes that buffer
    through a view, materialize.scan_view, or it is inlined), and a scan's first
    step is the scan's (a cheap one is computed into its state)."""
    old = {id(o) for o in topo_order(op.input_tensors())}
    total = 0
    for o in topo_order([new]):
        if id(o) in old or isinstance(o, PlaceholderOp) or getattr(o, "tag", "") == "scan_init":
            continue
        if isinstance(o, ComputeOp) and isinstance(o.body[0], E.Load) \
                and isinstance(o.body[0].tensor.op, ScanOp):
            continue
        total += stage_count(o)
    return total


def _scanned(op):
    """The scan form of the reduction stage ``op`` (:func:`_as_scan`, or
    :func:`_split_triangle` for several axes) when it visits fewer points, else None."""
    try:
        new = _as_scan(op)
        if new is None:
            new = _split_triangle(op)
    except TexprError:  # a form the scan cannot take (its checks say why): keep the sum
        return None
    if new is None or _new_cost(new, op) >= stage_count(op):
        return None
    return new


def prefix_sums_to_scans(tensors):
    """Prefix/suffix sums and products (triangular domains) become scans (module docstring)."""

    def fn(op, _orig, _tmap):
        if not isinstance(op, ComputeOp) or not isinstance(op.body[0], Reduce):
            return None
        return _scanned(op)

    return rebuild(tensors, fn)
